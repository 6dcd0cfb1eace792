"""Model families for the scaling benchmark: each takes a depth `n` and grows linearly with it.

Every family returns `(fun, args)`; the joint module is `rp.export_vjp(fun, *args)`.
Widths are tiny on purpose: the scaling benchmark measures pass time and memory
against the number of ops, not FLOPs. Names: every family names its layer outputs
`layer<i>` with `checkpoint_name`, so the names policy has something to keep.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

import remat_passes as rp

D = 4          # feature width
B = 2          # batch
N_W = 8        # distinct weight matrices, reused round robin


def _weights(n=N_W, d=D):
    return jnp.ones((n, d, d), jnp.float32) * 0.1


def chain_names(n):
    """A long chain of small layers, each output named."""
    def f(W, x):
        h = x
        for i in range(n):
            h = checkpoint_name(jnp.sin(jnp.tanh(h @ W[i % N_W])), f"layer{i}")
        return jnp.sum(h)
    return f, (_weights(), jnp.ones((B, D), jnp.float32))


def fanout(n):
    """One forward value (c) read by every layer, forward and backward."""
    def f(W, x):
        c = jnp.cos(x)
        h = x
        for i in range(n):
            h = checkpoint_name(jnp.tanh(h @ W[i % N_W] + c), f"layer{i}")
        return jnp.sum(h)
    return f, (_weights(), jnp.ones((B, D), jnp.float32))


def elementwise(n):
    """A deep elementwise chain (no dots)."""
    def f(x):
        h = x
        for i in range(n):
            h = checkpoint_name(jnp.sin(h) * jnp.cos(h) + h, f"layer{i}")
        return jnp.sum(h)
    return f, (jnp.ones((B, D), jnp.float32),)


def transformer(n, tokens=4, heads=2):
    """n pre-LN transformer blocks: layer norm, softmax attention, gelu MLP."""
    def ln(h):
        mu = h.mean(-1, keepdims=True)
        return (h - mu) * jax.lax.rsqrt(((h - mu) ** 2).mean(-1, keepdims=True) + 1e-5)

    def f(W, x):
        h = x
        for i in range(n):
            w = W[i % N_W]
            a = ln(h)
            q, k, v = a @ w, a @ w.T, a @ (w * 0.5)
            q = q.reshape(B, tokens, heads, D // heads)
            k = k.reshape(B, tokens, heads, D // heads)
            v = v.reshape(B, tokens, heads, D // heads)
            s = jnp.einsum("bqhd,bkhd->bhqk", q, k)
            o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)
            h = h + checkpoint_name(o.reshape(B, tokens, D) @ w, f"layer{i}")
            h = h + jax.nn.gelu(ln(h) @ w)
        return jnp.sum(h)
    return f, (_weights(), jnp.ones((B, tokens, D), jnp.float32))


def scan_body(n, steps=8):
    """lax.scan over `steps` layers whose body is a chain of n sub-layers."""
    def layer(h, w):
        for j in range(n):
            h = checkpoint_name(jnp.sin(jnp.tanh(h @ w)) * 0.9, f"layer{j}")
        return h, None

    def f(Ws, x):
        return jnp.sum(jax.lax.scan(layer, x, Ws)[0])
    return f, (_weights(steps), jnp.ones((B, D), jnp.float32))


def nested_regions(n):
    """rp.checkpoint regions three deep: n outer blocks of 2 middle blocks of 2 inner ones."""
    def inner(h, w, i):
        return checkpoint_name(jnp.sin(h @ w), f"layer{i}")

    def middle(h, w, i):
        for j in range(2):
            h = rp.checkpoint(inner, policy=rp.policies.dots_saveable)(h, w, 4 * i + 2 * j)
        return h

    def outer(h, w, i):
        for j in range(2):
            h = rp.checkpoint(middle, policy=rp.policies.save_only_these_names("layer0"))(
                h, w, 2 * i + j)
        return jnp.tanh(h)

    def f(W, x):
        h = x
        for i in range(n):
            h = rp.checkpoint(outer)(h, W[i % N_W], i)
        return jnp.sum(h)
    return f, (_weights(), jnp.ones((B, D), jnp.float32))


def jitted_calls(n):
    """Many calls of small jitted functions (func.call ops for the inline pass)."""
    @jax.jit
    def layer(h, w):
        return jnp.sin(jnp.tanh(h @ w))

    @jax.jit
    def pair(h, w):
        return layer(layer(h, w), w.T)

    def f(W, x):
        h = x
        for i in range(n):
            h = checkpoint_name(pair(h, W[i % N_W]), f"layer{i}")
        return jnp.sum(h)
    return f, (_weights(), jnp.ones((B, D), jnp.float32))


def conds(n):
    """A chain of `lax.cond`s, each choosing between two small layers."""
    def f(W, x):
        h = x
        for i in range(n):
            w = W[i % N_W]
            h = checkpoint_name(jax.lax.cond(jnp.sum(h) > 0, lambda h: jnp.sin(jnp.tanh(h @ w)),
                                             lambda h: jnp.cos(h @ w), h), f"layer{i}")
        return jnp.sum(h)
    return f, (_weights(), jnp.ones((B, D), jnp.float32))


def scans(n, steps=2):
    """A chain of `lax.scan`s, each over `steps` small layers (a deep RNN, say)."""
    def f(Ws, x):
        h = x
        for i in range(n):
            h = checkpoint_name(jax.lax.scan(lambda c, w: (jnp.sin(c @ w), None), h, Ws)[0],
                                f"layer{i}")
        return jnp.sum(h)
    return f, (_weights(steps), jnp.ones((B, D), jnp.float32))


FAMILIES = {
    "chain-names": chain_names,
    "fan-out": fanout,
    "elementwise": elementwise,
    "transformer": transformer,
    "scan-body": scan_body,
    "nested-regions": nested_regions,
    "jitted-calls": jitted_calls,
    "conds": conds,
    "scans": scans,
}

DESCRIPTIONS = {
    "chain-names": "long chain `h = name(sin(tanh(h @ W)))`",
    "fan-out": "every layer reads one forward value `c = cos(x)`",
    "elementwise": "deep chain `h = name(sin(h) * cos(h) + h)`, no dots",
    "transformer": "pre-LN blocks: layer norm, 2-head softmax attention, gelu MLP",
    "scan-body": "`lax.scan` over 8 layers, body a chain of n sub-layers",
    "nested-regions": "`rp.checkpoint` regions nested three deep",
    "jitted-calls": "calls of small `jax.jit` functions (inlined first)",
    "conds": "a chain of `lax.cond`s between two small layers",
    "scans": "a chain of `lax.scan`s, each over 2 small layers",
}
