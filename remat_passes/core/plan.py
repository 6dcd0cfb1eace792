"""The remat plan: which forward values the backward reads from memory, which it recomputes.

`build_plan(analysis, decider)` walks the backward ops of a joint function in
program order (the StableHLO analog of JAX's `partial_eval_jaxpr_custom`
loop) and, for every forward value each one reads, asks where that value
comes from:

* function arguments, side-effecting ops, results of ops with regions kept whole
  (scan loops) and values the decider calls Saveable/Offloadable are *saved*;
* values computed from constants alone are *free*: cloned, never saved;
* Recompute values get a *clone*: the op is copied into the backward, its own
  reads resolved the same way, once per (op, checkpoint-scope context), just in time
  (right before the first backward op that needs it: its *serve*), but a clone
  smaller than the clones it is the last to read is moved to where they are made
  (`make_narrowing_clones_early`: a ReLU mask beside the recomputed pre-activation);
* a result of an op kept whole that has a *twin* (a backward op computing the same
  value: the recompute case of a cond, see `case_rewrite`) is read from the twin.
  A twin's own op is served only if something reads the twin (else it stays unused
  and the dead-code sweep removes it).

The result, a `RematPlan`, says all of that without touching the IR: the
saved values (with offload placements), the clones in creation order, and the
sources each serve reads. Its residual bytes and recomputed ops are known
without a rewrite, so a planner can score many plans; `materialize` builds one.

`PolicyDecider` is the decider that follows checkpoint policies with
`jax.checkpoint`'s nesting semantics (see its docstring). A planner can pass
any object with the same `home` method.
"""
from __future__ import annotations

import heapq
from array import array
from typing import NamedTuple

from remat_passes.ir import contract, graph
from remat_passes.policy.policies import (Offloadable, Recompute, Saveable, as_policy)
from remat_passes.policy.scopes import BodyVerdicts, ScopePolicies, VerdictCache


class PolicyDecider:
    """Where the value of a forward op comes from, by checkpoint policy.

    Checkpoint scopes (the user docs' checkpoint regions) nest like
    `jax.checkpoint` calls. The policy in force for an op is that of its
    outermost scope (the module-level policy outside scopes); values flowing
    into a scope, or from one scope into another, are saved. When a scope is
    recomputed inside the backward, an inner scope's policy decides which of
    its values that recomputation keeps for the whole outer scope, and which
    are recomputed again just before the inner scope's own backward ops.
    `home(pos, ctx, saved)` answers for a request from the backward of the
    scope chain `ctx`: (verdict, depth), with depth 0 and a non-Recompute
    verdict for a residual of the forward pass, else the depth of the scope
    backward that recomputes it. Levels are searched outermost first.
    """

    def __init__(self, analysis, policies: ScopePolicies, scope_re=None):
        self.a = analysis
        self.policies = policies
        self.chains = analysis.scope_chains(scope_re)
        self.scope_re = scope_re
        self._verdicts = VerdictCache()
        self._body_verdicts = BodyVerdicts(policies, scope_re, self._verdicts)
        self._outers: dict = {}       # position -> frozenset (interned)
        self._prefix: dict = {}       # position -> tuple (interned)
        self._interned: dict = {}

    def verdict(self, policy, pos):
        return self._verdicts.get(policy, self.a.ops[pos], pos)

    def body_verdict(self, op):
        """The verdict on an op of a scan loop's body, which the loop's rule asks per
        iteration (`BodyVerdicts`)."""
        return self._body_verdicts(op)

    def _intern(self, x):
        return self._interned.setdefault(x, x)

    def _consumer_outers(self, pos) -> set:
        """The outermost scopes of the op's forward consumers (None: outside scopes)."""
        if pos not in self._outers:
            chains = self.chains
            self._outers[pos] = self._intern(frozenset(
                chains[c][0] if chains[c] else None for c in self.a.forward_consumers(pos)))
        return self._outers[pos]

    def _consumer_prefix(self, pos):
        """The longest common prefix of the forward consumers' scope chains (None: no
        consumers)."""
        if pos not in self._prefix:
            prefix = None
            for c in self.a.forward_consumers(pos):
                chain = self.chains[c]
                if prefix is None:
                    prefix = chain
                else:
                    n = 0
                    while n < len(prefix) and n < len(chain) and prefix[n] == chain[n]:
                        n += 1
                    prefix = prefix[:n]
            self._prefix[pos] = prefix if prefix is None else self._intern(prefix)
        return self._prefix[pos]

    def forward_verdict(self, pos):
        """The verdict of the forward pass itself for the op: is its result a residual?
        (Recompute: the backward that reads it recomputes it; the planner reads this of
        the ops `auto` does not decide.)"""
        scope = self.decided_by(pos)
        if scope is False:
            return Saveable
        return self.verdict(self.policies.outside if scope is None
                            else self.policies.of_scope(scope), pos)

    def decided_by(self, pos):
        """Whose policy gives the op's forward verdict: None, the module's (outside scopes,
        and for a scope's output that is read outside it); else the op's outermost scope;
        False where it is saved whatever a policy says: the input of a scope
        (jax.checkpoint saves its arguments), or the output of one scope another reads."""
        chain = self.chains[pos]
        outers = self._consumer_outers(pos)
        if outers - {None, chain[0] if chain else None}:
            return False
        return None if not chain or None in outers else chain[0]

    def scope_backward_verdict(self, pos, scope):
        """The op's verdict for a read from the backward of `scope`, its own outermost
        scope, where the forward pass keeps nothing else (`_saved_for_scope`)."""
        return self._saved_for_scope(pos, scope, ())

    def _saved_for_scope(self, pos, scope, saved):
        """Forward verdict for the op when the backward of `scope` (its outermost) asks.
        A value the forward keeps anyway (the input of another scope, or a scope output
        an outer backward already took) is reused rather than recomputed."""
        if self._consumer_outers(pos) - {None, scope}:
            return Saveable
        first = self.a.result_base[pos]
        if first < self.a.result_base[pos + 1] and first in saved:
            return Saveable
        return self.verdict(self.policies.of_scope(scope), pos)

    def _kept_at(self, pos, ctx, depth):
        """In the backward of scope ctx[depth-1], which re-runs the forward of scope
        ctx[depth], does that re-run keep the op's value (inside ctx[depth])?"""
        prefix = self._consumer_prefix(pos)
        if prefix is not None and (len(prefix) < depth + 1 or prefix[:depth + 1] != ctx[:depth + 1]):
            return True  # an output of scope ctx[depth]: kept by the enclosing re-run
        return self.verdict(self.policies.of_scope(ctx[depth]), pos) is not Recompute

    def home(self, pos, ctx, saved):
        verdict = (self.forward_verdict(pos) if not ctx
                   else self._saved_for_scope(pos, ctx[0], saved))
        if verdict is not Recompute:
            return verdict, 0
        for depth in range(1, len(ctx)):
            if self._kept_at(pos, ctx, depth):
                return Recompute, depth
        return Recompute, len(ctx)


