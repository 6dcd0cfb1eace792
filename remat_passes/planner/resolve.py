"""Turn the `auto` policies in force into plans: `resolve` solves each for a function's
analysis and puts a `PlannedPolicy` (its per-op verdicts) in its place.

`for_peak` chooses, for `objective=peak`, among plans for trial residual budgets that
the caller (the pipeline runner) makes and measures: the planner itself runs no pass.
`by_compiled_cost` chooses, for `score=xla`, among candidate plans the caller compiles.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from remat_passes.core.plan import PolicyDecider
from remat_passes.core.residuals import describe_value
from remat_passes.cost import flops
from remat_passes.ir import graph
from remat_passes.ir.mlir import RematError, op_id
from remat_passes.ir.verdicts import Offloadable, Recompute, Saveable
from remat_passes.planner.model import Problem, Solution, build_problem
from remat_passes.planner.report import PlanReport
from remat_passes.planner.solvers import minimum_bytes, solve
from remat_passes.planner.working_set import TOWARD, equal_cost_plan
from remat_passes.policy.auto import AutoPolicy, PlannedPolicy, auto
from remat_passes.policy.policies import (dots_saveable, dots_with_no_batch_dims_saveable,
                                          everything_saveable, nothing_saveable)
from remat_passes.policy.scopes import ScopePolicies

_SAVE = everything_saveable   # for the ops a plan leaves undecided (free ones, say)


def _verdicts(p: Problem, sol: Solution, offload_kind) -> dict:
    out = {}
    prod = p.value_producer
    offloaded_ops = set(int(prod[v]) for v in np.nonzero(sol.offloaded)[0] if prod[v] >= 0)
    for node, op in enumerate(p.ops):
        if node in p.stands_for:      # a choice for several ops: they are recomputed,
            if sol.recompute[node]:   # else left to the fallback (saved), those it holds
                out.update((op_id(each), Recompute) for each in p.stands_for[node])
            else:                     # saved where the op they are in is recomputed
                out.update((op_id(each), Saveable) for each in p.held.get(node, ()))
            continue
        if sol.recompute[node]:
            out[op_id(op)] = Recompute
        elif node in offloaded_ops:
            out[op_id(op)] = Offloadable("device", offload_kind)
        else:
            out[op_id(op)] = Saveable
    return out


class BudgetBelowMinimum(RematError):
    """`auto`'s budget is below the least a plan of the function can keep."""

    def __init__(self, message, policy, budget: int, minimum: int, no_remat: int):
        super().__init__(message)
        self.policy, self.budget, self.minimum, self.no_remat = policy, budget, minimum, no_remat


def plan_auto(policy: AutoPolicy, a, scope_re, kept_whole, governed, *,
              compare_exact=False, round_exact=True) -> tuple[dict, PlanReport]:
    """Solve `policy` for analysis `a`: ({op_id: verdict}, report). `governed`: the ops
    it decides (a `Governed`, which knows the others' verdicts)."""
    profile = policy.profile
    p, b = build_problem(a, scope_re, kept_whole, profile, policy.offload is not None,
                         governed, round_exact=round_exact)
    no_remat = p.no_remat_bytes()
    budget = policy.budget.resolve(no_remat)
    minimum = minimum_bytes(p)
    if budget < minimum:
        chains = a.scope_chains(scope_re)      # (values of regions it leaves to them?)
        regions = any(chains[pos] and not governed(pos)
                      for pos in range(len(a.ops)) if not a.backward[pos])
        raise BudgetBelowMinimum(
            f"error: {policy.spec}: the budget, {budget} B of activations, is below the minimum "
            f"this function can keep, {minimum} B (outputs of side-effecting ops and values "
            "nothing may recompute" + (", and what checkpoint regions with a policy of their "
                                       "own save for the backward (an auto region's values "
                                       "count as saved)" if regions else "")
            + f"; the function's arguments are not counted); without remat it keeps "
            f"{no_remat} B", policy, budget, minimum, no_remat)
    sol, exact = solve(p, budget, policy.solver, compare_exact=compare_exact)
    if policy.ties in TOWARD:        # (what ties=peak chose, where it kept that plan)
        sol = equal_cost_plan(p, budget, sol, policy.ties, policy.solver) or sol
    verdicts = _verdicts(p, sol, policy.offload)
    for op in b.free_ops:      # (the fallback, save, would stack what the model never does)
        verdicts.setdefault(op_id(op), Recompute)
    cost = {op_id(op): (op.name, b.flops[n], p.op_cost[n]) for n, op in enumerate(p.ops)}
    recomputed, unpriced = [], []
    for n in np.nonzero(sol.recompute)[0]:
        if n in p.stands_for:       # (what it stands for, say "the ops in the branches ...")
            recomputed.append((p.labels[n], b.flops[n], p.op_cost[n], "top"))
            continue
        op = p.ops[n]
        what = (f"{graph.jax_type_str(op.results[0].type)} "
                f"{describe_value(op.results[0], a.func_op)}") if len(op.results) else op.name
        recomputed.append((what, b.flops[n], p.op_cost[n], p.labels[n]))
        target = flops.unpriced_target(op)
        if target is not None:
            unpriced.append(target)
    report = PlanReport(policy.spec, budget, minimum, no_remat, sol, exact, profile.name,
                        (p.n_ops, p.n_values), cost, recomputed,
                        p.kept_argument_bytes(sol.available), unpriced)
    return verdicts, report


