"""Per-iteration remat through scan loop pairs: decide (`plan_pair`), then rewrite.

For a forward/backward pair (see `scan_pairs`), the policy applies per
iteration: a stacked value whose forward producer is Recompute stops being
stacked and the backward body recomputes it, just before its first use, from
what is still available at the same iteration:

* values still stacked (read at the backward's slot index);
* loop-invariant carries of the forward loop (threaded into the backward loop
  as extra pass-through carries), and values computed from them alone;
* the forward slot index itself (it equals the backward's read index).

A value the recomputation needs that is Saveable (or a carry-in, an input of
the iteration like a `jax.checkpoint`ed layer's argument) is stacked: an
existing buffer is reused, else a new one is added to both loops. A sub-step of
an unrolled step is sliced out of its stacked block. Values that only move data
of invariants by the slot index (slices of a scanned-over array) are re-sliced
in the backward body instead of stacked, as JAX forwards `xs`.

`plan_pair` decides all of this without touching the IR and returns a
`ScanPairPlan`: the backward reads to replace (jobs, in program order), the values
each needs (`items`, in the order they are created: a worklist, no recursion),
the carries to add to both loops, and the bytes and ops it implies per
iteration. `materialize_pair` then builds it with `loop_edit`.

Nested scans: an inner forward loop first also stacks the inner values the
policy saves (`nested_saves.presave`), so the outer forward saves them
`[outer, inner, ...]`; when the backward body recomputes the inner loop, the
clone reads them back, and the rewrite then runs on the backward body, where
the inner pair now sits in one block (`rewrite_pairs`).

A pair whose forward loop itself sits in a checkpoint scope (`jax.checkpoint`
around code with a scan) is not remat per iteration: `plan_whole` decides which
stacks the forward keeps (those of saved values) and `materialize_whole` puts a
recompute clone of the forward loop before the backward loop, reading them back.
"""
from __future__ import annotations

import dataclasses

from remat_passes.analysis import scan_pairs
from remat_passes.analysis.scan_pairs import (WHILE, Pair, PendingPairs, analyse_forward,
                                              moves_data, owner, unrolled_parts)
from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import ir, op_id
from remat_passes.ir.verdicts import Offloadable, Recompute
from remat_passes.regions import loop_edit, nested_saves
from remat_passes.regions.clone_verdicts import Inherited
from remat_passes.regions.scan_nested import inner_saved, prestack


# --------------------------------------------------------------- the plan --
@dataclasses.dataclass(frozen=True)
class Ref:
    """Result `result` of plan item `item`."""
    item: int
    result: int = 0


@dataclasses.dataclass
class Need:
    """A source that needs other values first: `make(their sources)` builds it."""
    deps: list
    make: object


@dataclasses.dataclass(frozen=True)
class Carry:
    """A backward carry: an existing one (`added=False`, `index` = carry number) or the
    `index`-th one the plan adds."""
    index: int
    added: bool


@dataclasses.dataclass
class Clone:
    """Clone forward body op `op` into the backward body, before `before`."""
    job: int                  # the job (recompute group) it is created for
    before: object            # an original op of the backward body
    op: object                # the forward body op
    sources: dict             # value it reads -> source
    saved: dict               # a nested forward loop or case: result k -> source of its save


@dataclasses.dataclass
class ReadSlot:
    """Read slot `index` of a stacked buffer (a backward carry), before `before`."""
    job: int
    before: object
    carry: Carry
    index: object
    type: object              # the value's type


@dataclasses.dataclass
class SlicePart:
    """Slice sub-step `part` out of the stacked block `source` of an unrolled loop."""
    job: int
    before: object
    source: object
    part: int
    type: object


Item = Clone | ReadSlot | SlicePart     # what the backward body gets, in creation order


@dataclasses.dataclass(frozen=True)
class ThreadCarry:
    """Add a backward carry that passes forward invariant carry `k` through."""
    k: int