# ------------------------------------------------------------------ plan --
# A source says where a read gets its value: a vid >= 0 (the value as it is), or a
# negative int naming a result of a clone of the plan (plain ints keep big plans small).
RESULT_STRIDE = 1 << 16


def clone_source(clone: int, result: int = 0) -> int:
    """The source for result `result` of clone number `clone`."""
    return -1 - (clone * RESULT_STRIDE + result)


def is_clone_source(src: int) -> bool:
    return src < 0


def clone_of_source(src: int) -> tuple[int, int]:
    """(clone number, result number) of a clone source."""
    return divmod(-1 - src, RESULT_STRIDE)


class Clone(NamedTuple):
    """One recomputed op: a copy of a forward op placed in the backward."""
    op: int          # position of the forward op it copies
    ctx: tuple       # the checkpoint-scope context it serves
    sources: tuple   # per value the op reads (analysis.reads(op)): its source
    group: int       # the recompute group (one per consumer served)


class Serve(NamedTuple):
    """A backward consumer that needs clones or reads something else than the forward
    value: the clones placed right before it and what it reads instead."""
    consumer: int    # position; len(analysis.ops) is the function's return (split results)
    group: int
    clones: range    # clone numbers made before it, in order (a tuple where some moved)
    reads: tuple     # vid it reads, source, vid, source, ... for the reads that change
    result_slots: tuple = ()    # the return only: result index, source, ...


