"""`rp.jit` called under a JAX transformation: what it builds there, or why it refuses.

* Inside `jax.jit` (or `lax.scan`, `jax.grad`, ...): the joint form's rewritten program,
  built for the tracers' shapes and dtypes, becomes part of the program being traced
  (`Exported.call`, `call_traced`); the split form runs two executables and says it cannot.
* Under `jax.vmap`, the innermost transformation of the call (`call_batched`): rp.jit of
  the function vmapped the same way, a Jitted of its own per way of batching with the same
  options (the vmap's axis name too, for collectives inside), through
  `jax.custom_batching.custom_vmap`, in either form; its results all batched, as
  `out_axes=0`. Only there: custom_vmap has no reverse-mode rule, so under `jax.grad` the
  call keeps `Exported.call`. A call inside a `jax.jit` that is vmapped later
  (`jax.vmap(jax.jit(g))`, g calling the rp.jit function) is batched by the same rule
  (`batchable`); a derivative of that vmap refuses, in rp.jit's words (the derivative is
  jax.export's, which JAX cannot batch).
* Inside `jax.shard_map` (or `jax.pmap`), the function would be exported alone, without the
  shard_map's axis names and its types (which values vary over the manual axes): where an
  argument varies, `check_manual` refuses. JAX sums the gradient of an argument replicated
  where another is sharded over the devices, an exported step does not (on two devices its
  gradients were half of jax.jit's); and the exported call's results are typed as
  replicated, so a varying result under `out_specs=P()` would pass where JAX refuses it.
  jax.pmap types nothing as varying: a step without collectives runs there, and one with a
  collective over the axis cannot be exported alone and says so. The form that works is
  `rp.jit(jax.shard_map(step, ...))`, the backward inside the shard_map's body
  (`regions.loop_backward`).
* Differentiated from outside (`jax.grad` of a function that calls it): a function with a
  backward of its own (a gradient step) is differentiated through the rewritten program
  (`Exported.call` has a VJP: a gradient of the gradient); one without is rewritten as
  `api/differentiated` builds it (`jax.grad(rp.jit(loss))`, in any form), also where a
  jax.jit or jax.checkpoint between them traces the call first (`differentiated.deferred`:
  inside jax.jit, one without a backward that nothing differentiates runs as it is). Forward mode
  (`jax.jvp`, `jax.jacfwd`, `jax.hessian`) JAX refuses for an exported call (inside
  jax.jit only when it lowers): refused at the call, in rp.jit's words.
* A function that closes over a value traced by an enclosing transformation (an argument
  of the `jax.jit` around the call) cannot be exported alone: said so, where jax.export's
  own error was "Too many leaves for PyTreeDef".
"""
from __future__ import annotations

import jax

from remat_passes import jax_compat
from remat_passes.api import arguments, differentiated
from remat_passes.ir.mlir import RematError


def _name(jitted) -> str:
    return getattr(jitted.fun, "__name__", "the function")


def _manual_axes() -> str:
    """The manual mesh axes of the shard_map (or pmap) the call is traced in, as an error
    names them; empty outside one."""
    return ", ".join(map(repr, jax.sharding.get_abstract_mesh().manual_axes))


def check_manual(jitted, leaves) -> None:
    """Refuse a call inside jax.shard_map on arguments that vary over its manual axes
    (module docstring)."""
    manual = _manual_axes()
    if not manual or not any(jax_compat.varying_axes(x) for x in leaves):
        return
    raise RematError(
        f"error: rp.jit: {_name(jitted)} is called inside jax.shard_map (manual mesh axes "
        f"{manual}) with arguments that vary over them: exported alone "
        "it would lose shard_map's types (JAX sums the gradient of an argument replicated "
        "where another is sharded, and checks out_specs against what varies; a step "
        "exported alone does neither), so its gradients could differ; put the shard_map "
        "inside, rp.jit(jax.shard_map(step, ...))")


