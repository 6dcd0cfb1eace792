"""Checkpoint policies on StableHLO ops: the names of `jax.checkpoint_policies`.

A policy is called once per forward op with an `OpInfo` and returns a verdict:
`True`/`Saveable` (the op's results may be kept as residuals), `False`/
`Recompute` (they are recomputed in the backward pass when needed), or
`Offloadable(src, dst)` (kept, but moved to another memory space between the
passes). JAX's primitives map onto StableHLO ops as follows:

  dot_general_p            -> stablehlo.dot_general, stablehlo.dot
  conv_general_dilated_p   -> stablehlo.convolution
  scaled_matmul_wrapper    -> stablehlo.custom_call @__op$block_scaled_dot (GPU)
  name_p (checkpoint_name) -> stablehlo.custom_call @remat.name {backend_config = "<name>"}

Every built-in policy carries a `spec`: the expression that recreates it, e.g.
`save_only_these_names('a', 'b')`. Specs are what the CLI accepts
(`policy=...`) and what regions record in a module; `parse_policy` reads them.
"""
from __future__ import annotations

import ast
import difflib
import inspect
import re
from typing import Any

from remat_passes.cost.flops import conv_dim_labels
from remat_passes.ir.graph import DTYPE_NAMES
from remat_passes.ir.mlir import RematError
from remat_passes.ir.verdicts import Offloadable, Recompute, Saveable, normalize_verdict  # noqa: F401 (re-exported: policies speak of them)
from remat_passes.policy.auto import auto  # auto(budget=...) is a policy spelling too
from remat_passes.policy.base import Policy, PolicyError  # noqa: F401

NAME_MARKER = "remat.name"


# ------------------------------------------------------------------ op info --
class OpInfo:
    """What a policy sees of one forward op.

    name             e.g. "stablehlo.dot_general"
    operand_types    e.g. ["tensor<8x4xf32>", ...]
    operand_shapes   the same as (shape, element type): [((8, 4), "f32"), ...], a dynamic
                     dimension None, an operand that is not a tensor (a token) None
    result_types
    attributes       attribute name -> printed value
    checkpoint_name  for the @remat.name marker, its name; else None
    primitive        JAX's name for the op when its location says ("sin"), else the
                     StableHLO op name without dialect ("sine")
    lhs_batching_dims / rhs_batching_dims  for dot_general
    scaled_dot_batch  for JAX's block-scaled matmul (a custom call on GPU), its batch
                     size (a dot to JAX's dot policies: "no batch dims" where it is 1);
                     else None
    lowered_from     for a dot_general JAX lowered from another primitive
                     ("ragged_dot_general", on CPU): that primitive, which JAX's dot
                     policies do not count as a dot; else None

    `operand_types`, `result_types`, `attributes` and `primitive` may be given as
    zero-argument callables: they are computed on first use (printing types and
    attributes costs more than most policies ever look at).
    """

    def __init__(self, name, operand_types, result_types, attributes, checkpoint_name,
                 lhs_batching_dims=(), rhs_batching_dims=(), lhs_contracting_dims=(),
                 rhs_contracting_dims=(), primitive=None, scaled_dot_batch=None,
                 lowered_from=None, operand_shapes=None):
        self.name = name
        self.scaled_dot_batch = scaled_dot_batch
        self.lowered_from = lowered_from
        self._lazy = {"operand_types": operand_types, "result_types": result_types,
                      "attributes": attributes,
                      "operand_shapes": operand_shapes if operand_shapes is not None
                      else (lambda: [_parse_tensor_type(t) for t in self.operand_types]),
                      "primitive": lowered_from or primitive or name.split(".", 1)[-1]}
        self.checkpoint_name = checkpoint_name
        self.lhs_batching_dims = tuple(lhs_batching_dims)
        self.rhs_batching_dims = tuple(rhs_batching_dims)
        self.lhs_contracting_dims = tuple(lhs_contracting_dims)
        self.rhs_contracting_dims = tuple(rhs_contracting_dims)

    def _get(self, key):
        value = self._lazy[key]
        if callable(value):
            value = self._lazy[key] = value()
        return value

    def freeze(self) -> "OpInfo":
        """Compute every lazy field now (while the op exists): for a policy that keeps
        the OpInfo it was given, to read after the pass."""
        for key in self._lazy:
            self._get(key)
        return self

    @property
    def operand_types(self) -> list[str]:
        return self._get("operand_types")

    @property
    def operand_shapes(self) -> list:
        return self._get("operand_shapes")

    @property
    def result_types(self) -> list[str]:
        return self._get("result_types")

    @property
    def attributes(self) -> dict[str, str]:
        return self._get("attributes")

    @property
    def primitive(self) -> str:
        return self._get("primitive")

    def __repr__(self):
        extra = f", checkpoint_name={self.checkpoint_name!r}" if self.checkpoint_name else ""
        return f"OpInfo({self.name}{extra})"

    @property
    def is_dot(self) -> bool:
        return (self.name in ("stablehlo.dot_general", "stablehlo.dot")
                and self.lowered_from is None) or self.scaled_dot_batch is not None

    @property
    def is_conv(self) -> bool:
        return self.name == "stablehlo.convolution"