class RematPlan:
    """The decision for one function, in flat integer arrays (a big plan stays small).

    `saved`: vid -> Offloadable or None; `clone(i)`/`clones()` and `serves()` give
    the clones (in creation order) and serves (in program order) as named tuples.
    Sources are vids (`analysis.vid`: read the value as it is) or clone sources."""

    def __init__(self, analysis, kept_whole):
        self.analysis = analysis
        self.kept_whole = set(kept_whole)  # positions of ops with regions saved whole
        self.saved: dict = {}
        self.split_flags = None            # split mode: per result, is it <f>_bwd's?
        self.twins_read: set = set()       # vids of twins read instead of their originals
        self.next_group = 0
        self._clone_op, self._clone_group = array("q"), array("q")
        self._clone_ctx: list = []
        self._src_starts, self._src_flat = array("q", [0]), array("q")
        self._serve = array("q")           # consumer, group, first clone, stop clone, ...
        self._read_starts, self._read_flat = array("q", [0]), array("q")
        self._slots: tuple = ()
        self._moved: dict = {}             # clone -> the serve (index) it was moved to

    # --- building (by the plan builder)
    def add_clone(self, pos, ctx, sources, group) -> int:
        self._clone_op.append(pos)
        self._clone_group.append(group)
        self._clone_ctx.append(ctx)
        self._src_flat.extend(sources)
        self._src_starts.append(len(self._src_flat))
        return len(self._clone_op) - 1

    def add_serve(self, consumer, group, first, reads, slots=()) -> None:
        self._serve.extend((consumer, group, first, len(self._clone_op)))
        self._read_flat.extend(reads)
        self._read_starts.append(len(self._read_flat))
        if slots:
            self._slots = tuple(slots)

    # --- reading
    @property
    def num_clones(self) -> int:
        return len(self._clone_op)

    def clone(self, i) -> Clone:
        s = self._src_starts
        return Clone(self._clone_op[i], self._clone_ctx[i],
                     tuple(self._src_flat[s[i]:s[i + 1]]), self._clone_group[i])

    def clones(self) -> list[Clone]:
        return [self.clone(i) for i in range(self.num_clones)]

    def serves(self):
        """The serves in program order (the return last, in split mode)."""
        sv, rs = self._serve, self._read_starts
        n = len(sv) // 4
        moved_in: dict = {}
        for clone, to in sorted(self._moved.items()):
            moved_in.setdefault(to, []).append(clone)
        for k in range(n):
            consumer, group, first, stop = sv[4 * k:4 * k + 4]
            slots = self._slots if consumer == len(self.analysis.ops) else ()
            clones = range(first, stop)
            if self._moved:
                clones = tuple(c for c in clones if c not in self._moved) + \
                    tuple(moved_in.get(k, ()))
            yield Serve(consumer, group, clones,
                        tuple(self._read_flat[rs[k]:rs[k + 1]]), slots)

    def move_clone(self, clone: int, serve: int) -> None:
        """Make clone number `clone` before the consumer of serve number `serve` (an
        earlier one than its own), in that serve's recompute group, after its clones."""
        self._moved[clone] = serve
        self._clone_group[clone] = self._serve[4 * serve + 1]

    def residuals(self) -> list[int]:
        """The saved vids: arguments first, then in program order."""
        return sorted(self.saved)

    def residual_bytes(self, offloaded: bool = False) -> int:
        """Bytes of the saved values kept on the device (or, with offloaded=True, moved)."""
        a = self.analysis
        return sum(graph.type_bytes(a.value(v).type) for v, o in self.saved.items()
                   if (o is not None) == offloaded)

    def recomputed_ops(self) -> list:
        """The forward ops the backward recomputes, once per clone."""
        return [self.analysis.ops[pos] for pos in self._clone_op]


