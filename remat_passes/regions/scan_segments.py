"""Segmenting a scan loop pair: keep one carry per k iterations, not one residual per iteration.

A forward scan loop stacks what the backward loop reads, one slot per iteration
(`scan_pairs`). `segment` rewrites the pair so that

* the forward loop writes, instead of those stacks, its carry state at the start of
  every k-th iteration into a buffer of ceil(n/k) (+1 scratch slot) entries;
* the backward loop, when it reaches the last slot of a segment (it visits the slots
  in reverse), runs an inner while over that segment's forward iterations (a copy of
  the forward body, from the saved carry) that fills segment buffers of k slots; every
  read of a stack in the backward body reads the segment buffer instead.

This is the two-level scheme one writes by hand with `jax.checkpoint` around an outer
scan of inner scans: n residual slots become ceil(n/k) carries + k residual slots, for
one more run of the forward body per iteration. A trip count k does not divide ends in
a shorter last segment. The forward body's own per-iteration policy still decides what
a slot holds (the rewrite runs after remat-partial-eval). With more levels (k1 x k2 x ...),
a segment is rerun first only to save its carry every k2 iterations, then each
sub-segment into the slots. In split form the pair spans <f>_fwd and <f>_bwd
(`find_split_pairs`) and `Crossing` carries what the backward now needs across. A scan in
a shard_map body pairs across the VJP's two manual computations (`manual_crossing`).

`check(pair, k)` gives the pair as `segment` needs it (`Segmentable`), or why it cannot be
segmented; `segment` does it and says what it did (`Segmented`).
"""
from __future__ import annotations

import dataclasses

from remat_passes.analysis import scan_pairs
from remat_passes.analysis.scan_pairs import WHILE, Pair, const_int, owner
from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import func, ir, op_id
from remat_passes.sharding import gspmd
from remat_passes.regions.loop_edit import LoopEdit, drop_unused_carries, int_const, zeros


# ----------------------------------------------------------------- checks --
def _counter(w):
    """(carry index, trip count) of a while counting 0, 1, ... while `i < n` (n constant),
    else None."""
    body = w.regions[1].blocks[0]
    cond = w.regions[0].blocks[0]
    ret = graph.terminator(body)
    test = owner(graph.terminator(cond).operands[0])
    if test is None or test.name != "stablehlo.compare" or \
            "LT" not in str(test.attributes["comparison_direction"]):
        return None
    for k, (a, r) in enumerate(zip(body.arguments, ret.operands)):
        op = owner(r)
        if op is None or op.name != "stablehlo.add" or op.operands[0] != a or \
                const_int(op.operands[1]) != 1 or const_int(w.operands[k]) != 0:
            continue
        if test.operands[0] == cond.arguments[k] and const_int(test.operands[1]) is not None:
            return k, const_int(test.operands[1])
    return None


def _reverse_slot(s, t, n) -> bool:
    """Is `s` the slot n-1-t (`(n - t) - 1` or `(n-1) - t`)?"""
    op = owner(s)
    if op is None or op.name != "stablehlo.subtract":
        return False
    a, b = op.operands
    if b == t:
        return const_int(a) == n - 1
    inner = owner(a)
    return (const_int(b) == 1 and inner is not None and inner.name == "stablehlo.subtract"
            and const_int(inner.operands[0]) == n and inner.operands[1] == t)