# ----------------------------------------------------------------- policies --
def _q(names):
    return ", ".join(repr(n) for n in names)


def _everything(op):
    return True


def _nothing(op):
    return False


def _dots(op):
    return op.is_dot or op.is_conv


def _dot_general_no_batch(op):
    if op.lowered_from is not None:
        return False
    if op.name == "stablehlo.dot":  # plain dot has no batch dimensions
        return True
    return op.name == "stablehlo.dot_general" and not op.lhs_batching_dims \
        and not op.rhs_batching_dims


def _dots_no_batch(op):
    if op.scaled_dot_batch is not None:     # (as JAX: a batch of one)
        return op.scaled_dot_batch == 1
    return _dot_general_no_batch(op)


everything_saveable = Policy(_everything, "everything_saveable", constant=Saveable)
nothing_saveable = Policy(_nothing, "nothing_saveable", constant=Recompute)
dots_saveable = Policy(_dots, "dots_saveable")
checkpoint_dots = dots_saveable
dots_with_no_batch_dims_saveable = Policy(_dots_no_batch, "dots_with_no_batch_dims_saveable")
checkpoint_dots_with_no_batch_dims = dots_with_no_batch_dims_saveable


def offload_dot_with_no_batch_dims(offload_src, offload_dst):
    offload = Offloadable(offload_src, offload_dst)     # (its memory kinds checked now)

    def policy(op):
        if _dot_general_no_batch(op):      # (JAX's: dot_general alone, not the scaled one)
            return offload
        return Recompute
    return Policy(policy, f"offload_dot_with_no_batch_dims({offload_src!r}, {offload_dst!r})")


def _names_except(names_not_to_save, label: str, unnamed: bool) -> Policy:
    """Save named values but those given; unnamed values by `unnamed`."""
    excluded = frozenset(names_not_to_save)

    def policy(op):
        if op.checkpoint_name is not None:
            return op.checkpoint_name not in excluded
        return unnamed
    return Policy(policy, f"{label}({_q(names_not_to_save)})", names=excluded)


def save_anything_except_these_names(*names_not_to_save):
    """Save any values (not just named ones) excluding the names given."""
    return _names_except(names_not_to_save, "save_anything_except_these_names", True)


def save_any_names_but_these(*names_not_to_save):
    """Save only named values, excluding the names given."""
    return _names_except(names_not_to_save, "save_any_names_but_these", False)


def save_only_these_names(*names_which_can_be_saved):
    """Save only named values, and only among the names given."""
    allowed = frozenset(names_which_can_be_saved)

    def policy(op):
        return op.checkpoint_name is not None and op.checkpoint_name in allowed
    return Policy(policy, f"save_only_these_names({_q(names_which_can_be_saved)})",
                  names=allowed)


def save_and_offload_only_these_names(*, names_which_can_be_saved, names_which_can_be_offloaded,
                                      offload_src, offload_dst):
    saved = set(names_which_can_be_saved)
    offloaded = set(names_which_can_be_offloaded)
    intersection = saved & offloaded
    if intersection:
        raise ValueError(
            "The names should be exclusive and should not intersect in"
            " `names_which_can_be_saved` and `names_which_can_be_offloaded`. Got"
            f" names_which_can_be_saved={saved}, names_which_can_be_offloaded={offloaded}"
            f" and the intersection={intersection}")
    offload = Offloadable(offload_src, offload_dst)     # (its memory kinds checked now)

    def policy(op):
        if op.checkpoint_name in saved:
            return Saveable
        if op.checkpoint_name in offloaded:
            return offload
        return Recompute
    spec = ("save_and_offload_only_these_names("
            f"names_which_can_be_saved=[{_q(sorted(saved))}], "
            f"names_which_can_be_offloaded=[{_q(sorted(offloaded))}], "
            f"offload_src={offload_src!r}, offload_dst={offload_dst!r})")
    return Policy(policy, spec, names=saved | offloaded)


