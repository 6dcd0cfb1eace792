"""rp.jit of a step whose arguments and results have leaves that are not arrays (an Equinox
Module's activation function), taken as static as `eqx.filter_jit` takes them
(api/static_leaves.py): the same losses and parameters as eqx.filter_jit's, the policy's
residuals as jax.checkpoint's, the function back in the returned Module."""
from __future__ import annotations

from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import remat_passes as rp
from remat_testlib import assert_trees_close, jax_saved_residuals, jax_type, our_type

eqx = pytest.importorskip("equinox")
OPT = optax.adam(1e-2)
STEPS = 3
X = jax.random.normal(jax.random.key(1), (16, 8))
Y = jnp.zeros((16, 4))


class Net(eqx.Module):
    """An MLP (its activation function a leaf) and a Dropout (its rate and `inference`
    flag Python leaves: arrays under jax.jit, the rate then a parameter to
    eqx.filter(model, eqx.is_array) and the flag a traced bool)."""
    mlp: eqx.nn.MLP
    drop: eqx.nn.Dropout

    def __init__(self, key):
        self.mlp = eqx.nn.MLP(8, 4, 32, depth=2, activation=jax.nn.gelu, key=key)
        self.drop = eqx.nn.Dropout(0.25)

    def __call__(self, x, key):
        return self.drop(self.mlp(x), key=key)


def make():
    model = Net(jax.random.key(0))
    return model, OPT.init(eqx.filter(model, eqx.is_array))


def loss_fn(model, x, y, key=jax.random.key(2)):
    keys = jax.random.split(key, x.shape[0])
    return jnp.mean((jax.vmap(model)(x, keys) - y) ** 2)


def step(model, opt_state, x, y):
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
    updates, opt_state = OPT.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    return eqx.apply_updates(model, updates), opt_state, loss


def train(jitted) -> tuple:
    model, opt_state = make()
    losses = []
    for _ in range(STEPS):
        model, opt_state, loss = jitted(model, opt_state, X, Y)
        losses.append(float(loss))
    return losses, model


@pytest.fixture(scope="module")
def reference():
    return train(eqx.filter_jit(step))


@pytest.mark.parametrize("mode,policy", [("joint", "nothing_saveable"),
                                         ("split", "dots_saveable")])
def test_an_equinox_step_runs_as_under_filter_jit(reference, mode, policy):
    """Before, jax.jit's error: the MLP's activation function is not a valid JAX type.
    The function, the Dropout's rate and flag come back as they went in."""
    jitted = rp.jit(step, mode=mode, policy=policy)
    losses, model = train(jitted)
    np.testing.assert_allclose(losses, reference[0], rtol=1e-5)
    assert len(set(losses)) == STEPS
    assert_trees_close(jax.tree.leaves(eqx.filter(model, eqx.is_array)),
                       jax.tree.leaves(eqx.filter(reference[1], eqx.is_array)),
                       rtol=1e-4, atol=1e-6)
    assert model.mlp.activation is jax.nn.gelu and model.drop.p == 0.25 and \
        model.drop.inference is False
    assert jitted.builds == 1


def test_an_equinox_step_called_again_takes_the_short_way(monkeypatch):
    """Called again with a Module like the last one (the same static leaves, arrays of the
    same shapes), the step runs its program without rp.jit's full way through the
    arguments (`call_cache`), the static leaves put back in the results; a Module with
    another static leaf (inference mode) takes the full way and builds once more. Results
    as eqx.filter_jit's throughout."""
    from remat_passes.api import jit as rp_jit
    full = []
    taken = rp_jit.Jitted._taken
    monkeypatch.setattr(rp_jit.Jitted, "_taken", lambda self, a, k: (full.append(1),
                                                                     taken(self, a, k))[1])
    jitted, want = rp.jit(step, policy="nothing_saveable"), eqx.filter_jit(step)
    model, opt_state = make()
    for inference, in_full in ((False, True), (False, False), (True, True), (True, False),
                               (False, False)):
        model = eqx.nn.inference_mode(model, inference)
        before = len(full)
        expected = want(model, opt_state, X, Y)
        got = jitted(model, opt_state, X, Y)
        assert (len(full) > before) == in_full, inference
        assert got[0].mlp.activation is jax.nn.gelu and got[0].drop.p == 0.25 and \
            got[0].drop.inference is inference
        assert jax.tree.structure(got) == jax.tree.structure(expected)
        assert_trees_close(jax.tree.leaves(eqx.filter(got, eqx.is_array)),
                           jax.tree.leaves(eqx.filter(expected, eqx.is_array)), rtol=1e-5)
        model, opt_state = got[0], got[1]
    assert jitted.builds == 2


def test_an_equinox_step_saves_what_jax_checkpoint_saves():
    model, opt_state = make()
    ours = rp.jit(step, policy="dots_saveable").lower(model, opt_state, X, Y).residuals
    params, static = eqx.partition(model, eqx.is_inexact_array)
    theirs = jax_saved_residuals(jax.checkpoint(
        lambda p, x, y: loss_fn(eqx.combine(p, static), x, y),
        policy=jax.checkpoint_policies.dots_saveable), params, X, Y)
    assert Counter(our_type(r) for r in ours if not r.argument) == Counter(
        jax_type(a) for a, d in theirs if not d.startswith("from the argument"))
    assert any(r.argument and "model.mlp.layers[0].weight" in r.description for r in ours), \
        [str(r) for r in ours]


