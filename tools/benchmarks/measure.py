"""The comparison with hand-written `jax.checkpoint`: measure every (model, policy) case.

For every case, side by side in one run:

* residual bytes of our split form vs. what JAX's own `saved_residuals` reports
  for the hand-written `jax.checkpoint(model, policy=...)` (entries 'from a
  literal' dropped);
* extra FLOPs of recomputation: the compiled forward + backward of each split
  form (ours: `<f>_fwd` / `<f>_bwd`; JAX: `jax.vjp` of the checkpointed model,
  forward and backward jitted separately) over JAX's no-remat split, by XLA's
  cost analysis, or by `remat_passes.flops` (loop bodies times their trip
  count) for the scanned models;
* the static joint-peak estimate of our joint form and of JAX's own joint program;
* pass time, JAX's trace+lower time, export time; gradient error vs `jax.grad`.

XLA:CPU undoes recomputation inside one joint program (DESIGN.md section 5),
hence the split forms for FLOPs and bytes. Results: `results/models.json`.
"""
from __future__ import annotations

import functools
import math
import re
import time

import jax
import jax.numpy as jnp
import numpy as np

import remat_passes as rp
from remat_passes.cost import flops
from remat_passes.cost.memory import estimate_memory
from remat_passes.ir import graph
from remat_passes.ir.mlir import ir
from remat_passes.jax_compat import jax_saved_residuals
from tools.benchmarks import common
from tools.benchmarks.cases import Case, cases_for, jax_function
from tools.benchmarks.models import MODELS, Model, _identity


def best_time(fn, repeat):
    best, result = math.inf, None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t)
    return best, result


def xla_cost(compiled) -> float:
    """flops + transcendentals from XLA's cost analysis of a compiled executable (or of a
    lowered program, before XLA's optimizer)."""
    ca = compiled.cost_analysis()
    if isinstance(ca, (list, tuple)):
        ca = ca[0] if ca else {}
    ca = ca or {}
    return float(ca.get("flops", 0.0)) + float(ca.get("transcendentals", 0.0))


def short_type(aval) -> str:
    """'f32[16,64]' as our residuals print types (memory space left out)."""
    return re.sub(r"<[^>]*>", "", aval.str_short(short_dtypes=True))


def aval_bytes(aval) -> int:
    return int(np.prod(aval.shape, dtype=np.int64)) * np.dtype(aval.dtype).itemsize


def is_host(aval) -> bool:
    return "host" in str(getattr(aval, "memory_space", "")).lower()


def float_leaves(tree):
    return [x for x in jax.tree_util.tree_leaves(tree)
            if jnp.issubdtype(x.dtype, jnp.inexact)]


def jax_split(fun, args, scanned=False):
    """JAX's split form: forward -> (out, VJP leaves), backward(VJP leaves, ct); compiled.
    Cost: XLA's cost analysis, or `remat_passes.flops` of the lowered StableHLO when
    `scanned` (XLA counts a loop body once)."""
    store = {}

    def fwd(*a):
        out, vjp_fn = jax.vjp(fun, *a)
        leaves, store["tree"] = jax.tree_util.tree_flatten(vjp_fn)
        return out, leaves

    fwd_l = jax.jit(fwd).lower(*args)
    fwd_c = fwd_l.compile()
    out, leaves = fwd_c(*args)
    ct = jnp.ones_like(out)

    def bwd(leaves, ct):
        grads = jax.tree_util.tree_unflatten(store["tree"], leaves)(ct)
        return [g for g in jax.tree_util.tree_leaves(grads)
                if g.dtype != jax.dtypes.float0]

    bwd_l = jax.jit(bwd).lower(leaves, ct)
    bwd_c = bwd_l.compile()
    grads = bwd_c(leaves, ct)
    if scanned:
        return sum(flops.function_flops(rp.Module.parse(lo.as_text())) for lo in (fwd_l, bwd_l)), \
            grads
    return xla_cost(fwd_c) + xla_cost(bwd_c), grads


def max_err(grads, ref) -> float:
    grads, ref = float_leaves(grads), float_leaves(ref)
    if len(grads) != len(ref):
        raise RuntimeError(f"{len(grads)} gradients vs {len(ref)} from jax.grad")
    # in NumPy: eager jnp ops would compile one XLA program per op and shape
    return max(float(np.max(np.abs(np.asarray(g, np.float32) - np.asarray(r, np.float32))))
               for g, r in zip(grads, ref))


def rounding_stats(split) -> list[int]:
    """reduce_precision ops in <f>_fwd (what insert-reduce-precision added): count and bytes,
    and the same for those applied to function arguments."""
    n = b = n_arg = b_arg = 0
    with split.op.context:
        for op in graph.body_block(graph.find_func(split.op, "main_fwd")).operations:
            if op.operation.name != "stablehlo.reduce_precision":
                continue
            nbytes = graph.type_bytes(op.results[0].type)
            n, b = n + 1, b + nbytes
            if isinstance(op.operands[0], ir.BlockArgument):
                n_arg, b_arg = n_arg + 1, b_arg + nbytes
    return [n, b, n_arg, b_arg]


