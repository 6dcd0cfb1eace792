"""Scan loop pairs, read only: which `stablehlo.while` ops are the two halves of a scan.

JAX exports `lax.scan` under a VJP as two loops in the same block:

* a *forward* while whose body computes one iteration and writes per-iteration
  residuals into loop-carried stacked buffers (`dynamic_update_slice` of the
  value, broadcast or reshaped to `[1, ...]`, at the iteration's slot index);
* a *backward* while, later in the block, that takes those buffers as carries,
  passes them through unchanged and reads one slot per iteration
  (`dynamic_slice` of size `[1, ...]` at the slot index, then `reshape`).

This module recognises them (`analyse_forward`, `find_pairs`) and answers
questions about them; it never changes the IR. `scan_rewrite` applies a policy
per iteration; `loop_edit` adds and drops carries.
"""
from __future__ import annotations

import collections
import dataclasses

from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import ir, op_id
from remat_passes.ir.verdicts import Recompute, Saveable

WHILE = graph.WHILE


# ----------------------------------------------------------- small helpers --
def owner(v):
    """The op defining `v`, or None for a block argument."""
    return v.owner.operation if isinstance(v, ir.OpResult) else None


def const_int(v):
    """The integer value of a scalar integer constant, else None."""
    op = owner(v)
    if op is None or op.name != "stablehlo.constant":
        return None
    try:
        attr = ir.DenseIntElementsAttr(op.attributes["value"])
    except (ValueError, TypeError):
        return None
    if not attr.is_splat:
        return None
    return int(ir.IntegerAttr(attr.get_splat_value()).value)


def shape(v) -> list[int]:
    return list(ir.RankedTensorType(v.type).shape)


def elements(v) -> int:
    n = 1
    for d in shape(v):
        n *= d
    return n


def unwrap_update(u, slot_shape):
    """The per-iteration value behind a `[1, ...]` update (broadcast_in_dim/reshape)."""
    op = owner(u)
    if op is not None and op.name in ("stablehlo.broadcast_in_dim", "stablehlo.reshape"):
        src = op.operands[0]
        if shape(src) == slot_shape:
            if op.name == "stablehlo.reshape":
                return src
            dims = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
            if dims == list(range(1, len(slot_shape) + 1)):
                return src
    return None


def _zero_tail(indices) -> bool:
    return all(const_int(i) == 0 for i in indices)


# ------------------------------------------------------------ forward loop --
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

    @property
    def trip_count(self) -> int:
        """Iterations: the leading dimension of the stacked buffers."""
        return shape(self.op.results[next(iter(self.stacked))])[0]


def analyse_forward(w) -> ForwardLoop | None:
    """The scan structure of a while: counter, invariant carries, stacked buffers."""
    w = w.operation
    if w.name != WHILE or len(w.regions) != 2:
        return None
    body = w.regions[1].blocks[0]
    ret = graph.terminator(body)
    args = list(body.arguments)
    counters, invariant, stacked = [], set(), {}
    for k, (a, r) in enumerate(zip(args, ret.operands)):
        if r == a:
            invariant.add(k)
            continue
        op = owner(r)
        if op is None:
            continue
        if (op.name == "stablehlo.add" and op.operands[0] == a and const_int(op.operands[1]) == 1
                and const_int(w.operands[k]) is not None):
            counters.append(k)
            continue
        if op.name != "stablehlo.dynamic_update_slice" or op.operands[0] != a:
            continue
        if len(list(a.uses)) != 1:
            continue
        buf_shape = shape(a)
        update = op.operands[1]
        if not buf_shape or shape(update) != [1] + buf_shape[1:]:
            continue
        if not _zero_tail(list(op.operands)[3:]):
            continue
        value = unwrap_update(update, buf_shape[1:])
        if value is None:
            continue
        stacked[k] = Stacked(k, value, op.operands[2], op)
    if not counters or not stacked:
        return None
    # the counter is the carry the stacks are indexed by, where several count up by one
    # (a fori_loop made a scan: its own index beside the scan's counter); the other is a
    # carry like any
    slots = {s.index for s in stacked.values()}
    counter = next((k for k in counters if args[k] in slots), counters[-1])
    return ForwardLoop(w, body, counter, invariant, stacked)


