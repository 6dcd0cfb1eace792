"""annotate-host-offload: move Offloadable residuals to host memory between the passes.

For each residual an offload policy made Offloadable(src, dst) (remat-partial-eval
records the placement on the producer, `remat.offload`), emit what JAX itself
emits for `offload_dot_with_no_batch_dims` / `save_and_offload_only_these_names`
when lowering for GPU/TPU:

* after the producer, `stablehlo.custom_call @annotate_device_placement(%r)
  {has_side_effect = true, mhlo.frontend_attributes = {_xla_buffer_placement = "<dst>"}}`,
  read only by the backward (with symbolic dimensions the call also takes the value's shape:
  `contract.annotate_placement`);
* before the first backward use, the same with `"<src>"`, and the backward reads that;
  where that first use is an optimization barrier (place-optimization-barriers runs
  first), the barrier holds the host value and the copy comes right after it, as in
  JAX's own lowering (XLA cannot then start the copy before what the barrier waits for).

Inside scan loop pairs (joint form) the same per iteration, as JAX emits it for
`jax.checkpoint` inside `lax.scan`. In split form the `@<f>_fwd` result and the
`@<f>_bwd` argument that carry the residual also get `mhlo.memory_kind =
"<dst>"`; a scan's stack is moved slot by slot there too (the forward loop writes each
slot to host, the backward loop brings back the slot it reads), so neither half holds
the whole stack in device memory. XLA:CPU ignores the annotations (the module still runs
there); on GPU/TPU the residual lives in host memory.
"""
from __future__ import annotations

import dataclasses

from remat_passes.analysis import scan_pairs
from remat_passes.ir import contract, graph
from remat_passes.ir.contract import annotate_placement as annotate
from remat_passes.ir.mlir import ir
from remat_passes.passes.base import ModulePass, option
from remat_passes.regions.rules import result_placements


def _residual_values(op, placements) -> list:
    """(value, placement) of an offloaded producer's values the backward may read: its
    results, or the rounded copies insert-reduce-precision put after them."""
    values = []
    for v, placement in zip(op.results, placements):
        if placement is None:
            continue
        values.append((v, placement))
        values.extend((u.owner.operation.results[0], placement) for u in v.uses
                      if u.owner.operation.name == "stablehlo.reduce_precision")
    return values


def _bring_back(a, value, src, uses) -> None:
    """The backward reads `value` (in host memory) through `uses`: they read one copy in
    memory `src`, made before the first of them. Where that first reader is a top-level
    optimization barrier, the barrier holds `value` itself and the copy is made from its
    result, right after it, as in JAX's split of `jax.checkpoint`: XLA cannot start the
    copy before what the barrier waits for. (Measured, XLA:GPU on an H200: with the copy
    before the barrier, it started it at the top of the scanned MLP's backward and held
    its 262,144 B through the loop: temp 4,460,864 B against JAX's 4,199,232 B.)"""
    first = min((a.top_level(u.owner.operation) for u in uses), key=a.position_key)
    held = [u for u in uses if u.owner.operation == first]
    if first.name == "stablehlo.optimization_barrier" and held:
        results = [first.results[u.operand_number] for u in held]
        readers = [r for v in results for r in v.uses]
        readers += [u for u in uses if u.owner.operation != first]
        device = annotate(results[0], src, ir.InsertionPoint.after(first), first.location)
        a.note_inserted(device.owner.operation, backward=True, after=first)
    else:
        readers = list(uses)
        device = annotate(value, src, ir.InsertionPoint(first), first.location)
        a.note_inserted(device.owner.operation, backward=True, before=first)
    for use in readers:
        use.owner.operands[use.operand_number] = device


def offload_joint(a) -> int:
    count = 0
    for pos, op in enumerate(a.ops):
        if a.backward[pos]:
            continue
        placements = result_placements(op)
        if not any(placements):
            continue
        for v, placement in _residual_values(op, placements):
            bwd_uses = [(u, a.top_level(u.owner.operation)) for u in v.uses]
            bwd_uses = [(u, top) for u, top in bwd_uses if a.is_backward(top)]
            if not bwd_uses:
                continue
            host = annotate(v, placement.dst, ir.InsertionPoint.after(v.owner), op.location)
            a.note_inserted(host.owner.operation, backward=False, after=v.owner)
            for use, _ in bwd_uses:
                use.owner.operands[use.operand_number] = host
            _bring_back(a, host, placement.src, [u for u in host.uses])
            count += 1
    return count


def _slot_to_host(s, dst) -> None:
    """The value forward loop stack `s` writes each iteration goes to memory `dst` right
    before it is wrapped into its slot (the stack then fills in that memory)."""
    wrap = s.dus.operands[1].owner.operation
    wrap.operands[0] = annotate(s.value, dst, ir.InsertionPoint(wrap), wrap.location)