def fixed_verdicts(a, policies: ScopePolicies, scope_re) -> PolicyDecider:
    """The forward verdicts of the ops of analysis `a` as far as `policies` fix them
    (`PolicyDecider.forward_verdict`): an auto policy not yet planned (or a Python policy
    this process does not have) counts as saving everything."""
    def fixed(pol):
        return everything_saveable if isinstance(pol, (AutoPolicy, str)) else pol
    known = ScopePolicies(fixed(policies.module_policy),
                          {k: fixed(p) for k, p in policies.recorded.items()},
                          fixed(policies.scope_policy))
    return PolicyDecider(a, known, scope_re)


class Governed:
    """Which ops a plan decides: `governed(pos)`, the ops whose forward verdict its policy
    gives (`PolicyDecider.decided_by` of `fixed_verdicts`); for the module policy (`key`
    None) those outside checkpoint regions and a region's outputs read outside it, for
    the policy of the region recorded as `key` (graph.scope_key) that region's others. A
    region with a policy of its own keeps its verdicts. remat-partial-eval plans with it,
    and so do `bounds` and the trial plans (`planning_problem`), so that they agree on the
    least a plan keeps."""

    def __init__(self, fixed: PolicyDecider, key=None):
        self.fixed, self.key = fixed, key

    def __call__(self, pos) -> bool:
        scope = self.fixed.decided_by(pos)
        if self.key is None:
            return scope is None
        return bool(scope) and graph.scope_key(scope) == self.key

    def body_op(self, op, scope_re) -> bool:
        """For an op of a scan loop's body (which the loop's rule decides per iteration
        by the policy of the op's own outermost scope): is that policy the plan's?"""
        chain = graph.scope_chain(op, scope_re)
        if self.key is None:
            return not chain
        return bool(chain) and graph.scope_key(chain[0]) == self.key


def resolve(policies, a, scope_re, kept_whole, *, compare_exact=False, round_exact=True):
    """Replace the auto policies of a ScopePolicies by their solutions (PlannedPolicy).
    Returns the reports. `round_exact`: does the pipeline round f32 and f64 residuals
    (insert-reduce-precision round-exact=; priced where it does)?"""
    reports = []
    if isinstance(policies.module_policy, AutoPolicy):
        auto_policy = policies.module_policy
        fixed = fixed_verdicts(a, policies, scope_re)
        verdicts, report = plan_auto(auto_policy, a, scope_re, kept_whole, Governed(fixed),
                                     compare_exact=compare_exact, round_exact=round_exact)
        policies.module_policy = PlannedPolicy(auto_policy.spec, verdicts, _SAVE, report)
        reports.append(report)
    for key, pol in list(policies.recorded.items()):
        if isinstance(pol, AutoPolicy):
            fixed = fixed_verdicts(a, policies, scope_re)   # (with the plans made so far)
            verdicts, report = plan_auto(pol, a, scope_re, kept_whole, Governed(fixed, key),
                                         compare_exact=compare_exact,
                                         round_exact=round_exact)
            policies.recorded[key] = PlannedPolicy(pol.spec, verdicts, _SAVE, report)
            reports.append(report)
    if isinstance(policies.scope_policy, AutoPolicy):
        raise RematError("error: region-policy=auto(...) is not supported: give the scopes "
                         "made by region-regex a fixed policy, or use auto as the module policy")
    return reports


def has_auto(policies) -> bool:
    return isinstance(policies.module_policy, AutoPolicy) or any(
        isinstance(p, AutoPolicy) for p in policies.recorded.values())