def test_an_equinox_loss_under_filter_grad_filter_jit_and_vmap():
    """Differentiated from outside (eqx.filter_grad), called inside eqx.filter_jit, and
    per example under jax.vmap (rp.jit of the vmapped function, whose arguments keep their
    static leaves): the gradients are JAX's."""
    model, _ = make()
    expected = eqx.filter_grad(loss_fn)(model, X, Y)
    loss = rp.jit(loss_fn, policy="nothing_saveable")
    for got in (eqx.filter_grad(loss)(model, X, Y),
                eqx.filter_jit(eqx.filter_grad(loss))(model, X, Y)):
        assert_trees_close(jax.tree.leaves(got), jax.tree.leaves(expected))
    per_example = jax.vmap(eqx.filter_grad(loss_fn), in_axes=(None, 0, 0))(
        model, X[:, None], Y[:, None])
    got = jax.vmap(rp.jit(eqx.filter_grad(loss_fn), policy="nothing_saveable"),
                   in_axes=(None, 0, 0))(model, X[:, None], Y[:, None])
    assert_trees_close(jax.tree.leaves(got), jax.tree.leaves(per_example))


def test_a_non_array_leaf_is_part_of_the_signature():
    """A function among the leaves is static: another one builds again, the same one
    does not; results as jax.jit's with the function closed over. A Python number outside
    an Equinox Module (a learning rate) is an array, as under jax.jit: no build per value."""
    def grad_step(params, x, lr):
        g = jax.grad(lambda w: jnp.sum(params["act"](x @ w)))(params["w"])
        return {"w": params["w"] - lr * g, "act": params["act"]}
    jitted = rp.jit(grad_step, policy="nothing_saveable")
    w, x = jnp.ones((4, 3)) * 0.1, jnp.linspace(0, 1, 8).reshape(2, 4)
    for act, lr in ((jnp.tanh, 0.1), (jnp.sin, 0.1), (jnp.tanh, 0.5)):
        got = jitted({"w": w, "act": act}, x, lr)
        assert got["act"] is act
        np.testing.assert_allclose(got["w"], jax.jit(lambda w, x: grad_step(
            {"w": w, "act": act}, x, lr)["w"])(w, x), rtol=1e-6)
    assert jitted.builds == 2


def test_an_unhashable_non_array_leaf_is_a_clear_error():
    class Config:
        __hash__ = None
    with pytest.raises(rp.RematError, match=r"argument leaf settings\['cfg'\] is a Config, "
                                            r"not an array.*must be hashable"):
        rp.jit(lambda w, settings: jax.grad(lambda w: jnp.sum(w ** 2))(w))(
            jnp.ones(3), {"cfg": Config()})


def test_a_lowered_equinox_step_runs_as_the_rp_jit_function():
    """As after jax.jit's lower(...).compile(): called with the arguments, whose leaves that
    are not arrays it takes as the rp.jit function does."""
    model, opt_state = make()
    jitted = rp.jit(step, policy="nothing_saveable")
    got = jitted.lower(model, opt_state, X, Y).compile()(model, opt_state, X, Y)
    assert got[0].mlp.activation is jax.nn.gelu
    assert_trees_close(jax.tree.leaves(eqx.filter(got, eqx.is_array)), jax.tree.leaves(
        eqx.filter(jitted(model, opt_state, X, Y), eqx.is_array)), rtol=0, atol=0)


def test_an_rp_jit_method_takes_its_instance_as_a_static_argument():
    """`@rp.jit` on a method of a plain class: the instance (not an array) is static, read
    when the step is built, one build per instance."""
    class Trainer:
        def __init__(self, lr):
            self.lr = lr

        @rp.jit(policy="nothing_saveable")
        def sgd(self, w, x):
            return w - self.lr * jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)
    w, x = jnp.ones((3, 2)) * 0.1, jnp.linspace(0, 1, 12).reshape(4, 3)
    for lr in (0.1, 0.5):
        trainer = Trainer(lr)
        expected = w - lr * jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)
        np.testing.assert_allclose(trainer.sgd(w, x), expected, rtol=1e-6)
        np.testing.assert_allclose(trainer.sgd.lower(w, x).compile()(w, x), expected,
                                   rtol=1e-6)
    assert Trainer.sgd.builds == 2


def test_eval_shape_of_an_equinox_step_gives_the_model_back_with_its_static_leaves():
    """The results' shapes as `eqx.filter_eval_shape` gives them: the Module's arrays as
    `jax.ShapeDtypeStruct`s, its activation function as it is; nothing built."""
    model, opt_state = make()
    jitted = rp.jit(step, policy="nothing_saveable")
    got = jitted.eval_shape(model, opt_state, X, Y)
    want = eqx.filter_eval_shape(step, model, opt_state, X, Y)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    assert jax.tree.leaves(got) == jax.tree.leaves(want)
    assert jitted.builds == 0
