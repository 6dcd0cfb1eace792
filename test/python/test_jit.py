"""rp.jit: a training step with remat, used like jax.jit.

A small decoder-like model trained with optax AdamW: the same losses and parameters as
`jax.jit(step)` over 30 steps in both forms, the step's own pytrees, one compilation per
signature, donation as in jax.jit."""
from __future__ import annotations

import json
import os
import re
import threading

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import remat_passes as rp
from remat_passes import jax_compat
from remat_passes.api import jit as rp_jit, variants as jit_variants
from remat_passes.core.residuals import activation_bytes
from remat_passes.ir.mlir import RematError
from remat_passes.jax import run as jax_run
from remat_testlib import assert_trees_close, compiling_threads, run_process
from tools.benchmarks import common

D, LAYERS, BATCH = 32, 3, 16
OPT = optax.adamw(1e-3)


def init(key):
    keys = jax.random.split(key, LAYERS)
    return [{"w1": jax.random.normal(k, (D, 4 * D)) / np.sqrt(D),
             "w2": jax.random.normal(jax.random.fold_in(k, 1), (4 * D, D)) / np.sqrt(4 * D),
             "scale": jnp.ones((D,))} for k in keys]


def loss(params, x, y):
    h = x
    for p in params:
        n = h / jnp.sqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-6) * p["scale"]
        a = rp.checkpoint_name(jax.nn.gelu(n @ p["w1"]), "act")
        h = h + rp.checkpoint_name(a @ p["w2"], "out")
    return jnp.mean((h - y) ** 2)


def make_step(loss_fn):
    def step(params, opt_state, batch):
        value, grads = jax.value_and_grad(loss_fn)(params, *batch)
        updates, opt_state = OPT.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, {"loss": value,
                                                                 "step": opt_state[0].count}
    return step


def step(params, opt_state, batch):
    value, grads = jax.value_and_grad(loss)(params, *batch)
    updates, opt_state = OPT.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, {"loss": value,
                                                             "step": opt_state[0].count}


def batches(n):
    key = jax.random.key(1)
    for i in range(n):
        kx, ky = jax.random.split(jax.random.fold_in(key, i))
        yield jax.random.normal(kx, (BATCH, D)), jax.random.normal(ky, (BATCH, D))


def train(step_fn, n=30):
    params = init(jax.random.key(0))
    state = OPT.init(params)
    losses = []
    for batch in batches(n):
        params, state, metrics = step_fn(params, state, batch)
        losses.append(float(metrics["loss"]))
    return params, state, metrics, losses


@pytest.fixture(scope="module")
def reference():
    return train(jax.jit(step))


JAX_POLICIES = {"nothing_saveable": jax.checkpoint_policies.nothing_saveable,
                "save_only_these_names('act')":
                    jax.checkpoint_policies.save_only_these_names("act")}


def assert_trained_alike(got, want, atol):
    params, state, metrics, losses = got
    ref_params, ref_state, ref_metrics, ref_losses = want
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-5)
    assert jax.tree.structure(params) == jax.tree.structure(ref_params)
    assert jax.tree.structure(state) == jax.tree.structure(ref_state)
    assert jax.tree.structure(metrics) == jax.tree.structure(ref_metrics)
    for a, b in zip(jax.tree.leaves((params, state)), jax.tree.leaves((ref_params, ref_state))):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=atol)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["joint", "split"])
@pytest.mark.parametrize("policy", ["nothing_saveable", "save_only_these_names('act')",
                                    "auto(budget=50%)"])
def test_training_equals_jax_jit(reference, policy, mode):
    """Losses equal jax.jit's (rtol 2e-5); parameters too, within what recomputation
    changes in the last bits (a recomputed reduction is fused differently by XLA; AdamW
    divides by the gradient's scale, so a last-bit change of a tiny gradient moves its
    parameter by up to ~1e-6 over 30 steps). Against jax.jit of the step with
    `jax.checkpoint(loss, policy)`, JAX's own remat of the same policy, within 1e-6."""
    jitted = rp.jit(step, policy=policy, mode=mode)
    got = train(jitted)
    assert_trained_alike(got, reference, atol=1e-5)
    if policy in JAX_POLICIES:
        ckpt = make_step(jax.checkpoint(loss, policy=JAX_POLICIES[policy]))
        assert_trained_alike(got, train(jax.jit(ckpt)), atol=1e-6)
    params, state, metrics, _ = got
    assert int(metrics["step"]) == 30
    assert jitted.builds == 1        # one export, remat and compilation for 30 calls
    lowered = jitted.lower(params, state, next(batches(1)))
    assert lowered.mode == mode and len(lowered.executables) == (1 if mode == "joint" else 2)
    if policy == "nothing_saveable":   # the forward keeps no activation then
        assert activation_bytes(lowered.residuals) == 0, lowered.residuals


@pytest.mark.slow
def test_objective_peak_checks_its_plan_inside_rp_jit(reference):
    """auto(objective=peak) in rp.jit: the trial plans, and the compile of the plan chosen
    that holds it to the budget as XLA allocates it, run inside rp.jit's build; the step
    trains as jax.jit's does. The budget is one XLA can meet: on this small step no plan
    compiles below no remat's footprint (598,596 B with jax 0.12, 99.0% of its estimate:
    at 99% the build took the least of the plans compiled, above the budget, or, where no
    plan's estimate fit either, refused the budget)."""
    jitted = rp.jit(step, policy="auto(99.5%, objective=peak)", mode="joint")
    params, state, _, losses = train(jitted, n=5)
    np.testing.assert_allclose(losses, reference[3][:5], rtol=2e-5)
    assert jitted.builds == 1
    lowered = jitted.lower(params, state, next(batches(1)))
    assert any("auto(budget=99.5%, objective=peak) (residual budget" in r
               for r in lowered.remarks), lowered.remarks
    assert not any("above the budget" in r or "none within the budget" in r
                   for r in lowered.remarks), lowered.remarks


def test_split_saves_what_the_policy_saves():
    """The residuals that cross from the forward executable to the backward one are the
    policy's (the names it saves, not the others)."""
    params = init(jax.random.key(0))
    state = OPT.init(params)
    lowered = rp.jit(step, policy="save_only_these_names('act')", mode="split").lower(
        params, state, next(batches(1)))
    named = [r.description for r in lowered.residuals if r.description.startswith("named")]
    assert named and all("'act'" in d for d in named), named
    assert lowered.executables[0].memory_analysis() is not None


@pytest.mark.parametrize("mode", ["joint", "split"])
def test_a_steps_optimizer_terms_of_its_own_state_are_not_residuals(mode):
    """AdamW's terms of the optimizer state and the parameters alone (b1 * mu, b2 * nu, the
    weight decay's wd * params), outside the differentiated loss, are computed where the
    update needs them, as under jax.jit; under everything_saveable they were residuals (in
    split form handed from the forward executable to the backward one): 5 tensors the size
    of the parameters. What the step keeps beyond its arguments is the loss's own, what
    `jax.checkpoint(loss, everything_saveable)` saves beyond its arguments (one scalar more:
    the step count + 1, which the step also returns)."""
    params = init(jax.random.key(0))
    state = OPT.init(params)
    batch = next(batches(1))
    lowered = rp.jit(step, policy="everything_saveable", mode=mode).lower(params, state, batch)
    kept = [r for r in lowered.residuals if not r.argument]
    assert not [r for r in kept if "optax" in str(r) and r.bytes > 4], kept
    saved = jax_compat.jax_saved_residuals(
        jax.checkpoint(loss, policy=jax.checkpoint_policies.everything_saveable),
        params, *batch)
    theirs = sum(int(np.prod(a.shape)) * a.dtype.itemsize for a, where in saved
                 if "from the argument" not in where)
    assert activation_bytes(lowered.residuals) <= theirs + 4
    assert_trees_close(lowered.run(params, state, batch), jax.jit(step)(params, state, batch),
                       rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["joint", "split"])
def test_donated_arguments_are_deleted(mode):
    params = init(jax.random.key(0))
    state = OPT.init(params)
    jitted = rp.jit(step, policy="nothing_saveable", mode=mode, donate_argnums=(0, 1))
    batch = next(batches(1))
    expected = jax.jit(step)(params, state, batch)
    out = jitted(params, state, batch)
    assert all(x.is_deleted() for x in jax.tree.leaves((params, state)))
    assert not any(x.is_deleted() for x in batch)
    for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(expected)):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("policy", ["dots_saveable", "everything_saveable"])
def test_split_donation_warns_no_more_than_jax_jit(policy):
    """A donated argument only the forward reads is donated to it where one of its outputs
    can take the buffer: donating the weights of a gradient step to a forward that returns
    none of their shape made JAX warn 'Some donated buffers were not usable' at every
    build, where jax.jit of the same step is silent. The arguments are still deleted."""
    import warnings

    def grads(p, x):
        return jax.grad(lambda p: jnp.mean(jnp.tanh(x @ p["w"] + p["b"]) ** 2))(p)
    params = {"w": jnp.full((6, 6), 0.1), "b": jnp.zeros(6)}
    x = jnp.ones((4, 6))
    expected = jax.jit(grads)(params, x)
    for name, jitted in (("jax.jit", jax.jit(grads, donate_argnums=0)),
                         ("rp.jit", rp.jit(grads, policy=policy, mode="split",
                                           donate_argnums=0))):
        donated = jax.tree.map(jnp.copy, params)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = jitted(donated, x)
        assert not [w for w in caught if "donated buffers" in str(w.message)], name
        assert all(a.is_deleted() for a in jax.tree.leaves(donated)), name
        for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(expected)):
            np.testing.assert_allclose(got, want, rtol=1e-6)


def test_one_build_per_signature_and_static_arguments():
    def scaled_step(params, x, scale):
        g = jax.grad(lambda p: jnp.sum(jnp.tanh(x @ p) ** 2) * scale)(params)
        return params - 0.1 * g
    jitted = rp.jit(scaled_step, policy="nothing_saveable", static_argnums=2)
    w = jnp.ones((4, 4)) * 0.1
    x = jnp.ones((2, 4))
    for scale in (1.0, 2.0, 1.0):
        got = jitted(w, x, scale)
        np.testing.assert_allclose(got, jax.jit(scaled_step, static_argnums=2)(w, x, scale),
                                   rtol=1e-6)
    assert jitted.builds == 2          # scale=1.0 and scale=2.0
    jitted(w, jnp.ones((3, 4)), 1.0)   # a new batch size: a new signature
    assert jitted.builds == 3
    jitted(w + 1, x, 1.0)              # new values, same signature
    assert jitted.builds == 3


def test_auto_mode_takes_joint_and_ties_on_cpu():
    """Joint everywhere; on CPU tied to the cotangent, unless the forward keeps no
    activation (nothing_saveable over the whole step: nothing to keep where the plan put
    it, the whole forward is recomputed at once)."""
    params = init(jax.random.key(0))
    sample = (params, OPT.init(params), next(batches(1)))
    lowered = rp.jit(step, policy="save_only_these_names('act')",
                     barrier_groups="per-use").lower(*sample)
    assert lowered.mode == "joint"
    tied = "stablehlo.is_finite" in lowered.module.text()
    assert tied == (jax.default_backend() == "cpu")
    lowered = rp.jit(step, policy="nothing_saveable").lower(*sample)
    assert "stablehlo.is_finite" not in lowered.module.text()


RB, RD, RL = 256, 64, 4        # a residual MLP whose activations outweigh its weights


def residual_loss(params, x):
    h = x
    for p in params:
        h = rp.checkpoint_name(h, "h")
        h = h + jnp.tanh(jnp.sin(h @ p["w1"])) @ p["w2"]
    return jnp.mean(h ** 2)


def residual_step(params, x):
    g = jax.grad(residual_loss)(params, x)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, g)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's behaviour")
