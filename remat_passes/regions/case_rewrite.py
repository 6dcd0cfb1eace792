"""Per-branch remat through `stablehlo.case` pairs (`lax.cond`, `lax.switch`): decide, rewrite.

JAX exports a cond under a VJP as two `stablehlo.case` ops on the same index:

* a *forward* case whose branches return the primal outputs, then residuals:
  each branch its own, zeros in the slots another branch fills (JAX merges
  slots of the same type across branches);
* a *backward* case, later in the block, whose branches read those results
  (captured from the enclosing block: case branches have no arguments).

Between the two, the policy applies per branch, as JAX's cond partial-eval rule
applies it to each branch. For each read of a forward result in backward branch
j, the value forward branch j returns there is:

* defined outside the forward case (an argument, a value computed before it):
  the backward branch reads it directly; it becomes a residual of the function,
  decided by the function-level plan (JAX saves a cond's operands);
* computed inside the branch and saved by the policy (or side-effecting): it
  stays a result of the forward case;
* otherwise recomputed in the backward branch just before its first use, from
  values outside the case, constants, and values the policy saves; a saved value
  the recomputation needs becomes a result of the forward case, in a slot of its
  type the branch no longer uses, else a new slot that the other branches fill
  with zeros.

The backward can also need a forward case's results outside any backward case:
a primal output the derivative of a later op reads (directly, or through a
forward op the policy recomputes), or every read when the cond sits in a
`custom_jvp` rule's primal computation. As JAX's staged cond recomputes its
outputs, a *recompute case* on the same index, placed where the backward
starts and marked as recomputation, computes them per branch the same way
(a result every branch saves is read from the forward case instead). Direct
reads are redirected to it; for a primal output it is the output's *twin*
(`contract.TWIN`): the function-level plan reads the twin wherever the backward
would otherwise have to save the output, and a twin nothing reads is swept
away with the dead code.

Results nothing reads any more leave the forward case, and the ops that only
computed them go too. `plan_case` decides all of this without touching the IR;
`materialize_case` rewrites.
"""
from __future__ import annotations

import dataclasses

from remat_passes.analysis.scan_pairs import inside, saved_results
from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import ir, op_id
from remat_passes.ir.verdicts import Offloadable, Recompute
from remat_passes.regions import case_crossing, nested_saves
from remat_passes.regions.clone_verdicts import Inherited, inherit, moved
from remat_passes.regions.case_nested import merged_slot, rebuilt, shrunk
from remat_passes.regions.loop_edit import zeros

CASE = graph.CASE


# ------------------------------------------------------------------ finding --
@dataclasses.dataclass
class CasePair:
    fwd: object                 # the forward case op
    bwds: list                  # backward case ops on the same index that read its results
    reads: dict                 # (bwd number, branch) -> {result k: [(user op, operand no.)]}
    direct: dict                # result k -> [(user op, operand no.)]: read by a backward
                                # op outside those cases
    backward_start: object      # the first backward op after the forward case
    outside: set                # results read by forward ops (primal outputs, say)


def _region_map(case) -> dict:
    """op_id of every op nested in `case` -> the number of the region holding it."""
    out = {}
    for j, region in enumerate(case.regions):
        for block in region.blocks:
            for op in block.operations:
                def visit(inner, j=j):
                    out[op_id(inner)] = j
                    return ir.WalkResult.ADVANCE
                op.operation.walk(visit)
    return out


def find_case_pairs(block, is_backward) -> list[CasePair]:
    """Forward cases of `block` whose results the backward reads, with how it reads them.
    `is_backward(op)`: for the top-level ops of the block."""
    ops = [op.operation for op in block.operations]
    cases = [op for op in ops if op.name == CASE]
    if not cases:
        return []
    position = {op_id(op): i for i, op in enumerate(ops)}
    on_index: dict = {}        # index operand -> the backward cases on it, in order
    for op in cases:
        if is_backward(op):
            on_index.setdefault(op.operands[0], []).append(op)
    backward_after = graph.backward_starts(ops, is_backward)
    pairs = []
    taken = set()
    for fwd in cases:
        if op_id(fwd) in taken or is_backward(fwd):
            continue
        here = position[op_id(fwd)]
        later = [b for b in on_index.get(fwd.operands[0], ()) if position[op_id(b)] > here]
        regions = [_region_map(b) for b in later]
        reads: dict = {}
        direct: dict = {}
        outside = set()
        for k, r in enumerate(fwd.results):
            for use in r.uses:
                user = use.owner.operation
                uid = op_id(user)
                for b, rmap in enumerate(regions):
                    j = rmap.get(uid)
                    if j is not None:
                        reads.setdefault((b, j), {}).setdefault(k, []).append(
                            (user, use.operand_number))
                        break
                else:
                    top = graph.top_level(user, block.owner)
                    if top.name != "func.return" and is_backward(top):
                        direct.setdefault(k, []).append((user, use.operand_number))
                    else:
                        outside.add(k)
        if reads or direct or outside:
            start = backward_after[here]
            if start is None:       # nothing of the backward follows: nothing to decide
                continue
            used = sorted({b for b, _ in reads})
            bwds = [later[b] for b in used]
            renumber = {b: i for i, b in enumerate(used)}
            reads = {(renumber[b], j): v for (b, j), v in reads.items()}
            pairs.append(CasePair(fwd, bwds, reads, direct, start, outside))
            taken.update(op_id(b) for b in bwds)
    return pairs


