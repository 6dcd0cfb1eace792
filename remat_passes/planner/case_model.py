"""How a `lax.cond` enters the planning problem of `auto`: what the case-pair rule keeps
of its forward case, and the choices the plan has for the ops of its branches.

The rule (`regions.case_rewrite`) plans a cond per branch, with the verdicts of the
policies in force there, and keeps residual slots shared by type across branches: what
it keeps is not a sum over values, so the branches' ops are not nodes of their own.
Instead `add_case` models a chain of choices for the ops of the branches that the plan
decides, each recomputing more than the one before: what `dots_saveable` recomputes, then
what `dots_with_no_batch_dims_saveable` recomputes too, then all of them. An op node
stands for each step (`ProblemBuilder.group`): it produces the slots only the choice
before it keeps, reads what its recomputation reads, and costs what it recomputes more
(in the costliest branch). A step is taken only after the one before it: it reads a
*token* of that step, a value too large to keep (`ProblemBuilder.token`). So every plan
is one of the choices, and what it counts is what the rule keeps.

A region op in a branch (a scan loop, a case, at any depth through loops and cases) that a
step recomputes is rerun by the rule, and what the step saves inside it is returned by it
(stacked per iteration by a loop) and kept (`nested_saves.presave`): `_presaved_stacks`
adds those to the slots, and the step's cost counts the ops inside it recomputes (a loop's
per iteration). Such an op whose step the plan does not take is saved
(`ProblemBuilder.group`'s `held`), not recomputed with the op it is in. A case in a scan
body (or a shard_map body) has its dots as a choice of their own the same way
(`add_body_case`).

A primal output the backward needs (a later op's derivative reads it, or a recomputed
op) is served by its *twin* (`case_rewrite`): free where the twin reads a slot the case
keeps anyway, else the bytes of a slot of its own.
"""
from __future__ import annotations

from typing import NamedTuple

from remat_passes.analysis import scan_pairs
from remat_passes.ir import graph
from remat_passes.ir.mlir import ir, op_id
from remat_passes.ir.verdicts import Recompute, Saveable
from remat_passes.policy.policies import dots_saveable, dots_with_no_batch_dims_saveable
from remat_passes.policy.scopes import policy_verdict
from remat_passes.regions import case_nested, case_rewrite, scan_nested

# the steps of the chain: (what recomputes the ops of the branches, how a report names them)
STEPS = ((dots_saveable, "what dots_saveable recomputes"),
         (dots_with_no_batch_dims_saveable, "the batch dots"),
         (None, "the rest"))


class CaseKept(NamedTuple):
    """What the case-pair rule keeps for a forward case under one choice of verdicts."""
    nodes: list       # value nodes of its residual results standing for the residual
                      # slots it keeps, one of the same type each
    twins: list       # value nodes of primal outputs whose twins read a slot of their own
                      # (kept where something reads the twin)
    outside: list     # vids of values outside the case that its backward, or a branch's
                      # recomputation, reads directly
    results: list     # vids of its results, whose reads by the backward those stand for
    clones: list      # per branch, the ops its recompute case clones
    verdict: object   # value -> verdict of the choice (what a cloned scan loop recomputes)

    def slots(self) -> set:
        return set(self.nodes) | set(self.twins)


def case_kept(a, pair, vid_node, op_verdict) -> CaseKept | None:
    """What the case-pair rule keeps for forward case `pair.fwd`, planned per branch with
    `op_verdict` for the ops of its branches. The rule serves each backward read of a
    result from a slot, a value outside or a recompute case, a primal output's direct
    reads too. None where the slots do not map onto its results (the model then counts
    every result the backward reads)."""
    def verdict(v):
        return scan_pairs.value_verdict(v, op_verdict)
    plan = case_rewrite.plan_case(pair, verdict)
    presaved = _presaved_stacks(plan, verdict)
    if presaved is None:
        return None
    results = pair.fwd.results
    free = [r for k, r in enumerate(results) if k not in pair.outside]
    primal = [results[k] for k in sorted(pair.outside)]
    twin_only = _twin_only_slots(plan)
    nodes, twins = [], []
    for s, t in enumerate(_with_presaved(plan, presaved)):
        if isinstance(t, int):
            continue
        # a slot stands on a residual result of its type (one beyond JAX's residuals, on
        # a primal output); one only a twin reads, on the twin's primal output
        pool = next((pool for pool in (free, primal) if any(r.type == t for r in pool)), None)
        if pool is None:
            return None
        match = next(r for r in pool if r.type == t)
        pool.remove(match)
        if s in twin_only:
            twins.append(vid_node[a.vid(results[twin_only[s]])])
        else:
            nodes.append(vid_node[a.vid(match)])
    outside = [src for _, _, src in plan.replace if isinstance(src, ir.Value)]
    outside += [src for branch in plan.clones for clone in branch
                for src in clone.sources.values() if isinstance(src, ir.Value)]
    outside += [src for branch in plan.r_yields for src in branch.values()
                if isinstance(src, ir.Value)]
    return CaseKept(nodes, list(dict.fromkeys(twins)), [a.vid(v) for v in dict.fromkeys(outside)],
                    [a.vid(r) for r in results],
                    [[clone.op for clone in branch] for branch in plan.clones], verdict)