@pytest.mark.parametrize("mode", ["joint", "split"])
def test_on_cpu_the_tie_keeps_what_remat_saves(mode):
    """XLA:CPU deletes optimization barriers before it schedules, so with barriers alone
    it merges clones with the forward ops they copy (joint) or runs every recomputation
    first (split), and the step needs jax.jit's memory. rp.jit ties each recomputation
    to the cotangent by data there (`tie_to_cotangent`, on by default on CPU): saving
    only each layer's input then needs well under jax.jit's memory, as XLA's
    memory_analysis() of what runs says, with jax.jit's results."""
    keys = jax.random.split(jax.random.key(0), RL)
    params = [{"w1": jax.random.normal(k, (RD, 4 * RD)) / 8,
               "w2": jax.random.normal(jax.random.fold_in(k, 1), (4 * RD, RD)) / 16}
              for k in keys]
    x = jax.random.normal(jax.random.key(1), (RB, RD))

    def peak(executables):
        return common.xla_peak([common.xla_memory(e) for e in executables])
    plain = peak([jax.jit(residual_step).lower(params, x).compile()])
    jitted = rp.jit(residual_step, policy="save_only_these_names('h')", mode=mode)
    lowered = jitted.lower(params, x)
    assert "stablehlo.is_finite" in lowered.module.text()
    assert peak(lowered.executables) < 0.7 * plain
    for got, want in zip(jax.tree.leaves(jitted(params, x)),
                         jax.tree.leaves(jax.jit(residual_step)(params, x))):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def variants(footprints: dict) -> dict:
    """`Lowered.footprints` but the twin built without fence-chains (XLA:CPU of jaxlib
    >= 0.11: `test_by_default_the_smallest_is_also_built_without_fences_...`)."""
    return {k: v for k, v in footprints.items() if not k.endswith(", chains not fenced")}


def test_barrier_groups_by_default_per_use_on_cpu_and_smaller_where_barriers_decide():
    """On CPU with jaxlib 0.10 (XLA:CPU deletes barriers before it fuses; the tie decides
    there) rp.jit builds once, per-use; where barriers decide (later jaxlibs' CPU, or
    without the tie, as on a backend that keeps barriers) it builds both groupings, records
    XLA's footprint of each and runs the smaller, with a remark that says so."""
    params = init(jax.random.key(0))
    sample = (params, OPT.init(params), next(batches(1)))
    policy = "save_only_these_names('act')"
    if jax.default_backend() == "cpu":
        lowered = rp.jit(step, policy=policy).lower(*sample)
        if jax_compat.xla_cpu_fuses_across_barriers():
            assert lowered.barrier_groups == "per-use" and lowered.footprints == {}
        else:     # (", tied" where a tie was placed: `.tied` is what runs)
            assert {k.split(",")[0] for k in lowered.footprints} == {"per-use", "per-region"}
            assert any(k.endswith(", tied") for k in lowered.footprints)
    lowered = rp.jit(step, policy=policy, tie_to_cotangent=False).lower(*sample)
    assert set(lowered.footprints) == {"per-use", "per-region"}
    assert lowered.footprints[lowered.barrier_groups] == min(lowered.footprints.values())
    assert lowered.footprint() == lowered.footprints[lowered.barrier_groups]
    assert any("optimization barriers " + lowered.barrier_groups in r
               for r in lowered.remarks)


@pytest.mark.parametrize("mode", ["joint", "split"])
def test_barrier_groups_smaller_runs_the_one_xla_says_is_smaller(monkeypatch, reference, mode):
    """Whichever grouping XLA reports as smaller is the one that runs (here per-region made
    to look smaller), and it trains as jax.jit does; per-region has one barrier for the
    step's one region where per-use has several (besides the one-value fences of
    fence-chains, which rp.jit adds to both on XLA:CPU of jaxlib >= 0.11)."""

    def groups_barriers(module):       # (a fence holds one value: `%5 = ...`, no `:n`)
        return len(re.findall(r"%\S+:\d+ = stablehlo\.optimization_barrier", module.text()))
    def fake(self):
        return {"per-use": 2000, "per-region": 1000}[self.barrier_groups]
    monkeypatch.setattr(rp_jit.Lowered, "footprint", fake)
    jitted = rp.jit(step, policy="nothing_saveable", mode=mode, barrier_groups="smaller",
                    tie_to_cotangent=False)
    params = init(jax.random.key(0))
    lowered = jitted.lower(params, OPT.init(params), next(batches(1)))
    assert lowered.barrier_groups == "per-region"
    assert variants(lowered.footprints) == {"per-use": 2000, "per-region": 1000}
    assert groups_barriers(lowered.module) == 1
    assert_trained_alike(train(jitted, n=5), train(jax.jit(step), n=5), atol=1e-6)
    per_use = rp.jit(step, policy="nothing_saveable", mode=mode, barrier_groups="per-use",
                     tie_to_cotangent=False).lower(params, OPT.init(params),
                                                   next(batches(1)))
    assert groups_barriers(per_use.module) > 1


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the tie is for XLA:CPU")
def test_split_rounds_read_back_residuals_where_the_backend_is_a_gpu(monkeypatch, reference):
    """In split form on a GPU rp.jit rounds the f32 residuals the backward only reads back,
    as jax.checkpoint does (rp.remat's round_read_back: exact, and XLA:GPU needs less scratch
    for that forward). Not on CPU, and not in joint form. Here the GPU answer is faked: the
    module rounds, and it trains as jax.jit does."""
    assert jit_variants.rounds_read_back("split", "gpu")
    assert not jit_variants.rounds_read_back("split", "cpu")
    assert not jit_variants.rounds_read_back("joint", "gpu")
    params = init(jax.random.key(0))
    sample = (params, OPT.init(params), next(batches(1)))
    here = rp.jit(step, policy="everything_saveable", mode="split").lower(*sample)
    assert "stablehlo.reduce_precision" not in here.module.text()
    monkeypatch.setattr(jit_variants, "rounds_read_back",
                        lambda mode, backend=None: mode == "split")
    jitted = rp.jit(step, policy="everything_saveable", mode="split", cache_dir=False)
    assert "stablehlo.reduce_precision" in jitted.lower(*sample).module.text()
    assert_trained_alike(train(jitted), reference, atol=1e-5)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the rule for XLA:CPU")
@pytest.mark.parametrize("mode", ["joint", "split"])
def test_cpu_rounds_no_f32_residual_a_recomputation_reads(monkeypatch, reference, mode):
    """On XLA:CPU rp.jit rounds no f32 residual (rp.remat's round_exact=False): the
    rounding is the identity there and makes XLA compute a kept elementwise value twice.
    Other backends keep them, as jax.checkpoint does (the GPU answer faked here: the module
    rounds what a recomputation reads). Either way it trains as jax.jit does; bf16 is
    rounded on every backend (the rule: `contract.residual_rounding`)."""
    assert jit_variants.rounding(mode, backend="cpu") == {"round_exact": False}
    assert jit_variants.rounding("joint", backend="gpu") == {}
    assert jit_variants.rounding("split", backend="gpu") == {"round_read_back": True}
    assert jit_variants.rounding("joint", read_back=True, backend="cpu") == \
        {"round_read_back": True}       # (the variant where nothing is recomputed)
    params = init(jax.random.key(0))
    sample = (params, OPT.init(params), next(batches(1)))
    here = rp.jit(step, policy="dots_saveable", mode=mode, cache_dir=False)
    assert "stablehlo.reduce_precision" not in here.lower(*sample).module.text()
    assert_trained_alike(train(here), reference, atol=1e-5)
    monkeypatch.setattr(jit_variants, "rounds_exact", lambda backend=None: True)
    there = rp.jit(step, policy="dots_saveable", mode=mode, cache_dir=False)
    assert "stablehlo.reduce_precision" in there.lower(*sample).module.text()
    assert_trained_alike(train(there), reference, atol=1e-5)


def test_joint_recomputing_nothing_is_also_built_rounded_and_the_smaller_runs(monkeypatch,
                                                                             reference):
    """Where the plan recomputes nothing the joint form is also built with its residuals
    rounded to their own type (exact; jax.checkpoint rounds them so) and the one XLA says is
    smaller runs: neither is smaller everywhere (measured on XLA:CPU, RecurrentGemma under
    everything_saveable needs 57 KB less rounded, the benchmark MLP 786 KB more). Live, the
    one that runs is the smaller; made to look smaller, the rounded one runs and trains as
    jax.jit does. A plan that recomputes something is not built rounded. Each grouping
    rp.jit builds is (per region the step has its barrier over what the backward reads)."""
    params = init(jax.random.key(0))
    sample = (params, OPT.init(params), next(batches(1)))
    live = rp.jit(step, policy="everything_saveable").lower(*sample)
    groupings = ("per-use",) if jax_compat.xla_cpu_fuses_across_barriers() else (
        "per-use", "per-region")   # (per region, the step's barrier over what the backward reads)
    assert set(live.footprints) == {g + r for g in groupings for r in ("", ", rounded")}
    assert live.footprints[live.barriers] == min(live.footprints.values()) == live.footprint()
    assert any(f"nothing recomputed, residuals {'rounded' if live.rounded else 'not rounded'}"
               f": XLA's footprint {live.footprint():,} B" in r for r in live.remarks)
    assert ("stablehlo.reduce_precision" in live.module.text()) == live.rounded

    def fake(self):
        return 1000 if self.rounded else 2000
    monkeypatch.setattr(rp_jit.Lowered, "footprint", fake)
    jitted = rp.jit(step, policy="everything_saveable", cache_dir=False)
    lowered = jitted.lower(*sample)
    assert lowered.rounded and lowered.barriers == "per-use, rounded"
    assert "stablehlo.reduce_precision" in lowered.module.text()
    assert_trained_alike(train(jitted), reference, atol=1e-5)
    some = rp.jit(step, policy="save_only_these_names('act')", cache_dir=False,
                  mode="joint").lower(*sample)
    assert not some.rounded and not any(k.endswith("rounded") for k in some.footprints)


def test_split_on_cpu_builds_tied_and_untied_and_runs_the_smaller(monkeypatch, reference):
    """In split form on CPU the tie can cost scratch as well as save it (XLA:CPU schedules
    a separate backward by itself: measured on the benchmark conv net, dots_saveable, 1.31x
    the untied backward's temp bytes; 0.91x under save_only_these_names), so by default
    rp.jit builds both and runs the one XLA says is smaller. Here the untied one made to
    look smaller: it runs, without the tie, and trains as jax.jit does. Live, the one that
    runs is the smaller of the two XLA measured."""
    params = init(jax.random.key(0))
    sample = (params, OPT.init(params), next(batches(1)))
    live = rp.jit(step, policy="save_only_these_names('act')", mode="split").lower(*sample)
    groupings = ("per-use",) if jax_compat.xla_cpu_fuses_across_barriers() else (
        "per-use", "per-region")      # (later jaxlibs: barriers split XLA:CPU's fusions)
    # (a variant whose module is another's, as a grouping that places no tie, is built once)
    assert set(variants(live.footprints)) <= {g + t for g in groupings
                                              for t in (", tied", "")}
    assert {k.split(",")[0] for k in live.footprints} == set(groupings)
    assert "per-use, tied" in live.footprints and "per-use" in live.footprints
    assert live.footprints[live.barriers] == min(live.footprints.values()) == live.footprint()
    assert any(f"optimization barriers {live.barriers}: XLA's footprint" in r
               for r in live.remarks)

    def fake(self):
        return 1000 if not self.tied else 2000
    monkeypatch.setattr(rp_jit.Lowered, "footprint", fake)
    jitted = rp.jit(step, policy="save_only_these_names('act')", mode="split")
    lowered = jitted.lower(*sample)
    assert not lowered.tied and lowered.barriers in ("per-use", "per-region")
    assert "stablehlo.is_finite" not in lowered.module.text()
    assert_trained_alike(train(jitted), reference, atol=1e-5)    # (as test_training_...)
    for kept in (rp.jit(step, policy="save_only_these_names('act')", mode="split",
                        tie_to_cotangent=True).lower(*sample),
                 rp.jit(step, policy="save_only_these_names('act')").lower(*sample)):
        # asked, or joint: only tied variants are built (a grouping that places no tie
        # is labelled untied: per region on jaxlib 0.12)
        assert "per-use" not in kept.footprints
        assert kept.tied or kept.barriers == "per-region"