REFINE_ROUNDS = 3   # objective=peak: rounds of 7 or 14 more trial budgets while none fits
CHECK_SLACK = 1.15  # objective=peak checked against XLA: the plans it may compile are those
                    # estimated within this of the budget (the estimate's error bound)
CHECK_MAX = 8       # ... at most this many of them


@dataclasses.dataclass
class PeakChoice:
    """What `for_peak` decided: `policy`, the residual-budget policy to plan with, its
    joint peak as estimated and its modelled cost, for the peak budget `budget`. Where the
    choice was checked against XLA (`check`): `compiled`, XLA's footprint of it (above the
    budget where no plan compiled fits it); `replaced`, where the estimate's own choice
    was compiled first and another taken, its (policy, estimated peak, compiled
    footprint); `compiles`, the plans compiled."""
    policy: AutoPolicy
    estimated: int
    cost: float
    budget: int
    compiled: int | None = None
    replaced: tuple | None = None
    compiles: int = 0


def for_peak(policy: AutoPolicy, lo: int, hi: int, trial, check=None) -> PeakChoice:
    """objective=peak: the residual-budget policy whose plan is the cheapest among those
    whose joint form's static peak estimate fits the budget. Tries residual budgets from
    `lo` (the minimum) to `hi` (no remat), 13 of them: the peak is not monotone in the
    residual bytes (recomputing more can raise it: what is recomputed is live at once),
    so every candidate is measured; where none fits, 7 more between the neighbours of the
    one that peaks lowest, and, where none fits yet, 7 more around the lower of those
    neighbours (measured: Equinox's valley at residual budget 281,815 B, which the trials
    at 223,104 and 334,656 B straddle), again (`REFINE_ROUNDS` times at most) while none
    fits.
    `trial(candidates)` plans the module for each candidate policy and returns (joint peak
    bytes, modelled recompute cost) of each: the pipeline runner does that on copies of the
    module (with score=xla compiling them side by side: the grid's 12 trials are asked for
    at once, and each round of 7). A percentage is of the no-remat peak.
    `check(candidate)`, where given, is XLA's footprint of the candidate's joint program
    compiled (None: it cannot be compiled). The estimate does not model how XLA packs its
    heap (a hole can put a plan over the budget), so the choice is compiled; where it does
    not fit, the other plans estimated within `CHECK_SLACK` of the budget are, cheapest
    first (`CHECK_MAX` compiles in all), and the first that fits is taken. Where none
    fits, the one XLA allocates least for (the estimate's choice where it is that one);
    where the estimate fits none, the first that fits as compiled, else it is the error
    below."""
    trials: dict = {}

    def measure(rbs):
        new = [rb for rb in dict.fromkeys(rbs) if rb not in trials]
        candidates = [auto(rb, offload=policy.offload, device=policy.device,
                           solver=policy.solver, monotone=False, ties="none") for rb in new]
        for rb, candidate in zip(new, candidates):
            candidate.spec = f"{policy.spec} (residual budget {rb} B)"
        for rb, candidate, result in zip(new, candidates, trial(candidates) if new else ()):
            trials[rb] = (*result, candidate)
    measure([hi])
    budget = policy.budget.resolve(trials[hi][0])   # a percentage: of the no-remat peak
    measure([int(lo + (hi - lo) * k / 12) for k in range(13)])
    def fits_yet():
        return any(t[0] <= budget for t in trials.values())
    for _ in range(REFINE_ROUNDS):   # the valley of the peak can fall between two points:
        if fits_yet():               # look closer there
            break
        grid = sorted(trials)
        if len(grid) == 1:           # (the minimum is no remat: one plan, nothing between)
            break
        k = min(range(len(grid)), key=lambda j: trials[grid[j]][0])
        side = min((j for j in (k - 1, k + 1) if 0 <= j < len(grid)),
                   key=lambda j: trials[grid[j]][0])
        for center in (k, side):     # then around the lower neighbour: the floor may lie
            if fits_yet():           # just beyond it (a valley narrower than the grid)
                break
            left, right = grid[max(center - 1, 0)], grid[min(center + 1, len(grid) - 1)]
            measure([int(left + (right - left) * j / 8) for j in range(1, 8)])
    tried = sorted(trials.values(), key=lambda t: t[1])   # cheapest first (ties: as made)
    fits = [t for t in tried if t[0] <= budget]
    chosen = PeakChoice(fits[0][2], fits[0][0], fits[0][1], budget) if fits else None
    if check is not None:
        checked = _checked_for_peak(budget, tried, fits[0] if fits else None, check)
        chosen = checked or chosen
    if chosen is None:
        lowest = min(t[0] for t in tried)
        measured = "XLA's footprint of each compiled" if policy.score == "xla" else \
            "as estimated"
        raise RematError(
            f"error: {policy.spec}: the peak budget, {budget} B, is below the lowest joint "
            f"peak of the {len(tried)} plans tried, {lowest} B ({measured}; without remat: "
            f"{trials[hi][0]} B; the peak is not monotone in the residual bytes, so a plan "
            "between the residual budgets tried may peak lower)")
    return chosen