# ----------------------------------------------------------------- the plan --
@dataclasses.dataclass(frozen=True)
class Slot:
    """The forward case's result in slot `index` of the new layout."""
    index: int


@dataclasses.dataclass(frozen=True)
class BranchMade:
    """Result `result` of clone `item` of a branch of the recompute case."""
    item: int
    result: int = 0


@dataclasses.dataclass(frozen=True)
class Recomputed:
    """Result `index` of the recompute case."""
    index: int


@dataclasses.dataclass
class BranchClone:
    op: object                  # the forward branch op to clone
    sources: dict               # value it reads -> source (an outer value, Slot or BranchMade)
    saved: dict = None          # a nested region op: saved result k -> its source (a Slot)


@dataclasses.dataclass
class CasePlan:
    pair: CasePair
    layout: list                # new forward results: old result number, or a type
    yields: list                # per forward branch: {new slot: value it returns there}
    clones: list                # per branch of the recompute case: [BranchClone] in order
    r_types: list               # the recompute case's result types
    r_yields: list              # per branch: {recompute result: source}
    twins_f: list               # (k, s): primal result k (numbered in the new layout)
                                # is saved in slot s as well
    twins_r: list               # (k, i): the recompute case's result i computes it
    replace: list               # (user op, operand number, source) for backward reads
    offloads: list              # (forward value, Offloadable) of saved values
    recomputed: int = 0         # backward reads served by recomputation

    @property
    def rewrites(self) -> bool:
        return bool(self.r_types) or \
            any(not isinstance(s, Slot) for _, _, s in self.replace) or \
            len(self.layout) != len(self.pair.fwd.results) or \
            any(self.layout[i] != i for i in range(len(self.layout)))


class _BranchPlanner:
    """Decides branch `j`: where each forward value the backward reads comes from (a
    forward case slot, a value outside the case, or a clone in the recompute case)."""

    def __init__(self, plan: "_PairPlanner", j: int):
        self.pp = plan
        self.j = j
        self.yields = list(graph.terminator(plan.pair.fwd.regions[j].blocks[0]).operands)
        self.clones: list = []
        self.memo: dict = {}        # forward value -> source
        self.cloned: dict = {}      # op_id of a forward op -> its clone's item number

    def in_branch(self, v) -> bool:
        return isinstance(v, ir.OpResult) and op_id(v.owner) in self.pp.fops[self.j]

    def source(self, root):
        """The source of forward value `root` (the operands of a clone are decided before
        it)."""
        return graph.post_order(root, self.memo, self._source_step)

    def _source_step(self, v):
        if not self.in_branch(v):
            self.memo[v] = v
            return None
        op = v.owner.operation
        if not self.recomputes(v):
            self.memo[v] = self.pp.slot_for(self.j, v)
            self.pp.mark_offload(v)
            return None
        reads = graph.read_values(op)
        saved = saved_results(op, self.pp.verdict)    # (what its regions save, read back)
        pending = [u for u in reads + saved if u not in self.memo]
        if pending:
            return pending
        key = op_id(op)
        if key not in self.cloned:      # one clone per op (it may have many results)
            self.clones.append(BranchClone(op, {u: self.memo[u] for u in reads},
                                     {u.result_number: self.memo[u] for u in saved}))
            self.cloned[key] = len(self.clones) - 1
        self.memo[v] = BranchMade(self.cloned[key], v.result_number)
        return None

    def recomputes(self, v) -> bool:
        op = v.owner.operation
        if graph.is_side_effecting(op):
            return False
        if self.pp.free(v, self.j):
            return True
        return self.pp.verdict(v) is Recompute