def test_by_default_the_smallest_is_also_built_without_fences_and_the_smaller_runs(
        monkeypatch, reference, tmp_path):
    """fence-chains, on by default on XLA:CPU of jaxlib >= 0.11, lowers most split programs
    but not all (RecurrentGemma under nothing_saveable: 563,072 B of backward temp with
    its one fence, 530,304 B without, JAX's 530,432 B), so in split form rp.jit builds the
    smallest variant again without it where it placed a fence and runs the smaller. Live,
    the split step gets the twin and runs the smallest, the joint one does not (no joint
    program measured was larger with the fence); made to look smaller, the twin runs, with
    fewer one-value barriers, and trains as jax.jit does. Asked for one way
    (`fence_chains=True` or False), it is built that way only."""
    if not rp_jit.fences_chains():
        pytest.skip("fence-chains is on by default only on XLA:CPU of jaxlib >= 0.11")
    params = init(jax.random.key(0))
    sample = (params, OPT.init(params), next(batches(1)))
    live = rp.jit(step, policy="nothing_saveable", mode="split").lower(*sample)
    assert unfenced(live) == 1, live.footprints
    assert live.footprints[live.barriers] == min(live.footprints.values()) == live.footprint()
    joint = rp.jit(step, policy="nothing_saveable", mode="joint").lower(*sample)
    assert any(rp_jit.CHAINS_FENCED in r for r in joint.remarks) and not unfenced(joint)

    def fences(lowered):       # one-value barriers (`%5 = ...`; a group's has `:n`)
        return len(re.findall(r"%[^\s:]+ = stablehlo\.optimization_barrier",
                              lowered.module.text()))
    monkeypatch.setattr(rp_jit.Lowered, "footprint", lambda self: 1000 if self.unfenced
                        else 2000)
    jitted = rp.jit(step, policy="nothing_saveable", mode="split", cache_dir=False)
    lowered = jitted.lower(*sample)
    assert lowered.unfenced and lowered.barriers.endswith(", chains not fenced")
    fenced = rp.jit(step, policy="nothing_saveable", mode="split", cache_dir=False,
                    barrier_groups=lowered.barrier_groups, tie_to_cotangent=lowered.tied,
                    fence_chains=True).lower(*sample)
    assert fences(lowered) < fences(fenced)
    assert_trained_alike(train(jitted), reference, atol=1e-5)
    # with a disk cache, a second process's build compiles the twin alone; donation (other
    # programs to choose among) chooses again
    first = rp.jit(step, policy="nothing_saveable", mode="split", cache_dir=tmp_path)
    assert first.lower(*sample).unfenced
    compiled = []
    compile_all = rp_jit.Jitted._compile_all
    monkeypatch.setattr(rp_jit.Jitted, "_compile_all", lambda self, mode, exported, jobs, *a: (
        compiled.append(len(jobs)), compile_all(self, mode, exported, jobs, *a))[1])
    again = rp.jit(step, policy="nothing_saveable", mode="split", cache_dir=tmp_path)
    assert again.lower(*sample).unfenced and compiled == [1]
    donating = rp.jit(step, policy="nothing_saveable", mode="split", cache_dir=tmp_path,
                      donate_argnums=(0, 1))
    assert donating.lower(*sample).unfenced and compiled[1] > 1 and compiled[2:] == [1]
    for asked in (True, False):
        one_way = rp.jit(step, policy="nothing_saveable", mode="split", fence_chains=asked,
                         cache_dir=False).lower(*sample)
        assert not one_way.unfenced and not any(k.endswith("not fenced")
                                                for k in one_way.footprints)


def test_the_programs_of_a_build_compile_side_by_side_as_one_thread_builds_them(monkeypatch):
    """rp.jit compiles the programs of a build side by side (`jax_run.compiling`: XLA
    compiles without Python's lock; a split build of four variants is eight compiles).
    Live: the compiles run in the worker threads, and the build is the one
    REMAT_PASSES_COMPILE_THREADS=1 makes, one compile after another in the calling thread:
    the same variants with the same XLA footprints, the same one running, the same step
    results bit for bit."""
    params = init(jax.random.key(0))
    sample = (params, OPT.init(params), next(batches(1)))
    threads = compiling_threads(monkeypatch)
    built = {}
    for n in ("2", "1"):
        monkeypatch.setenv(jax_run.COMPILE_THREADS_ENV, n)
        threads.clear()
        built[n] = rp.jit(step, policy="dots_saveable", mode="split",
                          cache_dir=False).lower(*sample)
        assert len(threads) >= 2 * len(built[n].footprints) >= 4, (threads, built[n].footprints)
        assert all(t.startswith("remat-passes-compile") if n == "2"
                   else t == threading.current_thread().name for t in threads), threads
    side, serial = built["2"], built["1"]
    assert side.footprints == serial.footprints and side.barriers == serial.barriers
    assert side.module.text() == serial.module.text()
    for a, b in zip(jax.tree.leaves(side(*sample)), jax.tree.leaves(serial(*sample))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_compiles_stay_in_the_calling_thread_where_it_changed_a_jax_setting(monkeypatch):
    """JAX's configuration context managers are per thread; a compile in another thread
    would not see what this one set (`jax.log_compiles(True)` here). Such a build
    compiles in the calling thread. By default one compile per CPU on the CPU backend, one
    at a time on the others (XLA:GPU autotunes on the device as it compiles);
    REMAT_PASSES_COMPILE_THREADS sets it anywhere, and a value that is not a thread count
    is a clear error."""
    params = init(jax.random.key(0))
    sample = (params, OPT.init(params), next(batches(1)))
    threads = compiling_threads(monkeypatch)
    monkeypatch.setenv(jax_run.COMPILE_THREADS_ENV, "2")
    with jax.log_compiles(True):
        assert jax_compat.settings_of_this_thread() == ["jax_log_compiles"]
        rp.jit(step, policy="dots_saveable", mode="joint", cache_dir=False).lower(*sample)
    assert threads and set(threads) == {threading.current_thread().name}
    monkeypatch.delenv(jax_run.COMPILE_THREADS_ENV)
    if jax.default_backend() == "cpu":        # by default: one per CPU there, 1 elsewhere
        assert jax_run.compile_threads() == len(os.sched_getaffinity(0))
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert jax_run.compile_threads() == 1
    monkeypatch.setenv(jax_run.COMPILE_THREADS_ENV, "3")
    assert jax_run.compile_threads() == 3
    monkeypatch.undo()
    for bad in ("0", "many", "-2"):
        monkeypatch.setenv(jax_run.COMPILE_THREADS_ENV, bad)
        with pytest.raises(RematError, match=f"REMAT_PASSES_COMPILE_THREADS='{bad}': give a "
                           "whole number of threads, 1 or more"):
            rp.jit(step, policy="dots_saveable", cache_dir=False).lower(*sample)


def test_tied_says_whether_a_tie_was_placed():
    """`Lowered.tied` is what runs, not what was asked: where nothing is recomputed no tie
    to the cotangent is placed, and it says False (a plan whose recomputation reads more
    than the arguments is tied: True)."""
    params = init(jax.random.key(0))
    sample = (params, OPT.init(params), next(batches(1)))
    none = rp.jit(step, policy="everything_saveable", tie_to_cotangent=True).lower(*sample)
    assert "stablehlo.is_finite" not in none.module.text()
    assert not none.tied and ", tied" not in none.barriers
    some = rp.jit(step, policy="save_only_these_names('act')", tie_to_cotangent=True,
                  barrier_groups="per-use").lower(*sample)
    assert "stablehlo.is_finite" in some.module.text() and some.tied


def test_decorator_form():
    @rp.jit(policy="dots_saveable", mode="joint")
    def grad_fn(w, x):
        return jax.grad(lambda w: jnp.sum(jnp.sin(x @ w)))(w)
    w, x = jnp.ones((3, 3)), jnp.ones((2, 3))
    np.testing.assert_allclose(grad_fn(w, x), jax.grad(lambda w: jnp.sum(jnp.sin(x @ w)))(w),
                               rtol=1e-6)


def _kw_step(params, x, *, scale=1.0, training=True):
    """A step with keyword-only arguments: `training` is for Python control flow."""
    def f(p):
        h = jnp.tanh(x @ p)
        return jnp.sum((h if training else h * 0.5) ** 2) * scale
    value, g = jax.value_and_grad(f)(params)
    return params - 0.1 * g, value


@pytest.mark.parametrize("mode", ["joint", "split"])
def test_keyword_arguments_as_jax_jit_takes_them(mode):
    """Keyword arguments are dynamic unless named static (`static_argnames`), and a
    parameter static by position is static when passed by keyword too, as in jax.jit."""
    w, x = jnp.ones((4, 4)) * 0.1, jnp.ones((2, 4))
    want = jax.jit(_kw_step, static_argnames="training")
    jitted = rp.jit(_kw_step, policy="nothing_saveable", mode=mode,
                    static_argnames="training")
    for kwargs in ({}, {"scale": 2.0}, {"scale": 3.0}, {"scale": 2.0, "training": False}):
        for got, expected in zip(jitted(w, x, **kwargs), want(w, x, **kwargs)):
            np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert jitted.builds == 3      # no keywords; scale (dynamic: 2.0 and 3.0 share one); training
    lowered = jitted.lower(w, x=x, scale=2.0)          # x by keyword: a signature of its own
    assert jitted.builds == 4
    assert any("from the argument x" in r.description for r in lowered.residuals), \
        [r.description for r in lowered.residuals]

    def scaled_step(params, x, scale):
        g = jax.grad(lambda p: jnp.sum(jnp.tanh(x @ p) ** 2) * scale)(params)
        return params - 0.1 * g
    by_position = rp.jit(scaled_step, policy="nothing_saveable", mode=mode, static_argnums=2)
    for scale in (1.0, 2.0):      # static: a Python float the step may branch on
        np.testing.assert_allclose(by_position(w, x, scale=scale),
                                   jax.jit(scaled_step, static_argnums=2)(w, x, scale=scale),
                                   rtol=1e-6)
    assert by_position.builds == 2


def test_eval_shape_as_jax_jit_gives_it():
    """`eval_shape` takes what the call takes (static arguments, `jax.ShapeDtypeStruct`s)
    and gives `jax.jit(...).eval_shape`'s answer without building anything."""
    w = jnp.ones((4, 4)) * 0.1
    jitted = rp.jit(_kw_step, policy="nothing_saveable", static_argnames="training")
    spec = jax.ShapeDtypeStruct((2, 4), jnp.float32)
    want = jax.jit(_kw_step, static_argnames="training").eval_shape(w, spec, training=False)
    assert jitted.eval_shape(w, spec, training=False) == want
    assert jitted.builds == 0


def test_threads_calling_with_a_new_signature_build_it_once():
    """Threads that call the step at once with a signature not yet built wait for one
    build (a build exports, rewrites and compiles: seconds, not to be done four times)."""
    w, x = jnp.ones((4, 4)) * 0.1, jnp.ones((2, 4))
    jitted = rp.jit(_kw_step, policy="nothing_saveable")
    results = []
    threads = [threading.Thread(target=lambda: results.append(jitted(w, x)[1]))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4 and jitted.builds == 1
    np.testing.assert_allclose(results, [jax.jit(_kw_step)(w, x)[1]] * 4, rtol=1e-6)


@pytest.mark.parametrize("mode", ["joint", "split"])
def test_a_call_like_an_earlier_one_runs_its_program_the_short_way(monkeypatch, mode):
    """A call whose dynamic leaves are all device arrays, NumPy arrays, Python numbers or
    leaves made static (a function), like one made before (the static values, the pytree,
    each device array's abstract value and sharding, each NumPy array's shape and dtype, each
    number's type), runs the program that one ran without
    rp.jit's full way through the arguments (`call_cache`: about 75 us less a call on 44
    arrays); anything else takes the full way, which builds, refuses or looks for NNX
    objects as before. Results and donation are jax.jit's either way."""
    full = []
    taken = rp_jit.Jitted._taken
    monkeypatch.setattr(rp_jit.Jitted, "_taken", lambda self, a, k: (full.append(1),
                                                                     taken(self, a, k))[1])

    def tagged_step(params, x, scale, training=True, act=jnp.tanh):
        g = jax.grad(lambda p: jnp.sum(act(x @ p) ** 2) * scale)(params)
        return params - 0.1 * g, {"loss": jnp.sum(g), "tag": "sgd" if training else "eval"}
    want = jax.jit(lambda *a, **k: tagged_step(*a, **k)[0], static_argnames=("training", "act"))
    jitted = rp.jit(tagged_step, policy="nothing_saveable", mode=mode,
                    static_argnames="training", donate_argnums=0)
    w, x = jnp.ones((4, 4)) * 0.1, jnp.ones((2, 4))
    calls = [  # (arguments, keyword arguments, takes the full way)
        ((x, 1.0), {}, True), ((x, 2.0), {}, False),          # a new number: same program
        ((x, jnp.float32(2.0)), {}, True),                    # a strong f32, not a weak one
        ((x, 3.0), {"training": False}, True), ((x, 3.0), {"training": False}, False),
        ((x, 4.0), {}, False),
        ((jnp.ones((3, 4)), 1.0), {}, True),                  # a new shape
        ((np.ones((2, 4), np.float32), 1.0), {}, True),       # a host array, then again
        ((np.ones((2, 4), np.float32), 2.0), {}, False),
        ((np.ones((2, 4), np.float64), 2.0), {}, False),      # (float64 without x64: the
        #                                                       float32 program, as jax.jit)
        ((x.astype(jnp.bfloat16), 1.0), {}, True),            # a new dtype
        ((x,), {"scale": 5.0}, True), ((x,), {"scale": 6.0}, False),   # by keyword
        ((x, 1.0), {"act": jnp.sin}, True), ((x, 2.0), {"act": jnp.sin}, False),  # static
        ((x, 1.0), {"act": jnp.cos}, True), ((x, 1.0), {"act": jnp.sin}, False),  # leaves
    ]
    for args, kwargs, in_full in calls:
        before = len(full)
        expected = want(w, *args, **kwargs)
        got = jitted(w, *args, **kwargs)
        assert (len(full) > before) == in_full, (args, kwargs)
        assert w.is_deleted()
        assert got[1]["tag"] == ("sgd" if kwargs.get("training", True) else "eval")
        assert_trees_close(got[0], expected, rtol=1e-6)
        w = jnp.ones((4, 4)) * 0.1
    assert jitted.builds == 9
    with pytest.raises(TypeError, match="static argument 'training' must be hashable"):
        jitted(w, x, 1.0, training=[True])


@pytest.mark.parametrize("mode", ["joint", "split"])
def test_arguments_donated_by_name_are_deleted(mode):
    params = init(jax.random.key(0))
    state = OPT.init(params)
    batch = next(batches(1))
    expected = jax.jit(step)(params, state, batch)
    jitted = rp.jit(step, policy="nothing_saveable", mode=mode,
                    donate_argnames=("params", "opt_state"))
    out = jitted(params, opt_state=state, batch=batch)
    assert all(x.is_deleted() for x in jax.tree.leaves((params, state)))
    assert not any(x.is_deleted() for x in batch)
    for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(expected)):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["joint", "split"])