def _presaved_stacks(plan, verdict) -> list | None:
    """Per branch, the types of the results `nested_saves.presave` adds to the region ops the
    recompute case clones (the values inside them the policy saves, which the clone reads
    back: the rule keeps them in slots of the forward case). None where that is not
    modelled (`_nested_saves`: the step joins the next)."""
    out = []
    for branch in plan.clones:
        types = []
        for clone in branch:
            mine = _nested_saves(clone.op, verdict)
            if mine is None:
                return None
            types += mine
        out.append(types)
    return out


def _nested_saves(op, verdict) -> list | None:
    """The types of the results presave adds to region op `op` where the choice recomputes
    it: a scan loop's stacks (`_loop_stacks`), a case's slots (`_case_saves`); none for
    other ops. None for another region op that saves a value inside."""
    op = op.operation
    if not op.regions or not any(verdict(r) is Recompute for r in op.results):
        return []
    loop = scan_pairs.analyse_forward(op)
    if loop is not None:
        return _loop_stacks(loop, verdict)
    if op.name == graph.CASE:
        return _case_saves(op, verdict)
    return None if _saves_inside(op, verdict) else []


def _loop_stacks(loop, verdict) -> list | None:
    """The types of the stacks presave adds to forward loop `loop`: the values of its body
    the choice saves that it does not stack yet, and what each region op of its body the
    choice recomputes returns more, per iteration (presave rebuilds those first)."""
    types = []
    for op in loop.body.operations:
        more = _nested_saves(op, verdict)
        if more is None:
            return None
        types += more
    stacked = {st.value for st in loop.stacked.values()}
    types += [v.type for v in scan_nested.inner_saved(loop, verdict) if v not in stacked]
    return [ir.RankedTensorType.get([loop.trip_count] + list(ir.RankedTensorType(t).shape),
                                    ir.RankedTensorType(t).element_type, loc=loop.op.location)
            for t in types]


def _case_saves(case, verdict) -> list | None:
    """The types of the results presave adds to `case` (`case_nested.add_nested_saves`: a
    slot per type a branch keeps, shared across branches): the values of a branch the
    choice saves, and what each region op of the branch it recomputes returns more
    (presave rebuilds those first)."""
    kinds: list = []
    for region, values in zip(case.regions, case_nested.plan_nested_saves(case, verdict)):
        types = [v.type for v in values]
        for op in region.blocks[0].operations:
            more = _nested_saves(op, verdict)
            if more is None:
                return None
            types += more
        used: set = set()
        for t in types:
            used.add(case_nested.merged_slot(kinds, used, t))
    return kinds


def _saves_inside(op, verdict) -> bool:
    """Is region op `op` recomputed while an op nested in it is saved?"""
    op = op.operation
    return any(verdict(r) is Recompute for r in op.results) and any(
        verdict(r) is not Recompute for region in op.regions for block in region.blocks
        for each in graph.nested_ops(block) if each.name != "stablehlo.constant"
        for r in each.results)


def _with_presaved(plan, presaved: list) -> list:
    """`plan.layout` with the slots the presaved stacks take: each a residual slot of its
    type its branch does not use, else a new one (`case_rewrite.slot_for`)."""
    layout = list(plan.layout)
    for j, types in enumerate(presaved):
        used = set(plan.yields[j])
        for t in types:
            used.add(case_nested.merged_slot(layout, used, t,
                                              lambda s: not isinstance(layout[s], int)))
    return layout


