"""`rp.remat`: the default pipeline on a copy of a Module, with the results read back."""
from __future__ import annotations

import dataclasses
import inspect

from remat_passes.ir import mlir
from remat_passes.ir.mlir import RematError, expect_module
from remat_passes.jax.module import compiled_cost, compiled_memory
from remat_passes.passes.base import PassState, parse_regex
from remat_passes.passes.manager import expand, run_pipeline
from remat_passes.passes.place_optimization_barriers import (PlaceOptimizationBarriers,
                                                             parse_groups)
from remat_passes.passes.remat import Remat
from remat_passes.passes.remat_partial_eval import parse_levels
from remat_passes.passes.segment_scans import parse_offload, parse_segments


def remat(module, policy=None, *, mode: str = "joint", prevent_cse: bool = True,
          prevent_cse_in_loops: bool = False, tie_to_cotangent: bool = False,
          barrier_groups: str = "per-use", scan_segments: int | str = 0,
          scan_segments_offload: str | None = None, func: str = "main",
          cotangent_args=None, region_regex=None, region_policy=None, levels: str = "auto",
          round_read_back: bool = False, round_exact: bool = True, fence_chains: bool = False,
          verify: bool = True):
    """Run the default remat pipeline on a copy of `module`; return the new Module.

    inline -> remat-partial-eval (policy, mode) -> insert-reduce-precision ->
    segment-scans (if scan_segments) -> place-optimization-barriers (if prevent_cse) ->
    annotate-host-offload -> strip-checkpoint-names -> fold-dot-transposes.
    `tie_to_cotangent`: for XLA:CPU, which deletes the barriers before it schedules, also
    make each recomputation wait for the cotangent by data (see
    place-optimization-barriers; rp.jit sets it when it compiles for CPU).
    `barrier_groups="per-region"`: one barrier per checkpoint region, as jax.checkpoint
    places them, instead of one per recomputation (place-optimization-barriers;
    rp.jit compiles both on GPU and keeps the smaller). `scan_segments=k` (or "sqrt": per
    loop, the k that keeps the fewest bytes): each scan keeps its carry every k iterations
    instead of its per-iteration residuals, and the backward reruns a segment's forward
    iterations from it (see segment-scans);
    `.residuals` still lists what the per-iteration policy keeps in a slot.
    `scan_segments_offload="pinned_host"` keeps those saved carries in host memory.
    `levels`: recomputation levels outside scans (remat-partial-eval's `levels`): "auto"
    (two under an auto policy, where they lower the peak estimate by 15%; else one), "1"
    (each value recomputed once, as jax.checkpoint does) or "2".
    `round_read_back`: also round the f32/f64 residuals the backward only reads back, as
    jax.checkpoint does (exact: the values do not change; see insert-reduce-precision):
    XLA:GPU needs less scratch for such a split forward (rp.jit sets it there).
    `round_exact=False`: round no f32/f64 residual at all (the identity for them), so that
    XLA:CPU does not compute a kept elementwise value twice, for its rounding and again
    inside the fusions that read it; `auto` then prices no such rounding (see
    insert-reduce-precision's round-exact; rp.jit sets it on XLA:CPU).
    `fence_chains`: give a backward value XLA would compute again inside several readers a
    barrier of its own, so XLA computes it once (place-optimization-barriers' fence-chains;
    rp.jit sets it for XLA:CPU of jaxlib >= 0.11).
    The residuals partial-eval chose are on the result as `.residuals`, and what it wants
    the user to know (e.g. a while loop it treated as one atomic op) as
    `.remarks`; `.timings` has each step's seconds.
    `verify` runs the MLIR verifier on the result (`remat-opt --verify-each`
    verifies after every step instead).
    """
    options = _options(module, policy, mode=mode, prevent_cse=prevent_cse,
                       prevent_cse_in_loops=prevent_cse_in_loops,
                       tie_to_cotangent=tie_to_cotangent, barrier_groups=barrier_groups,
                       scan_segments=scan_segments, scan_segments_offload=scan_segments_offload,
                       func=func, cotangent_args=cotangent_args, region_regex=region_regex,
                       region_policy=region_policy, levels=levels,
                       round_read_back=round_read_back, round_exact=round_exact,
                       fence_chains=fence_chains)
    return _run(module, options, (Barriers(options["barrier_groups"],
                                           options["tie_to_cotangent"]),), verify)[0]