@dataclasses.dataclass(frozen=True)
class NewBuffer:
    """Stack forward body value `value` in a new forward carry; add it to the backward."""
    value: object


@dataclasses.dataclass(frozen=True)
class ForwardResult:
    """Add a backward carry for forward buffer `k` the backward loop did not read yet."""
    k: int


Addition = ThreadCarry | NewBuffer | ForwardResult


@dataclasses.dataclass
class Job:
    """One backward read of a stacked value that the plan replaces."""
    read: scan_pairs.Read
    value: object             # the forward body value it read
    before: object            # its first user in the backward body
    source: object = None     # what replaces it


@dataclasses.dataclass
class ScanPairPlan:
    pair: Pair
    jobs: list                # Job, in program order of their first users
    items: list[Item]         # in creation order
    additions: list[Addition]  # backward carries to add, in order
    offloads: list            # (forward value, Offloadable): producers to mark
    new_buffers: list         # forward body values the forward loop starts stacking

    @property
    def rewrites(self) -> bool:
        return bool(self.jobs)

    def recomputed_ops(self) -> list:
        """The forward body ops the backward body clones, once per iteration."""
        return [it.op for it in self.items if isinstance(it, Clone)]

    def stacked_values(self) -> list:
        """Forward body values stacked once the plan is applied (kept and new buffers)."""
        dropped = {j.value for j in self.jobs if j.value not in self.kept_values}
        kept = [s.value for s in self.pair.fwd.stacked.values() if s.value not in dropped]
        return kept + list(self.new_buffers)

    @property
    def kept_values(self) -> set:
        """Stacked values the backward still reads from their buffers."""
        out = set()
        for m, reads in self.pair.reads.items():
            replaced = {id(j.read) for j in self.jobs}
            if any(id(rd) not in replaced for rd in reads):
                out.add(self.pair.fwd.stacked[self.pair.links[m]].value)
        return out


