"""The JAX side: export a joint VJP module, names and regions, compile and call.

* `export_vjp(fun, *primals)` exports `@main(primals..., cotangents...) ->
  (outputs..., primal cotangents...)` with `remat.cotangent` on the cotangent
  arguments, while `checkpoint_name` (ours and JAX's) lowers to the
  `@remat.name` marker instead of vanishing.
* `checkpoint(fun, policy=...)` marks each call as a `remat[N]` name-stack
  region (it survives jvp/transpose) and remembers its policy; `export_vjp`
  records the policies of the regions in the module (`remat.regions`).
* `from_exported` reads a `jax.export.Exported` back as a Module (`run` goes the
  other way).
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

from remat_passes import jax_compat
from remat_passes.ir import contract, graph, mlir

jax_compat.check_installed_version(("jax",))   # jaxlib was checked by `import remat_passes`
from remat_passes.ir.mlir import RematError, ir, stablehlo
from remat_passes.jax.module import Module
from remat_passes.jax import unrolled_scans
from remat_passes.jax.run import EXPORT_CHECKS
from remat_passes.policy.policies import Policy, as_policy, nothing_saveable

MARKER_TARGET = contract.NAME_TARGET

# Source positions in locations should name the user's code, not our wrappers
# (JAX excludes its own files the same way).
jax_compat.exclude_from_source_info(os.path.dirname(os.path.abspath(__file__)))

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


_LOOKED_THROUGH = ("stablehlo.convert", "stablehlo.reshape", "stablehlo.transpose")


def _marking_dots(rule, primitive: str):
    """`rule`, a lowering of `primitive` to StableHLO that ends in a dot_general (JAX's
    decomposition of `ragged_dot_general` for CPU), marking that dot_general with the
    primitive's name (`contract.PRIMITIVE`): JAX's dot policies decide on the primitive,
    and do not count this one as a dot."""
    def marked(ctx, *args, **params):
        outs = rule(ctx, *args, **params)
        for v in outs:
            op = v.owner if isinstance(v, ir.OpResult) else None
            while op is not None and op.name in _LOOKED_THROUGH and len(op.operands) == 1:
                v = op.operands[0]
                op = v.owner if isinstance(v, ir.OpResult) else None
            if op is not None and op.name == "stablehlo.dot_general":
                op.attributes[contract.PRIMITIVE] = ir.StringAttr.get(primitive)
        return outs
    return marked


@contextlib.contextmanager
def names_as_markers():
    """Within it, `checkpoint_name` lowers to the `@remat.name` marker the passes read
    (instead of to nothing), so a `jax.export` made inside keeps the names, and the
    dot_general `jax.lax.ragged_dot` lowers to on CPU is marked as not a dot
    (`contract.PRIMITIVE`), as JAX's policies see it. JAX's own
    lowering is restored on exit. A module exported this way needs
    `disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("remat.name")]`,
    and the function must be one JAX has not lowered before in the process (its
    lowering cache would hand back the old lowering); `rp.export` does both."""
    ragged = jax_compat.ragged_dot_primitive()
    with jax_compat.lowering_overridden(jax_compat.name_primitive(), _marker_lowering), \
            jax_compat.lowering_wrapped(ragged, lambda rule: _marking_dots(rule, ragged.name)):
        yield


def scan(f, init, xs=None, length=None, reverse=False, unroll=1, *, segments):
    """`jax.lax.scan` whose loop `segment-scans` cuts into segments of `segments` iterations
    (a count, counts per level such as "16x4", or "sqrt" / "cbrt"), whatever the pipeline's
    own `scan_segments` says. The body names its carry with a `remat.segments=...` marker
    that the pass reads (and strip-checkpoint-names removes); under `jax.jit` it is
    `lax.scan` itself."""
    from remat_passes.passes.segment_scans import parse_segments
    try:
        levels = parse_segments(segments)
    except ValueError as e:
        raise RematError(f"error: rp.scan: segments: {e}") from None
    text = levels if isinstance(levels, str) else (
        "x".join(map(str, levels)) if isinstance(levels, list) else str(levels))

    def body(carry, x):
        leaves, tree = jax.tree_util.tree_flatten(carry)
        if leaves:
            leaves[0] = checkpoint_name(leaves[0], contract.SEGMENTS_NAME + text)
        return f(jax.tree_util.tree_unflatten(tree, leaves), x)
    return jax.lax.scan(body, init, xs, length=length, reverse=reverse, unroll=unroll)


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


JAX_CHECKPOINT = ("jax", "regions")


@contextlib.contextmanager
def _jax_checkpoints(how: str):
    """What becomes of the `jax.checkpoint` calls in the model code while exporting:
    "jax" (JAX rematerializes them in the exported program, as `jax.export` does) or
    "regions" (each call is an `rp.checkpoint` region with its policy recorded: the
    passes apply it, and an outer region or budget can decide inside it)."""
    if how not in JAX_CHECKPOINT:
        raise RematError(f"error: jax_checkpoint must be one of {', '.join(JAX_CHECKPOINT)}, "
                         f"got {how!r}")
    if how == "jax":
        yield
        return

    def region(body, policy, prevent_cse):
        return checkpoint(body, policy=policy, prevent_cse=prevent_cse)
    with jax_compat.checkpoints_differentiated_as(region):
        yield


@contextlib.contextmanager
def _exportable():
    """What jax.export cannot carry, as a RematError that says what to change."""
    try:
        yield
    except NotImplementedError as e:
        if "host_callbacks" not in str(e):
            raise
        raise RematError(
            "error: the function calls back into Python (jax.debug.print, "
            "jax.debug.callback, jax.pure_callback or io_callback), and jax.export, "
            "through which the passes read a program, cannot carry a host callback (JAX: "
            f"{e}): take the callback out of the function, or return what it would "
            "print") from None


def export_vjp(fun, *primals, platforms=None, jax_checkpoint: str = "jax") -> Module:
    """Export the joint VJP of `fun` at `primals` as a Module.

    `@main(primals..., cotangents...) -> (outputs..., primal cotangents...)`,
    pytrees flattened as `jax.vjp` does; calling it equals `jax.vjp(fun,
    *primals)` followed by the VJP function on the same cotangents. An output that is not
    floating point (a count, a step number) has no cotangent argument (JAX's is a zero of
    `float0`): the cotangents are those of the floating-point outputs, in order.
    `jax_checkpoint="regions"` turns the `jax.checkpoint` calls of the model code into
    checkpoint regions the passes apply (default "jax": JAX applies them at export).
    """
    out_shape = jax.eval_shape(fun, *primals)
    out_leaves, out_tree = jax.tree_util.tree_flatten(out_shape)
    inexact = [jnp.issubdtype(leaf.dtype, jnp.inexact) for leaf in out_leaves]
    if not any(inexact):
        raise RematError("error: export_vjp needs a floating-point output, got "
                         f"{', '.join(sorted({str(leaf.dtype) for leaf in out_leaves}))}")
    # (the outputs' pytree, None where no cotangent is taken: the arguments keep their names)
    cotangent = jax.tree_util.tree_unflatten(out_tree, [
        jax.ShapeDtypeStruct(s.shape, s.dtype) if d else None
        for s, d in zip(out_leaves, inexact)])
    n = len(primals)

    def joint(*args):
        out, vjp_fn = jax.vjp(fun, *args[:n])
        cts = [np.zeros(s.shape, jax.dtypes.float0) if ct is None else ct
               for s, ct in zip(out_leaves, out_tree.flatten_up_to(args[n]))]
        return out, vjp_fn(jax.tree_util.tree_unflatten(out_tree, cts))
    names = _param_names(fun, n) + ["cotangent"]
    joint.__signature__ = inspect.Signature(
        [inspect.Parameter(nm, inspect.Parameter.POSITIONAL_OR_KEYWORD) for nm in names])
    joint.__name__ = getattr(fun, "__name__", "fun")

    with names_as_markers(), _jax_checkpoints(jax_checkpoint), _exportable(), \
            unrolled_scans.steps_apart(regions=jax_checkpoint == "regions"):
        exported = jax_export.export(jax.jit(joint, keep_unused=True), platforms=platforms,
                                     disabled_checks=list(EXPORT_CHECKS))(*primals, cotangent)
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
    module.exported = _with_module(exported, module)
    return module


def _with_module(exported, module: Module):
    """`exported` carrying `module`'s own IR (the marks and region specs added here), so
    that `module.exported.serialize()`, read back by remat-opt, is the module the passes
    see here: otherwise a cotangent with no mark is taken for a saved input."""
    return dataclasses.replace(exported, mlir_module_serialized=mlir.to_bytecode(module.op))


def export(fun, *args, platforms=None, jax_checkpoint: str = "jax",
           shardings: dict | None = None) -> Module:
    """`jax.export` of `jax.jit(fun)` at `args`, with checkpoint names kept.

    For a function that computes its own gradients (a training step): plain
    `jax.export` lowers `checkpoint_name` to nothing, so a names policy would
    find no names. Here names lower to the `@remat.name` marker the passes read
    (and `compile` drops), and the policies of `rp.checkpoint` regions are
    recorded, as `export_vjp` does. Equivalent: call `jax.export` inside
    `with rp.names_as_markers():` and load the result with `rp.from_exported`.
    `jax_checkpoint` as for `export_vjp`. `shardings`: `in_shardings` / `out_shardings`
    for the `jax.jit` exported (rp.jit's), as jax.jit takes them.
    """
    @functools.wraps(fun)
    def fresh(*a):      # a new function: JAX's caches never hand the marker lowering
        return fun(*a)  # to a later plain jit of `fun`, nor a plain one to us
    with names_as_markers(), _jax_checkpoints(jax_checkpoint), _exportable(), \
            unrolled_scans.steps_apart(regions=jax_checkpoint == "regions"):
        exported = jax_export.export(jax.jit(fresh, **(shardings or {})), platforms=platforms,
                                     disabled_checks=list(EXPORT_CHECKS))(*args)
    module = from_exported(exported)
    with module.op.context:
        _record_regions(module)
    module.exported = _with_module(exported, module)
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


def from_exported(exported) -> Module:
    """A Module from a jax.export.Exported, keeping its calling convention."""
    module = Module.parse(exported.mlir_module())
    module.exported = exported
    return module