class _PairPlanner:
    def __init__(self, pair: CasePair, verdict):
        self.pair = pair
        self.verdict = verdict
        fwd = pair.fwd
        self.fops = [{op_id(op.operation) for op in r.blocks[0].operations}
                     for r in fwd.regions]
        # new layout: the primal results the forward reads first, in order; residual
        # slots are assigned per branch as the plan needs them
        self.assigned: list = [dict() for _ in fwd.regions]   # branch -> {value: slot}
        self.slot_types: list = []          # per new slot: type
        self.slot_origin: list = []         # per new slot: old result number (a primal
                                            # output, kept) or None (a residual slot)
        self.old_slot: dict = {}            # old result number -> new slot
        for k in sorted(pair.outside):
            self._new_slot(fwd.results[k].type, k)
        self._free: dict = {}
        self.offloads: list = []

    def _new_slot(self, t, origin=None) -> int:
        self.slot_types.append(t)
        self.slot_origin.append(origin)
        if origin is not None:
            self.old_slot[origin] = len(self.slot_types) - 1
        return len(self.slot_types) - 1

    def slot_for(self, j: int, v) -> Slot:
        """The residual slot forward branch j returns `v` in: one of its type that branch j
        does not use yet (slots are shared across branches, as JAX merges them), else a new
        one. A primal output gets a residual slot too, as in JAX: the forward can drop the
        output while the slot holds what the backward of this branch reads."""
        mine = self.assigned[j]
        if v in mine:
            return Slot(mine[v])
        mine[v] = merged_slot(self.slot_types, set(mine.values()), v.type,
                               lambda s: self.slot_origin[s] is None)
        if mine[v] == len(self.slot_origin):
            self.slot_origin.append(None)
        return Slot(mine[v])

    def mark_offload(self, v) -> None:
        verdict = self.verdict(v)
        if isinstance(verdict, Offloadable):
            self.offloads.append((v, verdict))

    def free(self, root, j) -> bool:
        """Computed inside branch j from constants alone (cloned rather than saved)."""
        def step(v):
            if not (isinstance(v, ir.OpResult) and op_id(v.owner) in self.fops[j]):
                self._free[v] = False
                return None
            op = v.owner.operation
            reads = graph.read_values(op)
            pending = [u for u in reads if u not in self._free]
            if not pending:
                self._free[v] = not graph.is_side_effecting(op) and all(
                    self._free[u] for u in reads)
            return pending
        return graph.post_order(root, self._free, step)

    def plan(self) -> CasePlan:
        pair = self.pair
        nb = len(pair.fwd.regions)
        branches = [_BranchPlanner(self, j) for j in range(nb)]
        r_types: list = []
        r_yields: list = [dict() for _ in range(nb)]
        replace: list = []
        # reads inside backward branches: a recomputed value is a result of the recompute
        # case, in a slot of its type shared across branches (zeros where unused)
        taken = [dict() for _ in range(nb)]             # branch -> {source: result}
        for (b, j), reads in sorted(pair.reads.items(), key=lambda t: t[0]):
            bp = branches[j]
            for k, uses in reads.items():
                src = bp.source(bp.yields[k])
                if isinstance(src, BranchMade):
                    if src not in taken[j]:
                        taken[j][src] = merged_slot(
                            r_types, set(taken[j].values()), pair.fwd.results[k].type,
                            lambda s: True)
                        r_yields[j][taken[j][src]] = src
                    src = Recomputed(taken[j][src])
                for user, number in uses:
                    replace.append((user, number, src))
        # results the backward needs outside backward cases (primal outputs its plan may
        # read, direct reads): one recompute result each, unless every branch saves it in
        # the same slot (decided after the reads above, so that a slot allocated here for
        # a twin nobody reads can go again: see `tidy`)
        twins_f, twins_r = [], []
        for k in sorted(set(pair.direct) | pair.outside):
            srcs = [bp.source(bp.yields[k]) for bp in branches]
            if len(set(srcs)) == 1 and isinstance(srcs[0], Slot):   # saved in one slot
                if k in pair.outside:
                    twins_f.append((self.old_slot[k], srcs[0].index))
                for user, number in pair.direct.get(k, ()):
                    replace.append((user, number, srcs[0]))
                continue
            if k in pair.outside:
                twins_r.append((self.old_slot[k], len(r_types)))
            r_types.append(pair.fwd.results[k].type)
            for j, src in enumerate(srcs):
                r_yields[j][len(r_types) - 1] = src
            for user, number in pair.direct.get(k, ()):
                replace.append((user, number, Recomputed(len(r_types) - 1)))
        yields = [{s: v for v, s in mine.items()} for mine in self.assigned]
        layout = [self.slot_origin[s] if self.slot_origin[s] is not None else
                  self.slot_types[s] for s in range(len(self.slot_types))]
        recomputed = sum(1 for _, _, s in replace if isinstance(s, Recomputed))
        return CasePlan(pair, layout, yields, [bp.clones for bp in branches], r_types,
                        r_yields, twins_f, twins_r, replace, self.offloads, recomputed)