def call_traced(jitted, call, dynamic, mode: str):
    """Called under a JAX transformation (inside jax.jit): the rewritten program becomes
    part of the program being traced (`Exported.call`), built for the tracers' shapes and
    dtypes. Differentiated from outside, a function with no backward of its own runs as
    `api/differentiated` builds it."""
    leaves, tree = jax.tree_util.tree_flatten(dynamic)
    differentiated_by = jax_compat.autodiff_mode(leaves)
    if differentiated_by == "forward":
        raise _forward_mode(jitted)
    if mode == "split" and differentiated_by is None:
        raise _split_traced(jitted)
    placed = ([None] * len(leaves) if jitted.in_shardings is None else
              arguments.shardings_of(jitted.in_shardings, "in_shardings", dynamic))
    specs = jax.tree_util.tree_unflatten(tree, [jax.ShapeDtypeStruct(
        x.shape, x.dtype, weak_type=getattr(x.aval, "weak_type", False), sharding=s)
        if isinstance(x, jax.core.Tracer) else x for x, s in zip(leaves, placed)])
    if jitted._key(call, specs) in jitted._differentiated:
        run = differentiated.call if differentiated_by else differentiated.deferred
        return run(jitted, call, dynamic, specs)
    try:
        lowered = jitted._lowered(call, specs)
        if mode == "split":      # (differentiated from outside, with a backward of its own)
            raise _split_traced(jitted)
        if differentiated_by is None:     # (inside jax.jit: batchable should it be vmapped)
            return batchable(jitted, call, dynamic, lowered.traced)
        return lowered.traced(*dynamic)
    except differentiated.NoBackward:
        if differentiated_by is None:     # (inside jax.jit: maybe differentiated later)
            return differentiated.deferred(jitted, call, dynamic, specs)
        return differentiated.call(jitted, call, dynamic, specs)
    except TypeError as e:   # (forward mode further out: jax.hessian's jacfwd of a jacrev)
        if "forward-mode" not in str(e):
            raise
        raise _forward_mode(jitted) from None
    except AssertionError:
        manual = _manual_axes()
        if not manual:
            raise
        raise RematError(    # (JAX's export of a collective over an axis it lacks)
            f"error: rp.jit: {_name(jitted)} cannot be exported alone inside jax.shard_map "
            f"or jax.pmap (manual mesh axes {manual}): a collective "
            "over those axes inside it (lax.psum, pmean, all_gather) has none to run over "
            "once exported; put the shard_map inside, rp.jit(jax.shard_map(step, ...))") \
            from None
    except ValueError:
        if not _closes_over_tracers(jitted, call, specs):
            raise
        raise RematError(
            f"error: rp.jit: {_name(jitted)} closes over a value traced by an enclosing "
            "transformation (an argument of the jax.jit around the call, or a value computed "
            "from one), which jax.export cannot carry into the exported program: pass it to "
            "the rp.jit function as an argument") from None
    except NotImplementedError as e:     # (jax.vmap: no batching rule for an Exported)
        if "call_exported" not in str(e):
            raise
        raise RematError(
            f"error: rp.jit: {_name(jitted)} cannot be batched here: jax.vmap of a function "
            "that calls it inside jax.jit (or another transformation) batches jax.export's "
            "call, which JAX cannot do; vmap the rp.jit function itself, or put the vmap "
            "inside, rp.jit(jax.vmap(f, ...))") from None


def _not_batched(jitted, values) -> None:
    """Refuse to differentiate the call where JAX batches the derivative (a gradient of a
    jax.vmap of the jax.jit around it): the derivative is jax.export's call's VJP, which JAX
    cannot batch."""
    if jax_compat.vmap_batches(jax.tree_util.tree_leaves(values)):
        raise RematError(
            f"error: rp.jit: {_name(jitted)} is differentiated from outside a jax.vmap of "
            "the jax.jit that calls it: the derivative of its rewritten program is "
            "jax.export's, which JAX cannot batch; vmap the rp.jit function itself (jax.jit "
            "inside the vmap), or put the vmap inside, rp.jit(jax.vmap(f, ...))")


def _split_traced(jitted) -> RematError:
    return RematError(
        f"error: rp.jit: {_name(jitted)} in split form runs two executables and cannot "
        "be called inside jax.jit or another JAX transformation: call it outside, or use "
        "mode='joint' (then the rewritten program becomes part of the enclosing one)")


def _forward_mode(jitted) -> RematError:
    return RematError(
        f"error: rp.jit: {_name(jitted)} is differentiated in forward mode (jax.jvp, "
        "jax.jacfwd or jax.hessian of a function that calls it): its rewritten program is "
        "called as a jax.export'ed function, which JAX differentiates in reverse mode only "
        "(jax.grad, jax.vjp, jax.jacrev); use reverse mode, or put the jvp inside the "
        "rp.jit function")


