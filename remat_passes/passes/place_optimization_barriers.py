"""place-optimization-barriers: keep XLA from undoing or hoisting recomputation (prevent_cse).

remat-partial-eval clones recomputed ops into the backward pass, marked
`remat.recompute = <group>`: one group per backward op that needed them, placed
right before it. Left alone, XLA would CSE a clone with the forward op it
copies (the saving is gone) or schedule it early (everything is live again).
As in `jax.checkpoint`'s lowering, the values each group reads from outside
itself go through one `stablehlo.optimization_barrier` together with a backward
value available at that point — the incoming cotangent of the group's consumer —
and the group reads the barrier's results. The barrier is opaque to CSE, and it
cannot run before the cotangent exists.

Run it in joint form on @<f>, in split form on @<f>_bwd. Inside scan loop bodies
it places barriers only with `in-loops=true`: there the loop already keeps each
iteration's recomputation in its iteration (JAX recommends prevent_cse=False
for jax.checkpoint inside lax.scan). In a loop body the barrier's backward value
is a carry the body changes (the carried cotangent or a gradient accumulator).
A group whose inputs already all come from one barrier of ours is left alone,
so running the pass twice changes nothing; so is a group recomputing an
`rp.checkpoint` region made with prevent_cse=False (`contract.REGIONS_NO_CSE`).
Values computed from constants and dimension sizes alone never go through a
barrier: there is nothing to hide, and in a symbolic-shape module a shape
operand behind a barrier cannot be refined.
"""
from __future__ import annotations

import dataclasses

from remat_passes.analysis.function import RecomputeGroup, recompute_groups
from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import ir, op_id, stablehlo
from remat_passes.passes.base import ModulePass, option


def _incoming(group: RecomputeGroup, is_backward, cotangents) -> ir.Value | None:
    """A backward value available before the group: the consumer's cotangent operand,
    else the latest backward result before the group, else a cotangent argument. Sums of
    cotangents (`graph.accumulates`) are passed over: on a mesh they can be partial sums."""
    inside = {r for op in group.ops for r in op.results}
    for v in graph.read_values(group.consumer):
        if v in inside:
            continue
        if isinstance(v, ir.BlockArgument):
            if v in cotangents:
                return v
        elif is_backward(v.owner.operation) and not contract.is_recompute_clone(v.owner) \
                and not graph.accumulates(v.owner):
            return v
    if group.latest_backward is not None:
        return group.latest_backward
    return next(iter(cotangents), None)


def _already_placed(inputs) -> bool:
    owners = {op_id(v.owner) for v in inputs if isinstance(v, ir.OpResult)
              and contract.is_barrier(v.owner)}
    return len(owners) == 1 and all(isinstance(v, ir.OpResult) and contract.is_barrier(v.owner)
                                    for v in inputs)


def _is_shape_value(v, memo: dict, known=None) -> bool:
    """Computed from constants and dimension sizes alone (a shape computation of a
    symbolic-shape module, or a constant): nothing to hide from CSE, and routing it through
    a barrier would keep XLA from refining the shapes it feeds. A walk over the operands;
    `known(value)` answers for the values an analysis describes (None for the others)."""
    def step(u):
        if not isinstance(u, ir.OpResult):
            memo[u] = False
            return None
        if known is not None:
            answer = known(u)
            if answer is not None:
                memo[u] = answer
                return None
        op = u.owner.operation
        rule = graph.shape_rule(op)
        if rule is not None:
            memo[u] = rule
            return None
        pending = [w for w in op.operands if w not in memo]
        if not pending:
            memo[u] = all(memo[w] for w in op.operands)
        return pending
    return graph.post_order(v, memo, step)


def _shape_test(a):
    """is_shape(value) for place(): the analysis's `shape_only` (one sweep) for the ops it
    saw; ops inserted after it (a reduce_precision, say) are walked down to those."""
    memo: dict = {}
    n = len(a.ops)

    def known(v) -> bool | None:
        pos = a.position.get(op_id(v.owner))
        return bool(a.shape_only[pos]) if pos is not None and pos < n else None

    def is_shape(v) -> bool:
        return _is_shape_value(v, memo, known)
    return is_shape


