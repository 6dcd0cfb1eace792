"""Per-body remat through `sdy.manual_computation` pairs (shard_map): decide, rewrite.

JAX exports a shard_map under a VJP as two manual computations: a *forward* one
returning the primal outputs, then residuals, and a *backward* one, later in
the block, taking those residuals as operands (a manual computation reads
nothing from above). Between the two the policy applies to the forward body's
ops, as JAX's shard_map partial-eval rule applies it to `jax.checkpoint` around a
shard_map. For each residual the backward reads, the value the forward body
returns there is:

* an argument of the body: the backward reads the forward computation's operand
  (when the two shardings agree), a residual of the function decided by the
  function-level plan, as JAX saves a shard_map's operands;
* saved by the policy (or side-effecting): it stays a result of the forward
  computation;
* otherwise recomputed by a *recompute manual computation*, placed right before
  the backward one and marked as recomputation (the function-level plan routes
  its operands through the barrier, as JAX's lowering does). It takes the
  forward computation's operands it needs and the values the policy saves, and
  clones the body ops in between, collectives included: every device runs them
  again in lockstep.

A saved value the recomputation needs that the forward did not return becomes a
new result of the forward computation, sharded on its first dimension over the
manual axes it varies over (`varying_axes`; a scalar is reshaped to one element
first), the layout JAX gives shard_map residuals. Results nothing reads any more
go, and so do the body ops only they needed. `plan_pair` decides without
touching the IR; `materialize_pair` rewrites.

A scan loop in the forward body (a scanned model inside the shard_map) that the recompute
computation clones first stacks the body values the policy saves that its recomputation
needs, and a case there (a `lax.cond` inside the shard_map) first returns the branch
values the policy saves (`nested_saves.presave`, done by the rule before planning, as
JAX's scan and cond rules inside the shard_map rule keep them); those results are kept as
residuals, and the clone reads them back instead of computing them
(`nested_saves.reuse`).

The backward can also read a forward result directly: a primal output the
derivative of a later op needs (`o * o`). It is served the same way, by the
forward computation, its operand or the recompute computation (which then runs
the body's collectives that compute it, as JAX's staged shard_map does).
"""
from __future__ import annotations

import dataclasses

from remat_passes.analysis.scan_pairs import saved_results
from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import ir, op_id
from remat_passes.ir.verdicts import Offloadable, Recompute
from remat_passes.sharding.sdy import (manual_axes, mesh_of, per_value_attr, residual_layout,
                                       shardings, varying_axes)

MC = graph.MANUAL_COMPUTATION


# ------------------------------------------------------------------ finding --
@dataclasses.dataclass
class ShardMapPair:
    fwd: object                 # the forward manual computation
    readers: list               # top-level backward ops reading its results, in order
    reads: dict                 # result k -> [(backward op, operand number)]
    outside: set                # results read by forward ops or returned (primal outputs)
    backward_start: object      # the first backward op after the forward computation


def find_pairs(block, is_backward) -> list[ShardMapPair]:
    """Forward manual computations of `block` whose results the backward reads (usually
    as operands of a backward manual computation; a primal output the derivative of a
    later op reads is read directly)."""
    pairs = []
    ops = [op.operation for op in block.operations]
    position = {op_id(op): i for i, op in enumerate(ops)}
    backward_after = graph.backward_starts(ops, is_backward)
    for op in ops:
        if op.name != MC or is_backward(op) or body_side_effect(op) or mesh_of(op) is None \
                or lays_out_only(op):
            continue
        reads: dict = {}
        outside: set = set()
        readers: dict = {}
        for k, r in enumerate(op.results):
            for use in r.uses:
                user = use.owner.operation
                top = graph.top_level(user, block.owner)
                if top.name == "func.return" or not is_backward(top):
                    outside.add(k)
                else:
                    reads.setdefault(k, []).append((user, use.operand_number))
                    readers[op_id(top)] = top
        if reads:
            order = sorted(readers.values(), key=lambda b: position[op_id(b)])
            start = backward_after[position[op_id(op)]]
            pairs.append(ShardMapPair(op, order, reads, outside, start))
    return pairs