def _checked_for_peak(budget, tried, first, check) -> PeakChoice | None:
    """`for_peak`'s check against XLA: `first` (the estimate's choice, or None) compiled,
    then the others of `tried` (cheapest first) estimated within `CHECK_SLACK` of the
    budget, until one fits; where none does, the least compiled (None where the estimate
    fit none). None also where `check` cannot compile the plan."""
    order = ([first] if first else []) + [
        t for t in tried if t is not first and t[0] <= budget * CHECK_SLACK]
    compiled = []
    for t in order[:CHECK_MAX]:
        footprint = check(t[2])
        if footprint is None:
            return None
        compiled.append((footprint, t))
        if footprint <= budget:
            break
    else:
        if first is None:
            return None
    footprint, (peak, cost, candidate) = min(compiled, key=lambda c: c[0]) \
        if compiled[-1][0] > budget else compiled[-1]      # (the first of equals)
    replaced = (first[2], first[0], compiled[0][0]) \
        if first and candidate is not first[2] else None
    return PeakChoice(candidate, peak, cost, budget, footprint, replaced, len(compiled))


MONOTONE_GRID = 12     # monotone: trial residual budgets, the minimum to no remat in 12 steps
MONOTONE_SLACK = 1.02  # a peak within 2% of a larger budget's is not larger (the estimate's
                       # own error is larger than that)


@dataclasses.dataclass
class Trial:
    """One plan `monotone_peak` weighs: the residual budget it was planned at, the bytes
    it keeps, its peak as estimated and its modelled recompute cost (seconds)."""
    budget: int
    kept: int
    peak: int
    cost: float


@dataclasses.dataclass
class Monotone:
    """What `monotone_peak` decided: `chosen` is None where the plan for the budget
    stands (or, by the 'smaller' rule, where no plan can take its place); else the plan
    kept instead, because `own` (the plan for the budget) peaks above `lower`, the
    lowest-peaking plan chosen for a larger grid budget (`lower_for`)."""
    own: Trial
    lower: Trial | None
    lower_for: int | None
    chosen: Trial | None
    trials: int

    @property
    def rises(self) -> bool:
        """Does the plan for the budget peak above `lower` (beyond `MONOTONE_SLACK`)?"""
        return self.lower is not None and self.own.peak > self.lower.peak * MONOTONE_SLACK


def monotone_grid(lo: int, hi: int) -> list[int]:
    """`monotone_peak`'s trial residual budgets: `lo` to `hi` in `MONOTONE_GRID` steps."""
    return sorted({int(lo + (hi - lo) * k / MONOTONE_GRID) for k in range(MONOTONE_GRID + 1)})


