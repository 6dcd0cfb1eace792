"""The fences place-optimization-barriers puts beside its barriers: single-value
`stablehlo.optimization_barrier`s that keep XLA from fusing a cheap chain of elementwise ops
into several readers. XLA computes such a chain again inside each reader's fusion, so the
buffers the chain reads stay live until the last of those readers has run; behind a fence
the chain is computed once, stored, and its inputs can die there. Where XLA fuses across
barriers (XLA:CPU of jaxlib 0.10 deletes them before it fuses) a fence changes nothing.

* `fence_residual_producers` (`fence-producers`, joint form): a saved value whose cheap
  producer XLA would fuse again into backward readers, keeping the forward's dot output
  live into the backward beside the saved value.
* `fence_duplicated_chains` (`fence-chains`): a backward value made by a cheap chain that
  some reader stores (a dot or a convolution reads it) and other readers would compute
  again (a reduce, an elementwise op, a transpose), when the buffers the chain reads are
  at least twice its own bytes.
* `fence_early_clones`: a clone remat-partial-eval made early, in a group that does not
  read it (`core.plan.make_narrowing_clones_early`: a ReLU mask made where the
  pre-activation it is computed from is made), so that XLA stores it there instead of
  computing it inside its late reader from an input kept alive until then.
"""
from __future__ import annotations

from remat_passes.cost.xla_buffers import ELEMENTWISE, EXPENSIVE, FUSIBLE, is_literal
from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import ir, op_id, stablehlo


# elementwise ops XLA computes again inside each reader (not EXPENSIVE ones)
_DUPLICATED = ELEMENTWISE - EXPENSIVE
# readers that take their operands as stored buffers: XLA fuses no producer into them
_STORES_OPERANDS = frozenset({
    "stablehlo.dot_general", "stablehlo.dot", "stablehlo.convolution",
    "stablehlo.custom_call", "stablehlo.optimization_barrier", "stablehlo.while",
    "stablehlo.case", "stablehlo.if", "stablehlo.sort", "func.return", "func.call"})
_FENCE_DEPTH = 3   # ops along a producer chain XLA would fuse into the backward


def _unmarked(v):
    """`v` with the checkpoint-name markers that make it looked through: they are identities,
    gone before XLA sees the program (a saved `dot + bias` named `h` is the sum)."""
    while isinstance(v, ir.OpResult) and contract.checkpoint_name(v.owner) is not None:
        v = v.owner.operands[0]
    return v


def _made_from_dropped(v, kept: set) -> bool:
    """Is forward value `v` made by a short chain of cheap elementwise ops (which XLA
    computes again inside each reader) from a stored value the backward does not read
    (`kept`: what it reads), such as the dot output under `dot + bias`? (Checkpoint-name
    markers along the chain are looked through.)"""
    v = _unmarked(v)
    frontier = [v] if isinstance(v, ir.OpResult) and v.owner.name in _DUPLICATED else []
    for _ in range(_FENCE_DEPTH):
        chain = []
        for w in frontier:
            for u in w.owner.operands:
                if u in kept:
                    continue
                u = _unmarked(u)
                if not isinstance(u, ir.OpResult) or u in kept or is_literal(u):
                    continue
                if u.owner.name in _DUPLICATED:
                    chain.append(u)
                elif u.owner.name not in FUSIBLE:
                    return True
        frontier = chain
    return False


def fence_residual_producers(a, block, is_shape, note=None) -> int:
    """Joint form: a saved value XLA stores anyway (a dot, a barrier or the return reads
    it) but whose cheap producer XLA could fuse again into its backward readers gets read
    by those through one barrier, at the first of them. Left alone, XLA (GPU; XLA:CPU from
    jaxlib 0.11) computes `dot + bias` (rounded, named or not) once for the forward and again
    inside backward fusions, so the dot output stays live into the backward beside the
    saved value (measured, XLA:CPU of jaxlib 0.12, the GPT joint under `auto` at 2/9 of its
    budget range: 15,856,516 B without, 12,972,932 B with it, estimated 12,963,356 B;
    docs/passes.md has the others). A value no reader stores is left to XLA: there
    computing it inside each reader is what keeps it from being stored (the GPT under
    everything_saveable). Returns how many barriers it placed."""
    ops = [op.operation for op in block.operations][:-1]        # (not the return)
    backward = [a.is_backward(op) for op in ops]
    forward, kept = set(), set()
    for op, back in zip(ops, backward):
        if back:
            kept.update(v for v in graph.read_values(op) if v in forward)
        elif not contract.is_recompute_clone(op):
            forward.update(op.results)
    decided: dict = {}

    def needs_fence(v) -> bool:
        if v not in decided:
            decided[v] = not is_shape(v) and graph.is_static_float(v) \
                and any(u.owner.name in _STORES_OPERANDS for u in v.uses) \
                and _made_from_dropped(v, kept)
        return decided[v]
    fenced: dict = {}
    for op, back in zip(ops, backward):
        if not back or contract.is_recompute_clone(op) or contract.is_barrier(op) \
                or op.name in _STORES_OPERANDS:    # (nothing fused into it to fence off)
            continue
        reads = graph.read_values(op)
        new = [v for v in reads if v in forward and v not in fenced and needs_fence(v)]
        if new:
            barrier = stablehlo.OptimizationBarrierOp(new, ip=ir.InsertionPoint(op),
                                                      loc=op.location)
            contract.mark_barrier(barrier)
            if note is not None:
                note(barrier.operation, op)
            fenced.update(zip(new, barrier.results))
        if any(v in fenced for v in reads):
            graph.replace_reads_all([op], fenced)
    return len({op_id(v.owner) for v in fenced.values()})


