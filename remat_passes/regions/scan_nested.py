"""A forward scan loop nested where a recomputation clones it (in a scan body, a cond's
branch, a shard_map body): the values of its body the policy saves, which it must stack
(what JAX's forward keeps per inner iteration) before the op around it can keep them
(`nested_saves`).
"""
from __future__ import annotations

from remat_passes.analysis import scan_pairs
from remat_passes.ir import graph
from remat_passes.ir.mlir import ir, op_id
from remat_passes.ir.verdicts import Recompute
from remat_passes.regions import loop_edit


def inner_saved(loop, verdict) -> list:
    """Values of a nested forward loop's body that the policy saves and that its
    backward needs through recomputation: what JAX's forward stacks per inner iteration
    (the values a region op of the body returns for its regions, among them)."""
    body_ops = {op_id(op) for op in loop.body.operations}
    ret = graph.terminator(loop.body)
    todo = [s.value for s in loop.stacked.values()
            if isinstance(s.value, ir.BlockArgument) or verdict(s.value) is Recompute]
    seen, out = set(), []
    while todo:
        v = todo.pop()
        if v in seen:
            continue
        seen.add(v)
        if isinstance(v, ir.BlockArgument):
            k = v.arg_number
            if v.owner == loop.body and k not in loop.invariant and k != loop.counter:
                todo.append(ret.operands[k])   # a carry-in is the previous carry-out
            continue
        if op_id(v.owner) not in body_ops:
            continue
        op = v.owner.operation
        if op.name == "stablehlo.constant":
            continue
        if verdict(v) is not Recompute:
            out.append(v)
            continue
        todo.extend(graph.read_values(op))
        # (a region op recomputed with the body reads back what its regions save)
        todo.extend(scan_pairs.saved_results(op, verdict))
    return out


def prestack(loop, values: list):
    """Make forward loop `loop` (`scan_pairs.ForwardLoop`) stack `values` of its body too
    (an outer loop, a case or a shard_map around it keeps the stacks). Returns the new
    loop op (its old results keep their numbers; the body's ops are the same ops)."""
    edit = loop_edit.LoopEdit(loop.op)
    with loop.op.location:
        for v in values:
            loop_edit.stack_value(loop, edit, v)
    return edit.rebuild({k: k for k in range(len(loop.op.results))})
