"""How `rp.jit` runs its split form: the rewritten module's `<f>_fwd` and `<f>_bwd` compiled as
two executables (`build`), run one after the other by the Lowered's `run`.

The forward takes the function's arguments (those the export kept; a typed PRNG key as its
data) and returns the outputs it computes and the residuals; a residual that is an argument
passes through without leaving the forward (`split.drop_passthrough`). The backward takes
the residuals, donated where their buffers can serve its outputs, and returns the gradients
and the outputs it computes. Each of the function's outputs is put back in its place (by
its `jax.result_info`), so the caller gets the function's own pytree. A donated argument goes
to its last reader, and is deleted after the call, as jax.jit deletes it. On several devices
the backward takes the residuals sharded as the forward's executable returns them.
"""
from __future__ import annotations

from typing import Callable

import jax

from remat_passes import jax_compat
from remat_passes.api import arguments
from remat_passes.api.lowered import Lowered
from remat_passes.core import split
from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import RematError
from remat_passes.jax import run as jax_run


def _result_info(func_op) -> list:
    """Per result of a function: (its `jax.result_info` as text, or None; is it a residual)."""
    return [(str(e["jax.result_info"]) if "jax.result_info" in e else None,
             contract.RESIDUAL in e)
            for e in contract.all_entries(func_op, "res_attrs")]


def build(jitted, exported, module, dynamic, donated, start) -> Callable[[], Lowered]:
    """Lower `module`'s halves for `jitted` (its out_shardings, compiler options) on the
    dynamic arguments, start XLA's compilation of each (`start`) and give back a function
    that waits for them and makes the Lowered, whose `run` calls them in turn."""
    ex = exported.exported
    with module.op.context:
        fwd_f = graph.find_func(module.op, "main_fwd")
        bwd_f = graph.find_func(module.op, "main_bwd")
        before = [info for info, _ in _result_info(graph.find_func(exported.op, "main"))]
        fwd_info = _result_info(fwd_f)
        bwd_info = [info for info, _ in _result_info(bwd_f)]
        n_bwd_args = len(bwd_f.type.inputs)
    fwd_out = [info for info, residual in fwd_info if not residual]
    n_res = len(fwd_info) - len(fwd_out)
    if n_bwd_args != n_res:
        raise RematError(
            "error: rp.jit takes a function that computes its own gradients (a training "
            "step with jax.grad inside); this one's backward takes cotangents as "
            "arguments: differentiate it inside the function, or use rp.export_vjp")
    place = _placement(before, fwd_out, bwd_info)
    passthrough = split.drop_passthrough(module.op, len(fwd_out))   # {residual: fwd argument}
    made = [r for r in range(n_res) if r not in passthrough]  # residuals fwd returns
    kept = ex.module_kept_var_idx
    leaves, _ = jax.tree_util.tree_flatten(dynamic)
    donated_leaves = set()
    for pos in donated:
        first = len(jax.tree_util.tree_leaves(dynamic[:pos]))
        count = len(jax.tree_util.tree_leaves(dynamic[pos]))
        donated_leaves.update(range(first, first + count))
    # a donated argument goes to its last reader: the backward if it reads it; to the
    # forward where one of its outputs can take the buffer
    fwd_exp = module.to_exported("main_fwd")
    bwd_exp = module.to_exported("main_bwd")
    to_bwd = set(passthrough.values())
    fwd_donatable = [j for j, i in enumerate(kept) if i in donated_leaves and j not in to_bwd]
    fwd_in_kinds = jax_run.memory_kinds(module, "main_fwd", "arg_attrs")
    fwd_donated = tuple(fwd_donatable[k] for k in jax_run.usable_donations(
        [fwd_exp.in_avals[j] for j in fwd_donatable], fwd_exp.out_avals,
        [fwd_in_kinds[j] for j in fwd_donatable],
        jax_run.memory_kinds(module, "main_fwd", "res_attrs")))
    device = _one_device(leaves)
    fwd_kw = jax_run.memory_kind_shardings(module, "main_fwd", device)
    bwd_kw = {}
    if jitted.out_shardings is not None:   # each half returns its outputs so sharded
        asked = arguments.shardings_of(jitted.out_shardings, "out_shardings",
                                       jax.tree.unflatten(ex.out_tree,
                                                          [0] * ex.out_tree.num_leaves))
        fwd_kw, bwd_kw = (_with_out_shardings(
            kw, len(e.out_avals), {j: asked[k] for k, (h, j) in enumerate(place) if h == half})
            for half, kw, e in ((0, fwd_kw, fwd_exp), (1, bwd_kw, bwd_exp)))
    fwd_compiling = start(jax.jit(fwd_exp.call, donate_argnums=fwd_donated, **fwd_kw,
                                  **jitted._jit_kw).lower(
        *[arguments.key_data(leaves[i]) for i in kept]))
    in_kinds = jax_run.memory_kinds(module, "main_bwd", "arg_attrs")
    in_shardings = jax_run.placed_shardings(in_kinds, device) or [None] * len(in_kinds)
    if device is None:    # on several devices: the residuals as the forward hands them,
        # the arguments as the forward took them (one on no device, a Python number, or
        # placed by jax.jit where it went: the forward's program says where)
        made_sh = dict(zip(made, jax.tree.leaves(
            fwd_compiling().output_shardings)[len(fwd_out):]))
        took = jax.tree.leaves(fwd_compiling().input_shardings[0])
        in_shardings = [took[passthrough[r]] if r in passthrough
                        else made_sh[r] for r in range(n_res)]
    res_avals = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh)
                 for a, sh in zip(bwd_exp.in_avals, in_shardings)]
    # the residuals fwd made are ours, and so are donated arguments: the backward may
    # reuse their buffers for its outputs
    ours, seen = [], set()
    for r in range(n_res):
        if r in passthrough:
            if kept[passthrough[r]] not in donated_leaves or passthrough[r] in seen:
                continue
            seen.add(passthrough[r])
        ours.append(r)
    reusable = jax_run.usable_donations(
        [res_avals[r] for r in ours], bwd_exp.out_avals, [in_kinds[r] for r in ours],
        jax_run.memory_kinds(module, "main_bwd", "res_attrs"))
    bwd_jit = jax.jit(bwd_exp.call, donate_argnums=tuple(ours[k] for k in reusable),
                      **bwd_kw, **jitted._jit_kw)
    bwd_compiling = start(bwd_jit.lower(*res_avals))
    # (jaxlib 0.10 refuses a 4-bit residual the forward returns in a call of the
    # compiled backward: there the backward runs through jax.jit, which takes it)
    calls_compiled_bwd = jax_compat.aot_takes_sub_byte_results() or all(
        jax.dtypes.itemsize_bits(res_avals[r].dtype) >= 8 for r in made)
    n_fwd_out, out_tree = len(fwd_out), ex.out_tree
    # the halves take and give a typed PRNG key as its data: wrap the keys returned
    out_keys = {k: impl for k, a in enumerate(ex.out_avals)
                if (impl := jax_compat.key_impl(a.dtype)) is not None}
    n_flat_in = len(leaves)
    # (which of the forward's arguments are typed keys: fixed by the signature)
    keys_in = [j for j, i in enumerate(kept) if arguments.key_data(leaves[i]) is not leaves[i]]
    donated_flat = sorted(donated_leaves)

    def finish():
        fwd, bwd = fwd_compiling(), bwd_compiling()
        call_bwd = bwd if calls_compiled_bwd else bwd_jit

        def run(*dyn):
            flat = jax.tree_util.tree_leaves(dyn)
            if len(flat) != n_flat_in:
                raise TypeError("rp.jit: arguments do not match the signature built for")
            kept_args = [flat[i] for i in kept]
            for j in keys_in:
                kept_args[j] = jax.random.key_data(kept_args[j])
            outs = fwd(*kept_args)
            outs = outs if isinstance(outs, (tuple, list)) else (outs,)
            residuals = [None] * n_res
            for r, a in passthrough.items():
                residuals[r] = kept_args[a]
            for r, value in zip(made, outs[n_fwd_out:]):
                residuals[r] = value
            grads = call_bwd(*residuals)
            grads = grads if isinstance(grads, (tuple, list)) else (grads,)
            results = [None] * len(place)
            for k, (half, j) in enumerate(place):
                results[k] = outs[j] if half == 0 else grads[j]
                if k in out_keys:
                    results[k] = jax.random.wrap_key_data(results[k], impl=out_keys[k])
            for i in donated_flat:     # as jax.jit: a donated input is gone after the call
                if isinstance(flat[i], jax.Array) and not flat[i].is_deleted():
                    flat[i].delete()
            return jax.tree_util.tree_unflatten(out_tree, results)
        return Lowered("split", exported, module, (fwd, bwd), run)
    return finish


