"""Per-iteration remat through scan loops: forward/backward `stablehlo.while` pairs.

JAX exports `lax.scan` under a VJP as two loops in the same block:

* a *forward* while whose body computes one iteration and writes per-iteration
  residuals into loop-carried stacked buffers (`dynamic_update_slice` of the
  value, broadcast or reshaped to `[1, ...]`, at the iteration's slot index);
* a *backward* while, later in the block, that takes those buffers as carries,
  passes them through unchanged and reads one slot per iteration
  (`dynamic_slice` of size `[1, ...]` at the slot index, then `reshape`).

`rewrite_pairs(block, verdict, ...)` finds such pairs and applies the policy per
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
an unrolled step is sliced out of its stacked block. Nested scans: an inner
forward loop first also stacks the inner values the policy saves
(`prestack_nested`), so the outer forward saves them; when the backward body
recomputes the inner loop, the clone reads them back (`_reuse_saved_stacks`),
and the same rewrite then runs on the backward body, where the inner pair now
sits in one block.

Whiles that are not recognisable pairs are left alone (atomic).
"""
from __future__ import annotations

import dataclasses

from remat_passes import graph
from remat_passes.mlir import ir, op_id
from remat_passes.policies import Offloadable, Recompute, Saveable

WHILE = "stablehlo.while"


# ----------------------------------------------------------- small helpers --
def _owner(v):
    return v.owner.operation if isinstance(v, ir.OpResult) else None


def _const_int(v):
    """The integer value of a scalar integer constant, else None."""
    op = _owner(v)
    if op is None or op.name != "stablehlo.constant":
        return None
    try:
        attr = ir.DenseIntElementsAttr(op.attributes["value"])
    except (ValueError, TypeError):
        return None
    if not attr.is_splat:
        return None
    return int(ir.IntegerAttr(attr.get_splat_value()).value)


def _shape(v) -> list[int]:
    return list(ir.RankedTensorType(v.type).shape)


def _unwrap_update(u, slot_shape):
    """The per-iteration value behind a `[1, ...]` update (broadcast_in_dim/reshape)."""
    op = _owner(u)
    if op is not None and op.name in ("stablehlo.broadcast_in_dim", "stablehlo.reshape"):
        src = op.operands[0]
        if _shape(src) == slot_shape:
            if op.name == "stablehlo.reshape":
                return src
            dims = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
            if dims == list(range(1, len(slot_shape) + 1)):
                return src
    return None


def _elements(v) -> int:
    n = 1
    for d in _shape(v):
        n *= d
    return n


def _zero_tail(indices) -> bool:
    return all(_const_int(i) == 0 for i in indices)


@dataclasses.dataclass
class Stacked:
    """A forward carry that stacks one value per iteration."""
    carry: int
    value: ir.Value     # the per-iteration value in the forward body
    index: ir.Value     # the slot index it is written at
    dus: object         # the dynamic_update_slice op


@dataclasses.dataclass
class ForwardLoop:
    op: object
    body: object
    counter: int | None
    invariant: set
    stacked: dict       # carry -> Stacked

    def value_to_carry(self) -> dict:
        return {s.value: k for k, s in self.stacked.items()}


def analyse_forward(w) -> ForwardLoop | None:
    """The scan structure of a while: counter, invariant carries, stacked buffers."""
    w = w.operation
    if w.name != WHILE or len(w.regions) != 2:
        return None
    body = w.regions[1].blocks[0]
    ret = list(body.operations)[-1].operation
    args = list(body.arguments)
    counter, invariant, stacked = None, set(), {}
    for k, (a, r) in enumerate(zip(args, ret.operands)):
        if r == a:
            invariant.add(k)
            continue
        op = _owner(r)
        if op is None:
            continue
        if (op.name == "stablehlo.add" and op.operands[0] == a and _const_int(op.operands[1]) == 1
                and _const_int(w.operands[k]) is not None):
            counter = k
            continue
        if op.name != "stablehlo.dynamic_update_slice" or op.operands[0] != a:
            continue
        if len(list(a.uses)) != 1:
            continue
        buf_shape = _shape(a)
        update = op.operands[1]
        if not buf_shape or _shape(update) != [1] + buf_shape[1:]:
            continue
        if not _zero_tail(list(op.operands)[3:]):
            continue
        value = _unwrap_update(update, buf_shape[1:])
        if value is None:
            continue
        stacked[k] = Stacked(k, value, op.operands[2], op)
    if counter is None or not stacked:
        return None
    return ForwardLoop(w, body, counter, invariant, stacked)


