"""Build a `RematPlan` in the IR: clones just in time, then a dead-code sweep.

For each serve of the plan, in program order, its clones are created right
before its consumer (the insertion point is always that op, passed
explicitly), marked with the serve's recompute group, and wired to their
sources; then the consumer reads what the plan says. Forward ops left without
users (a cosine only the backward needed) are erased in one reverse sweep; the
first clone of such an op only the backward read is marked as moved (it costs
nothing over no remat).
Offloadable residuals get their placement recorded on the producer.

It returns an `Edit`: the function as it is now, described from what was made
(no walk over the IR). `analysis_after` (joint form) or `split.half_analyses`
(split form) turns that into the analyses the passes after remat-partial-eval
read instead of analysing again.
"""
from __future__ import annotations

from array import array
from typing import NamedTuple

from remat_passes.analysis.function import FunctionAnalysis
from remat_passes.core.plan import RematPlan, clone_of_source
from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import ir, op_id


class Edit(NamedTuple):
    """The function `materialize(plan)` left: its top-level ops in program order, their
    op ids and result counts, the values each reads (CSR rows, in the new vids), `side`
    (per op: a clone or a backward op of the plan's analysis: the half `split` puts it
    in), `new_vid` (vid before -> vid now, -1 for the results of erased ops),
    `keep_backward` (the old backward flags still hold: see
    FunctionAnalysis.backward_survives) and `erased` (the positions of the analysed ops
    the sweep erased, which must not be touched again)."""
    ops: list
    ids: array
    counts: array
    reads: tuple
    side: bytearray
    new_vid: array
    keep_backward: bool
    erased: set


def materialize(plan: RematPlan) -> Edit:
    """Build the plan in the IR; describe what it left."""
    a = plan.analysis
    n = len(a.ops)
    made: list = [None] * plan.num_clones
    placed, replaced = {}, {}    # consumer position -> [(clone number, Clone)], {vid: source}
    backward_only = {c.op for c in plan.clones() if a.backward_only(c.op)}   # (before edits)

    def value(src):
        if src < 0:
            clone, result = clone_of_source(src)
            return made[clone].results[result]
        return a.value(src)

    for serve in plan.serves():
        consumer = a.terminator if serve.consumer == n else a.ops[serve.consumer]
        ip = ir.InsertionPoint(consumer)
        clones = []
        for k in serve.clones:
            c = plan.clone(k)
            clone = a.ops[c.op].clone(ip=ip)
            for old, src in zip(a.reads(c.op), c.sources):
                if src != old:
                    graph.replace_reads(clone, a.value(old), value(src))
            contract.set_recompute_group(clone, c.group)
            made[k] = clone
            clones.append((k, c))
        if clones:
            placed[serve.consumer] = clones
        reads, slots = serve.reads, serve.result_slots
        if reads and serve.consumer < n:
            replaced[serve.consumer] = dict(zip(reads[0::2], reads[1::2]))
        for k in range(0, len(reads), 2):
            graph.replace_reads(consumer, a.value(reads[k]), value(reads[k + 1]))
        for k in range(0, len(slots), 2):
            consumer.operands[slots[k]] = value(slots[k + 1])
    for vid, placement in plan.saved.items():
        pos = a.producer[vid]
        if placement is not None and pos >= 0 and pos not in plan.kept_whole:
            contract.set_offload(a.ops[pos], placement)
    # the analysed ops left without uses (pure ones only; clones are always used)
    erased = set(graph.erase_unused(a.ops, lambda pos: a.side_effect[pos]))
    _mark_moved(plan, made, erased & backward_only)
    return _describe(a, made, erased, placed, replaced)


def _mark_moved(plan: RematPlan, made: list, moved: set[int]) -> None:
    """Mark the first clone of each op in `moved` (erased forward ops that only the
    backward read): it moved into the backward and costs nothing more
    (`FunctionAnalysis.backward_only`)."""
    seen = set()
    for k, c in enumerate(plan.clones()):
        if made[k] is not None and c.op in moved and c.op not in seen:
            seen.add(c.op)
            contract.set_moved(made[k])


def _describe(a, made: list, erased: set[int], placed: dict, replaced: dict) -> Edit:
    """The `Edit` of what materialize did to the function `a` describes: clones (`made`)
    before their consumers (`placed`), the consumers' reads replaced (`replaced`),
    `erased` ops gone."""
    n = len(a.ops)
    new_vid = array("q", range(a.nargs)) + array("q", [-1]) * (a.nvalues - a.nargs)
    clone_first = array("q", [0]) * len(made)
    ops, ids, counts = [], array("q"), array("q")
    side = bytearray()
    starts, flat = array("q", [0]), array("q")
    old_ids, base, old_backward = a.position.by_position(), a.result_base, a.backward
    old_starts, old_flat = a._reads
    count = a.nargs

    def new(src) -> int:
        if src >= 0:
            return new_vid[src]
        clone, result = clone_of_source(src)
        return clone_first[clone] + result

    for pos in range(n + 1):     # (n: the clones before the return, in split form)
        for k, clone in placed.get(pos, ()):
            size = base[clone.op + 1] - base[clone.op]
            ops.append(made[k])
            ids.append(op_id(made[k]))
            counts.append(size)
            side.append(1)
            flat.extend(dict.fromkeys(new(s) for s in clone.sources))
            starts.append(len(flat))
            clone_first[k] = count
            count += size
        if pos == n or pos in erased:
            continue
        lo, hi = base[pos], base[pos + 1]
        ops.append(a.ops[pos])
        ids.append(old_ids[pos])
        counts.append(hi - lo)
        side.append(old_backward[pos])
        swap = replaced.get(pos)
        if swap is None:    # (the same values, renumbered: still distinct)
            flat.extend(map(new_vid.__getitem__, old_flat[old_starts[pos]:old_starts[pos + 1]]))
        else:
            flat.extend(dict.fromkeys(new(swap.get(v, v)) for v in a.reads(pos)))
        starts.append(len(flat))
        new_vid[lo:hi] = array("q", range(count, count + hi - lo))
        count += hi - lo
    return Edit(ops, ids, counts, (starts, flat), side, new_vid, a.backward_survives(erased),
                erased)


def analysis_after(plan: RematPlan, edit: Edit) -> FunctionAnalysis:
    """The analysis of the (joint) function `materialize(plan)` left, from its `Edit`. The
    backward flags are the plan's (clones are backward) where they still hold, else found
    again by the rule: when they come from name stacks, or when a transposed op lost its
    forward user (it may turn backward now)."""
    a = plan.analysis
    return FunctionAnalysis.from_parts(a.func_op, edit.ops, a.terminator, edit.ids,
                                       edit.counts, edit.reads,
                                       edit.side if edit.keep_backward else None,
                                       a.cotangent_indices)
