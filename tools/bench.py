#!/usr/bin/env python
"""Benchmark: remat_passes policies vs. writing `jax.checkpoint` by hand.

Not a test. For every model x policy it measures, side by side in one run:

* residual bytes of our split form (`sum(r.bytes for r in remat(...).residuals)`)
  vs. what JAX's own `saved_residuals` reports for the hand-written
  `jax.checkpoint(model, policy=...)` (entries 'from a literal' dropped);
* extra FLOPs of recomputation: XLA cost analysis (flops + transcendentals) of
  the compiled forward + backward of the split forms (ours: `<f>_fwd` /
  `<f>_bwd`; JAX: `jax.vjp` of the checkpointed model, forward and backward
  jitted separately, residuals = leaves of the VJP function), as % over JAX's
  no-remat split (plain `jax.vjp`, forward and backward jitted separately);
* the static peak-live estimate (`remat_passes.memory.estimate_memory`) of our
  joint form, and of JAX's own joint program
  (`jax.jit(jax.value_and_grad(jax.checkpoint(model, policy)))`) for reference;
* pass time (`remat_passes.remat`), JAX's trace+lower time, our export time;
* max abs gradient error of our split forward+backward vs. `jax.grad`.

XLA:CPU undoes recomputation inside one joint program (DESIGN.md section 5),
hence the split forms for FLOPs and bytes.

    python tools/bench.py                  # writes docs/benchmarks.md, docs/img/residuals_vs_flops.png
    python tools/bench.py --models gpt --no-scaling --md /tmp/b.md --png /tmp/b.png
    python tools/bench.py --scaling-100k   # also re-time the 100k-op module (~2 min more)

The hand-written analysis between `<!-- analysis:begin -->` and `<!-- analysis:end -->`
in the Markdown file, and the 100k-op section, are kept when the page is regenerated.

Dependencies beyond the project: `pip install -e ".[bench]"` (equinox, matplotlib).
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import functools
import math
import os
import platform
import re
import subprocess
import sys
import time
from typing import Any, Callable

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from remat_passes.jax_compat import jax_saved_residuals  # noqa: E402
from jax.ad_checkpoint import checkpoint_name  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,  # noqa: E402
                           TimeElapsedColumn)

import remat_passes as rp  # noqa: E402

try:  # written by another helper; optional
    from remat_passes.memory import estimate_memory  # noqa: E402
except ImportError:  # pragma: no cover
    estimate_memory = None

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MD = os.path.join(ROOT, "docs", "benchmarks.md")
DEFAULT_PNG = os.path.join(ROOT, "docs", "img", "residuals_vs_flops.png")
FLOPS_TOLERANCE_PP = 1.0   # target: our extra FLOPs <= JAX's + 1 percentage point
console = Console(stderr=True)


# ================================================================== models ==
@dataclasses.dataclass
class Model:
    key: str
    title: str
    description: str
    build: Callable          # build(layer_wrap) -> loss(params, batch); fresh closure per call
    args: tuple              # (params, batch)
    names: dict              # policy arguments (checkpoint names) for this model
    jax_layer_wrap: Callable = jax.checkpoint   # what "per-layer regions" uses on the JAX side
    # Scan over layers: build(wrap, outer) wraps the scanned layer function with `wrap` and
    # each piece of the model outside the loop with `outer` (identity by default); the JAX
    # side of a policy is `lax.scan(jax.checkpoint(layer, policy=...))` with every outside
    # piece in `jax.checkpoint(piece, policy=...)` too (not a checkpoint around the whole
    # model), and FLOPs are counted on the StableHLO with loop trip counts (`hlo_flops`).
    scanned: bool = False
    parts: dict = dataclasses.field(default_factory=dict)   # layer code shared with scan variants
    only_cases: tuple | None = None   # short labels of the policies to run (None: all of them)


def _identity(fn):
    return fn


def _normal(key, shape, scale):
    return jax.random.normal(key, shape, jnp.float32) * scale


# ------------------------------------------------------------------ MLP --
def make_mlp(batch=128, width=512, depth=4, d_in=256, d_out=64) -> Model:
    keys = jax.random.split(jax.random.PRNGKey(0), depth + 3)
    dims = [d_in] + [width] * depth + [d_out]
    params = [(_normal(keys[i], (dims[i], dims[i + 1]), 1 / math.sqrt(dims[i])),
               jnp.zeros(dims[i + 1], jnp.float32)) for i in range(len(dims) - 1)]
    x = _normal(keys[-2], (batch, d_in), 1.0)
    y = _normal(keys[-1], (batch, d_out), 1.0)

    def build(wrap):
        def layer(p, h, i):
            W, b = p
            return checkpoint_name(jnp.tanh(h @ W + b), f"layer{i}_output")

        def mlp(params, batch):
            h, target = batch
            for i, p in enumerate(params[:-1]):
                h = wrap(functools.partial(layer, i=i))(p, h)
            W, b = params[-1]
            out = h @ W + b
            return jnp.mean((out - target) ** 2)
        return mlp

    return Model(
        "mlp", "MLP",
        f"{depth} tanh layers of width {width} (+ linear head), batch {batch}, MSE loss; "
        "each layer output named `layer<i>_output`",
        build, (params, (x, y)),
        names=dict(only=("layer1_output", "layer3_output"), but=("layer0_output",),
                   keep=("layer1_output",), offload=("layer2_output", "layer3_output")))


# ------------------------------------------------------------- conv net --
def make_convnet(batch=8, hw=32, channels=(16, 32, 32, 64), strides=(1, 2, 1, 2),
                 classes=10) -> Model:
    keys = jax.random.split(jax.random.PRNGKey(1), len(channels) + 3)
    params, c_in = [], 3
    for i, (c, s) in enumerate(zip(channels, strides)):
        params.append((_normal(keys[i], (3, 3, c_in, c), 1 / math.sqrt(9 * c_in)),
                       jnp.zeros(c, jnp.float32)))
        c_in = c
    head = (_normal(keys[-3], (c_in, classes), 1 / math.sqrt(c_in)), jnp.zeros(classes))
    images = _normal(keys[-2], (batch, hw, hw, 3), 1.0)
    labels = jax.random.randint(keys[-1], (batch,), 0, classes, jnp.int32)

    def build(wrap):
        def block(p, h, i, stride):
            W, b = p
            h = lax.conv_general_dilated(h, W, (stride, stride), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
            return checkpoint_name(jax.nn.relu(h + b), f"conv{i}")

        def convnet(params, batch):
            convs, (Wh, bh) = params
            h, labels = batch
            for i, (p, s) in enumerate(zip(convs, strides)):
                h = wrap(functools.partial(block, i=i, stride=s))(p, h)
            logits = jnp.mean(h, axis=(1, 2)) @ Wh + bh
            logp = jax.nn.log_softmax(logits)
            return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))
        return convnet

    return Model(
        "convnet", "Conv net",
        f"{len(channels)} 3x3 conv+ReLU layers (channels {'/'.join(map(str, channels))}, "
        f"strides {'/'.join(map(str, strides))}) on {batch}x{hw}x{hw}x3 NHWC images, "
        "global mean pool, linear head, softmax cross-entropy; conv outputs named `conv<i>`",
        build, ((params, head), (images, labels)),
        names=dict(only=("conv1", "conv3"), but=("conv0",), keep=("conv2",),
                   offload=("conv0", "conv1")))


# ------------------------------------------------------------------ GPT --
def make_gpt(batch=4, seq=64, d=128, heads=4, layers=4, mlp=512, vocab=256) -> Model:
    keys = iter(jax.random.split(jax.random.PRNGKey(2), 8 * layers + 8))
    std = 0.02
    params = {
        "wte": _normal(next(keys), (vocab, d), std),
        "wpe": _normal(next(keys), (seq, d), std),
        "layers": [{
            "ln1": jnp.ones(d), "ln2": jnp.ones(d),
            "wq": _normal(next(keys), (d, d), std), "wk": _normal(next(keys), (d, d), std),
            "wv": _normal(next(keys), (d, d), std), "wo": _normal(next(keys), (d, d), std),
            "w1": _normal(next(keys), (d, mlp), std), "b1": jnp.zeros(mlp),
            "w2": _normal(next(keys), (mlp, d), std), "b2": jnp.zeros(d),
        } for _ in range(layers)],
        "lnf": jnp.ones(d),
    }
    tokens = jax.random.randint(next(keys), (batch, seq + 1), 0, vocab, jnp.int32)
    dh = d // heads

    def layer_code():   # fresh closures per call (no tracing caches hit across cases)
        def rmsnorm(x, scale):
            return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale

        def block(lp, h):
            B, T, D = h.shape
            a = rmsnorm(h, lp["ln1"])
            q = checkpoint_name(a @ lp["wq"], "query_proj").reshape(B, T, heads, dh)
            k = checkpoint_name(a @ lp["wk"], "key_proj").reshape(B, T, heads, dh)
            v = checkpoint_name(a @ lp["wv"], "value_proj").reshape(B, T, heads, dh)
            s = jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(dh)
            causal = jnp.tril(jnp.ones((T, T), bool))
            s = jnp.where(causal, s, jnp.finfo(s.dtype).min)
            p = jax.nn.softmax(s, axis=-1)
            o = jnp.einsum("bhts,bshd->bthd", p, v).reshape(B, T, D)
            h = h + checkpoint_name(o @ lp["wo"], "attn_out")
            m = rmsnorm(h, lp["ln2"])
            m = jax.nn.gelu(checkpoint_name(m @ lp["w1"], "mlp_in") + lp["b1"])
            return h + checkpoint_name(m @ lp["w2"], "mlp_out") + lp["b2"]
        return block, rmsnorm

    def build(wrap):
        block, rmsnorm = layer_code()

        def gpt(params, tokens):
            inputs, targets = tokens[:, :-1], tokens[:, 1:]
            h = jnp.take(params["wte"], inputs, axis=0) + params["wpe"][None]
            for lp in params["layers"]:
                h = wrap(block)(lp, h)
            h = rmsnorm(h, params["lnf"])
            logits = h @ params["wte"].T
            logp = jax.nn.log_softmax(logits)
            return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))
        return gpt

    return Model(
        "gpt", "GPT decoder",
        f"{layers} pre-norm decoder layers (d_model {d}, {heads} heads, MLP {mlp}, GELU, "
        f"RMSNorm, causal softmax attention), vocab {vocab}, tied embeddings, batch {batch} x "
        f"seq {seq}, next-token cross-entropy; projections named `query_proj`, `key_proj`, "
        "`value_proj`, `attn_out`, `mlp_in`, `mlp_out` (same names in every layer)",
        build, (params, tokens),
        names=dict(only=("query_proj", "key_proj", "value_proj"), but=("mlp_in",),
                   keep=("attn_out",), offload=("mlp_in",)),
        parts=dict(layer_code=layer_code))


# ------------------------------------------------------ scan-over-layers --
def _stack(trees):
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *trees)


# The scanned models run a subset of the policies (compiling their split forms dominates the
# run time): no remat, the two extremes, one name policy, one offload policy, per-layer regions.
SCAN_CASES = ("none", "nothing", "dots", "only", "off_dots", "layers")


def make_mlp_scan() -> Model:
    """The MLP with its three 512x512 layers stacked and run by `lax.scan` (the first layer,
    256 -> 512, cannot be stacked with them and stays outside the loop)."""
    mlp = make_mlp()
    params, batch = mlp.args
    first, rest, head = params[0], params[1:-1], params[-1]
    n_scan = len(rest)

    def build(wrap, outer=_identity):
        def layer(p, h, name):          # the MLP's layer, with the name passed in
            W, b = p
            return checkpoint_name(jnp.tanh(h @ W + b), name)

        def head_loss(head, h, target):
            W, b = head
            out = h @ W + b
            return jnp.mean((out - target) ** 2)

        def mlp_scan(params, batch):
            first, stacked, head = params
            h, target = batch
            # the first layer is a layer: `wrap` (under a policy: the policy's checkpoint)
            h = wrap(functools.partial(layer, name="layer0_output"))(first, h)
            scanned = wrap(functools.partial(layer, name="layer_output"))
            h, _ = lax.scan(lambda h, p: (scanned(p, h), None), h, stacked)
            return outer(head_loss)(head, h, target)
        return mlp_scan

    return Model(
        "mlp-scan", "MLP, scan over layers",
        f"the MLP above with its {n_scan} width-512 tanh layers stacked on a leading layer axis "
        f"and run by `lax.scan` (first layer 256 -> 512 and the head outside the loop); the "
        f"first layer's output is named `layer0_output`, the scanned layer's `layer_output` "
        f"(every iteration)",
        build, ((first, _stack(rest), head), batch),
        names=dict(only=("layer_output",), but=("layer0_output",), keep=("layer_output",),
                   offload=("layer0_output",)),
        scanned=True, only_cases=SCAN_CASES)


def make_gpt_scan() -> Model:
    """The GPT decoder with its layers stacked and run by `lax.scan`; same block code."""
    gpt = make_gpt()
    params, tokens = gpt.args
    stacked = dict(params, layers=_stack(params["layers"]))
    layer_code = gpt.parts["layer_code"]

    def build(wrap, outer=_identity):
        block, rmsnorm = layer_code()

        def embed(wte, wpe, inputs):
            return jnp.take(wte, inputs, axis=0) + wpe[None]

        def norm_head_loss(lnf, wte, h, targets):
            h = rmsnorm(h, lnf)
            logits = h @ wte.T
            logp = jax.nn.log_softmax(logits)
            return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))

        def gpt_scan(params, tokens):
            inputs, targets = tokens[:, :-1], tokens[:, 1:]
            h = outer(embed)(params["wte"], params["wpe"], inputs)
            layer = wrap(block)
            h, _ = lax.scan(lambda h, lp: (layer(lp, h), None), h, params["layers"])
            return outer(norm_head_loss)(params["lnf"], params["wte"], h, targets)
        return gpt_scan

    return Model(
        "gpt-scan", "GPT decoder, scan over layers",
        "the GPT decoder above with its layer parameters stacked on a leading layer axis and "
        "the layers run by `lax.scan` (same block code, same names; embedding, final norm and "
        "head outside the loop)",
        build, (stacked, tokens), names=gpt.names, scanned=True, only_cases=SCAN_CASES)


# ------------------------------------------------------------- Equinox --
def make_equinox(batch=8, seq=32, d=64, heads=4, blocks=2, mlp=256) -> Model:
    import equinox as eqx

    class Block(eqx.Module):
        ln1: eqx.nn.LayerNorm
        attn: eqx.nn.MultiheadAttention
        ln2: eqx.nn.LayerNorm
        mlp: eqx.nn.MLP

        def __init__(self, key):
            k1, k2 = jax.random.split(key)
            self.ln1 = eqx.nn.LayerNorm(d)
            self.attn = eqx.nn.MultiheadAttention(heads, d, key=k1)
            self.ln2 = eqx.nn.LayerNorm(d)
            self.mlp = eqx.nn.MLP(d, d, mlp, depth=1, activation=jax.nn.gelu, key=k2)

        def __call__(self, x):                       # x: (seq, d)
            a = jax.vmap(self.ln1)(x)
            x = x + checkpoint_name(self.attn(a, a, a), "attn_out")
            m = jax.vmap(self.mlp)(jax.vmap(self.ln2)(x))
            return x + checkpoint_name(m, "mlp_out")

    class Transformer(eqx.Module):
        embed: eqx.nn.Linear
        blocks: list
        head: eqx.nn.Linear

        def __init__(self, key):
            keys = jax.random.split(key, blocks + 2)
            self.embed = eqx.nn.Linear(16, d, key=keys[0])
            self.blocks = [Block(k) for k in keys[1:-1]]
            self.head = eqx.nn.Linear(d, 16, key=keys[-1])

    model = Transformer(jax.random.PRNGKey(3))
    params, static = eqx.partition(model, eqx.is_inexact_array)
    kx, ky = jax.random.split(jax.random.PRNGKey(4))
    x = _normal(kx, (batch, seq, 16), 1.0)
    y = _normal(ky, (batch, seq, 16), 1.0)

    def build(wrap):
        def run_block(blk, h):
            return blk(h)

        def eqx_loss(params, batch):
            m = eqx.combine(params, static)
            xs, ys = batch

            def one(x):
                h = jax.vmap(m.embed)(x)
                for blk in m.blocks:
                    h = wrap(run_block)(blk, h)
                return jax.vmap(m.head)(h)
            return jnp.mean((jax.vmap(one)(xs) - ys) ** 2)
        return eqx_loss

    return Model(
        "equinox", "Equinox transformer",
        f"`eqx.nn` transformer: {blocks} blocks of `eqx.nn.MultiheadAttention` ({heads} heads, "
        f"d {d}) + `eqx.nn.MLP` (width {mlp}, GELU) with `eqx.nn.LayerNorm`, batch {batch} x "
        f"seq {seq} via `jax.vmap`, MSE loss; parameters split off with `eqx.partition`; "
        "block outputs named `attn_out`, `mlp_out` in the user's block code; JAX per-layer "
        "regions use `eqx.filter_checkpoint`",
        build, (params, (x, y)),
        names=dict(only=("attn_out",), but=("mlp_out",), keep=("attn_out",),
                   offload=("mlp_out",)),
        jax_layer_wrap=eqx.filter_checkpoint)


MODELS = {"mlp": make_mlp, "convnet": make_convnet, "gpt": make_gpt, "equinox": make_equinox,
          "mlp-scan": make_mlp_scan, "gpt-scan": make_gpt_scan}


# ================================================================ policies ==
@dataclasses.dataclass
class Case:
    label: str              # the policy as written (ours and JAX use the same spelling)
    short: str              # for the plot
    kind: str               # 'plain' (no checkpoint), 'whole' (checkpoint around the model), 'layers'
    jax_policy: Any = None
    our_policy: Any = None


def cases_for(model: Model) -> list[Case]:
    cp, P = jax.checkpoint_policies, rp.policies
    n = model.names

    def q(names):
        return ", ".join(names)
    cases = [
        Case("none (no remat)", "none", "plain"),
        Case("everything_saveable", "all", "whole", cp.everything_saveable,
             P.everything_saveable),
        Case("nothing_saveable", "nothing", "whole", cp.nothing_saveable, P.nothing_saveable),
        Case("dots_saveable", "dots", "whole", cp.dots_saveable, P.dots_saveable),
        Case("dots_with_no_batch_dims_saveable", "dots_nb", "whole",
             cp.dots_with_no_batch_dims_saveable, P.dots_with_no_batch_dims_saveable),
        Case(f"save_only_these_names({q(n['only'])})", "only", "whole",
             cp.save_only_these_names(*n["only"]), P.save_only_these_names(*n["only"])),
        Case(f"save_any_names_but_these({q(n['but'])})", "but", "whole",
             cp.save_any_names_but_these(*n["but"]), P.save_any_names_but_these(*n["but"])),
        Case(f"save_anything_except_these_names({q(n['but'])})", "except", "whole",
             cp.save_anything_except_these_names(*n["but"]),
             P.save_anything_except_these_names(*n["but"])),
        Case(f"save_from_both_policies(dots_with_no_batch_dims_saveable, "
             f"save_only_these_names({q(n['keep'])}))", "both", "whole",
             cp.save_from_both_policies(cp.dots_with_no_batch_dims_saveable,
                                        cp.save_only_these_names(*n["keep"])),
             P.save_from_both_policies(P.dots_with_no_batch_dims_saveable,
                                       P.save_only_these_names(*n["keep"]))),
        Case("offload_dot_with_no_batch_dims(device, pinned_host)", "off_dots", "whole",
             cp.offload_dot_with_no_batch_dims("device", "pinned_host"),
             P.offload_dot_with_no_batch_dims("device", "pinned_host")),
        Case(f"save_and_offload_only_these_names(saved=[{q(n['keep'])}], "
             f"offloaded=[{q(n['offload'])}])",
             "off_names", "whole",
             cp.save_and_offload_only_these_names(
                 names_which_can_be_saved=n["keep"], names_which_can_be_offloaded=n["offload"],
                 offload_src="device", offload_dst="pinned_host"),
             P.save_and_offload_only_these_names(
                 names_which_can_be_saved=n["keep"], names_which_can_be_offloaded=n["offload"],
                 offload_src="device", offload_dst="pinned_host")),
        Case("per-layer regions", "layers", "layers"),
    ]
    return [c for c in cases if model.only_cases is None or c.short in model.only_cases]


# ============================================================ measurements ==
def best_time(fn, repeat):
    best, result = math.inf, None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t)
    return best, result


def cost(compiled) -> float:
    """flops + transcendentals from XLA's cost analysis of a compiled executable."""
    ca = compiled.cost_analysis()
    if isinstance(ca, (list, tuple)):
        ca = ca[0] if ca else {}
    ca = ca or {}
    return float(ca.get("flops", 0.0)) + float(ca.get("transcendentals", 0.0))