def monotone_peak(budget: int, lo: int, hi: int, trial, rule: str = "larger") -> Monotone:
    """A smaller budget must not need a larger peak: the planner minimises recompute cost
    within the budget, and what it recomputes is held at once in the backward, so a plan
    that keeps less can peak above one that keeps more (measured: the benchmark conv net,
    whose plans at 0.30 to 0.75 MB of activations peak 9 to 13% above the plan at 0.90 MB).
    The plans for `MONOTONE_GRID` + 1 trial residual budgets from `lo` (the minimum) to
    `hi` (no remat) are weighed, from the largest down, each as this function would
    decide it: a grid budget's plan stands if its peak is within `MONOTONE_SLACK` of the
    lowest peak chosen for the grid budgets above it. The plan for `budget` itself is
    held to the same test against the grid budgets above it. Where a plan fails it:
    - rule 'larger': the plan chosen for the next grid budget above is taken. It keeps
      more than the budget and, the planner being cheapest within each budget, recomputes
      no more; the sweep of chosen plans never rises (+ the slack) as the budget falls.
    - rule 'smaller': the cheapest grid plan within the budget that passes is taken. It
      keeps within the budget and recomputes more; where there is none, the plan stands
      (`Monotone.chosen` None).
    `trial(residual budget)` plans a copy of the module (as the pass would, two levels
    included) and returns a `Trial`. Trials of budgets below `budget` are made only
    where rule 'smaller' looks for a plan."""
    if rule not in ("larger", "smaller"):
        raise ValueError(f"rule must be larger or smaller, got {rule!r}")
    grid = monotone_grid(lo, hi)
    made: dict = {}

    def at(rb) -> Trial:
        if rb not in made:
            made[rb] = trial(rb)
        return made[rb]

    def cheapest_under(limit_budget, cap):
        fits = [at(g) for g in grid if g <= limit_budget]
        fits = [t for t in fits if t.peak <= cap * MONOTONE_SLACK]
        return min(fits, key=lambda t: (t.cost, -t.kept)) if fits else None

    own = at(budget)
    lower, lower_for = None, None   # the lowest-peaking plan chosen for a grid budget above
    above = None                    # the plan chosen for the last grid budget decided
    for g in reversed([g for g in grid if g > budget]):
        natural = at(g)
        chosen = natural
        if lower is not None and natural.peak > lower.peak * MONOTONE_SLACK:
            chosen = above if rule == "larger" else cheapest_under(g, lower.peak) or natural
        if lower is None or chosen.peak < lower.peak:
            lower, lower_for = chosen, g
        above = chosen
    m = Monotone(own, lower, lower_for, None, len(made))
    if m.rises:
        m.chosen = above if rule == "larger" else cheapest_under(budget, lower.peak)
        m.trials = len(made)
    return m


# score=xla's other candidates: JAX's policies that need no names (the ones a user reaches
# for first), and the planner's own solutions at their byte counts
FIXED_CANDIDATES = (everything_saveable, dots_saveable, dots_with_no_batch_dims_saveable,
                    nothing_saveable)


@dataclasses.dataclass
class Scored:
    """One candidate of `by_compiled_cost`: its policy, the activation bytes its plan keeps
    and XLA's compiled FLOPs + transcendentals of its split form."""
    policy: object
    kept: int
    cost: float
    label: str


def by_compiled_cost(policy: AutoPolicy, trial) -> tuple[object, list[Scored], int]:
    """score=xla: the candidate whose compiled programs XLA counts the fewest FLOPs in,
    among those within the budget. XLA's optimizer fuses and duplicates cheap producers in
    ways the planner's model does not see (a saved elementwise value can be computed once
    for the output and again inside each consumer's fusion), so the model's cheapest plan
    is not always XLA's. Candidates: the planner's solution for `policy` (score=model),
    the same at `device=flops` (its cost is the FLOP count itself), JAX's fixed policies
    that need no names (`FIXED_CANDIDATES`) where they fit, and the planner's solution at
    each fitting fixed policy's byte count. `trial(candidate)` plans and compiles a copy of
    the module and returns (activation bytes, compiled cost, the budget in bytes or None).
    Returns (the chosen policy, every candidate scored, the budget); ties keep the
    planner's solution."""
    def planned(budget, device, label):
        candidate = auto(budget, device=device, solver=policy.solver, monotone=False,
                         ties="none")
        candidate.spec = policy.spec if label == "plan" else f"{policy.spec} ({label})"
        return candidate
    first = planned(policy.budget, policy.device, "plan")
    kept, cost, budget = trial(first)
    scored = [Scored(first, kept, cost, "the planner's solution")]
    tried = {(policy.device, kept)}

    def add(candidate, label):
        try:
            kept, cost, _ = trial(candidate)
        except RematError:      # (a fixed policy the function cannot take)
            return None
        if kept > budget:
            return None
        scored.append(Scored(candidate, kept, cost, label))
        return kept
    if (policy.device or "") != "flops":
        add(planned(budget, "flops", "device=flops"), "the planner's solution at device=flops")
    for fixed in FIXED_CANDIDATES:
        kept = add(fixed, fixed.spec)
        if kept is not None and (policy.device, kept) not in tried:
            tried.add((policy.device, kept))
            add(planned(kept, policy.device, f"budget {kept} B"),
                f"the planner's solution at {fixed.spec}'s {kept} B")
    best = min(range(len(scored)), key=lambda i: (scored[i].cost, i))
    return scored[best].policy, scored, budget