@dataclasses.dataclass
class Read:
    """One slot read of a stacked buffer in the backward body."""
    slice_op: object
    reshape_op: object
    index: ir.Value

    @property
    def value(self):
        return self.reshape_op.results[0]


def _reads(arg, ret) -> list[Read] | None:
    """The slot reads of backward carry `arg`, or None if it is used otherwise."""
    reads = []
    for use in arg.uses:
        op = use.owner.operation
        if op == ret:
            continue
        if op.name != "stablehlo.dynamic_slice" or use.operand_number != 0:
            return None
        sizes = list(ir.DenseI64ArrayAttr(op.attributes["slice_sizes"]))
        if sizes != [1] + _shape(arg)[1:] or not _zero_tail(list(op.operands)[2:]):
            return None
        users = [u.owner.operation for u in op.results[0].uses]
        if len(users) != 1 or users[0].name != "stablehlo.reshape":
            return None
        reads.append(Read(op, users[0], op.operands[1]))
    return reads


@dataclasses.dataclass
class Pair:
    fwd: ForwardLoop
    bwd: object
    links: dict          # backward carry -> forward carry (stacked buffers)
    reads: dict          # backward carry -> [Read]


def _through_reshapes(v):
    """The source of a reshape chain that ends in v's own type (unrolled scans reshape
    their stacks [N/k, k, ...] -> [N, ...] -> [N/k, k, ...] between the loops)."""
    src = v
    while _owner(src) is not None and _owner(src).name == "stablehlo.reshape":
        src = _owner(src).operands[0]
    return src if src.type == v.type else v


def find_pairs(block) -> list[Pair]:
    """Forward/backward scan pairs among the top-level ops of `block`."""
    whiles = [op.operation for op in block.operations if op.operation.name == WHILE]
    pairs = []
    for fw in whiles:
        loop = analyse_forward(fw)
        if loop is None:
            continue
        results = {r: k for k, r in enumerate(fw.results) if k in loop.stacked}
        for bw in whiles:
            if bw == fw:
                continue
            links, reads = {}, {}
            body = bw.regions[1].blocks[0]
            ret = list(body.operations)[-1].operation
            for m, init in enumerate(bw.operands):
                k = results.get(_through_reshapes(init))
                if k is None or ret.operands[m] != body.arguments[m]:
                    continue
                r = _reads(body.arguments[m], ret)
                if r is None:
                    continue
                links[m], reads[m] = k, r
            if links:
                pairs.append(Pair(loop, bw, links, reads))
    return pairs


def offloaded(while_op, result_number: int):
    """The Offloadable placement ("src:dst") of a stacked result of a forward scan loop."""
    u = stacked_value(while_op, result_number)
    if isinstance(u, ir.OpResult) and graph.OFFLOAD_ATTR in u.owner.attributes:
        return ir.StringAttr(u.owner.attributes[graph.OFFLOAD_ATTR]).value
    return None


def stacked_value(while_op, result_number: int):
    """The per-iteration value behind result `result_number` of a forward scan loop."""
    loop = analyse_forward(while_op)
    if loop is None or result_number not in loop.stacked:
        return None
    return loop.stacked[result_number].value


