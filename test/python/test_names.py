"""Checkpoint names that survive export, and names that match nothing.

`jax.export` lowers `checkpoint_name` to nothing, so a names policy on a plain
export of a training step finds no names. `rp.export` (or `jax.export` inside
`rp.names_as_markers()`) keeps them; a names policy whose names no value has
says so in a remark (`.remarks`, and on stderr from the CLI).
"""
from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import export as jax_export
from jax.ad_checkpoint import checkpoint_name
from remat_testlib import assert_same_residual_types, assert_trees_close, run_process

import remat_passes as rp

JP = jax.checkpoint_policies


def loss(W, x):
    h = checkpoint_name(jnp.sin(x @ W), "h")
    g = checkpoint_name(jnp.tanh(h @ W), "g")
    return jnp.sum(jnp.cos(g @ W))


def step(W, x):
    """A training step: the gradient is computed inside the exported function."""
    value, grad = jax.value_and_grad(loss)(W, x)
    return value, W - 0.1 * grad


def args():
    rng = np.random.default_rng(0)
    return (jnp.asarray(rng.normal(size=(4, 4)) * 0.5, jnp.float32),
            jnp.asarray(rng.normal(size=(3, 4)), jnp.float32))


def test_export_keeps_names_of_a_training_step():
    """rp.export: save_only_these_names('h') saves what jax.checkpoint saves for the same
    policy, with no remark, and the step computes what the original step computes."""
    a = args()
    m = rp.export(step, *a)
    out = rp.remat(m, rp.policies.save_only_these_names("h"))
    assert not any("named" in r or "names" in r for r in out.remarks), out.remarks
    assert_same_residual_types(out.residuals,
                               jax.checkpoint(loss, policy=JP.save_only_these_names("h")), *a,
                               context="rp.export train step")
    assert_trees_close(out.call(*a), jax.jit(step)(*a))


def test_plain_export_loses_names_and_says_so():
    """Plain jax.export: the policy acts as nothing_saveable, and the remark says why and
    how to keep the names."""
    a = args()
    m = rp.from_exported(jax_export.export(jax.jit(step))(*a))
    out = rp.remat(m, rp.policies.save_only_these_names("h"))
    nothing = rp.remat(m, "nothing_saveable")
    assert [str(r.type) for r in out.residuals] == [str(r.type) for r in nothing.residuals]
    remark = [r for r in out.remarks if "no checkpoint names at all" in r]
    assert remark and "'h'" in remark[0] and "rp.export" in remark[0], out.remarks


def test_names_as_markers_keeps_names_in_a_plain_export():
    a = args()
    with rp.names_as_markers():     # (a function JAX has not lowered before: see the docs)
        exp = jax_export.export(jax.jit(lambda W, x: step(W, x)), disabled_checks=[
            jax_export.DisabledSafetyCheck.custom_call("remat.name")])(*a)
    out = rp.remat(rp.from_exported(exp), rp.policies.save_only_these_names("h"))
    exported = rp.remat(rp.export(step, *a), rp.policies.save_only_these_names("h"))
    assert sorted(map(str, out.residuals)) == sorted(map(str, exported.residuals))
    assert not any("names" in r for r in out.remarks), out.remarks


def test_misspelled_name_lists_the_names_there_are():
    a = args()
    out = rp.remat(rp.export_vjp(loss, *a),
                   rp.policies.save_from_both_policies(rp.policies.dots_saveable,
                                                       rp.policies.save_only_these_names("hh")))
    remark = [r for r in out.remarks if "is named 'hh'" in r]
    assert remark and "'g', 'h'" in remark[0], out.remarks
    # every name present: no remark
    ok = rp.remat(rp.export_vjp(loss, *a), rp.policies.save_any_names_but_these("g", "h"))
    assert not any("named" in r for r in ok.remarks), ok.remarks


def test_cli_prints_the_remark_on_stderr(tmp_path):
    a = args()
    path = tmp_path / "step.mlir"
    path.write_text(rp.from_exported(jax_export.export(jax.jit(step))(*a)).text(debug_info=True))
    run = run_process([sys.executable, "-m", "remat_passes.cli", str(path),
                          "--remat=policy=save_only_these_names(h)", "-o",
                          str(tmp_path / "out.mlir")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "remark:" in run.stderr and "no checkpoint names at all" in run.stderr, run.stderr
    assert (tmp_path / "out.mlir").exists()
