"""place-optimization-barriers: keep XLA from undoing or hoisting recomputation (prevent_cse).

remat-partial-eval clones recomputed ops into the backward pass, marked
`remat.recompute = <group>`: one group per backward op that needed them, placed
right before it. Left alone, XLA would CSE a clone with the forward op it
copies (the saving is gone) or schedule it early (everything is live again).
As in `jax.checkpoint`'s lowering, the values each group reads from outside
itself go through one `stablehlo.optimization_barrier` together with a backward
value available at that point — the incoming cotangent of the group's consumer —
and the group reads the barrier's results. The barrier is opaque to CSE, and it
cannot run before the cotangent exists.

Run it in joint form on @<f>, in split form on @<f>_bwd. Inside scan loop bodies
it places barriers only with `in-loops=true`: there the loop already keeps each
iteration's recomputation in its iteration (JAX recommends prevent_cse=False
for jax.checkpoint inside lax.scan). In a loop body the barrier's backward value
is a carry the body changes (the carried cotangent or a gradient accumulator).
"""
from __future__ import annotations

from remat_passes import graph
from remat_passes.mlir import ir, op_id, stablehlo
from remat_passes.passes import ModulePass, Option, parse_bool

BARRIER_ATTR = "remat.barrier"  # marks the barriers this pass made (removed by strip)


def _group_of(op):
    attrs = op.operation.attributes
    if graph.RECOMPUTE_ATTR not in attrs:
        return None
    return ir.IntegerAttr(attrs[graph.RECOMPUTE_ATTR]).value


def recompute_groups(block) -> list[tuple[list, object]]:
    """[(ops of a recompute group, the op right after it)] in program order."""
    groups, current, current_id = [], [], None
    for op in block.operations:
        gid = _group_of(op)
        if gid is not None and gid == current_id:
            current.append(op.operation)
            continue
        if current:
            groups.append((current, op.operation))
        current, current_id = ([op.operation], gid) if gid is not None else ([], None)
    return groups


def place_barriers(func_op) -> int:
    """Insert one barrier per recompute group of `func_op`; returns how many."""
    block = graph.body_block(func_op)
    cotangents = [block.arguments[i] for i in range(len(block.arguments))
                  if graph.COTANGENT_ATTR in graph.arg_attr_names(func_op, i)]
    backward, _ = graph.backward_ops(func_op)
    return _place_in_block(block, backward, cotangents)


def place_barriers_in_loops(func_op) -> int:
    """Insert barriers for the recompute groups inside while bodies of `func_op`."""
    bodies = []

    def visit(op):
        if op.name == "stablehlo.while":
            bodies.append(op.regions[1].blocks[0])
        return ir.WalkResult.ADVANCE
    func_op.operation.walk(visit)
    placed = 0
    for body in bodies:
        ret = list(body.operations)[-1].operation
        changing = [a for a, r in zip(body.arguments, ret.operands) if r != a and str(
            ir.RankedTensorType(a.type).element_type).startswith(("f", "bf"))]
        backward = {op_id(op) for op in body.operations if _group_of(op) is None}
        placed += _place_in_block(body, backward, changing)
    return placed


def _place_in_block(block, backward, cotangents) -> int:
    groups = recompute_groups(block)
    if not groups:
        return 0
    placed = 0
    for ops, consumer in groups:
        inside = {r for op in ops for r in op.results}
        inputs = []
        for op in ops:
            inputs.extend(v for v in graph.read_values(op) if v not in inside)
        inputs = list(dict.fromkeys(inputs))
        if not inputs:
            continue  # constants only: nothing to hide from CSE
        ct = _incoming_cotangent(consumer, ops[0], block, backward, inside, cotangents)
        operands = inputs + ([ct] if ct is not None and ct not in inputs else [])
        barrier = stablehlo.OptimizationBarrierOp(
            operands, ip=ir.InsertionPoint(ops[0]), loc=ops[0].location)
        barrier.operation.attributes[BARRIER_ATTR] = ir.UnitAttr.get()
        for old, new in zip(inputs, barrier.results):
            for op in ops:
                graph.replace_reads(op, old, new)
        placed += 1
    return placed


def _incoming_cotangent(consumer, first, block, backward, inside, cotangents):
    """A backward value available before `first`: the consumer's cotangent operand,
    else the latest backward result before the group, else a cotangent argument."""
    for v in graph.read_values(consumer):
        if v in inside:
            continue
        if isinstance(v, ir.BlockArgument):
            if v in cotangents:
                return v
        elif op_id(v.owner) in backward and _group_of(v.owner) is None:
            return v
    latest = None
    for op in block.operations:
        if op_id(op) == op_id(first):
            break
        if op_id(op) in backward and _group_of(op) is None and len(op.results):
            latest = op.results[0]
    if latest is not None:
        return latest
    return cotangents[0] if cotangents else None


class PlaceOptimizationBarriers(ModulePass):
    name = "place-optimization-barriers"
    summary = ("Route the inputs of each recomputation, with the incoming cotangent, through "
               "an optimization_barrier so XLA cannot CSE or hoist it (prevent_cse)")
    options = (Option("func", str, "main",
                      "the function remat-partial-eval rewrote (its _bwd half in split form)"),
               Option("in-loops", parse_bool, False,
                      "also inside scan loop bodies (JAX recommends prevent_cse=False there)"))

    def run(self, module, options, state):
        name = options["func"]
        target = f"{name}_bwd" if graph.is_split(module, name) else name
        with module.context:
            func_op = graph.find_func(module, target)
            place_barriers(func_op)
            if options["in-loops"]:
                place_barriers_in_loops(func_op)