def lays_out_only(op) -> bool:
    """Does manual computation `op` compute nothing from its operands: return them as they
    are, beside values built from constants alone (JAX's copy of a replicated value on each
    device, hoisted out of a loop; under jax 0.10 with a broadcast constant beside it)? Then
    it is an op like any other to the function-level plan, which recomputes it for free
    (kept per pair, it was a residual: a copy of the value per device)."""
    block = op.regions[0].blocks[0]
    from_constants = set()           # (ops whose operands are all built from constants)
    for inner in list(block.operations)[:-1]:
        inner = inner.operation
        if len(inner.regions) or graph.is_side_effecting(inner) or not all(
                isinstance(x, ir.OpResult) and op_id(x.owner) in from_constants
                for x in inner.operands):
            return False
        from_constants.add(op_id(inner))
    return True


def reached_indirectly(block, is_backward) -> int:
    """How many forward manual computations of `block` (a mesh, no side effect, operands)
    the backward reads only through other forward ops (the stacks of a fully unrolled
    scan: JAX concatenates each layer's residuals and the backward slices them; a loop
    they feed): `find_pairs` does not take them, so they stay atomic."""
    ops = [op.operation for op in block.operations]
    position = {op_id(op): i for i, op in enumerate(ops)}
    feeds = [False] * len(ops)       # (a result read by the backward, or by a forward op
    direct = [False] * len(ops)      # whose results are; one sweep from the end)
    for i in range(len(ops) - 1, -1, -1):
        for r in ops[i].results:
            for use in r.uses:
                top = graph.top_level(use.owner.operation, block.owner)
                j = position.get(op_id(top))
                if top.name == "func.return" or j is None:
                    continue
                direct[i] = direct[i] or is_backward(top)
                feeds[i] = feeds[i] or is_backward(top) or feeds[j]
    return sum(1 for i, op in enumerate(ops)     # (one without operands is a constant)
               if op.name == MC and feeds[i] and not direct[i] and len(op.operands)
               and not is_backward(op) and not body_side_effect(op)
               and mesh_of(op) is not None and not lays_out_only(op))


def body_side_effect(op) -> bool:
    """Must `op` (in a manual computation's body, or the computation itself) never be
    duplicated? Collectives may: every device runs the body in lockstep."""
    if op.name in graph.COLLECTIVE_OPS:
        return False
    return graph.is_side_effecting(op)


# ----------------------------------------------------------------- the plan --
@dataclasses.dataclass(frozen=True)
class Outer:
    """The forward computation's operand `index` (the body's argument `index`)."""
    index: int


@dataclasses.dataclass(frozen=True)
class Kept:
    """A body value the forward computation returns as a residual."""
    value: object


@dataclasses.dataclass(frozen=True)
class Made:
    """The recompute computation's clone of body value `value`."""
    value: object


@dataclasses.dataclass(frozen=True)
class FromRecompute:
    """The recompute computation's result for the forward's old result `k`."""
    k: int


@dataclasses.dataclass
class ShardMapPairPlan:
    pair: ShardMapPair
    primal: list                # old result numbers the forward still returns first
    kept: list                  # body values returned after them, as residuals
    kept_from: dict             # kept body value -> old result number returning it
                                # (its sharding and global type), if any
    clones: list                # body ops the recompute computation clones, in order
    r_results: list             # old result numbers the recompute computation returns
    r_sources: dict             # old result number -> Made / Outer it returns
    replace: list               # (backward op, operand number, source of old result k)
    offloads: list              # (body value, Offloadable) of saved values
    twins: list                 # (n, k): the forward's primal result n (old result k) is
                                # computed by the recompute computation too
    verdict: object = None      # the policy's verdict it was planned with
    recomputed: int = 0         # backward reads served by recomputation

    @property
    def rewrites(self) -> bool:
        return bool(self.clones or self.r_results) or any(
            not isinstance(s, Kept) for _, _, s in self.replace) or \
            len(self.primal) + len(self.kept) != len(self.pair.fwd.results)