def run_split_form(model: Model, split, ref_grads, planned=None) -> tuple[float, float]:
    """(cost, max abs gradient error) of a split module: its forward and backward compiled
    with XLA and run on the model's inputs. Cost: XLA's cost analysis of the two
    executables, or `remat_passes.flops` for the scanned models (XLA counts a loop body
    once). `planned` (a dict), if given, gets "cost": XLA's cost analysis of the two
    programs as handed to XLA, before its optimizer (which folds constants and duplicates
    cheap producers into fusions); `remat_passes.flops` equals it on loop-free programs."""
    args = model.args
    fwd_l = rp.compile(split, "main_fwd").lower(*args)
    fwd_c = fwd_l.compile()
    res = fwd_c(*args)
    ct = jnp.ones_like(res[0])
    bwd_l = rp.compile(split, "main_bwd").lower(*res[1:], ct)
    bwd_c = bwd_l.compile()
    grads = bwd_c(*res[1:], ct)
    ours = flops.function_flops(split, "main_fwd") + flops.function_flops(split, "main_bwd")
    cost = ours if model.scanned else xla_cost(fwd_c) + xla_cost(bwd_c)
    if planned is not None:
        planned["cost"] = ours if model.scanned else xla_cost(fwd_l) + xla_cost(bwd_l)
    return cost, max_err(grads, ref_grads)


def run_joint_form(model: Model, joint, ref_grads) -> float:
    """Max abs gradient error of a joint module (compiled with XLA) on the model's inputs."""
    args = model.args
    ct = jnp.ones((), jnp.float32)
    out = jax.tree_util.tree_leaves(rp.compile(joint, "main")(*args, ct))
    return max_err(out[1:], ref_grads)


def measure_case(model: Model, case: Case, modules: dict, ref_grads, repeat: int,
                 base_split=None) -> dict:
    """One model x policy pair. `base_split`: `jax_split` of the model without remat, reused
    as JAX's side of `none (no remat)` (the same program)."""
    row = {"model": model.key, "label": case.label, "short": case.short, "kind": case.kind,
           "ours_dev": 0, "ours_host": 0, "jax_dev": 0, "jax_host": 0, "jax_literals": 0,
           "ours_res": [], "jax_res": []}
    args = model.args
    # ---------------------------------------------------------------- ours --
    module = modules["layers" if case.kind == "layers" else "plain"]
    pol = case.our_policy
    row["pass_s"], split = best_time(lambda: rp.remat(module, pol, mode="split"), repeat)
    row["pass_joint_s"], joint = best_time(lambda: rp.remat(module, pol, mode="joint"), repeat)
    for r in split.residuals:
        host = r.offload is not None and "host" in str(r.offload.dst)
        row["ours_host" if host else "ours_dev"] += r.bytes
        row["ours_res"].append([r.type, r.description + (" [host]" if host else "")])
    row["ours_n"] = len(split.residuals)
    row["rounded"] = rounding_stats(split)
    row["ours_cost"], row["grad_err"] = run_split_form(model, split, ref_grads)
    row["ours_peak"] = int(estimate_memory(joint).peak_bytes)
    # ----------------------------------------------------------------- JAX --
    for aval, desc in jax_saved_residuals(jax_function(model, case), *args):
        if desc == "from a literal":
            row["jax_literals"] += 1
            continue
        row["jax_host" if is_host(aval) else "jax_dev"] += aval_bytes(aval)
        row["jax_res"].append([short_type(aval), desc + (" [host]" if is_host(aval) else "")])
    row["jax_n"] = len(row["jax_res"])
    if case.kind == "plain" and base_split is not None:
        row["jax_cost"], jgrads = base_split
    else:
        row["jax_cost"], jgrads = jax_split(jax_function(model, case), args, model.scanned)
    row["jax_grad_err"] = max_err(jgrads, ref_grads)
    vg = functools.partial(jax.value_and_grad, argnums=(0, 1), allow_int=True)
    row["jax_lower_s"], lowered = best_time(
        lambda: jax.jit(vg(jax_function(model, case))).lower(*args), repeat)
    row["jax_peak"] = int(estimate_memory(rp.Module.parse(lowered.as_text())).peak_bytes)
    return row


def measure(keys=tuple(MODELS), repeat=3, progress=None) -> dict:
    rows, meta = [], {}
    models = [MODELS[k]() for k in keys]
    for model in models:
        args = model.args
        if progress:
            progress(f"{model.key}: export + reference")
        # jitted: run eagerly, jax.grad compiles every primitive on its own (~5 s a model)
        ref = jax.jit(jax.grad(model.build(_identity), argnums=(0, 1), allow_int=True))(*args)
        t_plain, plain = best_time(lambda: rp.export_vjp(model.build(_identity), *args), repeat)
        base = jax_split(model.build(_identity), args, model.scanned)
        t_layers, layers = best_time(
            lambda: rp.export_vjp(model.build(rp.checkpoint), *args), repeat)
        leaves = jax.tree_util.tree_leaves(args)
        meta[model.key] = dict(
            title=model.title, description=model.description, scanned=model.scanned,
            export_s=t_plain, export_layers_s=t_layers, base_cost=base[0],
            n_ops=common.count_ops(plain),
            n_params=int(sum(x.size for x in leaves[:len(jax.tree_util.tree_leaves(args[0]))])))
        modules = {"plain": plain, "layers": layers}
        for case in cases_for(model):
            if progress:
                progress(f"{model.key}: {case.short}")
            try:
                rows.append(measure_case(model, case, modules, ref, repeat, base))
            except Exception as e:  # keep going; the report shows the failure
                rows.append({"model": model.key, "label": case.label, "short": case.short,
                             "kind": case.kind, "error": f"{type(e).__name__}: {e}"})
    return {"machine": common.machine(), "repeat": repeat, "models": meta, "rows": rows}