# ----------------------------------------------------------- backward loop --
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
        if sizes != [1] + shape(arg)[1:] or not _zero_tail(list(op.operands)[2:]):
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

    @property
    def bwd_body(self):
        return self.bwd.regions[1].blocks[0]


def through_reshapes(v):
    """The source of a reshape chain that ends in v's own type (unrolled scans reshape
    their stacks [N/k, k, ...] -> [N, ...] -> [N/k, k, ...] between the loops)."""
    src = v
    while owner(src) is not None and owner(src).name == "stablehlo.reshape":
        src = owner(src).operands[0]
    return src if src.type == v.type else v


def _moved(v):
    """What `v` is a view of, one op back, where that op moves the data whole: a reshape,
    a broadcast that only adds unit dimensions, a concatenate of one non-empty operand, a
    full slice, or a slice that takes exactly one operand of a concatenate; else None."""
    op = owner(v)
    if op is None:
        return None
    if op.name == "stablehlo.reshape":
        return op.operands[0]
    if op.name == "stablehlo.broadcast_in_dim":
        src = op.operands[0]
        dims = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
        return src if elements(src) == elements(v) and dims == sorted(set(dims)) else None
    if op.name == "stablehlo.concatenate":
        parts = [x for x in op.operands if elements(x)]
        return parts[0] if len(parts) == 1 else None
    if op.name == "stablehlo.slice":
        return _sliced_part(op)
    return None


def _sliced_part(op):
    """The operand of slice `op` where it takes all of it, or the operand of the
    concatenate behind it (through full slices and one-operand concatenates) that it takes
    exactly; else None."""
    start, limit, strides = (list(ir.DenseI64ArrayAttr(op.attributes[k]))
                             for k in ("start_indices", "limit_indices", "strides"))
    src = op.operands[0]
    cut = [d for d, n in enumerate(shape(src)) if (start[d], limit[d]) != (0, n)]
    if any(s != 1 for s in strides) or len(cut) > 1:
        return None
    if not cut:
        return src
    d, cat = cut[0], src
    while True:
        o = owner(cat)
        if o is None or o.name not in ("stablehlo.slice", "stablehlo.concatenate"):
            return None
        if o.name == "stablehlo.concatenate" and \
                ir.IntegerAttr(o.attributes["dimension"]).value == d and \
                sum(1 for x in o.operands if elements(x)) > 1:
            break
        nxt = _moved(cat)
        if nxt is None or nxt.type != cat.type:
            return None
        cat = nxt
    offset = 0
    for part in o.operands:
        n = shape(part)[d]
        if (offset, offset + n) == (start[d], limit[d]):
            return part
        offset += n
    return None


def same_data(v):
    """The value `v` holds the data of, in the same type, through ops that move it whole
    (`_moved`): how a scan unrolled whole (`unroll=True`, haliax's nested remat) stacks
    the stacks of its steps' inner scans with concatenates and its transpose takes each
    back with slices; `v` itself where that source's type differs."""
    src = v
    while (nxt := _moved(src)) is not None:
        src = nxt
    return src if src.type == v.type else v


_VIEWS = ("stablehlo.reshape", "stablehlo.slice", "stablehlo.broadcast_in_dim",
          "stablehlo.transpose")


def same_view(a, b) -> bool:
    """Do `a` and `b` hold the same data by construction: the same value, or the same
    data-moving op (reshape, slice, broadcast, transpose) with the same attributes on
    operands that do (a scan's forward and its transpose slicing one array alike)?"""
    while a != b:
        oa, ob = owner(a), owner(b)
        if oa is None or ob is None or oa.name != ob.name or oa.name not in _VIEWS or \
                a.type != b.type or len(oa.operands) != 1 or \
                graph.attributes(oa) != graph.attributes(ob):
            return False
        a, b = oa.operands[0], ob.operands[0]
    return True