def plan_case(pair: CasePair, verdict) -> CasePlan:
    return _PairPlanner(pair, verdict).plan()


# -------------------------------------------------------------- rewriting --
def materialize_case(plan: CasePlan, verdict, mark_clone, next_group, key: int):
    """Apply a CasePlan: rebuild the forward case with the new result layout, build the
    recompute case (`key` links the two), and redirect the backward's reads. Returns the
    recompute case (None: none needed) and the verdicts its clones' nested ops inherit
    (`_build`)."""
    pair = plan.pair
    old = pair.fwd
    loc = old.location
    for v, placement in plan.offloads:
        contract.set_offload(v.owner, placement)
    types = [old.results[x].type if isinstance(x, int) else x for x in plan.layout]

    def forward_yields(j, before, ip):
        values = []
        for s, x in enumerate(plan.layout):
            v = plan.yields[j].get(s)
            if v is None and isinstance(x, int) and x in pair.outside:
                v = before[x]                           # a primal output: unchanged
            values.append(v if v is not None else zeros(types[s], ip, loc))
        return values
    new = rebuilt(old, types, forward_yields, ir.InsertionPoint(old))
    contract.set_case_key(new, key)
    contract.set_twin(new, key, plan.twins_f)
    for s, x in enumerate(plan.layout):
        if isinstance(x, int) and x in pair.outside:
            for use in list(old.results[x].uses):
                user = use.owner.operation
                if not any(inside(user, b) for b in pair.bwds):
                    user.operands[use.operand_number] = new.results[s]
    recompute, inherited = None, {}
    if plan.r_types:
        next_group()
        recompute = ir.Operation.create(CASE, results=plan.r_types,
                                        operands=[new.operands[0]], regions=len(old.regions),
                                        loc=loc, ip=ir.InsertionPoint(_r_position(plan)))
        mark_clone(recompute)
        contract.set_twin(recompute, key, plan.twins_r)
        for j, clones in enumerate(plan.clones):
            block = recompute.regions[j].blocks.append()
            value_of = _build(clones, new, ir.InsertionPoint(block), mark_clone,
                              lambda o, c: inherited.update(inherit(o, c, verdict)),
                              lambda old, new: moved(inherited, old, new))
            values = [value_of(plan.r_yields[j][n]) if n in plan.r_yields[j] else None
                      for n in range(len(plan.r_types))]
            ip = ir.InsertionPoint(block)
            values = [v if v is not None else zeros(plan.r_types[n], ip, loc)
                      for n, v in enumerate(values)]
            ir.Operation.create("stablehlo.return", operands=values, loc=loc, ip=ip)
    for user, number, src in plan.replace:
        if isinstance(src, Slot):
            user.operands[number] = new.results[src.index]
        elif isinstance(src, Recomputed):
            user.operands[number] = recompute.results[src.index]
        else:
            user.operands[number] = src
    old.erase()
    for case in (new, recompute):
        if case is not None:
            for region in case.regions:
                graph.erase_unused_in_block(region.blocks[0])
    return recompute, inherited


def _r_position(plan: CasePlan):
    """Where the recompute case goes: where the backward starts if the function-level plan
    may read its twins, else right before the first backward case reading it."""
    if plan.twins_r:
        return plan.pair.backward_start
    return plan.pair.bwds[0]


def _build(clones: list, fwd_case, ip, mark_clone, cloned, replaced):
    """Insert `clones` at `ip` (`cloned(original, clone)` for each op with regions,
    `replaced(old op id, new op)` for each op nested in one that is rebuilt to read back
    what it saved); returns the function giving a source's value."""
    built = []

    def value_of(src):
        if isinstance(src, Slot):
            return fwd_case.results[src.index]
        if isinstance(src, BranchMade):
            return built[src.item].results[src.result]
        return src
    for item in clones:
        clone = item.op.clone(ip=ip)
        if len(clone.regions):
            cloned(item.op, clone)
        for u, src in item.sources.items():
            v = value_of(src)
            if v != u:
                graph.replace_reads(clone, u, v)
        if item.saved:
            clone = nested_saves.reuse(clone, {k: value_of(src)
                                               for k, src in item.saved.items()}, replaced)
        mark_clone(clone)
        built.append(clone)
    return value_of