# fence_duplicated_chains: a chain whose inputs are at least this many times its own bytes,
# of at least FENCE_MIN_BYTES (smaller ones save nothing worth a barrier; measured, XLA:CPU
# of jaxlib 0.12: fencing the conv net's 320-byte logits gradient moved its peak by 128 KiB)
CHAIN_INPUTS_RATIO = 2
FENCE_MIN_BYTES = 4096
_CHAIN_DEPTH = 8     # ops walked back along a chain for the buffers it reads
_FOLDED = ("stablehlo.transpose", "stablehlo.reshape")   # XLA folds them into their readers


def _stored_by(v, depth: int = 2) -> bool:
    """Is `v` read, directly or through transposes and reshapes, by an op that stores its
    operands (a dot, a convolution, a loop, the return)? One of our own barriers does not
    count (measured: fencing the GPT's tie cotangents, which only the groups' barriers
    store, held 262,144 B more in XLA:CPU's schedule at 6/9 of its budget range)."""
    for use in v.uses:
        r = use.owner
        if r.name in _STORES_OPERANDS and r.name != "stablehlo.optimization_barrier":
            return True
        if depth and r.name in _FOLDED and _stored_by(r.results[0], depth - 1):
            return True
    return False


def chain_inputs(v) -> set:
    """The buffers the cheap chain that ends in `v` reads: walked back through fusible ops
    (not through a barrier) for `_CHAIN_DEPTH` ops; literals are none."""
    seen, out, frontier = set(), set(), [v]
    for _ in range(_CHAIN_DEPTH):
        nxt = []
        for w in frontier:
            for u in w.owner.operands:
                if u in seen or is_literal(u):
                    continue
                seen.add(u)
                if isinstance(u, ir.OpResult) and u.owner.name in FUSIBLE and \
                        not contract.is_barrier(u.owner):
                    nxt.append(u)
                else:
                    out.add(u)
        frontier = nxt
    return out


def duplicated_chain(v, is_shape) -> bool:
    """Would XLA compute backward value `v` (the result of a cheap elementwise op) both
    for a reader that stores it and again inside other readers, holding more than twice
    its bytes live until the last of them?"""
    readers = [use.owner for use in v.uses]
    if len(readers) < 2 or not graph.is_static_float(v) or is_shape(v):
        return False
    if all(r.name in _STORES_OPERANDS for r in readers) or not _stored_by(v):
        return False        # (stored once anyway, or computed inside every reader)
    size = graph.type_bytes(v.type)
    return size >= FENCE_MIN_BYTES and \
        sum(graph.type_bytes(u.type) for u in chain_inputs(v)) >= CHAIN_INPUTS_RATIO * size


# the remark place-optimization-barriers makes where fence-chains placed a fence (rp.jit
# then builds the program without them too, and runs the smaller)
CHAINS_FENCED = "fence-chains gave"


def fence_duplicated_chains(a, block, is_shape, note=None) -> int:
    """A backward value made by a cheap chain that XLA would compute once for a reader that
    stores it and again inside each of its other readers (`duplicated_chain`) gets one
    barrier right after it, read by all of them. Left alone, XLA:CPU (from jaxlib 0.11)
    holds the chain's inputs until its last reader: measured, the Equinox transformer at
    `auto(budget=0)`, joint, 3,118,276 B without, 2,582,400 B with (docs/passes.md has the
    rest). Returns how many barriers it placed."""
    placed = 0
    for op in [op.operation for op in block.operations][:-1]:
        if not a.is_backward(op) or contract.is_recompute_clone(op) or \
                contract.is_barrier(op) or op.name not in _DUPLICATED or len(op.results) != 1:
            continue
        v = op.results[0]
        if not duplicated_chain(v, is_shape):
            continue
        _fence_after(op, note)
        placed += 1
    return placed


def _fence_after(op, note=None) -> None:
    """One barrier right after `op`, over its one result, which all its readers read."""
    v = op.results[0]
    readers = [use.owner for use in v.uses]
    fence = stablehlo.OptimizationBarrierOp([v], ip=ir.InsertionPoint(op), loc=op.location)
    fence.operation.move_after(op)
    contract.mark_barrier(fence)
    if note is not None:
        note(fence.operation, after=op)
    graph.replace_reads_all(readers, {v: fence.results[0]})


def fence_early_clones(groups, is_shape, note=None) -> int:
    """A clone that nothing in its own recompute group reads (neither the group's clones
    nor its consumer: remat-partial-eval moved it there, ahead of its readers, because it
    is smaller than the clones it is computed from) gets one barrier right after it, read
    by all its readers. Without it XLA (GPU; XLA:CPU from jaxlib 0.11) fuses the clone
    into its late reader and keeps the inputs alive until there, which the move was to
    end. Constants and shape values are left alone (a loop's trip count stays visible),
    and so is a clone read inside another op's region. Returns how many barriers it
    placed."""
    placed = 0
    for group in groups:
        own = {op_id(op) for op in group.ops}
        if group.consumer is not None:
            own.add(op_id(group.consumer))
        for op in group.ops:
            if len(op.results) != 1 or not len(op.operands) or is_shape(op.results[0]):
                continue
            readers = [use.owner for use in op.results[0].uses]
            if not readers or all(contract.is_barrier(r) for r in readers) or \
                    any(op_id(r) in own or r.parent != op.parent for r in readers):
                continue    # (read through a barrier already: fenced, or not early)
            _fence_after(op, note)
            placed += 1
    return placed
