"""fold-dot-transposes: compute a saved matrix product in the order its forward reader takes.

Under `jax.vmap` a matrix-vector product (`W @ x` per example: Equinox's `Linear`, any
per-example model) lowers to a `dot_general` whose result has the batch last,
`[out, batch]`, and a `transpose` to `[batch, out]`. Without remat XLA folds the two into
one product written in the transposed order (its algebraic simplifier swaps the operands
where the transpose is the product's only reader). Once the backward keeps the product
(`dots_saveable`, a plan that saves it) the product has a second reader, the backward's,
through the rounding insert-reduce-precision puts on it, an optimization barrier and the
tie to the cotangent; XLA no longer folds, and XLA:CPU transposes the value physically in the
forward and again in each recomputation that reads it (Equinox's benchmark step under
`dots_saveable`: 69 copies in the compiled program against 1 without remat; `jax.checkpoint`'s
own program has 40, and its step takes 1.24x `eqx.filter_jit`'s on XLA:CPU).

This pass, run after the barriers are placed, folds them itself. For `t = transpose(r)`,
`r` the product (or its rounding), whose permutation puts the right operand's free
dimensions before the left's (batch dimensions first, as `dot_general` orders them), the
product becomes `dot_general(rhs, lhs)`, which is `t`; and where the backward reads `r`
through barriers and multiplications by a broadcast scalar (the tie) into the same
transpose, those read the new product directly and the transpose goes. A product read in
any other way (a split forward returning it, a slice of it) is left as it is: folding it
would move a transpose, not remove one. So is a product the transpose alone reads: XLA folds
that one itself, and folding it here changed what XLA:CPU allocates (25 products of the
benchmark GPT's backward: +1.3 MB of temp under one offload policy, joint). The product
swapped sums the same terms (a library may add them in another order, as after XLA's own
fold), and what is saved is the same value: the residuals remat-partial-eval reports, with
JAX's shapes, stay true of it. Only top-level ops of each function are rewritten (a loop
body's product is stacked by the loop, which reads it otherwise), and none that carries a
sharding (it names the result's dimensions in order) or a dot algorithm.

With `across-halves=true` (split form) a residual is folded too, where the forward, besides
returning it, reads it only through such transposes and the backward reads it only through
the same transpose: the forward returns the product swapped, and the backward reads it as it
is. The residual then crosses in the transposed order, its shape not JAX's, and its
description says so; rp.jit sets it in split form, where only its own halves read the
residuals (a function differentiated from outside: the Equinox loss under `dots_saveable`, 70
copies in the step against 13, 69.8 ms against 39.9 ms on XLA:CPU; its own two executables:
the Equinox step, 69 copies against 12, 62 ms against 51 ms).
"""
from __future__ import annotations

import dataclasses

from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import ir, op_id, stablehlo
from remat_passes.passes.base import ModulePass, option, parse_bool

DOT, TRANSPOSE = "stablehlo.dot_general", "stablehlo.transpose"
BARRIER, MULTIPLY = "stablehlo.optimization_barrier", "stablehlo.multiply"
ROUNDING = "stablehlo.reduce_precision"


# (a sharding on an op names its result's dimensions in order: where one is on the product
# or its readers, the product is left as written)
SHARDINGS = ("mhlo.sharding", "sdy.sharding")


def _sharded(op) -> bool:
    return any(name in op.attributes for name in SHARDINGS)


def _permutation(op) -> list[int]:
    return list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))


def _swapped_order(dot) -> list[int] | None:
    """The permutation of `dot`'s result that computing it with its operands swapped
    gives: batch dimensions, then the right operand's free ones, then the left's."""
    dims = stablehlo.DotDimensionNumbers(dot.attributes["dot_dimension_numbers"])
    lhs, rhs = (ir.RankedTensorType(v.type).rank for v in dot.operands)
    batch = len(dims.lhs_batching_dimensions)
    lhs_free = lhs - batch - len(dims.lhs_contracting_dimensions)
    rhs_free = rhs - batch - len(dims.rhs_contracting_dimensions)
    if lhs_free == 0 or rhs_free == 0:
        return None        # (nothing to swap)
    return list(range(batch)) + [batch + lhs_free + i for i in range(rhs_free)] + \
        [batch + i for i in range(lhs_free)]


def _splat_factor(op, value) -> bool:
    """`op` multiplies `value` (once) by a scalar broadcast (the tie to the cotangent)."""
    if op.operation.name != MULTIPLY:
        return False
    other = [v for v in op.operands if v != value]
    if len(other) != 1 or not isinstance(other[0], ir.OpResult):
        return False
    b = other[0].owner
    return b.operation.name == "stablehlo.broadcast_in_dim" and \
        ir.RankedTensorType(b.operands[0].type).rank == 0