def find_pairs(whiles, source=None) -> list[Pair]:
    """Forward/backward scan pairs among `whiles` (the while ops of one block, in order).
    `source(v)`: what a backward loop's operand `v` is the stack of (default: `v` through
    reshapes that end in its own type)."""
    source = source or through_reshapes
    whiles = [w.operation for w in whiles]
    # every loop's invariant carries, by what their initial value is the stack of
    # (in loop order: the pairs come in the order of their forward, then backward, loops)
    readers: dict = {}      # source value -> [(loop number, carry m)]
    for n, bw in enumerate(whiles):
        body = bw.regions[1].blocks[0]
        ret = graph.terminator(body)
        for m, init in enumerate(bw.operands):
            if ret.operands[m] == body.arguments[m]:
                readers.setdefault(source(init), []).append((n, m))
    pairs = []
    for i, fw in enumerate(whiles):
        loop = analyse_forward(fw)
        if loop is None:
            continue
        links: dict = {}    # loop number -> {carry m: stacked result k}
        for k in loop.stacked:
            for n, m in readers.get(fw.results[k], ()):
                if n != i:
                    links.setdefault(n, {})[m] = k
        for n in sorted(links):
            bw = whiles[n]
            body = bw.regions[1].blocks[0]
            ret = graph.terminator(body)
            found, reads = {}, {}
            for m in sorted(links[n]):
                r = _reads(body.arguments[m], ret)
                if r is not None:
                    found[m], reads[m] = links[n][m], r
            if found:
                pairs.append(Pair(loop, bw, found, reads))
    return pairs


def loop_source(v):
    """(forward loop, stacked carry) when `v` is, through reshapes, a stacked result of a
    forward scan loop (a split forward returns its stacks that way), else None."""
    while owner(v) is not None and owner(v).name == "stablehlo.reshape":
        v = owner(v).operands[0]
    if not isinstance(v, ir.OpResult) or v.owner.name != WHILE:
        return None
    loop = analyse_forward(v.owner)
    k = v.result_number
    return (loop, k) if loop is not None and k in loop.stacked else None


def slot_reads(v) -> list[Read] | None:
    """The slot reads of `v` when every use of it (through reshapes) is an invariant
    carry of a while whose body reads it one slot per iteration (how a split backward's
    scan reads a stack the forward handed over), else None."""
    reads = []
    for use in v.uses:
        op = use.owner.operation
        if op.name == "stablehlo.reshape":
            inner = slot_reads(op.results[0])
            if inner is None:
                return None
            reads += inner
            continue
        if op.name != WHILE:
            return None
        m = use.operand_number
        body = op.regions[1].blocks[0]
        ret = graph.terminator(body)
        if ret.operands[m] != body.arguments[m]:
            return None
        r = _reads(body.arguments[m], ret)
        if r is None:
            return None
        reads += r
    return reads


def find_pairs_in_block(block, source=None) -> list[Pair]:
    return find_pairs([op for op in block.operations if op.operation.name == WHILE], source)


class PendingPairs:
    """Scan pairs still to rewrite, in order, and how many of them hold each loop (by op
    id): a rewrite that rebuilds loops leaves the others as found unless one holds them."""

    def __init__(self, pairs=()):
        self.pairs = collections.deque(pairs)
        self.held = collections.Counter(i for q in self.pairs
                                        for i in (op_id(q.fwd.op), op_id(q.bwd)))

    def __bool__(self) -> bool:
        return bool(self.pairs)

    def pop(self):
        q = self.pairs.popleft()
        self.held.subtract((op_id(q.fwd.op), op_id(q.bwd)))
        return q

    def untouched(self, loops: set) -> "PendingPairs":
        """These, or none where one of them holds a loop of `loops` (rebuilt: the pairs
        are to be found again)."""
        return PendingPairs() if any(self.held[i] > 0 for i in loops) else self


