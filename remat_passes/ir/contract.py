"""The contract between passes: every `remat.*` name, read and written in one place.

Passes talk to each other (and to a later `remat-opt` run on a saved file)
only through what is written here. Each name has typed accessors; no other
module spells an attribute name or parses an attribute value.

==========================  =========================  ==============================
name                        where                      value
==========================  =========================  ==============================
`remat.cotangent`           function argument          unit: a cotangent input
`remat.gradient`            function result            unit: a gradient output
`remat.recompute`           op                         i64 recompute group (a clone)
`remat.moved`               op                         unit: a clone whose forward op
                                                       only the backward read, erased
                                                       (it moved: no extra cost)
`remat.offload`             op / _fwd result /         "src:dst": an Offloadable
                            _bwd argument              residual
`remat.residual`            `<f>_fwd` result           how JAX would describe it
`remat.barrier`             op                         unit: a barrier we placed
                                                       (or its tie's multiply)
`remat.regions`             module                     {"remat[N]": policy spec}
`remat.regions_no_cse`      module                     ["remat[N]", ...]: regions
                                                       made with prevent_cse=False
`remat.case`                forward stablehlo.case     i64 key linking it to its
                                                       recompute case
`remat.twin`                stablehlo.case             [key, k, r, ...]: result r
                                                       equals result k of the keyed
                                                       case
`remat.case_saves`          nested stablehlo.case      {"k": "save" or "src:dst"}:
                                                       result k holds values its
                                                       branches save for a recompute
`remat.manual_saves`        nested                     {"k": "save"}: result k holds
                            sdy.manual_computation     a body value the policy saves,
                                                       for a recompute
`@remat.name`               custom_call target         backend_config = the name
==========================  =========================  ==============================

What makes an op *backward* (stated once; `analysis.function.FunctionAnalysis`
implements it): it reads a cotangent argument or a backward value, or it is a
recompute clone; when no argument is marked, an op whose JAX name stack has a
`transpose(` frame is backward too. Work under a `transpose(` frame that needs
no cotangent (a conv kernel reversal, a mean's 1/N) is backward when every
user of it is backward; so is, then, work outside every differentiated function
(neither a `jvp(` nor a `transpose(` frame, where some op has one) that reads
only the arguments, constants and work like it (a training step's optimizer
terms of its own state).
"""
from __future__ import annotations

import numpy as np

from remat_passes.ir.mlir import ir, stablehlo
from remat_passes.ir.verdicts import Offloadable, Saveable

COTANGENT = "remat.cotangent"
GRADIENT = "remat.gradient"
RECOMPUTE = "remat.recompute"
MOVED = "remat.moved"       # a clone of a forward op only the backward read, now erased
OFFLOAD = "remat.offload"
RESIDUAL = "remat.residual"
BARRIER = "remat.barrier"
REGIONS = "remat.regions"
REGIONS_NO_CSE = "remat.regions_no_cse"   # keys of regions made with prevent_cse=False
NAME_TARGET = "remat.name"
SEGMENTS_NAME = "remat.segments="   # a name marker in a scan body: segment-scans' length for it
CASE_KEY = "remat.case"     # a forward stablehlo.case the case-pair rule rewrote: its key
TWIN = "remat.twin"         # results equal to the keyed case's: [key, k, r, k, r, ...]
CASE_SAVES = "remat.case_saves"   # results of a nested case that hold saved branch values
MANUAL_SAVES = "remat.manual_saves"   # results of a nested shard_map that hold saved values
LEVELS = "remat.levels"     # on a function: recomputation in two levels (core/levels.py)
# on a dot_general that JAX lowered from another primitive (on CPU, `ragged_dot_general`
# lowers to a masked dot_general): that primitive's name, which JAX's policies decide on
PRIMITIVE = "remat.primitive"

# The op attributes a finished pipeline removes (strip-checkpoint-names).
BOOKKEEPING_OP_ATTRS = (RECOMPUTE, MOVED, OFFLOAD, BARRIER, CASE_KEY, TWIN, CASE_SAVES,
                        MANUAL_SAVES, LEVELS, PRIMITIVE)