def unrolled_parts(v):
    """For `concatenate` (dim 0) of `[1, ...]`-wrapped values (how JAX stacks the sub-steps of
    an unrolled scan step), the wrapped values; else None."""
    op = _owner(v)
    if op is None or op.name != "stablehlo.concatenate" or \
            ir.IntegerAttr(op.attributes["dimension"]).value != 0:
        return None
    slot = _shape(v)[1:]
    parts = [_unwrap_update(u, slot) for u in op.operands]
    return None if any(p is None for p in parts) else parts


def value_verdict(v, op_verdict):
    """The per-iteration verdict for forward value `v` (op_verdict: op -> verdict).

    A result of a nested forward scan loop that stacks an op's value takes the
    verdict of that value (JAX applies the policy inside nested scans too); one
    that stacks an inner carry-in is the inner loop's own business (the policy's
    verdict on the loop op: most policies recompute it whole).
    """
    op = v.owner.operation
    if graph.is_side_effecting(op):
        return Saveable
    parts = unrolled_parts(v)
    if parts is not None:   # the block of an unrolled scan step: one value per sub-step
        verdicts = [Saveable if isinstance(u, ir.BlockArgument) else value_verdict(u, op_verdict)
                    for u in parts]
        kept = [x for x in verdicts if x is not Recompute]
        return kept[0] if kept else Recompute
    if op.name in ("stablehlo.broadcast_in_dim", "stablehlo.reshape") and \
            _elements(op.operands[0]) == _elements(v) and v.uses and \
            all(u.owner.operation.name == "stablehlo.concatenate" for u in v.uses):
        # wraps one sub-step of an unrolled scan step: scan machinery, not a computation
        src = op.operands[0]
        return Saveable if isinstance(src, ir.BlockArgument) else value_verdict(src, op_verdict)
    if op.name == WHILE:
        u = stacked_value(op, v.result_number)
        if isinstance(u, ir.OpResult):
            return value_verdict(u, op_verdict)
    return op_verdict(op)


# ------------------------------------------------------------ loop surgery --
class _LoopEdit:
    """Carries to add to / drop from one while; applied by rebuilding the op."""

    def __init__(self, w):
        self.op = w
        self.cond = w.regions[0].blocks[0]
        self.body = w.regions[1].blocks[0]
        self.inits = list(w.operands)

    @property
    def ret(self):
        return list(self.body.operations)[-1].operation

    def add(self, init, loc, returned=None):
        """A new carry with initial value `init`; the body returns `returned` (default:
        the carry itself, a pass-through). Returns the body's block argument."""
        self.cond.add_argument(init.type, loc)
        arg = self.body.add_argument(init.type, loc)
        self.inits.append(init)
        self._set_return(list(self.ret.operands) + [returned if returned is not None else arg])
        return arg

    def set_returned(self, k, value):
        ops = list(self.ret.operands)
        ops[k] = value
        self._set_return(ops)

    def _set_return(self, operands):
        old = self.ret
        ir.Operation.create("stablehlo.return", operands=operands, loc=old.location,
                            ip=ir.InsertionPoint(old))
        old.erase()

    def drop(self, keep):
        """Remove every carry k not in `keep` (their block args must be unused)."""
        drop = [k for k in range(len(self.inits)) if k not in keep]
        ops = list(self.ret.operands)
        self._set_return([v for k, v in enumerate(ops) if k in keep])
        for k in reversed(drop):
            self.cond.erase_argument(k)
            self.body.erase_argument(k)
        self.inits = [v for k, v in enumerate(self.inits) if k in keep]

    def rebuild(self, result_map):
        """Create the new while; `result_map[k]` is the new index of old result k (or None)."""
        old = self.op
        new = ir.Operation.create(WHILE, results=[v.type for v in self.inits],
                                  operands=self.inits, regions=2, loc=old.location,
                                  ip=ir.InsertionPoint(old))
        for name in ("mhlo.frontend_attributes",):
            if name in old.attributes:
                new.attributes[name] = old.attributes[name]
        self.cond.append_to(new.regions[0])
        self.body.append_to(new.regions[1])
        for k, r in enumerate(old.results):
            j = result_map.get(k)
            if j is not None:
                r.replace_all_uses_with(new.results[j])
        old.erase()
        self.op = new
        return new


