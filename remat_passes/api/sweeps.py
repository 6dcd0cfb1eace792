"""Planner sweeps over a module: `bounds` (the least and the most a plan keeps),
`recompute_seconds` (what a policy's plan costs in the planner's model) and `pareto`
(budget against recompute cost). Each runs the passes on copies of the module.
"""
from __future__ import annotations

import dataclasses

from remat_passes.api.remat import pass_state, remat
from remat_passes.core.residuals import activation_bytes
from remat_passes.cost import flops
from remat_passes.cost.devices import (PROFILES, default_device, recomputation_seconds,
                                       roundings_in)
from remat_passes.cost.memory import estimate_memory
from remat_passes.cost.memory_report import format_bytes
from remat_passes.cost.xla_schedule import deletes_barriers
from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import RematError, expect_module
from remat_passes.passes.inline import Inline
from remat_passes.passes.insert_reduce_precision import InsertReducePrecision
from remat_passes.passes.base import Progress
from remat_passes.passes.manager import run_pipeline
from remat_passes.passes.remat_partial_eval import RematPartialEval
from remat_passes.passes.trial_plans import planning_problem
from remat_passes.planner.model import Problem
from remat_passes.planner.report import format_flop
from remat_passes.planner.solvers import minimum_bytes
from remat_passes.policy.auto import AutoPolicy, auto


def recompute_seconds(module, policy, func: str = "main", device: str | None = None,
                      mode: str = "joint", levels: str = "auto",
                      round_exact: bool = True) -> float:
    """What the recomputation of `policy`'s plan for `module` costs in the planner's model,
    to compare any policy with auto on the same scale: the ops remat-partial-eval clones
    and the reduce_precision ops insert-reduce-precision then adds on what is kept (what
    `auto` minimises counts both), loop bodies times their trip count. `mode="split"`:
    of the split form. `levels` as `rp.remat`'s: with "1" it is the cost `auto`'s solver
    reports; two levels add what they recompute twice. `round_exact` as `rp.remat`'s."""
    expect_module(module, "rp.recompute_seconds")
    profile = PROFILES[device or default_device()]
    out = module.clone()
    run_pipeline(out.op, [Inline(), RematPartialEval(policy=policy, func=func, mode=mode,
                                                     levels=levels, round_exact=round_exact)],
                 pass_state(module, out))
    funcs = [graph.find_func(out.op, name).operation
             for name in ([func] if mode == "joint" else [f"{func}_fwd", f"{func}_bwd"])]
    existing = roundings_in(funcs)
    run_pipeline(out.op, [InsertReducePrecision(func=func, round_exact=round_exact)])
    with out.op.context:
        return recomputation_seconds(funcs, profile, flops.CostModel(out.op), existing)


def _own_backward(module, func: str, what: str) -> None:
    """A sweep plans `func`'s own backward: say so clearly where it runs inside loop
    bodies, cond branches or shard_map bodies (gradient accumulation, a conditional step,
    data parallelism; `outline-loop-backwards`), which a sweep does not take."""
    from remat_passes.passes.outline_loop_backwards import HOLDERS
    from remat_passes.regions import loop_backward
    expect_module(module, what)
    out = module.clone()
    run_pipeline(out.op, [Inline()], pass_state(module, out), verify_each=False)
    with out.op.context:
        bodies = loop_backward.loop_bodies(graph.find_func(out.op, func))
        if bodies:
            holder = HOLDERS[loop_backward.kind(bodies[0])]
            raise RematError(
                f"error: {what}: @{func} runs its backward pass inside {holder.brief}; "
                f"{what} plans a function's own backward (export {holder.one_step} for it). "
                "rp.remat, "
                "rp.jit and auto(budget=...) apply the policy inside the body")


def bounds(module, func: str = "main", policy: AutoPolicy | None = None, *,
           what: str = "rp.bounds") -> tuple[int, int]:
    """(minimum, no-remat) residual bytes a plan of `auto` as the module policy can have for
    `func` of `module`, as remat-partial-eval plans it: checkpoint regions with a policy of
    their own keep their verdicts, and count with what those keep (`planner.scope_model`)
    (`what`: who asks, for the error where the function's backward runs inside a loop
    body)."""
    _own_backward(module, func, what)
    p = problem_for(module, func, policy)
    return minimum_bytes(p), p.no_remat_bytes()