class ShardMapPairPlanner:
    def __init__(self, pair: ShardMapPair, verdict):
        self.pair = pair
        self.verdict = verdict
        fwd = pair.fwd
        self.body = fwd.regions[0].blocks[0]
        self.args = {a: j for j, a in enumerate(self.body.arguments)}
        self.yields = list(graph.terminator(self.body).operands)
        self.memo: dict = {}
        self.free: dict = {}
        self.kept: dict = {}            # body value -> None (ordered set)
        self.cloned: dict = {}          # op_id -> op
        self.offloads: list = []

    def decide(self, v) -> str:
        """'save' or 'recompute' for a value computed by a body op."""
        op = v.owner.operation
        if body_side_effect(op):
            return "save"
        if self._free(v):
            return "recompute"
        verdict = self.verdict(v)
        return "recompute" if verdict is Recompute else "save"

    def source(self, root):
        return graph.post_order(root, self.memo, self._step)

    def _step(self, v):
        if v in self.args:
            self.memo[v] = Outer(self.args[v])
            return None
        if self.decide(v) == "save":
            self.memo[v] = Kept(v)
            if v not in self.kept:
                self.kept[v] = None
                verdict = self.verdict(v) if not body_side_effect(v.owner.operation) else None
                if isinstance(verdict, Offloadable):
                    self.offloads.append((v, verdict))
            return None
        op = v.owner.operation
        reads = graph.read_values(op) + saved_results(op, self.verdict)
        pending = [u for u in reads if u not in self.memo]
        if pending:
            return pending
        self.cloned[op_id(op)] = op
        self.memo[v] = Made(v)
        return None

    def _free(self, root) -> bool:
        """Computed in the body from constants alone (cloned rather than saved)."""
        def step(v):
            if v in self.args or not isinstance(v, ir.OpResult):
                self.free[v] = False
                return None
            op = v.owner.operation
            reads = graph.read_values(op)
            pending = [u for u in reads if u not in self.free]
            if not pending:
                self.free[v] = not body_side_effect(op) and \
                    op.name not in graph.COLLECTIVE_OPS and all(self.free[u] for u in reads)
            return pending
        return graph.post_order(root, self.free, step)

    def plan(self) -> ShardMapPairPlan:
        pair = self.pair
        fwd = pair.fwd
        ins, outs = shardings(fwd, "in_shardings"), shardings(fwd, "out_shardings")
        replace, r_sources = [], {}
        for k in sorted(pair.reads):
            src = self.source(self.yields[k])
            if isinstance(src, Outer) and (str(ins[src.index]) != str(outs[k]) or
                                           fwd.operands[src.index].type != fwd.results[k].type):
                r_sources[k] = src          # a different layout: passed through
            elif isinstance(src, Made):
                r_sources[k] = src
            for user, number in pair.reads[k]:
                replace.append((user, number, FromRecompute(k) if k in r_sources else src))
        # primal outputs the policy recomputes: the recompute computation computes them
        # too (their twins), for the function-level plan to read wherever the backward
        # needs one (through a forward op it recomputes, say) instead of saving it
        primal = sorted(pair.outside)
        twins = []
        for n, k in enumerate(primal):
            y = self.yields[k]
            if y in self.args or (y not in self.memo and self.decide(y) == "save"):
                continue    # (saved: the output itself, not a second copy as a residual)
            if isinstance(self.source(y), Made):
                r_sources[k] = self.memo[self.yields[k]]
                twins.append((n, k))
        # a body value returned by an old result keeps that result's layout
        kept_from = {}
        for k, y in enumerate(self.yields):
            if y in self.kept and y not in kept_from:
                kept_from[y] = k
        order = {op_id(op.operation): i for i, op in enumerate(self.body.operations)}
        clones = sorted(self.cloned.values(), key=lambda op: order[op_id(op)])
        recomputed = sum(1 for _, _, s in replace if isinstance(s, FromRecompute))
        return ShardMapPairPlan(pair, primal, list(self.kept), kept_from, clones,
                                sorted(r_sources), r_sources, replace, self.offloads, twins,
                                self.verdict, recomputed)


def plan_pair(pair: ShardMapPair, verdict) -> ShardMapPairPlan:
    """Decide the pair (`verdict(body value)`: the policy's verdict)."""
    return ShardMapPairPlanner(pair, verdict).plan()


# -------------------------------------------------------------- rewriting --
def new_manual(like, operands, result_types, ins, outs, ip, loc):
    """A manual computation with `like`'s attributes but the given shardings (regions
    are filled by the caller)."""
    attrs = graph.attributes(like)
    attrs["in_shardings"] = per_value_attr(ins)
    attrs["out_shardings"] = per_value_attr(outs)
    return ir.Operation.create(MC, results=result_types, operands=operands,
                               attributes=attrs, regions=1, loc=loc, ip=ip)


