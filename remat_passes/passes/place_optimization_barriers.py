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

That holds where XLA keeps the barrier until it has scheduled the program (GPU; whether
XLA:GPU too drops a barrier's unread results, as below, is not measured). XLA:CPU
of jaxlib 0.10 deletes barriers before it schedules (its OptimizationBarrierExpander runs
right after HloCSE, before layout assignment), so there a later CSE merges a clone with the
forward op it copies and the scheduler runs all recomputation first: the program needs as
much memory as without remat. Later XLA:CPU keeps them until it schedules, but first drops
each result no op reads, the cotangent's among them, so there a group can wait only for
what it reads (seen on jaxlib 0.11.2 and 0.12: a barrier over a weight and a late value
whose result nothing reads; the op reading the weight's result ran at the start).
`tie-to-cotangent=true` adds a data dependency that survives:
enough of the group's computed inputs (one for each op that reads such an input and
nothing tied yet; an argument of the function only where an op reads arguments alone and
makes more than the argument, `_to_tie`) are read through
`x * sqrt(1 + 0 * convert(is_finite(c)))`, `c` the first element of the incoming
cotangent. The factor is exactly 1 whatever `c` holds (NaN and infinities included; the
square root of 1 is exact), so values are unchanged, but XLA cannot tell, so the clones
stay distinct from the forward and wait for the cotangent. The square root is there
because XLA counts it as expensive: it computes the factor once rather than again inside
every fusion that reads a tied value. Without it, each such fusion recomputed its factor
from `c`, and `c`'s own tied inputs, back along the chain of ties, and kept every buffer
that chain reads alive until the last of them ran (Equinox under `dots_saveable`, split
backward on XLA:CPU: 5,103,476 B without the square root, 3,924,152 B with it).
rp.jit turns it on when it compiles for CPU.

No tie is placed when the forward keeps no activation (every value the backward reads from
it is an argument): the backward then recomputes the whole forward from the arguments at
once, which needs what the program without remat needs, and XLA:CPU undoing it saves the
recomputation's time and costs no memory (measured: Equinox `nothing_saveable`, 1.05x the
untied footprint when tied). In joint form per use no barrier is placed either where XLA:CPU
keeps barriers through CSE (jaxlib >= 0.11; 0.10 deletes them first and merges the clones
itself): there the clones did not merge with the forward, and untied they ran in the forward
beside it (jaxlib 0.12, joint, nothing_saveable, the zoo's
RecurrentGemma 1,708,840 B with barriers, 1,585,960 B without, the program without remat
1,569,576 B; Gemma 3 bf16 1,072,816 B and 1,049,296 B). Per region the barrier stays, as
`jax.checkpoint` places it (Flax's blocks 1,125,024 B with it, 1,190,560 B without): rp.jit
compiles both and runs the smaller. In two levels (`remat.levels = 2`, core/levels.py) the ties are
placed all the same, and an op of a group that reads arguments alone gets its smallest
argument tied (a transient copy): they keep each segment's second recomputation apart from
the first, which XLA:CPU would otherwise merge and keep live from the start of the backward
(measured, Equinox at auto(budget=0) in 4 segments, split backward: 3,388,276 B with ties
of computed inputs only, 2,597,748 B with those of arguments too).

With the tie on, a barrier takes of the function's arguments only what keeps the clones
apart (`_inputs_to_hide`): a clone that reads a distinct value (`x @ w`, x recomputed) reads
the arguments beside it directly, and of an op that reads arguments alone only the smallest
goes through the barrier; the per-region barrier takes none the backward reads. Through a
barrier a weight is another value to XLA, and what XLA makes of it (XLA:CPU's f32 copy of a
bf16 weight for a dot) was made again beside the forward's, at the start of the program
(Gemma 3 bf16 under nothing_saveable, jaxlib 0.12, joint: 1,234,736 B before, 1,072,816 B
after; jax.checkpoint's 1,049,600 B).

`groups=per-use` (the default) places one barrier per recompute group, as above: each
recomputation waits for its own consumer's cotangent. `groups=per-region` places one per
checkpoint region, as `jax.checkpoint` does: the groups of a region (the whole function under
a module policy; the outermost `rp.checkpoint` region otherwise) share one barrier before the
first of them. Neither is smaller everywhere on GPU (measured on an H200, XLA's footprint of a
training step: per-use 5,512,796 B against per-region 3,861,084 B for Equinox under
`nothing_saveable`, where the per-use barriers split fusions XLA could otherwise make;
3,285,932 B against 3,734,388 B under `dots_saveable`); per-region reproduces
`jax.checkpoint`'s footprint to within bytes. rp.jit compiles both on a backend that keeps
barriers and runs the smaller. With `function-region=true` (a module policy; `remat` sets it)
the per-region barrier is JAX's whole one: it takes everything the backward reads from the
forward and is placed even when nothing is recomputed (`place_over_residuals`); with
`tie-to-cotangent=true` the groups' computed inputs are tied after it, as above. (Measured,
XLA:CPU of jaxlib 0.12, the conv net under `everything_saveable`, joint: 3,184,680 B without
it, as without remat, against 2,398,248 B with it; `jax.checkpoint`'s 2,367,512 B. XLA:CPU
turns a barrier it deletes into an order its scheduler keeps: the backward waits for
everything the barrier holds.)

`fence-producers=true` (the default), joint form, where a recomputation got a barrier: a
saved value that XLA stores anyway (a dot, a barrier or the return reads it) but whose
producer is a short chain of cheap elementwise ops on a value the backward does not read
(`x @ w + b`, the dot's output) is read by the backward through one more barrier, at its
first backward reader (`fence_residual_producers`). Otherwise XLA (GPU; XLA:CPU from jaxlib
0.11) fuses that chain again into backward fusions and keeps the dot's output live until
then, beside the saved value. A value no such reader stores is left alone: there XLA's
recomputing it inside each reader is what keeps it from being stored.

`fence-chains=true` (rp.jit sets it on XLA:CPU of jaxlib >= 0.11), where a recomputation got
a barrier, joint and split form: a backward value made by cheap elementwise ops that a dot
or a convolution stores and other readers (a reduce, a transpose, an elementwise op) would
compute again gets a barrier of its own, when the buffers its chain reads are at least
twice its bytes (`fence_duplicated_chains`). Otherwise XLA computes the chain once per
reader and holds its inputs until the last (measured, XLA:CPU of jaxlib 0.12, the Equinox
transformer, joint: 3,118,276 B at `auto(budget=0)` without it, 2,582,400 B with it;
docs/passes.md has the others). Both fences are in `passes/fences.py`.

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

from remat_passes import jax_compat
from remat_passes.analysis.function import RecomputeGroup, recompute_groups
from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import ir, op_id, stablehlo
from remat_passes.passes.base import ModulePass, option, parse_bool
from remat_passes.passes.diagnostics import Remark
from remat_passes.passes.fences import (CHAINS_FENCED, fence_duplicated_chains,
                                         fence_early_clones, fence_residual_producers)


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
    """Do all `inputs` come from one barrier of ours (directly, or through its tie)?"""
    def barrier_of(v):
        if not isinstance(v, ir.OpResult) or not contract.is_barrier(v.owner):
            return None
        op = v.owner
        if op.name != "stablehlo.optimization_barrier":      # a tie: x * factor
            return barrier_of(op.operands[0])
        return op_id(op)
    owners = {barrier_of(v) for v in inputs}
    return len(owners) == 1 and None not in owners


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


def _tieable(v) -> bool:
    """Can `v` be tied (multiplied by an exact 1 made in its own type): a floating-point
    tensor of static shape whose type has a 0. f8E8M0FNU (powers of two only) has none: 0
    converted to it is NaN, and every value tied through it came out NaN."""
    return graph.is_static_float(v) and \
        str(ir.RankedTensorType(v.type).element_type) != "f8E8M0FNU"


def _tie_source(ct) -> bool:
    """Can the ties read `ct` (a floating-point tensor of static shape with an element)?"""
    return _tieable(ct) and bool(graph.type_elements(ct.type))


def _tied(values: list, ct: ir.Value, before, note) -> list:
    """`values` read through a tie to `ct` (`_tie`), made right before op `before`; the
    ops made for it are reported to `note`."""
    with before.location:
        tied, made = _tie(values, ct, ir.InsertionPoint(before))
    if note is not None:
        for op in made:
            note(op, before)
    return tied


def _to_tie(group, inputs, is_argument, with_arguments: bool = False) -> list:
    """The inputs of `group` to read through a tie: walking its ops in order, an op that
    reads a computed input (not an argument of the function) but nothing tied yet,
    directly or through the group's own results, gets its smallest computed input tied
    (one tied operand is enough to make the op wait; where XLA does not fuse the
    multiply into its users it is a copy, so the smallest costs least). Afterwards every
    op that reads a computed input waits for the cotangent.

    An op that reads arguments alone gets its smallest argument tied where its results
    outweigh that argument (an embedding `x @ w`, a weight broadcast over the batch):
    untied, XLA:CPU runs it, and every clone that reads it, where its arguments are ready,
    in the forward (the barrier orders nothing there: XLA drops a barrier's results no op
    reads, the cotangent among them), and holds what they make until the backward reads it
    (measured, jaxlib 0.12, the Equinox transformer at objective=peak 2,963,080 B, joint
    per use: its first block's recomputed embedding, layer norm and softmax, 3,374,976 B
    against 2,779,008 B tied). Not where the argument is as large as what the op makes (a
    weight transposed or reshaped): the tie would copy it to save nothing (the GPT's tied
    256x128 head weight: +131,072 B). `with_arguments` (two levels): every op reading
    arguments alone gets its smallest tied, or the second level of the first segment
    merges with the first."""
    candidates = {v for v in inputs if _tieable(v) and not is_argument(v)}
    arguments = {v for v in inputs if _tieable(v) and is_argument(v)}
    waiting, chosen = set(), []
    for op in group.ops:
        reads = graph.read_values(op)
        if any(v in waiting for v in reads):
            waiting.update(op.results)
            continue
        outside = [v for v in reads if v in candidates] or \
            [v for v in reads if v in arguments]
        if outside:
            pick = min(outside, key=lambda v: graph.type_bytes(v.type))
            if pick in arguments and not with_arguments and graph.type_bytes(pick.type) >= \
                    sum(graph.type_bytes(r.type) for r in op.results):
                continue      # (a weight transposed or reshaped: nothing to gain)
            chosen.append(pick)
            waiting.add(pick)
            waiting.update(op.results)
    return chosen


def _argument_test(module_op, func_op):
    """is_argument(value) for `_to_tie`: an argument of the function the user gave. In
    split form, a `_bwd` argument is one when `_fwd` hands over its own argument."""
    args = set(graph.body_block(func_op).arguments)
    name = graph.func_name(func_op)
    if not name.endswith("_bwd"):
        return lambda v: v in args
    fwd = graph.find_func(module_op, name[:-len("_bwd")] + "_fwd")
    if fwd is None:
        return lambda v: v in args
    returned = list(graph.terminator(graph.body_block(fwd)).operands)
    residual_at = contract.residual_results(fwd)
    bwd_args = list(graph.body_block(func_op).arguments)
    passed = {bwd_args[k] for k, i in enumerate(residual_at)
              if k < len(bwd_args) and isinstance(returned[i], ir.BlockArgument)}
    cotangents = set(bwd_args[len(residual_at):])
    return lambda v: v in passed or v in cotangents


def _tie(values: list, ct: ir.Value, ip) -> tuple[list, list]:
    """`values`, each multiplied by a 1 computed from `ct` (see the module docstring);
    and the ops made for it, in order."""
    made = []

    def make(name, result_type, operands, **attributes) -> ir.Value:
        made.append(ir.Operation.create(name, results=[result_type], operands=operands,
                                        attributes=attributes, ip=ip))
        return made[-1].results[0]

    ct_type = ir.RankedTensorType(ct.type)
    rank = ct_type.rank
    scalar_type = ir.RankedTensorType.get([], ct_type.element_type)
    scalar = ct if not rank else make(
        "stablehlo.reshape", scalar_type,
        [make("stablehlo.slice", ir.RankedTensorType.get([1] * rank, ct_type.element_type),
              [ct], start_indices=ir.DenseI64ArrayAttr.get([0] * rank),
              limit_indices=ir.DenseI64ArrayAttr.get([1] * rank),
              strides=ir.DenseI64ArrayAttr.get([1] * rank))])
    finite = make("stablehlo.is_finite",
                  ir.RankedTensorType.get([], ir.IntegerType.get_signless(1)), [scalar])
    ones: dict = {}
    out = []
    for v in values:
        t = ir.RankedTensorType(v.type)
        elem = t.element_type
        if str(elem) not in ones:   # sqrt(1 + 0 * convert(is_finite(c))), once per dtype
            st = ir.RankedTensorType.get([], elem)
            zero, one = (make("stablehlo.constant", st, [], value=ir.DenseElementsAttr.get_splat(
                st, ir.FloatAttr.get(elem, x))) for x in (0.0, 1.0))
            flag = make("stablehlo.convert", st, [finite])
            ones[str(elem)] = make("stablehlo.sqrt", st, [make(
                "stablehlo.add", st, [make("stablehlo.multiply", st, [flag, zero]), one])])
        factor = make("stablehlo.broadcast_in_dim", t, [ones[str(elem)]],
                      broadcast_dimensions=ir.DenseI64ArrayAttr.get([]))
        out.append(make("stablehlo.multiply", t, [v, factor]))
        contract.mark_barrier(made[-1])     # ours: a second run sees the group placed
    return out, made


GROUPINGS = ("per-use", "per-region")


def parse_groups(text: str) -> str:
    t = text.strip()
    if t not in GROUPINGS:
        raise ValueError(f"expected one of {', '.join(GROUPINGS)}, got '{text}'")
    return t


def per_region(groups: list, position: dict) -> list:
    """The recompute groups merged per checkpoint region (`groups=per-region`): each group
    joins the earlier group of its outermost region (None: the function's own policy), so
    the region gets one barrier before its first recomputation, as jax.checkpoint places
    it. A group that reads a value made after that first recomputation (which the barrier
    could not take) starts a new one. `position`: op id -> index in the block."""
    open_by_region: dict = {}  # region -> (merged group, its first op's position, its results)
    out = []
    for g in groups:
        # (a clone of a constant carries no name stack: the first op with one says)
        region = next((chain[0] for chain in map(graph.scope_chain, g.ops) if chain), None)
        if region in open_by_region:
            m, start, made = open_by_region[region]
            if all(not isinstance(v, ir.OpResult) or v in made
                   or position.get(op_id(v.owner), start) < start for v in g.inputs()):
                m.ops.extend(g.ops)
                made.update(r for op in g.ops for r in op.results)
                continue
        m = RecomputeGroup(list(g.ops), g.consumer, g.latest_backward)
        open_by_region[region] = (m, position[op_id(g.ops[0])],
                                  {r for op in g.ops for r in op.results})
        out.append(m)
    return out


def _inputs_to_hide(group, is_shape, is_argument=None) -> list:
    """What a barrier for `group` would take: its inputs but shape values; none for a
    shape computation (dimension sizes), where there is nothing to hide.

    With `is_argument` (XLA:CPU, `tie-to-cotangent`; module docstring), of the function's
    arguments only what keeps the clones apart from the forward ops they copy: walking the
    group in order, an op that reads arguments alone (no computed input, nothing an earlier
    op made distinct) gets its smallest argument hidden; an op that reads a distinct value
    (`x @ w`, x recomputed) is a clone of its own and reads the arguments beside it as they
    are, so what XLA makes of a weight for it (XLA:CPU's f32 copy of a bf16 weight) is the
    forward's, not a second one."""
    if all(is_shape(r) for op in group.ops for r in op.results):
        return []
    inputs = [v for v in group.inputs() if not is_shape(v)]
    if is_argument is None:
        return inputs
    hidden = {v for v in inputs if not is_argument(v)}
    distinct = set()
    for op in group.ops:
        reads = [v for v in graph.read_values(op) if not is_shape(v)]
        if not reads:
            continue
        if not any(v in hidden or v in distinct for v in reads):
            arguments = [v for v in reads if is_argument(v)]     # arguments alone
            if arguments:
                hidden.add(min(arguments, key=lambda v: graph.type_bytes(v.type)))
        distinct.update(op.results)
    return [v for v in inputs if v in hidden]


def _markers_only(group, is_shape) -> bool:
    """Does `group` recompute nothing but checkpoint-name markers (and shape values)? A
    marker is an identity on a value the policy saves (it saves the op a name marks, not the
    name, as `save_anything_except_these_names` does): nothing to keep apart from the
    forward, so such a group does not keep per-region's barrier over the residuals from
    being placed. (Measured, the conv net's step under
    save_anything_except_these_names(conv0), per region, joint, XLA:CPU of jaxlib 0.11.2
    and 0.12: with the marker's group counted, no barrier over the residuals, 3,217,100 B;
    without, 2,373,324 B, jax.checkpoint's. Per use the marker keeps its barrier: there it
    measured smaller, jaxlib 0.10 joint 2,195,776 B of temp against 2,720,064 B without,
    jaxlib 0.12 split backward 1,409,024 B against 1,671,168 B.)"""
    return all(contract.checkpoint_name(op) is not None or is_shape(r)
               for op in group.ops for r in op.results)


def place(groups, is_backward, cotangents, note=None, skip=None, is_manual=None,
          is_shape=None, tie=None, tie_arguments: bool = False, is_argument=None) -> int:
    """One barrier per group (but those `skip(group)` names); returns how many were placed.
    `is_shape(value)`: computed from constants and dimension sizes alone (by default, a
    walk over its operands). `tie(value) -> is it an argument of the function`, if given:
    also read the group's computed inputs through a data dependency on the cotangent
    (`_to_tie`, `_tie`), for XLA:CPU.

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
        inputs = _inputs_to_hide(group, is_shape, is_argument)
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
            if tie is not None and same and _tie_source(ct):
                chosen = _to_tie(group, kind, tie, tie_arguments)
                if chosen:
                    mapping.update(zip(chosen, _tied([mapping[v] for v in chosen],
                                                     barrier.results[-1], first, note)))
            if note is not None:
                note(barrier.operation, first)
        graph.replace_reads_all(group.ops, mapping)
        placed += 1
    return placed


def place_over_residuals(a, block, groups, is_shape, note=None, tie=None,
                         tie_arguments: bool = False, is_argument=None) -> int:
    """`groups=per-region` under a module policy (the whole function one checkpoint region,
    no `rp.checkpoint` regions): one barrier before the region's backward begins (its first
    op that reads the forward, or its first recomputation) over every forward value the
    backward and the recompute `groups` read, with the incoming cotangent, as
    `jax.checkpoint(f, policy)` lowers the backward of its region, even when nothing is
    recomputed. It keeps XLA from fusing forward ops into the backward: the forward hands
    over what the policy saves (a relu's mask as a `pred`, say) instead of the larger values
    those are computed from (measured on an H200: conv net under everything_saveable,
    joint, 2,239,820 B with it against 2,924,764 B without; JAX 2,239,828 B). Values made
    after that point (an interleaved program, a group's late input) are read as they are;
    place() then gives a group that reads one its own barrier. `tie` (is_argument), for
    XLA:CPU: each group's computed inputs read through a tie to the barrier's cotangent, as
    place() ties them (`_to_tie`). `is_argument`: the groups' arguments as place() hides
    them (`_inputs_to_hide`). Returns 1 if placed."""
    ct_args = [a.args[i] for i in a.cotangent_indices]
    cotangents = set(ct_args)
    ops = [op.operation for op in block.operations][:-1]        # (not the return)
    clone_ids = {op_id(op) for g in groups for op in g.ops}
    forward, readers, first = set(), [], None
    for op in ops:
        if op_id(op) in clone_ids:
            first = first or op
            continue
        if not a.is_backward(op):
            if first is None and not contract.is_recompute_clone(op):
                forward.update(op.results)
            continue
        reads = [v for v in graph.read_values(op) if v not in cotangents and (
            v in forward or (isinstance(v, ir.BlockArgument) and v.owner == block))]
        if any(not is_shape(v) for v in reads):
            first = first or op
            readers.append(op)
    if first is None or contract.is_barrier(first):
        return 0        # nothing read from the forward (or placed by an earlier run)
    args = set(block.arguments)

    def from_forward(vs):       # what the barrier may take: forward values, arguments
        return [v for v in vs if not is_shape(v) and v not in cotangents
                and (v in forward or v in args)]
    values = [v for op in readers for v in from_forward(graph.read_values(op))
              if is_argument is None or not is_argument(v)]
    # (ordered, not sets: the barrier's operands keep one order from run to run)
    hidden = [dict.fromkeys(from_forward(_inputs_to_hide(g, is_shape, is_argument)))
              for g in groups]
    values = list(dict.fromkeys(values + [v for h in hidden for v in h]))
    if not values or _already_placed(values):
        return 0
    ct = next((c for c in ct_args if graph.is_static_float(c)), None)
    barrier = stablehlo.OptimizationBarrierOp(values + ([ct] if ct is not None else []),
                                              ip=ir.InsertionPoint(first), loc=first.location)
    contract.mark_barrier(barrier)
    if note is not None:
        note(barrier.operation, first)
    mapping = dict(zip(values, barrier.results))
    chosen = [_to_tie(g, [v for v in g.inputs() if v in h], tie, tie_arguments)
              if tie is not None and ct is not None and _tie_source(ct) else []
              for g, h in zip(groups, hidden)]
    graph.replace_reads_all(readers, mapping)
    for group, h in zip(groups, hidden):
        graph.replace_reads_all(group.ops, {v: mapping[v] for v in h})
    for group, picked in zip(groups, chosen):
        if picked:
            held = [mapping[v] for v in picked]
            tied = _tied(held, barrier.results[-1], group.ops[0], note)
            graph.replace_reads_all(group.ops, dict(zip(held, tied)))
    return 1


def place_in_loops(func_op, tie=None) -> int:
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
        placed += place(groups, lambda op: not contract.is_recompute_clone(op), changing,
                        tie=tie)
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
    tie_to_cotangent: bool = option(
        False, "also make the recomputation wait for the cotangent by data, for XLA:CPU "
        "(which deletes barriers before it schedules)")
    groups: str = option("per-use", "per-use: one barrier per recomputation, at its "
                         "consumer; per-region: one per checkpoint region, as jax.checkpoint",
                         parse_groups)
    function_region: bool = option(
        False, "the whole function is one checkpoint region (a module policy): with "
        "groups=per-region its backward reads everything from the forward through one "
        "barrier, also when nothing is recomputed, as jax.checkpoint(f, policy)", parse_bool)
    fence_producers: bool = option(
        True, "joint form, where something is recomputed: a saved value XLA stores anyway "
        "is read by the backward through a barrier, so XLA cannot fuse its cheap producer "
        "into backward readers and keep that producer's input live", parse_bool)
    fence_chains: bool = option(
        False, "where something is recomputed: a backward value made by cheap elementwise ops "
        "that one reader stores and others would compute again gets a barrier of its own, "
        "so XLA computes it once and its inputs die there (rp.jit sets it on XLA:CPU of "
        "jaxlib >= 0.11)", parse_bool)

    def apply(self, module_op, state) -> None:
        name = self.func
        target = f"{name}_bwd" if graph.is_split(module_op, name) else name
        with module_op.context:
            f = graph.find_func(module_op, target)
            a = state.analysis(f)
            # (also which arguments a group's clones read directly: `_inputs_to_hide`)
            is_argument = _argument_test(module_op, f) if self.tie_to_cotangent else None
            tie = is_argument
            no_activation = tie is not None and all(tie(v) for v in a.residuals) \
                and contract.recompute_levels(f) == 1
            if no_activation:
                tie = None   # the forward keeps no activation (module docstring)
            # (and joint, per use, where XLA:CPU keeps barriers through its CSE: no barrier
            # at all, so XLA merges the clones with the forward ops they copy, as the
            # module docstring says)
            merge = no_activation and self.groups == "per-use" and target == name \
                and not jax_compat.xla_cpu_fuses_across_barriers()
            groups = [] if merge else a.recompute_groups
            if self.groups == "per-region":
                groups = per_region(groups, {op_id(op): i for i, op in
                                             enumerate(graph.body_block(f).operations)})

            def note(barrier, first=None, after=None):
                a.note_inserted(barrier, backward=True, before=first, after=after)
            is_shape = _shape_test(a)
            # (tied: where a cotangent argument can be the ties' source, else place() ties
            # each group to its consumer's incoming cotangent. With no group to tie or hide,
            # as under everything_saveable, the barrier needs no source (a gradient step's
            # cotangent is a constant) and takes the arguments the backward reads as JAX's
            # does: nothing is recomputed from them. Measured, XLA:CPU of jaxlib 0.12, the
            # conv net's step: 3,086,348 B without the barrier, 2,463,756 B without its
            # arguments, 2,373,324 B with them, jax.checkpoint's to the byte)
            placed = 0
            region = self.groups == "per-region" and self.function_region \
                and target == name and _manual_test(a) is None \
                and not any(graph.scope_chain(op) for g in groups for op in g.ops)
            hiding = [g for g in groups if not _markers_only(g, is_shape)
                      and _inputs_to_hide(g, is_shape)] if region else []
            if region and (tie is None or not hiding or any(_tie_source(a.args[i])
                                                            for i in a.cotangent_indices)):
                placed = place_over_residuals(
                    a, graph.body_block(f), hiding, is_shape, note, tie=tie,
                    tie_arguments=contract.recompute_levels(f) == 2,
                    is_argument=is_argument if hiding else None)
            placed += place(groups, a.is_backward, [a.args[i] for i in a.cotangent_indices],
                            note, _in_regions_without_barrier(module_op), _manual_test(a),
                            is_shape, tie=tie, tie_arguments=contract.recompute_levels(f) == 2,
                            is_argument=is_argument)
            if not merge:
                fence_early_clones(a.recompute_groups, is_shape, note)
            # (only where something is recomputed: with no barrier of a recomputation, a
            # program keeps its residuals as XLA fuses them, and rp.jit can tell it apart)
            if self.fence_producers and placed and target == name and _manual_test(a) is None:
                fence_residual_producers(a, graph.body_block(f), is_shape, note)
            if self.fence_chains and placed and _manual_test(a) is None:
                fenced = fence_duplicated_chains(a, graph.body_block(f), is_shape, note)
                if fenced:      # (rp.jit reads it: where none is, it builds no twin)
                    state.remarks.append(Remark(
                        f"@{target}: {CHAINS_FENCED} {fenced} backward value(s) a barrier "
                        "of their own, so XLA computes each once for all its readers",
                        f.location))
            if self.in_loops:
                place_in_loops(f, tie=tie)
