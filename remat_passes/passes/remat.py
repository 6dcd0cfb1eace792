"""remat: the default pipeline, with the options users set.

`remat{policy=... mode=... prevent-cse=...}` expands into

    inline
    outline-loop-backwards{func mode}                (a backward inside loop bodies: the
                                                      steps below run on each body)
    remat-partial-eval{policy mode cotangent-args func region-regex region-policy}
    insert-reduce-precision{func region-regex round-read-back round-exact}
    segment-scans{segments func offload}             (scan-segments=k; loops rp.scan marked;
                                                      under auto, the segments it needs)
    sink-loop-constants{func}                        (loop-invariant constants, a mask:
                                                      computed inside the loops that read them)
    place-optimization-barriers{func in-loops tie-to-cotangent groups fence-chains}
                                                     (only with prevent-cse=true)
    annotate-host-offload{func}
    strip-checkpoint-names
    fold-dot-transposes{func}                        (a kept product its readers transpose:
                                                      computed in their order)
    inline                                           (the outlined bodies back; else nothing)

and the pipeline runner runs the steps one by one, so `--verify-each` and
`--mlir-print-ir-before/after-all` apply to each. `remat_passes.remat()` and
`remat-opt --remat='policy=... mode=split prevent-cse=false'` run it.
"""
from __future__ import annotations

import dataclasses

from remat_passes.passes.annotate_host_offload import AnnotateHostOffload
from remat_passes.passes.base import PipelinePass, option, parse_bool
from remat_passes.passes.fold_dot_transposes import FoldDotTransposes
from remat_passes.passes.inline import Inline
from remat_passes.passes.insert_reduce_precision import InsertReducePrecision
from remat_passes.passes.outline_loop_backwards import OutlineLoopBackwards
from remat_passes.passes.place_optimization_barriers import (PlaceOptimizationBarriers,
                                                             parse_groups)
from remat_passes.passes.remat_partial_eval import PartialEvalOptions, RematPartialEval
from remat_passes.passes.segment_scans import SegmentScans, parse_offload, parse_segments
from remat_passes.passes.sink_loop_constants import SinkLoopConstants
from remat_passes.passes.strip_checkpoint_names import StripCheckpointNames


@dataclasses.dataclass
class Remat(PartialEvalOptions, PipelinePass):
    name = "remat"
    summary = ("The default pipeline: inline, outline-loop-backwards, remat-partial-eval, "
               "insert-reduce-precision, segment-scans (scan-segments), sink-loop-constants, "
               "place-optimization-barriers (prevent-cse), annotate-host-offload, "
               "strip-checkpoint-names, fold-dot-transposes, inline")

    prevent_cse: bool = option(
        True, "place optimization barriers around recomputation (outside loops)", parse_bool)
    prevent_cse_in_loops: bool = option(
        False, "also inside scan loop bodies (JAX recommends prevent_cse=False there)",
        parse_bool)
    tie_to_cotangent: bool = option(
        False, "make recomputation wait for the cotangent by data as well (for XLA:CPU, "
        "which deletes optimization barriers before it schedules)", parse_bool)
    barrier_groups: str = option(
        "per-use", "per-use: one barrier per recomputation, at its consumer; per-region: one "
        "per checkpoint region, as jax.checkpoint (place-optimization-barriers groups=)",
        parse_groups)
    fence_chains: bool = option(
        False, "give a backward value XLA would compute again in several readers a barrier "
        "of its own (place-optimization-barriers fence-chains=; for XLA:CPU of jaxlib >= "
        "0.11)", parse_bool)
    round_read_back: bool = option(
        False, "also round the residuals the backward only reads back where that is exact "
        "(f32, f64), as jax.checkpoint does (insert-reduce-precision round-read-back=; for "
        "XLA:GPU's split form)", parse_bool)
    scan_segments: int | str = option(
        0, "keep each scan's carry every k iterations (a count, or sqrt: the length that keeps "
        "the fewest bytes) and recompute a segment at a time in the backward (segment-scans; "
        "0: off)", parse_segments)
    scan_segments_offload: str | None = option(
        None, "pinned_host or unpinned_host: the carries segment-scans saves wait in that "
        "memory (segment-scans offload=; default: on the device)", parse_offload)

    def expand(self) -> list:
        steps = [Inline(), OutlineLoopBackwards(func=self.func, mode=self.mode),
                 RematPartialEval(**self.partial_eval_options()),
                 InsertReducePrecision(func=self.func, region_regex=self.region_regex,
                                       round_read_back=self.round_read_back,
                                       round_exact=self.round_exact)]
        # (with scan-segments=0: the loops rp.scan marked, and under auto the segments its
        # budget needs; a module without loops costs it nothing)
        steps.append(SegmentScans(segments=self.scan_segments, func=self.func,
                                  offload=self.scan_segments_offload))
        steps.append(SinkLoopConstants(func=self.func))
        if self.prevent_cse:
            steps.append(PlaceOptimizationBarriers(func=self.func,
                                                   in_loops=self.prevent_cse_in_loops,
                                                   tie_to_cotangent=self.tie_to_cotangent,
                                                   groups=self.barrier_groups,
                                                   function_region=self.policy is not None,
                                                   fence_chains=self.fence_chains))
        steps += [AnnotateHostOffload(func=self.func), StripCheckpointNames(),
                  FoldDotTransposes(func=self.func), Inline()]
        return steps