def with_residuals(mc, values: list) -> tuple:
    """`mc` rebuilt with body `values` as new results after its own, each in JAX's shard_map
    residual layout (on its first dimension over the manual axes it varies over; a scalar
    as one element), its results' readers moved over. Returns (the new computation, the
    layouts: (local type, global type, sharding) per value)."""
    mesh_ref, mesh = mesh_of(mc)
    varying = varying_axes(mc, mesh)
    every = frozenset(manual_axes(mc))
    layouts = [residual_layout(v, varying.get(v, every), mesh, mesh_ref) for v in values]
    body = mc.regions[0].blocks[0]
    ret = graph.terminator(body)
    ip = ir.InsertionPoint(ret)
    returned = list(ret.operands)[:len(mc.results)] + [
        v if local == v.type else reshape(v, local, ip, ret.location)
        for v, (local, _, _) in zip(values, layouts)]
    ir.Operation.create("sdy.return", operands=returned, loc=ret.location, ip=ip)
    ret.erase()
    new = new_manual(mc, list(mc.operands),
                     [r.type for r in mc.results] + [g for _, g, _ in layouts],
                     shardings(mc, "in_shardings"),
                     shardings(mc, "out_shardings") + [s for _, _, s in layouts],
                     ir.InsertionPoint(mc), mc.location)
    body.append_to(new.regions[0])
    for k, r in enumerate(mc.results):
        r.replace_all_uses_with(new.results[k])
    mc.erase()
    return new, layouts


def _r_position(plan: ShardMapPairPlan):
    """Where the recompute computation goes: where the backward starts if the
    function-level plan may read its twins, else right before its first reader."""
    return plan.pair.backward_start if plan.twins else plan.pair.readers[0]


def reshape(v, t, ip, loc):
    """`v` reshaped to type `t` (a scalar residual to one element and back)."""
    return ir.Operation.create("stablehlo.reshape", results=[t], operands=[v], ip=ip,
                               loc=loc).results[0]


def materialize_pair(plan: ShardMapPairPlan, mark_clone, next_group, reuse_nested):
    """Apply a ShardMapPairPlan; returns the new forward computation and the recompute one (None
    if nothing is recomputed). `reuse_nested(clone, {result: value})`: a clone of a body op
    reads back the values its regions save (`nested_saves.reuse`)."""
    pair = plan.pair
    old = pair.fwd
    loc = old.location
    found = mesh_of(old)
    mesh_ref, mesh = found if found is not None else (None, None)
    ins, outs = shardings(old, "in_shardings"), shardings(old, "out_shardings")
    body = old.regions[0].blocks[0]
    ret = graph.terminator(body)
    yields = list(ret.operands)
    for v, placement in plan.offloads:
        contract.set_offload(v.owner, placement)
    # the forward computation: primal results, then the residuals it keeps
    varying = None
    layouts = []                         # per kept value: (local type, global type, sharding)
    for v in plan.kept:
        k = plan.kept_from.get(v)
        if k is not None:
            layouts.append((v.type, old.results[k].type, outs[k]))
            continue
        if varying is None:
            varying = varying_axes(old, mesh)
        layouts.append(residual_layout(v, varying.get(v, frozenset(manual_axes(old))),
                                       mesh, mesh_ref))
    returned = [yields[k] for k in plan.primal]
    for v, (local, _, _) in zip(plan.kept, layouts):
        returned.append(v if local == v.type else
                        reshape(v, local, ir.InsertionPoint(ret), ret.location))
    ir.Operation.create("sdy.return", operands=returned, loc=ret.location,
                        ip=ir.InsertionPoint(ret))
    ret.erase()
    types = [old.results[k].type for k in plan.primal] + [g for _, g, _ in layouts]
    new = new_manual(old, list(old.operands), types, ins,
                      [outs[k] for k in plan.primal] + [s for _, _, s in layouts],
                      ir.InsertionPoint(old), loc)
    body.append_to(new.regions[0])
    for n, k in enumerate(plan.primal):
        for use in list(old.results[k].uses):
            use.owner.operands[use.operand_number] = new.results[n]
    kept_result = {v: new.results[len(plan.primal) + i] for i, v in enumerate(plan.kept)}
    # the recompute computation
    recompute = None
    if plan.r_results:
        next_group()
        recompute = _recompute(plan, new, kept_result, layouts, ins, outs, loc,
                               reuse_nested)
        mark_clone(recompute)
    r_index = {k: n for n, k in enumerate(plan.r_results)}
    for user, number, src in plan.replace:
        if isinstance(src, FromRecompute):
            user.operands[number] = recompute.results[r_index[src.k]]
        elif isinstance(src, Kept):
            user.operands[number] = kept_result[src.value]
        else:
            user.operands[number] = new.operands[src.index]
    graph.erase_unused_in_block(new.regions[0].blocks[0], body_side_effect)
    return new, recompute           # (the caller erases the old forward computation)


