"""Build a `RematPlan` in the IR: clones just in time, then a dead-code sweep.

For each serve of the plan, in program order, its clones are created right
before its consumer (the insertion point is always that op, passed
explicitly), marked with the serve's recompute group, and wired to their
sources; then the consumer reads what the plan says. Forward ops left without
users (a cosine only the backward needed) are erased in one reverse sweep.
Offloadable residuals get their placement recorded on the producer.

`analysis_after` then describes the function as it is now from what was made
(no walk over the IR), so that the passes after remat-partial-eval need not
analyse it again.
"""
from __future__ import annotations

from array import array

from remat_passes import contract, graph
from remat_passes.analysis import FunctionAnalysis
from remat_passes.mlir import ir, op_id
from remat_passes.plan import RematPlan, clone_of_source


def materialize(plan: RematPlan) -> tuple[set[int], list]:
    """Build the plan; returns the positions of the analysed ops the sweep erased, and
    the clones made (in the plan's clone order)."""
    a = plan.analysis
    made: list = [None] * plan.num_clones

    def value(src):
        if src < 0:
            clone, result = clone_of_source(src)
            return made[clone].results[result]
        return a.value(src)

    for serve in plan.serves():
        consumer = a.terminator if serve.consumer == len(a.ops) else a.ops[serve.consumer]
        ip = ir.InsertionPoint(consumer)
        for n in serve.clones:
            c = plan.clone(n)
            clone = a.ops[c.op].clone(ip=ip)
            for old, src in zip(a.reads(c.op), c.sources):
                if src != old:
                    graph.replace_reads(clone, a.value(old), value(src))
            contract.set_recompute_group(clone, c.group)
            made[n] = clone
        reads, slots = serve.reads, serve.result_slots
        for k in range(0, len(reads), 2):
            graph.replace_reads(consumer, a.value(reads[k]), value(reads[k + 1]))
        for k in range(0, len(slots), 2):
            consumer.operands[slots[k]] = value(slots[k + 1])
    for vid, placement in plan.saved.items():
        pos = a.producer[vid]
        if placement is not None and pos >= 0 and pos not in plan.kept_whole:
            contract.set_offload(a.ops[pos], placement)
    return dead_code_sweep(a), made


def dead_code_sweep(a) -> set[int]:
    """Erase the analysed ops left without uses (pure ones only; clones are always used),
    in one reverse sweep: a dead op's operands are visited after it is gone. Returns the
    positions of the erased ops (which must not be touched again)."""
    erased = set()
    for pos in range(len(a.ops) - 1, -1, -1):
        op = a.ops[pos]
        if any(next(iter(r.uses), None) is not None for r in op.results):
            continue
        if a.side_effect[pos]:
            continue
        erased.add(pos)
        op.erase()
    return erased


def analysis_after(plan: RematPlan, made: list, erased: set[int]) -> FunctionAnalysis | None:
    """The analysis of the function `materialize(plan)` left (clones before their serves'
    consumers, the consumers' reads replaced, erased ops gone), built from the plan's
    integer arrays. None where the result is not known without looking again: a serve
    of the return (split form), or backward found by name stacks or by the rule for
    transposed ops whose forward user was erased (it may turn backward now)."""
    a = plan.analysis
    n = len(a.ops)
    before, replaced = {}, {}
    for serve in plan.serves():
        if serve.consumer == n:
            return None
        if len(serve.clones):
            before[serve.consumer] = serve.clones
        if serve.reads:
            replaced[serve.consumer] = dict(zip(serve.reads[0::2], serve.reads[1::2]))
    keep_backward = a.backward_survives(erased)
    new_vid = array("q", range(a.nargs)) + array("q", [-1]) * (a.nvalues - a.nargs)
    clone_first = array("q", [0]) * len(made)
    ops, ids, counts = [], array("q"), array("q")
    backward = bytearray()
    starts, flat = array("q", [0]), array("q")
    old_ids, base, old_backward = a.position.by_position(), a.result_base, a.backward
    count = a.nargs

    def new(src) -> int:
        if src >= 0:
            return new_vid[src]
        clone, result = clone_of_source(src)
        return clone_first[clone] + result

    for pos in range(n):
        for c in before.get(pos, ()):
            clone = plan.clone(c)
            k = base[clone.op + 1] - base[clone.op]
            ops.append(made[c])
            ids.append(op_id(made[c]))
            counts.append(k)
            backward.append(1)
            flat.extend(dict.fromkeys(new(s) for s in clone.sources))
            starts.append(len(flat))
            clone_first[c] = count
            count += k
        if pos in erased:
            continue
        k = base[pos + 1] - base[pos]
        ops.append(a.ops[pos])
        ids.append(old_ids[pos])
        counts.append(k)
        backward.append(old_backward[pos])
        swap = replaced.get(pos)
        reads = a.reads(pos) if swap is None else [swap.get(v, v) for v in a.reads(pos)]
        flat.extend(dict.fromkeys(new(s) for s in reads))
        starts.append(len(flat))
        for j in range(k):
            new_vid[base[pos] + j] = count + j
        count += k
    return FunctionAnalysis.after_edit(a, ops, ids, counts, (starts, flat),
                                       backward if keep_backward else None)