def _options(module, policy, *, mode, prevent_cse, prevent_cse_in_loops, tie_to_cotangent,
             barrier_groups, scan_segments, scan_segments_offload, func, cotangent_args,
             region_regex, region_policy, levels, round_read_back=False,
             round_exact=True, fence_chains=False) -> dict:
    """rp.remat's arguments checked and read, as the options of the `remat` pipeline."""
    expect_module(module, "rp.remat")
    if mode not in ("joint", "split"):
        raise RematError(f"error: mode must be 'joint' or 'split', got {mode!r}")
    parsed = {}
    for name, parse, value in (("levels", parse_levels, str(levels)),
                               ("scan_segments", parse_segments, scan_segments),
                               ("scan_segments_offload", parse_offload, scan_segments_offload),
                               ("barrier_groups", parse_groups, barrier_groups)):
        try:
            parsed[name] = parse(value)
        except ValueError as e:
            raise RematError(f"error: {name}: {e}") from None
    options = dict(policy=policy, mode=mode, func=func, prevent_cse=prevent_cse,
                   prevent_cse_in_loops=prevent_cse_in_loops,
                   tie_to_cotangent=tie_to_cotangent, cotangent_args=cotangent_args,
                   round_read_back=bool(round_read_back), round_exact=bool(round_exact),
                   fence_chains=bool(fence_chains), **parsed)
    if options["round_read_back"] and not options["round_exact"]:
        raise RematError("error: round_read_back=True rounds f32 and f64 residuals, which "
                         "round_exact=False leaves unrounded: give one of them")
    if region_regex is not None:
        try:
            options["region_regex"] = parse_regex(region_regex) \
                if isinstance(region_regex, str) else region_regex
        except ValueError as e:
            raise RematError(f"error: bad region_regex: {e}") from None
    if region_policy is not None:
        options["region_policy"] = region_policy
    return options


@dataclasses.dataclass(frozen=True)
class Barriers:
    """How place-optimization-barriers keeps XLA from undoing the recomputation: `groups`
    (per-use or per-region) and, for XLA:CPU, whether it also ties the recomputation to the
    cotangent by data (`tie`). rp.jit builds several where neither is smaller everywhere."""
    groups: str = "per-use"
    tie: bool = False

    def __str__(self) -> str:
        return self.groups + (", tied" if self.tie else "")


def remat_variants(module, variants, policy=None, **kwargs) -> list:
    """`rp.remat(module, policy, barrier_groups=v.groups, tie_to_cotangent=v.tie, **kwargs)`
    for each `Barriers` v of `variants`, in that order; the steps before
    place-optimization-barriers (the plan among them) run once, and the rest once per
    variant, on a copy each (rp.jit builds several and keeps the smaller)."""
    bound = inspect.signature(remat).bind(module, policy, **kwargs)   # (its checks, defaults)
    bound.apply_defaults()
    args = dict(bound.arguments)
    verify = args.pop("verify")
    options = _options(**args)
    try:
        variants = tuple(Barriers(parse_groups(v.groups), bool(v.tie)) for v in variants)
    except ValueError as e:
        raise RematError(f"error: barrier_groups: {e}") from None
    return _run(module, options, variants, verify)


def pass_state(module, out) -> PassState:
    """What a pipeline over `out` (a copy of `module`) starts from: the module's region
    policies, file name and dimension symbols, and XLA to compile `auto(score=xla)`'s
    candidates with."""
    state = PassState(region_policies=dict(out.region_policies), filename=module.filename)
    state.dim_symbols = dict(module.dim_symbols)
    state.compiled_cost = compiled_cost
    state.compiled_memory = compiled_memory
    return state


def _run(module, options: dict, variants: tuple, verify: bool) -> list:
    """The default pipeline on a copy of `module`, once per `Barriers` variant (see
    `remat_variants`)."""
    func = options["func"]
    out = module.clone()
    state = pass_state(module, out)
    steps = expand([Remat(**options)])
    cut = next((i for i, p in enumerate(steps) if isinstance(p, PlaceOptimizationBarriers)),
               len(steps))
    run_pipeline(out.op, steps[:cut], state, verify_each=False)
    # (the first variant goes on with the original and the analyses the steps kept)
    copies = [(out, state)] + [(out.clone(), state.fork()) for _ in variants[1:]]
    results = []
    for v, (mod, st) in zip(variants, copies):
        rest = [dataclasses.replace(p, groups=v.groups, tie_to_cotangent=v.tie)
                if isinstance(p, PlaceOptimizationBarriers) else p for p in steps[cut:]]
        run_pipeline(mod.op, rest, st, verify_each=False)
        if verify:   # the result, once (the CLI's --verify-each checks after every step)
            mlir.verify(mod.op.operation, module.filename, after="remat")
        # (where the backward runs in loop bodies: over the functions made of them)
        mod.residuals = st.results_of(func)
        mod.remarks = list(st.remarks)
        mod.timings = list(st.timings)
        mod.plan_reports = st.results_of(func, "plan_reports")
        mod.segmented = st.results_of(func, "segmented")    # scan loops segment-scans rewrote
        mod.dim_symbols = st.dim_symbols
        results.append(mod)
    return results