# StableHLO FLOP count with loop trip counts. XLA's cost analysis counts a `while` body once,
# whatever its trip count (checked: `lax.scan` over 1, 2, 3 or 8 layers gives the same
# `flops`), so for the scanned models both sides are counted on the StableHLO instead.
_EW_OPS = {
    "add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum", "negate",
    "abs", "sign", "exponential", "exponential_minus_one", "log", "log_plus_one", "logistic",
    "tanh", "sine", "cosine", "tan", "sqrt", "rsqrt", "cbrt", "power", "atan2", "floor",
    "ceil", "round_nearest_afz", "round_nearest_even", "compare", "select", "clamp", "and",
    "or", "xor", "not", "is_finite", "reduce_precision", "erf", "erf_inv"}
_DOT_DIMS = re.compile(r"lhs_contracting_dimensions = \[([0-9, ]*)\]")


def _nelems(t) -> int:
    return int(np.prod(rp.mlir.ir.RankedTensorType(t).shape, dtype=np.int64))


def _int_const(v):
    """The value of a scalar integer `stablehlo.constant`, else None."""
    ir = rp.mlir.ir
    if not isinstance(v, ir.OpResult) or v.owner.operation.name != "stablehlo.constant":
        return None
    m = re.search(r"dense<(-?\d+)>", str(v.owner.attributes["value"]))
    return int(m.group(1)) if m else None


