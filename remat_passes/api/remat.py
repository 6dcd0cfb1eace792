"""`rp.remat`: the default pipeline on a copy of a Module, with the results read back."""
from __future__ import annotations

from remat_passes.ir import mlir
from remat_passes.ir.mlir import RematError
from remat_passes.jax.module import Module
from remat_passes.passes.base import PassState, parse_regex
from remat_passes.passes.manager import run_pipeline
from remat_passes.passes.place_optimization_barriers import parse_groups
from remat_passes.passes.remat import Remat
from remat_passes.passes.segment_scans import parse_offload, parse_segments


def remat(module, policy=None, *, mode: str = "joint", prevent_cse: bool = True,
          prevent_cse_in_loops: bool = False, tie_to_cotangent: bool = False,
          barrier_groups: str = "per-use", scan_segments: int | str = 0,
          scan_segments_offload: str | None = None, func: str = "main",
          cotangent_args=None, region_regex=None, region_policy=None, verify: bool = True):
    """Run the default remat pipeline on a copy of `module`; return the new Module.

    inline -> remat-partial-eval (policy, mode) -> insert-reduce-precision ->
    segment-scans (if scan_segments) -> place-optimization-barriers (if prevent_cse) ->
    annotate-host-offload -> strip-checkpoint-names. `tie_to_cotangent`: for XLA:CPU,
    which deletes the barriers before it schedules, also make each recomputation wait for
    the cotangent by data (see place-optimization-barriers; rp.jit sets it when it compiles
    for CPU). `barrier_groups="per-region"`: one barrier per checkpoint region, as
    jax.checkpoint places them, instead of one per recomputation (place-optimization-barriers;
    rp.jit compiles both on GPU and keeps the smaller). `scan_segments=k` (or "sqrt": per
    loop, the k that keeps the fewest bytes): each scan keeps its carry every k iterations instead of its per-iteration residuals, and
    the backward reruns a segment's forward iterations from it (see segment-scans);
    `.residuals` still lists what the per-iteration policy keeps in a slot.
    `scan_segments_offload="pinned_host"` keeps those saved carries in host memory.
    The residuals partial-eval chose are on the result as `.residuals`, and what it wants
    the user to know (e.g. a while loop it treated as one atomic op) as
    `.remarks`; `.timings` has each step's seconds.
    `verify` runs the MLIR verifier on the result (`remat-opt --verify-each`
    verifies after every step instead).
    """
    if not isinstance(module, Module):
        raise TypeError("rp.remat takes a remat_passes.Module (from rp.export_vjp, rp.export, "
                        f"rp.load or rp.Module.parse), got {type(module).__name__}")
    if mode not in ("joint", "split"):
        raise RematError(f"error: mode must be 'joint' or 'split', got {mode!r}")
    try:
        scan_segments = parse_segments(scan_segments)
    except ValueError as e:
        raise RematError(f"error: scan_segments: {e}") from None
    try:
        scan_segments_offload = parse_offload(scan_segments_offload)
    except ValueError as e:
        raise RematError(f"error: scan_segments_offload: {e}") from None
    try:
        barrier_groups = parse_groups(barrier_groups)
    except ValueError as e:
        raise RematError(f"error: barrier_groups: {e}") from None
    options = dict(policy=policy, mode=mode, barrier_groups=barrier_groups,
                   func=func, prevent_cse=prevent_cse,
                   prevent_cse_in_loops=prevent_cse_in_loops,
                   tie_to_cotangent=tie_to_cotangent, scan_segments=scan_segments,
                   scan_segments_offload=scan_segments_offload,
                   cotangent_args=cotangent_args)
    if region_regex is not None:
        try:
            options["region_regex"] = parse_regex(region_regex) \
                if isinstance(region_regex, str) else region_regex
        except ValueError as e:
            raise RematError(f"error: bad region_regex: {e}") from None
    if region_policy is not None:
        options["region_policy"] = region_policy
    out = module.clone()
    state = PassState(region_policies=dict(out.region_policies), filename=module.filename)
    state.dim_symbols = dict(module.dim_symbols)
    run_pipeline(out.op, [Remat(**options)], state, verify_each=False)
    if verify:   # the result, once (the CLI's --verify-each checks after every step)
        mlir.verify(out.op.operation, module.filename, after="remat")
    out.residuals = state.residuals.get(func, [])
    out.remarks = list(state.remarks)
    out.timings = list(state.timings)
    out.plan_reports = state.plan_reports.get(func, [])
    out.segmented = state.segmented.get(func, [])    # scan loops segment-scans rewrote
    out.dim_symbols = state.dim_symbols
    return out