def _dce_block(block):
    """Erase pure ops of `block` left without uses (reverse sweep)."""
    for op in reversed([o.operation for o in block.operations][:-1]):
        if any(next(iter(r.uses), None) is not None for r in op.results):
            continue
        if graph.is_side_effecting(op):
            continue
        op.erase()


def _first_user(value, block):
    """The first top-level op of `block` that reads `value` (possibly nested)."""
    users = {graph.top_level_id(u.owner, block) for u in value.uses}
    for op in block.operations:
        if op_id(op) in users:
            return op.operation
    return None


# ------------------------------------------------------------ the rewrite --
class _PairRewrite:
    """Apply the per-iteration policy to one pair (see the module docstring)."""

    def __init__(self, pair: Pair, verdict, mark_clone, next_group, stats):
        self.pair = pair
        self.fwd = pair.fwd
        self.verdict = verdict          # value -> Saveable/Offloadable/Recompute
        self.mark_clone = mark_clone    # clone -> None (marks it with the current group)
        self.next_group = next_group    # () -> None (starts a new recompute group)
        self.stats = stats
        self.fedit = _LoopEdit(self.fwd.op)
        self.bedit = _LoopEdit(pair.bwd)
        fbody = self.fwd.body
        self.fargs = list(fbody.arguments)
        self.buffer_of = self.fwd.value_to_carry()       # forward value -> forward carry
        self.bcarry_of = {k: m for m, k in pair.links.items()}
        self.slot_index = {s.index for s in self.fwd.stacked.values()}
        self.threaded = {}      # forward invariant carry -> backward block arg
        self.memo = {}          # (forward value, backward index) -> backward value
        self.op_clones = {}     # (forward op id, backward index) -> its clone
        self.new_buffers = {}   # forward value -> (forward carry, backward carry)
        self._free = {}
        self.loc = self.fwd.op.location

    # --- what a forward value is made of
    def _in_fwd(self, v) -> bool:
        """Is v defined inside the forward loop (its body or deeper)?"""
        op = v.owner.owner if isinstance(v, ir.BlockArgument) else v.owner.operation
        target = op_id(self.fwd.op)
        while op is not None:
            if op_id(op) == target:
                return True
            op = op.parent
        return False

    def _is_free(self, v) -> bool:
        """Available in the backward body without being stacked: computed from constants,
        loop invariants and the slot index alone, where anything that depends on the index
        only moves data (the slice of a scanned-over array, as JAX forwards `xs`)."""
        return self._free_kind(v) is not None

    def _slices_invariant(self, v) -> bool:
        """A slice of a loop invariant (dynamic_slice/slice/reshape only): what JAX's scan
        emits to take the iteration's slice of a scanned-over array."""
        if not self._in_fwd(v):
            return True
        if isinstance(v, ir.BlockArgument):
            return v.owner == self.fwd.body and v.arg_number in self.fwd.invariant
        op = v.owner.operation
        return op.name in ("stablehlo.dynamic_slice", "stablehlo.slice", "stablehlo.reshape") \
            and self._slices_invariant(op.operands[0])

    def _free_kind(self, v):
        """None (needs iteration data), "invariant" or "indexed"."""
        if v in self._free:
            return self._free[v]
        if not self._in_fwd(v):
            kind = "invariant"
        elif v in self.slot_index:
            kind = "indexed"
        elif isinstance(v, ir.BlockArgument):
            kind = "invariant" if (v.owner == self.fwd.body
                                   and v.arg_number in self.fwd.invariant) else None
        else:
            op = v.owner.operation
            kinds = [self._free_kind(u) for u in graph.read_values(op)]
            if graph.is_side_effecting(op) or None in kinds:
                kind = None
            elif "indexed" in kinds:
                kind = "indexed" if _moves_data(op) else None
            else:
                kind = "invariant"
        self._free[v] = kind
        return kind

    def _mark_offload(self, v):
        """Record an Offloadable verdict on the producer (annotate-host-offload reads it)."""
        if isinstance(v, ir.BlockArgument):
            return
        verdict = self.verdict(v)
        if isinstance(verdict, Offloadable):
            v.owner.attributes[graph.OFFLOAD_ATTR] = ir.StringAttr.get(
                f"{verdict.src}:{verdict.dst}")

    def _must_stack(self, v) -> bool:
        if isinstance(v, ir.BlockArgument):
            return True      # a carry-in: an input of the iteration
        return self.verdict(v) is not Recompute

    # --- serving the backward body
    def run(self) -> bool:
        pair = self.pair
        bbody = pair.bwd.regions[1].blocks[0]
        order = {op_id(op): n for n, op in enumerate(bbody.operations)}
        self.part_of = {}
        for m, k in pair.links.items():
            value = self.fwd.stacked[k].value
            self._mark_offload(value)
            parts = unrolled_parts(value)
            if parts is not None and self._must_stack(value):
                for j, u in enumerate(parts):
                    self.part_of.setdefault(u, (value, j))
        jobs = []
        for m, reads in pair.reads.items():
            value = self.fwd.stacked[pair.links[m]].value
            if self._must_stack(value):
                continue
            for rd in reads:
                first = _first_user(rd.value, bbody)
                if first is not None:
                    jobs.append((order[op_id(first)], rd, value))
        if not jobs:
            return False
        # The pair is rewritten: like JAX, which forwards the scanned-over arrays instead of
        # stacking their slices, re-slice stacked values that only move data of invariants.
        for m, reads in pair.reads.items():
            value = self.fwd.stacked[pair.links[m]].value
            if self._must_stack(value) and self._free_kind(value) == "indexed" \
                    and self._slices_invariant(value):
                for rd in reads:
                    first = _first_user(rd.value, bbody)
                    if first is not None:
                        jobs.append((order[op_id(first)], rd, value))
        for _, rd, value in sorted(jobs, key=lambda j: j[0]):
            self.next_group()   # one recompute group per backward consumer
            new = self._get(value, rd.index, _first_user(rd.value, bbody))
            if new != rd.value:
                rd.value.replace_all_uses_with(new)
                self.stats["recomputed"] += 1
        _dce_block(bbody)
        self._finish()
        return True

    def _get(self, v, index, before):
        key = (v, index)
        if key not in self.memo:
            self.memo[key] = self._compute(v, index, before)
        return self.memo[key]

    def _compute(self, v, index, before):
        if v in self.slot_index:
            return index
        if not self._in_fwd(v):
            return v     # defined before the loop: visible in both loops
        if isinstance(v, ir.BlockArgument) and v.owner == self.fwd.body \
                and v.arg_number in self.fwd.invariant:
            return self._thread(v.arg_number)
        if v in self.part_of:   # one sub-step of a stacked unrolled block: slice it
            block_value, j = self.part_of[v]
            return self._slice_part(self._get(block_value, index, before), j, before, v.type)
        if not self._is_free(v) and self._must_stack(v):
            return self._stacked_read(v, index, before)
        op = v.owner.operation
        key = (op_id(op), index)
        if key not in self.op_clones:   # one clone per op (a while has many results)
            new_values = {u: self._get(u, index, before)
                          for u in graph.read_values(op) if self._in_fwd(u)}
            saved = self._saved_stacks(op, index, before) if op.name == WHILE else {}
            clone = op.clone(ip=ir.InsertionPoint(before))
            for old, new in new_values.items():
                if new != old:
                    graph.replace_reads(clone, old, new)
            self.mark_clone(clone)
            if saved:
                clone = self._reuse_saved_stacks(clone, saved)
            self.op_clones[key] = clone
        return self.op_clones[key].results[v.result_number]

    def _saved_stacks(self, op, index, before) -> dict:
        """For a nested forward scan loop: {result k: its stack as the backward body reads
        it} for each stacked value the policy saves."""
        loop = analyse_forward(op)
        if loop is None:
            return {}
        return {k: self._get(op.results[k], index, before) for k, st in loop.stacked.items()
                if isinstance(st.value, ir.OpResult) and self._must_stack(st.value)}

    def _reuse_saved_stacks(self, clone, outer: dict):
        """A nested forward scan loop recomputed in the backward body: its stacked values
        that the policy saves come from the outer forward's stacks (`outer`); the clone
        reads them back per inner iteration instead of computing them again."""
        saved = list(outer)
        new_loop = analyse_forward(clone)
        edit = _LoopEdit(clone)
        for k in saved:
            st = new_loop.stacked[k]
            arg = edit.add(outer[k], clone.location)
            u = st.value
            read = _read_slot(arg, st.index, u.owner.operation, u.type)
            for use in list(u.uses):
                if use.owner.operation != read.owner.operation:
                    use.owner.operands[use.operand_number] = read
            edit.set_returned(k, new_loop.body.arguments[k])   # no need to stack it again
        _dce_block(new_loop.body)
        return edit.rebuild({k: k for k in range(len(clone.results))})

    @staticmethod
    def _slice_part(block_value, j, before, value_type):
        t = ir.RankedTensorType(block_value.type)
        shape = list(t.shape)
        ip = ir.InsertionPoint(before)
        sliced = ir.Operation.create(
            "stablehlo.slice", results=[ir.RankedTensorType.get([1] + shape[1:], t.element_type)],
            operands=[block_value],
            attributes={"start_indices": ir.DenseI64ArrayAttr.get([j] + [0] * (len(shape) - 1)),
                        "limit_indices": ir.DenseI64ArrayAttr.get([j + 1] + shape[1:]),
                        "strides": ir.DenseI64ArrayAttr.get([1] * len(shape))}, ip=ip)
        return ir.Operation.create("stablehlo.reshape", results=[value_type],
                                   operands=[sliced.results[0]], ip=ip).results[0]

    def _thread(self, k):
        """The backward body's view of forward invariant carry k."""
        if k in self.threaded:
            return self.threaded[k]
        init = self.fwd.op.operands[k]
        bw = self.pair.bwd
        bbody = bw.regions[1].blocks[0]
        bret = list(bbody.operations)[-1].operation
        for m, binit in enumerate(bw.operands):
            if binit == init and bret.operands[m] == bbody.arguments[m]:
                self.threaded[k] = bbody.arguments[m]
                return bbody.arguments[m]
        arg = self.bedit.add(init, self.loc)
        self.threaded[k] = arg
        return arg

    def _stacked_read(self, v, index, before):
        """Read forward value v at `index`, stacking it if no buffer holds it yet."""
        bbody = self.pair.bwd.regions[1].blocks[0]
        k = self.buffer_of.get(v)
        if k is None:
            arg = self._new_buffer(v)
        elif k in self.bcarry_of:
            m = self.bcarry_of[k]
            for rd in self.pair.reads.get(m, []):
                if rd.index == index and rd.reshape_op.is_before_in_block(before):
                    return rd.value
            arg = bbody.arguments[m]
        else:   # stacked by the forward loop, not read by this backward loop yet
            arg = self.bedit.add(self.fwd.op.results[k], self.loc)
            self.bcarry_of[k] = len(self.bedit.inits) - 1
        return _read_slot(arg, index, before, v.type)

    def _new_buffer(self, v):
        zero = _stack_value(self.fwd, self.fedit, v)
        k = len(self.fedit.inits) - 1
        self.buffer_of[v] = k
        self._mark_offload(v)
        self.stats["stacked"] += 1
        # The backward loop takes the buffer as a pass-through carry; its init is
        # the new forward result, patched in when the forward loop is rebuilt.
        barg = self.bedit.add(zero, self.loc)
        self.new_buffers[v] = (k, len(self.bedit.inits) - 1)
        return barg

    # --- rebuild both loops
    def _finish(self):
        pair, fwd = self.pair, self.fwd
        bw = pair.bwd
        bbody = bw.regions[1].blocks[0]
        # Backward: drop stacked carries nothing reads any more.
        bkeep = []
        for m, arg in enumerate(bbody.arguments):
            uses = [u for u in arg.uses if u.owner != self.bedit.ret]
            if m in pair.links and not uses and m < len(bw.operands):
                continue
            bkeep.append(m)
        dropped_inits = [v for m, v in enumerate(self.bedit.inits) if m not in bkeep]
        self.bedit.drop(set(bkeep))
        bmap = {old: new for new, old in enumerate(bkeep)}
        new_bw = self.bedit.rebuild({m: bmap[m] for m in range(len(bw.results)) if m in bmap})
        for v in dropped_inits:   # reshape chains between the loops
            while _owner(v) is not None and _owner(v).name == "stablehlo.reshape" \
                    and next(iter(v.uses), None) is None:
                op = _owner(v)
                v = op.operands[0]
                op.erase()
        # Forward: new buffers feed the new backward carries.
        fw_old = fwd.op
        n_old = len(fw_old.results)
        fkeep = [k for k in range(len(self.fedit.inits))
                 if not (k < n_old and k in fwd.stacked
                         and next(iter(fw_old.results[k].uses), None) is None)]
        # Erase the dropped buffers' updates so their block args lose their uses.
        for k in range(len(self.fedit.inits)):
            if k not in fkeep:
                self.fedit.set_returned(k, self.fargs[k])
        _dce_block(fwd.body)
        self.fedit.drop(set(fkeep))
        fmap = {old: new for new, old in enumerate(fkeep)}
        new_fw = self.fedit.rebuild({k: fmap[k] for k in range(n_old) if k in fmap})
        for v, (k, m) in self.new_buffers.items():
            new_bw.operands[bmap[m]] = new_fw.results[fmap[k]]
        self.pair.fwd.op = new_fw
        self.pair.bwd = new_bw