class ScanPairPlanner:
    """Decides one pair (see the module docstring); reads the IR, never changes it."""

    def __init__(self, pair: Pair, verdict):
        self.pair = pair
        self.fwd = pair.fwd
        self.verdict = verdict          # value -> Saveable/Offloadable/Recompute
        fbody = self.fwd.body
        self.fwd_op_id = op_id(self.fwd.op)
        self.fargs = list(fbody.arguments)
        self.buffer_of = self.fwd.value_to_carry()       # forward value -> forward carry
        self.carry_of = {k: Carry(m, False) for m, k in pair.links.items()}
        self.slot_index = {s.index for s in self.fwd.stacked.values()}
        self.bbody = pair.bwd_body
        self.bops = [o.operation for o in self.bbody.operations]
        self.bpos = {op_id(o): i for i, o in enumerate(self.bops)}
        self.memo = {}          # (forward value, backward index) -> source
        self.op_items = {}      # (forward op id, backward index) -> item number
        self.items, self.additions, self.offloads, self.new_buffers = [], [], [], []
        self.threaded = {}      # forward invariant carry -> source
        self._free = {}
        self._in = {}
        self.job = 0

    # --- what a forward value is made of
    def in_fwd(self, v) -> bool:
        """Is v defined inside the forward loop (its body or deeper)?"""
        if v in self._in:
            return self._in[v]
        op = v.owner.owner if isinstance(v, ir.BlockArgument) else v.owner.operation
        result = False
        while op is not None:
            if op_id(op) == self.fwd_op_id:
                result = True
                break
            op = op.parent
        self._in[v] = result
        return result

    def slices_invariant(self, v) -> bool:
        """A slice of a loop invariant (dynamic_slice/slice/reshape only): what JAX's scan
        emits to take the iteration's slice of a scanned-over array."""
        while True:
            if not self.in_fwd(v):
                return True
            if isinstance(v, ir.BlockArgument):
                return v.owner == self.fwd.body and v.arg_number in self.fwd.invariant
            op = v.owner.operation
            if op.name not in ("stablehlo.dynamic_slice", "stablehlo.slice", "stablehlo.reshape"):
                return False
            v = op.operands[0]

    def free_kind(self, root):
        """None (needs iteration data), "invariant" or "indexed"."""
        return graph.post_order(root, self._free, self._free_step)

    def _free_step(self, v):
        if not self.in_fwd(v):
            kind = "invariant"
        elif v in self.slot_index:
            kind = "indexed"
        elif isinstance(v, ir.BlockArgument):
            kind = "invariant" if (v.owner == self.fwd.body
                                   and v.arg_number in self.fwd.invariant) else None
        else:
            op = v.owner.operation
            reads = graph.read_values(op)
            pending = [u for u in reads if u not in self._free]
            if pending:
                return pending
            kinds = [self._free[u] for u in reads]
            if graph.is_side_effecting(op) or None in kinds:
                kind = None
            elif "indexed" in kinds:
                kind = "indexed" if moves_data(op) else None
            else:
                kind = "invariant"
        self._free[v] = kind
        return None

    def must_stack(self, v) -> bool:
        if isinstance(v, ir.BlockArgument):
            return True      # a carry-in: an input of the iteration
        return self.verdict(v) is not Recompute

    def mark_offload(self, v) -> None:
        if isinstance(v, ir.BlockArgument):
            return
        verdict = self.verdict(v)
        if isinstance(verdict, Offloadable):
            self.offloads.append((v, verdict))

    def first_user(self, value):
        """The first op of the backward body that reads `value` (possibly nested)."""
        best = None
        for use in value.uses:
            op = use.owner.operation
            while op_id(op) not in self.bpos:
                op = op.parent.operation
            pos = self.bpos[op_id(op)]
            best = pos if best is None or pos < best else best
        return None if best is None else self.bops[best]

    # --- the plan
    def plan(self) -> ScanPairPlan:
        pair = self.pair
        self.part_of = {}
        for m, k in pair.links.items():
            value = self.fwd.stacked[k].value
            self.mark_offload(value)
            parts = unrolled_parts(value)
            if parts is not None and self.must_stack(value):
                for j, u in enumerate(parts):
                    self.part_of.setdefault(u, (value, j))
        jobs = []
        for m, reads in pair.reads.items():
            value = self.fwd.stacked[pair.links[m]].value
            if self.must_stack(value):
                continue
            for rd in reads:
                first = self.first_user(rd.value)
                if first is not None:
                    jobs.append((self.bpos[op_id(first)], Job(rd, value, first)))
        if jobs:
            # Like JAX, which forwards the scanned-over arrays instead of stacking their
            # slices, re-slice stacked values that only move data of invariants.
            for m, reads in pair.reads.items():
                value = self.fwd.stacked[pair.links[m]].value
                if self.must_stack(value) and self.free_kind(value) == "indexed" \
                        and self.slices_invariant(value):
                    for rd in reads:
                        first = self.first_user(rd.value)
                        if first is not None:
                            jobs.append((self.bpos[op_id(first)], Job(rd, value, first)))
        ordered = [j for _, j in sorted(jobs, key=lambda j: j[0])]
        for n, job in enumerate(ordered):
            self.job = n
            job.source = self.get(job.value, job.read.index, job.before)
        return ScanPairPlan(pair, ordered, self.items, self.additions, self.offloads,
                        self.new_buffers)

    def _add_item(self, item) -> int:
        self.items.append(item)
        return len(self.items) - 1

    def _step(self, v, index, before):
        """The source of `v` at `index`, or a `Need` for the values it needs first."""
        if v in self.slot_index:
            return index
        if not self.in_fwd(v):
            return v     # defined before the loop: visible in both loops
        if isinstance(v, ir.BlockArgument) and v.owner == self.fwd.body \
                and v.arg_number in self.fwd.invariant:
            return self.thread(v.arg_number)
        if v in self.part_of:   # one sub-step of a stacked unrolled block: slice it
            block_value, j = self.part_of[v]
            return Need([block_value], lambda srcs: Ref(self._add_item(SlicePart(
                self.job, before, source=srcs[0], part=j, type=v.type))))
        if self.free_kind(v) is None and self.must_stack(v):
            return self.stacked_read(v, index, before)
        op = v.owner.operation
        key = (op_id(op), index)
        if key in self.op_items:   # one clone per op (a while has many results)
            return Ref(self.op_items[key], v.result_number)
        reads = [u for u in graph.read_values(op) if self.in_fwd(u)]
        saved_keys = []
        if op.name == WHILE:
            loop = analyse_forward(op)
            if loop is not None:
                saved_keys = [k for k, st in loop.stacked.items()
                              if isinstance(st.value, ir.OpResult) and self.must_stack(st.value)]
        else:         # (a case or a shard_map returning values its regions save)
            saved_keys = list(contract.nested_saves(op))
        deps = reads + [op.results[k] for k in saved_keys]

        def make(srcs):
            item = Clone(self.job, before, op=op,
                        sources=dict(zip(reads, srcs[:len(reads)])),
                        saved=dict(zip(saved_keys, srcs[len(reads):])))
            self.op_items[key] = self._add_item(item)
            return Ref(self.op_items[key], v.result_number)
        return Need(deps, make)

    def get(self, v, index, before):
        """Source of forward value `v` at backward slot `index` (a post-order worklist)."""
        if (v, index) in self.memo:
            return self.memo[(v, index)]
        stack = [[v, None, []]]     # value, its Need once expanded, resolved sources
        while stack:
            frame = stack[-1]
            value, need, srcs = frame
            if need is None:
                step = self._step(value, index, before)
                if not isinstance(step, Need):
                    self.memo[(value, index)] = step
                    stack.pop()
                    continue
                need = frame[1] = step
            deps, make = need.deps, need.make
            if len(srcs) == len(deps):
                self.memo[(value, index)] = make(srcs)
                stack.pop()
                continue
            dep = deps[len(srcs)]
            if (dep, index) in self.memo:
                srcs.append(self.memo[(dep, index)])
            else:
                stack.append([dep, None, []])
        return self.memo[(v, index)]

    def thread(self, k):
        """The backward body's view of forward invariant carry k."""
        if k in self.threaded:
            return self.threaded[k]
        init = self.fwd.op.operands[k]
        bw = self.pair.bwd
        bret = graph.terminator(self.bbody)
        for m, binit in enumerate(bw.operands):
            if scan_pairs.same_view(binit, init) and \
                    bret.operands[m] == self.bbody.arguments[m]:
                self.threaded[k] = self.bbody.arguments[m]
                return self.threaded[k]
        self.additions.append(ThreadCarry(k))
        self.threaded[k] = Carry(len(self.additions) - 1, True)
        return self.threaded[k]

    def stacked_read(self, v, index, before):
        """Read forward value v at `index`, stacking it if no buffer holds it yet."""
        k = self.buffer_of.get(v)
        if k is None:
            self.mark_offload(v)
            self.new_buffers.append(v)
            self.additions.append(NewBuffer(v))
            carry = Carry(len(self.additions) - 1, True)
            self.buffer_of[v] = ("new", len(self.new_buffers) - 1)
            self.carry_of[self.buffer_of[v]] = carry
        elif k in self.carry_of:
            carry = self.carry_of[k]
            if not carry.added:
                for rd in self.pair.reads.get(carry.index, []):
                    if rd.index == index and \
                            self.bpos[op_id(rd.reshape_op)] < self.bpos[op_id(before)]:
                        return rd.value
        else:   # stacked by the forward loop, not read by this backward loop yet
            self.additions.append(ForwardResult(k))
            carry = self.carry_of[k] = Carry(len(self.additions) - 1, True)
        return Ref(self._add_item(ReadSlot(self.job, before, carry=carry, index=index,
                                           type=v.type)))