def _twin_only_slots(plan) -> dict:
    """{slot: the primal output (old result number) whose twin alone reads it}: the rule
    drops such a slot where nothing reads the twin (`case_rewrite.tidy`)."""
    def slots(sources):
        return {x.index for x in sources if isinstance(x, case_rewrite.Slot)}
    # the recompute case's results that are twins the backward does not read directly
    read = {x.index for _, _, x in plan.replace if isinstance(x, case_rewrite.Recomputed)}
    unread = {i for _, i in plan.twins_r} - read
    used = slots(src for _, _, src in plan.replace)
    used |= slots(src for branch in plan.clones for clone in branch
                  for src in (*clone.sources.values(), *(clone.saved or {}).values()))
    used |= slots(src for branch in plan.r_yields for i, src in branch.items()
                  if i not in unread)
    out = {}
    for k, s in plan.twins_f:
        if s not in used:
            out[s] = plan.layout[k]
    for k, i in plan.twins_r:
        if i not in unread:
            continue
        for s in slots(branch.get(i) for branch in plan.r_yields) - used:
            out[s] = plan.layout[k]
    return out


def add_case(b, a, pair, vid_node, sources, governed, scope_re) -> CaseKept | None:
    """Model forward case `pair.fwd` in builder `b` (see the module docstring): returns
    what saving the branches' ops keeps (the fixed policies' verdicts: an auto policy's
    ops count as saved, the fallback a plan leaves them to); None where `case_kept` is."""
    fixed = governed.fixed
    saved = case_kept(a, pair, vid_node, fixed.body_verdict)
    if saved is None:
        return None
    for k in pair.outside:
        node = vid_node[a.vid(pair.fwd.results[k])]
        if node not in saved.slots():
            b.value_bytes[node] = 0
    if governed(a.position[op_id(pair.fwd)]):
        _add_steps(b, a, pair, vid_node, sources, governed, scope_re, saved)
    return saved


def _add_steps(b, a, pair, vid_node, sources, governed, scope_re, saved) -> None:
    """The chain of choices for the branches' ops the plan decides (`STEPS`)."""
    fixed = governed.fixed
    mine = [op for region in pair.fwd.regions for block in region.blocks
            for op in graph.nested_ops(block)
            if governed.body_op(op, scope_re) and not graph.is_side_effecting(op)]
    line = graph.source_position(pair.fwd)[0]
    where = "the branches of the cond" + (f" at {line}" if line else "")
    before, taken, cost_before, last = saved, set(), (0.0, 0.0), None
    for policy, name in STEPS:
        ops = [op for op in mine if op_id(op) not in taken and (
            policy is None or policy_verdict(policy, op) is Recompute)]
        if not ops:
            continue
        ids = taken | {op_id(op) for op in ops}
        after = case_kept(a, pair, vid_node, lambda op, ids=ids: Recompute
                          if op_id(op) in ids else fixed.body_verdict(op))
        if after is None or not after.slots() < before.slots() \
                or not set(after.nodes) <= set(before.nodes):
            continue        # (its ops join the next step's)
        cost = _recompute_cost(b, saved, after)
        ops = [op for op in mine if op_id(op) in ids - taken]
        node = b.group(pair.fwd, ops, max(cost[0] - cost_before[0], 0.0),
                       max(cost[1] - cost_before[1], 0.0), f"{name} in {where}",
                       held=[op for op in ops if _nested(op, pair.fwd)])
        for n in before.slots() - after.slots():
            b.value_producer[n] = node
            b.pinned.add(n)
        b.reads[node].extend(n for vid in after.outside for n in sources(vid))
        if last is not None:
            b.reads[node].append(b.token(last))
        before, taken, cost_before, last = after, ids, cost, node


def _nested(op, case) -> bool:
    """Is `op` in a scan loop or a case in one of `case`'s branches, through loops and cases
    alone? (What `case_kept` counts of the values saved in such an op, `_presaved_stacks`,
    is kept only if they are saved where the plan recomputes the op.)"""
    depth = 0
    for parent in graph.ancestors(op):
        if op_id(parent) == op_id(case):
            return depth > 0
        if parent.name not in (graph.WHILE, graph.CASE):
            return False
        depth += 1
    return False


def _recompute_cost(b, saved: CaseKept, after: CaseKept) -> tuple:
    """(seconds, FLOPs) of what `after` recomputes beyond `saved`, in the costliest branch."""
    seconds, flop_count = 0.0, 0.0
    for j in range(len(after.clones)):
        mine, known = _branch_cost(b, after, j), _branch_cost(b, saved, j)
        seconds = max(seconds, mine[0] - known[0])
        flop_count = max(flop_count, mine[1] - known[1])
    return seconds, flop_count