_MOVEMENT = {"stablehlo.dynamic_slice", "stablehlo.slice", "stablehlo.reshape",
             "stablehlo.broadcast_in_dim", "stablehlo.transpose", "stablehlo.convert"}
_INDEX_ARITHMETIC = {"stablehlo.add", "stablehlo.subtract", "stablehlo.multiply",
                     "stablehlo.compare", "stablehlo.select", "stablehlo.convert",
                     "stablehlo.clamp", "stablehlo.negate"}


def _moves_data(op) -> bool:
    """Cheap to redo per iteration: data movement, or arithmetic on scalar indices."""
    if op.name in _MOVEMENT:
        return True
    return op.name in _INDEX_ARITHMETIC and all(
        not list(ir.RankedTensorType(r.type).shape) for r in op.results)


def _read_slot(arg, index, before, value_type):
    """dynamic_slice one `[1, ...]` slot of stacked `arg` at `index`, reshaped to
    `value_type`, right before op `before`."""
    t = ir.RankedTensorType(arg.type)
    slot = list(t.shape)[1:]
    ip = ir.InsertionPoint(before)
    zeros = [_int_const(index.type, 0, ip) for _ in slot]
    one_type = ir.RankedTensorType.get([1] + slot, t.element_type)
    ds = ir.Operation.create(
        "stablehlo.dynamic_slice", results=[one_type], operands=[arg, index] + zeros,
        attributes={"slice_sizes": ir.DenseI64ArrayAttr.get([1] + slot)}, ip=ip)
    return ir.Operation.create("stablehlo.reshape", results=[value_type],
                               operands=[ds.results[0]], ip=ip).results[0]


