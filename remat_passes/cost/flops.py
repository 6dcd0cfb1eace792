"""Static cost of StableHLO: FLOPs and bytes of ops and functions, loop trip counts included.

What XLA's cost analysis reports as `flops + transcendentals`, counted on the
StableHLO before any optimization:

* `dot_general`: 2 x (result elements) x (contracted size); `convolution`:
  2 x (result elements) x (kernel elements / output features);
* elementwise arithmetic (add, multiply, tanh, exp, compare, select, ...):
  one per result element; `reduce`: one per input element;
* data movement (reshape, transpose, slice, broadcast, concatenate, ...) and
  constants: free;
* `while`: its body times the trip count when the loop counts from a constant
  to a constant (JAX's scans and fori_loops), else once; `reduce`: its body once
  per element folded in (input minus result elements); `case`/`if`: the most
  expensive branch; `func.call`: the callee;
* JAX's block-scaled matmul (`jax.nn.scaled_matmul`, a custom call on GPU): as a dot
  contracting the last dimension; a Pallas TPU kernel (`tpu_custom_call`): the flops and
  transcendentals of the `cost_estimate` given to `pallas_call`, which its backend_config
  carries (what XLA counts); any other custom call: nothing (its cost is unknown:
  `unpriced_target` names it, so `auto` can say when it recomputes one);
* `stablehlo.composite`: its decomposition, as a call; but a ragged dot
  (`chlo.ragged_dot`, what `jax.lax.ragged_dot` exports for GPU and TPU: a mixture of
  experts' grouped matmul) the work each row does with its own group: 2 x (result
  elements) x (contracted size), over the groups where the ragged dimension is
  contracted. Its decomposition runs every group over every row (G times that).

XLA's own cost analysis counts a `while` body once whatever its trip count, so
for programs with scans this is the count to compare. `op_bytes` is the
memory traffic of an op (its operands and results), for a roofline cost.
"""
from __future__ import annotations

import json
import re

from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import ir

ELEMENTWISE = frozenset({
    "add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum", "negate",
    "abs", "sign", "exponential", "exponential_minus_one", "log", "log_plus_one", "logistic",
    "tanh", "sine", "cosine", "tan", "sqrt", "rsqrt", "cbrt", "power", "atan2", "floor",
    "ceil", "round_nearest_afz", "round_nearest_even", "compare", "select", "clamp", "and",
    "or", "xor", "not", "is_finite", "reduce_precision", "erf", "erf_inv", "expm1", "log1p"})
# custom calls that only mark or place a value (free, as data movement is)
_MARKERS = frozenset({contract.NAME_TARGET, contract.PLACEMENT_TARGET, "Sharding",
                      graph.SPMD_FULL_TO_SHARD, graph.SPMD_SHARD_TO_FULL, "MoveToHost",
                      "MoveToDevice", "LayoutConstraint"})
_CONV_DIMS = re.compile(r"\[([^\]]*)\]x\[([^\]]*)\]->\[([^\]]*)\]")


def dot_dims(op, name: str) -> list[int]:
    """A dot_general's dimension list `name` (lhs_contracting_dimensions, ...)."""
    m = re.search(name + r" = \[([0-9, ]*)\]", str(op.attributes["dot_dimension_numbers"]))
    return [int(d) for d in m.group(1).split(",") if d.strip()] if m else []


def conv_dims(op):
    """A convolution's dimension labels, (input, kernel, output), each a list such as
    ['b', '0', '1', 'f'] / ['0', '1', 'i', 'o']; None where they cannot be read."""
    return conv_dim_labels(str(op.attributes["dimension_numbers"]))


def conv_dim_labels(text: str):
    """`conv_dims` of a printed `dimension_numbers` attribute (`#stablehlo.conv<[b, f, 0,
    1]x[o, i, 0, 1]->[b, 0, 1, f]>`)."""
    m = _CONV_DIMS.search(text)
    return None if m is None else tuple([d.strip() for d in g.split(",")] for g in m.groups())


def elements(t) -> int:
    try:
        n = 1
        for d in ir.RankedTensorType(t).shape:
            n *= max(d, 0)
        return n
    except (ValueError, TypeError):
        return 0