def _reaches_transpose(value, perm: list[int]) -> bool:
    """Every reader of `value` is a transpose by `perm`, or passes it through a barrier or
    a multiplication by a broadcast scalar to readers that are."""
    for use in value.uses:
        op = use.owner
        if _sharded(op):
            return False
        if op.operation.name == TRANSPOSE and _permutation(op) == perm:
            continue
        if op.operation.name == BARRIER:
            if not _reaches_transpose(op.results[use.operand_number], perm):
                return False
        elif _splat_factor(op, value):
            if not _reaches_transpose(op.results[0], perm):
                return False
        else:
            return False
    return True


def _reroute(value, new, erased: set) -> None:
    """Have the readers of `value` (as `_reaches_transpose` found them) read `new`, the
    transposed value: the transposes go (their ids into `erased`), barriers and
    multiplications are made again in `new`'s order."""
    # (a barrier that takes the value twice is one reader)
    readers = {op_id(use.owner): use.owner for use in value.uses}
    for op in readers.values():
        if op.operation.name == TRANSPOSE:
            op.results[0].replace_all_uses_with(new)
            erased.add(op_id(op))
            op.erase()
        elif op.operation.name == BARRIER:
            operands = [new if v == value else v for v in op.operands]
            remade = ir.Operation.create(BARRIER, results=[v.type for v in operands],
                                         operands=operands, attributes=graph.attributes(op),
                                         loc=op.location, ip=ir.InsertionPoint(op))
            for old, made in zip(op.results, remade.results):
                if old.type == made.type:
                    old.replace_all_uses_with(made)
                else:
                    _reroute(old, made, erased)
            op.erase()
        else:           # (a multiplication by a broadcast scalar)
            factor = next(v for v in op.operands if v != value).owner
            ip = ir.InsertionPoint(op)
            spread = ir.Operation.create(
                factor.operation.name, results=[new.type], operands=list(factor.operands),
                attributes=graph.attributes(factor), loc=factor.location, ip=ip)
            operands = [new if v == value else spread.results[0] for v in op.operands]
            remade = ir.Operation.create(MULTIPLY, results=[new.type], operands=operands,
                                         attributes=graph.attributes(op), loc=op.location, ip=ip)
            _reroute(op.results[0], remade.results[0], erased)
            op.erase()
            if not list(factor.results[0].uses):
                factor.erase()


def fold(transpose, erased: set) -> bool:
    """Fold `transpose` into the product it reads, where it can (module docstring); the
    ids of the transposes that go are added to `erased`."""
    read = transpose.operands[0]
    if not isinstance(read, ir.OpResult):
        return False
    rounding = read.owner if read.owner.operation.name == ROUNDING else None
    product = rounding.operands[0] if rounding is not None else read
    if not isinstance(product, ir.OpResult) or product.owner.operation.name != DOT or \
            (rounding is not None and len(list(product.uses)) != 1):
        return False
    dot = product.owner
    if "algorithm" in dot.attributes or _sharded(dot) or \
            (rounding is not None and _sharded(rounding)):
        return False      # (a dot algorithm's operand types are per side: left as written)
    perm = _permutation(transpose)
    if len(list(read.uses)) == 1 or _swapped_order(dot) != perm or \
            not _reaches_transpose(read, perm):
        return False      # (a transpose alone reads it: XLA folds that one itself)
    dims = stablehlo.DotDimensionNumbers(dot.attributes["dot_dimension_numbers"])
    attributes = graph.attributes(dot)
    if "precision_config" in attributes:     # (one per operand: swapped with them)
        attributes["precision_config"] = ir.ArrayAttr.get(
            list(reversed(list(ir.ArrayAttr(attributes["precision_config"])))))
    attributes["dot_dimension_numbers"] = stablehlo.DotDimensionNumbers.get(
        lhs_batching_dimensions=list(dims.rhs_batching_dimensions),
        rhs_batching_dimensions=list(dims.lhs_batching_dimensions),
        lhs_contracting_dimensions=list(dims.rhs_contracting_dimensions),
        rhs_contracting_dimensions=list(dims.lhs_contracting_dimensions))
    ip = ir.InsertionPoint(dot)
    swapped = ir.Operation.create(DOT, results=[transpose.results[0].type],
                                  operands=list(reversed(list(dot.operands))),
                                  attributes=attributes, loc=dot.location, ip=ip).results[0]
    if rounding is not None:
        swapped = ir.Operation.create(ROUNDING, results=[swapped.type], operands=[swapped],
                                      attributes=graph.attributes(rounding),
                                      loc=rounding.location, ip=ip).results[0]
    _reroute(read, swapped, erased)
    if rounding is not None:
        rounding.erase()
    dot.erase()
    return True