# Host offload, as JAX emits it for offload policies on GPU/TPU.
PLACEMENT_TARGET = "annotate_device_placement"
PLACEMENT_KEY = "_xla_buffer_placement"
MEMORY_KIND = "mhlo.memory_kind"
HOST_KINDS = ("pinned_host", "unpinned_host")

# (exponent bits, mantissa bits) of every floating type XLA supports: what a
# reduce_precision to the type's own format is given, and how the memory
# estimate tells such a rounding (an identity) from a real one.
FLOAT_FORMATS = {
    "f64": (11, 52), "f32": (8, 23), "bf16": (8, 7), "f16": (5, 10),
    "f8E5M2": (5, 2), "f8E5M2FNUZ": (5, 2), "f8E4M3": (4, 3), "f8E4M3FN": (4, 3),
    "f8E4M3FNUZ": (4, 3), "f8E4M3B11FNUZ": (4, 3), "f8E3M4": (3, 4),
    "f8E8M0FNU": (8, 0), "f4E2M1FN": (2, 1), "f6E2M3FN": (2, 3), "f6E3M2FN": (3, 2),
}


def float_format(t) -> tuple[int, int] | None:
    """(exponent, mantissa) bits of a tensor type's element type; None if not a float."""
    try:
        return FLOAT_FORMATS.get(str(ir.RankedTensorType(t).element_type))
    except (ValueError, TypeError):
        return None


# The types whose every value XLA's reduce_precision to the type's own bits leaves as it
# is (checked on every bit pattern, XLA:CPU of jaxlib 0.10.2, 0.11.2 and 0.12). Its rounding
# emulates an IEEE format without its subnormals, so on the others it changes values: on
# f8E4M3FN 288 and 448 become NaN (IEEE's e4m3 has infinities there), on f4E2M1FN 4 becomes
# 6 and 0.5 becomes 0, on f8E8M0FNU 2^-127 becomes NaN, on f8E4M3, f8E3M4 and the FNUZ types
# the subnormals become 0 (jax.checkpoint rounds them all, and its gradients change so).
EXACT_ROUNDING = ("f64", "f32", "bf16", "f16", "f8E5M2")


def own_rounding(t) -> tuple[int, int] | None:
    """The (exponent, mantissa) bits that round a value of tensor type `t` to its own type,
    where XLA does that exactly (`EXACT_ROUNDING`); None for any other type."""
    try:
        elem = str(ir.RankedTensorType(t).element_type)
    except (ValueError, TypeError):
        return None
    return FLOAT_FORMATS[elem] if elem in EXACT_ROUNDING else None


def rounding_is_identity(t) -> bool:
    """Is rounding a value of tensor type `t` to its own type the identity wherever it
    stands (f32, f64: XLA computes them in their own type, never in a wider one inside a
    fusion, so no value of theirs has more precision than its type holds)?"""
    return own_rounding(t) in (FLOAT_FORMATS["f32"], FLOAT_FORMATS["f64"])


def residual_rounding(t, exact: bool = True) -> tuple[int, int] | None:
    """The bits insert-reduce-precision rounds a residual of type `t` to, None for a type it
    leaves alone: `own_rounding`, and with `exact=False` (its round-exact=false) none for
    f32 and f64, whose rounding is the identity. The planner prices the same roundings."""
    if not exact and rounding_is_identity(t):
        return None
    return own_rounding(t)


# ------------------------------------------------------------ op attributes --
def _i64(value: int):
    return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value)


def recompute_group(op) -> int | None:
    """The recompute group of a clone made by remat-partial-eval, else None."""
    attrs = op.operation.attributes
    return ir.IntegerAttr(attrs[RECOMPUTE]).value if RECOMPUTE in attrs else None


def is_recompute_clone(op) -> bool:
    return RECOMPUTE in op.operation.attributes


def set_recompute_group(op, group: int) -> None:
    op.operation.attributes[RECOMPUTE] = _i64(group)


def is_moved(op) -> bool:
    """A clone of a forward op that only the backward read, whose forward copy is gone:
    the op moved into the backward (`FunctionAnalysis.backward_only`)."""
    return MOVED in op.operation.attributes


def set_moved(op) -> None:
    op.operation.attributes[MOVED] = ir.UnitAttr.get()


