"""A shard_map (`sdy.manual_computation`) nested in a scan body: which of its body values
the backward needs saved, rebuilding it so that it returns them (`remat.manual_saves`
records which results hold them), and a recomputation of it that takes them back.

A scanned layer that runs a shard_map (a sharded matmul, an expert layer) puts a manual
computation in the forward loop's body. Where the per-iteration policy recomputes it, the
backward body clones it whole; inside, JAX's shard_map partial-eval rule applies the
policy per body op: the body values it saves become residuals of the shard_map, each on
its first dimension over the manual axes it varies over (as `shard_map_rewrite` lays out
a residual), and the recomputation computes the rest from them. So, as for a case nested
there (`case_nested`): `plan_nested_saves` finds the body values the policy saves that
computing the results needs, `add_nested_saves` makes the forward computation return them
(the outer forward loop then stacks them per iteration), and `reuse_nested_saves` gives a
recompute clone of it those values as operands, in place of the body ops that made them.
"""
from __future__ import annotations

from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import ir
from remat_passes.ir.verdicts import Recompute, Saveable
from remat_passes.regions import case_nested
from remat_passes.regions.shard_map_rewrite import (body_side_effect, new_manual, reshape,
                                                    shrunk, with_residuals)
from remat_passes.sharding.sdy import mesh_of, shardings

MC = graph.MANUAL_COMPUTATION


def _verdict(v, verdict):
    """The policy's verdict on body value `v`: a collective's is the policy's on the op
    (every device runs it again in lockstep; `verdict` calls it saved, a side effect
    elsewhere)."""
    op = v.owner.operation
    op_verdict = getattr(verdict, "op_verdict", None)
    if op.name in graph.COLLECTIVE_OPS and op_verdict is not None:
        return op_verdict(op)
    return verdict(v)


def plan_nested_saves(mc, verdict) -> list:
    """The body values of manual computation `mc` that the policy saves and that computing
    its results needs, in program order (the body's arguments are its operands: the
    recomputation takes those anyway)."""
    return case_nested.saves_for_results(mc.regions[0].blocks[0],
                                         lambda v: _verdict(v, verdict) is not Recompute,
                                         verdict)


def nested_saves_needed(op, verdict) -> list | None:
    """For a manual computation a recomputation would clone whole (the policy recomputes
    it) that does not return its saved values yet: `plan_nested_saves`; else (nothing to
    save, a side effect in its body, no mesh) None."""
    op = op.operation
    if op.name != MC or contract.manual_saves(op) or not op.results or \
            body_side_effect(op) or mesh_of(op) is None or \
            all(verdict(r) is not Recompute for r in op.results):
        return None
    saved = plan_nested_saves(op, verdict)
    return saved or None


def add_nested_saves(mc, saved: list):
    """Rebuild `mc` with a result for each value of `plan_nested_saves` (laid out as a
    shard_map residual), recorded in `remat.manual_saves`. Returns the new computation."""
    n_old = len(mc.results)
    new, _ = with_residuals(mc, saved)
    contract.set_manual_saves(new, {n_old + i: Saveable for i in range(len(saved))})
    return new


def reuse_nested_saves(clone, values: dict, reuse_inner):
    """A recompute clone of a manual computation with `remat.manual_saves`: each saved
    result k comes back as a new operand (`values[k]`, sharded as the result was), and the
    body reads it where it computed the value (a region op of the body that returned it
    reads it back too: `reuse_inner(op, {result: value})`); what only computed those
    values goes, and so do those results. Returns the rebuilt clone."""
    body = clone.regions[0].blocks[0]
    ret = graph.terminator(body)
    keys = sorted(values)
    for k in keys:
        y = ret.operands[k]               # the value, or a scalar reshaped to one element
        made = y.owner.operands[0] if _reshaped_scalar(y) else y
        arg = body.add_argument(y.type, clone.location)
        value = arg if arg.type == made.type else reshape(
            arg, made.type, ir.InsertionPoint.at_block_begin(body), clone.location)
        made.replace_all_uses_with(value)
        if len(made.owner.operation.regions):
            reuse_inner(made.owner.operation, {made.result_number: value})
    outs = shardings(clone, "out_shardings")
    new = new_manual(clone, list(clone.operands) + [values[k] for k in keys],
                     [r.type for r in clone.results],
                     shardings(clone, "in_shardings") + [outs[k] for k in keys], outs,
                     ir.InsertionPoint(clone), clone.location)
    body.append_to(new.regions[0])
    for a, b in zip(clone.results, new.results):   # (a clone nested in another one's
        a.replace_all_uses_with(b)                  # region is read already)
    clone.erase()
    return shrunk(new, [k for k in range(len(new.results)) if k not in values],
                  drop_unused_args=False)


def _reshaped_scalar(y) -> bool:
    """Is returned value `y` a scalar body value reshaped to one element
    (`residual_layout`)?"""
    return isinstance(y, ir.OpResult) and y.owner.name == "stablehlo.reshape" and \
        not ir.RankedTensorType(y.owner.operands[0].type).shape and \
        ir.RankedTensorType(y.type).shape == [1]
