"""strip-checkpoint-names: remove the `@remat.name` checkpoint-name markers.

`stablehlo.custom_call @remat.name(%x) {backend_config = "<name>"}` is an
identity that carries a `checkpoint_name` through export. No backend knows the
target, so every use of a marker's result is replaced by its operand and the
marker is erased; the module then compiles anywhere. It also drops the
`remat.*` bookkeeping attributes other passes leave on ops (recompute groups,
offload marks, barrier marks), so it runs last in the remat pipeline.
"""
from __future__ import annotations

from remat_passes import graph
from remat_passes.mlir import ir
from remat_passes.passes import ModulePass

BOOKKEEPING_OP_ATTRS = (graph.RECOMPUTE_ATTR, graph.OFFLOAD_ATTR, "remat.barrier")


class StripCheckpointNames(ModulePass):
    name = "strip-checkpoint-names"
    summary = "Remove @remat.name checkpoint-name markers (identities) so the module compiles"

    def run(self, module, options, state):
        markers = []

        def visit(op):
            if graph.marker_name(op) is not None:
                markers.append(op)
            for attr in BOOKKEEPING_OP_ATTRS:
                if attr in op.attributes:
                    del op.attributes[attr]
            return ir.WalkResult.ADVANCE
        module.operation.walk(visit)
        for op in markers:
            op.result.replace_all_uses_with(op.operands[0])
            op.erase()