def test_a_typed_prng_key_argument(mode):
    """A step that takes a `jax.random.key` (a typed key array: it has no weak type) for
    dropout and returns the next key and an aux value: as jax.jit computes them, the key
    a typed key again."""
    def loss_fn(params, x, key):
        keep = jax.random.bernoulli(key, 0.9, x.shape)
        h = jnp.tanh(jnp.where(keep, x, 0.0) @ params)
        return jnp.mean(h ** 2), h.mean()

    def dropout_step(params, x, key):
        key, sub = jax.random.split(key)
        (value, aux), g = jax.value_and_grad(loss_fn, has_aux=True)(params, x, sub)
        return params - 0.1 * g, value, aux, key
    w, x = jnp.ones((4, 8)) * 0.1, jnp.ones((16, 4))
    jitted = rp.jit(dropout_step, policy="nothing_saveable", mode=mode)
    key = jax.random.key(0)
    for _ in range(2):
        *got, next_key = jitted(w, x, key)
        *want, want_key = jax.jit(dropout_step)(w, x, key)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-6)
        assert next_key.dtype == want_key.dtype
        np.testing.assert_array_equal(jax.random.key_data(next_key),
                                      jax.random.key_data(want_key))
        key = next_key
    assert jitted.builds == 1


def test_bad_argument_names_are_clear_errors():
    with pytest.raises(ValueError, match="static_argnames names 'scal', which is not a "
                                         "parameter of _kw_step"):
        rp.jit(_kw_step, static_argnames="scal")
    with pytest.raises(ValueError, match="both static and donated"):
        rp.jit(_kw_step, static_argnums=0, donate_argnames="params")
    with pytest.raises(TypeError, match="static argument 'training' must be hashable"):
        rp.jit(_kw_step, static_argnames="training")(jnp.ones((4, 4)), jnp.ones((2, 4)),
                                                     training=[True])
    with pytest.raises(TypeError, match="unexpected keyword argument 'bias'"):
        rp.jit(_kw_step)(jnp.ones((4, 4)), jnp.ones((2, 4)), bias=1.0)


def test_a_function_without_a_backward_pass_is_a_clear_error():
    jitted = rp.jit(lambda x: jnp.sin(x) * 2)
    with pytest.raises(rp.RematError, match="has no backward pass.*use jax.jit"):
        jitted(jnp.ones(3))


def test_differentiated_from_outside_reverse_mode_runs_forward_mode_is_a_clear_error():
    """jax.grad of a function calling an rp.jit gradient differentiates the rewritten
    program (a gradient of the gradient, equal to jax.grad's); forward mode, which JAX
    refuses for an exported program (inside jax.jit only when it lowers), is an error that
    says what to do."""
    def f(w, x):
        return jnp.sum(jnp.sin(jnp.tanh(x @ w)) ** 2)
    w, x = jnp.arange(16.0).reshape(4, 4) * 0.05, jnp.ones((2, 4))
    g = rp.jit(jax.grad(f), policy="nothing_saveable")
    got = jax.grad(lambda a: jnp.sum(g(a, x) ** 2))(w)
    want = jax.grad(lambda a: jnp.sum(jax.grad(f)(a, x) ** 2))(w)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    forward = "differentiated in forward mode.*reverse mode only"
    with pytest.raises(rp.RematError, match=forward):
        jax.jvp(g, (w, x), (w, x))
    with pytest.raises(rp.RematError, match=forward):
        jax.jit(lambda a, b: jax.jvp(g, (a, b), (a, b)))(w, x)
    with pytest.raises(rp.RematError, match=forward):
        jax.jacfwd(g)(w, x)


def _dropout_loss(params, x, key, tokens, scale=1.0):
    """A loss with no backward of its own: a PRNG key and integer tokens among its
    arguments, a static keyword."""
    h = rp.checkpoint_name(jnp.tanh(x @ params["w1"]) * scale, "h")
    h = jnp.where(jax.random.bernoulli(key, 0.9, h.shape), h, 0.0) + tokens[:, None] * 0.01
    return jnp.mean((jnp.sin(h) @ params["w2"]) ** 2)


def test_a_loss_differentiated_from_outside_is_rematerialized():
    """jax.grad(rp.jit(loss, policy=...)), as jax.grad(jax.checkpoint(loss, policy=...)):
    the gradients are jax.grad's, eagerly and inside jax.jit (an optax step), built once
    per signature; the forward the enclosing program runs keeps what the policy saves.
    A second differentiation, jax.vmap around the differentiation (per-example gradients:
    rp.jit of the vmapped gradient instead; also around a jax.jit of it) and shardings are
    errors that say what to do."""
    k = jax.random.PRNGKey(0)
    params = {"w1": jax.random.normal(k, (16, 32)) * 0.3,
              "w2": jax.random.normal(jax.random.fold_in(k, 1), (32, 4)) * 0.3}
    x, key, tokens = jax.random.normal(k, (8, 16)), jax.random.key(3), jnp.arange(8)
    f = rp.jit(_dropout_loss, policy="save_only_these_names(h)", static_argnames="scale")
    want = jax.grad(_dropout_loss)(params, x, key, tokens, scale=2.0)
    assert_trees_close(jax.grad(f)(params, x, key, tokens, scale=2.0), want)
    assert_trees_close(jax.grad(f)(params, x, key, tokens, scale=2.0), want)   # (built)
    assert f.builds == 1
    value, grads = jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(params, x, key, tokens)
    want_value, want_grads = jax.value_and_grad(_dropout_loss, argnums=(0, 1))(
        params, x, key, tokens)
    assert_trees_close((value, grads), (want_value, want_grads))
    opt = optax.adam(1e-2)

    def train(loss_fn, p):
        def one(carry, _):
            p, s = carry
            v, g = jax.value_and_grad(loss_fn)(p, x, key, tokens)
            u, s = opt.update(g, s, p)
            return (optax.apply_updates(p, u), s), v
        return jax.jit(lambda p: jax.lax.scan(one, (p, opt.init(p)), None, length=3))(p)
    assert_trees_close(train(f, params), train(_dropout_loss, params))
    # what the enclosing program's forward keeps: the residuals the policy saves
    jaxpr = jax.make_jaxpr(lambda p: jax.vjp(lambda q: f(q, x, key, tokens), p)[1])(params)
    kept = [v.aval for v in jaxpr.jaxpr.outvars]
    assert sorted(str(a) for a in kept if a.shape == (8, 32)) == ["float32[8,32]"]   # h
    with pytest.raises(rp.RematError, match="differentiated twice from outside.*"
                                            r"rp.jit\(jax.grad\(_dropout_loss\)\)"):
        jax.grad(lambda p: jnp.sum(jax.grad(f)(p, x, key, tokens)["w2"]))(params)
    per_example = (None, 0, None, None)
    with pytest.raises(rp.RematError, match="under jax.vmap.*put both inside"):
        jax.vmap(jax.grad(f), in_axes=per_example)(params, jnp.stack([x, x]), key, tokens)
    # differentiated through a jax.jit that traced the call first (jax.grad(jax.jit(g))):
    # inside it the loss runs as it is, its derivative is the halves' (the enclosing
    # backward reads the arguments and h alone); before, "has no backward pass"
    g = jax.jit(lambda p, x: f(p, x, key, tokens))
    assert_trees_close(g(params, x), _dropout_loss(params, x, key, tokens))
    assert_trees_close(jax.grad(g)(params, x), jax.grad(_dropout_loss)(params, x, key, tokens))
    jaxpr = jax.make_jaxpr(lambda p: jax.vjp(lambda q: g(q, x), p)[1])(params)
    assert sorted(str(v.aval) for v in jaxpr.jaxpr.outvars if v.aval.shape == (8, 32)) == \
        ["float32[8,32]"]
    # (a vmap around a jax.jit that differentiates it: JAX batched the halves' calls,
    # "Batching rule for 'call_exported' not implemented")
    with pytest.raises(rp.RematError, match="inside a jax.jit that is vmapped in turn.*"
                                            r"rp.jit\(jax.vmap\(jax.grad\(_dropout_loss"):
        jax.vmap(jax.jit(jax.grad(f)), in_axes=per_example)(params, jnp.stack([x, x]), key,
                                                            tokens)
    inside = rp.jit(jax.vmap(jax.grad(_dropout_loss), in_axes=per_example),
                    policy="save_only_these_names(h)")
    assert_trees_close(inside(params, jnp.stack([x, x]), key, tokens),
                       jax.vmap(jax.grad(_dropout_loss), in_axes=per_example)(
                           params, jnp.stack([x, x]), key, tokens))
    sharded = rp.jit(_dropout_loss, in_shardings=jax.sharding.SingleDeviceSharding(
        jax.devices()[0]))
    with pytest.raises(rp.RematError, match="in_shardings or out_shardings"):
        jax.grad(sharded)(params, x, key, tokens)