class PlanBuilder:
    def __init__(self, plan: RematPlan, decider, kept_whole, first_group, twins=None):
        self.a = plan.analysis
        self.plan = plan
        self.decider = decider
        self.kept_whole = kept_whole      # position -> placement(vid), for ops whose results
        self.chains = decider.chains      # are never recomputed (scan loops)
        self.free_in_reader = getattr(decider, "free_in_reader", False)
        self.saved = plan.saved
        self.clone_of: dict = {}          # ctx -> {position: clone number}
        self.group = first_group
        self.twins = twins or {}          # forward vid -> backward vid equal to it
        self.twins_read: set = set()      # positions of the twins' ops something read
        self.serving = -1                 # the backward op being served

    @staticmethod
    def _common_prefix(a, b):
        n = 0
        while n < len(a) and n < len(b) and a[n] == b[n]:
            n += 1
        return a[:n]

    def source(self, vid, consumer_ctx):
        """Where value `vid` comes from for a reader in context `consumer_ctx`: a source,
        or a tuple (position, ctx, result) for a clone still to be planned."""
        a = self.a
        if vid < a.nargs:
            if vid not in a.cotangent_vids:
                self.saved.setdefault(vid, None)
            return vid
        pos = a.producer[vid]
        if a.backward[pos]:
            return vid
        if a.free[pos] and self.free_in_reader:
            ctx = consumer_ctx      # (made again where it is read: see TwoLevelDecider)
        else:
            ctx = self._common_prefix(consumer_ctx, self.chains[pos])
        if a.side_effect[pos]:
            self.saved.setdefault(vid, None)   # never duplicated
            return vid
        if pos in self.kept_whole:            # decided per iteration; offload marks inside
            twin = self.twins.get(vid)
            if twin is not None:
                tpos = a.producer[twin]
                if tpos in self.kept_whole:       # another result of the same op
                    self.plan.twins_read.add(twin)
                    self.saved[twin] = self.kept_whole[tpos](twin)
                    return twin
                if tpos != self.serving:
                    self.twins_read.add(tpos)
                    self.plan.twins_read.add(twin)
                    return twin
            self.saved[vid] = self.kept_whole[pos](vid)
            return vid
        if not a.free[pos]:
            verdict, depth = self.decider.home(pos, ctx, self.saved)
            if verdict is not Recompute:
                if isinstance(verdict, Offloadable):
                    self.saved[vid] = verdict
                else:   # "already saved" must not undo an earlier offload decision
                    self.saved.setdefault(vid, None)
                return vid
            ctx = ctx[:depth]
        result = vid - a.result_base[pos]
        clone = self.clone_of.get(ctx, {}).get(pos)
        if clone is not None:
            return clone_source(clone, result)
        return (pos, ctx, result)

    def resolve(self, vid, consumer_ctx):
        """The final source of `vid`, planning the clones it needs (a post-order worklist;
        a finished clone is found through `clone_of` when its read is resolved again)."""
        first = self.source(vid, consumer_ctx)
        if not isinstance(first, tuple):
            return first
        pos, ctx, result = first
        stack = [(pos, ctx, [])]
        while stack:
            p, c, srcs = stack[-1]
            reads = self.a.reads(p)
            if len(srcs) == len(reads):
                stack.pop()
                n = self.plan.add_clone(p, c, srcs, self.group)
                self.clone_of.setdefault(c, {})[p] = n
                continue
            s = self.source(reads[len(srcs)], c)
            if isinstance(s, tuple):
                stack.append((s[0], s[1], []))
            else:
                srcs.append(s)
        return clone_source(self.clone_of[ctx][pos], result)

    def serve(self, pos, ctx) -> None:
        """Plan the reads of backward op `pos` (nothing is recorded when it reads
        everything as is)."""
        self.serving = pos
        self.group += 1
        first = self.plan.num_clones
        reads = []
        for vid in self.a.reads(pos):
            new = self.resolve(vid, ctx)
            if new != vid:
                reads += (vid, new)
        if reads or first != self.plan.num_clones:
            self.plan.add_serve(pos, self.group, first, reads)


def build_plan(analysis, decider, *, split: bool = False, kept_whole=None,
               first_group: int = 0, twins=None) -> RematPlan:
    """Decide the whole function (see the module docstring). `twins`: forward vid ->
    backward vid computing the same value."""
    kept_whole = kept_whole or {}
    twins = twins or {}
    # a twin's op that nothing reads yet is served only if the plan reads the twin
    optional = {pos for pos in {analysis.producer[t] for t in twins.values()}
                if not any(len(analysis.users(v)) for v in analysis.results(pos))}
    served = set()
    while True:     # at most twice: once more if twins were read (their ops are served)
        plan = RematPlan(analysis, kept_whole)
        b = PlanBuilder(plan, decider, kept_whole, first_group, twins)
        chains = decider.chains
        for pos in range(len(analysis.ops)):
            if analysis.backward[pos] and (pos not in optional or pos in served):
                b.serve(pos, chains[pos])
        if b.twins_read <= served:
            break
        served |= b.twins_read
    if split:
        flags = plan.split_flags = _split_flags(analysis)
        b.twins = {}      # (a twin not served by now must not be read)
        b.group += 1
        first = plan.num_clones
        slots = []
        for i, v in enumerate(analysis.terminator.operands):
            vid = analysis.vid(v)
            if flags[i] and not analysis.is_backward_vid(vid):
                slots += (i, b.resolve(vid, ()))
        plan.add_serve(len(analysis.ops), b.group, first, (), slots)
    plan.next_group = b.group
    make_narrowing_clones_early(plan)
    return plan


