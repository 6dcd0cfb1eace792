"""Property test: random programs, every policy, joint and split equal jax.vjp.

A program is a random straight-line composition over a pool of f32[3,4]
values (inputs x and y, with W: f32[4,4] and b: f32[4]) of elementwise ops
(sin, tanh, exp, mul, add), a dot with W, a broadcast of b, a
reshape/transpose, a reduce-sum broadcast back, and checkpoint names. For
every policy the rewritten module must verify, in joint and split form; for a
drawn subset of policies (compiling is what costs time) both forms are
compiled and must match jax.vjp.

A second generator (`build_with_regions`) draws from ops with regions and ops
that have rules or corners of their own: `lax.scan` with a named value in its
body, `lax.cond` and `lax.switch` (the branch taken varies), `fori_loop`, a
forward-only `while_loop`, a `jax.checkpoint` region with its own policy,
custom_jvp functions (relu, softplus, logsumexp), gather by a computed
permutation, sort, cumsum/cumprod, dynamic_slice/dynamic_update_slice, where,
an integer path, stop_gradient, pad, concatenate, flip. Every policy, `auto`
budgets included, is rewritten, verified, compiled and compared with jax.vjp
in both forms.

Set REMAT_HYPOTHESIS=dev for random (not derandomized) runs with more
examples.
"""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from jax import lax
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


def exported_and_expected(fun, args):
    """(export_vjp's module, jax.vjp's cotangent, the number of outputs, outputs and grads
    of jax.vjp as one flat list)."""
    out, ct, grads = reference_vjp(fun, args)
    return rp.export_vjp(fun, *args), ct, len(leaves(out)), leaves(out) + leaves(grads)


@pytest.mark.slow
@settings(settings.get_profile(PROFILE))
@given(program=program_st,
       compiled=st.lists(st.sampled_from(sorted(POLICIES)), min_size=3, max_size=3, unique=True))
def test_random_programs_every_policy(program, compiled):
    module, ct, n_out, expected = exported_and_expected(build(program), ARGS)
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
    module, ct, _, expected = exported_and_expected(build(program), ARGS)
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


# ------------------------------------------------- programs with regions and rules --
REGION_OPS = ["sin", "mul", "dot", "name", "scan", "cond", "switch", "fori", "while",
              "checkpoint", "relu", "softplus", "logsumexp", "gather", "sort", "cumsum",
              "cumprod", "max", "where", "intpath", "concat", "dslice", "stopgrad", "pad",
              "flip", "div"]
REGION_POLICIES = {
    "everything_saveable": P.everything_saveable,
    "nothing_saveable": P.nothing_saveable,
    "dots_saveable": P.dots_saveable,
    "save_only_these_names": P.save_only_these_names("n0", "n2"),
    "save_any_names_but_these": P.save_any_names_but_these("n1"),
    "save_anything_except_these_names": P.save_anything_except_these_names("n0"),
    "offload_dot_with_no_batch_dims": P.offload_dot_with_no_batch_dims("device", "pinned_host"),
    "auto_50": P.auto("50%"),
    "auto_minimum": P.auto("0%"),
}
INNER_POLICIES = [jax.checkpoint_policies.nothing_saveable,
                  jax.checkpoint_policies.dots_saveable,
                  jax.checkpoint_policies.save_only_these_names("n1")]