def recompute_levels(func_op) -> int:
    """1, or 2 where remat-partial-eval recomputed the function's backward in two levels."""
    attrs = func_op.operation.attributes
    return ir.IntegerAttr(attrs[LEVELS]).value if LEVELS in attrs else 1


def set_recompute_levels(func_op, levels: int) -> None:
    func_op.operation.attributes[LEVELS] = _i64(levels)


def offload_attr(placement: Offloadable):
    return ir.StringAttr.get(f"{placement.src}:{placement.dst}")


def parse_offload(attr) -> Offloadable:
    src, _, dst = ir.StringAttr(attr).value.partition(":")
    return Offloadable(src, dst)


def offload_of(op) -> Offloadable | None:
    """The placement remat-partial-eval decided for an op's residual results."""
    attrs = op.operation.attributes
    return parse_offload(attrs[OFFLOAD]) if OFFLOAD in attrs else None


def set_offload(op, placement: Offloadable) -> None:
    op.operation.attributes[OFFLOAD] = offload_attr(placement)


def is_barrier(op) -> bool:
    return BARRIER in op.operation.attributes


def mark_barrier(op) -> None:
    op.operation.attributes[BARRIER] = ir.UnitAttr.get()


def case_key(op) -> int | None:
    attrs = op.operation.attributes
    return ir.IntegerAttr(attrs[CASE_KEY]).value if CASE_KEY in attrs else None


def set_case_key(op, key: int) -> None:
    op.operation.attributes[CASE_KEY] = _i64(key)


def twin_of(op) -> tuple[int, list[tuple[int, int]]] | None:
    """For an op computing results of the forward case with key `key` again (or holding
    them in another result: the forward case itself): (key, [(k, r), ...]), result `r`
    of `op` equal to result `k` of that case."""
    attrs = op.operation.attributes
    if TWIN not in attrs:
        return None
    values = list(ir.DenseI64ArrayAttr(attrs[TWIN]))
    return values[0], list(zip(values[1::2], values[2::2]))


def set_twin(op, key: int, pairs) -> None:
    if not pairs:
        if TWIN in op.operation.attributes:
            del op.operation.attributes[TWIN]
        return
    op.operation.attributes[TWIN] = ir.DenseI64ArrayAttr.get(
        [key, *(x for pair in pairs for x in pair)])


def case_saves(op) -> dict:
    """{result k: Saveable or Offloadable}: results of a case nested in a loop body or a
    branch that hold, per branch, a value the policy saves (zeros in other branches),
    added so that a recomputation of the case can read them back."""
    return _saves(op, CASE_SAVES)


def manual_saves(op) -> dict:
    """{result k: Saveable}: results of a manual computation (shard_map) nested in a loop
    body that hold body values the policy saves, added so that a recomputation of it can
    take them back."""
    return _saves(op, MANUAL_SAVES)


def nested_saves(op) -> dict:
    """`case_saves` of a case, `manual_saves` of a manual computation, else {}."""
    return _saves(op, CASE_SAVES) or _saves(op, MANUAL_SAVES)


def _saves(op, name: str) -> dict:
    attrs = op.operation.attributes
    if name not in attrs:
        return {}
    d = ir.DictAttr(attrs[name])
    out = {}
    for k in range(len(op.operation.results)):
        if str(k) in d:
            text = ir.StringAttr(d[str(k)]).value
            out[k] = Saveable if text == "save" else parse_offload(d[str(k)])
    return out


def set_case_saves(op, saves: dict) -> None:
    _set_saves(op, saves, CASE_SAVES)


def set_manual_saves(op, saves: dict) -> None:
    _set_saves(op, saves, MANUAL_SAVES)


def _set_saves(op, saves: dict, name: str) -> None:
    op.operation.attributes[name] = ir.DictAttr.get({
        str(k): ir.StringAttr.get("save") if not isinstance(v, Offloadable) else offload_attr(v)
        for k, v in saves.items()})


def strip_bookkeeping(op) -> None:
    attrs = op.operation.attributes
    for name in BOOKKEEPING_OP_ATTRS:
        if name in attrs:
            del attrs[name]


