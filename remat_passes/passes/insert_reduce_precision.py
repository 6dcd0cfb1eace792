"""insert-reduce-precision: round the saved floating-point residuals a recomputation reads.

Under XLA's excess precision (a bf16 value kept in f32 inside a fusion), the
forward pass can use a value that was never rounded to its type while the
backward reads the rounded copy that was written to memory, so a recomputation
from it no longer matches the forward. JAX inserts `reduce_precision` with the
type's own exponent/mantissa bits on the producer of the residuals of a
`jax.checkpoint` (PR 22244); this pass does the same after remat-partial-eval,
on each saved floating-point residual that the forward also reads and that

* a recomputation in the backward reads (a recompute clone; checkpoint-name
  markers, re-slicing and other data movement, and optimization barriers are
  looked through, and a backward loop or case that recomputes inside counts), or
* is computed inside a checkpoint region (`remat[N]` frames of
  `remat_passes.checkpoint`, or scopes matched by `region-regex`) and read by the
  forward inside that region: JAX's `jax.checkpoint` rounds these whether or not
  anything is recomputed (its `test_excess_precision_hell`).

`%r = stablehlo.reduce_precision %v` goes right after the producer and every use
reads %r. In joint form the residuals are the forward values the backward reads;
in split form the results `@<f>_fwd` returns as residuals (a recomputation reads
the matching argument of `@<f>_bwd`). Inside scan loop pairs, the stacked
per-iteration values the forward body also uses are rounded where a recomputation
in the backward loop reads their slots (split form: in a backward loop of `@<f>_bwd`);
a loop's free ops (re-slicing its inputs, index constants) read no stack, so recomputing
them rounds none.

A residual offloaded to another memory is not rounded either: the backward reads the
copy written there, never what the forward computed (JAX rounds the residuals the
forward itself reads; an offloaded one is the device_put's result, which it does not),
and a rounding would keep the value twice, the unrounded one in scratch memory.

A residual the backward only reads back is not rounded: the backward then reads
what the program without remat reads (the value written to memory), so a policy
that recomputes nothing (`everything_saveable`, or a plan that keeps everything)
gives the outputs and gradients of the program without remat bit for bit. With
`round-read-back=true` those are rounded too where the rounding is exact (f32, f64:
XLA computes them in their own type), as jax.checkpoint rounds them: the values do not
change, but XLA:GPU fuses around a rounding, and JAX's split forward of the benchmark MLP
under `everything_saveable` needs 2,098,560 B of scratch on an H100 where the same program
without the roundings (ours) needs 6,292,864 B: without them XLA:GPU computes each saved
activation again late, from the split-K partial products of its matrix product, which it
keeps alive until then. rp.jit sets it for the split form on a GPU. Nothing
is inserted where the producer already is an identical `reduce_precision`, nor for
complex or integer values, nor for function arguments: they arrive from memory in
their own type, so rounding them is the identity (JAX's lowering emits none). Nor for
the narrow float types other than f8E5M2 (`contract.EXACT_ROUNDING`): XLA's
reduce_precision to their own bits changes their values (f8E4M3FN's 448 becomes NaN,
f4E2M1FN's 4 becomes 6, subnormals become 0), where jax.checkpoint rounds them and its
gradients change.

What the pass reads is all in the module (recompute attributes, name stacks,
residual attributes), so running it alone on a file agrees with the pipeline.
"""
from __future__ import annotations

import dataclasses
import re

from remat_passes.analysis import scan_pairs
from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import RematError, ir, op_id, stablehlo
from remat_passes.passes.base import ModulePass, option, parse_bool, parse_regex
from remat_passes.regions.rules import result_placements

BARRIER = "stablehlo.optimization_barrier"


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


def _passes_through(op) -> bool:
    """A recompute clone that computes nothing: a checkpoint-name marker (an identity) or
    data movement (a reshape reads back what memory holds, re-slicing in loops)."""
    return contract.checkpoint_name(op) is not None or scan_pairs.moves_data(op)


def _has_recompute(op) -> bool:
    """Does `op` (a backward loop or case) recompute anything inside?"""
    found = []

    def visit(inner):
        if contract.is_recompute_clone(inner) and not _passes_through(inner):
            found.append(inner)
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE
    op.walk(visit)
    return bool(found)


