"""Property test: random programs, every policy, joint and split equal jax.vjp.

A program is a random straight-line composition over a pool of f32[3,4]
values (inputs x and y, with W: f32[4,4] and b: f32[4]) of elementwise ops
(sin, tanh, exp, mul, add), a dot with W, a broadcast of b, a
reshape/transpose, a reduce-sum broadcast back, and checkpoint names. For
every policy the rewritten module must verify, in joint and split form; for a
drawn subset of policies (compiling is what costs time) both forms are
compiled and must match jax.vjp. Set REMAT_HYPOTHESIS=dev for random (not
derandomized) runs with more examples.
"""
from __future__ import annotations

import os

import jax.numpy as jnp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.ad_checkpoint import checkpoint_name
from remat_testlib import assert_trees_close, leaves, reference_vjp, run_joint, run_split

import remat_passes as rp

P = rp.policies

settings.register_profile("remat-ci", max_examples=15, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("remat-dev", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
PROFILE = "remat-dev" if os.environ.get("REMAT_HYPOTHESIS") == "dev" else "remat-ci"

NAMES = ["n0", "n1", "n2", "n3"]


def custom(info):
    if info.checkpoint_name in ("n1", "n3"):
        return P.Offloadable("device", "pinned_host")
    return info.name in ("stablehlo.dot_general", "stablehlo.sine")


POLICIES = {
    "none": None,
    "everything_saveable": P.everything_saveable,
    "nothing_saveable": P.nothing_saveable,
    "dots_saveable": P.dots_saveable,
    "dots_with_no_batch_dims_saveable": P.dots_with_no_batch_dims_saveable,
    "offload_dot_with_no_batch_dims": P.offload_dot_with_no_batch_dims("device", "pinned_host"),
    "save_anything_except_these_names": P.save_anything_except_these_names("n0", "n2"),
    "save_any_names_but_these": P.save_any_names_but_these("n1"),
    "save_only_these_names": P.save_only_these_names("n0", "n3"),
    "save_from_both_policies": P.save_from_both_policies(P.dots_saveable,
                                                         P.save_only_these_names("n1")),
    "save_and_offload_only_these_names": P.save_and_offload_only_these_names(
        names_which_can_be_saved=["n0"], names_which_can_be_offloaded=["n1", "n2"],
        offload_src="device", offload_dst="pinned_host"),
    "custom_callable": custom,
}

OPS = ["sin", "tanh", "exp", "mul", "add", "dot", "bias", "reshape", "rowsum", "name"]

step = st.tuples(st.sampled_from(OPS), st.integers(0, 63), st.integers(0, 63))
program_st = st.lists(step, min_size=2, max_size=9)


def build(program):
    """A function (x, y, W, b) -> (f32[3,4], f32[]) from a list of steps."""
    def fun(x, y, W, b):
        pool = [x, y]
        n_names = 0
        for op, i, j in program:
            u, v = pool[i % len(pool)], pool[j % len(pool)]
            if op == "sin":
                r = jnp.sin(u)
            elif op == "tanh":
                r = jnp.tanh(u)
            elif op == "exp":
                r = jnp.exp(0.1 * u)
            elif op == "mul":
                r = u * v
            elif op == "add":
                r = u + v
            elif op == "dot":
                r = u @ W
            elif op == "bias":
                r = u + jnp.broadcast_to(b, u.shape)
            elif op == "reshape":
                r = u.reshape(2, 6).T.reshape(3, 4)
            elif op == "rowsum":
                r = jnp.broadcast_to(jnp.sum(u, axis=1, keepdims=True), u.shape) * 0.25
            else:  # name
                r = checkpoint_name(u, NAMES[n_names % len(NAMES)])
                n_names += 1
            pool.append(r)
        # every input reaches an output with a nonzero gradient (unused inputs and
        # zero gradients have their own tests in test_remat_structure)
        return pool[-1], jnp.sum(jnp.sin(pool[len(pool) // 2])) + jnp.sum(b * W[0]) \
            + jnp.sum(jnp.tanh(x * y))
    return fun


ARGS = (jnp.linspace(-1.0, 1.0, 12, dtype=jnp.float32).reshape(3, 4),
        jnp.cos(jnp.arange(12, dtype=jnp.float32)).reshape(3, 4) * 0.5,
        (jnp.eye(4, dtype=jnp.float32) * 0.5 + 0.1 * jnp.sin(jnp.arange(16.0).reshape(4, 4))),
        jnp.linspace(0.1, 0.4, 4, dtype=jnp.float32))


@pytest.mark.slow
@settings(settings.get_profile(PROFILE))
@given(program=program_st,
       compiled=st.lists(st.sampled_from(sorted(POLICIES)), min_size=3, max_size=3, unique=True))
def test_random_programs_every_policy(program, compiled):
    fun = build(program)
    module = rp.export_vjp(fun, *ARGS)
    out, ct, grads = reference_vjp(fun, ARGS)
    n_out = len(leaves(out))
    expected = leaves(out) + leaves(grads)
    seen = {}
    for name, policy in POLICIES.items():
        joint = rp.remat(module, policy)
        joint.verify()
        split = rp.remat(module, policy, mode="split")
        split.verify()
        assert {"main_fwd", "main_bwd"} <= set(split.functions())
        assert "remat.name" not in str(joint) and "remat.name" not in str(split)
        # residuals are reported consistently in both forms
        assert [str(r) for r in joint.residuals] == [str(r) for r in split.residuals], name
        if name not in compiled:
            continue
        key = str(joint)
        if key not in seen:
            seen[key] = run_joint(joint, ARGS, ct)
        assert_trees_close(seen[key], expected, what=f"{name} joint {program}")
        got, residuals = run_split(split, ARGS, ct, n_out)
        assert_trees_close(got, expected, what=f"{name} split {program}")
        assert len(residuals) == len(split.residuals)


@pytest.mark.parametrize("program", [
    [("dot", 0, 0), ("name", 2, 0), ("tanh", 3, 0), ("mul", 4, 1), ("rowsum", 5, 0)],
    [("name", 0, 0), ("sin", 2, 0), ("name", 3, 0), ("exp", 4, 0), ("reshape", 5, 0),
     ("bias", 6, 0), ("dot", 7, 0)],
], ids=["dot_name_tanh", "names_chain"])
def test_fixed_programs_all_policies_compile(program):
    """Two fixed programs through every policy, compiled (fast regression net)."""
    fun = build(program)
    module = rp.export_vjp(fun, *ARGS)
    out, ct, grads = reference_vjp(fun, ARGS)
    expected = leaves(out) + leaves(grads)
    seen = {}
    for name, policy in POLICIES.items():
        joint = rp.remat(module, policy)
        key = str(joint)
        if key not in seen:
            seen[key] = run_joint(joint, ARGS, ct)
        assert_trees_close(seen[key], expected, what=f"{name} joint")
    # guard against a policy being ignored: saving everything and nothing differ
    assert str(rp.remat(module, P.everything_saveable)) != str(rp.remat(module, P.nothing_saveable))
    assert len(seen) >= 2