def place(groups, is_backward, cotangents, note=None, skip=None, is_manual=None,
          is_shape=None) -> int:
    """One barrier per group (but those `skip(group)` names); returns how many were placed.
    `is_shape(value)`: computed from constants and dimension sizes alone (by default, a
    walk over its operands).

    `is_manual(value)`: is it a per-device value of a GSPMD shard_map? XLA's partitioner
    cannot take a barrier mixing those with global values, so a group reading both gets
    one barrier of each kind (the incoming cotangent joins the one of its kind)."""
    placed = 0
    if is_shape is None:
        shape_values: dict = {}

        def is_shape(v):
            return _is_shape_value(v, shape_values)
    for group in groups:
        if skip is not None and skip(group):
            continue
        if all(is_shape(r) for op in group.ops for r in op.results):
            continue        # a shape computation (dimension sizes): nothing to hide
        inputs = [v for v in group.inputs() if not is_shape(v)]
        if not inputs or _already_placed(inputs):
            continue  # constants only: nothing to hide from CSE (or placed before)
        ct = _incoming(group, is_backward, cotangents)
        kinds = [inputs] if is_manual is None else \
            [k for k in ([v for v in inputs if not is_manual(v)],
                         [v for v in inputs if is_manual(v)]) if k]
        first = group.ops[0]
        mapping = {}
        for kind in kinds:
            same = ct is not None and ct not in kind and (
                is_manual is None or is_manual(ct) == is_manual(kind[0]))
            barrier = stablehlo.OptimizationBarrierOp(
                kind + ([ct] if same else []), ip=ir.InsertionPoint(first),
                loc=first.location)
            contract.mark_barrier(barrier)
            mapping.update(zip(kind, barrier.results))
            if note is not None:
                note(barrier.operation, first)
        graph.replace_reads_all(group.ops, mapping)
        placed += 1
    return placed


def place_in_loops(func_op) -> int:
    """Barriers for the recompute groups inside while bodies of `func_op`."""
    bodies = []

    def visit(op):
        if op.name == "stablehlo.while":
            bodies.append(op.regions[1].blocks[0])
        return ir.WalkResult.ADVANCE
    func_op.operation.walk(visit)
    placed = 0
    for body in bodies:
        ret = graph.terminator(body)
        changing = [a for a, r in zip(body.arguments, ret.operands) if r != a and str(
            ir.RankedTensorType(a.type).element_type).startswith(("f", "bf"))]
        # in a loop body every op that is not a clone counts as backward
        groups = recompute_groups([op.operation for op in body.operations],
                                  lambda i, op: not contract.is_recompute_clone(op))
        placed += place(groups, lambda op: not contract.is_recompute_clone(op), changing)
    return placed


def _manual_test(a):
    """is_manual(value) for place(), or None when the function has no GSPMD shard_map."""
    manual = a.manual
    if not any(manual):
        return None

    def is_manual(v) -> bool:
        try:
            return bool(manual[a.vid(v)])
        except KeyError:           # inserted after the analysis (a reduce_precision, say):
            return any(is_manual(u) for u in v.owner.operands)   # manual if it reads one
    return is_manual


def _in_regions_without_barrier(module_op):
    """skip(group) for place(): every op of the group is recomputation of an `rp.checkpoint`
    region made with prevent_cse=False (its outermost region: the one whose backward
    recomputes it, as in jax.checkpoint), or None when there are no such regions."""
    keys = contract.regions_without_cse_barrier(module_op)
    if not keys:
        return None

    def skip(group) -> bool:
        for op in group.ops:
            chain = graph.scope_chain(op)
            if not chain or graph.scope_key(chain[0]) not in keys:
                return False
        return True
    return skip


@dataclasses.dataclass
class PlaceOptimizationBarriers(ModulePass):
    name = "place-optimization-barriers"
    summary = ("Route the inputs of each recomputation, with the incoming cotangent, through "
               "an optimization_barrier so XLA cannot CSE or hoist it (prevent_cse)")
    preserves_analyses = True

    func: str = option("main",
                       "the function remat-partial-eval rewrote (its _bwd half in split form)")
    in_loops: bool = option(False, "also inside scan loop bodies (JAX recommends "
                            "prevent_cse=False there)")

    def apply(self, module_op, state) -> None:
        name = self.func
        target = f"{name}_bwd" if graph.is_split(module_op, name) else name
        with module_op.context:
            f = graph.find_func(module_op, target)
            a = state.analysis(f)
            place(a.recompute_groups, a.is_backward, [a.args[i] for i in a.cotangent_indices],
                  lambda barrier, first: a.note_inserted(barrier, backward=True, before=first),
                  _in_regions_without_barrier(module_op), _manual_test(a), _shape_test(a))
            if self.in_loops:
                place_in_loops(f)