def _has_recompute_cached(op, recomputes_inside: dict) -> bool:
    """`_has_recompute`, walked once per op (`recomputes_inside`: {op_id: answer})."""
    key = op_id(op)
    if key not in recomputes_inside:
        recomputes_inside[key] = _has_recompute(op)
    return recomputes_inside[key]


def read_by_recomputation(v, recomputes_inside: dict) -> bool:
    """Does a recomputation read `v` (through markers, data movement and barriers)?
    `recomputes_inside`: {op_id: _has_recompute} of the region ops seen so far (each
    loop body is walked once per pass run, however many residuals it reads)."""
    todo, seen = [v], set()
    while todo:
        x = todo.pop()
        for use in x.uses:
            op = use.owner.operation
            if op.name == BARRIER:
                follow = [op.results[use.operand_number]]
            elif contract.is_recompute_clone(op):
                if not _passes_through(op):
                    return True
                follow = list(op.results)
            elif len(op.regions):
                if _has_recompute_cached(op, recomputes_inside):
                    return True
                continue
            else:
                continue
            for r in follow:
                if r not in seen:
                    seen.add(r)
                    todo.append(r)
    return False


def _scopes(op, scope_re) -> tuple:
    return graph.scope_chain_of_stack(graph.name_stack(op), scope_re)


def _moved(placement) -> bool:
    return placement is not None and placement.src != placement.dst


def _offloaded(v) -> bool:
    """Is forward value `v` a residual remat-partial-eval moves to another memory (as
    annotate-host-offload reads it: a case's or a manual computation's from its regions)?"""
    return isinstance(v, ir.OpResult) and \
        _moved(result_placements(v.owner.operation)[v.result_number])


def round_stacked(loop, carries, exact: bool = True) -> None:
    """Round the stacked per-iteration values of `carries` that the forward body also uses
    itself (not one offloaded to another memory; `exact`: as `contract.residual_rounding`)."""
    for k in carries:
        s = loop.stacked[k]
        v, bits = s.value, contract.residual_rounding(s.value.type, exact)
        wrap = s.dus.operands[1].owner.operation
        if not bits or isinstance(v, ir.BlockArgument) or _offloaded(v):
            continue
        if any(op_id(u.owner) != op_id(wrap) for u in v.uses):
            round_value(v, bits, loop.body)


def _recomputed_from(reads, backward_loops, recomputes_inside: dict) -> bool:
    """Is a stack recomputed from: does a recomputation read one of its slot `reads` (a
    list of `scan_pairs.Read`; None where the backward reads the stack otherwise: then
    wherever one of `backward_loops` recomputes anything)?"""
    if reads is None:
        return any(_has_recompute_cached(w, recomputes_inside) for w in backward_loops)
    return any(read_by_recomputation(r.value, recomputes_inside) for r in reads)


def round_loops(pairs, recomputes_inside: dict, exact: bool = True) -> None:
    """Joint form: inside scan loop pairs, round the stacked values a recomputation in the
    backward body reads (JAX rounds what jax.checkpoint saves inside a scan the same
    way; a stack the backward only reads back, or reads to re-slice the loop's inputs, is
    not rounded, as at the top level)."""
    for pair in pairs:
        reads = {k: pair.reads[m] for m, k in pair.links.items()}
        round_stacked(pair.fwd, [k for k in pair.fwd.stacked if _recomputed_from(
            reads.get(k), [pair.bwd], recomputes_inside)], exact)
        round_loops(scan_pairs.find_pairs_in_block(pair.bwd_body), recomputes_inside, exact)


