"""A scan loop in a cond's branch that the backward recomputes: its loop pair crosses from
the recompute case into the backward case.

Where the policy recomputes a forward case's branch values, `case_rewrite` builds a
*recompute case* on the same index that reruns the branch in the backward and returns what
the backward case's branches read. A scan loop in the branch is then a forward loop in
branch j of the recompute case whose stacks a backward loop in branch j of the backward
case reads. JAX's scan rule inside its cond rule applies the policy per iteration there,
so `rewrite` does too: each such pair gets the per-iteration rewrite of a scan pair
(`scan_rewrite.plan_pair`, `materialize_pair`, then `rewrite_pairs` for the pairs in its
backward body: a scan in the scan's body), the backward loop first reading the forward
loop's stacks directly; then each value of the recompute case's branch that the
backward branch now reads (the stacks of what an iteration keeps, the carries) crosses as
a new result of the recompute case, zeros in its other branches.

Before, the loop was rerun whole with all its stacks: under `nothing_saveable` the
backward held every iteration's residuals at once where JAX holds a carry per iteration.
A cond in a scan body is a recompute case in the backward loop's body as well, and
`in_loop_bodies` gives a scan in its branch the same rewrite (scan>cond>scan). A cond in
the branch is cloned whole into the recompute case, and the backward case of its own
pair sits in the backward case's branch: `_nested_cases` pairs the two across the outer
cases and gives the inner pair the same rewrite (cond>cond>scan, at any depth).
"""
from __future__ import annotations

from remat_passes.analysis.scan_pairs import inside
from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import ir, op_id
from remat_passes.regions import nested_saves
from remat_passes.regions.case_nested import merged_slot, rebuilt, shrunk
from remat_passes.regions.loop_edit import zeros
from remat_passes.regions.scan_rewrite import materialize_pair, plan_pair, rewrite_pairs
from remat_passes.regions.scan_segments import pairs_across


def rewrite(recompute, bwds: list, verdict, mark_clone, next_group) -> int:
    """Give every scan pair across `recompute` (a recompute case) and the backward cases
    `bwds` the policy per iteration (`verdict`: a `clone_verdicts.Inherited`, which records
    the clones' verdicts). Returns how many pairs were rewritten."""
    return _rewrite(recompute, bwds, verdict, mark_clone, next_group)[0]


def _rewrite(recompute, bwds: list, verdict, mark_clone, next_group):
    """`rewrite`; returns how many pairs were rewritten and the recompute case, rebuilt
    if it was."""
    n = 0
    stats = {"pairs": 0, "recomputed": 0, "stacked": 0}
    for j, region in enumerate(recompute.regions):
        fblock = region.blocks[0]
        for bwd in bwds:
            skipped: set = set()         # (backward loops read otherwise too: left whole)
            while True:
                ret = graph.terminator(fblock)
                crossed = {recompute.results[i]: v for i, v in enumerate(ret.operands)}
                pairs = [p for p in pairs_across(fblock, bwd.regions[j].blocks[0], crossed)
                         if op_id(p.bwd) not in skipped]
                if not pairs:
                    break
                p = pairs[0]
                with p.fwd.op.location:
                    if nested_saves.presave(p.fwd.body, verdict):
                        continue           # (the region ops of its body were rebuilt)
                    if not _join(p, recompute, fblock):
                        skipped.add(op_id(p.bwd))
                        continue
                    plan = plan_pair(p, verdict)
                    materialize_pair(plan, mark_clone, next_group, stats, verdict.record)
                    if plan.rewrites:        # (the pairs in its backward body, per iteration)
                        rewrite_pairs(p.bwd_body, verdict, mark_clone, next_group)
                n += 1
    clones = _nested_cases(recompute, bwds, verdict, mark_clone, next_group)
    if n or clones:
        _read_outside(recompute, bwds)
        recompute = _cross(recompute, bwds)
    return n + sum(clones), recompute


def _nested_cases(recompute, bwds: list, verdict, mark_clone, next_group) -> list:
    """A case cloned into branch j of `recompute` (a cond in the recomputed branch) whose
    backward cases sit in branch j of the cases of `bwds`: where a scan in one of its
    branches (at any depth of conds) pairs with a loop in a backward case's branch, the
    backward cases read the clone's results directly (`_uncross`; the outer `_cross`
    mends it) and the clone gets `rewrite`. Before, the scan ran whole in the clone and
    the backward held all of its stacks. Returns, per clone so read, how many pairs in it
    were rewritten."""
    done = []
    for j, region in enumerate(recompute.regions):
        fblock = region.blocks[0]
        crossed = _through(recompute, j, {r: r for r in recompute.results})
        found: dict = {}                 # op id of a clone -> (clone, [backward cases])
        for bwd in bwds:
            for clone, back in _case_pairs(fblock, bwd.regions[j].blocks[0], crossed):
                found.setdefault(op_id(clone), (clone, []))[1].append(back)
        for clone, backs in found.values():
            # (what branch j returns changes as each clone is rewritten: read it again)
            crossed = _through(recompute, j, {r: r for r in recompute.results})
            if not any(_has_pairs(clone, back, crossed) for back in backs):
                continue
            for back in backs:
                _uncross(recompute, j, clone, back, bwds)
            with clone.location:
                done.append(_rewrite(clone, backs, verdict, mark_clone, next_group)[0])
    return done


