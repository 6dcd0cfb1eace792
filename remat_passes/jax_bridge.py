"""The JAX side: export a joint VJP module, names and regions, compile and call.

* `export_vjp(fun, *primals)` exports `@main(primals..., cotangents...) ->
  (outputs..., primal cotangents...)` with `remat.cotangent` on the cotangent
  arguments, while `checkpoint_name` (ours and JAX's) lowers to the
  `@remat.name` marker instead of vanishing.
* `checkpoint(fun, policy=...)` marks each call as a `remat[N]` name-stack
  region (it survives jvp/transpose) and remembers its policy; `export_vjp`
  records the policies of the regions in the module (`remat.regions`).
* `to_exported` / `compile` turn any function of a Module back into a
  `jax.export.Exported` and a jitted callable, on the default backend.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import itertools
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import export as jax_export

from remat_passes import contract, graph, gspmd, jax_compat

jax_compat.check_installed_version(("jax",))   # jaxlib was checked by `import remat_passes`
from remat_passes.mlir import RematError, func, ir, stablehlo
from remat_passes.module import Module, main_signature
from remat_passes.policies import Policy, as_policy, nothing_saveable

MARKER_TARGET = contract.NAME_TARGET

# Source positions in locations should name the user's code, not our wrappers
# (JAX excludes its own files the same way).
jax_compat.exclude_from_source_info(os.path.dirname(os.path.abspath(__file__)))
_MARKER_CHECK = jax_export.DisabledSafetyCheck.custom_call(MARKER_TARGET)

# --------------------------------------------------------------- names --


def checkpoint_name(x, name: str):
    """Name a value for name-based policies; the same primitive as JAX's own.

    Under `export_vjp` it becomes `stablehlo.custom_call @remat.name`; under
    plain `jax.jit` it lowers to nothing, exactly like
    `jax.ad_checkpoint.checkpoint_name`.
    """
    from jax.ad_checkpoint import checkpoint_name as jax_checkpoint_name
    return jax_checkpoint_name(x, name)


def _marker_lowering(ctx, x, *, name):
    op = stablehlo.CustomCallOp(
        [x.type], [x],
        call_target_name=ir.StringAttr.get(MARKER_TARGET),
        backend_config=ir.StringAttr.get(name))
    return op.results


@contextlib.contextmanager
def names_as_markers():
    """Within it, `checkpoint_name` lowers to the `@remat.name` marker the passes read
    (instead of to nothing), so a `jax.export` made inside keeps the names. JAX's own
    lowering is restored on exit. A module exported this way needs
    `disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("remat.name")]`,
    and the function must be one JAX has not lowered before in the process (its
    lowering cache would hand back the old lowering); `rp.export` does both."""
    with jax_compat.lowering_overridden(jax_compat.name_primitive(), _marker_lowering):
        yield


# ------------------------------------------------------------- regions --
_region_ids = itertools.count(1)
_REGION_POLICIES: dict[str, Policy] = {}
_REGIONS_NO_CSE: set[str] = set()        # keys of regions made with prevent_cse=False


def checkpoint(fun, *, policy=None, prevent_cse: bool = True, static_argnums=()):
    """Mark each call of `fun` as a checkpoint region (the StableHLO-level jax.checkpoint).

    Nothing is rematerialized at trace time: the call is traced inside a
    unique `remat[N]` name scope, which JAX keeps through jvp and transpose,
    and `policy` (default `nothing_saveable`, as for jax.checkpoint) is
    recorded for it. `remat-partial-eval` then applies it. With
    `prevent_cse=False` its recomputation gets no optimization_barrier
    (place-optimization-barriers skips it), as jax.checkpoint's. `static_argnums` is
    accepted for jax.checkpoint compatibility: arguments stay Python values
    here anyway, since no separate trace is made.
    """
    pol = nothing_saveable if policy is None else as_policy(policy)
    if isinstance(static_argnums, int):
        static_argnums = (static_argnums,)
    if not (isinstance(static_argnums, tuple) and all(isinstance(d, int) for d in static_argnums)):
        raise TypeError("the `static_argnums` argument to `remat_passes.checkpoint` must be an "
                        f"int or a tuple of ints, got {static_argnums!r}")

    @functools.wraps(fun)
    def region(*args, **kwargs):
        key = f"remat[{next(_region_ids)}]"
        _REGION_POLICIES[key] = pol
        if not prevent_cse:
            _REGIONS_NO_CSE.add(key)
        with jax.named_scope(key):
            return fun(*args, **kwargs)
    region.prevent_cse = prevent_cse
    return region


# ---------------------------------------------------------- export_vjp --
def _param_names(fun, n: int) -> list[str]:
    try:
        params = list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][:n]
    if len(names) < n or any(p.kind == p.VAR_POSITIONAL for p in params[:len(names)]):
        names = names + [f"arg{i}" for i in range(len(names), n)]
    return names


def export_vjp(fun, *primals, platforms=None) -> Module:
    """Export the joint VJP of `fun` at `primals` as a Module.

    `@main(primals..., cotangents...) -> (outputs..., primal cotangents...)`,
    pytrees flattened as `jax.vjp` does; calling it equals `jax.vjp(fun,
    *primals)` followed by the VJP function on the same cotangents.
    """
    out_shape = jax.eval_shape(fun, *primals)
    for leaf in jax.tree_util.tree_leaves(out_shape):
        if not jnp.issubdtype(leaf.dtype, jnp.inexact):
            raise RematError(f"error: export_vjp needs floating-point outputs, got {leaf.dtype}")
    cotangent = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype), out_shape)
    n = len(primals)

    def joint(*args):
        out, vjp_fn = jax.vjp(fun, *args[:n])
        return out, vjp_fn(args[n])
    names = _param_names(fun, n) + ["cotangent"]
    joint.__signature__ = inspect.Signature(
        [inspect.Parameter(nm, inspect.Parameter.POSITIONAL_OR_KEYWORD) for nm in names])
    joint.__name__ = getattr(fun, "__name__", "fun")

    with names_as_markers():
        exported = jax_export.export(jax.jit(joint, keep_unused=True), platforms=platforms,
                                     disabled_checks=[_MARKER_CHECK])(*primals, cotangent)
    module = Module.parse(exported.mlir_module())
    n_primal_leaves = len(jax.tree_util.tree_leaves(primals))
    n_out_leaves = len(jax.tree_util.tree_leaves(out_shape))
    main = graph.find_func(module.op, "main")
    nargs = len(graph.body_block(main).arguments)
    nres = len(main.type.results)
    with module.op.context:
        contract.mark_cotangent_args(main, range(n_primal_leaves, nargs))
        for i in range(n_out_leaves, nres):
            contract.set_entry(main, "res_attrs", i, contract.GRADIENT, ir.UnitAttr.get())
        _record_regions(module)
    module.exported = exported
    return module


def export(fun, *args, platforms=None) -> Module:
    """`jax.export` of `jax.jit(fun)` at `args`, with checkpoint names kept.

    For a function that computes its own gradients (a training step): plain
    `jax.export` lowers `checkpoint_name` to nothing, so a names policy would
    find no names. Here names lower to the `@remat.name` marker the passes read
    (and `compile` drops), and the policies of `rp.checkpoint` regions are
    recorded, as `export_vjp` does. Equivalent: call `jax.export` inside
    `with rp.names_as_markers():` and load the result with `rp.from_exported`.
    """
    @functools.wraps(fun)
    def fresh(*a):      # a new function: JAX's caches never hand the marker lowering
        return fun(*a)  # to a later plain jit of `fun`, nor a plain one to us
    with names_as_markers():
        exported = jax_export.export(jax.jit(fresh), platforms=platforms,
                                     disabled_checks=[_MARKER_CHECK])(*args)
    module = from_exported(exported)
    with module.op.context:
        _record_regions(module)
    return module


def _record_regions(module: Module) -> None:
    """The policies of the rp.checkpoint regions in the module, on the module.

    Every region key seen in its name stacks is looked up, not only those made
    during this export: JAX reuses the trace of a function it traced before (a
    scan body traced by an earlier `eval_shape` or `jit`), region frames included.
    Keys are unique in the process, so a key always names the policy it was made with."""
    regions = _scopes_in(module.op)
    if regions:
        specs = {}
        for key in regions:
            pol = _REGION_POLICIES[key]
            specs[key] = pol.spec
            if pol.spec.startswith("<"):  # a Python callable: kept on the Module
                module.region_policies[key] = pol
        contract.set_region_specs(module.op, specs)
        no_cse = [key for key in regions if key in _REGIONS_NO_CSE]
        if no_cse:
            contract.set_regions_without_cse_barrier(module.op, no_cse)


def _scopes_in(module_op) -> list[str]:
    """The keys of this process's rp.checkpoint regions named in the module's name stacks."""
    found = {}

    def visit(op):
        for frame in graph.SCOPE_FRAME_RE.findall(graph.name_stack(op)):
            if frame in _REGION_POLICIES:
                found[frame] = None
        return ir.WalkResult.ADVANCE
    module_op.operation.walk(visit)
    return sorted(found, key=lambda k: int(k[6:-1]))


# ------------------------------------------------------ compile & call --
_DTYPES = {
    "f16": jnp.float16, "bf16": jnp.bfloat16, "f32": jnp.float32, "f64": jnp.float64,
    "i1": jnp.bool_, "i8": jnp.int8, "i16": jnp.int16, "i32": jnp.int32, "i64": jnp.int64,
    "ui8": jnp.uint8, "ui16": jnp.uint16, "ui32": jnp.uint32, "ui64": jnp.uint64,
    "complex<f32>": jnp.complex64, "complex<f64>": jnp.complex128,
    "f8E4M3FN": jnp.float8_e4m3fn, "f8E5M2": jnp.float8_e5m2,
}


def _aval(t):
    rt = ir.RankedTensorType(t)
    elem = str(rt.element_type)
    if elem not in _DTYPES:
        raise RematError(f"error: cannot call a function with element type {elem}")
    return jax.core.ShapedArray(tuple(rt.shape), np.dtype(_DTYPES[elem]))


def _single_function_module(module: Module, function: str):
    """A copy whose public @main runs `function`, markers stripped.

    For another function, a public @main wrapper calls it, so calls between
    private functions keep their symbols.
    """
    from remat_passes.passes.strip_checkpoint_names import strip
    copy = module.clone()
    target = graph.find_func(copy.op, function)  # raises a clear error if absent
    with copy.op.context, ir.Location.unknown():
        strip(copy.op)
        if function == "main":
            return copy
        for op in list(copy.op.body.operations):
            if op.operation.name == "func.func" and graph.func_name(op) == "main":
                op.operation.attributes["sym_name"] = ir.StringAttr.get("main_original")
                op.operation.attributes["sym_visibility"] = ir.StringAttr.get("private")
        target.operation.attributes["sym_visibility"] = ir.StringAttr.get("private")
        ftype = target.type
        wrapper = func.FuncOp("main", ftype, ip=ir.InsertionPoint(copy.op.body))
        block = wrapper.add_entry_block()
        with ir.InsertionPoint(block):
            call = func.CallOp(list(ftype.results), ir.FlatSymbolRefAttr.get(function),
                               list(block.arguments))
            func.ReturnOp(list(call.results))
    return copy


def to_exported(module: Module, function: str = "main"):
    """A jax.export.Exported that runs `function` of `module`.

    @main keeps the Exported's calling convention (pytrees, platform index,
    symbolic shapes) as long as its signature is what was imported.
    """
    copy = _single_function_module(module, function)
    serialized = copy.bytecode()
    exp = module.exported
    if exp is not None and function == "main" and \
            main_signature(copy.op) == module.exported_signature:
        return dataclasses.replace(exp, mlir_module_serialized=serialized)
    main = graph.find_func(copy.op, "main")
    in_avals = tuple(_aval(t) for t in main.type.inputs)
    out_avals = tuple(_aval(t) for t in main.type.results)
    n_in, n_out = len(in_avals), len(out_avals)
    platforms = exp.platforms if exp is not None else (jax.default_backend(),)
    out_tree = jax.tree_util.tree_structure(0 if n_out == 1 else (0,) * n_out)
    return jax_compat.make_exported(
        fun_name=function,
        in_tree=jax.tree_util.tree_structure(((0,) * n_in, {})),
        in_avals=in_avals,
        out_tree=out_tree,
        out_avals=out_avals,
        _in_named_shardings=(None,) * n_in,
        _out_named_shardings=(None,) * n_out,
        in_shardings_hlo=(None,) * n_in,
        out_shardings_hlo=(None,) * n_out,
        nr_devices=exp.nr_devices if exp is not None else gspmd.num_devices(copy.op),
        platforms=tuple(platforms),
        ordered_effects=(),
        unordered_effects=(),
        disabled_safety_checks=(_MARKER_CHECK,),
        mlir_module_serialized=serialized,
        calling_convention_version=exp.calling_convention_version if exp is not None else 10,
        module_kept_var_idx=tuple(range(n_in)),
        uses_global_constants=False,
        _get_vjp=None,
    )


def compile(module: Module, function: str = "main"):
    """Compile `function` of `module` with XLA (default backend); returns a callable.

    A function that kept an Exported's calling convention takes the original
    pytrees; any other (the split <f>_fwd/<f>_bwd, hand-written modules) takes
    flat arrays, and pytrees of arrays are flattened for it.
    """
    exported = to_exported(module, function)
    if module.exported is not None and exported.in_tree == module.exported.in_tree:
        return jax.jit(exported.call)
    return jax.jit(lambda *args: exported.call(*jax.tree_util.tree_leaves(args)))


def from_exported(exported) -> Module:
    """A Module from a jax.export.Exported, keeping its calling convention."""
    module = Module.parse(exported.mlir_module())
    module.exported = exported
    return module

