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
`in_loop_bodies` gives a scan in its branch the same rewrite (scan>cond>scan). A scan in a
cond in a cond's branch (cond>cond>scan) is still rerun whole: its pair would have to
cross two levels of recompute case.
"""
from __future__ import annotations

from remat_passes.analysis.scan_pairs import inside
from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import ir, op_id
from remat_passes.regions import nested_saves
from remat_passes.regions.case_nested import rebuilt
from remat_passes.regions.loop_edit import zeros
from remat_passes.regions.scan_rewrite import materialize_pair, plan_pair, rewrite_pairs
from remat_passes.regions.scan_segments import pairs_across


def rewrite(recompute, bwds: list, verdict, mark_clone, next_group) -> int:
    """Give every scan pair across `recompute` (a recompute case) and the backward cases
    `bwds` the policy per iteration (`verdict`: a `clone_verdicts.Inherited`, which records
    the clones' verdicts). Returns how many pairs were rewritten."""
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
    if n:
        _read_outside(recompute, bwds)
        _cross(recompute, bwds)
    return n


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
    becomes a new result of `recompute` (zeros from the other branches). Returns the
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
    values = list(reads)
    n_old = len(recompute.results)
    types = [r.type for r in recompute.results] + [v.type for v in values]

    def yields_of(j, before, ip):
        return before + [v if branch_of[op_id(v.owner)] == j else zeros(v.type, ip)
                         for v in values]
    new = rebuilt(recompute, types, yields_of, ir.InsertionPoint(recompute))
    for i in range(n_old):
        recompute.results[i].replace_all_uses_with(new.results[i])
    for n, v in enumerate(values):
        for op, number in reads[v]:
            op.operands[number] = new.results[n_old + n]
    recompute.erase()
    return new