def save_from_both_policies(policy_1, policy_2):
    p1, p2 = as_policy(policy_1), as_policy(policy_2)

    def policy(op):
        out1, out2 = p1(op), p2(op)
        if not (isinstance(out1, bool) and isinstance(out2, bool)):
            raise ValueError(
                "The return value of the policies should be a boolean. Got:"
                f" {out1} and {out2}. Please write a custom policy function directly,"
                " rather than using this helper function.")
        return out1 or out2
    names = None if p1.names is None and p2.names is None else \
        (p1.names or frozenset()) | (p2.names or frozenset())
    return Policy(policy, f"save_from_both_policies({p1.spec}, {p2.spec})",
                  reads_attributes=p1.reads_attributes or p2.reads_attributes, names=names)


# The class spellings jax 0.10-0.11 use (0.11 exports them from jax.checkpoint_policies):
# same arguments as the dataclass fields, same policies as the factories above.
def SaveOnlyTheseNames(saveable_names):  # noqa: N802 (JAX's name)
    return save_only_these_names(*sorted(saveable_names))


def SaveAnyNamesButThese(names):  # noqa: N802
    return save_any_names_but_these(*sorted(names))


def SaveAndOffloadOnlyTheseNames(names_which_can_be_saved, names_which_can_be_offloaded,  # noqa: N802
                                 offload_src, offload_dst):
    return save_and_offload_only_these_names(
        names_which_can_be_saved=names_which_can_be_saved,
        names_which_can_be_offloaded=names_which_can_be_offloaded,
        offload_src=offload_src, offload_dst=offload_dst)


# MaxText's `remat_policy` presets, as MaxText 0.2.5 builds them (`get_remat_policy` in
# maxtext/layers/nnx_decoders.py) over its checkpoint names: (what the names get, names).
# "full" is `policy=None`, jax.checkpoint's default; "none" and "custom" (names from the
# config) are not presets of a policy.
_MAXTEXT_QKV = ("query_proj", "value_proj", "key_proj", "kv_proj", "qkv_proj")
_MAXTEXT_MLP = ("mlpwi_0", "mlpwi_1", "mlpwi", "mlpwo")
_MAXTEXT_MINIMAL = _MAXTEXT_QKV + ("out_proj",) + _MAXTEXT_MLP
MAXTEXT_PRESETS: dict[str, tuple[str, tuple[str, ...]]] = {
    "minimal": ("save", _MAXTEXT_MINIMAL),
    "minimal_with_context": ("save", _MAXTEXT_MINIMAL + ("context",)),
    "minimal_flash": ("save", _MAXTEXT_MINIMAL + ("context",)),
    "minimal_with_quantization": ("save", _MAXTEXT_MINIMAL + ("quantization",)),
    "minimal_with_context_and_quantization":
        ("save", _MAXTEXT_MINIMAL + ("context", "quantization")),
    "save_dot_with_context_except_mlp": ("save", _MAXTEXT_QKV + ("context", "out_proj")),
    "save_dot_except_mlpwi": ("save", _MAXTEXT_QKV + ("out_proj", "mlpwo")),
    "save_dot_except_mlp": ("save", _MAXTEXT_QKV + ("out_proj",)),
    "save_qkv_proj": ("save", _MAXTEXT_QKV),
    "qkv_proj_offloaded": ("offload", ("query_proj", "value_proj", "key_proj", "kv_proj")),
    "minimal_offloaded": ("offload", _MAXTEXT_MINIMAL),
    "save_out_proj": ("save", ("out_proj",)),
    "full": ("nothing", ()),
}