def plan_pair(pair: Pair, verdict) -> ScanPairPlan:
    """Decide the per-iteration rewrite of one pair (no IR changes)."""
    return ScanPairPlanner(pair, verdict).plan()


# ------------------------------------------------------------ the rewrite --
def materialize_pair(plan: ScanPairPlan, mark_clone, next_group, stats,
                     cloned=lambda original, clone: None) -> None:
    """Apply a ScanPairPlan: new carries, the backward body's items, then rebuild both loops.
    `cloned(original, clone)` is told of each clone of an op with regions."""
    pair, fwd = plan.pair, plan.pair.fwd
    for v, placement in plan.offloads:
        contract.set_offload(v.owner, placement)
    if not plan.rewrites:
        return
    bw = pair.bwd
    bbody = pair.bwd_body
    loc = fwd.op.location
    fedit, bedit = loop_edit.LoopEdit(fwd.op), loop_edit.LoopEdit(bw)
    n_bwd = len(bw.operands)
    added_args = []
    new_buffers = {}        # forward value -> (forward carry, backward carry)
    for add in plan.additions:
        if isinstance(add, ThreadCarry):
            arg = bedit.add(fwd.op.operands[add.k], loc)
        elif isinstance(add, NewBuffer):
            zero = loop_edit.stack_value(fwd, fedit, add.value)
            arg = bedit.add(zero, loc)
            new_buffers[add.value] = (len(fedit.inits) - 1, len(bedit.inits) - 1)
            stats["stacked"] += 1
        else:   # ForwardResult
            arg = bedit.add(fwd.op.results[add.k], loc)
        added_args.append(arg)

    built = []

    def value_of(src):
        if isinstance(src, Ref):
            made = built[src.item]    # a clone (an op) or the value a read/slice made
            return made.results[src.result] if hasattr(made, "results") else made
        if isinstance(src, Carry):
            return added_args[src.index] if src.added else bbody.arguments[src.index]
        return src

    job_of = 0
    next_group()
    for item in plan.items:
        while job_of < item.job:
            job_of += 1
            _finish_job(plan.jobs[job_of - 1], value_of, stats)
            next_group()
        if isinstance(item, Clone):
            clone = item.op.clone(ip=ir.InsertionPoint(item.before))
            if len(clone.regions):
                cloned(item.op, clone)
            for old, src in item.sources.items():
                new = value_of(src)
                if new != old:
                    graph.replace_reads(clone, old, new)
            mark_clone(clone)
            if item.saved:     # (what its regions save, read back)
                clone = nested_saves.reuse(clone, {k: value_of(s)
                                                   for k, s in item.saved.items()})
            built.append(clone)
        elif isinstance(item, ReadSlot):
            built.append(loop_edit.read_slot(value_of(item.carry), item.index, item.before,
                                             item.type))
        else:
            built.append(loop_edit.slice_part(value_of(item.source), item.part, item.before,
                                              item.type))
    for job in plan.jobs[job_of:]:
        _finish_job(job, value_of, stats)
        if job is not plan.jobs[-1]:
            next_group()
    graph.erase_unused_in_block(bbody)
    _rebuild(plan, fedit, bedit, new_buffers, n_bwd)


