"""rp.jit of a Flax NNX training step that updates its Module and Optimizer in place, as
`nnx.jit` runs it (api/graph_nodes.py): the same losses, parameters, BatchNorm statistics,
Rngs counts and optimizer state as nnx.jit's, the policy's residuals as jax.checkpoint's."""
from __future__ import annotations

from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import remat_passes as rp
from remat_testlib import assert_trees_close, jax_saved_residuals, jax_type, our_type

nnx = pytest.importorskip("flax.nnx")
STEPS = 3


class Net(nnx.Module):
    """Linear (no bias: one before BatchNorm gets a zero gradient, and AdamW turns its
    rounding noise into steps of the learning rate), BatchNorm, GELU, Dropout, Linear."""

    def __init__(self, rngs):
        self.l1 = nnx.Linear(16, 64, use_bias=False, rngs=rngs)
        self.bn = nnx.BatchNorm(64, rngs=rngs)
        self.drop = nnx.Dropout(0.25, rngs=rngs)
        self.l2 = nnx.Linear(64, 4, rngs=rngs)

    def __call__(self, x):
        return self.l2(self.drop(jax.nn.gelu(self.bn(self.l1(x)))))


def make():
    model = Net(nnx.Rngs(0, dropout=1))
    return model, nnx.Optimizer(model, optax.adamw(1e-2), wrt=nnx.Param)


X = jax.random.normal(jax.random.key(0), (32, 16))
Y = jnp.arange(32) % 4