def _stack_value(loop: ForwardLoop, edit: _LoopEdit, v):
    """Add a buffer to forward loop `loop` (through `edit`) that stacks body value `v` at
    the loop's slot index; returns the buffer's initial value (zeros, before the loop)."""
    ftype = ir.RankedTensorType(v.type)
    n = _shape(loop.op.results[next(iter(loop.stacked))])[0]
    stacked_type = ir.RankedTensorType.get([n] + list(ftype.shape), ftype.element_type)
    zero = ir.Operation.create(
        "stablehlo.constant", results=[stacked_type],
        attributes={"value": ir.DenseElementsAttr.get_splat(
            stacked_type, _zero_attr(ftype.element_type))},
        ip=ir.InsertionPoint(loop.op)).results[0]
    ref = next(iter(loop.stacked.values()))
    arg = edit.add(zero, loop.op.location)
    ip = ir.InsertionPoint(edit.ret)
    one_type = ir.RankedTensorType.get([1] + list(ftype.shape), ftype.element_type)
    upd = ir.Operation.create("stablehlo.reshape", results=[one_type], operands=[v],
                              ip=ip).results[0]
    zeros = [_int_const(ref.index.type, 0, ip) for _ in ftype.shape]
    dus = ir.Operation.create("stablehlo.dynamic_update_slice", results=[stacked_type],
                              operands=[arg, upd, ref.index] + zeros, ip=ip)
    edit.set_returned(len(edit.inits) - 1, dus.results[0])
    return zero


