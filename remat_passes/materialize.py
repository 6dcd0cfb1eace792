"""Build a `RematPlan` in the IR: clones just in time, then a dead-code sweep.

For each serve of the plan, in program order, its clones are created right
before its consumer (the insertion point is always that op, passed
explicitly), marked with the serve's recompute group, and wired to their
sources; then the consumer reads what the plan says. Forward ops left without
users (a cosine only the backward needed) are erased in one reverse sweep.
Offloadable residuals get their placement recorded on the producer.
"""
from __future__ import annotations

from remat_passes import contract, graph
from remat_passes.mlir import ir
from remat_passes.plan import RematPlan, clone_of_source


def materialize(plan: RematPlan) -> set[int]:
    """Build the plan; returns the positions of the analysed ops the sweep erased."""
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
    return dead_code_sweep(a)


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