def maxtext(preset):
    """MaxText's `remat_policy=preset` (MaxText 0.2.5's definitions, over its checkpoint
    names: `query_proj`, `qkv_proj`, `out_proj`, `mlpwi`, `mlpwo`, `context`, ...). A
    preset names the projections of every MaxText architecture; a model has some of them,
    so only a preset none of whose names the model has gets the missing-names remark."""
    if preset not in MAXTEXT_PRESETS:
        close = difflib.get_close_matches(str(preset), MAXTEXT_PRESETS, n=3)
        raise ValueError(f"unknown MaxText remat preset {preset!r}" + (
            f"; did you mean {', '.join(close)}?" if close else
            f"; known: {', '.join(MAXTEXT_PRESETS)}"))
    kind, names = MAXTEXT_PRESETS[preset]
    if kind == "nothing":
        base = nothing_saveable
    elif kind == "save":
        base = save_only_these_names(*names)
    else:
        base = save_and_offload_only_these_names(
            names_which_can_be_saved=[], names_which_can_be_offloaded=list(names),
            offload_src="device", offload_dst="pinned_host")
    return Policy(base, f"maxtext({preset!r})", constant=base.constant,
                  names=frozenset(names) or None, names_any=True)


# Names usable in a policy spec, with the number of arguments they take
# (None: the name itself is the policy).
POLICIES: dict[str, Any] = {
    "everything_saveable": everything_saveable,
    "nothing_saveable": nothing_saveable,
    "dots_saveable": dots_saveable,
    "checkpoint_dots": checkpoint_dots,
    "dots_with_no_batch_dims_saveable": dots_with_no_batch_dims_saveable,
    "checkpoint_dots_with_no_batch_dims": checkpoint_dots_with_no_batch_dims,
    "offload_dot_with_no_batch_dims": offload_dot_with_no_batch_dims,
    "save_anything_except_these_names": save_anything_except_these_names,
    "save_any_names_but_these": save_any_names_but_these,
    "save_only_these_names": save_only_these_names,
    "save_from_both_policies": save_from_both_policies,
    "save_and_offload_only_these_names": save_and_offload_only_these_names,
    "SaveOnlyTheseNames": SaveOnlyTheseNames,
    "SaveAnyNamesButThese": SaveAnyNamesButThese,
    "SaveAndOffloadOnlyTheseNames": SaveAndOffloadOnlyTheseNames,
    "auto": auto,
    "maxtext": maxtext,
}


SCALED_DOT = "scaled_matmul_wrapper"


_TENSOR_TYPE = re.compile(r"tensor<((?:(?:\d+|\?)x)*)(complex<[^>]*>|[^,>]+)")


def _parse_tensor_type(text: str):
    """(shape, element type) of a printed ranked tensor type; None for another type."""
    m = _TENSOR_TYPE.match(text)
    if m is None:
        return None
    dims = [d for d in m.group(1).split("x") if d]
    return tuple(None if d == "?" else int(d) for d in dims), m.group(2)


class _Shaped:
    """An operand's aval where JAX's ShapedArray cannot stand for it (a dynamic dimension,
    an element type JAX lacks, a token): its shape, dtype (or None) and rank."""

    def __init__(self, shape, dtype=None):
        self.shape, self.dtype, self.ndim = tuple(shape), dtype, len(shape)


def _precision(attrs: dict):
    """JAX's `precision` param from a printed `precision_config`: None where every operand's
    is DEFAULT (what JAX lowers None to), else a tuple of `lax.Precision`."""
    import jax
    names = re.findall(r"precision (\w+)", attrs.get("precision_config", ""))
    if all(n == "DEFAULT" for n in names):
        return None
    return tuple(getattr(jax.lax.Precision, n) for n in names)


def _i64s(text: str | None, default):
    return tuple(int(x) for x in re.findall(r"-?\d+", text.split(":", 1)[-1].split(">")[0])) \
        if text else default