def _finish_job(job: Job, value_of, stats) -> None:
    new = value_of(job.source)
    if new != job.read.value:
        job.read.value.replace_all_uses_with(new)
        stats["recomputed"] += 1


def _rebuild(plan: ScanPairPlan, fedit, bedit, new_buffers, n_bwd) -> None:
    """Drop the buffers nothing reads any more and rebuild both loops."""
    pair, fwd = plan.pair, plan.pair.fwd
    bw = pair.bwd
    bbody = pair.bwd_body
    bret = graph.terminator(bbody)
    bkeep = []
    for m, arg in enumerate(bbody.arguments):
        uses = [u for u in arg.uses if u.owner.operation != bret]
        if m in pair.links and not uses and m < n_bwd:
            continue
        bkeep.append(m)
    dropped_inits = [v for m, v in enumerate(bedit.inits) if m not in bkeep]
    bedit.drop(set(bkeep))
    bmap = {old: new for new, old in enumerate(bkeep)}
    new_bw = bedit.rebuild({m: bmap[m] for m in range(len(bw.results)) if m in bmap})
    for v in dropped_inits:   # reshape chains between the loops
        loop_edit.erase_unread(v)
    fw_old = fwd.op
    n_old = len(fw_old.results)
    fargs = list(fwd.body.arguments)
    fkeep = [k for k in range(len(fedit.inits))
             if not (k < n_old and k in fwd.stacked
                     and next(iter(fw_old.results[k].uses), None) is None)]
    for k in range(len(fedit.inits)):   # the dropped buffers' updates lose their users
        if k not in fkeep:
            fedit.set_returned(k, fargs[k])
    fedit.flush_return()
    graph.erase_unused_in_block(fwd.body)
    fedit.drop(set(fkeep))
    fmap = {old: new for new, old in enumerate(fkeep)}
    new_fw = fedit.rebuild({k: fmap[k] for k in range(n_old) if k in fmap})
    for v, (k, m) in new_buffers.items():
        new_bw.operands[bmap[m]] = new_fw.results[fmap[k]]
    pair.fwd.op = new_fw
    pair.bwd = new_bw