def _inner_saved(loop: ForwardLoop, verdict) -> list:
    """Values of a nested forward loop's body that the policy saves and that its
    backward needs through recomputation: what JAX's forward stacks per inner iteration."""
    body_ops = {op_id(op) for op in loop.body.operations}
    ret = list(loop.body.operations)[-1].operation
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
    return out


def prestack_nested(pair: Pair, verdict) -> bool:
    """Make each forward scan loop nested in `pair`'s forward body also stack the inner
    values the policy saves (see `_inner_saved`), so that the outer forward can save
    them [outer, inner, ...] and a recomputation of the inner loop reads them back."""
    changed = False
    for op in list(pair.fwd.body.operations):
        loop = analyse_forward(op)
        if loop is None:
            continue
        stacked = {s.value for s in loop.stacked.values()}
        new = [v for v in _inner_saved(loop, verdict) if v not in stacked]
        if not new:
            continue
        edit = _LoopEdit(loop.op)
        with loop.op.location:
            for v in new:
                _stack_value(loop, edit, v)
        edit.rebuild({k: k for k in range(len(loop.op.results))})
        changed = True
    return changed


def _zero_attr(elem):
    if isinstance(elem, ir.IntegerType) or str(elem).startswith(("i", "ui")):
        return ir.IntegerAttr.get(elem, 0)
    return ir.FloatAttr.get(elem, 0.0)