def trip_count(while_op) -> int:
    """Trip count of a counted `stablehlo.while` (JAX's scan/fori loops: `i < N` from a
    constant start); raises if it is not one."""
    cond = while_op.regions[0].blocks[0]
    for op in cond.operations:
        if op.operation.name != "stablehlo.compare" or \
                "LT" not in str(op.attributes["comparison_direction"]):
            continue
        lhs, bound = op.operands
        ir = rp.mlir.ir
        n = _int_const(bound)
        if n is not None and isinstance(lhs, ir.BlockArgument):
            start = _int_const(while_op.operands[lhs.arg_number])
            if start is not None:
                return max(n - start, 0)
    raise ValueError("stablehlo.while with no constant trip count")


def hlo_flops(module, func: str) -> float:
    """Arithmetic FLOPs of `func` in a StableHLO module, the way XLA's cost analysis counts
    them (flops + transcendentals: 2*M*N*K per dot_general, one per element of every
    elementwise op, one per input element of a reduce; data movement free), with each
    `while` body counted once per iteration and `func.call` followed."""
    funcs = {}
    for op in module.op.body.operations:   # module: an rp.Module
        if op.operation.name == "func.func":
            funcs[str(op.attributes["sym_name"]).strip('"')] = op

    def ops_cost(block) -> float:
        total = 0.0
        for op in block.operations:
            name = op.operation.name
            short = name.split(".", 1)[-1]
            if name == "stablehlo.while":
                body = sum(ops_cost(b) for b in op.regions[1].blocks)
                total += trip_count(op) * body
            elif name == "func.call":
                callee = str(op.attributes["callee"]).lstrip("@")
                total += ops_cost(funcs[callee].regions[0].blocks[0])
            elif name == "stablehlo.dot_general":
                m = _DOT_DIMS.search(str(op.attributes["dot_dimension_numbers"]))
                lhs = rp.mlir.ir.RankedTensorType(op.operands[0].type).shape
                k = int(np.prod([lhs[int(d)] for d in m.group(1).split(",") if d.strip()],
                                dtype=np.int64)) if m else 1
                total += 2.0 * _nelems(op.results[0].type) * k
            elif name == "stablehlo.convolution":
                raise NotImplementedError("hlo_flops: convolution")
            elif name == "stablehlo.reduce":
                n_in = len(op.operands) // 2
                total += sum(_nelems(v.type) for v in list(op.operands)[:n_in])
            elif name in ("stablehlo.case", "stablehlo.if"):
                total += max(sum(ops_cost(b) for b in r.blocks) for r in op.regions)
            elif short in _EW_OPS and name.startswith(("stablehlo.", "chlo.")):
                total += _nelems(op.results[0].type)
        return total

    with module.op.context:
        return ops_cost(funcs[func].regions[0].blocks[0])


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