@dataclasses.dataclass
class InsertReducePrecision(ModulePass):
    name = "insert-reduce-precision"
    summary = ("Round each saved floating-point residual a recomputation reads (or a "
               "checkpoint region's forward reads) to its own type (reduce_precision)")
    preserves_analyses = True

    func: str = option("main",
                       "the function remat-partial-eval rewrote (its _fwd half in split form)")
    region_regex: re.Pattern | None = option(
        None, "name-stack scopes that are checkpoint regions (as remat-partial-eval's "
        "region-regex)", parse_regex)
    round_read_back: bool = option(
        False, "also round the residuals the backward only reads back where that is exact "
        "(f32, f64), as jax.checkpoint does (for XLA:GPU's split form)", parse_bool)
    round_exact: bool = option(
        True, "round f32 and f64 residuals too, as jax.checkpoint does (their rounding is the "
        "identity; false: none of them, so XLA:CPU computes no kept elementwise value twice, "
        "for the rounding and again in the fusions that read it)", parse_bool)

    def _bits(self, t):
        return contract.residual_rounding(t, self.round_exact)

    def _wanted(self, v, forward_uses, read_by, recomputes_inside: dict) -> bool:
        """Round residual `v` (producer an op), read by `forward_uses` in the forward and,
        in the backward, by `read_by` (a value: v itself, or the argument of <f>_bwd)?"""
        if not forward_uses or not self._bits(v.type):
            return False
        if self.round_read_back and contract.rounding_is_identity(v.type):
            return True
        inner = _scopes(v.owner, self.region_regex)
        if inner and any(inner[-1] in _scopes(u.owner, self.region_regex) for u in forward_uses):
            return True
        return read_by_recomputation(read_by, recomputes_inside)

    def apply(self, module_op, state) -> None:
        if self.round_read_back and not self.round_exact:
            raise RematError("error: insert-reduce-precision: round-read-back=true rounds "
                             "f32 and f64 residuals, which round-exact=false leaves "
                             "unrounded: give one of them")
        name = self.func
        with module_op.context:
            if graph.is_split(module_op, name):
                self._round_split(state, graph.find_func(module_op, f"{name}_fwd"),
                                  graph.find_func(module_op, f"{name}_bwd"))
                return
            f = graph.find_func(module_op, name)
            a = state.analysis(f)
            recomputes_inside: dict = {}
            for v in a.residuals:
                if isinstance(v, ir.BlockArgument):
                    continue
                # Being returned is no forward *use* (as in split form, and in JAX).
                forward_uses = [u for u in v.uses
                                if u.owner.operation.name != "func.return"
                                and not a.is_backward(a.top_level(u.owner.operation))]
                if _offloaded(v):
                    continue
                if self._wanted(v, forward_uses, v, recomputes_inside):
                    op = round_value(v, self._bits(v.type), a.block)
                    if op is not None:
                        a.note_inserted(op, backward=False, after=v.owner)
            round_loops(a.scan_pairs, recomputes_inside, self.round_exact)
            a.loops_changed()

    def _round_split(self, state, fwd, bwd) -> None:
        a = state.analysis(fwd)
        ret = a.terminator
        bwd_args = graph.body_block(bwd).arguments
        recomputes_inside: dict = {}
        entries = contract.all_entries(fwd, "res_attrs")    # (read once: O(results))
        for k, i in enumerate(contract.residual_results(fwd)):
            v = ret.operands[i]
            if isinstance(v, ir.BlockArgument):
                continue
            moved = contract.OFFLOAD in entries[i] and \
                _moved(contract.parse_offload(entries[i][contract.OFFLOAD]))
            if moved or _offloaded(v):
                continue
            uses = [u for u in v.uses if op_id(u.owner) != op_id(ret)]
            if self._wanted(v, uses, bwd_args[k], recomputes_inside):
                op = round_value(v, self._bits(v.type), a.block)
                if op is not None:
                    a.note_inserted(op, backward=False, after=v.owner)
        # the stacks of the forward's scan loops it returns, by what the backward does
        # with each: rounded where a recomputation reads it
        backward_loops = [op.operation for op in graph.body_block(bwd).operations
                          if op.operation.name == scan_pairs.WHILE]
        rounded: dict = {}      # forward loop op id -> (loop, [stacked carry])
        for k, i in enumerate(contract.residual_results(fwd)):
            found = scan_pairs.loop_source(ret.operands[i])
            if found is None:
                continue
            loop, carry = found
            if _recomputed_from(scan_pairs.slot_reads(bwd_args[k]), backward_loops,
                                recomputes_inside):
                rounded.setdefault(op_id(loop.op), (loop, set()))[1].add(carry)
        for loop, carries in rounded.values():
            round_stacked(loop, sorted(carries), self.round_exact)