def _lengths(n: int) -> list[int]:
    """The segment lengths worth trying for n iterations: ceil(n/q) for every count q of
    segments. Any other length k keeps as many segments as ceil(n/ceil(n/k)) <= k does, in
    longer segments, so it is never better. O(sqrt(n)) of them, shortest first."""
    root = int(n ** 0.5) + 1
    return sorted({k for k in range(1, min(root, n - 1) + 1)}
                  | {-(-n // q) for q in range(2, root + 1) if -(-n // q) < n})


def least_bytes_k(n: int, carry_bytes: int, slot_bytes: int) -> int:
    """The segment length that keeps the fewest bytes: (ceil(n/k) + 1) saved carries plus k
    slots, about sqrt(n * carry / slot); the shortest of equals."""
    return min(_lengths(n),
               key=lambda k: ((-(-n // k) + 1) * carry_bytes + k * slot_bytes, k))


def least_bytes_levels(n: int, carry_bytes: int, slot_bytes: int) -> list:
    """Three levels (segments, sub-segments) that keep the fewest bytes: (ceil(n/k1) + 1) +
    (ceil(k1/k2) + 1) carries plus k2 slots. (What a segment of k1 keeps grows with k1, so
    the lengths of `_lengths` are again the only ones worth trying.)"""
    best = None
    for k1 in _lengths(n):
        if k1 < 2:
            continue
        k2 = least_bytes_k(k1, carry_bytes, slot_bytes)
        cost = ((-(-n // k1) + 1) + (-(-k1 // k2) + 1)) * carry_bytes + k2 * slot_bytes
        if best is None or cost < best[0]:
            best = (cost, [k1, k2])
    return best[1] if best else [1]


@dataclasses.dataclass
class Segmentable:
    pair: Pair
    links: dict          # the backward carries it replaces -> their forward stacks
    levels: list         # iterations per segment, then per sub-segment, ... (decreasing)
    n: int               # trip count of both loops
    counter: int         # the forward loop's counter carry
    t: ir.Value          # the backward loop's counter (it runs forward iteration n-1-t)
    state: list          # forward carries that are neither invariant, counter nor stacks
    constants: list      # constants defined outside the forward loop that its body reads


def check(pair: Pair, k, split: bool = False) -> Segmentable | str:
    """The pair as `segment` needs it, or why it cannot segment it; `k` is a segment length
    or "sqrt" (`least_bytes_k` of this loop). The forward loop writes
    iteration i's slot at i (a scan) or n-1-i (a reverse scan); the backward loop's step t
    must read the slot of forward iteration n-1-t."""
    fwd, bwd = pair.fwd, pair.bwd
    counted = _counter(fwd.op)
    if counted is None:
        return "its forward loop does not count 0, 1, ... up to a constant"
    counter, n = counted
    if n != fwd.trip_count:
        return "its forward loop's trip count differs from its stacks' length"
    state = [c for c in range(len(fwd.op.operands))
             if c not in fwd.invariant and c != counter and c not in fwd.stacked]
    # the stacks only the backward loop reads; one the function also reads elsewhere (a
    # per-iteration output, say) stays whole, and the backward reads it as before
    links = {m: c for m, c in pair.links.items()
             if len(list(fwd.op.results[c].uses)) == 1 and len(list(bwd.operands[m].uses)) == 1
             and (split or gspmd.round_trip_source(bwd.operands[m]) == fwd.op.results[c])
             and next(iter(bwd.results[m].uses), None) is None}
    if not links:
        return "its stacks reach the backward loop through reshapes or have other readers"
    if k in ("sqrt", "cbrt"):
        if n < (2 if k == "sqrt" else 3):
            return f"a trip count of {n} has no {'sub-' if k == 'cbrt' else ''}segments"
        sizes = (sum(graph.type_bytes(fwd.op.operands[c].type) for c in state),
                 sum(graph.type_bytes(fwd.stacked[c].value.type) for c in links.values()))
        k = least_bytes_k(n, *sizes) if k == "sqrt" else least_bytes_levels(n, *sizes)
    levels = list(k) if isinstance(k, (list, tuple)) else [k]
    if not 1 <= levels[0] < n:
        return f"segments={levels[0]} is not less than the trip count {n}"
    if any(not 1 <= b < a for a, b in zip(levels, levels[1:])):
        return f"segments={'x'.join(map(str, levels))}: each level must be shorter than the one before"
    back = _counter(bwd)
    if back is None or back[1] != n:
        return "its backward loop does not count 0, 1, ... up to the same trip count"
    t = bwd.regions[1].blocks[0].arguments[back[0]]
    i = fwd.body.arguments[counter]
    for m, c in links.items():
        index = fwd.stacked[c].index
        if index == i:
            ok = all(_reverse_slot(rd.index, t, n) for rd in pair.reads[m])
        elif _reverse_slot(index, i, n):
            ok = all(rd.index == t for rd in pair.reads[m])
        else:
            return "the forward loop writes a stack at a slot other than i or n-1-i"
        if not ok:
            return "the backward loop does not read forward iteration n-1-t in its step t"
    constants = []
    for op in graph.nested_ops(fwd.body):
        for v in op.operands:
            src = owner(v)
            if isinstance(v, ir.BlockArgument):
                if not scan_pairs.inside(v.owner.owner, fwd.op):
                    return "the forward loop's body reads an argument of the function directly"
            elif not scan_pairs.inside(src, fwd.op):
                if src.name != "stablehlo.constant":
                    return "the forward loop's body reads a value from outside the loop"
                if not any(v == c for c in constants):
                    constants.append(v)
    return Segmentable(pair, links, levels, n, counter, t, state, constants)


# ---------------------------------------------------------------- builders --
def new_op(name, operands, result_type, ip, **attrs):
    return ir.Operation.create(name, results=[result_type], operands=list(operands),
                               attributes=attrs, ip=ip).results[0]


def _arith(name, a, b, ip):
    return new_op(f"stablehlo.{name}", [a, b], a.type, ip)


def _compare(direction, a, b, ip):
    i1 = ir.RankedTensorType.get([], ir.IntegerType.get_signless(1))
    return new_op("stablehlo.compare", [a, b], i1, ip, comparison_direction=ir.Attribute.parse(
        f"#stablehlo<comparison_direction {direction}>"))


def _select(pred, a, b, ip):
    return new_op("stablehlo.select", [pred, a, b], a.type, ip)


def _stack_type(n, value_type):
    t = ir.RankedTensorType(value_type)
    return ir.RankedTensorType.get([n] + list(t.shape), t.element_type)


def _every_kth_slot(i, k, scratch, ip):
    """Where iteration `i` (counted from a segment's start) writes its carry: slot i/k when
    i % k == 0, else the scratch slot `scratch` (so the loop needs no branch)."""
    ck = int_const(i.type, k, ip)
    first = _compare("EQ", _arith("remainder", i, ck, ip), int_const(i.type, 0, ip), ip)
    return _select(first, _arith("divide", i, ck, ip), int_const(i.type, scratch, ip), ip)


def _write(buf, value, index, ip):
    """dynamic_update_slice of `value` into slot `index` of `buf`."""
    t = ir.RankedTensorType(value.type)
    one = new_op("stablehlo.reshape", [value], _stack_type(1, value.type), ip)
    rest = [int_const(index.type, 0, ip) for _ in t.shape]     # (the other dimensions)
    return new_op("stablehlo.dynamic_update_slice", [buf, one, index] + rest, buf.type, ip)


def _read(buf, index, value_type, ip):
    t = ir.RankedTensorType(value_type)
    rest = [int_const(index.type, 0, ip) for _ in t.shape]
    one = new_op("stablehlo.dynamic_slice", [buf, index] + rest, _stack_type(1, value_type), ip,
                 slice_sizes=ir.DenseI64ArrayAttr.get([1] + list(t.shape)))
    return new_op("stablehlo.reshape", [one], value_type, ip)


def _slice_of(values, block) -> list:
    """The ops of `block` (in block order) that `values` depend on."""
    seen = set()
    work = [v for v in values if isinstance(v, ir.OpResult)]
    while work:
        op = work.pop().owner.operation
        if op_id(op) in seen:
            continue
        seen.add(op_id(op))
        work.extend(r for r in graph.read_values(op) if isinstance(r, ir.OpResult))
    return [op.operation for op in block.operations if op_id(op.operation) in seen]


# ----------------------------------------------------------------- rewrite --
def _rerun(seg, ip, loc, lo, hi, starts, inv_args, bufs, ops, fargs, invariant, fill):
    """An inner while, at `ip`, over forward iterations [lo, hi) from carry state `starts`:
    a copy of `ops` of the forward body per iteration, and `fill(args, j, lo, mapping, ip,
    buffers)` writing into the loop-carried `bufs`. Returns the buffers after the loop."""
    init = [lo, hi, lo] + starts + inv_args + bufs
    inner = ir.Operation.create(WHILE, results=[v.type for v in init], operands=init,
                                regions=2, loc=loc, ip=ip)
    cond = inner.regions[0].blocks.append(*[v.type for v in init])
    body = inner.regions[1].blocks.append(*[v.type for v in init])
    cip = ir.InsertionPoint(cond)
    ir.Operation.create("stablehlo.return", operands=[
        _compare("LT", cond.arguments[0], cond.arguments[1], cip)], ip=cip)
    a = list(body.arguments)
    j, j_hi, j_base = a[0], a[1], a[2]
    ns, ni = len(seg.state), len(invariant)
    mapping = {fargs[seg.counter]: j}
    mapping.update({fargs[c]: a[3 + q] for q, c in enumerate(seg.state)})
    mapping.update({fargs[c]: a[3 + ns + q] for q, c in enumerate(invariant)})
    bip = ir.InsertionPoint(body)
    for v in seg.constants:       # constants the body reads from outside the loop: copied
        mapping[v] = v.owner.clone(ip=bip).results[0]
    graph.clone_ops(ops, bip, mapping)
    filled = fill(a, j, j_base, mapping, bip, a[3 + ns + ni:])
    state_next = graph.terminator(fargs[0].owner).operands
    ir.Operation.create("stablehlo.return", operands=(
        [_arith("add", j, int_const(j.type, 1, bip), bip), j_hi, j_base]
        + [mapping.get(state_next[c], state_next[c]) for c in seg.state]
        + a[3 + ns:3 + ns + ni] + filled), ip=bip)
    return list(inner.results)[3 + ns + ni:]


@dataclasses.dataclass
class Segmented:
    """What one rewrite did: n iterations in segments of k; the stacks it removed and the
    saved carries and segment buffers it added (bytes), and the loop's source position."""
    n: int
    levels: list
    removed_bytes: int
    carry_bytes: int
    segment_bytes: int
    where: str
    crossing_bytes: int = 0   # the loop's invariants, now new results of a shard_map body

    @property
    def k(self) -> int:
        return self.levels[0]

    @property
    def delta_bytes(self) -> int:
        """What segmenting changed in the activations kept (negative: saved)."""
        return self.carry_bytes + self.segment_bytes + self.crossing_bytes - self.removed_bytes

    def text(self) -> str:
        spans = [self.n] + self.levels
        carries = " + ".join(f"{-(-a // b)}" for a, b in zip(spans, spans[1:]))
        inner = "".join(f", then {b}" for b in self.levels[1:])
        runs = "one more run" if len(self.levels) == 1 else f"{len(self.levels)} more runs"
        return (f"a scan loop of {self.n} iterations{self.where} runs in segments of {self.k}"
                f"{inner}: it keeps {carries} carries (+1 scratch each, "
                f"{self.carry_bytes:,} B) and {self.levels[-1]} slots ({self.segment_bytes:,} B) "
                f"instead of {self.n} slots ({self.removed_bytes:,} B), for {runs} of its body "
                "per iteration" + (f"; its invariants now leave the shard_map body too "
                                   f"({self.crossing_bytes:,} B)" if self.crossing_bytes else ""))


def segment(seg: Segmentable, crossing=None, offload: str | None = None) -> Segmented:
    """Rewrite the pair (see the module docstring). `seg` comes from `check`. In split form
    `crossing` (a `Crossing`) carries the values the backward loop now needs from <f>_fwd
    into <f>_bwd as residuals, and drops the stacks that crossed. `offload` (pinned_host or
    unpinned_host): each saved carry goes to that memory as the forward loop writes it into
    its buffer, and comes back to the device as the backward loop reads it, as JAX emits an
    offloaded residual inside a scan; in split form the buffers cross in that memory."""
    pair, n, k = seg.pair, seg.n, seg.levels[0]
    pos, _ = graph.source_position(pair.fwd.op)
    spans = [n] + seg.levels        # each level's carries: ceil(span / length) + 1
    if crossing is not None:
        scale, crossed = crossing.scale, crossing.residual_bytes
    else:       # (a GSPMD shard_map's stacks leave its region as global values)
        crossed = gspmd.global_bytes
        first = pair.fwd.op.results[next(iter(seg.links.values()))]
        factor = crossed(first) // max(graph.type_bytes(first.type), 1)

        def scale(v):
            return factor
    report = Segmented(
        n, list(seg.levels),
        sum(crossed(pair.fwd.op.results[c]) for c in seg.links.values()),
        sum(graph.type_bytes(_stack_type(-(-outer // inner) + 1, pair.fwd.op.operands[c].type))
            * scale(pair.fwd.op.operands[c])
            for outer, inner in zip(spans, spans[1:]) for c in seg.state),
        # (the slots, on the scale of the stack they replace)
        sum(graph.type_bytes(_stack_type(seg.levels[-1], pair.fwd.stacked[c].value.type))
            * crossed(pair.fwd.op.results[c])
            // max(graph.type_bytes(pair.fwd.op.results[c].type), 1)
            for c in seg.links.values()),
        f" at {pos}" if pos else "")
    fwd = pair.fwd
    m = -(-n // k)
    loc = fwd.op.location
    links = sorted(seg.links.items())                  # (backward carry, forward stack)
    values = {c: fwd.stacked[c].value for _, c in links}
    state_next = {c: graph.terminator(fwd.body).operands[c] for c in seg.state}

    # The forward loop: the carry state at the start of every k-th iteration, saved.
    fedit = LoopEdit(fwd.op)
    fargs = list(fedit.body.arguments)
    i = fargs[seg.counter]
    ip = ir.InsertionPoint(graph.terminator(fedit.body))
    slot = _every_kth_slot(i, k, m, ip)
    before_fwd = ir.InsertionPoint(fwd.op)
    for c in seg.state:
        init = zeros(_stack_type(m + 1, fargs[c].type), before_fwd)
        arg = fedit.add(init, loc)
        saved = fargs[c] if offload is None else \
            contract.annotate_placement(fargs[c], offload, ip, loc)
        fedit.set_returned(len(fedit.inits) - 1, _write(arg, saved, slot, ip))
    old_count = len(fwd.op.results)
    inner_ops = _slice_of(list(values.values()) + list(state_next.values()), fedit.body)

    # The backward loop: carries for the saved states (their initial values are the new
    # forward loop's results, set once it is rebuilt), the forward's invariants, the saved
    # states of the inner levels, and one segment buffer per stack.
    bedit = LoopEdit(pair.bwd)
    bbody = bedit.body
    before_bwd = ir.InsertionPoint(pair.bwd)
    placeholders = [zeros(v.type, before_bwd) for v in fedit.inits[old_count:]]
    saved_at = [len(bedit.inits) + q for q in range(len(placeholders))]
    saved_args = [bedit.add(v, loc) for v in placeholders]
    invariant = sorted(fwd.invariant)
    if crossing is None:
        inv_args = [bedit.add(fwd.op.operands[c], loc) for c in invariant]
    else:                     # (the forward's values reach the backward as residuals)
        report.crossing_bytes = crossing.new_bytes([fwd.op.operands[c] for c in invariant])
        inv_args = [bedit.add(crossing.bring(fwd.op.operands[c], before_bwd), loc)
                    for c in invariant]
    levels = seg.levels
    level_args = []           # per inner level: its saved states (carries of the loop)
    for outer, inner_k in zip(levels, levels[1:]):
        m_l = -(-outer // inner_k)
        level_args.append([bedit.add(zeros(_stack_type(m_l + 1, fargs[c].type), before_bwd),
                                     loc) for c in seg.state])
    seg_args = [bedit.add(zeros(_stack_type(levels[-1], values[c].type), before_bwd), loc)
                for _, c in links]
    reads = [rd for mm, _ in links for rd in pair.reads[mm]]
    position = {op_id(o.operation): x for x, o in enumerate(bbody.operations)}
    first_read = min((rd.slice_op for rd in reads), key=lambda op: position[op_id(op)])
    ip = ir.InsertionPoint(first_read)
    t = seg.t
    cn, c1 = int_const(t.type, n, ip), int_const(t.type, 1, ip)
    s = _arith("subtract", int_const(t.type, n - 1, ip), t, ip)   # the forward iteration
    lo, hi_span, buffers = int_const(t.type, 0, ip), cn, saved_args
    state_ops = _slice_of(list(state_next.values()), fedit.body)
    for level, k_l in enumerate(levels):
        ck = int_const(t.type, k_l, ip)
        g = _arith("divide", _arith("subtract", s, lo, ip), ck, ip)
        base = _arith("add", lo, _arith("multiply", g, ck, ip), ip)
        end = _arith("minimum", _arith("add", base, ck, ip), hi_span, ip)
        need = _compare("EQ", s, _arith("subtract", end, c1, ip), ip)
        hi = _select(need, end, base, ip)       # the segment's iterations, or none
        starts = [_read(b, g, fargs[c].type, ip) for b, c in zip(buffers, seg.state)]
        if offload is not None and level == 0:        # (the saved carries: back to the device)
            starts = [contract.annotate_placement(v, "device", ip, loc) for v in starts]
        if level == len(levels) - 1:            # the last level fills the slots
            def fill(a, j, j_base, mapping, bip, bufs):
                here = _arith("subtract", j, j_base, bip)
                return [_write(b, mapping.get(values[c], values[c]), here, bip)
                        for b, (_, c) in zip(bufs, links)]
            segs = _rerun(seg, ip, loc, base, hi, starts, inv_args, seg_args, inner_ops,
                          fargs, invariant, fill)
            for q in range(len(seg_args)):
                bedit.set_returned(len(bedit.inits) - len(seg_args) + q, segs[q])
        else:                                   # an outer level saves the next one's states
            k_next = levels[level + 1]

            def fill(a, j, j_base, mapping, bip, bufs, k_next=k_next):
                slot = _every_kth_slot(_arith("subtract", j, j_base, bip), k_next,
                                       -(-k_l // k_next), bip)
                return [_write(b, a[3 + q], slot, bip) for q, b in enumerate(bufs)]
            buffers = _rerun(seg, ip, loc, base, hi, starts, inv_args, level_args[level],
                             state_ops, fargs, invariant, fill)
            for q, b in enumerate(buffers):
                arg = level_args[level][q]
                bedit.set_returned(list(bbody.arguments).index(arg), b)
        lo, hi_span = base, end
    rip = ir.InsertionPoint(first_read)
    offset = _arith("subtract", s, base, rip)
    for q, (mm, _) in enumerate(links):
        for rd in pair.reads[mm]:
            rd.slice_op.operands[0] = segs[q]
            rd.slice_op.operands[1] = offset
    # The stacks are no longer read: drop them from both loops.
    keep = {x for x in range(len(bedit.inits)) if x not in seg.links}
    bedit.drop(keep)
    kept = sorted(keep)
    new_bwd = bedit.rebuild({x: kept.index(x) for x in kept if x < len(pair.bwd.results)})
    stacks = [fwd.op.results[c] for _, c in links]
    if crossing is not None:
        crossing.drop_stacks(stacks)
    carries = [fwd.op.operands[c] for c in seg.state]     # (the saved carries' own)
    new_fwd = fedit.rebuild({r: r for r in range(old_count)})
    for x, v, like in zip(saved_at, list(new_fwd.results)[old_count:], carries):
        if crossing is None:
            new_bwd.operands[kept.index(x)] = v
        else:
            new_bwd.operands[kept.index(x)] = crossing.bring(v, ir.InsertionPoint(new_bwd),
                                                             memory_kind=offload, like=like)
    for v in placeholders:
        v.owner.erase()
    drop_unused_carries(new_fwd)
    return report


# ------------------------------------------------------------- split form --
def find_split_pairs(fwd_func, bwd_func) -> list[Pair]:
    """Scan pairs across the halves: a forward loop of <f>_fwd whose stack <f>_fwd returns
    as a residual, and a backward loop of <f>_bwd that takes that residual's argument."""
    ret = graph.terminator(graph.body_block(fwd_func))
    bargs = list(graph.body_block(bwd_func).arguments)
    crossed = {bargs[k]: ret.operands[i]
               for k, i in enumerate(contract.residual_results(fwd_func))}
    return pairs_across(graph.body_block(fwd_func), graph.body_block(bwd_func), crossed)


def pairs_across(fwd_block, bwd_block, crossed: dict, source=None) -> list[Pair]:
    """Scan pairs between two blocks: a forward loop of `fwd_block` whose stack crosses
    (`crossed`: a value of `bwd_block` -> the value of `fwd_block` it stands for) and a
    backward loop of `bwd_block` that reads it (through `source(operand)` where given)."""
    loops = [scan_pairs.analyse_forward(op.operation)
             for op in fwd_block.operations if op.operation.name == WHILE]
    stack_of = {}
    for loop in loops:
        for c in (loop.stacked if loop is not None else ()):
            stack_of[loop.op.results[c]] = (loop, c)
    pairs = []
    for op in bwd_block.operations:
        bwd = op.operation
        if bwd.name != WHILE:
            continue
        body = bwd.regions[1].blocks[0]
        ret_b = graph.terminator(body)
        links, reads, owner_loop = {}, {}, None
        for m, init in enumerate(bwd.operands):
            init = init if source is None else source(init)
            hit = stack_of.get(crossed.get(init)) if init in crossed else None
            if hit is None or ret_b.operands[m] != body.arguments[m]:
                continue
            if owner_loop is not None and op_id(hit[0].op) != op_id(owner_loop.op):
                continue                 # (one forward loop per backward loop)
            r = scan_pairs._reads(body.arguments[m], ret_b)
            if r is None:
                continue
            owner_loop = hit[0]
            links[m], reads[m] = hit[1], r
        if links:
            pairs.append(Pair(owner_loop, bwd, links, reads))
    return pairs


class Crossing:
    """The values <f>_bwd reads from <f>_fwd, as residuals: `bring` gives a stand-in in
    <f>_bwd for a value of <f>_fwd, `drop_stacks` names residuals no longer needed, and
    `finish` rewrites both signatures (residuals stay between <f>_fwd's outputs and
    <f>_bwd's cotangent arguments) and the list of residual records."""

    keeps_memory_kind = True    # an offloaded value crosses in host memory

    @staticmethod
    def scale(value) -> int:
        """A new residual's bytes over its bytes as a value: the same here."""
        return 1

    @staticmethod
    def residual_bytes(value) -> int:
        """The bytes of the residual that carries `value` (a stack) now."""
        return graph.type_bytes(value.type)

    @staticmethod
    def new_bytes(values) -> int:
        """(Split form: the residual records `finish` returns count what crosses.)"""
        return 0

    def __init__(self, fwd_func, bwd_func, residuals: list):
        self.fwd, self.bwd = fwd_func, bwd_func
        self.res_idx = contract.residual_results(fwd_func)
        self.residuals = list(residuals)
        self.wanted = []        # (stand-in in <f>_bwd, value of <f>_fwd)
        self.dropped = set()    # residual numbers
        self.kinds = {}         # stand-in -> the memory kind it crosses in (offloaded)

    def bring(self, value, ip, memory_kind: str | None = None, like=None):
        """A stand-in in <f>_bwd for `value` of <f>_fwd. <f>_fwd returns the value at once, past
        its declared results (so that its rewrites keep the value current) until `finish`.
        `memory_kind`: it crosses in that memory (the result and the argument say so).
        (`like`: see `GspmdCrossing.bring`.)"""
        stand_in = zeros(value.type, ip)
        if memory_kind is not None:
            self.kinds[stand_in] = memory_kind
        ret = graph.terminator(graph.body_block(self.fwd))
        self.wanted.append((stand_in, len(ret.operands)))
        func.ReturnOp(list(ret.operands) + [value], ip=ir.InsertionPoint(ret))
        ret.erase()
        return stand_in

    def entry(self, value) -> dict:
        """More of the result and argument entries of new residual `value` (none here)."""
        return {}

    def drop_stacks(self, values) -> None:
        ret = graph.terminator(graph.body_block(self.fwd))
        for k, i in enumerate(self.res_idx):
            if any(ret.operands[i] == v for v in values):
                self.dropped.add(k)

    def finish(self, describe) -> list:
        """Rewrite the signatures; `describe(value)` -> (description, bytes) of a new
        residual. Returns the residual records in their new order."""
        from remat_passes.core.residuals import Residual
        fblock, bblock = graph.body_block(self.fwd), graph.body_block(self.bwd)
        ret = graph.terminator(fblock)
        n_declared = len(contract.all_entries(self.fwd, "res_attrs"))
        wanted = [(stand_in, ret.operands[at]) for stand_in, at in self.wanted]
        func.ReturnOp(list(ret.operands)[:n_declared], ip=ir.InsertionPoint(ret))
        ret.erase()
        ret = graph.terminator(fblock)
        bargs = list(bblock.arguments)
        kept = [k for k in range(len(self.res_idx)) if k not in self.dropped]
        new_values, new_args, new_kinds = [], [], []
        for stand_in, v in wanted:
            k = next((k for k in kept if ret.operands[self.res_idx[k]] == v), None)
            if k is None and not any(v == w for w in new_values):
                new_values.append(v)
                new_kinds.append(self.kinds.get(stand_in))
            target = bargs[k] if k is not None else None
            new_args.append((stand_in, target, v))
        # <f>_fwd: outputs, kept residuals, new residuals
        outputs = [x for i, x in enumerate(ret.operands) if i not in self.res_idx]
        f_entries = contract.all_entries(self.fwd, "res_attrs")
        out_entries = [e for i, e in enumerate(f_entries) if i not in self.res_idx]
        kept_entries = [f_entries[self.res_idx[k]] for k in kept]
        described = [describe(v) for v in new_values]
        values = outputs + [ret.operands[self.res_idx[k]] for k in kept] + new_values
        func.ReturnOp(values, ip=ir.InsertionPoint(ret))
        ret.erase()
        graph.retype(self.fwd)
        contract.set_all_entries(self.fwd, "res_attrs", out_entries + kept_entries + [
            dict(contract.residual_entry(d, None), **_kind_entry(kind), **self.entry(v))
            for (d, _), kind, v in zip(described, new_kinds, new_values)])
        # <f>_bwd: kept residual arguments, new ones, then the cotangents (moved to the end)
        b_entries = contract.all_entries(self.bwd, "arg_attrs")
        n_res = len(self.res_idx)
        cot = list(range(n_res, len(bargs)))
        added = [bblock.add_argument(v.type, ir.Location.unknown()) for v in new_values]
        moved = [bblock.add_argument(bargs[i].type, bargs[i].location) for i in cot]
        for i, new in zip(cot, moved):
            bargs[i].replace_all_uses_with(new)
        for stand_in, target, v in new_args:
            if target is None:
                target = added[next(j for j, w in enumerate(new_values) if w == v)]
            stand_in.replace_all_uses_with(target)
            stand_in.owner.erase()
        for i in sorted(list(self.dropped) + cot, reverse=True):
            assert next(iter(bargs[i].uses), None) is None
            bblock.erase_argument(i)
        graph.retype(self.bwd)
        contract.set_all_entries(self.bwd, "arg_attrs", [b_entries[k] for k in kept]
                                 + [dict(_kind_entry(kind), **self.entry(v))
                                    for kind, v in zip(new_kinds, new_values)]
                                 + [b_entries[i] for i in cot])
        records = [self.residuals[k] for k in kept if k < len(self.residuals)]
        for v, (d, nbytes) in zip(new_values, described):
            records.append(Residual(graph.jax_type_str(v.type), d, nbytes,
                                    argument=isinstance(v, ir.BlockArgument)))
        return records


def _kind_entry(kind: str | None) -> dict:
    """The argument/result entry of a value that crosses in memory `kind` (None: none)."""
    return {} if kind is None else {contract.MEMORY_KIND: ir.StringAttr.get(kind)}