@dataclasses.dataclass
class Row:
    model: str
    case: Case
    ours_dev: int = 0
    ours_host: int = 0
    ours_n: int = 0
    jax_dev: int = 0
    jax_host: int = 0
    jax_n: int = 0
    jax_literals: int = 0
    ours_cost: float = float("nan")
    jax_cost: float = float("nan")
    ours_peak: int | None = None
    jax_peak: int | None = None
    pass_s: float = float("nan")
    pass_joint_s: float = float("nan")
    jax_lower_s: float = float("nan")
    grad_err: float = float("nan")
    jax_grad_err: float = float("nan")
    rounded: tuple = (0, 0, 0, 0)   # reduce_precision in our <f>_fwd: (n, bytes, n on args, bytes)
    ours_res: list = dataclasses.field(default_factory=list)   # [(type, description)]
    jax_res: list = dataclasses.field(default_factory=list)
    error: str | None = None

    @property
    def ours_total(self):
        return self.ours_dev + self.ours_host

    @property
    def jax_total(self):
        return self.jax_dev + self.jax_host


def jax_split(fun, args, scanned=False):
    """JAX's split form: forward -> (out, VJP leaves), backward(VJP leaves, ct); compiled.
    Cost: XLA's cost analysis, or `hlo_flops` of the lowered StableHLO when `scanned`."""
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
        return sum(hlo_flops(rp.Module.parse(lo.as_text()), "main") for lo in (fwd_l, bwd_l)), \
            grads
    return cost(fwd_c) + cost(bwd_c), grads


def max_err(grads, ref) -> float:
    grads, ref = float_leaves(grads), float_leaves(ref)
    if len(grads) != len(ref):
        raise RuntimeError(f"{len(grads)} gradients vs {len(ref)} from jax.grad")
    # in NumPy: eager jnp ops would compile one XLA program per op and shape
    return max(float(np.max(np.abs(np.asarray(g, np.float32) - np.asarray(r, np.float32))))
               for g, r in zip(grads, ref))


def peak_of(module) -> int | None:
    if estimate_memory is None:
        return None
    return int(estimate_memory(module).peak_bytes)


def rounding_stats(split) -> tuple:
    """reduce_precision ops in <f>_fwd (what insert-reduce-precision added): count and bytes,
    and the same for those applied to function arguments."""
    from remat_passes import graph
    from remat_passes.mlir import ir
    n = b = n_arg = b_arg = 0
    with split.op.context:
        for op in graph.body_block(graph.find_func(split.op, "main_fwd")).operations:
            if op.operation.name != "stablehlo.reduce_precision":
                continue
            nbytes = graph.type_bytes(op.results[0].type)
            n, b = n + 1, b + nbytes
            if isinstance(op.operands[0], ir.BlockArgument):
                n_arg, b_arg = n_arg + 1, b_arg + nbytes
    return n, b, n_arg, b_arg


def jax_function(model: Model, case: Case):
    """A fresh JAX function for `case` (fresh closures: no tracing caches hit)."""
    if case.kind == "plain":
        return model.build(_identity)
    if case.kind == "whole" and model.scanned:
        # scan(checkpoint(layer, policy)), and every piece outside the loop checkpointed with
        # the same policy: what our module policy means (it applies everywhere)
        def ckpt(fn):
            return jax.checkpoint(fn, policy=case.jax_policy)
        return model.build(ckpt, outer=ckpt)
    if case.kind == "whole":
        return jax.checkpoint(model.build(_identity), policy=case.jax_policy)
    return model.build(model.jax_layer_wrap)


