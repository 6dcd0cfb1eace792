"""insert-reduce-precision: round every saved floating-point residual to its own type.

Under XLA's excess precision (a bf16 value kept in f32 inside a fusion), the
forward pass can use a value that was never rounded to its type while the
backward reads the rounded copy that was written to memory, so a recomputation
from it no longer matches the forward. JAX inserts `reduce_precision` with the
type's own exponent/mantissa bits on the producer of every residual of a
`jax.checkpoint` (PR 22244); this pass does the same after remat-partial-eval:

* joint form: every forward value the backward reads that the forward also
  uses gets `%r = stablehlo.reduce_precision %v` right after its producer, and
  every use reads %r; inside scan loop pairs whose backward body recomputes,
  the same for each stacked value the forward body also uses;
* split form: the same for each residual `@<f>_fwd` returns.

Nothing is inserted where the producer already is an identical
`reduce_precision`, nor for complex or integer values, nor for function
arguments: they arrive from memory in their own type, so rounding them is the
identity (JAX's lowering of a checkpoint emits none for them either).

`when-recomputed=true` (how the `remat` pipeline runs it) skips the pass in
joint form when remat-partial-eval recomputed nothing from saved values:
without recomputation forward and backward read the same value, and JAX
without `jax.checkpoint` rounds nothing either. The split form is rounded
whenever a checkpoint policy was in force (a policy, or checkpoint regions),
recomputed or not: its residuals reach `@<f>_bwd` through memory, rounded to
their type, so the forward's own consumers must read the rounded value as
well. With no policy and no regions (JAX's plain `jax.vjp`, which rounds
nothing) it skips the split form too.
"""
from __future__ import annotations

import dataclasses

from remat_passes import contract, graph, scan_pairs
from remat_passes.mlir import ir, op_id, stablehlo
from remat_passes.passes import ModulePass, option


def _is_same_rounding(v, bits) -> bool:
    if not isinstance(v, ir.OpResult) or v.owner.operation.name != "stablehlo.reduce_precision":
        return False
    attrs = v.owner.operation.attributes
    return (ir.IntegerAttr(attrs["exponent_bits"]).value,
            ir.IntegerAttr(attrs["mantissa_bits"]).value) == bits


def round_value(v, bits, block):
    """Insert reduce_precision after v's producer; every use of v reads it. Returns the
    rounding op, or None if nothing was needed."""
    if _is_same_rounding(v, bits):
        return None
    if isinstance(v, ir.BlockArgument):
        ip, loc = ir.InsertionPoint.at_block_begin(block), v.location
    else:
        ip, loc = ir.InsertionPoint.after(v.owner), v.owner.location
    rounded = stablehlo.ReducePrecisionOp(v, bits[0], bits[1], ip=ip, loc=loc).result
    rid = op_id(rounded.owner)
    for use in list(v.uses):
        if op_id(use.owner) != rid:
            use.owner.operands[use.operand_number] = rounded
    return rounded.owner.operation


def _has_recompute(op) -> bool:
    """Does `op` (a backward loop) recompute anything? Re-slicing a scanned-over array (data
    movement, as JAX forwards `xs`) and checkpoint-name markers are no recomputation."""
    found = []

    def visit(inner):
        if contract.is_recompute_clone(inner) and not scan_pairs.moves_data(inner) \
                and contract.checkpoint_name(inner) is None:
            found.append(inner)
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE
    op.walk(visit)
    return bool(found)


def round_stacked(loop) -> None:
    """Round each stacked per-iteration value the forward body also uses itself."""
    for s in loop.stacked.values():
        v, bits = s.value, contract.float_format(s.value.type)
        wrap = s.dus.operands[1].owner.operation
        if not bits or isinstance(v, ir.BlockArgument):
            continue
        if any(op_id(u.owner) != op_id(wrap) for u in v.uses):
            round_value(v, bits, loop.body)