_MOVEMENT = {"stablehlo.dynamic_slice", "stablehlo.slice", "stablehlo.reshape",
             "stablehlo.broadcast_in_dim", "stablehlo.transpose", "stablehlo.convert"}
_INDEX_ARITHMETIC = {"stablehlo.add", "stablehlo.subtract", "stablehlo.multiply",
                     "stablehlo.compare", "stablehlo.select", "stablehlo.convert",
                     "stablehlo.clamp", "stablehlo.negate"}


def moves_data(op) -> bool:
    """Cheap to redo per iteration: data movement, or arithmetic on scalar indices (how a
    scan slices its scanned-over arrays)."""
    if op.name in _MOVEMENT:
        return True
    return op.name in _INDEX_ARITHMETIC and all(
        not list(ir.RankedTensorType(r.type).shape) for r in op.results)


# ------------------------------------------------------- per-value answers --
def stacked_value(while_op, result_number: int):
    """The per-iteration value behind result `result_number` of a forward scan loop."""
    loop = analyse_forward(while_op)
    if loop is None or result_number not in loop.stacked:
        return None
    return loop.stacked[result_number].value


def saved_results(op, verdict) -> list:
    """The results of region op `op` that hold values of its regions the policy saves,
    which a recomputation of it reads back instead of computing: those of a forward scan
    loop that stack a body value the policy saves, those of a case or a shard_map that
    return them (`contract.nested_saves`); else none."""
    op = op.operation
    if op.name != WHILE:
        return [op.results[k] for k in sorted(contract.nested_saves(op))]
    loop = analyse_forward(op)
    if loop is None:
        return []
    return [op.results[k] for k, st in sorted(loop.stacked.items())
            if isinstance(st.value, ir.OpResult) and verdict(op.results[k]) is not Recompute]


def unrolled_parts(v):
    """For `concatenate` (dim 0) of `[1, ...]`-wrapped values (how JAX stacks the sub-steps of
    an unrolled scan step), the wrapped values; else None."""
    op = owner(v)
    if op is None or op.name != "stablehlo.concatenate" or \
            ir.IntegerAttr(op.attributes["dimension"]).value != 0:
        return None
    slot = shape(v)[1:]
    parts = [unwrap_update(u, slot) for u in op.operands]
    return None if any(p is None for p in parts) else parts


def value_verdict(v, op_verdict):
    """The per-iteration verdict for forward value `v` (op_verdict: op -> verdict).

    A result of a nested forward scan loop that stacks an op's value takes the
    verdict of that value (JAX applies the policy inside nested scans too); one
    that stacks an inner carry-in is the inner loop's own business (the policy's
    verdict on the loop op: most policies recompute it whole). A result of a nested
    case or shard_map that holds a value its regions save (`contract.nested_saves`) is
    saved.
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
            elements(op.operands[0]) == elements(v) and v.uses and \
            all(u.owner.operation.name == "stablehlo.concatenate" for u in v.uses):
        # wraps one sub-step of an unrolled scan step: scan machinery, not a computation
        src = op.operands[0]
        return Saveable if isinstance(src, ir.BlockArgument) else value_verdict(src, op_verdict)
    if op.name == WHILE:
        u = stacked_value(op, v.result_number)
        if isinstance(u, ir.OpResult):
            return value_verdict(u, op_verdict)
    # a result of a case or a shard_map holding a value its regions save
    saved = contract.nested_saves(op).get(v.result_number)
    if saved is not None:
        return saved
    return op_verdict(op)


def inside(op, container) -> bool:
    """Is `op` (or the owner of a block argument) nested in `container`?"""
    target = op_id(container)
    while op is not None:
        if op_id(op) == target:
            return True
        op = op.parent
    return False