def problem_for(module, func: str = "main", policy: AutoPolicy | None = None, *,
                round_exact: bool = True) -> Problem:
    """The planning problem `auto` as the module policy solves for `func` of a copy of
    `module` (inlined; `planning_problem`), for the solvers and benchmarks to work on
    directly. `round_exact` as `rp.remat`'s: False prices no rounding of an f32/f64
    residual, as rp.jit plans on XLA:CPU (`variants.rounding`)."""
    return planning_problem(module, func, policy, round_exact=round_exact)


@dataclasses.dataclass
class ParetoPoint:
    budget: int                 # the budget asked for (bytes of activations)
    activation_bytes: int       # what the split form's <f>_fwd keeps on the device beyond
                                # the function's own arguments (what the budget counts)
    host_bytes: int             # what it moves to host memory
    extra_flops: float          # FLOPs recomputed (fwd + bwd of the split form, over no remat)
    extra_pct: float            # ... as % of the no-remat split's FLOPs
    joint_peak: int             # the joint form's peak as XLA would allocate it (the "xla"
    #                             model of estimate_memory, which objective=peak bounds)
    solve_seconds: float
    method: str


@dataclasses.dataclass
class PolicyPoint:
    """A fixed policy measured as `pareto` measures its plans."""
    policy: str
    activation_bytes: int
    host_bytes: int
    extra_flops: float
    extra_pct: float
    joint_peak: int


# the policies `policy_points` measures by default: JAX's fixed ones that need no names
FIXED_POLICIES = ("nothing_saveable", "dots_with_no_batch_dims_saveable", "dots_saveable",
                  "everything_saveable")


class _Measure:
    """Activation bytes, host bytes, extra FLOPs and the joint peak of a policy's plan, the
    same way for every plan of a sweep (FLOPs over the no-remat split form's), each built
    with rp.remat's `round_exact`."""

    def __init__(self, module, func: str, levels: str = "auto", round_exact: bool = True):
        self.module, self.func, self.levels = module, func, levels
        self.round_exact = round_exact
        self.base = self._flops(remat(module, None, mode="split", func=func))

    def _flops(self, split) -> float:
        return flops.function_flops(split, f"{self.func}_fwd") + \
            flops.function_flops(split, f"{self.func}_bwd")

    def __call__(self, policy) -> tuple:
        """(split module, activation bytes, host bytes, extra FLOPs, extra %, joint peak)."""
        split = remat(self.module, policy, mode="split", func=self.func, levels=self.levels,
                      round_exact=self.round_exact)
        # the joint form as rp.jit builds it: where XLA deletes barriers (CPU), tied
        joint = remat(self.module, policy, mode="joint", func=self.func, levels=self.levels,
                      tie_to_cotangent=deletes_barriers(), round_exact=self.round_exact)
        extra = self._flops(split) - self.base
        host = sum(r.bytes for r in split.residuals if r.offload is not None and
                   r.offload.dst in contract.HOST_KINDS)
        return (split, activation_bytes(split.residuals), host, extra,
                extra / self.base * 100 if self.base else 0.0,
                estimate_memory(joint, model="xla")[self.func].peak_bytes)


def pareto(module, budgets=None, *, points: int = 20, offload=None, device=None,
           func: str = "main", solver: str = "auto", levels: str = "auto",
           monotone=False, round_exact: bool = True) -> list[ParetoPoint]:
    """Budget -> activation bytes, extra FLOPs, joint peak and solve time, for a sweep of
    budgets (by default `points` from the minimum to no remat). A larger budget never
    costs more: a point whose plan costs more than the plan of a smaller budget takes
    that plan instead. A progress bar (on a terminal) shows once it takes a second.
    `plot_pareto` draws the result. `levels` as `rp.remat`'s (at the tightest budgets two
    levels can cost more FLOPs than a larger budget's plan, for a lower peak). `monotone`
    as `auto`'s (True or 'larger', 'smaller'): a budget whose plan would peak above a
    larger budget's takes another plan (its trial plans are made once for the whole sweep).
    `round_exact` as `rp.remat`'s: False plans, builds and counts each plan without
    roundings of f32/f64 residuals, as rp.jit builds on XLA:CPU (`variants.rounding`).
    """
    if budgets is None and (isinstance(points, bool) or not isinstance(points, int)
                            or points < 1):
        raise RematError(f"error: rp.pareto: points is how many budgets to plan, at least "
                         f"1, got {points!r}")
    lo, hi = bounds(module, func, AutoPolicy(0, offload=offload, device=device),
                    what="rp.pareto")
    measure = _Measure(module, func, levels, round_exact)
    if budgets is None:
        budgets = sorted({int(lo + (hi - lo) * k / max(points - 1, 1)) for k in range(points)})
    out = []
    best = None      # the cheapest plan so far
    with Progress(len(budgets), "pareto: planning budgets") as progress:
        for b in sorted(budgets):
            progress.advance()
            split, dev, host, extra, pct, peak = measure(
                auto(b, offload=offload, device=device, solver=solver, monotone=monotone))
            rep = split.plan_reports[0]
            point = ParetoPoint(b, dev, host, extra, pct, peak, rep.solution.seconds,
                                rep.solution.method)
            if best is not None and best.extra_flops < point.extra_flops:
                point = dataclasses.replace(best, budget=b, solve_seconds=point.solve_seconds)
            best = point
            out.append(point)
    return out