def residuals_as_folded(module_op, residuals: list, func: str = "main") -> list:
    """`residuals` (remat-partial-eval's of the split module `module_op`) as they now cross:
    each one across-halves folded with its type transposed and its description saying of
    what (`f32[16,8] transpose of f32[8,16] output of dot_general ...`). As given where they
    do not match the forward's residual results one for one."""
    fwd = graph.find_func(module_op, f"{func}_fwd")
    results = contract.residual_results(fwd) if fwd is not None else []
    # (the forward returns each residual, or, once rp.jit's split form drops them, those
    # that are not arguments)
    returned = [k for k, r in enumerate(residuals) if not r.argument]
    if len(results) == len(residuals):
        returned = list(range(len(residuals)))
    elif len(results) != len(returned):
        return residuals
    out = list(residuals)
    with module_op.context:
        for k, i in zip(returned, results):
            r = residuals[k]
            text = ir.StringAttr(contract.entry(fwd, "res_attrs", i, contract.RESIDUAL)).value
            if text == f"{r.type} {r.description}":
                continue
            new_type, _, description = text.partition(" ")
            if description != f"transpose of {r.type} {r.description}":
                return residuals        # (not the residual it was: leave them all as given)
            out[k] = dataclasses.replace(r, type=new_type, description=description)
    return out


def fold_residual(fwd, bwd, index: int, erased: set) -> bool:
    """Fold the product `fwd` returns at `index` (a residual) where the forward, besides
    returning it, reads it only through transposes `fold` takes, and `bwd` reads every
    argument it crosses as (the same value may cross more than once) only through the same
    transpose: the forward then returns the transposed product, which the backward reads
    as it is (its transposes go), and the residual's type and description say so."""
    ret = graph.terminator(graph.body_block(fwd))
    value = ret.operands[index]
    if not isinstance(value, ir.OpResult) or contract.offload_entry(fwd, "res_attrs", index):
        return False
    residuals = contract.residual_results(fwd)
    positions = [i for i, v in enumerate(ret.operands) if v == value]
    if not set(positions) <= set(residuals):
        return False      # (also an output of the function: read there in JAX's order)
    args = [graph.body_block(bwd).arguments[residuals.index(i)] for i in positions]
    readers = [u.owner for u in value.uses if u.owner != ret]
    transposes = [op for op in readers if op.operation.name == TRANSPOSE]
    if not transposes or any(_sharded(op) for op in readers):
        return False
    perm = _permutation(transposes[0])
    if not all(_reaches_transpose(arg, perm) for arg in args):
        return False
    # (the return reads the transposed value, as the forward's readers: `fold` takes it)
    crossing = ir.Operation.create(TRANSPOSE, results=[transposes[0].results[0].type],
                                   operands=[value], attributes=graph.attributes(
                                       transposes[0]), ip=ir.InsertionPoint(ret)).results[0]
    for i in positions:
        ret.operands[i] = crossing
    if not fold(crossing.owner, erased):
        for i in positions:
            ret.operands[i] = value
        crossing.owner.erase()
        return False
    for i, arg in zip(positions, args):
        old = ir.StringAttr(contract.entry(fwd, "res_attrs", i, contract.RESIDUAL)).value
        contract.set_entry(fwd, "res_attrs", i, contract.RESIDUAL, ir.StringAttr.get(
            f"{graph.jax_type_str(ret.operands[i].type)} transpose of {old}"))
        arg.set_type(ret.operands[i].type)   # (now the transposed value its readers take:
        _reroute(arg, arg, erased)           # the transposes go, barriers and ties remade)
    graph.retype(fwd)
    graph.retype(bwd)
    return True


@dataclasses.dataclass
class FoldDotTransposes(ModulePass):
    name = "fold-dot-transposes"
    preserves_analyses = True     # (it drops those of the functions it changes)
    summary = ("Compute a matrix product read through a transpose (a vmapped matrix-vector "
               "product) in the transposed order, also where the backward keeps it")

    func: str = option("main", "the function (both halves in split form) to rewrite")
    across_halves: bool = option(
        False, "in split form, also fold a product the forward returns as a residual that "
        "the backward reads only through the same transpose: the residual then crosses in "
        "the transposed order, and its shape is not JAX's (rp.jit's halves, differentiated "
        "from outside, where no one reads the residuals)", parse_bool)

    def apply(self, module_op, state) -> None:
        with module_op.context, ir.Location.unknown():
            for name in graph.functions_of(module_op, self.func):
                f = graph.find_func(module_op, name)
                if f is None:
                    continue
                transposes = [(op_id(op), op) for op in graph.body_block(f).operations
                              if op.operation.name == TRANSPOSE]
                erased: set = set()     # (a fold also takes the backward's transposes)
                for key, op in transposes:
                    if key not in erased and fold(op, erased):
                        state.drop(name)
            if self.across_halves and graph.is_split(module_op, self.func):
                fwd, bwd = (graph.find_func(module_op, f"{self.func}_{half}")
                            for half in ("fwd", "bwd"))
                erased = set()
                for index in contract.residual_results(fwd):
                    if fold_residual(fwd, bwd, index, erased):
                        state.drop(f"{self.func}_fwd")
                        state.drop(f"{self.func}_bwd")