def test_a_loss_differentiated_from_outside_reads_the_disk_cache(tmp_path, monkeypatch):
    """With cache_dir, the rewritten halves of a loss differentiated from outside are kept
    on disk: a fresh rp.jit (another process's) rewrites none of them again (it only
    exports the loss and finds that it has no backward of its own), and compiles none of
    the candidates to choose again where the first one weighed several."""
    from remat_passes.api import differentiated
    composed = []
    compose = differentiated._composed
    monkeypatch.setattr(differentiated, "_composed", lambda *a: (composed.append(1),
                                                                 compose(*a))[1])

    def loss(w, x):
        return jnp.sum(jnp.sin(jnp.tanh(x @ w) @ w) ** 2)
    w, x = jnp.arange(16.0).reshape(4, 4) * 0.05, jnp.ones((2, 4))
    first = jax.grad(rp.jit(loss, policy="nothing_saveable", cache_dir=str(tmp_path)))(w, x)
    assert list(tmp_path.glob("*.mlirbc"))
    assert len(list(tmp_path.glob("*.choice.json"))) == (len(composed) > 1)
    made = []
    real = rp_jit.remat_variants

    def counting(*args, **kwargs):
        out = real(*args, **kwargs)      # (the export without a backward raises here)
        made.append(len(out))
        return out
    monkeypatch.setattr(rp_jit, "remat_variants", counting)
    composed.clear()
    again = jax.grad(rp.jit(loss, policy="nothing_saveable", cache_dir=str(tmp_path)))(w, x)
    assert made == [] and composed == []
    np.testing.assert_array_equal(again, first)


def test_a_loss_with_an_integer_aux_output_differentiated_from_outside():
    """`jax.value_and_grad(rp.jit(loss), has_aux=True)` where the aux holds a count (no
    cotangent: export_vjp takes none for it), eagerly and through a jax.jit around the call:
    JAX's values, gradients and aux. Before: "export_vjp needs floating-point outputs"."""
    def loss_aux(w, x):
        h = jnp.tanh(x @ w)
        return jnp.sum(h ** 2), {"positive": jnp.sum(h > 0), "mean": jnp.mean(h)}
    w, x = jnp.linspace(-1, 1, 12).reshape(4, 3), jnp.linspace(0, 1, 8).reshape(2, 4)
    expected = jax.value_and_grad(loss_aux, has_aux=True)(w, x)
    jitted = rp.jit(loss_aux, policy="nothing_saveable")
    for got in (jax.value_and_grad(jitted, has_aux=True)(w, x),
                jax.value_and_grad(jax.jit(lambda w, x: jitted(w, x)), has_aux=True)(w, x)):
        assert_trees_close(jax.tree.leaves(got), jax.tree.leaves(expected))
        assert got[0][1]["positive"].dtype == jnp.int32


def test_a_flax_nnx_loss_differentiated_by_nnx_grad():
    """Flax NNX differentiates a loss of a Module with `nnx.grad` (its own split of the
    Module into state, then jax.grad): an rp.jit loss goes through it, and the gradients
    are nnx.grad's of the plain loss."""
    from flax import nnx

    class Model(nnx.Module):
        def __init__(self, rngs):
            self.l1, self.l2 = nnx.Linear(8, 32, rngs=rngs), nnx.Linear(32, 4, rngs=rngs)

        def __call__(self, x):
            return self.l2(rp.checkpoint_name(jax.nn.gelu(self.l1(x)), "act"))

    def loss(model, x, y):
        return jnp.mean((model(x) - y) ** 2)
    model, x, y = Model(nnx.Rngs(0)), jnp.ones((16, 8)), jnp.zeros((16, 4))
    got = nnx.state(nnx.grad(rp.jit(loss, policy="nothing_saveable"))(model, x, y))
    assert_trees_close(jax.tree.leaves(got), jax.tree.leaves(nnx.state(nnx.grad(loss)(
        model, x, y))))


def test_a_loss_differentiated_from_outside_needs_no_more_than_jax_checkpoint():
    """XLA's temp bytes of jax.jit(jax.grad(rp.jit(loss, policy))) are at most those of
    jax.grad(jax.checkpoint(loss, policy)) + 2% (the benchmark conv net: jaxlib 0.12,
    2,129,920 B against 2,719,744 B under both policies; 0.10, 2,793,472 B against
    2,793,472 B under nothing_saveable, 2,494,464 B against 2,793,472 B under
    dots_saveable), and the gradients are jax.grad's."""
    from tools.benchmarks.models import MODELS
    model = MODELS["convnet"]()
    fn = model.build(lambda f: f)

    def loss(*args):
        return jnp.sum(fn(*args) ** 2) * 1e-3
    argnums = tuple(i for i, a in enumerate(model.args)
                    if all(jnp.issubdtype(x.dtype, jnp.inexact) for x in jax.tree.leaves(a)))

    def temp(g):
        return g.lower(*model.args).compile().memory_analysis().temp_size_in_bytes
    want = jax.jit(jax.grad(loss, argnums=argnums))(*model.args)
    for policy in ("nothing_saveable", "dots_saveable"):
        ours = jax.jit(jax.grad(rp.jit(loss, policy=policy), argnums=argnums))
        theirs = jax.jit(jax.grad(jax.checkpoint(
            loss, policy=getattr(jax.checkpoint_policies, policy)), argnums=argnums))
        assert temp(ours) <= 1.02 * temp(theirs), policy
        assert_trees_close(ours(*model.args), want, what=policy)


def test_a_loss_differentiated_from_outside_keeps_vmapped_products_as_read(monkeypatch):
    """Differentiated from outside, a product kept under dots_saveable that both halves read
    through the same transpose (a vmapped `W @ v`, as Equinox's Linear) crosses from the
    forward to the backward in that order (fold-dot-transposes across-halves): fewer
    transposes XLA:CPU does in memory (the libraries benchmark's Equinox loss: 70 copies in
    the step against 13), the same temp bytes, jax.grad's gradients. So it does in rp.jit's
    own split form (the Equinox step: 69 copies against 12), where `.residuals` says so."""
    from remat_passes.passes import fold_dot_transposes
    keys = jax.random.split(jax.random.key(0), 4)
    ws = [jax.random.normal(k, (64, 64)) * 0.2 for k in keys[:3]]
    x = jax.random.normal(keys[3], (128, 64))

    def loss(ws, x):
        def one(v):
            for w in ws:
                v = jnp.tanh(w @ v + w[0])
            return v
        return jnp.sum(jax.vmap(one)(x) ** 2)

    def compiled():
        return jax.jit(jax.grad(rp.jit(loss, policy="dots_saveable"))).lower(ws, x).compile()
    folded = compiled()
    monkeypatch.setattr(fold_dot_transposes, "fold_residual", lambda *a: False)
    kept = compiled()
    copies = [c.as_text().count(" copy(") for c in (folded, kept)]
    assert copies[0] < copies[1], copies
    temps = [c.memory_analysis().temp_size_in_bytes for c in (folded, kept)]
    assert temps[0] <= temps[1], temps
    assert_trees_close(folded(ws, x), jax.grad(loss)(ws, x), what="gradients")
    # rp.jit's own split form: the same, its residuals saying so
    step = rp.jit(lambda ws, x: jax.grad(loss)(ws, x), policy="dots_saveable", mode="split",
                  cache_dir=False)
    as_kept = step.lower(ws, x)
    monkeypatch.undo()
    step = rp.jit(lambda ws, x: jax.grad(loss)(ws, x), policy="dots_saveable", mode="split",
                  cache_dir=False)
    as_folded = step.lower(ws, x)
    copies = [sum(e.as_text().count(" copy(") for e in low.executables)
              for low in (as_folded, as_kept)]
    assert copies[0] < copies[1], copies
    temps = [[e.memory_analysis().temp_size_in_bytes for e in low.executables]
             for low in (as_folded, as_kept)]
    assert all(a <= b for a, b in zip(*temps)), temps
    assert any(r.description.startswith("transpose of f32[") for r in as_folded.residuals)
    assert not any("transpose" in r.description for r in as_kept.residuals)
    assert sum(r.bytes for r in as_folded.residuals) == sum(r.bytes for r in as_kept.residuals)
    assert_trees_close(step(ws, x), jax.grad(loss)(ws, x), what="gradients")


@pytest.mark.parametrize("mode", ["joint", "split"])
def test_compiler_options_reach_each_program(mode):
    """`compiler_options`, as jax.jit takes them, go to each program a build compiles (both
    halves in split form): with XLA's fusion pass turned off each executable's HLO is
    another, the step's results are the same; an option XLA does not know is its error."""
    params, batch = init(jax.random.key(0)), next(batches(1))
    state = OPT.init(params)
    plain = rp.jit(step, policy="dots_saveable", mode=mode)
    tuned = rp.jit(step, policy="dots_saveable", mode=mode,
                   compiler_options={"xla_disable_hlo_passes": "fusion"})
    texts = [[e.as_text() for e in j.lower(params, state, batch).executables]
             for j in (plain, tuned)]
    assert len(texts[1]) == (2 if mode == "split" else 1)
    assert all(a != b for a, b in zip(*texts))
    # (unfused, XLA rounds in another order: an AdamW step's update of 1e-3 to 4e-5)
    assert_trees_close(tuned(params, state, batch), plain(params, state, batch), rtol=1e-4,
                       what=mode)
    with pytest.raises(Exception, match="No such compile option: 'xla_no_such_option'"):
        rp.jit(step, mode=mode, compiler_options={"xla_no_such_option": 1})(
            params, state, batch)
    with pytest.raises(TypeError, match="compiler_options must be a dict"):
        rp.jit(step, compiler_options=[("xla_disable_hlo_passes", "fusion")])


def test_bad_options_are_clear_errors():
    with pytest.raises(ValueError, match="mode must be one of"):
        rp.jit(step, mode="fast")
    with pytest.raises(ValueError, match="barrier_groups must be one of per-use"):
        rp.jit(step, barrier_groups="per-layer")
    with pytest.raises(ValueError, match="both static and donated"):
        rp.jit(step, static_argnums=1, donate_argnums=1)
    with pytest.raises(TypeError, match="must be hashable"):
        rp.jit(lambda a, b: a, static_argnums=1)(jnp.ones(1), [1])


@pytest.mark.parametrize("mode", ["joint", "split"])
def test_an_activation_budget_below_the_parameters_is_met(mode):
    """auto's budget counts activations (what the backward keeps beyond the step's own
    arguments: parameters, optimizer state, batch), so a budget far below the parameters'
    bytes is normal: it is met, and the step trains as jax.jit's does."""
    params = init(jax.random.key(0))
    param_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    budget = param_bytes // 20
    jitted = rp.jit(step, policy=f"auto(budget={budget})", mode=mode)
    got = train(jitted, n=5)
    want = train(jax.jit(step), n=5)
    np.testing.assert_allclose(got[3], want[3], rtol=2e-5)
    lowered = jitted.lower(got[0], got[1], next(batches(1)))
    kept = activation_bytes(lowered.residuals)
    assert 0 < kept <= budget < param_bytes, (kept, budget, param_bytes)
    assert any(r.argument for r in lowered.residuals)    # the arguments are kept, uncounted
    assert f"budget {budget} B of activations" in lowered.remarks[0]


# ------------------------------------------------------------------ disk cache --
def _grad_step(w, x):
    return w - 0.1 * jax.grad(lambda w: jnp.sum(jnp.tanh(jnp.sin(x @ w) @ w)))(w)


W, X = jnp.ones((4, 4)) * 0.1, jnp.ones((2, 4))


def unfenced(lowered) -> int:
    """1 where rp.jit built a twin without fence-chains (XLA:CPU of jaxlib >= 0.11, a fence
    placed), else 0."""
    return sum(k.endswith(", chains not fenced") for k in lowered.footprints)


def run(jitted):
    """Call and lower from one place: the exported program holds the source position of
    the call, and the cache's key is the program."""
    return jitted(W, X), jitted.lower(W, X)