def lowered_from(op) -> str | None:
    """The JAX primitive other than dot_general_p that `op` (a dot_general) was lowered from
    (`PRIMITIVE`), else None."""
    attrs = op.operation.attributes
    return ir.StringAttr(attrs[PRIMITIVE]).value if PRIMITIVE in attrs else None


# JAX's block-scaled matmul (`jax.nn.scaled_matmul` / `scaled_dot_general`, MX formats) on
# GPU: its `scaled_matmul_wrapper` primitive, which JAX's dot policies count as a dot.
SCALED_DOT_TARGET = "__op$block_scaled_dot"


def is_scaled_dot(op) -> bool:
    """Is `op` the custom call of JAX's block-scaled matmul (lhs, rhs, lhs scales, rhs
    scales; the contraction over the last dimension of both, the first being the batch)?"""
    op = op.operation
    return op.name == "stablehlo.custom_call" and \
        ir.StringAttr(op.attributes["call_target_name"]).value == SCALED_DOT_TARGET


# -------------------------------------------------------------- the marker --
def checkpoint_name(op) -> str | None:
    """The name if `op` is the `@remat.name` checkpoint-name marker, else None."""
    op = op.operation
    if op.name != "stablehlo.custom_call":
        return None
    if ir.StringAttr(op.attributes["call_target_name"]).value != NAME_TARGET:
        return None
    if "backend_config" not in op.attributes:
        return ""
    try:
        return ir.StringAttr(op.attributes["backend_config"]).value
    except ValueError:
        return str(op.attributes["backend_config"])


def placement(op) -> str | None:
    """The memory an `@annotate_device_placement` op moves its operand to, else None."""
    op = op.operation
    if op.name != "stablehlo.custom_call" or \
            ir.StringAttr(op.attributes["call_target_name"]).value != PLACEMENT_TARGET:
        return None
    if "mhlo.frontend_attributes" not in op.attributes:
        return None
    attrs = ir.DictAttr(op.attributes["mhlo.frontend_attributes"])
    if PLACEMENT_KEY not in attrs:
        return None
    return ir.StringAttr(attrs[PLACEMENT_KEY]).value


def placement_attrs(kind: str) -> dict:
    """The attributes of an annotate_device_placement op that moves to `kind`."""
    return {"mhlo.frontend_attributes": ir.DictAttr.get({PLACEMENT_KEY: ir.StringAttr.get(kind)})}


def annotate_placement(value, kind: str, ip, loc):
    """`stablehlo.custom_call @annotate_device_placement(value)` (a side effect, so it is
    kept) that moves `value` to memory `kind`, as JAX emits it for an offload policy;
    returns the moved value."""
    operands = [value]
    shaped = ir.RankedTensorType(value.type)
    if not shaped.has_static_shape:     # (symbolic dimensions: the shape as an operand)
        operands.append(_shape_of(value, shaped.rank, ip, loc))
    op = stablehlo.CustomCallOp([value.type], operands, PLACEMENT_TARGET,
                                has_side_effect=True, ip=ip, loc=loc)
    for name, attr in placement_attrs(kind).items():
        op.operation.attributes[name] = attr
    if len(operands) > 1:
        op.operation.attributes["indices_of_shape_operands"] = ir.DenseIntElementsAttr.get(
            np.array([1], np.int64))
    return op.result


def _shape_of(value, rank: int, ip, loc):
    """tensor<rank x i32>: `value`'s dimension sizes, which a custom call of a value with
    symbolic dimensions takes as its result's shape (JAX's `indices_of_shape_operands`), so
    that shape refinement gives the result the shape the call is made for (it cannot see
    through the call otherwise, and XLA refuses the module)."""
    one = ir.RankedTensorType.get([1], ir.IntegerType.get_signless(32))
    sizes = [stablehlo.ReshapeOp(one, stablehlo.GetDimensionSizeOp(value, d, ip=ip, loc=loc),
                                 ip=ip, loc=loc).result for d in range(rank)]
    return stablehlo.ConcatenateOp(sizes, 0, ip=ip, loc=loc).result


# ------------------------------------------------- argument/result entries --
def _entries(func_op, which: str, index: int) -> dict:
    attrs = func_op.operation.attributes
    if which not in attrs:
        return {}
    arr = ir.ArrayAttr(attrs[which])
    if index >= len(arr):
        return {}
    d = ir.DictAttr(arr[index])
    return {d[i].name: d[i].attr for i in range(len(d))}