def _int_constant(v):
    if not isinstance(v, ir.OpResult) or v.owner.operation.name != "stablehlo.constant":
        return None
    try:
        attr = ir.DenseIntElementsAttr(v.owner.attributes["value"])
    except (ValueError, TypeError):
        return None
    return int(ir.IntegerAttr(attr.get_splat_value()).value) if attr.is_splat else None


def trip_count(while_op) -> int | None:
    """Iterations of a `stablehlo.while` counting from a constant to a constant (`i < N`
    with a constant start), else None."""
    cond = while_op.regions[0].blocks[0]
    for op in cond.operations:
        op = op.operation
        if op.name != "stablehlo.compare" or \
                "LT" not in str(op.attributes["comparison_direction"]):
            continue
        lhs, bound = op.operands
        n = _int_constant(bound)
        if n is not None and isinstance(lhs, ir.BlockArgument):
            start = _int_constant(while_op.operands[lhs.arg_number])
            if start is not None:
                return max(n - start, 0)
    return None


def _dot_flops(op) -> float:
    lhs = ir.RankedTensorType(op.operands[0].type).shape
    k = 1
    for d in dot_dims(op, "lhs_contracting_dimensions"):
        k *= lhs[d]
    return 2.0 * elements(op.results[0].type) * k


def i64s(op, name, default):
    """An op's integer-array attribute as a list (`default` where it is absent)."""
    if name not in op.attributes:
        return default
    attr = op.attributes[name]
    try:
        return list(ir.DenseI64ArrayAttr(attr))
    except (ValueError, TypeError):
        return [int(x) for x in ir.DenseIntElementsAttr(attr)]


def _kernel_estimate(op) -> float:
    """flops + transcendentals of a Pallas TPU kernel's `cost_estimate` (its backend_config,
    JSON: custom_call_config.cost_estimate); 0 for any other custom call."""
    if graph.custom_call_target(op) != "tpu_custom_call" or "backend_config" not in op.attributes:
        return 0.0
    try:
        config = json.loads(ir.StringAttr(op.attributes["backend_config"]).value)
        estimate = config["custom_call_config"]["cost_estimate"]
        return float(estimate.get("flops", 0)) + float(estimate.get("transcendentals", 0))
    except (ValueError, TypeError, KeyError, AttributeError):
        return 0.0


def unpriced_target(op) -> str | None:
    """The target of a custom call whose cost the count cannot know (a LAPACK routine on CPU,
    a Triton or Mosaic GPU kernel, cuDNN attention: counted as 0 FLOPs), else None."""
    target = graph.custom_call_target(op)
    if target is None or target in _MARKERS or target == contract.SCALED_DOT_TARGET or \
            (target == "tpu_custom_call" and _kernel_estimate(op) > 0):
        return None
    return target


def _ragged_dot_flops(op) -> float:
    """A `stablehlo.composite "chlo.ragged_dot"`: its dimension numbers are (lhs batch, rhs
    batch, lhs contracting, rhs contracting, lhs ragged, rhs group) dimensions."""
    numbers = ir.DictAttr(op.attributes["composite_attributes"])["ragged_dot_dimension_numbers"]
    _, _, contracting, _, ragged, _ = [[int(d) for d in ir.DenseIntElementsAttr(a)]
                                       for a in ir.ArrayAttr(numbers)]
    lhs = ir.RankedTensorType(op.operands[0].type).shape
    k = 1
    for d in contracting:
        k *= lhs[d]
    groups = ir.RankedTensorType(op.operands[2].type).shape
    per_group = groups[-1] if groups and set(ragged) & set(contracting) else 1
    return 2.0 * elements(op.results[0].type) * k / max(per_group, 1)