def _conv_params(op: "OpInfo") -> dict:
    """The params JAX gives `conv_general_dilated_p`, read back from the printed op."""
    import jax
    attrs = op.attributes
    spatial = len(op.operand_shapes[0][0]) - 2 if op.operand_shapes[0] else 0
    labels = conv_dim_labels(attrs.get("dimension_numbers", ""))
    numbers = None
    if labels:
        lhs, rhs, out = labels
        order = [str(i) for i in range(spatial)]
        numbers = jax.lax.ConvDimensionNumbers(
            tuple(lhs.index(d) for d in ["b", "f", *order]),
            tuple(rhs.index(d) for d in ["o", "i", *order]),
            tuple(out.index(d) for d in ["b", "f", *order]))
    parsed_in = op.operand_shapes[0][1] if op.operand_shapes[0] else None
    parsed_out = (_parse_tensor_type(op.result_types[0]) or (None, None))[1]
    pads = re.findall(r"-?\d+", attrs.get("padding", "").split(":")[0])
    if len(pads) == 1:                     # (a splat)
        pads = pads * (2 * spatial)
    return {"window_strides": _i64s(attrs.get("window_strides"), (1,) * spatial),
            "padding": tuple((int(pads[2 * i]), int(pads[2 * i + 1])) for i in range(spatial))
            if pads else ((0, 0),) * spatial,
            "lhs_dilation": _i64s(attrs.get("lhs_dilation"), (1,) * spatial),
            "rhs_dilation": _i64s(attrs.get("rhs_dilation"), (1,) * spatial),
            "dimension_numbers": numbers,
            "feature_group_count": int(attrs.get("feature_group_count", "1").split(":")[0]),
            "batch_group_count": int(attrs.get("batch_group_count", "1").split(":")[0]),
            "precision": _precision(attrs),
            # (None unless the result's type differs from the input's)
            "preferred_element_type": None if parsed_out == parsed_in else _dtype(parsed_out),
            "out_sharding": None}


def _dtype(elem: str):
    """The JAX dtype of an MLIR element type, or None where the installed JAX has none."""
    import jax.numpy as jnp
    name = DTYPE_NAMES.get(elem)
    return jnp.dtype(getattr(jnp, name)) if name and hasattr(jnp, name) else None


def _result_dtype(op: "OpInfo"):
    """JAX's `preferred_element_type` of a dot: its result's dtype (what jnp.matmul, einsum
    and Flax pass; lax.dot_general called without one has None)."""
    parsed = _parse_tensor_type(op.result_types[0]) if op.result_types else None
    return _dtype(parsed[1]) if parsed else None


def _avals(op: "OpInfo") -> list:
    """The operands' avals, as JAX passes them to a policy (`jax.core.ShapedArray`)."""
    import jax
    out = []
    for shape_elem in op.operand_shapes:
        if shape_elem is None:               # a token
            out.append(_Shaped(()))
            continue
        shape, elem = shape_elem
        dtype = _dtype(elem)
        out.append(jax.core.ShapedArray(shape, dtype) if dtype is not None and
                   None not in shape else _Shaped(shape, dtype))
    return out


def _from_jax_policy(policy) -> Policy:
    """Adapt a policy written for jaxprs (`policy(prim, *avals, **params)`).

    `jax.checkpoint_policies.*` and user policies in JAX's style see the JAX
    primitive that lowers to the op: dot_general_p, conv_general_dilated_p,
    name_p (with its `name`), or a stand-in primitive named like the op.
    """
    from remat_passes import jax_compat
    dot_general_p, conv_p, name_p, Primitive = jax_compat.policy_primitives()
    stand_ins: dict[str, Any] = {}

    def adapted(op: OpInfo):
        avals = _avals(op)
        if op.checkpoint_name is not None:
            return policy(name_p, *avals, name=op.checkpoint_name)
        if op.name in ("stablehlo.dot_general", "stablehlo.dot") and op.lowered_from is None:
            dims = ((op.lhs_contracting_dims, op.rhs_contracting_dims),
                    (op.lhs_batching_dims, op.rhs_batching_dims))
            return policy(dot_general_p, *avals, dimension_numbers=dims,
                          precision=_precision(op.attributes),
                          preferred_element_type=_result_dtype(op), out_sharding=None)
        if op.name == "stablehlo.convolution":
            return policy(conv_p, *avals, **_conv_params(op))
        if op.scaled_dot_batch is not None:     # (JAX's policies read the lhs's batch size)
            prim = stand_ins.setdefault(SCALED_DOT, Primitive(SCALED_DOT))
            return policy(prim, *avals)
        prim = stand_ins.setdefault(op.primitive, Primitive(op.primitive))
        return policy(prim, *avals)
    name = getattr(policy, "__qualname__", None) or repr(policy)
    # (reads_attributes: the precision and a convolution's window, as JAX's params give them)
    return Policy(adapted, f"<jax policy {name}>", reads_attributes=True)


def _is_jax_policy(policy) -> bool:
    """jax.checkpoint_policies objects, and user policies written in JAX's style
    (`def policy(prim, *avals, **params)`: a first parameter named `prim`)."""
    module = getattr(policy, "__module__", "") or ""
    if module.startswith("jax.") or module == "jax":
        return True
    try:
        params = list(inspect.signature(policy).parameters)
    except (TypeError, ValueError):
        return False
    return bool(params) and params[0] == "prim"