def measure(model: Model, case: Case, modules: dict, ref_grads, repeat: int,
            base_split=None) -> Row:
    """One model x policy pair. `base_split`: `jax_split` of the model without remat, reused
    as JAX's side of `none (no remat)` (the same program)."""
    row = Row(model.key, case)
    args = model.args
    # ---------------------------------------------------------------- ours --
    module = modules["layers" if case.kind == "layers" else "plain"]
    pol = case.our_policy
    row.pass_s, split = best_time(lambda: rp.remat(module, pol, mode="split"), repeat)
    row.pass_joint_s, joint = best_time(lambda: rp.remat(module, pol, mode="joint"), repeat)
    for r in split.residuals:
        host = r.offload is not None and "host" in str(r.offload.dst)
        if host:
            row.ours_host += r.bytes
        else:
            row.ours_dev += r.bytes
        row.ours_res.append((r.type, r.description + (" [host]" if host else "")))
    row.ours_n = len(split.residuals)
    row.rounded = rounding_stats(split)
    fwd_c = rp.compile(split, "main_fwd").lower(*args).compile()
    res = fwd_c(*args)
    ct = jnp.ones_like(res[0])
    bwd_c = rp.compile(split, "main_bwd").lower(*res[1:], ct).compile()
    grads = bwd_c(*res[1:], ct)
    if model.scanned:
        row.ours_cost = hlo_flops(split, "main_fwd") + hlo_flops(split, "main_bwd")
    else:
        row.ours_cost = cost(fwd_c) + cost(bwd_c)
    row.grad_err = max_err(grads, ref_grads)
    row.ours_peak = peak_of(joint)
    # ----------------------------------------------------------------- JAX --
    for aval, desc in jax_saved_residuals(jax_function(model, case), *args):
        if desc == "from a literal":
            row.jax_literals += 1
            continue
        if is_host(aval):
            row.jax_host += aval_bytes(aval)
        else:
            row.jax_dev += aval_bytes(aval)
        row.jax_res.append((short_type(aval), desc + (" [host]" if is_host(aval) else "")))
    row.jax_n = len(row.jax_res)
    if case.kind == "plain" and base_split is not None:
        row.jax_cost, jgrads = base_split
    else:
        row.jax_cost, jgrads = jax_split(jax_function(model, case), args, model.scanned)
    row.jax_grad_err = max_err(jgrads, ref_grads)
    vg = functools.partial(jax.value_and_grad, argnums=(0, 1), allow_int=True)
    row.jax_lower_s, lowered = best_time(
        lambda: jax.jit(vg(jax_function(model, case))).lower(*args), repeat)
    if estimate_memory is not None:
        row.jax_peak = peak_of(rp.Module.parse(lowered.as_text()))
    return row


