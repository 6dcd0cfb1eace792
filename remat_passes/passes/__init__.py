"""The pass registry: our passes and the core MLIR passes that jaxlib carries.

A pass of ours is a subclass of `ModulePass` with a kebab-case `name`, a
one-line `summary`, its `options` and a `run(module, options, state)` that
rewrites an `ir.Module` in place. Core MLIR passes are run through MLIR's own
PassManager by name.
"""
from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Callable

from remat_passes.mlir import RematError


@dataclasses.dataclass
class Option:
    name: str
    parse: Callable[[str], Any]
    default: Any
    help: str


def parse_bool(text: str) -> bool:
    t = text.strip().lower()
    if t in ("true", "1", "yes", "on"):
        return True
    if t in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got '{text}'")


def parse_int_list(text: str) -> list[int]:
    text = text.strip().strip("[]{}")
    if not text:
        return []
    return [int(t) for t in text.split(",")]


@dataclasses.dataclass
class PassState:
    """What passes of one pipeline run share: region policies and results."""
    region_policies: dict = dataclasses.field(default_factory=dict)
    filename: str | None = None
    # Filled by remat-partial-eval: one entry per function it rewrote.
    residuals: dict = dataclasses.field(default_factory=dict)
    # Notes for the user (printed with the residual report), e.g. loops kept whole.
    remarks: list = dataclasses.field(default_factory=list)


class ModulePass:
    name: str = ""
    summary: str = ""
    options: tuple[Option, ...] = ()

    def parse_options(self, given: dict[str, str]) -> dict[str, Any]:
        known = {o.name: o for o in self.options}
        out = {o.name: o.default for o in self.options}
        for key, text in given.items():
            if key not in known:
                close = difflib.get_close_matches(key, known, n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else \
                    (f"; options: {', '.join(known)}" if known else "; it takes no options")
                raise RematError(f"error: unknown option '{key}' for pass '{self.name}'{hint}")
            try:
                out[key] = known[key].parse(text)
            except (ValueError, RematError) as e:
                msg = str(e).removeprefix("error: ")
                raise RematError(f"error: bad value for option '{key}' of pass '{self.name}': {msg}") from None
        return out

    def run(self, module, options: dict[str, Any], state: PassState) -> None:
        raise NotImplementedError


# Core MLIR passes registered in jaxlib's bindings: name -> (MLIR class name, summary).
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


def registry() -> dict[str, ModulePass]:
    """Our passes by pipeline name (imported lazily to keep start-up fast)."""
    from remat_passes.passes.annotate_host_offload import AnnotateHostOffload
    from remat_passes.passes.inline import Inline
    from remat_passes.passes.insert_reduce_precision import InsertReducePrecision
    from remat_passes.passes.place_optimization_barriers import PlaceOptimizationBarriers
    from remat_passes.passes.remat import Remat
    from remat_passes.passes.remat_partial_eval import RematPartialEval
    from remat_passes.passes.strip_checkpoint_names import StripCheckpointNames
    passes = [Inline(), RematPartialEval(), InsertReducePrecision(), PlaceOptimizationBarriers(),
              AnnotateHostOffload(), StripCheckpointNames(), Remat()]
    return {p.name: p for p in passes}


def all_pass_names() -> list[str]:
    return sorted(list(registry()) + list(CORE_PASSES))


def unknown_pass_error(name: str) -> RematError:
    close = difflib.get_close_matches(name, all_pass_names(), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see --list-passes"
    return RematError(f"error: unknown pass '{name}'{hint}")
