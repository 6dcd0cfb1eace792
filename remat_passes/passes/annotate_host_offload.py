"""annotate-host-offload: move Offloadable residuals to host memory between the passes.

For each residual an offload policy made Offloadable(src, dst) (remat-partial-eval
marks it `remat.offload = "src:dst"`), emit what JAX itself emits for
`offload_dot_with_no_batch_dims` / `save_and_offload_only_these_names` when
lowering for GPU/TPU:

* after the producer, `stablehlo.custom_call @annotate_device_placement(%r)
  {has_side_effect = true, mhlo.frontend_attributes = {_xla_buffer_placement = "<dst>"}}`,
  read only by the backward;
* before the first backward use, the same with `"<src>"`, and the backward reads that.

In split form the `@<f>_fwd` result and the `@<f>_bwd` argument that carry the
residual also get `mhlo.memory_kind = "<dst>"`. XLA:CPU ignores the annotations
(the module still runs there); on GPU/TPU the residual lives in host memory.
"""
from __future__ import annotations

from remat_passes import graph, scan
from remat_passes.mlir import ir, op_id, stablehlo
from remat_passes.passes import ModulePass, Option

TARGET = "annotate_device_placement"


def annotate(value, placement: str, ip, loc):
    op = stablehlo.CustomCallOp([value.type], [value], TARGET, has_side_effect=True,
                                ip=ip, loc=loc)
    op.operation.attributes["mhlo.frontend_attributes"] = ir.DictAttr.get(
        {"_xla_buffer_placement": ir.StringAttr.get(placement)})
    return op.result


def _parse(attr) -> tuple[str, str]:
    src, _, dst = ir.StringAttr(attr).value.partition(":")
    return src, dst


def offload_joint(func_op) -> int:
    block = graph.body_block(func_op)
    backward, _ = graph.backward_ops(func_op)
    count = 0
    for op in list(block.operations):
        op = op.operation
        if graph.OFFLOAD_ATTR not in op.attributes or op_id(op) in backward:
            continue
        src, dst = _parse(op.attributes[graph.OFFLOAD_ATTR])
        for v in _residual_values(op):
            bwd_uses = [u for u in v.uses
                        if graph.top_level_id(u.owner.operation, block) in backward]
            if not bwd_uses:
                continue
            first = min((graph.top_level_op(u.owner.operation, block) for u in bwd_uses),
                        key=lambda o: _position(block, o))
            host = annotate(v, dst, ir.InsertionPoint.after(v.owner), op.location)
            device = annotate(host, src, ir.InsertionPoint(first), first.location)
            for use in bwd_uses:
                use.owner.operands[use.operand_number] = device
            count += 1
    return count


def offload_loops(block) -> int:
    """Per-iteration offload inside scan loop pairs (joint form), as JAX emits it for
    `jax.checkpoint` inside `lax.scan`: the stacked value goes to host before it is
    written into its buffer; each backward read comes back to the device."""
    count = 0
    for pair in scan.find_pairs(block):
        for m, k in pair.links.items():
            s = pair.fwd.stacked[k]
            v = s.value
            producer = v.owner if isinstance(v, ir.OpResult) else None
            if producer is not None and producer.name == "stablehlo.reduce_precision" and \
                    isinstance(producer.operands[0], ir.OpResult):
                producer = producer.operands[0].owner   # rounded by insert-reduce-precision
            if producer is None or graph.OFFLOAD_ATTR not in producer.attributes:
                continue
            src, dst = _parse(producer.attributes[graph.OFFLOAD_ATTR])
            wrap = s.dus.operands[1].owner.operation
            host = annotate(v, dst, ir.InsertionPoint(wrap), wrap.location)
            wrap.operands[0] = host
            for rd in pair.reads[m]:
                value = rd.value
                uses = list(value.uses)
                device = annotate(value, src, ir.InsertionPoint.after(rd.reshape_op),
                                  rd.reshape_op.location)
                for use in uses:
                    use.owner.operands[use.operand_number] = device
            count += 1
        count += offload_loops(pair.bwd.regions[1].blocks[0])
    return count


def _residual_values(op) -> list:
    """The values of an offloaded producer the backward may read: its results, or the
    rounded copies insert-reduce-precision put after them."""
    values = []
    for v in op.results:
        values.append(v)
        values.extend(u.owner.operation.results[0] for u in v.uses
                      if u.owner.operation.name == "stablehlo.reduce_precision")
    return values


def _position(block, op) -> int:
    target = op_id(op)
    for i, o in enumerate(block.operations):
        if op_id(o) == target:
            return i
    raise ValueError("op not in block")


def offload_split(fwd, bwd) -> int:
    fwd_block, bwd_block = graph.body_block(fwd), graph.body_block(bwd)
    ret = list(fwd_block.operations)[-1].operation
    residuals = graph.split_residuals(fwd)
    count = 0
    for k, (i, v) in enumerate(residuals):
        attr = graph.attr_value(fwd, "res_attrs", i, graph.OFFLOAD_ATTR)
        if attr is None:
            continue
        src, dst = _parse(attr)
        ip = ir.InsertionPoint(ret) if isinstance(v, ir.BlockArgument) else \
            ir.InsertionPoint.after(v.owner)
        host = annotate(v, dst, ip, ret.location)
        ret.operands[i] = host
        graph.set_attr_entry(fwd, "res_attrs", i, "mhlo.memory_kind", ir.StringAttr.get(dst))
        arg = bwd_block.arguments[k]
        if graph.attr_value(bwd, "arg_attrs", k, graph.OFFLOAD_ATTR) is None:
            continue
        uses = list(arg.uses)
        if uses:
            first = min((graph.top_level_op(u.owner.operation, bwd_block) for u in uses),
                        key=lambda o: _position(bwd_block, o))
            device = annotate(arg, src, ir.InsertionPoint(first), first.location)
            for use in uses:
                use.owner.operands[use.operand_number] = device
        graph.set_attr_entry(bwd, "arg_attrs", k, "mhlo.memory_kind", ir.StringAttr.get(dst))
        count += 1
    return count


class AnnotateHostOffload(ModulePass):
    name = "annotate-host-offload"
    summary = ("Annotate Offloadable residuals with annotate_device_placement (to host after the "
               "producer, back to device before the first backward use)")
    options = (Option("func", str, "main", "the function remat-partial-eval rewrote"),)

    def run(self, module, options, state):
        name = options["func"]
        with module.context, ir.Location.unknown():
            if graph.is_split(module, name):
                offload_split(graph.find_func(module, f"{name}_fwd"),
                              graph.find_func(module, f"{name}_bwd"))
            else:
                func_op = graph.find_func(module, name)
                offload_joint(func_op)
                offload_loops(graph.body_block(func_op))
