"""`rp.jit` of a function with no backward of its own, differentiated from outside:
`jax.grad(rp.jit(loss, policy=...))`, as `jax.grad(jax.checkpoint(loss, policy=...))`.

The function's joint VJP is exported (`rp.export_vjp`) and rewritten in split form:
`main_fwd` (the arguments -> the outputs and the residuals the policy keeps) and
`main_bwd` (the residuals and the outputs' cotangents -> the arguments' cotangents). A
`jax.custom_vjp` runs the first as its forward and the second as its backward, each a
jax.export'ed program (`Exported.call`), so the enclosing `jax.grad` (or `jax.vjp`, inside
`jax.jit` or not) gets the residuals and the recomputation our passes chose, where JAX's own
differentiation of the function would keep every activation. Called inside a `jax.jit` (or
`jax.checkpoint`) that is differentiated only later (`jax.grad(jax.jit(g))`, g calling it),
the call cannot tell: it runs the function as it is (`deferred`, what jax.jit would run),
and its derivative, where JAX takes one, is the halves'.

The halves run inside the program that differentiates the function: under `jax.jit` one XLA
program holds both, as the joint form does, but XLA sees the halves' calling convention
too. So the barrier variants built are those of the split form (on CPU the recomputation
tied to the cotangent by data and not: on jaxlib 0.10 the benchmark MLP under
`dots_saveable` needs 557,056 B of temp tied, 524,288 B untied, as jax.checkpoint; both
groupings where barriers decide), and where nothing is recomputed each also with jax.checkpoint's
`optimization_barrier` over the residuals and cotangents before the backward (XLA:CPU,
jaxlib 0.12, the benchmark conv net under `everything_saveable`: 2,195,456 B of temp with
it, as jax.checkpoint, 2,719,744 B without). The one kept is the smallest XLA footprint of
the two halves composed into one program (`jax.value_and_grad`'s shape: arguments in,
outputs and gradients out), as rp.jit keeps the smallest joint program
(`api/variants.smaller`): a proxy, since the program that runs is the caller's (an optimizer's
update around it; on the conv net under `dots_saveable`, jaxlib 0.12, the variant the proxy
ranks first needs 2,129,920 B of temp in `jax.jit(jax.grad(...))`, another 2,064,384 B, and
jax.checkpoint 2,719,744 B). A product kept that both halves read through the same transpose
(a vmapped `W @ v`) crosses in that order (fold-dot-transposes across-halves, as in rp.jit's
split form: the residuals are the custom_vjp's own; on XLA:CPU the Equinox loss of the libraries benchmark under
`dots_saveable` took 69.8 ms a step with the transposes, 39.9 ms without, eqx.filter_jit 45.2
ms). Arguments that are not floating point (integer tokens, PRNG keys)
get no cotangent (None: zero), and outputs that are not (a count in `has_aux`'s aux, an NNX
Rngs count the loss advances) take none (export_vjp's). With `cache_dir` the rewritten
modules are kept on disk, as rp.jit keeps those of a step, and so is which candidate was
kept, so that a later process compiles no candidate to choose again.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from remat_passes import jax_compat
from remat_passes.api import arguments, cache
from remat_passes.api.variants import recomputes_nothing, rounding
from remat_passes.ir.mlir import RematError
from remat_passes.jax import run as jax_run
from remat_passes.jax.bridge import export_vjp


class NoBackward(RematError):
    """rp.jit's function has no backward pass of its own (`Jitted._remat` says so): called
    alone there is nothing to rematerialize; differentiated from outside, this module
    builds it."""


def call(jitted, call_, dynamic, specs):
    """Run `jitted`'s function on `dynamic` (tracers of jax.grad, jax.vjp) through a
    custom_vjp of its rewritten split halves, built once per signature (`specs`)."""
    key = jitted._key(call_, specs)
    run = jitted._differentiated.get(key)
    if run is None:
        run = jitted._differentiated[key] = build(jitted, call_, specs)
        jitted.builds += 1
    return run(*dynamic)


def deferred(jitted, call_, dynamic, specs):
    """`jitted`'s function, with no backward of its own, called inside jax.jit (or
    jax.checkpoint) with nothing differentiating it yet: the function as it is (what
    jax.jit would run: called alone there is nothing to rematerialize), as a
    `jax.custom_vjp` whose derivative, where JAX takes one later (`jax.grad(jax.jit(g))`,
    g calling it), is that of the rewritten halves (`call`)."""
    fun = jitted._bound(call_, len(dynamic))
    leaves, tree = jax.tree_util.tree_flatten(dynamic)
    flat = arguments.LeafCalls(tree)

    @jax.custom_vjp
    def plain(*xs):
        return flat(fun, xs)

    def fwd(*xs):
        return jax.vjp(lambda *a: flat(lambda *d: call(jitted, call_, d, specs), a), *xs)

    def bwd(vjp, cotangents):
        return vjp(cotangents)
    plain.defvjp(fwd, bwd)
    return flat.unflatten(plain(*leaves))


def build(jitted, call_, specs) -> Callable:
    """The function of the dynamic arguments that runs the halves (module docstring)."""
    name = getattr(jitted.fun, "__name__", "the function")
    if jitted.in_shardings is not None or jitted.out_shardings is not None:
        raise RematError(f"error: rp.jit: {name} has in_shardings or out_shardings, which "
                         "differentiated from outside it does not take: put them on the "
                         "jax.jit around it (the halves are partitioned with the program "
                         "that calls them), or the differentiation inside, "
                         "rp.jit(jax.value_and_grad(...), in_shardings=...)")
    fun = jitted._bound(call_, len(specs))
    in_leaves = jax.tree_util.tree_leaves(specs)
    out_leaves, out_tree = jax.tree_util.tree_flatten(jax.eval_shape(fun, *specs))
    # (the outputs that take a cotangent: export_vjp's, the floating-point ones)
    inexact = [jnp.issubdtype(x.dtype, jnp.inexact) for x in out_leaves]
    module = export_vjp(fun, *specs, jax_checkpoint=jitted.jax_checkpoint)
    options = jitted.remat_options("split")
    options.pop("round_read_back", None)     # (one program: rounded as the joint form)
    options.update(rounding("joint"))
    variants = jitted._variants("split")     # (on CPU tied to the cotangent and not)
    made = []
    for m, _ in jitted._remat(module, "split", name, variants, options=options):
        # (the residuals cross between this custom_vjp's halves alone: folded across them)
        if not any(m.bytecode() == o.bytecode() for o in made):
            made.append(m)
    # (where nothing is recomputed, also with jax.checkpoint's barrier over the residuals)
    candidates = [(*_halves(m, len(in_leaves), len(inexact), sum(inexact)), fence)
                  for m in made
                  for fence in ((False, True) if recomputes_nothing(module, m) else (False,))]
    if len(candidates) > 1:
        # (with a disk cache, the choice an earlier process made among the same candidates)
        key = jitted.cache_dir and cache.choice_key([m.bytecode() for m in made], dict(
            form="differentiated", fences=[c[2] for c in candidates],
            arguments=cache.arguments_described(in_leaves)))
        kept = (cache.load_choice(jitted.cache_dir, key) or {}).get("index") if key else None
        if isinstance(kept, int) and 0 <= kept < len(candidates):
            candidates = [candidates[kept]]
        else:
            with jax_run.compiling() as start:      # (side by side)
                waiting = [start(_composed(*c, len(inexact), sum(inexact)))
                           for c in candidates]
                sizes = [jax_run.footprint(wait()) for wait in waiting]
            if None not in sizes:
                i = sizes.index(min(sizes))
                candidates = [candidates[i]]
                if key:
                    cache.store_choice(jitted.cache_dir, key, dict(index=i, footprints=sizes))
    fwd, bwd, fence = candidates[0]
    differentiable = [jnp.issubdtype(x.dtype, jnp.inexact) for x in in_leaves]
    return _custom_vjp(fwd, bwd, fence, out_tree, inexact, differentiable, name)


def _halves(module, n_in: int, n_out: int, n_ct: int) -> tuple:
    """The split module's halves as JAX functions (`Exported.call`); `n_ct` of the `n_out`
    outputs take a cotangent."""
    fwd = jax_compat.exported_for_call(module.to_exported("main_fwd"))[0]
    bwd = jax_compat.exported_for_call(module.to_exported("main_bwd"))[0]
    n_res = len(fwd.out_avals) - n_out
    if len(fwd.in_avals) != n_in or len(bwd.in_avals) != n_res + n_ct or \
            len(bwd.out_avals) != n_in:
        raise RematError("error: rp.jit: the rewritten halves do not keep the calling "
                         "convention of the function's VJP (report this as a bug)")
    return fwd, bwd


def _backward(call_bwd, fence: bool, residuals, cotangents):
    if fence:     # (as jax.checkpoint: the backward waits for them all)
        residuals, cotangents = jax.lax.optimization_barrier((tuple(residuals),
                                                              tuple(cotangents)))
    return call_bwd(*residuals, *cotangents)


def _composed(fwd, bwd, fence: bool, n_out: int, n_ct: int):
    """The halves composed into one program as `jax.value_and_grad` composes them, lowered
    to compile for XLA's footprint: the arguments in, the outputs and the gradients out,
    each cotangent ones (a loss's is 1)."""
    ct_avals = bwd.in_avals[len(bwd.in_avals) - n_ct:]

    def composed(*args):
        outs = fwd.call(*args)
        ones = [jnp.ones(a.shape, a.dtype) for a in ct_avals]
        return outs[:n_out], _backward(bwd.call, fence, outs[n_out:], ones)
    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in fwd.in_avals]
    return jax.jit(composed).lower(*specs)


