"""Loops, cases and shard_maps nested in a scan body: what the outer forward loop must
have them return before it can stack it. A nested forward loop stacks the inner values
the policy saves (what JAX's forward keeps per inner iteration); a nested case the policy
recomputes returns the branch values it saves (`case_nested`), a nested shard_map the
body values it saves (`manual_nested`).
"""
from __future__ import annotations

from remat_passes.analysis import scan_pairs
from remat_passes.analysis.scan_pairs import Pair, analyse_forward
from remat_passes.ir import contract, graph
from remat_passes.ir.graph import CASE
from remat_passes.ir.mlir import ir, op_id
from remat_passes.ir.verdicts import Recompute
from remat_passes.regions import case_nested, loop_edit, manual_nested


def inner_saved(loop, verdict) -> list:
    """Values of a nested forward loop's body that the policy saves and that its
    backward needs through recomputation: what JAX's forward stacks per inner iteration
    (the branch values a case of the body returns, `contract.case_saves`, among them)."""
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
        # (a case recomputed with the body reads back the branch values it returns)
        todo.extend(op.results[k] for k in contract.case_saves(op))
    return out


def plan_prestack(pair: Pair, verdict) -> list:
    """[(nested forward loop, values to stack)]: for each forward scan loop nested in
    `pair`'s forward body, the inner values the policy saves that it does not stack yet;
    [(nested case, values per branch)]: for each case there the policy recomputes, the
    branch values it saves (`case_nested.plan_nested_saves`); [(nested shard_map, values)]:
    for each manual computation there the policy recomputes, the body values it saves
    (`manual_nested.plan_nested_saves`), once the cases in its body return theirs
    (`manual_nested.cases_to_presave`)."""
    out = []
    for op in pair.fwd.body.operations:
        cases = manual_nested.cases_to_presave(op, verdict)
        if cases:          # (first the cases in a shard_map's body return their values)
            out.extend(cases)
            continue
        if op.operation.name in (CASE, graph.MANUAL_COMPUTATION):
            saved = (case_nested if op.operation.name == CASE
                     else manual_nested).nested_saves_needed(op, verdict)
            if saved is not None:
                out.append((op.operation, saved))
            continue
        loop = analyse_forward(op)
        if loop is None:
            continue
        stacked = {s.value for s in loop.stacked.values()}
        new = [v for v in inner_saved(loop, verdict) if v not in stacked]
        if new:
            out.append((loop, new))
    return out


def prestack(plan: list, verdict) -> None:
    """Make each nested forward loop of `plan_prestack` stack its values too, and each
    nested case or shard_map return its saved values (the outer loop then stacks them as
    needed)."""
    for nested, values in plan:
        if not isinstance(nested, scan_pairs.ForwardLoop):     # a case or a shard_map
            with nested.location:
                if nested.name == CASE:
                    case_nested.add_nested_saves(nested, values, verdict)
                else:
                    manual_nested.add_nested_saves(nested, values)
            continue
        loop = nested
        edit = loop_edit.LoopEdit(loop.op)
        with loop.op.location:
            for v in values:
                loop_edit.stack_value(loop, edit, v)
        edit.rebuild({k: k for k in range(len(loop.op.results))})