def as_policy(policy) -> Policy:
    """A Policy from a Policy, a spec string, a JAX policy or a user callable."""
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, str):
        return parse_policy(policy)
    if callable(policy) and _is_jax_policy(policy):
        from remat_passes import jax_compat
        spec = jax_compat.native_policy_spec(policy)   # jax.checkpoint_policies.* objects
        return parse_policy(spec) if spec is not None else _from_jax_policy(policy)
    if callable(policy):
        name = getattr(policy, "__qualname__", None) or repr(policy)
        return Policy(policy, f"<callable {name}>", reads_attributes=True)
    raise RematError(f"error: a policy must be a name, a spec string or a callable, got {policy!r}")


# ------------------------------------------------------------- spec parsing --
_AUTO_VALUE = re.compile(r"\b(budget|offload|device|objective|solver|score|monotone|check|ties)\s*=\s*([^,()'\"]+)")
_AUTO_BUDGET = re.compile(r"\bauto\(\s*([^,()'\"=]+?)\s*(?=[,)])")


def _quote_auto_values(text: str) -> str:
    """`auto(budget=2GiB)` -> `auto(budget='2GiB')`, and the budget given first without its
    keyword, `auto(12MiB)` -> `auto(budget='12MiB')`: budgets with units or % are no Python."""
    text = _AUTO_BUDGET.sub(lambda m: f"auto(budget={m.group(1)}", text)
    return _AUTO_VALUE.sub(lambda m: f"{m.group(1)}='{m.group(2).strip()}'", text)


def parse_policy(spec: str) -> Policy:
    """Read a policy spec such as `save_only_these_names(a, 'b.c')`.

    Bare identifiers among the arguments are names (strings), so specs can be
    written on a command line without quotes.
    """
    text = _quote_auto_values(spec.strip())
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError as e:
        raise RematError(f"error: cannot parse policy '{spec}': {e.msg}") from None
    return _eval_policy(tree, spec)


def _unknown_policy(name, spec):
    close = difflib.get_close_matches(name, POLICIES, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else \
        f"; known policies: {', '.join(POLICIES)}"
    return RematError(f"error: unknown policy '{name}' in '{spec}'{hint}")


def _eval_policy(node, spec):
    if isinstance(node, ast.Name):
        if node.id not in POLICIES:
            raise _unknown_policy(node.id, spec)
        value = POLICIES[node.id]
        if not isinstance(value, Policy):
            raise RematError(f"error: policy '{node.id}' needs arguments (in '{spec}')")
        return value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        name = node.func.id
        if name not in POLICIES:
            raise _unknown_policy(name, spec)
        factory = POLICIES[name]
        if isinstance(factory, Policy):
            raise RematError(f"error: policy '{name}' takes no arguments (in '{spec}')")
        if name == "save_from_both_policies":
            args = [_eval_policy(a, spec) for a in node.args]
        else:
            args = [_eval_arg(a, spec) for a in node.args]
        _check_keywords(name, factory, node.keywords, spec)
        kwargs = {k.arg: _eval_arg(k.value, spec) for k in node.keywords}
        try:
            return factory(*args, **kwargs)
        except TypeError as e:
            raise RematError(f"error: bad arguments for policy '{name}' in '{spec}': {e}") from None
        except ValueError as e:
            raise RematError(f"error: {e}") from None
    raise RematError(f"error: cannot read policy '{spec}': expected NAME or NAME(args)")


def _check_keywords(name, factory, keywords, spec) -> None:
    """An option the policy does not take is named with the ones it does (before its value
    is read: `auto(10%, levels=2)` asks for a pass option, not a bad value)."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):     # (a factory without a signature to read)
        return
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    known = [n for n, p in params.items()
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for k in keywords:
        if k.arg is not None and k.arg not in known:
            takes = f"its options: {', '.join(known)}" if known else \
                f"it takes arguments only, no name=value options: {name}(a, b)"
            raise RematError(f"error: policy '{name}' has no option '{k.arg}' (in '{spec}'); "
                             + takes)


def _eval_arg(node, spec):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [_eval_arg(e, spec) for e in node.elts]
    raise RematError(f"error: policy arguments must be names or strings, in '{spec}'")