def _alone(values, name: str) -> None:
    """Refuse what the halves cannot take from outside, traced by another differentiation
    (the gradient of the gradient; JAX's error came late, in the outer backward pass: "No
    VJP is available") or by jax.vmap ("Batching rule for 'call_exported' not
    implemented"): they are jax.export'ed programs, with neither rule of their own."""
    leaves = jax.tree_util.tree_leaves(values)
    if jax_compat.autodiff_mode(leaves) is not None:
        raise RematError(
            f"error: rp.jit: {name} is differentiated twice from outside (the gradient of "
            "its gradient): its rewritten halves are jax.export'ed programs, which have no "
            "derivative of their own; put the inner differentiation inside, "
            f"rp.jit(jax.grad({name})), whose gradient JAX takes")
    if jax_compat.vmap_batches(leaves):
        raise RematError(
            f"error: rp.jit: {name} is differentiated from outside under jax.vmap "
            "(per-example gradients, jax.jacrev): its rewritten halves are jax.export'ed "
            "programs, which JAX cannot batch; put both inside, "
            f"rp.jit(jax.vmap(jax.grad({name}), ...))")


def _unbatchable(call, name: str) -> Callable:
    """`call` (of a half, an `Exported.call`) with a batching rule that refuses in rp.jit's
    words, where JAX would fail with "Batching rule for 'call_exported' not implemented":
    a jax.vmap around a jax.jit that differentiates the function inside (the halves are in
    its program by then; `_alone` sees a vmap inside the jax.jit). The program is the same
    (custom_vmap inlines at lowering)."""
    refusing = jax.custom_batching.custom_vmap(call)

    @refusing.def_vmap
    def rule(axis_size, in_batched, *args):
        raise RematError(
            f"error: rp.jit: {name} runs its rewritten halves (differentiated from outside) "
            "inside a jax.jit that is vmapped in turn: they are jax.export'ed programs, "
            "which JAX cannot batch; put the vmap inside the rp.jit function: "
            f"rp.jit(jax.vmap(jax.grad({name}), ...)) for per-example gradients, "
            f"jax.grad(rp.jit(jax.vmap({name}, ...))) for the gradient of a batched loss")
    return refusing


def _custom_vjp(fwd, bwd, fence: bool, out_tree, inexact: list, differentiable: list,
                name: str) -> Callable:
    n_out = out_tree.num_leaves
    call_fwd, call_bwd = _unbatchable(fwd.call, name), _unbatchable(bwd.call, name)

    @jax.custom_vjp
    def flat(*xs):
        return tuple(call_fwd(*map(arguments.key_data, xs)))[:n_out]

    def flat_fwd(*xs):
        _alone(xs, name)
        outs = tuple(call_fwd(*map(arguments.key_data, xs)))
        return outs[:n_out], outs[n_out:]

    def flat_bwd(residuals, cotangents):
        _alone((residuals, cotangents), name)
        cotangents = [ct for ct, d in zip(cotangents, inexact) if d]   # (float0 the others)
        grads = _backward(call_bwd, fence, residuals, cotangents)
        return tuple(g if d else None for g, d in zip(grads, differentiable))
    flat.defvjp(flat_fwd, flat_bwd)

    def run(*dynamic):
        outs = flat(*jax.tree_util.tree_leaves(dynamic))
        return jax.tree_util.tree_unflatten(out_tree, list(outs))
    return run
