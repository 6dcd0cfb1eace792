"""Which programs `rp.jit` builds for one input signature, and which one it runs.

Neither placement of optimization barriers is smaller everywhere, nor tying the
recomputation to the cotangent in a split backward, nor rounding the residuals where nothing
is recomputed (`rp.jit`'s module docstring gives the measurements). So rp.jit rewrites the
function once per variant (`barrier_variants`; `remat_variants` makes the plan once),
compiles each distinct program and runs the one with the smallest XLA footprint (`smaller`).
The benchmarks build what rp.jit would from the same functions.
"""
from __future__ import annotations

import jax

from remat_passes import jax_compat
from remat_passes.api.remat import Barriers
from remat_passes.cost.xla_schedule import deletes_barriers, fences_chains  # noqa: F401
from remat_passes.passes.diagnostics import Remark

BARRIER_GROUPS = ("per-use", "per-region", "smaller")


def needs_tie(backend: str | None = None) -> bool:
    """Does `backend` need the recomputation tied to the cotangent by data? XLA:CPU
    deletes optimization barriers before it schedules (place-optimization-barriers)."""
    return deletes_barriers(backend)


def rounds_read_back(mode: str, backend: str | None = None) -> bool:
    """Does rp.jit round the f32 residuals the backward only reads back (rp.remat's
    `round_read_back`)? In split form on a GPU: XLA:GPU then needs less scratch for the
    forward, as for jax.checkpoint's (insert-reduce-precision); the values do not change."""
    return mode == "split" and (backend or jax.default_backend()) == "gpu"


def rounds_exact(backend: str | None = None) -> bool:
    """Does rp.jit round the f32/f64 residuals a recomputation reads to their own type
    (rp.remat's `round_exact`)? Not on XLA:CPU: there the rounding is the identity (XLA:CPU
    computes f32 in f32) and only makes XLA compute a kept elementwise value twice, for its
    rounding and again inside each fusion that reads it (insert-reduce-precision). On other
    backends they stay, as jax.checkpoint rounds them, until one has measured them."""
    return (backend or jax.default_backend()) != "cpu"


def rounding(mode: str, read_back: bool = False, backend: str | None = None) -> dict:
    """rp.remat's rounding options as rp.jit sets them for `mode` (`read_back`: the variant
    with every residual rounded, where nothing is recomputed): `round_read_back` where it
    rounds those too (`rounds_read_back`), `round_exact=False` where it rounds no f32/f64
    residual (`rounds_exact`), else none (rp.remat's defaults)."""
    if read_back or rounds_read_back(mode, backend):
        return {"round_read_back": True}
    return {} if rounds_exact(backend) else {"round_exact": False}


def barrier_variants(mode: str, tie_to_cotangent: bool | None = None,
                     barrier_groups: str | None = None, prevent_cse: bool = True) -> tuple:
    """The barrier variants rp.jit builds, compiles and runs the smallest of (rp.jit's
    module docstring): both groupings for "smaller", and by default where barriers decide
    (a backend that keeps them, no tie; CPU from jaxlib 0.11); in split form on CPU, by
    default, the recomputation tied to the cotangent and not."""
    tie = needs_tie() if tie_to_cotangent is None else tie_to_cotangent
    if not prevent_cse:
        return (Barriers("per-use"),)      # no barriers at all
    # where XLA:CPU deletes barriers before it fuses (jaxlib 0.10) the grouping changes
    # nothing there: one variant; later ones split fusions at barriers, as GPUs do
    chosen = barrier_groups or ("per-use" if tie and jax_compat.xla_cpu_fuses_across_barriers()
                                else "smaller")
    groupings = ("per-use", "per-region") if chosen == "smaller" else (chosen,)
    tied = (True, False) if tie and mode == "split" and tie_to_cotangent is None else (tie,)
    return tuple(Barriers(g, t) for t in tied for g in groupings)


def ties(module) -> int:
    """How many `is_finite` ops the module has: place-optimization-barriers' ties to the
    cotangent, beyond the exported function's own (none are placed where nothing is
    recomputed)."""
    return str(module).count("stablehlo.is_finite")


def recomputes_nothing(exported, module) -> bool:
    """Does `module`, rewritten from `exported`, recompute nothing? (It has no optimization
    barrier of its own: place-optimization-barriers places one for each recomputation, and
    its fences of saved values only beside those.) One recomputing module has no barrier
    either: per use, where the forward keeps no activation, on a jaxlib that keeps barriers
    through CSE. For it the answer is True, and harmless: every residual there is an
    argument, so rp.jit asks for no variant with the residuals rounded (`round_read_back`):
    it would be the same program."""
    return str(module).count("stablehlo.optimization_barrier") == \
        str(exported).count("stablehlo.optimization_barrier")


def smaller(built: list):
    """Of the programs built with each barrier variant (or with and without rounded
    residuals), the one with the smaller XLA footprint (the first where the backend does
    not say; the first of equals), with what each measured and a remark saying which ran."""
    if len(built) == 1:
        return built[0]
    sizes = {b.barriers: b.footprint() for b in built}
    best = built[0]
    if all(v is not None for v in sizes.values()):
        best = min(built, key=lambda b: sizes[b.barriers])
    report(best, sizes)
    return best


def report(best, sizes: dict, kept: bool = False) -> None:
    """Give the Lowered `best` what each variant measured (`sizes`, by `Lowered.barriers`)
    and a remark saying which ran; `kept`: the choice was read from the disk cache, where
    an earlier process stored it, and the others were not compiled again."""
    best.footprints = dict(sizes)
    other = ", ".join(f"{g} {v:,} B" for g, v in sizes.items()
                      if g != best.barriers and v is not None)
    what = f"optimization barriers {best.barriers}" if not any(
        ", rounded" in g for g in sizes) else \
        "nothing recomputed, residuals " + ("rounded" if best.rounded else "not rounded")
    best.module.remarks = list(best.module.remarks) + [Remark(
        f"rp.jit: {what}: XLA's footprint "
        + (f"{sizes[best.barriers]:,} B against {other}" if other
           else "not reported by this backend; kept the first")
        + (" (the choice read from the disk cache, as an earlier process measured it; the "
           "others not compiled again)" if kept else ""))]
