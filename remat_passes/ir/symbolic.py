"""Names of symbolic dimensions (`jax.export.symbolic_shape`) for reports: `f32[b,4]`.

StableHLO writes a symbolic dimension as `?`; the name lives only in how
`jax.export` builds the module: `@main` computes each dimension variable with
`get_dimension_size` of an argument and passes it to the exported function's
body, whose parameter says `{jax.global_constant = "b"}`. `argument_dims` reads
that before `inline` erases it (the pipeline runner keeps the answer on its
`PassState`; a Module keeps it as `dim_symbols`), and `DimNames` carries the
names forward through a function: ops whose result has an operand's shape,
`dot_general`, `broadcast_in_dim`, `transpose`, `reduce`, loops, and the shape
operands of `dynamic_broadcast_in_dim` / `dynamic_reshape` / `dynamic_iota`
(built from `get_dimension_size`, constants and products). A dimension none of
these explain stays `?`. One forward sweep, on first use: O(number of ops).
"""
from __future__ import annotations

from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import ir

GLOBAL_CONSTANT = "jax.global_constant"
UNKNOWN = "?"

# {function name: {argument number: (label of each dimension: a symbol, or None)}}
ArgumentDims = dict


def _ranked(t):
    try:
        return ir.RankedTensorType(t)
    except (ValueError, TypeError):
        return None


def _through_scalars(value):
    """The op a scalar shape value comes from, looking through convert/reshape."""
    while isinstance(value, ir.OpResult) and value.owner.name in (
            "stablehlo.convert", "stablehlo.reshape"):
        value = value.owner.operands[0]
    return value


def argument_dims(module_op) -> ArgumentDims:
    """The symbols of the public functions' argument dimensions, read from the calls
    `jax.export` makes to its exported body (empty when there are none, or once
    inlined)."""
    funcs = {graph.func_name(op): op for op in module_op.body.operations
             if op.operation.name == "func.func"}
    if not any(GLOBAL_CONSTANT in entries for f in funcs.values()
               for entries in contract.all_entries(f, "arg_attrs")):
        return {}       # (no exported body takes dimension variables: nothing to scan)
    out: ArgumentDims = {}
    for name, f in funcs.items():
        if not graph.is_public(f) or not f.regions[0].blocks:
            continue
        for op in graph.body_block(f).operations:
            if op.name != "func.call":
                continue
            callee = funcs.get(ir.FlatSymbolRefAttr(op.attributes["callee"]).value)
            if callee is None:
                continue
            for i, operand in enumerate(op.operands):
                symbol = contract.entry(callee, "arg_attrs", i, GLOBAL_CONSTANT)
                source = _through_scalars(operand)
                if symbol is None or not isinstance(source, ir.OpResult) or \
                        source.owner.name != "stablehlo.get_dimension_size":
                    continue
                arg = source.owner.operands[0]
                if not isinstance(arg, ir.BlockArgument):
                    continue
                rt = _ranked(arg.type)
                dims = out.setdefault(name, {}).setdefault(
                    arg.arg_number, [None] * (rt.rank if rt else 0))
                d = ir.IntegerAttr(source.owner.attributes["dimension"]).value
                if d < len(dims):
                    dims[d] = ir.StringAttr(symbol).value
    return {f: {a: tuple(d) for a, d in args.items()} for f, args in out.items()}


