"""insert-reduce-precision: round every saved floating-point residual to its own type.

Under XLA's excess precision (a bf16 value kept in f32 inside a fusion), the
forward pass can use a value that was never rounded to its type while the
backward reads the rounded copy that was written to memory, so a recomputation
from it no longer matches the forward. JAX inserts `reduce_precision` with the
type's own exponent/mantissa bits on the producer of every residual of a
`jax.checkpoint` (PR 22244); this pass does the same after remat-partial-eval:

* joint form: every forward value the backward reads that the forward also
  uses gets `%r = stablehlo.reduce_precision %v` right after its producer, and
  every use reads %r;
* split form: the same for each residual `@<f>_fwd` returns.

Nothing is inserted where the producer already is an identical
`reduce_precision`, nor for complex or integer values, nor for function
arguments: they arrive from memory in their own type, so rounding them is the
identity (JAX's lowering of a checkpoint emits none for them either).
"""
from __future__ import annotations

from remat_passes import graph, scan
from remat_passes.mlir import ir, op_id, stablehlo
from remat_passes.passes import ModulePass, Option

# (exponent bits, mantissa bits) of each floating type XLA supports.
FLOAT_BITS = {
    "f64": (11, 52), "f32": (8, 23), "bf16": (8, 7), "f16": (5, 10),
    "f8E5M2": (5, 2), "f8E5M2FNUZ": (5, 2), "f8E4M3": (4, 3), "f8E4M3FN": (4, 3),
    "f8E4M3FNUZ": (4, 3), "f8E4M3B11FNUZ": (4, 3), "f8E3M4": (3, 4),
    "f8E8M0FNU": (8, 0), "f4E2M1FN": (2, 1), "f6E2M3FN": (2, 3), "f6E3M2FN": (3, 2),
}


def float_bits(t):
    """(exponent, mantissa) bits of a tensor type's element type, or None."""
    try:
        return FLOAT_BITS.get(str(ir.RankedTensorType(t).element_type))
    except (ValueError, TypeError):
        return None


def _is_same_rounding(v, bits) -> bool:
    if not isinstance(v, ir.OpResult) or v.owner.operation.name != "stablehlo.reduce_precision":
        return False
    attrs = v.owner.operation.attributes
    return (ir.IntegerAttr(attrs["exponent_bits"]).value,
            ir.IntegerAttr(attrs["mantissa_bits"]).value) == bits


def round_value(v, bits, block) -> bool:
    """Insert reduce_precision after v's producer; every use of v reads it. False if
    nothing was needed."""
    if _is_same_rounding(v, bits):
        return False
    if isinstance(v, ir.BlockArgument):
        first = list(block.operations)[0]
        ip, loc = ir.InsertionPoint(first), v.location
    else:
        ip, loc = ir.InsertionPoint.after(v.owner), v.owner.location
    rounded = stablehlo.ReducePrecisionOp(v, bits[0], bits[1], ip=ip, loc=loc).result
    for use in list(v.uses):
        if op_id(use.owner) != op_id(rounded.owner):
            use.owner.operands[use.operand_number] = rounded
    return True


def _has_recompute(op) -> bool:
    found = []

    def visit(inner):
        if graph.RECOMPUTE_ATTR in inner.attributes:
            found.append(inner)
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE
    op.walk(visit)
    return bool(found)


def _round_stacked(loop) -> None:
    """Round each stacked per-iteration value the forward body also uses itself."""
    for s in loop.stacked.values():
        v, bits = s.value, float_bits(s.value.type)
        wrap = s.dus.operands[1].owner.operation
        if not bits or isinstance(v, ir.BlockArgument):
            continue
        if any(op_id(u.owner) != op_id(wrap) for u in v.uses):
            round_value(v, bits, loop.body)


def round_loops(block) -> None:
    """Joint form: inside scan loop pairs whose backward body recomputes, round the
    stacked values (JAX rounds what jax.checkpoint saves inside a scan the same way)."""
    for pair in scan.find_pairs(block):
        bwd_body = pair.bwd.regions[1].blocks[0]
        if _has_recompute(pair.bwd):
            _round_stacked(pair.fwd)
        round_loops(bwd_body)


class InsertReducePrecision(ModulePass):
    name = "insert-reduce-precision"
    summary = ("Round each saved floating-point residual to its own type (reduce_precision) "
               "so forward and recomputed values agree under excess precision")
    options = (Option("func", str, "main",
                      "the function remat-partial-eval rewrote (its _fwd half in split form)"),)

    def run(self, module, options, state):
        name = options["func"]
        with module.context:
            if graph.is_split(module, name):
                fwd = graph.find_func(module, f"{name}_fwd")
                block = graph.body_block(fwd)
                ret = list(block.operations)[-1].operation
                for _, v in graph.split_residuals(fwd):
                    if isinstance(v, ir.BlockArgument):
                        continue
                    bits = float_bits(v.type)
                    uses = [u for u in v.uses if op_id(u.owner) != op_id(ret)]
                    if bits and uses:
                        round_value(v, bits, block)
                for op in block.operations:   # the forward halves of scan loop pairs
                    loop = scan.analyse_forward(op)
                    if loop is not None:
                        _round_stacked(loop)
                return
            func_op = graph.find_func(module, name)
            block = graph.body_block(func_op)
            backward, _ = graph.backward_ops(func_op)
            for v in graph.joint_residuals(func_op):
                if isinstance(v, ir.BlockArgument):
                    continue
                bits = float_bits(v.type)
                # Being returned is no forward *use* (as in split form, and in JAX).
                forward_uses = [u for u in v.uses
                                if u.owner.operation.name != "func.return"
                                and graph.top_level_id(u.owner.operation, block) not in backward]
                if bits and forward_uses:
                    round_value(v, bits, block)
            round_loops(block)