def _read_to_device(rd, src) -> None:
    """Backward loop slot read `rd` comes back to memory `src` right after it, and its
    readers read that."""
    uses = list(rd.value.uses)
    device = annotate(rd.value, src, ir.InsertionPoint.after(rd.reshape_op),
                      rd.reshape_op.location)
    for use in uses:
        use.owner.operands[use.operand_number] = device


def offload_loops(pairs) -> int:
    """Per-iteration offload inside scan loop pairs (joint form): the stacked value goes
    to host before it is written into its buffer; each backward read comes back to the
    device."""
    count = 0
    for pair in pairs:
        for m, k in pair.links.items():
            s = pair.fwd.stacked[k]
            v = s.value
            producer = v.owner if isinstance(v, ir.OpResult) else None
            if producer is not None and producer.name == "stablehlo.reduce_precision" and \
                    isinstance(producer.operands[0], ir.OpResult):
                producer = producer.operands[0].owner   # rounded by insert-reduce-precision
            placement = contract.offload_of(producer) if producer is not None else None
            if placement is None:
                continue
            _slot_to_host(s, placement.dst)
            for rd in pair.reads[m]:
                _read_to_device(rd, placement.src)
            count += 1
        count += offload_loops(scan_pairs.find_pairs_in_block(pair.bwd_body))
    return count


def _only_returned(v, ret) -> bool:
    """`v` (or the reshapes of it) is read by nothing but the function's return."""
    for use in v.uses:
        op = use.owner.operation
        if op == ret:
            continue
        if op.name != "stablehlo.reshape" or not _only_returned(op.results[0], ret):
            return False
    return True


def _stack_slots_to_host(v, ret, dst) -> bool:
    """When `v` is a forward scan's stack (one slot per iteration) that only the return
    reads, move each slot to host as the loop writes it (JAX's split form of an offloading
    scan: the loop fills a buffer in host memory) and say True; else False."""
    src = scan_pairs.loop_source(v)
    if src is None:
        return False
    loop, k = src
    if not _only_returned(loop.op.results[k], ret):
        return False
    s = loop.stacked[k]
    if s.dus.operands[1].owner.operation.operands[0] != s.value:
        return False
    _slot_to_host(s, dst)
    return True


def _slots_to_device(arg, src) -> bool:
    """When every backward use of the host stack `arg` is a scan reading one slot per
    iteration, bring each slot back as it is read (the stack stays in host memory) and
    say True; else False."""
    reads = scan_pairs.slot_reads(arg)
    if not reads:
        return False
    for rd in reads:
        _read_to_device(rd, src)
    return True


def offload_split(fa, ba) -> int:
    """Split form: `fa`/`ba` are the analyses of <f>_fwd and <f>_bwd. A residual goes to
    host at the return of <f>_fwd and comes back before its first use in <f>_bwd; a
    scan's stack instead slot by slot, inside the loops (the whole stack would otherwise
    be built, and read back, in device memory)."""
    fwd, bwd = fa.func_op, ba.func_op
    ret = fa.terminator
    count = 0
    for k, i in enumerate(contract.residual_results(fwd)):
        placement = contract.offload_entry(fwd, "res_attrs", i)
        if placement is None:
            continue
        v = ret.operands[i]
        if not _stack_slots_to_host(v, ret, placement.dst):
            ip = ir.InsertionPoint(ret) if isinstance(v, ir.BlockArgument) else \
                ir.InsertionPoint.after(v.owner)
            ret.operands[i] = annotate(v, placement.dst, ip, ret.location)
        contract.set_entry(fwd, "res_attrs", i, contract.MEMORY_KIND,
                           ir.StringAttr.get(placement.dst))
        arg = ba.args[k]
        if contract.offload_entry(bwd, "arg_attrs", k) is None:
            continue
        uses = list(arg.uses)
        if uses and not _slots_to_device(arg, placement.src):
            _bring_back(ba, arg, placement.src, uses)
        contract.set_entry(bwd, "arg_attrs", k, contract.MEMORY_KIND,
                           ir.StringAttr.get(placement.dst))
        count += 1
    return count


@dataclasses.dataclass
class AnnotateHostOffload(ModulePass):
    name = "annotate-host-offload"
    summary = ("Annotate Offloadable residuals with annotate_device_placement (to host after the "
               "producer, back to device at the first backward use)")
    preserves_analyses = True

    func: str = option("main", "the function remat-partial-eval rewrote")

    def apply(self, module_op, state) -> None:
        name = self.func
        with module_op.context, ir.Location.unknown():
            if graph.is_split(module_op, name):
                offload_split(state.analysis(graph.find_func(module_op, f"{name}_fwd")),
                              state.analysis(graph.find_func(module_op, f"{name}_bwd")))
            else:
                a = state.analysis(graph.find_func(module_op, name))
                offload_joint(a)
                offload_loops(a.scan_pairs)
