"""The passes talk to each other only through the module: each step of the default pipeline
run alone by `remat-opt`, from a file to a file, ends where `rp.remat` (one pipeline run,
analyses and state shared) ends, text for text."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import remat_passes as rp
from remat_passes import cli
from remat_passes.passes.remat import Remat
from remat_passes.policy.policies import as_policy


def mlp(W1, W2, x):
    h = rp.checkpoint_name(jnp.sin(x @ W1), "h")
    return jnp.sum(jnp.tanh(h @ W2) ** 2)


def scanned(W, xs):
    def body(c, x):
        c = jnp.tanh(c @ W + x)
        return c, jnp.sin(c)
    c, ys = jax.lax.scan(body, xs[0], xs)
    return jnp.sum(c) + jnp.sum(ys ** 2)


def branches(x, W):
    y = jax.lax.cond(jnp.sum(x) > 0, lambda v: jnp.sin(v @ W), lambda v: jnp.cos(v) @ W, x)
    return jnp.sum(y * y)


def bf16_region(W1, W2, x):
    """A checkpoint region in bf16: what insert-reduce-precision rounds depends on where the
    region is, which must be read from the module."""
    inner = rp.checkpoint(lambda a: jnp.sin(a @ W1) @ W2, policy="dots_saveable")
    return jnp.sum(jnp.tanh(inner(x)).astype(jnp.float32))


def _args(name):
    k = jax.random.split(jax.random.key(0), 3)
    if name == "mlp":
        return (jax.random.normal(k[0], (8, 16)), jax.random.normal(k[1], (16, 4)),
                jax.random.normal(k[2], (4, 8)))
    if name == "scanned":
        return jax.random.normal(k[0], (8, 8)) * 0.3, jax.random.normal(k[1], (5, 8))
    if name == "branches":
        return jax.random.normal(k[0], (4, 8)), jax.random.normal(k[1], (8, 8))
    return tuple(jax.random.normal(k[i], s).astype(jnp.bfloat16)
                 for i, s in enumerate([(8, 16), (16, 8), (4, 8)]))


PROGRAMS = {"mlp": mlp, "scanned": scanned, "branches": branches, "bf16_region": bf16_region}
CASES = [(name, policy, mode)
         for name in PROGRAMS
         for policy in ("nothing_saveable", "dots_saveable", "save_only_these_names('h')",
                        "auto")
         for mode in ("joint", "split")]


@pytest.fixture(scope="module")
def modules():
    return {name: rp.export_vjp(f, *_args(name)) for name, f in PROGRAMS.items()}


def _tight_auto(module) -> str:
    """auto at the smallest of a few budgets this module's plan can meet (so it recomputes)."""
    for percent in (50, 70, 90, 95, 99, 100):
        spec = f"auto(budget={percent}%)"
        try:
            rp.remat(module, spec)
            return spec
        except rp.RematError:
            continue
    raise AssertionError("no budget fits")


@pytest.mark.parametrize("name,policy,mode", CASES)
def test_passes_one_by_one_through_files_equal_the_pipeline(modules, tmp_path, capsys,
                                                            name, policy, mode):
    module = modules[name]
    if policy == "auto":
        policy = _tight_auto(module)
    expected = str(rp.remat(module, policy, mode=mode))
    path = tmp_path / "step0.mlir"
    module.save(str(path))
    steps = Remat(policy=as_policy(policy), mode=mode).expand()
    for n, step in enumerate(steps, 1):
        out = tmp_path / f"step{n}.mlir"
        code = cli.main([str(path), f"--pass-pipeline=builtin.module({step.spec()})",
                         "-o", str(out), "--mlir-print-debuginfo"])
        assert code == 0, f"{step.spec()}: {capsys.readouterr().err}"
        path = out
    assert str(rp.load(str(path))) == expected