def _through(case, j: int, crossed: dict) -> dict:
    """`crossed` (a value read across -> the value it stands for) one case deeper: a result
    of `case` stands for what its branch j returns there."""
    ret = graph.terminator(case.regions[j].blocks[0])
    return {x: ret.operands[v.result_number] if isinstance(v, ir.OpResult) and
            op_id(v.owner) == op_id(case) else v for x, v in crossed.items()}


def _case_pairs(fblock, bblock, crossed: dict):
    """(case of `fblock`, case of `bblock` on the index `crossed` says is the first's)."""
    cases = [op.operation for op in fblock.operations if op.operation.name == graph.CASE]
    for op in bblock.operations:
        back = op.operation
        if back.name == graph.CASE:
            index = crossed.get(back.operands[0], back.operands[0])
            clone = next((c for c in cases if c.operands[0] == index), None)
            if clone is not None:
                yield clone, back


def _has_pairs(clone, back, crossed: dict) -> bool:
    """Whether a scan of a branch of `clone`, or of a case nested there, pairs with a loop
    of `back`'s branch, which reads the clone's results through `crossed`."""
    for i, region in enumerate(clone.regions):
        fblock, bblock = region.blocks[0], back.regions[i].blocks[0]
        through = _through(clone, i, crossed)
        if pairs_across(fblock, bblock, through) or any(
                _has_pairs(c, b, through) for c, b in _case_pairs(fblock, bblock, through)):
            return True
    return False


def _uncross(recompute, j: int, clone, back, bwds: list) -> None:
    """Ops of `back` (in branch j of a backward case) read the results of `clone` (in
    branch j of `recompute`) directly where they read them through `recompute`'s results;
    a result of `recompute` only backward branches other than j read now returns zeros
    from branch j, so that the clone's result has no other reader."""
    ret = graph.terminator(recompute.regions[j].blocks[0])
    redirected = set()
    for op in (op for region in back.regions for op in graph.nested_ops(region.blocks[0])):
        for number, x in enumerate(op.operands):
            if isinstance(x, ir.OpResult) and op_id(x.owner) == op_id(recompute):
                v = ret.operands[x.result_number]
                if isinstance(v, ir.OpResult) and op_id(v.owner) == op_id(clone):
                    op.operands[number] = v
                    redirected.add(x.result_number)
    in_branch = _ops_in_branches(bwds)
    for i in redirected - _twin_results(recompute):     # (a twin: the function-level plan may read it later)
        r = recompute.results[i]
        readers = _branches_reading(r, in_branch)
        if readers is not None and j not in readers:
            ret.operands[i] = zeros(r.type, ir.InsertionPoint(ret))


def in_loop_bodies(block, verdict, mark_clone, next_group) -> int:
    """Cases that a backward loop's body reruns per iteration (a cond in a scan body: the
    scan rule clones the forward case there, before the backward case on the same index)
    are recompute cases too: a scan in a branch of one gets `rewrite` (scan>cond>scan).
    Before, it ran whole and the backward loop's iteration held all of its stacks.
    Returns how many pairs were rewritten."""
    found = []
    for loop in graph.nested_ops(block):
        if loop.name != graph.WHILE:
            continue
        ops = [op.operation for op in loop.regions[1].blocks[0].operations]
        for i, clone in enumerate(ops):
            if clone.name != graph.CASE or not contract.is_recompute_clone(clone):
                continue
            bwds = [op for op in ops[i + 1:] if op.name == graph.CASE
                    and not contract.is_recompute_clone(op)
                    and op.operands[0] == clone.operands[0]]
            if bwds:
                found.append((clone, bwds))
    n = 0
    for clone, bwds in reversed(found):     # (innermost first)
        with clone.location:
            n += rewrite(clone, bwds, verdict, mark_clone, next_group)
    return n


def _join(p, recompute, fblock) -> bool:
    """Have the backward loop of pair `p` read the forward loop's stacks directly (across
    the cases, until `_cross` mends it) where it read them through results of `recompute`
    (whose branch in `fblock` then returns zeros there). False, and nothing changed: such a
    result has other readers."""
    links = {m: p.bwd.operands[m].result_number for m in p.links}
    for i in links.values():
        for use in recompute.results[i].uses:
            if op_id(use.owner.operation) != op_id(p.bwd) or use.operand_number not in links:
                return False
    ret = graph.terminator(fblock)
    for m, k in p.links.items():
        p.bwd.operands[m] = p.fwd.op.results[k]
        ret.operands[links[m]] = zeros(recompute.results[links[m]].type,
                                       ir.InsertionPoint(ret))
    return True


