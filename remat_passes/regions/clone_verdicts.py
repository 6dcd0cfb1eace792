"""The verdicts of the ops nested in a recompute clone: those of the ops they copy.

A plan's verdicts (`auto`'s `PlannedPolicy`) are by op identity. A rule that clones a
region op into the backward (the scan rule's recomputation of an inner scan loop, the case
rule's recompute case) makes new nested ops, which would get the verdict a plan gives the
ops it leaves undecided (saved) where a rule asks for them: a loop in such a clone is
rewritten per iteration (`scan_rewrite.rewrite_pairs`, `case_crossing`), and saved all of
its stacks in the backward where the plan had counted them recomputed. `inherit` records,
when a clone is made, its nested ops' originals' verdicts; `Inherited` answers with them.
Only clones that hold a loop are recorded: no rule plans the ops of the others.
"""
from __future__ import annotations

from remat_passes.ir import graph
from remat_passes.ir.mlir import ir, op_id
from remat_passes.regions import nested_saves


class Inherited:
    """value -> verdict: for an op nested in a recorded clone, the verdicts its original
    had (`inherit`), else `verdict`'s. Other attributes (`in_scope`) are `verdict`'s."""

    def __init__(self, verdict, inherited: dict):
        self.verdict, self.inherited = verdict, inherited

    def __call__(self, value):
        if isinstance(value, ir.OpResult):
            name, verdicts = self.inherited.get(op_id(value.owner), (None, None))
            if name == value.owner.name and value.result_number < len(verdicts):
                return verdicts[value.result_number]
        return self.verdict(value)

    def record(self, original, clone) -> None:
        """The ops nested in `clone`, a clone of `original` just made, answer with the
        verdicts their originals have (`inherit`)."""
        self.inherited.update(inherit(original, clone, self))

    def replaced(self, old: int, new) -> None:
        """Op `new` replaces the op whose id was `old` (`nested_saves.replaced`)."""
        moved(self.inherited, old, new)
        nested_saves.replaced(self.verdict, old, new)

    def __getattr__(self, name):
        return getattr(self.verdict, name)


def inherit(original, clone, verdict) -> dict:
    """{op id of an op nested in `clone`: (its name, the verdicts on the results of the op
    of `original` it copies)}; empty unless the clone holds a loop."""
    ops = list(zip(_nested(original), _nested(clone)))
    if original.name != graph.WHILE and not any(o.name == graph.WHILE for o, _ in ops):
        return {}
    return {op_id(c): (c.name, [verdict(r) for r in o.results]) for o, c in ops}


def moved(inherited: dict, old: int, new) -> None:
    """Op `new` replaces the op whose id was `old` (rebuilt): it inherits what that one did."""
    if old in inherited:
        inherited[op_id(new)] = inherited[old]


def _nested(op):
    return (each for region in op.regions for block in region.blocks
            for each in graph.nested_ops(block))