def _branch_cost(b, kept: CaseKept, j: int) -> tuple:
    """(seconds, FLOPs) of the ops `kept`'s recompute case clones in branch j: a scan loop
    its body's ops the choice recomputes, per iteration (what it saves is read back)."""
    seconds, flop_count = 0.0, 0.0
    for op in kept.clones[j]:
        cost = _op_cost(b, op, kept.verdict)
        seconds, flop_count = seconds + cost[0], flop_count + cost[1]
    return seconds, flop_count


def _op_cost(b, op, verdict) -> tuple:
    """(seconds, FLOPs) of recomputing `op`: a scan loop, per iteration, the ops of its body
    `verdict` recomputes that compute the next carries (the rerun of the loop) and, again,
    those that compute what an iteration stacks (its backward iteration reruns them: the
    per-iteration rewrite, `case_crossing`), a loop or a case among them the same way; a
    case, those of its costliest branch; else the op."""
    loop = scan_pairs.analyse_forward(op)
    if loop is not None:
        ret = graph.terminator(loop.body)
        carries = [v for k, v in enumerate(ret.operands) if k not in loop.stacked
                   and k not in loop.invariant and k != loop.counter]
        stacked = [st.value for st in loop.stacked.values()]
        rerun = _closure_cost(b, loop.body, carries, verdict)
        again = _closure_cost(b, loop.body, stacked, verdict)
        return (loop.trip_count * (rerun[0] + again[0]),
                loop.trip_count * (rerun[1] + again[1]))
    if op.name != graph.CASE:
        return b.profile.op_seconds(op, b.cost_model), b.cost_model.op_flops(op)
    costs = [_closure_cost(b, region.blocks[0],
                           list(graph.terminator(region.blocks[0]).operands), verdict)
             for region in op.regions]
    return max(c[0] for c in costs), max(c[1] for c in costs)


def _closure_cost(b, block, roots: list, verdict) -> tuple:
    """(seconds, FLOPs) of the ops of `block` that computing `roots` recomputes: through
    values `verdict` recomputes, each op once (what it saves is read back)."""
    mine = {op_id(op) for op in block.operations}
    seen, todo = set(), list(roots)
    seconds, flop_count = 0.0, 0.0
    while todo:
        v = todo.pop()
        if not isinstance(v, ir.OpResult) or op_id(v.owner) not in mine or \
                verdict(v) is not Recompute:
            continue
        o = v.owner.operation
        if op_id(o) in seen:
            continue
        seen.add(op_id(o))
        cost = _op_cost(b, o, verdict)
        seconds, flop_count = seconds + cost[0], flop_count + cost[1]
        todo.extend(graph.read_values(o))
    return seconds, flop_count


def add_body_case(b, case, node: int, n: int, copies: int = 1) -> None:
    """A case in a scan loop's body (a `lax.cond` per iteration) or in a Shardy shard_map
    body (`copies`: the devices' copies of a value it keeps), op node `node` of the body
    (`n` times): where the plan recomputes it, the backward body reruns it, and the
    dots in its branches (in loops and cases there too) are a choice of their own (a group
    node): recomputed with it, or kept per iteration (what `nested_saves.presave` makes
    the case return, `_case_saves`), which the rerun reads back. Before, the case was
    recomputed whole or not at all, so that auto at dots_saveable's bytes recomputed 20%
    more FLOPs than it. Not modelled (the case stays one op): branches with side-effecting
    ops, or with no dots."""
    ops = [op for region in case.regions for block in region.blocks
           for op in graph.nested_ops(block)]
    if any(graph.is_side_effecting(op) for op in ops):
        return
    dots = [op for op in ops
            if not op.regions and policy_verdict(dots_saveable, op) is not Recompute]
    ids = {op_id(op) for op in dots}

    def kept(v):                      # the dots saved, the rest recomputed
        return scan_pairs.value_verdict(v, lambda op: Saveable if op_id(op) in ids
                                        else Recompute)
    slots = _case_saves(case, kept) if dots else None
    if not slots:
        return
    rest = _op_cost(b, case, kept)
    total = _op_cost(b, case, lambda v: Recompute)
    b.op_cost[node], b.flops[node] = rest[0] * n, rest[1] * n
    line = graph.source_position(case)[0]
    group = b.group(case, dots, max(total[0] - rest[0], 0.0) * n,
                    max(total[1] - rest[1], 0.0) * n,
                    "the dots in the branches of the cond" + (f" at {line}" if line else ""),
                    held=dots)
    b.reads[group].append(b.token(node))
    for t in slots:
        value = b.slot(t, group, n, copies=copies)
        b.pinned.add(value)
        b.reads[node].append(value)
