"""The bundled example: an MLP, exported once, rematerialized by policy.

    python examples/mlp.py           # export -> transform -> compile -> run, with reports
    python examples/mlp.py --write   # also regenerate examples/mlp.mlir (the CLI's input)

The model code has no jax.checkpoint in it; it only names each layer's output
with `checkpoint_name`, as real model code often does. For each policy the
joint VJP module goes through `remat_passes.remat`, is compiled with XLA and
run; its gradients are compared with `jax.grad` of the same loss, and the
saved residuals are listed the way `jax.ad_checkpoint.print_saved_residuals`
lists them. Exit status 1 if any gradient disagrees.
"""
from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

import remat_passes as rp

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LAYERS, WIDTH, BATCH = 4, 128, 32


def layer(W, b, x):
    return jnp.tanh(x @ W + b)


def predict(params, x):
    for i, (W, b) in enumerate(params):
        x = layer(W, b, x)
        x = checkpoint_name(x, f"layer{i}_output")
    return x


def loss(params, x):
    return jnp.sum(predict(params, x) ** 2)


def make_inputs(seed=0):
    keys = jax.random.split(jax.random.PRNGKey(seed), 2 * LAYERS + 1)
    params = [(jax.random.normal(keys[2 * i], (WIDTH, WIDTH)) / np.sqrt(WIDTH),
               jax.random.normal(keys[2 * i + 1], (WIDTH,)) * 0.1) for i in range(LAYERS)]
    x = jax.random.normal(keys[-1], (BATCH, WIDTH))
    return params, x


POLICIES = {
    "none (save everything)": None,
    "nothing_saveable": rp.policies.nothing_saveable,
    "dots_saveable": rp.policies.dots_saveable,
    "save_only_these_names(layer0_output, layer2_output)":
        rp.policies.save_only_these_names("layer0_output", "layer2_output"),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="regenerate examples/mlp.mlir")
    args = ap.parse_args(argv)

    params, x = make_inputs()
    print(f"export: joint VJP of an MLP ({LAYERS} layers, width {WIDTH}, batch {BATCH})")
    module = rp.export_vjp(loss, params, x)
    if args.write:
        text = module.text(debug_info=True).replace(ROOT + os.sep, "")
        with open(os.path.join(HERE, "mlp.mlir"), "w") as f:
            f.write(text)
        print("wrote examples/mlp.mlir")

    ref_grads = jax.grad(loss)(params, x)
    ref_flat = jax.tree_util.tree_leaves(ref_grads)
    ok = True
    for label, policy in POLICIES.items():
        out = rp.remat(module, policy)          # partial-eval + strip-checkpoint-names
        results = out.call(params, x, jnp.float32(1.0))  # compile with XLA and run
        grads = jax.tree_util.tree_leaves(results[1])
        err = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(grads, ref_flat))
        # f32 rtol 1e-5; the absolute floor scales with the gradient's magnitude, since
        # XLA's fusion reorders sums (jax.jit(jax.grad) differs from eager by as much).
        agree = all(np.allclose(a, b, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(b))))
                    for a, b in zip(grads, ref_flat))
        ok &= agree
        nbytes = sum(r.bytes for r in out.residuals)
        print(f"\npolicy {label}: {len(out.residuals)} residuals, {nbytes} bytes; "
              f"max |grad - jax.grad| = {err:.2e} {'OK' if agree else 'MISMATCH'}")
        for r in out.residuals:
            print(f"  {r}")
    print("\nall gradients match jax.grad" if ok else "\nGRADIENT MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