# --------------------------------------- a scan inside a checkpoint scope --
def _recomputed_stack(s, verdict) -> bool:
    """Does the stacked value of `s` (a `Stacked`) come from recomputation, not a save?
    Carry-ins are: a checkpoint saves what its policy names, and a carry-in is no op's
    result (the previous iteration's carry-out, or the loop's initial value)."""
    return isinstance(s.value, ir.BlockArgument) or verdict(s.value) is Recompute


@dataclasses.dataclass
class WholePlan:
    """A scan pair whose forward loop sits in a checkpoint scope, as `jax.checkpoint`
    around a function with a scan treats it: the forward loop keeps (stacks) only what
    the policy saves; the backward re-runs it, reading those stacks back."""
    pair: Pair
    prestack: list            # body values the forward loop must stack first
    recompute: dict           # backward carry -> forward carry: the stacks the re-run makes
    saved: list               # forward carries of saved stacks (the re-run reads them)
    offloads: list            # (forward body value, Offloadable) of saved stacks


def plan_whole(pair: Pair, verdict) -> WholePlan:
    """Decide a scan pair in a checkpoint scope (no IR changes)."""
    fwd = pair.fwd
    stacked = {s.value for s in fwd.stacked.values()}
    prestack = [v for v in inner_saved(fwd, verdict) if v not in stacked]
    recompute = {m: k for m, k in pair.links.items()
                 if _recomputed_stack(fwd.stacked[k], verdict)}
    saved = [k for k, s in fwd.stacked.items() if not _recomputed_stack(s, verdict)]
    offloads = []
    for k in saved:
        placement = verdict(fwd.stacked[k].value)
        if isinstance(placement, Offloadable):
            offloads.append((fwd.stacked[k].value, placement))
    return WholePlan(pair, prestack, recompute, saved, offloads)


def _redirect(bwd, m, old_source, new_source) -> None:
    """Backward loop `bwd` reads `new_source` as carry `m` where it read `old_source`,
    through the same reshape chain (see `scan_pairs.through_reshapes`)."""
    chain = []
    v = bwd.operands[m]
    while v != old_source:
        chain.append(owner(v))
        v = chain[-1].operands[0]
    for op in reversed(chain):
        new_source = ir.Operation.create(
            "stablehlo.reshape", results=[op.results[0].type], operands=[new_source],
            loc=op.location, ip=ir.InsertionPoint(bwd)).results[0]
    bwd.operands[m] = new_source