def _conv_flops(op) -> float:
    """2 x multiply-adds that touch real input (not padding), as XLA counts them."""
    dims = conv_dims(op)
    lhs_t = ir.RankedTensorType(op.operands[0].type).shape
    rhs_t = ir.RankedTensorType(op.operands[1].type).shape
    out_t = ir.RankedTensorType(op.results[0].type).shape
    if dims is None:   # unknown layout: no padding correction
        per = 1
        for d in rhs_t:
            per *= d
        return 2.0 * elements(op.results[0].type) * per / max(rhs_t[-1], 1)
    lhs, rhs, out = dims
    spatial = [d for d in lhs if d.isdigit()]
    n = len(spatial)
    strides = i64s(op, "window_strides", [1] * n)
    lhs_dil = i64s(op, "lhs_dilation", [1] * n)
    rhs_dil = i64s(op, "rhs_dilation", [1] * n)
    pad = i64s(op, "padding", [0] * (2 * n))
    macs = out_t[out.index("b")] * rhs_t[rhs.index("o")] * rhs_t[rhs.index("i")]
    for j, d in enumerate(spatial):
        size = (lhs_t[lhs.index(d)] - 1) * lhs_dil[j] + 1
        k, o = rhs_t[rhs.index(d)], out_t[out.index(d)]
        valid = 0
        for y in range(o):
            for t in range(k):
                x = y * strides[j] + t * rhs_dil[j] - pad[2 * j]
                if 0 <= x < size and x % lhs_dil[j] == 0:
                    valid += 1
        macs *= valid
    return 2.0 * macs


class CostModel:
    """FLOPs of ops, with callees' costs remembered (one per module)."""

    def __init__(self, module_op=None):
        self._funcs = {}
        if module_op is not None:
            for op in module_op.body.operations:
                if op.operation.name == "func.func":
                    self._funcs[graph.func_name(op)] = op
        self._callee: dict = {}

    def op_flops(self, op) -> float:
        op = op.operation
        name = op.name
        if name == "stablehlo.dot_general":
            return _dot_flops(op)
        if name == "stablehlo.dot":
            lhs = ir.RankedTensorType(op.operands[0].type).shape
            return 2.0 * elements(op.results[0].type) * (lhs[-1] if lhs else 1)
        if name == "stablehlo.convolution":
            return _conv_flops(op)
        if contract.is_scaled_dot(op):       # [b, m, k] x [b, n, k] -> [b, m, n]
            lhs = ir.RankedTensorType(op.operands[0].type).shape
            return 2.0 * elements(op.results[0].type) * (lhs[-1] if lhs else 1)
        if name == "stablehlo.custom_call":
            return _kernel_estimate(op)
        if name == "stablehlo.reduce":   # the body once per element folded in
            applications = elements(op.operands[0].type) - elements(op.results[0].type)
            return max(applications, 0) * max(self.block_flops(op.regions[0].blocks[0]), 1.0)
        if name == "stablehlo.while":
            body = self.block_flops(op.regions[1].blocks[0])
            return (trip_count(op) or 1) * body
        if name == "sdy.manual_computation":     # (a Shardy shard_map: its body, per device)
            return sum(self.block_flops(b) for r in op.regions for b in r.blocks)
        if name in ("stablehlo.case", "stablehlo.if"):
            return max((sum(self.block_flops(b) for b in r.blocks) for r in op.regions),
                       default=0.0)
        if name == "stablehlo.composite" and \
                ir.StringAttr(op.attributes["name"]).value == "chlo.ragged_dot":
            try:
                return _ragged_dot_flops(op)
            except (ValueError, TypeError, KeyError, IndexError):
                pass                    # (another form: counted by its decomposition)
        if name in ("func.call", "stablehlo.composite"):
            callee = ir.FlatSymbolRefAttr(
                op.attributes["callee" if name == "func.call" else "decomposition"]).value
            if callee not in self._callee:
                f = self._funcs.get(callee)
                self._callee[callee] = 0.0 if f is None or not len(f.regions[0].blocks) \
                    else self.block_flops(graph.body_block(f))
            return self._callee[callee]
        dialect, _, short = name.partition(".")
        if dialect in ("stablehlo", "chlo") and short in ELEMENTWISE:
            return float(elements(op.results[0].type))
        return 0.0

    def block_flops(self, block) -> float:
        return sum(self.op_flops(op) for op in block.operations)

    def function_flops(self, func_op) -> float:
        return self.block_flops(graph.body_block(func_op))


def op_bytes(op) -> int:
    """Memory traffic of an op: the bytes of its operands and results."""
    op = op.operation
    return sum(graph.type_bytes(v.type) for v in op.operands) + \
        sum(graph.type_bytes(r.type) for r in op.results)


def function_flops(module, function: str = "main") -> float:
    """FLOPs of `function` of a Module (or an ir.Module), loops times their trip counts."""
    module_op = getattr(module, "op", module)
    with module_op.context:
        return CostModel(module_op).function_flops(graph.find_func(module_op, function))
