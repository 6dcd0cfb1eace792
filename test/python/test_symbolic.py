"""Symbolic shapes (`jax.export.symbolic_shape`): the default pipeline compiles a
symbolic-batch training step, which then runs for several batch sizes with the same
results as the step itself; reports print dynamic dimensions as `?`."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export as jax_export

import remat_passes as rp
from remat_testlib import assert_trees_close


def loss(W, x):
    h = jnp.sin(x @ W)
    return jnp.sum(jnp.tanh(h @ W))


def step(W, x):
    value, grad = jax.value_and_grad(loss)(W, x)
    return value, W - 0.1 * grad


@pytest.mark.parametrize("policy", ["nothing_saveable", "dots_saveable", None])
def test_symbolic_batch_step_compiles_and_runs_for_several_batches(policy):
    (b,) = jax_export.symbolic_shape("b")
    W = jnp.asarray(np.random.default_rng(0).normal(size=(4, 4)) * 0.5, jnp.float32)
    exp = jax_export.export(jax.jit(step))(W, jax.ShapeDtypeStruct((b, 4), jnp.float32))
    out = rp.remat(rp.from_exported(exp), policy)
    for n in (1, 3, 8):
        x = jnp.asarray(np.random.default_rng(n).normal(size=(n, 4)), jnp.float32)
        assert_trees_close(out.call(W, x), jax.jit(step)(W, x))
    if policy == "nothing_saveable":
        assert "optimization_barrier" in str(out)      # the data values are still behind one


def test_dynamic_dimensions_print_as_question_marks():
    (b,) = jax_export.symbolic_shape("b")
    m = rp.export_vjp(loss, jax.ShapeDtypeStruct((4, 4), jnp.float32),
                      jax.ShapeDtypeStruct((b, 4), jnp.float32))
    res = rp.saved_residuals(m, policy="nothing_saveable")
    x = [r for r in res if r.type == "f32[?,4]"]
    assert len(x) == 1 and "16 bytes per unit" in str(x[0]), [str(r) for r in res]
    assert all("-9223372036854775808" not in str(r) for r in res)