def all_entries(func_op, which: str) -> list[dict]:
    """Every argument's ("arg_attrs") or result's ("res_attrs") attribute dict."""
    count = len(func_op.type.inputs if which == "arg_attrs" else func_op.type.results)
    attrs = func_op.operation.attributes
    arr = list(ir.ArrayAttr(attrs[which])) if which in attrs else []
    out = []
    for i in range(count):
        if i < len(arr):
            d = ir.DictAttr(arr[i])
            out.append({d[j].name: d[j].attr for j in range(len(d))})
        else:
            out.append({})
    return out


def set_entry(func_op, which: str, index: int, name: str, value) -> None:
    """Set attribute `name` of argument/result `index`; `value=None` removes it."""
    entries = all_entries(func_op, which)
    if value is None:
        entries[index].pop(name, None)
    else:
        entries[index][name] = value
    set_all_entries(func_op, which, entries)


def set_all_entries(func_op, which: str, entries: list[dict]) -> None:
    func_op.operation.attributes[which] = ir.ArrayAttr.get([ir.DictAttr.get(e) for e in entries])


def entry(func_op, which: str, index: int, name: str):
    return _entries(func_op, which, index).get(name)


def cotangent_args(func_op) -> list[int]:
    """Indices of the arguments marked `remat.cotangent`."""
    return [i for i, e in enumerate(all_entries(func_op, "arg_attrs")) if COTANGENT in e]


def mark_cotangent_args(func_op, indices) -> None:
    """Make exactly `indices` the marked cotangent arguments."""
    wanted = set(indices)
    entries = all_entries(func_op, "arg_attrs")
    for i, e in enumerate(entries):
        if i in wanted:
            e[COTANGENT] = ir.UnitAttr.get()
        else:
            e.pop(COTANGENT, None)
    set_all_entries(func_op, "arg_attrs", entries)


def gradient_results(func_op) -> list[int]:
    return [i for i, e in enumerate(all_entries(func_op, "res_attrs")) if GRADIENT in e]


def residual_results(func_op) -> list[int]:
    """Result indices of an `<f>_fwd` that are residuals (carry `remat.residual`)."""
    return [i for i, e in enumerate(all_entries(func_op, "res_attrs")) if RESIDUAL in e]


def residual_entry(description: str, placement_: Offloadable | None) -> dict:
    out = {RESIDUAL: ir.StringAttr.get(description)}
    if placement_ is not None:
        out[OFFLOAD] = offload_attr(placement_)
    return out


def offload_entry(func_op, which: str, index: int) -> Offloadable | None:
    attr = entry(func_op, which, index, OFFLOAD)
    return None if attr is None else parse_offload(attr)


def memory_kind(func_op, which: str, index: int) -> str | None:
    attr = entry(func_op, which, index, MEMORY_KIND)
    return None if attr is None else ir.StringAttr(attr).value


# ---------------------------------------------------------------- regions --
def region_specs(module_op) -> dict[str, str]:
    """{"remat[N]": policy spec} recorded by export_vjp for `rp.checkpoint` regions."""
    attrs = module_op.operation.attributes
    if REGIONS not in attrs:
        return {}
    d = ir.DictAttr(attrs[REGIONS])
    return {d[i].name: ir.StringAttr(d[i].attr).value for i in range(len(d))}


def regions_without_cse_barrier(module_op) -> set[str]:
    """Keys of the `rp.checkpoint` regions made with prevent_cse=False."""
    attrs = module_op.operation.attributes
    if REGIONS_NO_CSE not in attrs:
        return set()
    return {ir.StringAttr(a).value for a in ir.ArrayAttr(attrs[REGIONS_NO_CSE])}


def set_regions_without_cse_barrier(module_op, keys) -> None:
    module_op.operation.attributes[REGIONS_NO_CSE] = ir.ArrayAttr.get(
        [ir.StringAttr.get(k) for k in sorted(keys)])


def set_region_specs(module_op, specs: dict[str, str]) -> None:
    module_op.operation.attributes[REGIONS] = ir.DictAttr.get(
        {k: ir.StringAttr.get(v) for k, v in specs.items()})
