"""Every model the benchmarks (and the tests that need them) use, defined once.

* The comparison models (`MODELS`): MLP, conv net, GPT decoder, Equinox
  transformer, and the scan-over-layers MLP and GPT; each a `Model` whose
  `build(wrap)` returns the loss with each layer wrapped by `wrap` (identity,
  `rp.checkpoint` or `jax.checkpoint`), so one definition serves both sides.
* The static-memory figures: an 8-layer MLP and a transformer block
  (`mlp_model`, `transformer_block`, `transformer_model`).
* The scaling families live in `families.py`.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.ad_checkpoint import checkpoint_name

import remat_passes as rp
from remat_passes.cost.memory_report import format_bytes

P = rp.policies

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


# ------------------------------------------------------ held-out decoder --
def make_decoder(batch=4, seq=64, d=128, heads=4, kv_heads=2, layers=4, mlp=384,
                 vocab=256) -> Model:
    """A decoder the planner was never tuned on (`HELD_OUT`: the budgets page checks `auto`
    on it beside the benchmark models, not in the other pages): rotary positions,
    grouped-query attention, SwiGLU, two checkpoint names per layer, `ctx` (the attention
    context before its output projection) and `act` (the gated MLP activation)."""
    keys = iter(jax.random.split(jax.random.PRNGKey(7), 8 * layers + 4))
    std = 0.02
    dh = d // heads
    params = {
        "embed": _normal(next(keys), (vocab, d), std),
        "layers": [{
            "ln1": jnp.ones(d), "ln2": jnp.ones(d),
            "wq": _normal(next(keys), (d, heads * dh), std),
            "wkv": _normal(next(keys), (d, 2 * kv_heads * dh), std),
            "wo": _normal(next(keys), (heads * dh, d), std),
            "wg": _normal(next(keys), (d, mlp), std), "wu": _normal(next(keys), (d, mlp), std),
            "wd": _normal(next(keys), (mlp, d), std),
        } for _ in range(layers)],
        "lnf": jnp.ones(d), "head": _normal(next(keys), (d, vocab), std),
    }
    tokens = jax.random.randint(next(keys), (batch, seq + 1), 0, vocab, jnp.int32)

    def rmsnorm(x, scale):
        return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale

    def rotary(x):                       # x: (B, T, H, dh)
        T = x.shape[1]
        inv = 1.0 / (10000.0 ** (jnp.arange(0, dh, 2, dtype=jnp.float32) / dh))
        ang = jnp.arange(T, dtype=jnp.float32)[:, None] * inv[None]
        cos, sin = jnp.cos(ang)[None, :, None], jnp.sin(ang)[None, :, None]
        x1, x2 = x[..., ::2], x[..., 1::2]
        return jnp.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).reshape(x.shape)

    def block(lp, h):
        B, T, _ = h.shape
        a = rmsnorm(h, lp["ln1"])
        q = rotary((a @ lp["wq"]).reshape(B, T, heads, dh))
        k, v = jnp.split((a @ lp["wkv"]).reshape(B, T, 2 * kv_heads, dh), 2, axis=2)
        k = jnp.repeat(rotary(k), heads // kv_heads, axis=2)
        v = jnp.repeat(v, heads // kv_heads, axis=2)
        s = jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(dh)
        s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -1e9)
        ctx = jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(s, axis=-1), v)
        h = h + checkpoint_name(ctx.reshape(B, T, heads * dh), "ctx") @ lp["wo"]
        m = rmsnorm(h, lp["ln2"])
        act = checkpoint_name(jax.nn.silu(m @ lp["wg"]) * (m @ lp["wu"]), "act")
        return h + act @ lp["wd"]

    def build(wrap):
        def decoder(params, tokens):
            inputs, targets = tokens[:, :-1], tokens[:, 1:]
            h = jnp.take(params["embed"], inputs, axis=0)
            for lp in params["layers"]:
                h = wrap(block)(lp, h)
            logp = jax.nn.log_softmax(rmsnorm(h, params["lnf"]) @ params["head"])
            return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))
        return decoder

    return Model(
        "decoder", "Held-out decoder",
        f"{layers} pre-norm decoder layers (d_model {d}, {heads} query and {kv_heads} key/value "
        f"heads, rotary positions, SwiGLU MLP {mlp}, RMSNorm), vocab {vocab}, untied head, "
        f"batch {batch} x seq {seq}, next-token cross-entropy; the attention context named "
        "`ctx`, the gated MLP activation `act`; not used to tune the planner",
        build, (params, tokens),
        names=dict(only=("ctx", "act"), but=("act",), keep=("ctx",), offload=("act",)))


MODELS = {"mlp": make_mlp, "convnet": make_convnet, "gpt": make_gpt, "equinox": make_equinox,
          "mlp-scan": make_mlp_scan, "gpt-scan": make_gpt_scan}
HELD_OUT = {"decoder": make_decoder}     # the budgets page only (see make_decoder)


# ------------------------------------------------------- static memory figures --
def mlp_model(layers=8, width=256, batch=64):
    def mlp(params, x):
        h = x
        for i, (w, b) in enumerate(params):
            h = checkpoint_name(jnp.tanh(h @ w + b), f"layer{i}")
        return jnp.sum(h)
    k = jax.random.split(jax.random.PRNGKey(0), 2 * layers + 1)
    params = [(jax.random.normal(k[2 * i], (width, width), jnp.float32) * 0.05,
               jax.random.normal(k[2 * i + 1], (width,), jnp.float32) * 0.05)
              for i in range(layers)]
    x = jax.random.normal(k[-1], (batch, width), jnp.float32)
    even = [f"layer{i}" for i in range(0, layers, 2)]
    policies = [
        ("no remat", None),
        (f"save_only_these_names({', '.join(even)})", P.save_only_these_names(*even)),
        ("save_only_these_names(layer3)", P.save_only_these_names("layer3")),
        ("dots_saveable", P.dots_saveable),
        ("nothing_saveable", P.nothing_saveable),
    ]
    act = batch * width * 4
    note = (f"{layers} layers, width {width}, batch {batch}, f32; one activation "
            f"f32[{batch},{width}] = {format_bytes(act)}")
    return rp.export_vjp(mlp, params, x), policies, note


def transformer_block(batch=4, tokens=128, width=256, heads=4, hidden=1024):
    """(block, params, x): one pre-norm-free transformer block with named activations."""
    def block(p, x):
        def split_heads(t):
            return t.reshape(batch, tokens, heads, width // heads).transpose(0, 2, 1, 3)
        q = checkpoint_name(x @ p["wq"], "q")
        k = checkpoint_name(x @ p["wk"], "k")
        v = checkpoint_name(x @ p["wv"], "v")
        s = jnp.einsum("bhqd,bhkd->bhqk", split_heads(q), split_heads(k)) / np.sqrt(width // heads)
        a = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), split_heads(v))
        a = checkpoint_name(a.transpose(0, 2, 1, 3).reshape(batch, tokens, width), "attn_out")
        h = x + a @ p["wo"]
        m = checkpoint_name(jax.nn.gelu(h @ p["w1"]), "mlp_hidden")
        return h + m @ p["w2"]
    ks = jax.random.split(jax.random.PRNGKey(1), 7)
    shapes = {"wq": (width, width), "wk": (width, width), "wv": (width, width),
              "wo": (width, width), "w1": (width, hidden), "w2": (hidden, width)}
    p = {n: jax.random.normal(kk, s, jnp.float32) * 0.05 for (n, s), kk in zip(shapes.items(), ks)}
    x = jax.random.normal(ks[6], (batch, tokens, width), jnp.float32)
    return block, p, x


def transformer_model(batch=4, tokens=128, width=256, heads=4, hidden=1024):
    block, p, x = transformer_block(batch, tokens, width, heads, hidden)
    policies = [
        ("no remat", None),
        ("save_only_these_names(q, k, v)", P.save_only_these_names("q", "k", "v")),
        ("save_only_these_names(attn_out)", P.save_only_these_names("attn_out")),
        ("save_only_these_names(q, k, v, attn_out)",
         P.save_only_these_names("q", "k", "v", "attn_out")),
        ("save_only_these_names(attn_out, mlp_hidden)",
         P.save_only_these_names("attn_out", "mlp_hidden")),
        ("dots_saveable", P.dots_saveable),
        ("nothing_saveable", P.nothing_saveable),
    ]
    note = (f"batch {batch}, {tokens} tokens, width {width}, {heads} heads, MLP {hidden}, f32; "
            f"f32[{batch},{tokens},{width}] = {format_bytes(batch * tokens * width * 4)}, "
            f"scores f32[{batch},{heads},{tokens},{tokens}] = "
            f"{format_bytes(batch * heads * tokens * tokens * 4)}")
    return rp.export_vjp(block, p, x), policies, note