@pytest.mark.parametrize("mode", ["joint", "split"])
def test_disk_cache_serves_a_new_jitted_without_the_pipeline(tmp_path, monkeypatch, mode):
    """A second rp.jit of the same program with the same cache directory reads the rewrite
    from disk: the pipeline does not run (it would raise here), and the program, its
    residuals and its remarks are those of the first build. Where the first build compiled
    several programs and ran the smallest, the second compiles that one alone (the choice
    is kept in the cache too), and says so."""
    want, built = run(rp.jit(_grad_step, policy="nothing_saveable", mode=mode,
                             cache_dir=tmp_path))
    assert not built.from_cache
    entries = sorted(p.name.split(".", 1)[1] for p in tmp_path.iterdir())
    several = bool(built.footprints)     # (what each program built measured, where several)
    assert entries.count("choice.json") == several
    assert entries.count("json") == entries.count("mlirbc") == (len(entries) - several) // 2

    def no_pipeline(*args, **kwargs):
        raise AssertionError("the pipeline ran although the cache has the program")
    monkeypatch.setattr("remat_passes.api.jit.remat_variants", no_pipeline)
    compiled = []
    compile_all = rp_jit.Jitted._compile_all
    monkeypatch.setattr(rp_jit.Jitted, "_compile_all", lambda self, mode, exported, jobs, *a: (
        compiled.append(len(jobs)), compile_all(self, mode, exported, jobs, *a))[1])
    got, cached = run(rp.jit(_grad_step, policy="nothing_saveable", mode=mode,
                             cache_dir=tmp_path))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert cached.from_cache
    assert compiled == [1]
    assert (cached.barriers, cached.footprints) == (built.barriers, built.footprints)
    assert [str(r) for r in cached.residuals] == [str(r) for r in built.residuals]
    kept = " (the choice read from the disk cache, as an earlier process measured it; the " \
        "others not compiled again)"
    assert [str(r) for r in cached.remarks] == [
        str(r) + (kept if several and str(r).startswith("rp.jit: optimization barriers")
                  else "") for r in built.remarks]
    np.testing.assert_allclose(want, jax.jit(_grad_step)(W, X), rtol=1e-6)
    for damaged in tmp_path.glob("*.choice.json"):    # (unreadable: chosen again, rewritten)
        damaged.write_text("{not json")
        compiled.clear()
        run(rp.jit(_grad_step, policy="nothing_saveable", mode=mode, cache_dir=tmp_path))
        assert compiled[0] > 1 and json.loads(damaged.read_text())["footprints"]


def test_disk_cache_keys_on_the_options_and_skips_python_policies(tmp_path, monkeypatch):
    for options in ({"policy": "nothing_saveable"}, {"policy": "dots_saveable"},
                    {"policy": "dots_saveable", "prevent_cse": False}):
        assert not run(rp.jit(_grad_step, cache_dir=tmp_path, **options))[1].from_cache
    # an entry per barrier variant rp.jit builds (without prevent_cse: one, no barriers)
    per_call = len(rp_jit.barrier_variants("joint"))
    assert len(list(tmp_path.glob("*.mlirbc"))) == 2 * per_call + 1
    assert run(rp.jit(_grad_step, policy="dots_saveable", cache_dir=tmp_path))[1].from_cache
    # a policy of the user's own is Python code: nothing says what it decides
    run(rp.jit(_grad_step, policy=lambda op: op.name == "stablehlo.sine", cache_dir=tmp_path))
    assert len(list(tmp_path.glob("*.mlirbc"))) == 2 * per_call + 1
    # the environment variable names the directory when the argument does not
    monkeypatch.setenv("REMAT_PASSES_CACHE_DIR", str(tmp_path / "env"))
    assert not run(rp.jit(_grad_step, policy="nothing_saveable"))[1].from_cache
    assert run(rp.jit(_grad_step, policy="nothing_saveable"))[1].from_cache
    assert not run(rp.jit(_grad_step, policy="nothing_saveable", cache_dir=False))[1].from_cache


def test_disk_cache_misses_once_the_passes_change(tmp_path, monkeypatch):
    """The key holds a digest of remat_passes' source files: an entry written before a pass
    changed (the same version number: a checkout moved on) is not served."""
    from remat_passes.api import cache
    assert not run(rp.jit(_grad_step, policy="nothing_saveable", cache_dir=tmp_path))[1] \
        .from_cache
    assert run(rp.jit(_grad_step, policy="nothing_saveable", cache_dir=tmp_path))[1].from_cache
    monkeypatch.setattr(cache, "code_digest", lambda: "another-checkout")
    assert not run(rp.jit(_grad_step, policy="nothing_saveable", cache_dir=tmp_path))[1] \
        .from_cache


def test_a_damaged_cache_entry_is_a_miss_and_is_written_again(tmp_path):
    run(rp.jit(_grad_step, policy="nothing_saveable", cache_dir=tmp_path))
    entries = list(tmp_path.glob("*.mlirbc"))     # (one per barrier variant rp.jit builds)
    assert len(entries) == len(rp_jit.barrier_variants("joint"))
    for entry in entries:
        entry.write_bytes(b"ML\xefR garbage")
    got, again = run(rp.jit(_grad_step, policy="nothing_saveable", cache_dir=tmp_path))
    np.testing.assert_allclose(got, jax.jit(_grad_step)(W, X), rtol=1e-6)
    assert not again.from_cache
    assert run(rp.jit(_grad_step, policy="nothing_saveable", cache_dir=tmp_path))[1].from_cache


def test_disk_cache_is_read_by_another_process(tmp_path):
    """The real use: a second Python process finds the first one's rewrite."""
    import sys
    script = (
        "import jax, jax.numpy as jnp, remat_passes as rp\n"
        "def f(w, x):\n"
        "    return w - 0.1 * jax.grad(lambda w: jnp.sum(jnp.tanh(jnp.sin(x @ w) @ w)))(w)\n"
        f"j = rp.jit(f, policy='nothing_saveable', cache_dir={str(tmp_path)!r})\n"
        "w, x = jnp.ones((4, 4)) * 0.1, jnp.ones((2, 4))\n"
        "j(w, x)\n"
        "print(j.lower(w, x).from_cache)\n")
    runs = [run_process([sys.executable, "-c", script], capture_output=True, text=True,
                           timeout=300) for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], runs[-1].stderr
    assert [r.stdout.split()[-1] for r in runs] == ["False", "True"]


def test_jax_checkpoint_regions_in_a_training_step():
    """A model that wraps its layers in jax.checkpoint: with jax_checkpoint="regions" the
    layers are regions the passes apply (an outer rp.checkpoint's policy decides inside
    them, as jax.checkpoint's would), with jax.jit's results."""
    def ckpt_loss(params, x, y):
        h = x
        for p in params:
            def layer(p, h):
                a = rp.checkpoint_name(jax.nn.gelu(h @ p["w1"]), "act")
                return h + a @ p["w2"]
            h = jax.checkpoint(layer)(p, h)
        return jnp.mean((h - y) ** 2)

    def ckpt_step(params, x, y):
        g = jax.grad(rp.checkpoint(ckpt_loss, policy="save_only_these_names('act')"))(
            params, x, y)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, g)
    params = init(jax.random.key(0))
    x, y = next(batches(1))
    jitted = rp.jit(ckpt_step, jax_checkpoint="regions")
    lowered = jitted.lower(params, x, y)
    assert "rematted_computation" not in lowered.exported.text(debug_info=True)
    named = [r for r in lowered.residuals if r.description.startswith("named")]
    assert len(named) == LAYERS and all("'act'" in r.description for r in named), named
    for got, want in zip(jax.tree.leaves(jitted(params, x, y)),
                         jax.tree.leaves(jax.jit(ckpt_step)(params, x, y))):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="jax_checkpoint"):
        rp.jit(ckpt_step, jax_checkpoint="yes")


OFFLOAD_H = ("save_and_offload_only_these_names(names_which_can_be_saved=[], "
             "names_which_can_be_offloaded=['act'], offload_src='device', "
             "offload_dst='pinned_host')")