def run_benchmarks(models: list[Model], repeat: int):
    rows, meta = [], {}
    total = sum(len(cases_for(m)) + 2 for m in models)
    with Progress(TextColumn("{task.description:<48}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("starting", total=total)
        for model in models:
            args = model.args
            progress.update(task, description=f"{model.key}: export + reference")
            # jitted: run eagerly, jax.grad compiles every primitive on its own (~5 s a model)
            ref = jax.jit(jax.grad(model.build(_identity), argnums=(0, 1), allow_int=True))(*args)
            t_plain, plain = best_time(lambda: rp.export_vjp(model.build(_identity), *args),
                                       repeat)
            base = jax_split(model.build(_identity), args, model.scanned)
            base_cost = base[0]
            progress.advance(task)
            t_layers, layers = best_time(
                lambda: rp.export_vjp(model.build(rp.checkpoint), *args), repeat)
            progress.advance(task)
            leaves = jax.tree_util.tree_leaves(args)
            meta[model.key] = dict(
                export_s=t_plain, export_layers_s=t_layers, base_cost=base_cost,
                n_ops=count_ops(plain), n_params=sum(x.size for x in leaves[:len(
                    jax.tree_util.tree_leaves(args[0]))]))
            modules = {"plain": plain, "layers": layers}
            for case in cases_for(model):
                progress.update(task, description=f"{model.key}: {case.short}")
                try:
                    rows.append(measure(model, case, modules, ref, repeat, base))
                except Exception as e:  # keep going; the report shows the failure
                    row = Row(model.key, case, error=f"{type(e).__name__}: {e}")
                    rows.append(row)
                    progress.console.print(f"[red]{model.key} / {case.label}: {row.error}")
                progress.advance(task)
    return rows, meta


def count_ops(module) -> int:
    n = 0

    def visit(op):
        nonlocal n
        n += 1
        return rp.mlir.ir.WalkResult.ADVANCE
    module.op.operation.walk(visit)
    return n


# ================================================================= targets ==
def extra_pct(c, base):
    return (c - base) / base * 100.0


def misses(row: Row, base: float) -> list[str]:
    if row.error:
        return ["error"]
    out = []
    if row.ours_dev > row.jax_dev or row.ours_total > row.jax_total:
        out.append("bytes")
    if extra_pct(row.ours_cost, base) > extra_pct(row.jax_cost, base) + FLOPS_TOLERANCE_PP:
        out.append("flops")
    return out


# ================================================================== report ==
def fmt_bytes(n) -> str:
    if n is None:
        return "n/a"
    if n < 1024:
        return f"{n} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024:
            return f"{n:.1f} {unit}" if n < 100 else f"{n:.0f} {unit}"
    return f"{n:.0f} TiB"


def fmt_res(dev, host) -> str:
    s = fmt_bytes(dev)
    if host:
        s += f" + {fmt_bytes(host)} host"
    return s


def fmt_ms(s) -> str:
    return "n/a" if s is None or math.isnan(s) else f"{s * 1e3:.0f}" if s >= 0.1 else \
        f"{s * 1e3:.1f}"


def fmt_pct(p) -> str:
    return "n/a" if math.isnan(p) else f"{p:+.1f}%"


def residual_diff(row: Row, limit=5) -> list[str]:
    """Residuals one side saves and the other does not, matched by type (multiset
    difference; descriptions differ in wording between the two sides)."""
    def by_type(res):
        d = collections.defaultdict(list)
        for t, desc in res:
            d[t].append(desc)
        return d
    ours, theirs = by_type(row.ours_res), by_type(row.jax_res)
    lines = []
    for side, a, b in (("only ours", ours, theirs), ("only JAX", theirs, ours)):
        extra = []
        for t in a:
            k = len(a[t]) - len(b.get(t, []))
            if k > 0:
                # show the descriptions the other side has least of
                other = collections.Counter(b.get(t, []))
                descs = [d for d in a[t] if not other.pop(d, 0)] or a[t]
                extra.append((t, k, collections.Counter(descs[-k:] if len(descs) >= k else descs)))
        if not extra:
            continue
        total = sum(k for _, k, _ in extra)
        nbytes = 0
        shown = []
        for t, k, descs in sorted(extra, key=lambda e: -e[1]):
            nbytes += k * type_bytes_str(t)
        for t, k, descs in sorted(extra, key=lambda e: -e[1] * type_bytes_str(e[0]))[:limit]:
            d = "; ".join(_short_desc(x) for x in list(descs)[:2])
            shown.append(f"{k}x `{t}` ({d})")
        more = len(extra) - min(len(extra), limit)
        lines.append(f"{side}: {total} residuals, {fmt_bytes(nbytes)}: " + ", ".join(shown)
                     + (f", and {more} more types" if more else ""))
    return lines


_DTYPE_BYTES = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "i64": 8, "i32": 4, "i16": 2,
                "i8": 1, "u8": 1, "i1": 1, "bool": 1, "u32": 4, "u64": 8}


def type_bytes_str(t: str) -> int:
    m = re.match(r"([a-z0-9]+)(?:<[^>]*>)?\[([0-9,]*)\]", t)
    if not m:
        return 0
    n = 1
    for d in filter(None, m.group(2).split(",")):
        n *= int(d)
    return n * _DTYPE_BYTES.get(m.group(1), 4)


def _short_desc(desc: str) -> str:
    desc = desc.replace(ROOT + "/", "")
    desc = re.sub(r"/\S*/site-packages/", "", desc)
    desc = re.sub(r"(\w+\.<locals>\.)+", "", desc)
    return desc


def model_table(model: Model, rows: list[Row], meta: dict) -> list[str]:
    base = meta["base_cost"]
    out = [f"### {model.title}", "", model.description + ".", "",
           f"Joint VJP module: {meta['n_ops']:,} ops; {meta['n_params']:,} parameters. "
           f"Export (`rp.export_vjp`): {fmt_ms(meta['export_s'])} ms "
           f"({fmt_ms(meta['export_layers_s'])} ms with per-layer `rp.checkpoint` regions). "
           f"No-remat split (plain `jax.vjp`): {base / 1e6:.1f} MFLOP fwd+bwd.", "",
           "| policy | residuals ours | residuals JAX | ours/JAX | extra FLOPs ours | "
           "extra FLOPs JAX | peak (joint) ours | peak (joint) JAX | pass ms split / joint "
           "| JAX trace+lower ms | max abs grad err | targets |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|"]
    for r in rows:
        if r.error:
            out.append(f"| `{r.case.label}` | error: {r.error[:120]} |" + " |" * 10)
            continue
        m = misses(r, base)
        ratio = r.ours_total / r.jax_total if r.jax_total else float("nan")
        out.append(
            f"| `{r.case.label}` | {fmt_res(r.ours_dev, r.ours_host)} ({r.ours_n}) "
            f"| {fmt_res(r.jax_dev, r.jax_host)} ({r.jax_n}) | {ratio:.2f} "
            f"| {fmt_pct(extra_pct(r.ours_cost, base))} | {fmt_pct(extra_pct(r.jax_cost, base))} "
            f"| {fmt_bytes(r.ours_peak)} | {fmt_bytes(r.jax_peak)} "
            f"| {fmt_ms(r.pass_s)} / {fmt_ms(r.pass_joint_s)} | {fmt_ms(r.jax_lower_s)} "
            f"| {r.grad_err:.1e} | {'ok' if not m else 'MISS: ' + ', '.join(m)} |")
    out.append("")
    return out


def git_commit() -> str:
    """'abc1234' (+ ' with local changes to remat_passes/' when the package differs from it)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "remat_passes"], cwd=ROOT,
                               text=True, capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown commit"
    return head + (" with local changes to remat_passes/" if dirty else "")


def render(models, rows, meta, args, runtime_s, png_rel, scaling_md, extra_md) -> str:
    by_model = collections.defaultdict(list)
    for r in rows:
        by_model[r.model].append(r)
    n_pairs = len(rows)
    missed = [(r, misses(r, meta[r.model]["base_cost"])) for r in rows]
    missed = [(r, m) for r, m in missed if m]
    literals = sum(r.jax_literals for r in rows)
    cpu = platform.processor() or platform.machine()
    L = [
        "# Benchmarks: remat_passes vs. hand-written `jax.checkpoint`",
        "",
        "<!-- Generated by `python tools/bench.py`; edit the script, not this file, except between "
        "the analysis:begin/end markers (that block is kept on regeneration). -->",
        "",
        f"Regenerate everything on this page with `python tools/bench.py` (needs "
        f"`pip install -e \".[bench]\"`); this run: {datetime.date.today().isoformat()}, "
        f"{n_pairs} model x policy pairs in {runtime_s / 60:.1f} min wall time "
        f"(pass-time scaling included), host {cpu}, {os.cpu_count()} cpus, "
        f"python {platform.python_version()}, jax {jax.__version__} "
        f"({jax.default_backend()}), remat_passes {rp.__version__} at {git_commit()}, "
        f"timings best of "
        f"{args.repeat}. The machine is shared and noisy: compare numbers within a row "
        "(measured side by side), not across runs.",
        "",
        "## What is compared",
        "",
        "For each model we export the joint VJP once with `rp.export_vjp` (no `jax.checkpoint` "
        "in the model code) and run `rp.remat(module, policy, mode='split')`; the JAX side is "
        "the same model written by hand with `jax.checkpoint(model, policy=...)` around the "
        "whole loss (or `jax.checkpoint` around each layer for *per-layer regions*, where our "
        "side wraps each layer in `rp.checkpoint`). `none (no remat)` is the model without any "
        "checkpoint on both sides (our policy `None`).",
        "",
        "*Scan over layers* (`mlp-scan`, `gpt-scan`): the layers' parameters are stacked on a "
        "leading axis and run by `lax.scan`. Ours is still `rp.remat(rp.export_vjp(f), policy)`: "
        "the policy applies per iteration inside the scan's forward/backward while pair, and "
        "to the whole module outside it. JAX's side is written the usual way, "
        "`lax.scan(jax.checkpoint(layer, policy=...))`, and, so that it means the same as our "
        "module policy, every piece outside the loop (MLP: the first layer, head + loss; "
        "GPT: the embedding, final norm + head + loss) is in its own `jax.checkpoint(piece, "
        "policy=...)` too. *Per-layer regions* are `lax.scan(rp.checkpoint(layer))` vs. "
        "`lax.scan(jax.checkpoint(layer))` (plus the MLP's first layer), with no policy "
        "outside the regions on either side. These two models run a subset of the policies "
        f"({', '.join(SCAN_CASES)} in the plot's labels) to keep the run short.",
        "",
        "- **residuals**: ours = `sum(r.bytes for r in out.residuals)` of the split form (count "
        "in parentheses); JAX = the avals `jax._src.ad_checkpoint.saved_residuals` reports for "
        "the hand-written checkpointed function, summed. Both count function arguments the "
        "backward pass reads (parameters, inputs). Entries JAX reports as `from a literal` "
        f"(scalars, not memory) are dropped: {literals} such entries in this run. Values "
        "offloaded to host memory (`pinned_host`) are listed separately as `+ ... host`.",
        "- **extra FLOPs**: XLA's cost analysis (`flops + transcendentals` of "
        "`jax.jit(...).lower(...).compile().cost_analysis()`) of the compiled forward plus the "
        "compiled backward of each split form, as % over JAX's no-remat split (plain "
        "`jax.vjp`, forward and backward jitted separately: the same baseline for both "
        "columns). Ours: `rp.compile(out, 'main_fwd')` / `'main_bwd'` (an `Exported.call` "
        "under `jax.jit`). JAX: forward = `jax.vjp(f_ckpt, *args)` returning the leaves of "
        "the VJP function (`jax.tree_util.tree_flatten(vjp_fn)`), backward = the VJP "
        "function rebuilt from those leaves, applied to the cotangent. Split forms because "
        "XLA:CPU undoes recomputation inside one joint program (DESIGN.md §5). XLA's cost "
        "analysis counts a `while` body once whatever its trip count (checked: a `lax.scan` over "
        "2, 3 or 8 layers reports the same FLOPs), so for the scanned models both sides and the "
        "baseline are counted instead on the StableHLO of the same split forms (`hlo_flops` in "
        "the script: 2·M·N·K per `dot_general`, one per element of each elementwise op, one per "
        "input element of a `reduce`, `while` bodies times their constant trip count); on "
        "loop-free programs it agrees with XLA's count to 0.1%. The scanned tables' "
        "percentages are therefore not XLA numbers, and only comparable within those tables.",
        "- **peak (joint)**: the static program-order liveness estimate "
        "`remat_passes.memory.estimate_memory(...).peak_bytes` of our joint form "
        "(`rp.remat(..., mode='joint')`) and, for reference, of JAX's own joint program "
        "(the StableHLO of `jax.jit(jax.value_and_grad(f_ckpt))`, same estimator)."
        if estimate_memory is not None else
        "- **peak (joint)**: n/a (`remat_passes.memory.estimate_memory` not available).",
        "- **pass ms**: `rp.remat(module, policy, mode='split')` / `mode='joint'` (clone + "
        "passes + verifier). **JAX trace+lower ms**: "
        "`jax.jit(jax.value_and_grad(jax.checkpoint(model, policy))).lower(...)` on a fresh "
        "function. Our own front-end cost is the export time in each model's header.",
        "- **max abs grad err**: our split forward + backward (compiled with XLA) vs. "
        "`jax.grad` of the model without remat (float gradients only).",
        f"- **targets**: residual bytes ours <= JAX (device bytes and device+host bytes), and "
        f"extra FLOPs ours <= JAX + {FLOPS_TOLERANCE_PP:g} percentage point.",
        "",
        f"![residual memory vs. recompute FLOPs]({png_rel})",
        "",
        "*Residual bytes (device; split form) vs. extra FLOPs over the no-remat split, per "
        "policy. Filled: remat_passes; open: hand-written `jax.checkpoint`. Labels: none = no "
        "remat, all = everything_saveable, nothing, dots, dots_nb = "
        "dots_with_no_batch_dims_saveable, only / but / except = the name policies, both = "
        "save_from_both_policies, off_dots / off_names = the offload policies (device bytes "
        "only), layers = per-layer regions.*",
        "",
        "## Summary",
        "",
    ]
    if missed:
        L.append(f"{n_pairs - len(missed)} of {n_pairs} pairs meet both targets. Misses:")
        L.append("")
        for r, m in missed:
            base = meta[r.model]["base_cost"]
            L.append(f"- **{r.model} / `{r.case.label}`** ({', '.join(m)}): residuals "
                     f"{fmt_res(r.ours_dev, r.ours_host)} ours vs {fmt_res(r.jax_dev, r.jax_host)} "
                     f"JAX; extra FLOPs {fmt_pct(extra_pct(r.ours_cost, base))} ours vs "
                     f"{fmt_pct(extra_pct(r.jax_cost, base))} JAX.")
            for line in residual_diff(r) if not r.error else [r.error]:
                L.append(f"  - {line}")
            if "flops" in m:
                n, b, n_arg, b_arg = r.rounded
                L.append(f"  - insert-reduce-precision rounds {n} values ({fmt_bytes(b)}) in our "
                         f"forward, {n_arg} of them function arguments ({fmt_bytes(b_arg)}); "
                         "JAX rounds residuals only inside `jax.checkpoint`, and never "
                         "arguments.")
    else:
        L.append(f"All {n_pairs} pairs meet both targets.")
    L.append("")
    bad_grad = [r for r in rows if not r.error and not r.grad_err <= 1e-4]
    L.append("Gradients: max abs error vs. `jax.grad` over all pairs "
             f"{max((r.grad_err for r in rows if not r.error), default=float('nan')):.1e} "
             f"(JAX's own split: {max((r.jax_grad_err for r in rows if not r.error), default=float('nan')):.1e})"
             + (f"; above 1e-4: {', '.join(f'{r.model}/{r.case.short}' for r in bad_grad)}."
                if bad_grad else "."))
    L.append("")
    if extra_md:
        L += [extra_md.strip(), ""]
    L += ["## Results per model", ""]
    for model in models:
        L += model_table(model, by_model[model.key], meta[model.key])
    L += [
        "## GPU",
        "",
        "**Not measured.** This run had no GPU. On GPU/TPU, XLA keeps the recomputation of a "
        "joint program and honours `annotate_device_placement`, so the joint form's memory "
        "can be read from XLA itself (`compiled.memory_analysis()`: temp + argument + output "
        "bytes) and host offload can be checked. To fill this section: run `tools/bench.py` "
        "on a GPU machine and add, per model x policy, XLA's `memory_analysis()` of "
        "`rp.compile(rp.remat(module, policy), 'main')` vs. "
        "`jax.jit(jax.value_and_grad(jax.checkpoint(model, policy)))`, and step times.",
        "",
    ]
    if scaling_md:
        L += ["## Pass time vs. module size", "", scaling_md.strip(), ""]
    return "\n".join(L) + "\n"


# ==================================================================== plot ==
def _clusters(pts):
    """Group points that coincide on the plot (log x, linear y) so each group gets one label."""
    xs = [math.log10(p[0]) for p in pts]
    ys = [p[1] for p in pts]
    xr = (max(xs) - min(xs)) or 1.0
    yr = (max(ys) - min(ys)) or 1.0
    clusters = []
    for p, lx in zip(pts, xs):
        for c in clusters:
            if abs(c["lx"] - lx) < 0.025 * xr and abs(c["y"] - p[1]) < 0.025 * yr:
                c["items"].append(p)
                break
        else:
            clusters.append(dict(lx=lx, y=p[1], x=p[0], items=[p]))
    return clusters


def _label(ax, clusters, points_per_px):
    """One label per cluster, right of it, moved up/down to avoid the labels placed so far."""
    right = ax.get_window_extent().x1 * points_per_px   # keep labels inside the axes
    placed = []   # boxes in points (x0, y0, x1, y1): the markers, then each label placed
    for c in clusters:
        px, py = ax.transData.transform((c["x"], c["y"])) * points_per_px
        placed.append((px - 6, py - 6, px + 6, py + 6))
    for c in sorted(clusters, key=lambda c: (-c["y"], c["lx"])):
        labels = list(dict.fromkeys(p[3] for p in c["items"]))
        sides = {p[2] for p in c["items"]}
        text = "/".join(labels) + ("" if sides == {"ours", "jax"} else
                                   " (ours)" if sides == {"ours"} else " (JAX)")
        color = "black" if sides == {"ours", "jax"} else \
            ("tab:blue" if sides == {"ours"} else "tab:orange")
        px, py = ax.transData.transform((c["x"], c["y"])) * points_per_px
        w, h = 4.1 * len(text), 8.5
        candidates = [(9, dy) for dy in (-3, 6, -12, 15, -21, 24, -30, 33)] + \
            [(-9 - w, dy) for dy in (-3, 6, -12, 15)]
        for dx, dy in candidates:
            box = (px + dx, py + dy, px + dx + w, py + dy + h)
            inside = right is None or box[2] <= right
            if inside and not any(box[0] < q[2] and q[0] < box[2] and box[1] < q[3]
                                  and q[1] < box[3] for q in placed):
                break
        else:
            dx, dy = candidates[0]
            box = (px + dx, py + dy, px + dx + w, py + dy + h)
        placed.append(box)
        ax.annotate(text, (c["x"], c["y"]), fontsize=7, color=color,
                    xytext=(dx, dy), textcoords="offset points")


def plot(models, rows, meta, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    n = len(models)
    cols = 2 if n > 1 else 1
    nrows = math.ceil(n / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(7.5 * cols, 5.4 * nrows), squeeze=False)
    to_label = []
    for ax, model in zip(axes.flat, models):
        base = meta[model.key]["base_cost"]
        pts = []   # (bytes, extra %, side, short label)
        for r in rows:
            if r.model != model.key or r.error:
                continue
            ours = (max(r.ours_dev, 1), extra_pct(r.ours_cost, base))
            jx = (max(r.jax_dev, 1), extra_pct(r.jax_cost, base))
            pts += [(*ours, "ours", r.case.short), (*jx, "jax", r.case.short)]
            if abs(math.log(ours[0] / jx[0])) > 0.02 or abs(ours[1] - jx[1]) > 0.5:
                ax.annotate("", xy=ours, xytext=jx, zorder=1,
                            arrowprops=dict(arrowstyle="->", color="0.6", lw=0.8))
        ax.scatter([p[0] for p in pts if p[2] == "jax"], [p[1] for p in pts if p[2] == "jax"],
                   marker="s", s=120, facecolors="none", edgecolors="tab:orange",
                   linewidths=1.5, label="jax.checkpoint by hand (split)", zorder=2)
        ax.scatter([p[0] for p in pts if p[2] == "ours"], [p[1] for p in pts if p[2] == "ours"],
                   marker="o", s=45, color="tab:blue", label="remat_passes (split)", zorder=3)
        ax.set_xscale("log")
        span = max(p[0] for p in pts) / min(p[0] for p in pts)
        ax.xaxis.set_major_locator(ticker.LogLocator(base=2.0,
                                                     subs=(1.0,) if span > 5 else (1.0, 1.5)))
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: fmt_bytes(int(round(v)))))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.margins(x=0.3, y=0.1)
        ax.set_title(model.title)
        ax.set_xlabel("residual bytes on device, split form (log scale)")
        ax.set_ylabel("extra FLOPs over the no-remat split (%)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8, loc="center right")
        to_label.append((ax, _clusters(pts)))
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle("Residual memory vs. recompute FLOPs per policy "
                 "(XLA:CPU cost analysis, flops + transcendentals)")
    fig.tight_layout()
    for ax, clusters in to_label:   # after the layout: positions are final
        _label(ax, clusters, 72.0 / fig.dpi)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ================================================================= scaling ==
def run_scaling(sizes: str, repeat: int, heading: str = "###") -> str:
    script = os.path.join(ROOT, "tools", "bench_pass_time.py")
    cmd = [sys.executable, script, "--sizes", sizes, "--repeat", str(repeat)]
    console.print(f"running {' '.join(cmd[1:])}")
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        return (f"`tools/bench_pass_time.py --sizes {sizes}` failed (exit {proc.returncode}):"
                f"\n\n```\n{proc.stderr[-2000:]}\n```")
    text = proc.stdout.strip()
    # Demote its headings under ours and drop its title line.
    lines = [ln for ln in text.splitlines() if not ln.startswith("# ")]
    lines = [(heading + ln[2:]) if ln.startswith("## ") else ln for ln in lines]
    how = "`python tools/bench.py --scaling-100k`" if sizes == "100000" else "`tools/bench.py`"
    return (f"Output of `python tools/bench_pass_time.py --sizes {sizes} --repeat {repeat}` "
            f"(run by {how}):\n\n" + "\n".join(lines).strip())


BLOCK_RE = r"<!-- {0}:begin -->\n(.*?)<!-- {0}:end -->"


def kept_block(path, name) -> str | None:
    try:
        with open(path) as f:
            m = re.search(BLOCK_RE.format(name), f.read(), re.S)
    except OSError:
        return None
    return m.group(1) if m else None


def block(name, body) -> str:
    return f"<!-- {name}:begin -->\n{body.strip()}\n<!-- {name}:end -->"


# ==================================================================== main ==
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS),
                    help=f"comma-separated subset of {','.join(MODELS)}")
    ap.add_argument("--repeat", type=int, default=3, help="timings: best of N (default 3)")
    ap.add_argument("--md", default=DEFAULT_MD, help="Markdown report to write")
    ap.add_argument("--png", default=DEFAULT_PNG, help="plot to write")
    ap.add_argument("--scaling-sizes", default="1000,10000",
                    help="sizes for tools/bench_pass_time.py (default 1000,10000)")
    ap.add_argument("--no-scaling", action="store_true",
                    help="do not run tools/bench_pass_time.py; keep the section already in --md")
    ap.add_argument("--scaling-100k", action="store_true",
                    help="also time the 100k-op module (about 2 min, once); otherwise the "
                         "100k note already in --md is kept")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    keys = [k.strip() for k in args.models.split(",") if k.strip()]
    unknown = [k for k in keys if k not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {', '.join(MODELS)}")
    models = [MODELS[k]() for k in keys]
    rows, meta = run_benchmarks(models, args.repeat)

    if args.no_scaling:
        scaling = kept_block(args.md, "scaling") or "(not run)"
    else:
        scaling = run_scaling(args.scaling_sizes, 3)
    if args.scaling_100k:
        big = run_scaling("100000", 1, heading="####")
        big = (f"Measured {datetime.date.today().isoformat()} at {git_commit()} "
               "(once; about 2 min):\n\n" + big)
    else:
        big = kept_block(args.md, "scaling100k")
    scaling_md = block("scaling", scaling)
    if big:
        scaling_md += "\n\n### 100k ops\n\n" + block("scaling100k", big)

    plot(models, rows, meta, args.png)
    runtime = time.perf_counter() - t0
    png_rel = os.path.relpath(os.path.abspath(args.png),
                              os.path.dirname(os.path.abspath(args.md)))
    analysis = kept_block(args.md, "analysis")
    extra = block("analysis", analysis) if analysis else None
    md = render(models, rows, meta, args, runtime, png_rel, scaling_md, extra)
    os.makedirs(os.path.dirname(os.path.abspath(args.md)), exist_ok=True)
    with open(args.md, "w") as f:
        f.write(md)
    console.print(f"wrote {args.md} and {args.png} in {runtime:.0f} s")


if __name__ == "__main__":
    main()