def _region_op(op, u, v, W, k):
    """One step of a region program: a f32[3,4] from two (k picks a variant)."""
    if op == "sin":
        return jnp.sin(u)
    if op == "mul":
        return u * v
    if op == "div":
        return u / (1.5 + jnp.tanh(v))
    if op == "dot":
        return jnp.tanh(u @ W)
    if op == "name":
        return checkpoint_name(u, NAMES[k % 3])
    if op == "relu":                       # custom_jvp
        return jax.nn.relu(u) + 0.1 * u
    if op == "softplus":
        return jax.nn.softplus(u)
    if op == "logsumexp":
        return u - jax.nn.logsumexp(u, axis=1, keepdims=True)
    if op == "gather":                     # rows by a permutation computed from v
        return u[jnp.argsort(v[:, 0])] * 1.1
    if op == "sort":
        return jnp.sort(u, axis=1)
    if op == "cumsum":
        return jnp.cumsum(u, axis=1) * 0.3
    if op == "cumprod":
        return jnp.cumprod(1.0 + 0.1 * jnp.tanh(u), axis=0)
    if op == "max":
        return u + jnp.max(v, axis=0, keepdims=True)
    if op == "where":
        return jnp.where(v > 0, u, jnp.sin(u))
    if op == "intpath":                    # an integer value computed from v scales u
        return u * (1 + (jnp.floor(jnp.abs(v) * 3).astype(jnp.int32) % 3).astype(jnp.float32))
    if op == "concat":
        return jnp.concatenate([u[:, :2], v[:, 2:] * u[:, 2:]], axis=1)
    if op == "dslice":
        i = (jnp.argmax(v[0]) % 2).astype(jnp.int32)
        piece = lax.dynamic_slice(u, (0, i), (u.shape[0], 2))
        return lax.dynamic_update_slice(u * 0.9, jnp.sin(piece), (0, i))
    if op == "stopgrad":
        return u * lax.stop_gradient(v) + u
    if op == "pad":
        return jnp.pad(u[:, 1:], ((0, 0), (0, 1))) + 0.5 * u
    if op == "flip":
        return jnp.flip(u, axis=0) * v
    if op == "scan":                       # a carry f32[4] over v's 3 rows, a named value
        def body(c, row):
            h = checkpoint_name(jnp.tanh(c @ W + row), NAMES[k % 3])
            return h * 0.9 + 0.1 * c, jnp.sin(h)
        c, ys = lax.scan(body, u[0], v)
        return ys + c
    if op == "fori":
        return lax.fori_loop(0, 3, lambda i, h: jnp.sin(h @ W) + h * 0.5, u)
    if op == "while":                      # a loop with no gradient through it
        n = lax.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, s[1] * 0.5),
                           (0, jnp.sum(lax.stop_gradient(v))))[1]
        return u * (1.0 + 0.01 * n)
    if op == "cond":                       # k flips which branch runs
        return lax.cond((jnp.sum(v) > 0) != (k == 1), lambda a, b: jnp.sin(a) * b,
                        lambda a, b: jnp.tanh(a @ W) + b, u, v)
    if op == "switch":                     # four branches, the index computed from v
        i = (jnp.sum(v) > 0).astype(jnp.int32) + k
        return lax.switch(i, [lambda a, b: jnp.exp(0.1 * a) * b, lambda a, b: a @ W * b,
                              lambda a, b: jnp.sin(a) + b, lambda a, b: a * b], u, v)
    if op == "checkpoint":                 # a region with a policy of its own
        def inner(a, b):
            return jnp.tanh(checkpoint_name(jnp.sin(a @ W), "n1")) * b
        return jax.checkpoint(inner, policy=INNER_POLICIES[k % 3])(u, v)
    raise ValueError(op)


def build_with_regions(program):
    """A function (x, y, W) -> (f32[3,4], f32[]) from a list of (op, i, j, k) steps."""
    def fun(x, y, W):
        pool = [x, y]
        for op, i, j, k in program:
            pool.append(_region_op(op, pool[i % len(pool)], pool[j % len(pool)], W, k))
        return pool[-1], jnp.sum(jnp.sin(pool[len(pool) // 2])) + jnp.sum(jnp.tanh(x * y) @ W)
    return fun


def _chain(ops):
    """A program whose every step reads the one before it (and the one before that)."""
    return [(op, t + 1, t, t % 3) for t, op in enumerate(ops)]


# every op at least once, in chains, beside what Hypothesis draws
REGION_EXAMPLES = [
    _chain(["scan", "cond", "fori", "while", "checkpoint", "name", "dot", "gather", "sort"]),
    _chain(["relu", "softplus", "logsumexp", "cumsum", "name", "cumprod", "max", "where",
            "intpath", "cond", "switch"]),
    _chain(["concat", "dslice", "stopgrad", "name", "pad", "flip", "div", "sin", "mul",
            "checkpoint", "scan", "switch", "cond"]),
]
assert {op for program in REGION_EXAMPLES for op, *_ in program} == set(REGION_OPS)

region_step = st.tuples(st.sampled_from(REGION_OPS), st.integers(0, 63), st.integers(0, 63),
                        st.integers(0, 2))


@pytest.mark.slow
@settings(settings.get_profile(PROFILE), max_examples=3 if PROFILE == "remat-ci" else 60)
@given(program=st.lists(region_step, min_size=2, max_size=7))
@example(program=REGION_EXAMPLES[0])
@example(program=REGION_EXAMPLES[1])
@example(program=REGION_EXAMPLES[2])
def test_random_programs_with_regions_every_policy(program):
    args = ARGS[:3]
    module, ct, n_out, expected = exported_and_expected(build_with_regions(program), args)
    seen = {}
    for name, policy in REGION_POLICIES.items():
        try:
            joint = rp.remat(module, policy)
        except rp.RematError as e:         # a loop or a cond keeps some bytes whatever is done
            assert name.startswith("auto") and "of activations, is below the" in str(e), \
                (name, str(e))
            continue
        joint.verify()
        key = str(joint)
        if key not in seen:
            seen[key] = run_joint(joint, args, ct)
        assert_trees_close(seen[key], expected, what=f"{name} joint {program}")
        split = rp.remat(module, policy, mode="split")
        split.verify()
        key = str(split)       # (policies that make the same program: compiled once)
        if key not in seen:
            seen[key] = run_split(split, args, ct, n_out)
        got, residuals = seen[key]
        assert_trees_close(got, expected, what=f"{name} split {program}")
        assert len(residuals) == len(split.residuals), name