def _read_outside(recompute, bwds: list) -> None:
    """An op of branch j of a backward case that reads a result of `recompute` whose branch
    j returns a value from outside it (the weights of a scan in the branch, say) reads
    that value itself. Else, once the rewrite threads that value into a backward loop for
    its recomputation, the loop carries it twice, once as the case's copy (XLA of jaxlib
    0.10 and 0.11 kept both: a second weight matrix live through the backward loop)."""
    for j, region in enumerate(recompute.regions):
        yields = graph.terminator(region.blocks[0]).operands
        outside = {i: v for i, v in enumerate(yields) if not _defined_in(v, recompute)}
        if not outside:
            continue
        for bwd in bwds:
            for op in graph.nested_ops(bwd.regions[j].blocks[0]):
                for number, x in enumerate(op.operands):
                    if isinstance(x, ir.OpResult) and op_id(x.owner) == op_id(recompute) \
                            and x.result_number in outside:
                        op.operands[number] = outside[x.result_number]


def _defined_in(v, op) -> bool:
    owner = v.owner.owner if isinstance(v, ir.BlockArgument) else v.owner
    return inside(owner, op)


def _cross(recompute, bwds: list):
    """Each value of a branch of `recompute` that an op of a backward case's branch reads
    becomes a result of `recompute`: one whose value in that branch nothing reads (only
    ops of the backward cases' other branches do), else a new one, shared across branches
    as `merged_slot` shares them (zeros where a branch has nothing there); results nothing
    reads any more go (but twins, which the function-level plan may read). Returns the
    rebuilt recompute case."""
    branch_of = {}                       # op id of an op at a branch's top level -> branch
    for j, region in enumerate(recompute.regions):
        for op in region.blocks[0].operations:
            branch_of[op_id(op.operation)] = j
    reads: dict = {}                     # crossing value -> [(op, operand number)]
    for bwd in bwds:
        for region in bwd.regions:
            for op in graph.nested_ops(region.blocks[0]):
                for number, x in enumerate(op.operands):
                    if isinstance(x, ir.OpResult) and op_id(x.owner) in branch_of:
                        reads.setdefault(x, []).append((op, number))
    if not reads:
        return recompute
    n_old = len(recompute.results)
    key, twins = contract.twin_of(recompute) or (None, [])
    kept = _twin_results(recompute)     # (the function-level plan may read them later)
    in_branch = _ops_in_branches(bwds)
    readers = [_branches_reading(r, in_branch) if i not in kept else None
               for i, r in enumerate(recompute.results)]
    types = [r.type for r in recompute.results]
    fills = [dict() for _ in recompute.regions]   # per branch: {result: value}
    place = {}                                    # crossing value -> result
    for v in reads:
        j = branch_of[op_id(v.owner)]
        place[v] = merged_slot(types, set(fills[j]), v.type, lambda i: i >= n_old or (
            bool(readers[i]) and j not in readers[i]))
        fills[j][place[v]] = v

    def yields_of(j, before, ip):
        return [fills[j][i] if i in fills[j] else before[i] if i < n_old else zeros(t, ip)
                for i, t in enumerate(types)]
    new = rebuilt(recompute, types, yields_of, ir.InsertionPoint(recompute))
    for i in range(n_old):
        recompute.results[i].replace_all_uses_with(new.results[i])
    for v, i in place.items():
        for op, number in reads[v]:
            op.operands[number] = new.results[i]
    recompute.erase()
    keep = [i for i, r in enumerate(new.results)       # (less what nothing reads now)
            if next(iter(r.uses), None) is not None or i in kept]
    if len(keep) < len(types):
        new = shrunk(new, keep)
        contract.set_twin(new, key, [(k, keep.index(t)) for k, t in twins])
    return new


def _twin_results(case) -> set:
    """The results of recompute case `case` that are twins of primal outputs."""
    return {r for _, r in (contract.twin_of(case) or (None, []))[1]}


def _ops_in_branches(bwds: list) -> list:
    """Per branch j: the op ids nested in branch j of the cases `bwds`."""
    out: list = []
    for bwd in bwds:
        for j, region in enumerate(bwd.regions):
            if j == len(out):
                out.append(set())
            out[j].update(op_id(op) for op in graph.nested_ops(region.blocks[0]))
    return out


def _branches_reading(result, in_branch: list):
    """The branches of the backward cases whose ops read `result` (None: an op outside
    them reads it too)."""
    out = set()
    for use in result.uses:
        j = next((j for j, ids in enumerate(in_branch) if op_id(use.owner.operation) in ids),
                 None)
        if j is None:
            return None
        out.add(j)
    return out