def _closes_over_tracers(jitted, call, specs) -> bool:
    """Does the function read a tracer of an enclosing trace (a constant of its jaxpr)?"""
    fun = jitted._bound(call, len(specs))
    try:
        consts = jax.make_jaxpr(fun)(*specs).consts
    except Exception:              # (the diagnosis of another failure: leave that one)
        return False
    return any(isinstance(c, jax.core.Tracer) for c in consts)


def _check_batchable(jitted) -> None:
    if jitted.in_shardings is not None or jitted.out_shardings is not None:
        raise RematError(f"error: rp.jit: {_name(jitted)} has in_shardings or out_shardings, "
                         "which do not say how to shard the batch axis of jax.vmap: put the "
                         "vmap inside, rp.jit(jax.vmap(f, ...), in_shardings=...)")


def _run_batched(jitted, call, in_batched, args, axis: dict):
    """A custom_vmap rule's answer: rp.jit of the function vmapped as `in_batched` says (a
    pytree of bools like `args`), a Jitted of its own per way of batching with `jitted`'s
    options, run on `args`; its results all batched."""
    fun = jitted._bound(call, len(args))
    in_axes = tuple(jax.tree_util.tree_map(lambda b: 0 if b else None, in_batched))
    flags, tree = jax.tree_util.tree_flatten(in_batched)
    key = (call, tree, tuple(flags), tuple(sorted(axis.items(), key=str)))
    inner = jitted._batched.get(key)
    if inner is None:
        donated = arguments.donated_positions(jitted, call, len(args) - len(call.kw_names))
        inner = jitted._batched[key] = jitted.like(
            jax.vmap(fun, in_axes=in_axes, **axis), donated)
    out = inner(*args)
    return out, jax.tree_util.tree_map(lambda _: True, out)


def call_batched(jitted, call, dynamic):
    """Called under jax.vmap (module docstring)."""
    _check_batchable(jitted)
    axis = jax_compat.vmap_axis()     # (its name, for collectives inside the function)
    batched = jax.custom_batching.custom_vmap(jitted._bound(call, len(dynamic)))

    @batched.def_vmap
    def rule(axis_size, in_batched, *args):
        del axis_size
        return _run_batched(jitted, call, in_batched, args, axis)
    return batched(*dynamic)


def batchable(jitted, call, dynamic, run):
    """`run(*dynamic)` (the rewritten program's `Exported.call`, traced inside jax.jit with
    nothing differentiating it yet), in a form JAX can batch should it vmap that jax.jit
    later (`jax.vmap(jax.jit(g))`, where g calls the rp.jit function): jax.export's call
    has no batching rule, so a `custom_vmap` runs `_run_batched` there, as `call_batched`
    does (without the vmap's axis name, which the rule is not told: a collective over it
    inside the function cannot be exported alone in any case). custom_vmap has no
    reverse-mode rule, so a `custom_vjp` around it differentiates `run` as JAX would
    (`Exported.call`'s own VJP: the gradient of the gradient). The program is the same:
    both inline at lowering."""
    leaves, tree = jax.tree_util.tree_flatten(dynamic)
    flat = arguments.LeafCalls(tree)

    def flat_run(*xs):
        return flat(run, xs)

    batched = jax.custom_batching.custom_vmap(flat_run)

    @batched.def_vmap
    def rule(axis_size, in_batched, *xs):
        del axis_size
        _check_batchable(jitted)
        out, _ = _run_batched(jitted, call, jax.tree_util.tree_unflatten(tree, in_batched),
                              jax.tree_util.tree_unflatten(tree, xs), {})
        out = jax.tree_util.tree_leaves(out)
        return out, [True] * len(out)

    @jax.custom_vjp
    def differentiable(*xs):
        return batched(*xs)

    def fwd(*xs):     # (as Exported.call's own VJP: the arguments are the residuals)
        return batched(*xs), xs

    def bwd(xs, cotangents):
        _not_batched(jitted, (xs, cotangents))
        return jax.vjp(flat_run, *xs)[1](cotangents)
    differentiable.defvjp(fwd, bwd)
    return flat.unflatten(differentiable(*leaves))