def policy_points(module, policies=FIXED_POLICIES, func: str = "main", *,
                  round_exact: bool = True) -> list[PolicyPoint]:
    """Each fixed policy (specs, or policies of `rp.policies` / JAX) measured as `pareto`
    measures its plans (`round_exact` as its): where the hand-picked choices sit beside the
    sweep."""
    from remat_passes.policy.policies import as_policy
    _own_backward(module, func, "rp.policy_points")
    measure = _Measure(module, func, round_exact=round_exact)
    out = []
    for policy in policies:
        _, dev, host, extra, pct, peak = measure(policy)
        out.append(PolicyPoint(as_policy(policy).spec, dev, host, extra, pct, peak))
    return out


def plot_pareto(points: list[ParetoPoint], fixed: list[PolicyPoint] | None = None, *,
                module=None, func: str = "main", ax=None, path: str | None = None,
                round_exact: bool = True):
    """Extra FLOPs (% over no remat) against the activation bytes kept: the sweep as a
    step line, and the fixed policies as labelled points (`fixed`, or measured on `module`
    with `policy_points`, `round_exact` as the sweep's). Returns matplotlib's Axes; `path`
    also saves the figure there. Needs matplotlib (`pip install "remat_passes[plot]"`)."""
    try:
        import matplotlib
        if ax is None and path is not None:
            matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("plot_pareto needs matplotlib: pip install \"remat_passes[plot]\" "
                          "(or pip install matplotlib)") from None
    if fixed is None and module is not None:
        fixed = policy_points(module, func=func, round_exact=round_exact)
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 4.2))
    xs = [q.activation_bytes for q in points]
    ys = [q.extra_pct for q in points]
    ax.step(xs, ys, where="post", marker="o", ms=3, label="auto(budget=...)")
    for q in fixed or []:
        ax.scatter([q.activation_bytes], [q.extra_pct], marker="s", color="black", zorder=3)
        ax.annotate(q.policy, (q.activation_bytes, q.extra_pct), textcoords="offset points",
                    xytext=(4, 4), fontsize=8)
    ax.set_xlabel("activation bytes kept for the backward")
    ax.set_ylabel("extra FLOPs (% over no remat)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right")
    if path is not None:
        ax.figure.savefig(path, bbox_inches="tight", dpi=120)
    return ax


def lower_peak_above(points: list[ParetoPoint]) -> list:
    """Per point, the point of a larger budget with the lowest joint peak where that peak is
    below this point's (else None): a smaller budget can need a larger peak, since what is
    recomputed is held at once (docs/policies.md, `auto`); `objective=peak` bounds the peak,
    and `monotone` holds each plan to the larger budgets' plans."""
    out, best = [None] * len(points), None
    for k in range(len(points) - 1, -1, -1):
        q = points[k]
        if best is not None and best.joint_peak < q.joint_peak:
            out[k] = best
        if best is None or q.joint_peak <= best.joint_peak:
            best = q
    return out


def format_pareto(points: list[ParetoPoint]) -> str:
    lines = ["budget | activations (device) | host | extra FLOPs | joint peak | solve",
             "---|---|---|---|---|---"]
    points = sorted(points, key=lambda q: q.budget)
    for q, lower in zip(points, lower_peak_above(points)):
        note = "" if lower is None else \
            f" (a larger budget peaks lower: {format_bytes(lower.joint_peak)} at " \
            f"{format_bytes(lower.budget)})"
        lines.append(f"{format_bytes(q.budget)} | {format_bytes(q.activation_bytes)} | "
                     f"{format_bytes(q.host_bytes)} | {format_flop(q.extra_flops)} "
                     f"({q.extra_pct:+.1f}%) | {format_bytes(q.joint_peak)}{note} | "
                     f"{q.solve_seconds:.3f} s {q.method}")
    return "\n".join(lines)