def _with_out_shardings(kw: dict, n: int, asked: dict) -> dict:
    """`jax.jit` keyword arguments `kw` of a split half with `n` results, with the results
    in `asked` ({index: sharding}) returned so sharded; `out_shardings` in the shape
    `to_exported` gives the results (one bare, several a tuple)."""
    if all(s is None for s in asked.values()):
        return kw
    have = kw.get("out_shardings")
    sh = [have] if n == 1 else list(have) if have is not None else [None] * n
    for j, s in asked.items():
        sh[j] = s
    return dict(kw, out_shardings=sh[0] if n == 1 else tuple(sh))


def _one_device(leaves):
    """The device of a program whose arguments are on one device (None: several). Arrays
    and `jax.ShapeDtypeStruct`s with a sharding say where they are."""
    devices = {d for x in leaves if isinstance(x, (jax.Array, jax.ShapeDtypeStruct))
               and getattr(x, "sharding", None) is not None for d in x.sharding.device_set}
    return next(iter(devices)) if len(devices) == 1 else (
        jax.devices()[0] if not devices else None)


def _placement(before: list, fwd_out: list, bwd_out: list) -> list:
    """For each result of the exported function (by its `jax.result_info`), (0, j): the
    j-th result of `<f>_fwd`, or (1, j): of `<f>_bwd`."""
    where: dict = {}
    for half, infos in ((0, fwd_out), (1, bwd_out)):
        for j, info in enumerate(infos):
            if info is None or info in where:
                raise RematError("error: rp.jit: cannot tell which half computes which "
                                 "output (results without distinct jax.result_info)")
            where[info] = (half, j)
    if set(where) != set(before) or len(before) != len(where):
        raise RematError("error: rp.jit: the split halves' outputs are not the function's")
    return [where[info] for info in before]