def loss_fn(model, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()


def step(model, optimizer, x, y):
    loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
    optimizer.update(model, grads)
    return loss


def state_leaves(*objects) -> list:
    """Every leaf of the objects' state as NumPy (a PRNG key as its data)."""
    return [np.asarray(jax.random.key_data(v) if jnp.issubdtype(v.dtype, jax.dtypes.prng_key)
                       else v) for v in jax.tree.leaves(nnx.state(objects))]


def train(jitted, by_keyword=False) -> tuple:
    model, optimizer = make()     # (by keyword: in another order than the parameters')
    losses = [float(jitted(y=Y, optimizer=optimizer, x=X, model=model) if by_keyword
                    else jitted(model, optimizer, X, Y)) for _ in range(STEPS)]
    return losses, state_leaves(model, optimizer)


@pytest.fixture(scope="module")
def reference():
    return train(nnx.jit(step))


@pytest.mark.parametrize("mode,policy", [("joint", "nothing_saveable"),
                                         ("joint", "dots_saveable"),
                                         ("split", "dots_saveable")])
def test_an_nnx_step_updates_its_objects_as_nnx_jit(reference, mode, policy):
    """The step changes the Module's parameters, its BatchNorm statistics and its Dropout's
    Rngs count, and the Optimizer's state, in place: after each call the caller's objects
    hold what nnx.jit's hold (before, rp.jit said the step had no backward pass: the
    gradients reached no output)."""
    losses, leaves = train(rp.jit(step, mode=mode, policy=policy))
    np.testing.assert_allclose(losses, reference[0], rtol=1e-5)
    assert len(set(losses)) == STEPS          # (each step saw the one before's updates)
    assert_trees_close(leaves, reference[1], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("policy", ["dots_saveable", "nothing_saveable"])
def test_an_nnx_step_saves_what_jax_checkpoint_saves(policy):
    """The activations the rewritten step keeps are those jax.checkpoint keeps for the same
    policy around the loss of the Module's parameters (the arguments aside: the step's
    include the optimizer's); the arguments are named by their place in the Module."""
    model, optimizer = make()
    ours = rp.jit(step, policy=policy).lower(model, optimizer, X, Y).residuals
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def pure(params, rest, x, y):
        return loss_fn(nnx.merge(graphdef, params, rest), x, y)
    theirs = jax_saved_residuals(
        jax.checkpoint(pure, policy=getattr(jax.checkpoint_policies, policy)), params, rest,
        X, Y)
    assert Counter(our_type(r) for r in ours if not r.argument) == Counter(
        jax_type(a) for a, d in theirs if not d.startswith("from the argument"))
    assert any(r.argument and "model['l1']['kernel']" in r.description for r in ours), \
        [str(r) for r in ours]


def test_an_nnx_step_donates_and_takes_keywords(reference):
    """Donated objects (`donate_argnums`, `donate_argnames` by keyword) get every array
    back, the old ones deleted, as nnx.jit's donation does: the next call runs on them."""
    model, optimizer = make()
    kernel = model.l1.kernel.get_value()
    jitted = rp.jit(step, donate_argnums=(0, 1), policy="dots_saveable")
    losses = [float(jitted(model, optimizer, X, Y)) for _ in range(STEPS)]
    assert kernel.is_deleted()
    np.testing.assert_allclose(losses, reference[0], rtol=1e-5)
    assert_trees_close(state_leaves(model, optimizer), reference[1], rtol=1e-4, atol=1e-6)
    losses, leaves = train(rp.jit(step, donate_argnames=("model", "optimizer"),
                                  policy="nothing_saveable"), by_keyword=True)
    np.testing.assert_allclose(losses, reference[0], rtol=1e-5)
    assert_trees_close(leaves, reference[1], rtol=1e-4, atol=1e-6)


def test_an_nnx_step_inside_nnx_jit_updates_its_objects(reference):
    """Called inside nnx.jit, the step's updates reach nnx.jit's objects, and so the
    caller's."""
    inner = rp.jit(step, policy="nothing_saveable")
    losses, leaves = train(nnx.jit(lambda m, o, x, y: inner(m, o, x, y)))
    np.testing.assert_allclose(losses, reference[0], rtol=1e-5)
    assert_trees_close(leaves, reference[1], rtol=1e-4, atol=1e-6)


def old_style_step(model, optimizer, x, y):
    """The step of Flax's tutorials before 0.11: the optimizer holds the model
    (`nnx.ModelAndOptimizer`), and both are passed."""
    loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
    optimizer.update(grads)
    return loss


def train_old_style(jitted) -> tuple:
    model = Net(nnx.Rngs(0, dropout=1))
    optimizer = nnx.ModelAndOptimizer(model, optax.adamw(1e-2))
    losses = [float(jitted(model, optimizer, X, Y)) for _ in range(STEPS)]
    assert optimizer.model is model
    return losses, state_leaves(model, optimizer)


@pytest.mark.skipif(not hasattr(nnx, "ModelAndOptimizer"), reason="flax < 0.11")
@pytest.mark.parametrize("mode,donate", [("joint", ()), ("split", (0, 1))])
def test_arguments_that_share_variables_are_one_object_as_under_nnx_jit(mode, donate):
    """An optimizer that holds its model, passed beside it: the two arguments share the
    model's Variables, which the traced function sees once (the arguments are split
    together), and the caller's objects end as nnx.jit's (before, rp.jit refused them)."""
    reference = train_old_style(nnx.jit(old_style_step, donate_argnums=donate))
    losses, leaves = train_old_style(rp.jit(old_style_step, mode=mode, donate_argnums=donate,
                                            policy="dots_saveable"))
    np.testing.assert_allclose(losses, reference[0], rtol=1e-5)
    assert len(set(losses)) == STEPS
    assert_trees_close(leaves, reference[1], rtol=1e-4, atol=1e-6)


def test_an_argument_inside_another_is_the_same_object_in_the_call(reference):
    """A layer passed beside the model that holds it is that layer inside the call too (it
    has no Variables of its own in the state), and the step's updates reach the caller's
    objects as nnx.jit's."""
    def step_and_layer(model, layer, optimizer, x, y):
        assert layer is model.l1
        return step(model, optimizer, x, y)

    model, optimizer = make()
    jitted = rp.jit(step_and_layer, policy="dots_saveable")
    losses = [float(jitted(model, model.l1, optimizer, X, Y)) for _ in range(STEPS)]
    np.testing.assert_allclose(losses, reference[0], rtol=1e-5)
    assert_trees_close(state_leaves(model, optimizer), reference[1], rtol=1e-4, atol=1e-6)


def test_a_gradient_that_reaches_no_result_is_named_in_the_error():
    """A step that writes its update into a plain argument (a dict) loses it, as jax.jit
    does: the error says so, and names Flax NNX objects as the ones kept."""
    def step_in_place(params, x):
        params["w"] = params["w"] - jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(params["w"])
        return jnp.sum(x)
    with pytest.raises(rp.RematError, match="none whose result reaches what it returns.*"
                                            "Flax NNX"):
        rp.jit(step_in_place)({"w": jnp.ones((4, 4))}, jnp.ones((2, 4)))


def test_an_nnx_loss_per_example_under_vmap():
    """jax.vmap of rp.jit of a gradient function of a Module (unbatched) is rp.jit of the
    vmapped function, which takes the Module as the call split it: JAX's gradients."""
    model, _ = make()
    model.eval()           # (no Dropout, BatchNorm's running statistics: per example)

    def grads(model, x, y):
        return nnx.state(nnx.grad(loss_fn)(model, x[None], y[None]))
    expected = jax.vmap(grads, in_axes=(None, 0, 0))(model, X, Y)
    got = jax.vmap(rp.jit(grads, policy="nothing_saveable"), in_axes=(None, 0, 0))(
        model, X, Y)
    assert_trees_close(jax.tree.leaves(got), jax.tree.leaves(expected))


def test_a_lowered_nnx_step_says_to_call_the_rp_jit_function():
    model, optimizer = make()
    lowered = rp.jit(step, policy="nothing_saveable").lower(model, optimizer, X, Y)
    with pytest.raises(TypeError, match="a lowered step takes arrays.*call it instead"):
        lowered.compile()(model, optimizer, X, Y)


def test_an_rp_jit_method_of_an_nnx_module_updates_the_module(reference):
    """`@rp.jit` on a Module's method (as `@nnx.jit` is written): the instance is the first
    argument, split as the others, and updated in place."""
    class Trained(Net):
        @rp.jit(policy="dots_saveable")
        def train_step(self, optimizer, x, y):
            return step(self, optimizer, x, y)
    model = Trained(nnx.Rngs(0, dropout=1))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-2), wrt=nnx.Param)
    losses = [float(model.train_step(optimizer, X, Y)) for _ in range(STEPS)]
    np.testing.assert_allclose(losses, reference[0], rtol=1e-5)
    assert_trees_close(state_leaves(model, optimizer), reference[1], rtol=1e-4, atol=1e-6)
    assert model.train_step.builds == 1
    assert model.train_step.lower(optimizer, X, Y).mode == "joint"