def materialize_whole(plan: WholePlan, mark_clone, next_group, stats) -> tuple:
    """Apply a WholePlan whose values are all stacked (`prestack` done): a recompute
    clone of the forward loop right before the backward loop reads the saved stacks
    back and makes the other stacks the backward reads; stacks nothing reads any more
    are dropped from both loops. Returns (forward loop, recompute loop or None)."""
    pair = plan.pair
    fwd = pair.fwd
    for v, placement in plan.offloads:
        contract.set_offload(v.owner, placement)
    if not plan.recompute:
        return fwd.op, None
    next_group()
    clone = fwd.op.clone(ip=ir.InsertionPoint(pair.bwd))
    mark_clone(clone)
    for j, init in enumerate(list(clone.operands)):   # (what the backward reads anyway)
        same = next((b for b in pair.bwd.operands if scan_pairs.same_view(b, init)), None)
        if same is not None:
            clone.operands[j] = same
    clone = nested_saves.reuse(clone, {k: fwd.op.results[k] for k in plan.saved})
    for m, k in plan.recompute.items():
        _redirect(pair.bwd, m, fwd.op.results[k], clone.results[k])
    stats["whole"] += 1
    next_group()
    return loop_edit.drop_unused_carries(fwd.op), loop_edit.drop_unused_carries(clone)


def rewrite_pairs(block, verdict, mark_clone, next_group, stats=None) -> dict:
    """Apply the per-iteration policy to every scan pair in `block` (and nested ones); a
    pair whose forward loop sits in a checkpoint scope is re-run whole (`plan_whole`).

    Returns stats: pairs rewritten, slot reads replaced by recomputation, buffers added,
    loops re-run whole, the op ids of the forward loops in a scope (`scoped_loops`), and
    the verdicts the clones' nested ops inherit (`inherited`, `clone_verdicts`: an inner
    loop recomputed in a backward body gets the plan's verdicts on the loop it copies).
    """
    stats = stats if stats is not None else {"pairs": 0, "recomputed": 0, "stacked": 0,
                                             "whole": 0, "scoped_loops": set(),
                                             "inherited": {}}
    if not isinstance(verdict, Inherited):
        verdict = Inherited(verdict, stats["inherited"])
    done = set()
    whole = set()       # loops of pairs in a checkpoint scope, done
    in_scope = getattr(verdict, "in_scope", None)
    # the pairs found and not done yet: found again only when a rewrite rebuilt a loop one
    # of them holds, or when all are done
    pending = PendingPairs()
    while True:
        if not pending:
            pending = PendingPairs([p for p in scan_pairs.find_pairs_in_block(block)
                                    if (op_id(p.fwd.op), op_id(p.bwd)) not in done
                                    and op_id(p.fwd.op) not in whole])
            if not pending:
                break
        p = pending.pop()
        loops = {op_id(p.fwd.op), op_id(p.bwd)}    # (what its rewrite may rebuild)
        if in_scope is not None and in_scope(p.fwd.op) \
                and not contract.is_recompute_clone(p.fwd.op):   # (not a re-run already)
            with p.fwd.op.location:
                plan = plan_whole(p, verdict)
                if plan.prestack:
                    prestack(p.fwd, plan.prestack)
                    pending = PendingPairs()    # the forward loop was rebuilt
                    continue
                stats["pairs"] += 1
                rebuilt = materialize_whole(plan, mark_clone, next_group, stats)
            whole.update(op_id(w) for w in rebuilt if w is not None)
            stats["scoped_loops"].add(op_id(rebuilt[0]))
            pending = pending.untouched(loops)
            continue
        with p.fwd.op.location:     # (the region ops of its body return what they save)
            nested = nested_saves.presave(p.fwd.body, verdict)
        if nested:
            pending = PendingPairs()    # the nested ops were rebuilt
            continue
        stats["pairs"] += 1
        with p.fwd.op.location:   # the default location (and context) of new ops and types
            plan = plan_pair(p, verdict)
            materialize_pair(plan, mark_clone, next_group, stats, verdict.record)
        done.add((op_id(p.fwd.op), op_id(p.bwd)))
        if plan.rewrites:
            pending = pending.untouched(loops)
            rewrite_pairs(p.bwd_body, verdict, mark_clone, next_group, stats)
    return stats