class DimNames:
    """Labels of the dimensions of a function's values: static sizes as numbers,
    symbolic ones by name where known, else `?`."""

    def __init__(self, func_op, args: dict | None = None):
        self.func_op = func_op
        self._args = args or {}
        self._labels: dict | None = None      # value -> tuple of labels (values hash)

    # -------------------------------------------------------------- queries --
    def labels(self, value) -> tuple[str, ...] | None:
        rt = _ranked(value.type)
        if rt is None:
            return None
        if rt.has_static_shape:
            return tuple(str(d) for d in rt.shape)
        if self._labels is None:
            self._labels = {}
            self._sweep()
        known = self._labels.get(value)
        return tuple(known[i] if rt.is_dynamic_dim(i) and known and known[i] else
                     (UNKNOWN if rt.is_dynamic_dim(i) else str(d))
                     for i, d in enumerate(rt.shape))

    def type_str(self, value) -> str:
        """`f32[b,4]`: graph.jax_type_str with the names of symbolic dimensions."""
        text = graph.jax_type_str(value.type)
        labels = self.labels(value)
        if labels is None or "[" not in text:
            return text
        return text[:text.index("[")] + "[" + ",".join(labels) + "]"

    def symbols(self, value) -> str | None:
        """The product of a value's symbolic dimensions (`b`, `b*s`), None if one is unknown
        or the value has none."""
        rt = _ranked(value.type)
        labels = self.labels(value)
        if rt is None or labels is None:
            return None
        names = [labels[i] for i in range(rt.rank) if rt.is_dynamic_dim(i)]
        if not names or UNKNOWN in names:
            return None
        return "*".join(names)

    def split_arguments(self, analysis, residuals) -> ArgumentDims:
        """The argument dimensions of `<f>_fwd(primals)` and `<f>_bwd(residuals,
        cotangents)` that split.split_function makes of this function."""
        args = analysis.args
        primal = [v for i, v in enumerate(args) if i not in analysis.cotangent_vids]
        cot = [v for i, v in enumerate(args) if i in analysis.cotangent_vids]

        def named(values):
            return {i: self.labels(v) for i, v in enumerate(values)
                    if _ranked(v.type) is not None and not _ranked(v.type).has_static_shape}
        return {f"{analysis.name}_fwd": named(primal),
                f"{analysis.name}_bwd": named(list(residuals) + cot)}

    # ---------------------------------------------------------------- sweep --
    def _get(self, value):
        rt = _ranked(value.type)
        if rt is None:
            return None
        if rt.has_static_shape:
            return tuple(str(d) for d in rt.shape)
        return self._labels.get(value)

    def _set(self, value, labels):
        rt = _ranked(value.type)
        if rt is None or labels is None or rt.has_static_shape or len(labels) != rt.rank:
            return
        labels = tuple(str(d) if not rt.is_dynamic_dim(i) else labels[i]
                       for i, d in enumerate(rt.shape))
        if any(labels[i] for i in range(rt.rank) if rt.is_dynamic_dim(i)):
            self._labels[value] = labels

    def _sweep(self) -> None:
        block = graph.body_block(self.func_op)
        for i, arg in enumerate(block.arguments):
            if i in self._args:
                self._set(arg, self._args[i])
        for op in graph.nested_ops(block):     # (a loop's block arguments are named
            self._op(op)                       # before its body is swept)

    def _op(self, op) -> None:
        name = op.name
        operands, results = list(op.operands), list(op.results)
        if name == "stablehlo.while":
            for region in op.regions:
                for b in region.blocks:
                    for operand, arg in zip(operands, b.arguments):
                        self._set(arg, self._get(operand))
        if name == "stablehlo.dot_general":
            self._dot(op)
        elif name in ("stablehlo.broadcast_in_dim", "stablehlo.dynamic_broadcast_in_dim"):
            src = self._get(operands[0])
            dims = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
            out = self._shape_operand(operands[1]) if name.startswith("stablehlo.dynamic") \
                else None
            rt = _ranked(results[0].type)
            if rt is not None:
                labels = list(out) if out and len(out) == rt.rank else [None] * rt.rank
                for i, d in enumerate(dims):
                    if src and labels[d] is None and _ranked(operands[0].type).shape[i] != 1:
                        labels[d] = src[i]
                self._set(results[0], labels)
        elif name == "stablehlo.transpose":
            src = self._get(operands[0])
            if src:
                perm = list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))
                self._set(results[0], [src[p] for p in perm])
        elif name == "stablehlo.reduce":
            dims = set(ir.DenseI64ArrayAttr(op.attributes["dimensions"]))
            n = len(results)
            for operand, result in zip(operands[:n], results):
                src = self._get(operand)
                if src:
                    self._set(result, [l for i, l in enumerate(src) if i not in dims])
        elif name in ("stablehlo.dynamic_reshape", "stablehlo.dynamic_iota"):
            self._set(results[0], self._shape_operand(operands[-1] if name.endswith(
                "reshape") else operands[0]))
        else:
            self._same_shape(operands, results)

    def _same_shape(self, operands, results) -> None:
        """A result with an operand's shape has its labels (positionally when the op has as
        many operands as results, as optimization_barrier and markers do)."""
        pairwise = len(operands) == len(results)
        for k, r in enumerate(results):
            rt = _ranked(r.type)
            if rt is None or rt.has_static_shape:
                continue
            candidates = [operands[k]] if pairwise else operands
            for o in candidates:
                ot = _ranked(o.type)
                if ot is not None and list(ot.shape) == list(rt.shape):
                    labels = self._get(o)
                    if labels:
                        self._set(r, labels)
                        break

    def _dot(self, op) -> None:
        from remat_passes.ir.mlir import stablehlo
        lhs, rhs = (self._get(v) for v in op.operands[:2])
        lt, rt = (_ranked(v.type) for v in op.operands[:2])
        if lt is None or rt is None:
            return
        lhs = lhs or (None,) * lt.rank
        rhs = rhs or (None,) * rt.rank
        nums = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
        lb, rb = list(nums.lhs_batching_dimensions), list(nums.rhs_batching_dimensions)
        lc, rc = list(nums.lhs_contracting_dimensions), list(nums.rhs_contracting_dimensions)
        labels = [lhs[i] or rhs[j] for i, j in zip(lb, rb)]
        labels += [lhs[i] for i in range(lt.rank) if i not in lb and i not in lc]
        labels += [rhs[i] for i in range(rt.rank) if i not in rb and i not in rc]
        self._set(op.results[0], labels)

    def _shape_operand(self, value) -> list | None:
        """The labels a 1-D shape tensor spells: concatenations of constants and
        reshaped/converted scalars from get_dimension_size (and their products)."""
        value = _through_scalars(value) if _ranked(value.type) and \
            _ranked(value.type).rank == 0 else value
        if not isinstance(value, ir.OpResult):
            return None
        op = value.owner
        if op.name == "stablehlo.concatenate":
            parts = [self._shape_operand(v) for v in op.operands]
            return None if any(p is None for p in parts) else [l for p in parts for l in p]
        if op.name == "stablehlo.constant":
            try:
                return [str(int(v)) for v in ir.DenseIntElementsAttr(op.attributes["value"])]
            except (ValueError, TypeError):
                return None
        if op.name in ("stablehlo.reshape", "stablehlo.convert", "stablehlo.broadcast_in_dim"):
            src = op.operands[0]
            st = _ranked(src.type)
            if st is not None and st.rank == 0:
                label = self._scalar(src)
                return None if label is None else [label]
            return self._shape_operand(src)
        return None

    def _scalar(self, value) -> str | None:
        value = _through_scalars(value)
        if not isinstance(value, ir.OpResult):
            return None
        op = value.owner
        if op.name == "stablehlo.get_dimension_size":
            labels = self._get(op.operands[0])
            d = ir.IntegerAttr(op.attributes["dimension"]).value
            return labels[d] if labels and labels[d] else None
        if op.name == "stablehlo.constant":
            try:
                return str(int(ir.DenseIntElementsAttr(op.attributes["value"])[0]))
            except (ValueError, TypeError, IndexError):
                return None
        if op.name == "stablehlo.multiply":
            a, b = (self._scalar(v) for v in op.operands)
            return None if a is None or b is None else _product(a, b)
        return None


def _product(a: str, b: str) -> str:
    """`a*b` as JAX writes a product: the number first, then the symbols in order."""
    number, symbols = 1, []
    for factor in a.split("*") + b.split("*"):
        if factor.isdigit():
            number *= int(factor)
        else:
            symbols.append(factor)
    factors = ([str(number)] if number != 1 or not symbols else []) + sorted(symbols)
    return "*".join(factors)
