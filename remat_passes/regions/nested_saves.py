"""Region ops nested where a recomputation clones them whole: a case in a cond's branch,
a loop or a case in a scan body, either in a shard_map body, at any depth.

JAX's cond, scan and shard_map partial-eval rules nest: inside each, the policy applies
op by op, and what it saves there becomes a residual of the op around it. So, before the
rule of the outermost op decides, every nested op returns the values the policy saves
inside it, innermost first (`presave`): a case its branch values (`case_nested`), a
forward scan loop the stacks of its body values (`scan_nested`), a shard_map its body
values (`manual_nested`). The op around it keeps those results like any saved value; a
recompute clone of the nested op reads them back instead of computing them, and so do
the ops nested in it (`reuse`).
"""
from __future__ import annotations

from remat_passes.analysis.scan_pairs import WHILE, analyse_forward
from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import ir, op_id
from remat_passes.ir.verdicts import Recompute
from remat_passes.regions import case_nested, loop_edit, manual_nested
from remat_passes.regions.scan_nested import inner_saved, prestack
from remat_passes.regions.shard_map_rewrite import body_side_effect
from remat_passes.sharding.sdy import mesh_of

CASE, MC = graph.CASE, graph.MANUAL_COMPUTATION


def presave(block, verdict) -> int:
    """Make each region op of `block` that a recomputation would clone (the policy
    recomputes a result of it) return the values the policy saves inside it, the ops
    nested in it first. Returns how many ops were rebuilt (0: nothing to do, so a second
    call does nothing)."""
    n = 0
    for op in list(block.operations):
        op = op.operation
        if not _recomputed(op, verdict):
            continue
        if op.name == CASE:
            n += sum(presave(region.blocks[0], verdict) for region in op.regions)
            saved = case_nested.nested_saves_needed(op, verdict)
            if saved is not None:
                with op.location:
                    replaced(verdict, op_id(op), case_nested.add_nested_saves(op, saved, verdict))
                n += 1
        elif op.name == MC:
            if body_side_effect(op) or mesh_of(op) is None:
                continue            # (atomic: recomputed whole)
            n += presave(op.regions[0].blocks[0], verdict)
            saved = manual_nested.nested_saves_needed(op, verdict)
            if saved is not None:
                with op.location:
                    replaced(verdict, op_id(op), manual_nested.add_nested_saves(op, saved))
                n += 1
        elif op.name == WHILE:
            loop = analyse_forward(op)
            if loop is None:
                continue
            if presave(loop.body, verdict):
                loop = analyse_forward(op)          # (ops of its body were rebuilt)
            stacked = {st.value for st in loop.stacked.values()}
            new = [v for v in inner_saved(loop, verdict) if v not in stacked]
            if new:
                replaced(verdict, op_id(op), prestack(loop, new))
                n += 1
    return n


def replaced(verdict, old: int, new) -> None:
    """Tell `verdict` that op `new` replaces the op whose id was `old` (a loop rebuilt to
    stack more): a plan's verdicts are by op identity (`PlannedPolicy`), and the new op
    takes the old one's (else the fallback's: a loop the plan recomputes, saved)."""
    hook = getattr(verdict, "replaced", None)
    if hook is not None:
        hook(old, new)


def _recomputed(op, verdict) -> bool:
    """Does the policy recompute a result of `op` (so a recomputation clones it)?"""
    return any(verdict(r) is Recompute for r in op.results)


def reuse(clone, values: dict, replaced=lambda old, new: None):
    """A recompute clone of a region op that `presave` made return saved values: it reads
    `values[k]` back for result k instead of computing it, and so do the ops nested in it
    that saved the value in turn. Returns the clone (rebuilt, for a loop or a shard_map);
    `replaced(old op id, new op)` is told of each nested op rebuilt."""
    def inner(op, read):
        old = op_id(op)
        new = reuse(op, read, replaced)
        if new is not None and op_id(new) != old:
            replaced(old, new)
        return new
    if clone.name == CASE:
        case_nested.reuse_nested_saves(clone, values, inner)
        return clone
    if clone.name == MC:
        mine = {k: v for k, v in values.items() if k in contract.manual_saves(clone)}
        return manual_nested.reuse_nested_saves(clone, mine, inner) if mine else clone
    loop = analyse_forward(clone) if clone.name == WHILE else None
    if loop is None:
        return clone
    mine = {k: v for k, v in values.items()        # (its stacks of body values)
            if k in loop.stacked and isinstance(loop.stacked[k].value, ir.OpResult)}
    return loop_edit.reuse_saved_stacks(clone, mine, inner) if mine else clone