def _int_const(t, value, ip):
    attr = ir.DenseElementsAttr.get_splat(ir.RankedTensorType(t),
                                          ir.IntegerAttr.get(ir.RankedTensorType(t).element_type,
                                                             value))
    return ir.Operation.create("stablehlo.constant", results=[t], attributes={"value": attr},
                               ip=ip).results[0]


def rewrite_pairs(block, verdict, mark_clone, next_group, stats=None) -> dict:
    """Apply the per-iteration policy to every scan pair in `block` (and nested ones).

    Returns stats: pairs rewritten, slot reads replaced by recomputation, buffers added.
    """
    stats = stats if stats is not None else {"pairs": 0, "recomputed": 0, "stacked": 0}
    done = set()
    while True:
        pairs = [p for p in find_pairs(block)
                 if (op_id(p.fwd.op), op_id(p.bwd)) not in done]
        if not pairs:
            break
        p = pairs[0]
        with p.fwd.op.location:
            if prestack_nested(p, verdict):
                continue    # the nested loops were rebuilt: find the pairs again
        stats["pairs"] += 1
        with p.fwd.op.location:   # the default location (and context) of new ops and types
            changed = _PairRewrite(p, verdict, mark_clone, next_group, stats).run()
        done.add((op_id(p.fwd.op), op_id(p.bwd)))
        if changed:
            rewrite_pairs(p.bwd.regions[1].blocks[0], verdict, mark_clone, next_group, stats)
    return stats