def round_loops(pairs) -> None:
    """Joint form: inside scan loop pairs whose backward body recomputes, round the
    stacked values (JAX rounds what jax.checkpoint saves inside a scan the same way)."""
    for pair in pairs:
        if _has_recompute(pair.bwd):
            round_stacked(pair.fwd)
        round_loops(scan_pairs.find_pairs_in_block(pair.bwd_body))


def recomputes(func_op) -> bool:
    """Did remat-partial-eval recompute anything in `func_op` from saved values? Clones
    of constants (and of ops on cloned constants only), of checkpoint-name markers
    (identities) and, in loop bodies, re-slicing of scanned-over arrays (data movement,
    as JAX forwards `xs`) don't count."""
    found = []
    top = op_id(func_op)

    def visit(op):   # loop bodies included: per-iteration recomputation counts
        if contract.is_recompute_clone(op) and contract.checkpoint_name(op) is None and any(
                isinstance(v, ir.BlockArgument) or not contract.is_recompute_clone(v.owner)
                for v in op.operands) and not (
                scan_pairs.moves_data(op) and op_id(op.parent) != top):
            found.append(op)
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE
    func_op.operation.walk(visit)
    return bool(found)


@dataclasses.dataclass
class InsertReducePrecision(ModulePass):
    name = "insert-reduce-precision"
    summary = ("Round each saved floating-point residual to its own type (reduce_precision) "
               "so forward and recomputed values agree under excess precision")
    preserves_analyses = True

    func: str = option("main",
                       "the function remat-partial-eval rewrote (its _fwd half in split form)")
    when_recomputed: bool = option(
        False, "joint form: only if remat-partial-eval recomputed something from saved "
        "values; split form: only if it ran under a checkpoint policy (JAX rounds only "
        "inside jax.checkpoint)")

    def apply(self, module_op, state) -> None:
        name = self.func
        with module_op.context:
            if graph.is_split(module_op, name):
                # (whether or not anything is recomputed: the residual reaches @<f>_bwd
                # through memory, rounded to its type, so the forward's own consumers
                # must read the rounded value too; JAX's test_excess_precision_hell. Not
                # without a checkpoint policy: JAX's plain jax.vjp rounds nothing.)
                if not (self.when_recomputed and state.checkpointed.get(name) is False):
                    self._round_split(state, graph.find_func(module_op, f"{name}_fwd"))
                return
            f = graph.find_func(module_op, name)
            if self.when_recomputed and not recomputes(f):
                return
            a = state.analysis(f)
            for v in a.residuals:
                if isinstance(v, ir.BlockArgument):
                    continue
                bits = contract.float_format(v.type)
                if not bits:
                    continue
                # Being returned is no forward *use* (as in split form, and in JAX).
                forward_uses = [u for u in v.uses
                                if u.owner.operation.name != "func.return"
                                and not a.is_backward(a.top_level(u.owner.operation))]
                if forward_uses:
                    op = round_value(v, bits, a.block)
                    if op is not None:
                        a.note_inserted(op, backward=False, after=v.owner)
            round_loops(a.scan_pairs)
            a.loops_changed()

    @staticmethod
    def _round_split(state, fwd) -> None:
        a = state.analysis(fwd)
        ret = a.terminator
        for i in contract.residual_results(fwd):
            v = ret.operands[i]
            if isinstance(v, ir.BlockArgument):
                continue
            bits = contract.float_format(v.type)
            uses = [u for u in v.uses if op_id(u.owner) != op_id(ret)]
            if bits and uses:
                op = round_value(v, bits, a.block)
                if op is not None:
                    a.note_inserted(op, backward=False, after=v.owner)
        for pair_fwd in (scan_pairs.analyse_forward(op) for op in a.ops
                         if op.name == scan_pairs.WHILE):
            if pair_fwd is not None:   # the forward halves of scan loop pairs
                round_stacked(pair_fwd)
