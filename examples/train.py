"""Training with remat: a small decoder trained with optax AdamW through `rp.jit`, beside
`jax.jit`.

    python examples/train.py                      # keep the two names, recompute the rest
    python examples/train.py --policy nothing_saveable --mode split

The model names two activations per layer (`attn`, `mlp`) with `checkpoint_name`; it has
no `jax.checkpoint` in it. `rp.jit(step, policy=...)` exports the step once per input
signature, rematerializes it and compiles it; the loop calls it like `jax.jit(step)`.
Printed: both loss curves, what the forward keeps for the backward, and XLA's
`memory_analysis()` of the executables that ran (on CPU the rewrite ties each
recomputation to the cotangent, so XLA:CPU keeps it: the temp bytes fall below jax.jit's).
Exit status 1 if the losses differ.
"""
from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.ad_checkpoint import checkpoint_name

import remat_passes as rp

D, HEADS, T, BATCH, LAYERS, STEPS = 64, 4, 32, 8, 3, 30


def init(key):
    def dense(k, n, m):
        return jax.random.normal(k, (n, m)) / np.sqrt(n)
    keys = [jax.random.split(jax.random.fold_in(key, i), 4) for i in range(LAYERS)]
    return [{"qkv": dense(k[0], D, 3 * D), "out": dense(k[1], D, D),
             "w1": dense(k[2], D, 4 * D), "w2": dense(k[3], 4 * D, D)} for k in keys]


def rms(x):
    return x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)


def loss(params, x, y):
    h = x
    causal = jnp.tril(jnp.ones((T, T), bool))
    for p in params:
        q, k, v = (a.reshape(BATCH, T, HEADS, D // HEADS)
                   for a in jnp.split(rms(h) @ p["qkv"], 3, axis=-1))
        scores = jnp.einsum("bthd,bshd->bhts", q, k) / np.sqrt(D // HEADS)
        weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
        attn = jnp.einsum("bhts,bshd->bthd", weights, v).reshape(BATCH, T, D)
        h = h + checkpoint_name(attn @ p["out"], "attn")
        h = h + checkpoint_name(jax.nn.gelu(rms(h) @ p["w1"]), "mlp") @ p["w2"]
    return jnp.mean((h - y) ** 2)


OPT = optax.adamw(3e-3)


def step(params, opt_state, batch):
    value, grads = jax.value_and_grad(loss)(params, *batch)
    updates, opt_state = OPT.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value


def batches():
    """A fixed task: predict a fixed random linear map of the input."""
    target = jax.random.normal(jax.random.key(7), (D, D)) / np.sqrt(D)
    for i in range(STEPS):
        x = jax.random.normal(jax.random.fold_in(jax.random.key(1), i), (BATCH, T, D))
        yield x, x @ target


def train(step_fn):
    params = init(jax.random.key(0))
    state = OPT.init(params)
    losses = []
    for batch in batches():
        params, state, value = step_fn(params, state, batch)
        losses.append(float(value))
    return losses


def memory(compiled) -> str:
    m = compiled.memory_analysis()
    return (f"temp {m.temp_size_in_bytes:,} B, arguments {m.argument_size_in_bytes:,} B, "
            f"outputs {m.output_size_in_bytes:,} B")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", default="save_only_these_names('attn', 'mlp')")
    ap.add_argument("--mode", default="auto", choices=["auto", "joint", "split"])
    args = ap.parse_args(argv)

    reference = jax.jit(step)
    ours = rp.jit(step, policy=args.policy, mode=args.mode)
    ref_losses, our_losses = train(reference), train(ours)

    print(f"step | jax.jit | rp.jit(policy={args.policy})")
    for i in range(0, STEPS, 5):
        print(f"{i:4d} | {ref_losses[i]:.6f} | {our_losses[i]:.6f}")
    params = init(jax.random.key(0))
    sample = (params, OPT.init(params), next(batches()))
    lowered = ours.lower(*sample)
    print(f"\nrp.jit compiled the step {ours.builds} time(s) for {STEPS} calls; form: "
          f"{lowered.mode} (mode={args.mode}, backend {jax.default_backend()})")
    acts = [r for r in lowered.residuals if not r.argument]
    print(f"the forward keeps {len(lowered.residuals)} values for the backward: "
          f"{len(lowered.residuals) - len(acts)} arguments and {len(acts)} activations "
          f"({sum(r.bytes for r in acts):,} B)")
    for r in acts[:8]:
        print(f"  {r}")
    print("\nXLA's memory_analysis() of what ran:")
    print(f"  {'jax.jit(step):':18s}{memory(reference.lower(*sample).compile())}")
    for name, compiled in zip(("joint",) if lowered.mode == "joint" else ("forward", "backward"),
                              lowered.executables):
        print(f"  {'rp.jit ' + name + ':':18s}{memory(compiled)}")
    ok = np.allclose(our_losses, ref_losses, rtol=2e-5)
    print("\nlosses " + ("match jax.jit" if ok else "DIFFER from jax.jit"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