def twins(analysis) -> dict:
    """{vid of a forward case's primal result: vid of a result equal to it (a residual
    slot of the same case, or a result of its recompute case)}."""
    by_key = {}
    holders = []
    for pos, op in enumerate(analysis.ops):
        if op.name != CASE:
            continue
        k = contract.case_key(op)
        if k is not None:
            by_key[k] = pos
        t = contract.twin_of(op)
        if t is not None:
            holders.append((pos, t))
    out = {}
    for pos, (key, pairs) in holders:
        fpos = by_key.get(key)
        if fpos is None:
            continue
        fbase, base = analysis.result_base[fpos], analysis.result_base[pos]
        for k, r in pairs:
            out[fbase + k] = base + r
    return out


def tidy(analysis, twins_read: set) -> bool:
    """After the function-level plan: drop the results of rewritten cases that nothing
    reads and the plan does not read as twins (a primal output the backward turned out
    not to need: its twin and the residual slots only it needed), then move a recompute
    case with no twins left right before its first user. Returns whether the IR
    changed (then the function is planned again)."""
    a = analysis
    block = graph.body_block(a.func_op)
    changed = False
    renumbered: dict = {}            # op_id of a rebuilt case -> {old result: new result}
    cases = [op for op in a.ops if op.name == CASE and (
        contract.case_key(op) is not None or contract.twin_of(op) is not None)]
    for op in reversed(cases):       # the recompute case first: it reads the forward one
        base = a.result_base[a.position[op_id(op)]]
        own_twins = contract.twin_of(op) if contract.case_key(op) is not None else None
        kept_primals = {k for k, _ in own_twins[1]} if own_twins else set()
        keep = [i for i, r in enumerate(op.results)
                if next(iter(r.uses), None) is not None or base + i in twins_read
                or i in kept_primals]
        if len(keep) == len(op.results):
            continue
        changed = True
        new = shrunk(op, keep)
        if new is None:
            continue
        renumbered[op_id(new)] = {old: n for n, old in enumerate(keep)}
    if not changed:
        return False
    # twin pairs follow the new numbering (a pair whose result went is dropped)
    keys = {}
    for op in block.operations:
        op = op.operation
        if op.name == CASE and contract.case_key(op) is not None:
            keys[contract.case_key(op)] = renumbered.get(op_id(op))
    for op in block.operations:
        op = op.operation
        t = contract.twin_of(op) if op.name == CASE else None
        if t is None:
            continue
        key, pairs = t
        fmap, rmap = keys.get(key), renumbered.get(op_id(op))
        fmap = fmap if fmap is not None else {k: k for k, _ in pairs}
        rmap = rmap if rmap is not None else {r: r for _, r in pairs}
        contract.set_twin(op, key, [(fmap[k], rmap[r]) for k, r in pairs
                                    if k in fmap and r in rmap])
    _move_recompute_cases(block)
    return True


def _move_recompute_cases(block) -> None:
    """A recompute case without twins goes right before its first user in `block`."""
    ops = [op.operation for op in block.operations]
    position = {op_id(op): i for i, op in enumerate(ops)}
    for i, op in enumerate(ops):
        if op.name != CASE or not contract.is_recompute_clone(op) or \
                contract.twin_of(op) is not None:
            continue
        users = (position.get(op_id(graph.top_level(use.owner.operation, block.owner)), -1)
                 for r in op.results for use in r.uses)
        first = min((u for u in users if u > i), default=None)
        if first is not None and first != i + 1:
            op.move_before(ops[first])


def rewrite_cases(block, verdict, mark_clone, next_group, is_backward) -> dict:
    """Apply the per-branch policy to every forward case of `block` the backward reads.
    Returns stats."""
    stats = {"pairs": 0, "recomputed": 0}
    for key, pair in enumerate(find_case_pairs(block, is_backward)):
        for region in pair.fwd.regions:     # region ops in its branches: what they save
            with pair.fwd.location:
                nested_saves.presave(region.blocks[0], verdict)
        with pair.fwd.location:
            plan = plan_case(pair, verdict)
            stats["pairs"] += 1
            stats["recomputed"] += plan.recomputed
            if plan.rewrites or plan.offloads:
                recompute, inherited = materialize_case(plan, verdict, mark_clone,
                                                        next_group, key)
                if recompute is not None:     # (its scans get the policy per iteration)
                    case_crossing.rewrite(recompute, pair.bwds,
                                          Inherited(verdict, inherited),
                                          mark_clone, next_group)
    return stats