def test_nnx_grad_of_an_rp_jit_loss_updates_batch_statistics_and_rngs():
    """nnx.grad(rp.jit(loss)) in training mode: the loss writes BatchNorm's statistics and
    the Dropout's Rngs count (an integer output, which takes no cotangent); the gradients and
    the Module's state after it are nnx.grad's of the plain loss."""
    results = []
    for loss in (loss_fn, rp.jit(loss_fn, policy="nothing_saveable")):
        model, _ = make()
        grads = nnx.grad(loss)(model, X, Y)
        results.append((state_leaves(grads), state_leaves(model)))
    assert_trees_close(results[1][0], results[0][0], rtol=1e-4, atol=1e-6)
    assert_trees_close(results[1][1], results[0][1], rtol=1e-5, atol=1e-7)
    assert not all(np.array_equal(a, b) for a, b in zip(results[0][1], state_leaves(make()[0])))


def test_eval_shape_of_an_nnx_step_leaves_the_objects_as_they_are():
    """`eval_shape` gives the step's results as `jax.jit(...).eval_shape` would, without
    building or updating the Module and Optimizer (a step that trains would)."""
    model, optimizer = make()
    before = state_leaves(model, optimizer)
    jitted = rp.jit(step, policy="nothing_saveable")
    got = jitted.eval_shape(model, optimizer, X, jax.ShapeDtypeStruct(Y.shape, Y.dtype))
    assert got == jax.ShapeDtypeStruct((), jnp.float32), got
    assert jitted.builds == 0
    for a, b in zip(state_leaves(model, optimizer), before):
        np.testing.assert_array_equal(a, b)


class Stack(nnx.Module):
    """Five MLP blocks made by `nnx.vmap` and run by `nnx.scan(unroll=2)` (the last block
    left out of the loop's two trips), each block under `nnx.remat(policy)` if given."""

    def __init__(self, rngs, policy=None):
        @nnx.split_rngs(splits=5)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def blocks(rngs):
            return nnx.Sequential(nnx.Linear(16, 32, rngs=rngs), jax.nn.gelu,
                                  nnx.Linear(32, 16, rngs=rngs))
        self.blocks = blocks(rngs)
        self.policy = policy

    def __call__(self, x):
        def layer(h, block):
            return h + block(h)
        if self.policy is not None:
            layer = nnx.remat(layer, policy=getattr(jax.checkpoint_policies, self.policy))
        return nnx.scan(layer, in_axes=(nnx.Carry, 0), out_axes=nnx.Carry, unroll=2)(
            x, self.blocks)


def stack_step(model, optimizer, x):
    loss, grads = nnx.value_and_grad(lambda m: jnp.mean(m(x) ** 2))(model)
    optimizer.update(model, grads)
    return loss


@pytest.mark.parametrize("policy", ["nothing_saveable", "dots_saveable"])
def test_an_nnx_scan_whose_unroll_leaves_a_block_out_gets_the_policy_per_block(policy):
    """`nnx.scan(unroll=2)` over five blocks: JAX's lowering peels the fifth block out of the
    loop, which left the loop atomic (recomputed whole under a module policy). The step
    trains as nnx.jit's does, no remark says a loop is atomic, and the activations kept are
    at most what `nnx.remat(layer, policy)` keeps under JAX."""
    def make_stack(remat_policy=None):
        model = Stack(nnx.Rngs(0), remat_policy)
        return model, nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
    x = jax.random.normal(jax.random.key(1), (8, 16))
    results = []
    for jitted in (nnx.jit(stack_step), rp.jit(stack_step, policy=policy)):
        model, optimizer = make_stack()
        results.append(([float(jitted(model, optimizer, x)) for _ in range(STEPS)],
                        state_leaves(model, optimizer)))
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-5)
    assert_trees_close(results[1][1], results[0][1], rtol=1e-4, atol=1e-6)
    model, optimizer = make_stack()
    lowered = rp.jit(stack_step, policy=policy).lower(model, optimizer, x)
    assert not any("atomic" in r for r in lowered.remarks), lowered.remarks
    ours = sum(r.bytes for r in lowered.residuals if not r.argument)
    reference, _ = make_stack(policy)
    graphdef, params, rest = nnx.split(reference, nnx.Param, ...)
    theirs = jax_saved_residuals(
        lambda p: jnp.mean(nnx.merge(graphdef, p, rest)(x) ** 2), params)
    jax_bytes = sum(a.size * a.dtype.itemsize for a, d in theirs
                    if not d.startswith("from the argument"))
    assert 0 < ours <= jax_bytes, (ours, jax_bytes)
