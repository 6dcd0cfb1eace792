#!/usr/bin/env python
"""Figures: static peak memory of a joint VJP, no remat vs. remat policies.

Not a test. Exports two models with `remat_passes.export_vjp`, runs
`remat_passes.remat` with each policy in joint and split form, and prints a
Markdown table per model of `remat_passes.memory.estimate_memory` figures:

* joint peak: the peak of live bytes of @main run in program order (the
  static estimate of DESIGN.md section 5: XLA:CPU undoes remat, so the joint
  form cannot be measured by compiling it on CPU);
* split: the peaks of @main_fwd and @main_bwd and the residual bytes
  @main_fwd returns (what is kept between the two calls);
* the "early" row: the same recomputation as the first policy row, moved to
  the start of the backward (what just-in-time placement avoids).

Models:
  mlp          8 layers, width 256, batch 64, tanh, checkpoint_name(h, "layer<i>")
  transformer  one block: 4 heads, 128 tokens, width 256, batch 4, MLP 1024
               (gelu), names q, k, v, attn_out, mlp_hidden; VJP of its output

    python tools/memory_figures.py [--out figures.md]
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.ad_checkpoint import checkpoint_name  # noqa: E402

import remat_passes as rp  # noqa: E402
from remat_passes import contract, graph  # noqa: E402
from remat_passes.analysis import FunctionAnalysis  # noqa: E402
from remat_passes.memory import estimate_memory, format_bytes  # noqa: E402

P = rp.policies


# ------------------------------------------------------------------ models --
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


# ------------------------------------------------------------------- early --
def partial_eval_only(module, policy):
    """remat-partial-eval alone: the recompute clones keep their remat.recompute marks."""
    from remat_passes.policies import as_policy
    out = module.clone()
    spec = as_policy(policy).spec
    rp.run_pipeline(out.op, rp.parse_pipeline(
        f"builtin.module(remat-partial-eval{{policy={spec}}})"))
    return out


def early_variant(module, policy):
    """(module, clones moved): remat-partial-eval alone, then every recompute clone moved,
    in order, before the first other backward op (recomputation placed early)."""
    out = partial_eval_only(module, policy)
    a = FunctionAnalysis(graph.find_func(out.op, "main"))
    clones = [op for op in a.ops if contract.is_recompute_clone(op)]
    first = next(op for pos, op in enumerate(a.ops)
                 if a.backward[pos] and not contract.is_recompute_clone(op))
    for op in clones:
        op.move_before(first)
    out.verify()
    return out, len(clones)


# ------------------------------------------------------------------- table --
def _mib(n: int) -> str:
    return f"{n / 2**20:.2f}"


def table(name, module, policies, note) -> str:
    rows = []
    base = None
    for label, policy in policies:
        joint = estimate_memory(rp.remat(module, policy))["main"]
        split = estimate_memory(rp.remat(module, policy, mode="split"))
        base = joint.peak_bytes if base is None else base
        rows.append((label, joint.peak_bytes, split["main_fwd"].peak_bytes,
                     split["main_bwd"].peak_bytes, split.residual_bytes))
    first_policy = policies[1]
    early = estimate_memory(early_variant(module, first_policy[1])[0])["main"].peak_bytes
    args = estimate_memory(rp.remat(module, None))["main"].argument_bytes
    out = [f"**{name}** ({note}); arguments {_mib(args)} MiB; all figures MiB", "",
           "| policy | joint peak | vs. no remat | split fwd peak | split bwd peak | residuals |",
           "|---|---:|---:|---:|---:|---:|"]
    for label, jp, fp, bp, res in rows:
        delta = "" if jp == base else f"{(jp - base) / 2**20:+.2f}"
        out.append(f"| {label} | {_mib(jp)} | {delta} | {_mib(fp)} | {_mib(bp)} | {_mib(res)} |")
    out.append(f"| {first_policy[0]}, recomputation placed early | {_mib(early)} | "
               f"{(early - base) / 2**20:+.2f} | | | |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="also write the Markdown to this file")
    args = ap.parse_args(argv)
    parts = ["Static peak memory (remat_passes.memory.estimate_memory: program order, "
             "no buffer reuse, device bytes)."]
    for name, build in (("8-layer MLP", mlp_model), ("Transformer block", transformer_model)):
        module, policies, note = build()
        parts.append(table(name, module, policies, note))
    text = "\n\n".join(parts) + "\n"
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
