"""A `stablehlo.case` nested in a loop body or a branch: which of its branch values the
backward needs saved, and rebuilding it so that it returns them (`remat.case_saves`
records which results hold them); plus the case-rebuilding helpers the case-pair
rewrite shares.
"""
from __future__ import annotations

from remat_passes.analysis.scan_pairs import saved_results
from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import ir, op_id
from remat_passes.ir.verdicts import Offloadable, Recompute, Saveable
from remat_passes.regions import loop_edit

CASE = graph.CASE


def _return_in(block, values) -> None:
    """Replace (or add) the terminator of a case branch with one returning `values`."""
    ops = list(block.operations)
    ret = ops[-1].operation if ops and ops[-1].operation.name == "stablehlo.return" else None
    ip = ir.InsertionPoint(ret) if ret is not None else ir.InsertionPoint(block)
    loc = ret.location if ret is not None else ir.Location.unknown()
    ir.Operation.create("stablehlo.return", operands=values, loc=loc, ip=ip)
    if ret is not None:
        ret.erase()


def rebuilt(old, types, yields_of, ip):
    """A case op like `old` (its regions moved over) whose branch j returns
    `yields_of(j, terminator operands, insertion point)`."""
    for j, region in enumerate(old.regions):
        block = region.blocks[0]
        ret = graph.terminator(block)
        _return_in(block, yields_of(j, list(ret.operands), ir.InsertionPoint(ret)))
    new = ir.Operation.create(CASE, results=types, operands=list(old.operands),
                              regions=len(old.regions), loc=old.location, ip=ip,
                              attributes=graph.attributes(old))
    for j, region in enumerate(old.regions):
        region.blocks[0].append_to(new.regions[j])
    return new


def merged_slot(types: list, used: set, t, shareable=lambda s: True) -> int:
    """A slot of type `t` among `types` not in `used` (and `shareable`), else a new one
    appended to `types` (how a case shares its slots across branches; the planner's
    model of it, `case_model`, counts them the same way)."""
    for s, ts in enumerate(types):
        if shareable(s) and s not in used and ts == t:
            return s
    types.append(t)
    return len(types) - 1


def shrunk(op, keep: list):
    """Replace case `op` by one with only the results `keep` (None: erased, nothing kept)."""
    if not keep:
        op.erase()
        return None
    types = [op.results[i].type for i in keep]
    new = rebuilt(op, types, lambda j, before, ip: [before[i] for i in keep],
                  ir.InsertionPoint(op))
    for n, i in enumerate(keep):
        op.results[i].replace_all_uses_with(new.results[n])
    op.erase()
    for region in new.regions:
        graph.erase_unused_in_block(region.blocks[0])
    return new


def plan_nested_saves(case, verdict) -> list[list]:
    """Per branch of `case` (nested in a scan body or in another case's branch, where a
    recomputation clones it whole): the values inside the branch that the policy saves
    and that computing the branch's results needs, in program order. JAX's cond rule
    makes them residuals of the cond; empty lists: nothing to save."""
    return [saves_for_results(region.blocks[0], lambda v: graph.is_side_effecting(
        v.owner.operation) or verdict(v) is not Recompute, verdict) for region in case.regions]


def saves_for_results(block, kept, verdict) -> list:
    """The values of `block`'s ops that `kept(value)` says are saved and that computing
    what the block returns needs (through values it does not keep), in program order:
    what a region nested where a recomputation clones it whole must return (a case's
    branch, a shard_map's body). A region op recomputed with the block reads back what
    its own regions save (`scan_pairs.saved_results` under `verdict`)."""
    order = {op_id(op): n for n, op in enumerate(block.operations)}
    todo = list(graph.terminator(block).operands)
    seen, saved = set(), []
    while todo:
        v = todo.pop()
        if v in seen or not isinstance(v, ir.OpResult) or op_id(v.owner) not in order:
            continue
        seen.add(v)
        op = v.owner.operation
        if op.name == "stablehlo.constant":
            continue
        if kept(v):
            saved.append(v)
            continue
        todo.extend(graph.read_values(op))
        # (a region op recomputed with the block reads back what its regions save)
        todo.extend(saved_results(op, verdict))
    return sorted(saved, key=lambda v: (order[op_id(v.owner)], v.result_number))


def add_nested_saves(case, saved: list, verdict):
    """Rebuild `case` with results that hold the values of `plan_nested_saves` (a slot of
    one type and placement shared across branches, zeros in the others), recorded in
    `remat.case_saves`. Returns the new case."""
    kinds, per_branch = [], []          # per slot: (type, verdict); per branch: {slot: v}
    for values in saved:
        used, mine = set(), {}
        for v in values:
            s = merged_slot(kinds, used, (str(v.type), _placement(v, verdict)))
            used.add(s)
            mine[s] = v
        per_branch.append(mine)
    n_old = len(case.results)
    types = [r.type for r in case.results]
    extra = [next(mine[s] for mine in per_branch if s in mine).type for s in range(len(kinds))]

    def yields(j, before, ip):
        return before + [per_branch[j][s] if s in per_branch[j] else
                         loop_edit.zeros(t, ip, case.location) for s, t in enumerate(extra)]
    new = rebuilt(case, types + extra, yields, ir.InsertionPoint(case))
    for k in range(n_old):
        case.results[k].replace_all_uses_with(new.results[k])
    case.erase()
    contract.set_case_saves(new, {n_old + s: kd[1] for s, kd in enumerate(kinds)})
    return new


def _placement(v, verdict):
    """Saveable, or the Offloadable a saved value keeps."""
    if graph.is_side_effecting(v.owner.operation):
        return Saveable
    placement = verdict(v)
    return placement if isinstance(placement, Offloadable) else Saveable


def reuse_nested_saves(clone, values: dict, reuse_inner) -> None:
    """A recompute clone of a case with `remat.case_saves`: wherever branch j computed the
    value it returns in saved result k, it uses `values[k]` (result k read back) instead;
    what only computed those values goes. A value a region op of the branch returned (a
    case, a scan loop nested there, which saved it in turn) goes to `reuse_inner(op,
    {result: value})` too, so that its regions read it back as well."""
    for region in clone.regions:
        block = region.blocks[0]
        mine = {op_id(op) for op in block.operations}
        ret = graph.terminator(block)
        inner: dict = {}                    # region op of the branch -> {result: value}
        for k, new in values.items():
            v = ret.operands[k]
            if isinstance(v, ir.OpResult) and op_id(v.owner) in mine and \
                    v.owner.operation.name != "stablehlo.constant":
                v.replace_all_uses_with(new)
                if len(v.owner.operation.regions):
                    inner.setdefault(v.owner.operation, {})[v.result_number] = new
        for op, read in inner.items():
            reuse_inner(op, read)
        graph.erase_unused_in_block(block)


def nested_saves_needed(op, verdict) -> list | None:
    """For a case a recomputation would clone whole (the policy recomputes it) that does
    not return its saved values yet: `plan_nested_saves`; else (or nothing to save) None."""
    op = op.operation
    if op.name != CASE or contract.case_saves(op) or not op.results or \
            all(verdict(r) is not Recompute for r in op.results):
        return None
    saved = plan_nested_saves(op, verdict)
    return saved if any(saved) else None