def _recompute(plan: ShardMapPairPlan, new, kept_result, layouts, ins, outs, loc,
               reuse_nested):
    pair = plan.pair
    body = new.regions[0].blocks[0]
    layout_of = dict(zip(plan.kept, layouts))
    # its operands: the forward operands and kept residuals the clones or results read
    wanted: dict = {}                    # source -> None (ordered)
    cloned = {op_id(op) for op in plan.clones}
    for op in plan.clones:
        for u in saved_results(op, plan.verdict):   # (its own results, kept)
            wanted.setdefault(Kept(u), None)
        for u in graph.read_values(op):
            if isinstance(u, ir.BlockArgument) and u.owner == body:
                wanted.setdefault(Outer(u.arg_number), None)
            elif isinstance(u, ir.OpResult) and op_id(u.owner) not in cloned:
                wanted.setdefault(Kept(u), None)
    for k in plan.r_results:
        if isinstance(plan.r_sources[k], Outer):
            wanted.setdefault(plan.r_sources[k], None)
    sources = list(wanted)
    operands, r_ins, local_types = [], [], []
    for s in sources:
        if isinstance(s, Outer):
            operands.append(new.operands[s.index])
            r_ins.append(ins[s.index])
            local_types.append(body.arguments[s.index].type)
        else:
            local, _, sharding = layout_of[s.value]
            operands.append(kept_result[s.value])
            r_ins.append(sharding)
            local_types.append(local)
    r_types = [pair.fwd.results[k].type for k in plan.r_results]
    r = new_manual(new, operands, r_types, r_ins, [outs[k] for k in plan.r_results],
                    ir.InsertionPoint(_r_position(plan)), loc)
    block = r.regions[0].blocks.append(*local_types,
                                       arg_locs=[loc] * len(local_types))
    ip = ir.InsertionPoint(block)
    value = {}
    for s, arg in zip(sources, block.arguments):
        if isinstance(s, Outer):
            value[body.arguments[s.index]] = arg
        elif arg.type != s.value.type:        # a scalar returned as one element
            value[s.value] = reshape(arg, s.value.type, ip, loc)
        else:
            value[s.value] = arg
    for op in plan.clones:
        clone = op.clone(ip=ip)
        for u in graph.read_values(op):
            if u in value and value[u] != u:
                graph.replace_reads(clone, u, value[u])
        saved = {s.result_number: value[s] for s in saved_results(op, plan.verdict)}
        if saved:     # (its saved branch values or stacks read back, not computed)
            clone = reuse_nested(clone, saved)
        for a, b in zip(op.results, clone.results):
            value[a] = b
    results = []
    for k in plan.r_results:
        src = plan.r_sources[k]
        results.append(value[body.arguments[src.index]] if isinstance(src, Outer)
                       else value[src.value])
    ir.Operation.create("sdy.return", operands=results, loc=loc, ip=ip)
    return r


@dataclasses.dataclass
class Rewritten:
    """A rewritten pair, as the function-level plan sees it."""
    fwd: object                 # the forward computation
    recompute: object           # the recompute computation, or None
    twins: list                 # (n, r): forward result n equals recompute result r
    primal: int                 # how many of the forward's results are primal outputs


