"""The pass registry: our passes and pipelines by name, and the core MLIR passes jaxlib
carries (run through MLIR's own PassManager by name: `CorePass`)."""
from __future__ import annotations

import difflib

from remat_passes.ir import mlir
from remat_passes.ir.mlir import RematError
from remat_passes.passes.base import ModulePass, PassState

CORE_PASSES = {
    "canonicalize": ("Canonicalizer", "Canonicalize operations (MLIR core)"),
    "cse": ("CSE", "Eliminate common sub-expressions (MLIR core)"),
    "symbol-dce": ("SymbolDCE", "Eliminate dead symbols (MLIR core)"),
    "sccp": ("SCCP", "Sparse conditional constant propagation (MLIR core)"),
    "remove-dead-values": ("RemoveDeadValues", "Remove dead values (MLIR core)"),
    "loop-invariant-code-motion": ("LoopInvariantCodeMotion",
                                   "Hoist loop invariant instructions outside of the loop (MLIR core)"),
    "strip-debuginfo": ("StripDebugInfo", "Strip debug info from all operations (MLIR core)"),
    "symbol-privatize": ("SymbolPrivatize", "Mark symbols private (MLIR core)"),
    "topological-sort": ("TopologicalSort", "Sort regions topologically (MLIR core)"),
}


class CorePass:
    """A core MLIR pass, by name and option text, run through MLIR's PassManager."""
    preserves_analyses = False

    def __init__(self, name: str, options: dict[str, str] | None = None):
        self.name = name
        self.options = dict(options or {})

    def spec(self) -> str:
        if not self.options:
            return self.name
        return self.name + "{" + " ".join(f"{k}={v}" for k, v in self.options.items()) + "}"

    def apply(self, module_op, state: PassState, verify: bool = True) -> None:
        pm = mlir.passmanager.PassManager.parse(f"builtin.module({self.spec()})")
        pm.enable_verifier(verify)
        try:
            pm.run(module_op.operation)
        except mlir.ir.MLIRError as e:
            raise RematError(mlir.diagnostics_message(
                e, state.filename, f"in pass '{self.name}'")) from None


def registry() -> dict[str, type[ModulePass]]:
    """Our passes and pipelines by name (imported lazily to keep start-up fast)."""
    from remat_passes.passes.annotate_host_offload import AnnotateHostOffload
    from remat_passes.passes.fold_dot_transposes import FoldDotTransposes
    from remat_passes.passes.inline import Inline
    from remat_passes.passes.insert_reduce_precision import InsertReducePrecision
    from remat_passes.passes.outline_loop_backwards import OutlineLoopBackwards
    from remat_passes.passes.place_optimization_barriers import PlaceOptimizationBarriers
    from remat_passes.passes.remat import Remat
    from remat_passes.passes.remat_partial_eval import RematPartialEval
    from remat_passes.passes.segment_scans import SegmentScans
    from remat_passes.passes.sink_loop_constants import SinkLoopConstants
    from remat_passes.passes.strip_checkpoint_names import StripCheckpointNames
    passes = [Inline, OutlineLoopBackwards, RematPartialEval, InsertReducePrecision,
              PlaceOptimizationBarriers, AnnotateHostOffload, StripCheckpointNames, SegmentScans,
              SinkLoopConstants, FoldDotTransposes, Remat]
    return {p.name: p for p in passes}


def all_pass_names() -> list[str]:
    return sorted(list(registry()) + list(CORE_PASSES))


def unknown_pass_error(name: str) -> RematError:
    close = difflib.get_close_matches(name, all_pass_names(), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see --list-passes"
    return RematError(f"error: unknown pass '{name}'{hint}")