def make_narrowing_clones_early(plan: RematPlan) -> None:
    """Move a clone to the serve where its inputs are made when that ends more bytes'
    lives than it starts. Just in time, a small value read late (the conv net's ReLU
    mask, 128 KiB of bool, read by the select of the first layer's backward) keeps the
    large clone it is computed from (the 512 KiB pre-activation, made earlier for the
    weight gradient's input) alive until then; made where that clone is made, the mask
    lives instead. A clone moves to the latest serve that makes one of its clone inputs,
    when the inputs that no other reader needs later outweigh its own results; free
    inputs made for it alone (a broadcast constant) move with it. Clones are taken in
    creation order, so a chain of narrowing clones moves together."""
    a = plan.analysis
    clones = plan.clones()
    if not clones:
        return
    where = array("q", [0]) * len(clones)
    readers: dict = {}            # clone source -> [("clone", k) | ("serve", index)]
    for index, serve in enumerate(plan.serves()):
        for k in serve.clones:
            where[k] = index
        for src in serve.reads[1::2] + serve.result_slots[1::2]:
            if is_clone_source(src):
                readers.setdefault(src, []).append(("serve", index))
    for k, c in enumerate(clones):
        for src in set(c.sources):
            if is_clone_source(src):
                readers.setdefault(src, []).append(("clone", k))

    last_read = _LastRead(readers, where)

    def made_for(k, j, i):
        """The free clones of serve j that only feed clone k (a broadcast constant), in
        creation order; None where k reads another clone of serve j, or where those
        read a clone made after serve i."""
        along, todo = set(), [k]
        while todo:
            x = todo.pop()
            for src in set(clones[x].sources):
                if not is_clone_source(src):
                    continue
                m = clone_of_source(src)[0]
                if where[m] != j:
                    if where[m] > i:
                        return None
                    continue
                if m in along:
                    continue
                if not a.free[clones[m].op] or any(
                        kind != "clone" or not (r == x or r == k or r in along)
                        for kind, r in readers[src]):
                    return None
                along.add(m)
                todo.append(m)
        return sorted(along)

    for k, c in enumerate(clones):
        j = where[k]
        if any(not is_clone_source(src) and src >= a.nargs and a.is_backward_vid(src)
               for src in c.sources):
            continue                        # reads a backward value: not there earlier
        inputs = {src for src in c.sources
                  if is_clone_source(src) and where[clone_of_source(src)[0]] != j}
        if not inputs:
            continue
        i = max(where[clone_of_source(src)[0]] for src in inputs)
        along = made_for(k, j, i) if i < j else None
        if along is None:
            continue
        ending = sum(graph.type_bytes(_clone_result_type(a, clones, src)) for src in inputs
                     if last_read.latest(src, but=k) <= i)
        starting = sum(graph.type_bytes(t) for t in _result_types(a, c.op))
        if ending <= starting:
            continue
        for m in along + [k]:
            plan.move_clone(m, i)
            where[m] = i


class _LastRead:
    """The latest serve that reads each clone source, but one clone reader: the readers are
    serves (by index) and clones (at `where[k]`, which only moves earlier). A max-heap per
    source, its entries refreshed when they come to the top: a moved clone's entry is too
    late until then, never too early, so the top, once current, is the latest. A question
    costs a logarithm of the readers, and a move one refresh per source the clone reads;
    a scan of the readers per question was quadratic where a value every layer reads has
    as many readers as layers (the scaling benchmark's fan-out family)."""

    def __init__(self, readers: dict, where):
        self.where = where
        self.heaps = {}
        for src, rs in readers.items():
            heap = [(-(where[r] if kind == "clone" else r), kind == "clone", r) for kind, r in rs]
            heapq.heapify(heap)
            self.heaps[src] = heap

    def latest(self, src, but: int) -> int:
        """The index of the latest serve reading `src`, clone `but` left out; -1 if none."""
        heap, aside, found = self.heaps.get(src, []), None, -1
        while heap:
            neg, is_clone, r = heap[0]
            if is_clone and self.where[r] != -neg:      # moved since: refresh it
                heapq.heapreplace(heap, (-self.where[r], True, r))
            elif is_clone and r == but and aside is None:
                aside = heapq.heappop(heap)
            else:
                found = -neg
                break
        if aside is not None:
            heapq.heappush(heap, aside)
        return found


def _result_types(a, pos) -> list:
    return [a.value(v).type for v in a.results(pos)]


def _clone_result_type(a, clones, src):
    clone, result = clone_of_source(src)
    return _result_types(a, clones[clone].op)[result]


def _split_flags(analysis) -> list[bool]:
    """Which results belong to <f>_bwd: gradients (by mark) and backward values."""
    gradients = set(contract.gradient_results(analysis.func_op))
    return [i in gradients or analysis.is_backward_vid(analysis.vid(v))
            for i, v in enumerate(analysis.terminator.operands)]


__all__ = ["RematPlan", "Clone", "Serve", "clone_source", "clone_of_source", "is_clone_source",
           "PolicyDecider", "build_plan", "as_policy"]