def rewrite_pairs(block, verdict, mark_clone, next_group, analysis,
                  reuse_nested) -> tuple[list, dict]:
    """Apply the per-body policy to every shard_map pair of `block` (`analysis`: of its
    function; told of the ops inserted; `reuse_nested`: see `materialize_pair`). Returns
    [Rewritten] and stats."""
    stats = {"pairs": 0, "recomputed": 0}
    rewritten = []
    for pair in find_pairs(block, analysis.is_backward):
        with pair.fwd.location:
            plan = plan_pair(pair, verdict)
            stats["pairs"] += 1
            stats["recomputed"] += plan.recomputed
            if not (plan.rewrites or plan.offloads):
                rewritten.append(Rewritten(pair.fwd, None, [], len(pair.fwd.results)))
                continue
            new, recompute = materialize_pair(plan, mark_clone, next_group, reuse_nested)
            analysis.note_inserted(new, backward=False, before=pair.fwd)
            if recompute is not None:
                analysis.note_inserted(recompute, backward=True, before=_r_position(plan))
            pair.fwd.erase()
            r_index = {k: i for i, k in enumerate(plan.r_results)}
            rewritten.append(Rewritten(new, recompute,
                                       [(n, r_index[k]) for n, k in plan.twins],
                                       len(plan.primal)))
    return rewritten, stats


def twins(analysis, rewritten: list) -> dict:
    """{vid of a forward computation's primal result: vid of the recompute result equal
    to it}."""
    out = {}
    for rw in rewritten:
        fpos = analysis.position.get(op_id(rw.fwd))
        rpos = analysis.position.get(op_id(rw.recompute)) if rw.recompute is not None \
            else None
        if fpos is None or rpos is None:
            continue
        for n, r in rw.twins:
            out[analysis.result_base[fpos] + n] = analysis.result_base[rpos] + r
    return out


def tidy(analysis, twins_read: set, rewritten: list) -> bool:
    """After the function-level plan: drop the recompute results nothing reads and the
    plan does not read as twins, then the forward residuals only they needed; move a
    recompute computation whose twins are not read right before its first user. Updates
    `rewritten`; returns whether the IR changed (then the function is planned again)."""
    changed = False
    block = graph.body_block(analysis.func_op)
    for rw in rewritten:
        r = rw.recompute
        if r is None:
            continue
        base = analysis.result_base[analysis.position[op_id(r)]]
        keep = [i for i, v in enumerate(r.results)
                if next(iter(v.uses), None) is not None or base + i in twins_read]
        read_twins = [(n, i) for n, i in rw.twins if base + i in twins_read]
        if len(keep) == len(r.results) and len(read_twins) == len(rw.twins):
            continue
        changed = True
        renumber = {old: new for new, old in enumerate(keep)}
        rw.twins = [(n, renumber[i]) for n, i in read_twins]
        rw.recompute = shrunk(r, keep, drop_unused_args=True)
        fwd_keep = [i for i, v in enumerate(rw.fwd.results)
                    if i < rw.primal or next(iter(v.uses), None) is not None]
        if len(fwd_keep) < len(rw.fwd.results):
            rw.fwd = shrunk(rw.fwd, fwd_keep, drop_unused_args=False)
        if rw.recompute is not None and not rw.twins:
            _move_before_first_user(rw.recompute, block)
    return changed


def shrunk(op, keep: list, drop_unused_args: bool):
    """Replace manual computation `op` by one returning only the results `keep` (and,
    with `drop_unused_args`, taking only the operands its body still reads); None if
    nothing is kept (it is erased)."""
    if not keep:
        op.erase()
        return None
    body = op.regions[0].blocks[0]
    ret = graph.terminator(body)
    ir.Operation.create("sdy.return", operands=[ret.operands[i] for i in keep],
                        loc=ret.location, ip=ir.InsertionPoint(ret))
    ret.erase()
    graph.erase_unused_in_block(body, body_side_effect)
    args = [i for i, a in enumerate(body.arguments)
            if not drop_unused_args or next(iter(a.uses), None) is not None]
    ins, outs = shardings(op, "in_shardings"), shardings(op, "out_shardings")
    new = new_manual(op, [op.operands[i] for i in args], [op.results[i].type for i in keep],
                      [ins[i] for i in args], [outs[i] for i in keep],
                      ir.InsertionPoint(op), op.location)
    for i in reversed(range(len(body.arguments))):
        if i not in args:
            body.erase_argument(i)
    body.append_to(new.regions[0])
    for n, i in enumerate(keep):
        op.results[i].replace_all_uses_with(new.results[n])
    op.erase()
    return new


def _move_before_first_user(op, block) -> None:
    users = {op_id(graph.top_level(use.owner.operation, block.owner))
             for r in op.results for use in r.uses}
    found = False
    for later in block.operations:
        later = later.operation
        if later == op:
            found = True
        elif found and op_id(later) in users:
            op.move_before(later)
            return
