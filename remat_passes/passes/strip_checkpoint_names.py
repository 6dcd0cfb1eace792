"""strip-checkpoint-names: remove the `@remat.name` checkpoint-name markers.

`stablehlo.custom_call @remat.name(%x) {backend_config = "<name>"}` is an
identity that carries a `checkpoint_name` through export. No backend knows the
target, so every use of a marker's result is replaced by its operand and the
marker is erased; the module then compiles anywhere. It also drops the
`remat.*` bookkeeping attributes other passes leave on ops (recompute groups,
offload marks, barrier marks), so it runs last in the remat pipeline.
"""
from __future__ import annotations

import dataclasses

from remat_passes.ir import contract
from remat_passes.ir.mlir import ir
from remat_passes.passes.base import ModulePass


def strip(module_op) -> int:
    """Remove the markers and bookkeeping attributes of `module_op`; returns the markers."""
    markers = []

    def visit(op):
        if contract.checkpoint_name(op) is not None:
            markers.append(op)
        contract.strip_bookkeeping(op)
        return ir.WalkResult.ADVANCE
    module_op.operation.walk(visit)
    for op in markers:
        op.result.replace_all_uses_with(op.operands[0])
        op.erase()
    return len(markers)


@dataclasses.dataclass
class StripCheckpointNames(ModulePass):
    name = "strip-checkpoint-names"
    summary = "Remove @remat.name checkpoint-name markers (identities) so the module compiles"

    def apply(self, module_op, state) -> None:
        strip(module_op)