def test_split_form_keeps_offloaded_residuals_in_host_memory():
    """The split form hands an offloaded residual from the forward executable to the
    backward one in host memory (XLA:GPU refuses a value moved to host that an executable
    returns in device memory), with jax.jit's results; so does Module.call of the halves."""
    params = init(jax.random.key(0))
    state = OPT.init(params)
    batch = next(batches(1))
    jitted = rp.jit(step, policy=OFFLOAD_H, mode="split")
    fwd, bwd = jitted.lower(params, state, batch).executables
    assert "pinned_host" in {s.memory_kind for s in jax.tree.leaves(fwd.output_shardings)}
    assert "pinned_host" in {s.memory_kind for s in jax.tree.leaves(bwd.input_shardings)}
    for got, want in zip(jax.tree.leaves(jitted(params, state, batch)),   # (AdamW: see
                         jax.tree.leaves(jax.jit(step)(params, state, batch))):  # above)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-5)
    split = rp.remat(rp.export_vjp(loss, params, *batch), OFFLOAD_H, mode="split")
    y, *residuals = split.call(params, *batch, function="main_fwd")
    offloaded = [r.sharding.memory_kind for r in residuals].count("pinned_host")
    assert offloaded == LAYERS, [r.sharding.memory_kind for r in residuals]
    grads = split.call(*residuals, jnp.ones(()), function="main_bwd")
    want = jax.grad(loss, argnums=(0, 1, 2))(params, *batch)
    for got, ref in zip(jax.tree.leaves(grads), jax.tree.leaves(want)):
        np.testing.assert_allclose(got, ref, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("callback", ["debug_print", "pure_callback"])
def test_a_host_callback_is_a_clear_error(callback):
    """jax.export cannot carry a host callback (JAX raises NotImplementedError about
    serialization): rp.jit and rp.export_vjp say what in the function is the cause."""
    def loss(w, x):
        h = jnp.tanh(x @ w)
        if callback == "debug_print":
            jax.debug.print("mean {}", h.mean())
        else:
            h = h + jax.pure_callback(np.sin, jax.ShapeDtypeStruct(h.shape, h.dtype),
                                      jax.lax.stop_gradient(h))
        return jnp.mean(h ** 2)
    w, x = jnp.eye(4), jnp.ones((2, 4))
    with pytest.raises(rp.RematError, match="calls back into Python .* cannot carry a host"):
        rp.jit(lambda w: jax.value_and_grad(loss)(w, x))(w)
    with pytest.raises(rp.RematError, match="calls back into Python"):
        rp.export_vjp(loss, w, x)


@pytest.mark.parametrize("mode", ["joint", "split"])
def test_under_jax_vmap_it_is_rp_jit_of_the_vmapped_function(mode):
    """jax.vmap of an rp.jit function failed with "Batching rule for 'call_exported' not
    implemented" (the rewritten program runs through jax.export's call), then with an error
    that said to vmap inside. It now is rp.jit of the vmapped function: jax.jit's answer, in
    either form, one build per way of batching, under jax.jit too (joint form), with static
    keyword arguments and nested vmaps."""
    def step(w, x, scale=1.0):
        return w - 0.1 * scale * jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
    w, xs = jnp.eye(4) * 0.5, jnp.linspace(-1, 1, 24).reshape(3, 2, 4)
    f = rp.jit(step, policy="nothing_saveable", mode=mode, static_argnames="scale")
    want = jax.jit(jax.vmap(step, in_axes=(None, 0)))(w, xs)
    np.testing.assert_allclose(jax.vmap(f, in_axes=(None, 0))(w, xs), want,
                               rtol=1e-6, atol=1e-7)
    ws = jnp.stack([w, 2 * w, 3 * w])
    np.testing.assert_allclose(jax.vmap(lambda w, x: f(w, x, scale=2.0))(ws, xs),
                               jax.vmap(lambda w, x: step(w, x, 2.0))(ws, xs),
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(
        jax.vmap(jax.vmap(f, in_axes=(None, 0)), in_axes=(None, 0))(w, xs[:, None]),
        want[:, None], rtol=1e-6, atol=1e-7)
    assert f.builds == 0 and len(f._batched) == 2       # (the plain function never built;
    # the nested vmap's inner one is the outer's Jitted's own)
    if mode == "joint":    # differentiated outside the vmap: the vmapped program's gradients
        loss = lambda f: lambda w: jnp.sum(jax.vmap(f, in_axes=(None, 0))(w, xs) ** 2)
        np.testing.assert_allclose(jax.grad(loss(f))(w), jax.grad(loss(step))(w),
                                   rtol=1e-5, atol=1e-7)
    # under a vmap that batches none of its arguments: the plain function, as without vmap
    unbatched = lambda w: jax.vmap(lambda x: f(w, xs[0]) + 0 * x.sum())(xs)
    np.testing.assert_allclose(unbatched(w), jnp.stack([step(w, xs[0])] * 3),
                               rtol=1e-6, atol=1e-7)
    assert f.builds == 1
    if mode == "joint":
        np.testing.assert_allclose(jax.jit(unbatched)(w), jnp.stack([step(w, xs[0])] * 3),
                                   rtol=1e-6, atol=1e-7)
    batched = next(iter(f._batched.values()))
    assert batched.builds == 1 and batched.lower(w, xs).mode == mode
    if mode == "joint":
        np.testing.assert_allclose(jax.jit(jax.vmap(f, in_axes=(None, 0)))(w, xs), want,
                                   rtol=1e-6, atol=1e-7)
        assert batched.builds == 1      # (the same program, called inside jax.jit)
    else:
        with pytest.raises(rp.RematError, match="in split form .* cannot be called inside"):
            jax.jit(jax.vmap(f, in_axes=(None, 0)))(w, xs)


def test_under_jax_vmap_pytrees_donation_and_other_batch_axes():
    """An ensemble of dict parameters (a scan and a cond in the step), donated: jax.jit's
    answer, and the donated (batched) buffers are gone; a batch axis other than the first."""
    def step(params, x):
        def loss(p):
            h, _ = jax.lax.scan(lambda h, w: (rp.checkpoint_name(jnp.tanh(h @ w), "h"), None),
                                x, p["ws"])
            h = jax.lax.cond(h.sum() > 0, jnp.sin, jnp.cos, h)
            return jnp.mean((h @ p["out"]) ** 2)
        value, grad = jax.value_and_grad(loss)(params)
        return value, jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grad)
    rng = np.random.default_rng(0)
    ens = {"ws": jnp.asarray(rng.normal(size=(4, 3, 8, 8)) * 0.3, jnp.float32),
           "out": jnp.asarray(rng.normal(size=(4, 8, 2)), jnp.float32)}
    xs = jnp.asarray(rng.normal(size=(4, 5, 8)), jnp.float32)
    want = jax.jit(jax.vmap(step))(ens, xs)
    f = rp.jit(step, policy="save_only_these_names(h)", donate_argnums=0)
    donated = jax.tree_util.tree_map(jnp.copy, ens)
    assert_trees_close(jax.vmap(f)(donated, xs), want)
    assert all(x.is_deleted() for x in jax.tree_util.tree_leaves(donated))
    one = jax.tree_util.tree_map(lambda p: p[0], ens)
    g = rp.jit(step, policy="save_only_these_names(h)")
    assert_trees_close(jax.vmap(g, in_axes=(None, 1))(one, jnp.moveaxis(xs, 0, 1)),
                       jax.vmap(step, in_axes=(None, 1))(one, jnp.moveaxis(xs, 0, 1)))
    # a collective over the vmap's named axis inside the function: gradients averaged
    # over the batch, as data parallelism does it with jax.lax.pmean
    def averaged(params, x):
        value, new = step(params, x)
        return jax.lax.pmean(value, "batch"), jax.lax.pmean(new, "batch")
    assert_trees_close(
        jax.vmap(rp.jit(averaged, policy="nothing_saveable"), in_axes=(None, 0),
                 axis_name="batch")(one, xs),
        jax.vmap(averaged, in_axes=(None, 0), axis_name="batch")(one, xs))


def test_inside_jax_jit_a_closure_over_a_traced_value_is_a_clear_error():
    """rp.jit of a function that closes over an argument of the jax.jit around the call:
    jax.export cannot carry the tracer, and its error was "Too many leaves for PyTreeDef".
    Now it says what is wrong and what to do; passed as an argument, it gives jax.jit's
    answer."""
    def step(w, x):
        return jax.value_and_grad(lambda w: jnp.mean(jnp.sin(x @ w) ** 2))(w)
    w, x = jnp.eye(4) * 0.5, jnp.ones((3, 4))
    with pytest.raises(rp.RematError, match="closes over a value traced by an enclosing "
                                            "transformation.*as an argument"):
        jax.jit(lambda w, x: rp.jit(lambda x: step(w * 2, x))(x))(w, x)
    got = jax.jit(lambda w, x: rp.jit(step, policy="nothing_saveable")(w * 2, x))(w, x)
    assert_trees_close(got, jax.jit(lambda w, x: step(w * 2, x))(w, x))


def test_under_a_vmapped_jax_jit_it_is_rp_jit_of_the_vmapped_function():
    """An rp.jit function called inside a jax.jit that is vmapped in turn
    (`jax.vmap(jax.jit(g))`): JAX batched the exported program's call and failed with
    "Batching rule for 'call_exported' not implemented". Now it is batched as under jax.vmap
    directly: jax.jit's answer, nested vmaps and a PRNG key too. The program compiled for
    jax.jit(g) is that of the exported call alone; a gradient through that jax.jit (of the
    gradient) is still jax.grad's; a derivative of the vmapped jax.jit is a clear error."""
    def step(w, x, key):
        def loss(w):
            h = jnp.tanh(x @ w)
            return jnp.mean(jnp.where(jax.random.bernoulli(key, 0.8, h.shape), h, 0.0) ** 2)
        return jax.value_and_grad(loss)(w)
    w, xs = jnp.eye(4) * 0.5, jnp.linspace(-1, 1, 24).reshape(3, 2, 4)
    keys = jax.random.split(jax.random.key(0), 3)
    f = rp.jit(step, policy="nothing_saveable")
    g = jax.jit(lambda w, x, key: f(w, x, key))
    assert_trees_close(jax.vmap(g, in_axes=(None, 0, 0))(w, xs, keys),
                       jax.vmap(step, in_axes=(None, 0, 0))(w, xs, keys))
    assert_trees_close(
        jax.vmap(jax.vmap(g, in_axes=(None, 0, None)), in_axes=(None, 0, None))(
            w, xs[:, None], keys[0]),
        jax.vmap(jax.vmap(step, in_axes=(None, 0, None)), in_axes=(None, 0, None))(
            w, xs[:, None], keys[0]))
    assert f.builds == 1 and len(f._batched) == 2
    exported = f.lower(w, xs[0], keys[0]).traced

    def instructions(jitted):    # (the HLO without its name, source locations, stack frames)
        text = jitted.lower(w, xs[0], keys[0]).compile().as_text()
        return [re.sub(r", metadata=\{[^}]*\}", "", line) for line in text.splitlines()[1:]
                if not re.match(r"(\d+ |FileNames|FunctionNames|FileLocations|StackFrames)",
                                line)]
    assert instructions(g) == instructions(jax.jit(lambda w, x, key: exported(w, x, key)))
    second = lambda f: lambda a: jnp.sum(jax.jit(f)(a, xs[0], keys[0])[1] ** 2)
    np.testing.assert_allclose(jax.grad(second(f))(w), jax.grad(second(step))(w),
                               rtol=1e-5, atol=1e-7)
    with pytest.raises(rp.RematError, match="differentiated from outside a jax.vmap of the "
                                            "jax.jit.*vmap the rp.jit function itself"):
        jax.grad(lambda a: jnp.sum(jax.vmap(g, in_axes=(None, 0, 0))(a, xs, keys)[0]))(w)


def test_under_jax_vmap_what_cannot_be_batched_is_a_clear_error():
    """Under jax.vmap of a derivative of an rp.jit function, the call JAX batches is
    jax.export's, which it cannot batch; the error says so and what does work. An rp.jit
    function with in_shardings does not say how to shard the batch axis."""
    def step(w, x):
        return jax.value_and_grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
    w, xs = jnp.eye(4) * 0.5, jnp.linspace(-1, 1, 24).reshape(3, 2, 4)
    f = rp.jit(step, policy="nothing_saveable")
    with pytest.raises(rp.RematError, match="cannot be batched here.*vmap the rp.jit "
                                            r"function itself.*rp.jit\(jax.vmap\(f"):
        jax.vmap(jax.grad(lambda w, x: f(w, x)[0]), in_axes=(None, 0))(w, xs)
    sharded = rp.jit(step, policy="nothing_saveable",
                     in_shardings=jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    with pytest.raises(rp.RematError, match="in_shardings or out_shardings.*batch axis"):
        jax.vmap(sharded, in_axes=(None, 0))(w, xs)


def test_split_form_donates_no_host_residual_to_a_device_gradient():
    """A residual offloaded to host memory whose shape and type a gradient has: the backward
    must not take its buffer for the gradient (in device memory), in rp.jit's split form nor
    where the user donates it to rp.compile's backward. Donated, PjRt aborted the whole
    process on the call ("PjRtBuffer's memory kind does not match sharding's memory kind"),
    on XLA:CPU of jaxlib 0.10.2 to 0.12."""
    w, x = jnp.eye(8) * 0.3, jnp.ones((8, 8))
    offload = "offload_dot_with_no_batch_dims(device, pinned_host)"

    def loss(w):
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    def step(w):
        return jax.value_and_grad(loss)(w)
    jitted = rp.jit(step, policy=offload, mode="split")
    _, bwd = jitted.lower(w).executables
    assert [s.memory_kind for s in jax.tree.leaves(bwd.input_shardings)] == ["pinned_host"]
    for got, want in zip(jax.tree.leaves(jitted(w)), jax.tree.leaves(jax.jit(step)(w))):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    split = rp.remat(rp.export_vjp(loss, w), offload, mode="split")
    _, residual = rp.compile(split, "main_fwd")(w)
    assert residual.sharding.memory_kind == "pinned_host"
    grad = rp.compile(split, "main_bwd", donate_argnums=0)(residual, jnp.ones(()))
    np.testing.assert_allclose(grad, jax.grad(loss)(w), rtol=1e-6, atol=1e-7)


def test_a_split_step_returns_its_offloaded_residual_in_host_memory():
    """The forward half of an exported training step takes the step's own arguments (the
    step's calling convention), and still returns an offloaded residual in host memory, as
    the backward half takes it (XLA:GPU refuses a value moved to host that an executable
    returns in device memory); it came back in device memory."""
    w, x = jnp.eye(8) * 0.3, jnp.ones((8, 8))

    def loss(w):
        return jnp.mean(jnp.tanh(x @ w) ** 2)
    split = rp.remat(rp.export(lambda w: jax.value_and_grad(loss)(w), w),
                     "offload_dot_with_no_batch_dims(device, pinned_host)", mode="split")
    value, residual = jax.tree.leaves(rp.compile(split, "main_fwd")(w))
    assert residual.sharding.memory_kind == "pinned_host"
    grad = rp.compile(split, "main_bwd")(residual)
    np.testing.assert_allclose(value, loss(w), rtol=1e-6)
    np.testing.assert_allclose(grad, jax.grad(loss)(w), rtol=1e-6, atol=1e-7)


def test_a_saved_sum_of_a_dot_and_a_bias_costs_no_more_than_in_jax_checkpoint():
    """`h = x @ w + b` saved by name, its gelu recomputed: XLA (GPU; XLA:CPU from jaxlib
    0.11) would compute the sum again inside backward fusions from the dot output and keep
    that live beside `h`, unless the backward reads `h` through a barrier
    (place-optimization-barriers' fence-producers). Measured, XLA:CPU of jaxlib 0.12: 8,654,884
    B without it against jax.checkpoint's 8,132,640 B; 7,606,308 B with it. (The saved value
    is the name marker's: fence-producers looks through it. Before, it found the chain only
    behind a rounding, and lost it when rp.jit stopped rounding f32 on XLA:CPU.)"""
    def f(x, w1, b1, w2):
        for _ in range(3):
            h = rp.checkpoint_name(x @ w1 + b1, "h")
            x = jnp.tanh(jax.nn.gelu(h) @ w2) + x
        return x
    k = jax.random.split(jax.random.key(0), 4)
    args = (jax.random.normal(k[0], (256, 256)), jax.random.normal(k[1], (256, 512)) * .05,
            jax.random.normal(k[2], (512,)), jax.random.normal(k[3], (512, 256)) * .05)

    def grads(fun):
        return lambda *a: jax.vjp(fun, *a)[1](jnp.ones((256, 256)))
    ours = rp.jit(grads(f), policy="save_only_these_names('h')")
    lowered = ours.lower(*args)
    theirs = jax.jit(grads(jax.checkpoint(
        f, policy=jax.checkpoint_policies.save_only_these_names("h")))).lower(*args).compile()
    if lowered.footprint() is not None:
        assert lowered.footprint() <= 1.02 * common.xla_footprint(common.xla_memory(theirs))
    for got, want in zip(ours(*args), jax.jit(grads(f))(*args)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("policy", ["nothing_saveable", "dots_saveable"])
def test_a_gelu_cotangent_read_by_dots_and_a_reduce_is_computed_once(policy):
    """An MLP under vmap, as Equinox writes it: the cotangent through the GELU is read by the
    two weight-gradient dots (through a transpose) and by the bias gradient's reduce. XLA
    computes that cheap chain again inside each reader and holds its inputs, two 256-wide
    products, until the last; with jaxlib >= 0.11 rp.jit fences it (place-optimization-
    barriers' fence-chains) and XLA:CPU computes it once. Measured, XLA:CPU of jaxlib 0.12
    with YNNPACK's fusions off (with them on, XLA does not count what the fused products
    hold: the two programs report the same), joint: nothing_saveable 2,885,664 B without
    the fence, 2,295,840 B with it (jax.checkpoint's 2,951,200 B); dots_saveable 2,885,664 B
    and 2,033,696 B (2,820,128 B)."""
    def f(x, w1, b1, w2):
        block = jax.vmap(jax.vmap(lambda v: w2 @ jax.nn.gelu(w1 @ v + b1)))
        for _ in range(2):
            x = block(x) + x
        return x
    k = jax.random.split(jax.random.key(0), 4)
    args = (jax.random.normal(k[0], (8, 32, 64)), jax.random.normal(k[1], (256, 64)) * .1,
            jax.random.normal(k[2], (256,)), jax.random.normal(k[3], (64, 256)) * .1)
    ct = jnp.ones((8, 32, 64))

    def grads(fun):
        return lambda *a: jax.vjp(fun, *a)[1](ct)
    ours = rp.jit(grads(f), policy=policy)
    for got, want in zip(ours(*args), jax.jit(grads(f))(*args)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    def fences(fence_chains):     # one-value barriers (`%5 = ...`; a group's has `:n`)
        # (per region: per use, under nothing_saveable, the forward keeps no activation and
        # gets no barrier where XLA:CPU keeps them through CSE, so no fence either)
        text = rp.jit(grads(f), policy=policy, fence_chains=fence_chains,
                      barrier_groups="per-region").lower(*args).module.text()
        return len(re.findall(r"%[^\s:]+ = stablehlo\.optimization_barrier", text))
    assert fences(True) >= 2 and fences(False) == 0     # (one a block, on any backend)
    if not rp_jit.fences_chains():
        return      # (XLA:CPU of jaxlib 0.10 fuses across barriers: a fence changes nothing)
    module = rp.export_vjp(f, *args)

    def footprint(fence):      # the smaller of rp.jit's two barrier groupings, as it runs
        return min(common.xla_footprint(common.xla_memory(rp.compile(rp.remat(
            module, policy, tie_to_cotangent=True, barrier_groups=groups,
            fence_chains=fence), "main").lower(*args, ct).compile(
                compiler_options={"xla_cpu_experimental_ynn_fusion_type": ""})))
            for groups in ("per-use", "per-region"))
    assert footprint(True) <= 0.9 * footprint(False)


@pytest.mark.parametrize("policy, jax_policy", [
    ("nothing_saveable", jax.checkpoint_policies.nothing_saveable),
    ("save_only_these_names('l2')", jax.checkpoint_policies.save_only_these_names("l2"))])
@pytest.mark.exact
def test_a_recomputed_bf16_dot_shares_the_forwards_copy_of_its_weight(policy, jax_policy):
    """XLA:CPU computes a bf16 dot in f32, from an f32 copy of the weight it makes at the
    start of the program. A recomputed dot that read its weight through the barrier (another
    value to XLA) got a second copy beside the forward's, held until the backward: with
    the tie (XLA:CPU), a clone that reads a recomputed value reads the arguments beside it
    directly (place-optimization-barriers' `_inputs_to_hide`). Measured, XLA:CPU of jaxlib
    0.12 with YNNPACK's fusions off, joint, the smaller of the two groupings:
    nothing_saveable 4,210,762 B before, 3,186,760 B after (jax.checkpoint's 3,186,744 B);
    save_only_these_names('l2') 3,436,680 B and 3,166,280 B (3,190,840 B). jaxlib 0.10
    merges the copies itself."""
    from jax.ad_checkpoint import checkpoint_name

    def model(name):
        def f(x, ws):
            for i, w in enumerate(ws):
                x = name(jnp.tanh(x @ w), f"l{i}")
            return jnp.sum(x.astype(jnp.float32))
        return f
    k = jax.random.split(jax.random.key(0), 7)
    ws = [(jax.random.normal(k[i], (256, 256)) * .05).astype(jnp.bfloat16) for i in range(6)]
    x = jax.random.normal(k[6], (8, 256)).astype(jnp.bfloat16)
    ct = jnp.ones((), jnp.float32)
    f = model(rp.checkpoint_name)

    def grads(fun):
        return lambda *a: jax.vjp(fun, *a)[1](ct)
    for got, want in zip(jax.tree.leaves(rp.jit(grads(f), policy=policy)(x, ws)),
                         jax.tree.leaves(jax.jit(grads(f))(x, ws))):
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    if jax.default_backend() != "cpu":
        return
    options = {"xla_cpu_experimental_ynn_fusion_type": ""}
    module = rp.export_vjp(f, x, ws)
    ours = min(common.xla_footprint(common.xla_memory(rp.compile(rp.remat(
        module, policy, tie_to_cotangent=True, barrier_groups=groups,
        fence_chains=rp_jit.fences_chains()), "main").lower(x, ws, ct).compile(
            compiler_options=options))) for groups in ("per-use", "per-region"))
    theirs = jax.jit(grads(jax.checkpoint(model(checkpoint_name), policy=jax_policy))).lower(
        x, ws).compile(compiler_options=options)
    assert ours <= 1.02 * common.xla_footprint(common.xla_memory(theirs))


def _small_step(p, x, lr=0.1):
    def f(p):
        return jnp.mean((jnp.tanh(x @ p["w1"]) @ p["w2"]) ** 2)
    v, g = jax.value_and_grad(f)(p)
    return jax.tree.map(lambda a, b: a - lr * b, p, g), v


def test_lower_for_shapes_alone_builds_one_program_per_shape():
    """`lower` with jax.ShapeDtypeStruct arguments (memory planning without data) builds for
    those shapes: a second batch size is a second program, not the first one again (all
    specs were one cache entry before: the larger batch got the smaller one's program and
    its XLA footprint), and a call with arrays of one of those shapes runs what was built."""
    params = {"w1": jax.ShapeDtypeStruct((4, 8), jnp.float32),
              "w2": jax.ShapeDtypeStruct((8, 2), jnp.float32)}
    jitted = rp.jit(_small_step, policy="nothing_saveable")
    small = jitted.lower(params, jax.ShapeDtypeStruct((16, 4), jnp.float32))
    large = jitted.lower(params, jax.ShapeDtypeStruct((4096, 4), jnp.float32))
    assert small is not large and jitted.builds == 2
    assert "tensor<4096x4xf32>" in large.as_text() and "tensor<4096x4xf32>" not in small.as_text()
    assert large.footprint() > 100 * small.footprint()
    assert jitted.lower(params, jax.ShapeDtypeStruct((16, 4), jnp.float32)) is small
    # arrays of those shapes made without a sharding run what lower built
    jitted({"w1": jnp.ones((4, 8)), "w2": jnp.ones((8, 2))}, jnp.ones((16, 4)))
    assert jitted.builds == 2


@pytest.mark.parametrize("mode", ["joint", "split"])
def test_lowered_compiles_and_runs_as_jax_jits_does(mode):
    """`jitted.lower(...).compile()` runs like jax.jit's Compiled: called with the dynamic
    arguments (static ones left out), the same results as jax.jit; `cost_analysis()` and
    `as_text()` (XLA's HLO; the Lowered's is the rewritten MLIR) say what was compiled;
    arguments of other shapes, another structure or a static keyword are a TypeError that
    says which."""
    p = {"w1": jnp.ones((4, 8)) * 0.1, "w2": jnp.ones((8, 2))}
    x = jnp.arange(64.0).reshape(16, 4) / 64
    specs = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), p)
    jitted = rp.jit(_small_step, policy="nothing_saveable", mode=mode, static_argnames="lr")
    compiled = jitted.lower(specs, jax.ShapeDtypeStruct((16, 4), jnp.float32), lr=0.5).compile()
    got = compiled(p, x)
    expected = jax.jit(_small_step, static_argnames="lr")(p, x, lr=0.5)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    costs = compiled.cost_analysis()
    assert len(costs) == (1 if mode == "joint" else 2) and all(c["flops"] > 0 for c in costs)
    assert compiled.as_text().count("HloModule ") == len(costs)     # (XLA's programs)
    assert re.search(r"func\.func (public )?@main(_fwd)?\(", compiled.lowered.as_text())
    assert compiled.residuals == compiled.lowered.residuals     # (the Lowered's, as they are)
    with pytest.raises(TypeError, match=r"leaf 2 was float32\[16,4\], called with "
                       r"float32\[8,4\]"):
        compiled(p, x[:8])
    with pytest.raises(TypeError, match="argument structure"):
        compiled(p)
    with pytest.raises(TypeError, match="static arguments are part of what was built"):
        compiled(p, x, lr=0.5)
    with pytest.raises(TypeError, match="leaf 2 is a jax.ShapeDtypeStruct, which has no data"):
        jitted(p, jax.ShapeDtypeStruct((16, 4), jnp.float32), lr=0.5)


@pytest.mark.parametrize("mode", ["joint", "split"])
def test_lower_for_specs_of_keys_and_weak_scalars(mode):
    """A typed PRNG key and a weakly typed scalar given to `lower` as specs: the step builds
    (the split halves take a key's words: the spec of a key was passed as a key, "Rank
    mismatch ... expected (2,)") and its compiled form takes the key and a Python float, as
    jax.jit's does."""
    def dropout_step(p, x, key, scale):
        def f(p):
            h = jnp.tanh(x @ p["w1"])
            return jnp.mean((jnp.where(jax.random.bernoulli(key, 0.8, h.shape), h, 0)
                             @ p["w2"]) ** 2)
        v, g = jax.value_and_grad(f)(p)
        return jax.tree.map(lambda a, b: a - scale * b, p, g), v
    p = {"w1": jnp.ones((4, 8)) * 0.1, "w2": jnp.ones((8, 2))}
    x, key = jnp.arange(64.0).reshape(16, 4) / 64, jax.random.key(3)
    specs = (jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), p),
             jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct((), key.dtype),
             jax.ShapeDtypeStruct((), jnp.float32, weak_type=True))
    compiled = rp.jit(dropout_step, policy="nothing_saveable", mode=mode).lower(*specs).compile()
    got, expected = compiled(p, x, key, 0.1), jax.jit(dropout_step)(p, x, key, 0.1)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        np.testing.assert_allclose(a, b, rtol=1e-6)
