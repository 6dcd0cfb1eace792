"""Every print_saved_residuals cell of the JAX gradient-checkpointing notebook.

The notebook (shared/seeds/000_*.txt) is the reference: for each cell the
residuals `remat_passes` saves on the exported StableHLO must be those JAX
saves for the same program with `jax.checkpoint`. JAX's answer is computed
live (never copied from the notebook), from a freshly built function each
time: JAX caches the trace of a `jax.checkpoint`ed function by function
object, so reusing `loss` after redefining `predict` (as the notebook does
between cells 19 and 22) silently reuses the old trace. That is why the
notebook's cell 22 prints no named residual; a fresh trace saves
'layer0_output', and so do we.
"""
from __future__ import annotations

import contextlib
import io

import jax
import jax.numpy as jnp
import pytest
from jax.ad_checkpoint import checkpoint_name
from remat_testlib import (assert_same_residual_types, jax_residual_types, jax_saved_residuals,
                           jax_type, our_residual_types)

import remat_passes as rp

JP = jax.checkpoint_policies
P = rp.policies


# ------------------------------------------------------------- cells 1-4 --
def g(W, x):
    y = jnp.dot(W, x)
    return jnp.sin(y)


def make_f(g_):
    def f(W1, W2, W3, x):
        x = g_(W1, x)
        x = g_(W2, x)
        x = g_(W3, x)
        return x
    return f


def make_f4():
    def f4(W1, W2, W3, x):
        x = checkpoint_name(g(W1, x), name='a')
        x = checkpoint_name(g(W2, x), name='b')
        x = checkpoint_name(g(W3, x), name='c')
        return x
    return f4


ARGS_F = (jnp.ones((5, 4)), jnp.ones((6, 5)), jnp.ones((7, 6)), jnp.ones(4))


def lines_ours(residuals):
    return [str(r) for r in residuals]


def lines_jax(fun, *args):
    return [f"{jax_type(a)} {d}" for a, d in jax_saved_residuals(fun, *args)]


def test_cell1_no_checkpoint():
    f = make_f(g)
    ours = rp.saved_residuals(f, *ARGS_F)
    assert_same_residual_types(ours, make_f(g), *ARGS_F)
    # without jax.checkpoint JAX saves sin and cos of every layer but the last sin
    assert sum(1 for r in ours if "output of cos" in r.description) == 3


def test_cell2_checkpoint_each_call_of_g():
    ours = rp.saved_residuals(make_f(rp.checkpoint(g)), *ARGS_F)
    assert_same_residual_types(ours, make_f(jax.checkpoint(g)), *ARGS_F)
    # no cosine is saved any more: it is recomputed inside each region's backward
    assert not any("cos" in r.description for r in ours)


def test_cell3_dots_with_no_batch_dims_on_whole_f():
    module = rp.export_vjp(make_f(g), *ARGS_F)
    ours = rp.saved_residuals(module, policy=P.dots_with_no_batch_dims_saveable)
    jax_f = jax.checkpoint(make_f(g), policy=JP.dots_with_no_batch_dims_saveable)
    assert_same_residual_types(ours, jax_f, *ARGS_F)
    assert sum(1 for r in ours if "dot_general" in r.description) == 3


def test_cell4_save_only_these_names_a():
    module = rp.export_vjp(make_f4(), *ARGS_F)
    ours = rp.saved_residuals(module, policy=P.save_only_these_names('a'))
    jax_f = jax.checkpoint(make_f4(), policy=JP.save_only_these_names('a'))
    assert_same_residual_types(ours, jax_f, *ARGS_F)
    named = [r for r in ours if r.description.startswith("named")]
    assert len(named) == 1 and named[0].description.startswith("named 'a' from ")
    assert named[0].type == "f32[5]"


# ------------------------------------------------------------ cells 16-22 --
def layer(W, x):
    return jnp.sin(jnp.dot(W, x))


def make_loss(named: bool):
    """loss/predict of cells 16 and 20, built fresh (see the module docstring)."""
    def predict(params, x):
        *Ws, Wlast = params
        for i, W in enumerate(Ws):
            x = layer(W, x)
            if named:
                x = checkpoint_name(x, name=f'layer{i}_output')
        x = jnp.dot(Wlast, x)
        return x

    def loss(params, x, y):
        return jnp.sum((predict(params, x) - y) ** 2)
    return loss


W = jnp.ones((4, 4))
ARGS_LOSS = ([W, W, W], jnp.ones(4), jnp.ones(4))

LOSS_CASES = {
    # cell: (named?, our policy, JAX policy); None = no jax.checkpoint at all
    "cell18_plain": (False, None, None),
    "cell19_dots_no_batch": (False, P.dots_with_no_batch_dims_saveable,
                             JP.dots_with_no_batch_dims_saveable),
    "cell21_named_plain": (True, None, None),
    "cell21_named_dots_no_batch": (True, P.dots_with_no_batch_dims_saveable,
                                   JP.dots_with_no_batch_dims_saveable),
    "cell22_save_any_names_but_layer1": (True, P.save_any_names_but_these('layer1_output'),
                                         JP.save_any_names_but_these('layer1_output')),
}


@pytest.mark.parametrize("case", list(LOSS_CASES))
def test_loss_cells(case):
    named, ours_policy, jax_policy = LOSS_CASES[case]
    module = rp.export_vjp(make_loss(named), *ARGS_LOSS)
    ours = rp.saved_residuals(module, policy=ours_policy)
    jax_fun = make_loss(named) if jax_policy is None else \
        jax.checkpoint(make_loss(named), policy=jax_policy)
    assert_same_residual_types(ours, jax_fun, *ARGS_LOSS, context=case)


def test_cell21_names_are_saved_by_name():
    ours = rp.saved_residuals(make_loss(True), *ARGS_LOSS)
    descs = [r.description for r in ours]
    assert any(d.startswith("named 'layer0_output' from ") for d in descs), descs
    assert any(d.startswith("named 'layer1_output' from ") for d in descs), descs


def test_cell22_excluded_name_is_not_saved():
    module = rp.export_vjp(make_loss(True), *ARGS_LOSS)
    ours = rp.saved_residuals(module, policy=P.save_any_names_but_these('layer1_output'))
    descs = [r.description for r in ours]
    assert not any("layer1_output" in d for d in descs), descs
    # only named values (and arguments) may be saved under this policy
    assert all(d.startswith(("from the argument", "named ")) for d in descs), descs


# ----------------------------------------------------------- cells 25-29 --
def chain_compose(funs):
    def f(x):
        for fun in funs:
            x = fun(x)
        return x
    return f


def recursive_checkpoint(funs, ckpt):
    if len(funs) == 1:
        return funs[0]
    elif len(funs) == 2:
        f1, f2 = funs
        return lambda x: f1(f2(x))
    else:
        f1 = recursive_checkpoint(funs[:len(funs) // 2], ckpt)
        f2 = recursive_checkpoint(funs[len(funs) // 2:], ckpt)
        return lambda x: f1(ckpt(f2)(x))


@pytest.mark.parametrize("n", [8, 16])
def test_chain_compose(n):
    ours = rp.saved_residuals(chain_compose([jnp.sin] * n), 3.)
    assert_same_residual_types(ours, chain_compose([jnp.sin] * n), 3.)
    assert our_residual_types(ours) == {"f32[]": n}


@pytest.mark.parametrize("n", [8, 16])
def test_recursive_checkpoint(n):
    ours = rp.saved_residuals(recursive_checkpoint([jnp.sin] * n, rp.checkpoint), 3.)
    jax_f = recursive_checkpoint([jnp.sin] * n, jax.checkpoint)
    assert_same_residual_types(ours, jax_f, 3.)
    # the point of recursive checkpointing: far fewer residuals than the chain's n
    assert len(ours) <= n // 2


# --------------------------------------------------------- descriptions --
def test_argument_descriptions_use_parameter_names():
    ours = rp.saved_residuals(make_f(g), *ARGS_F)
    descs = [r.description for r in ours]
    for name in ("W1", "W2", "W3", "x"):
        assert f"from the argument {name}" in descs


def test_argument_descriptions_use_pytree_paths():
    ours = rp.saved_residuals(make_loss(False), *ARGS_LOSS)
    descs = [r.description for r in ours]
    for i in range(3):
        assert f"from the argument params[{i}]" in descs
    assert descs[:4] == [f"from the argument params[{i}]" for i in range(3)] + \
        ["from the argument x"]


def test_named_description():
    module = rp.export_vjp(make_f4(), *ARGS_F)
    ours = rp.saved_residuals(module, policy=P.save_only_these_names('a'))
    (named,) = [r for r in ours if "named" in r.description]
    assert named.description.startswith("named 'a' from ")
    assert named.description.endswith("f4)")


CELL_FUNCS = {
    # (ours, JAX's) built independently; policy applied to the whole function
    "cell1": (lambda: (make_f(g), None), lambda: make_f(g), ARGS_F),
    "cell2": (lambda: (make_f(rp.checkpoint(g)), None),
              lambda: make_f(jax.checkpoint(g)), ARGS_F),
    "cell3": (lambda: (make_f(g), P.dots_with_no_batch_dims_saveable),
              lambda: jax.checkpoint(make_f(g), policy=JP.dots_with_no_batch_dims_saveable),
              ARGS_F),
    "cell4": (lambda: (make_f4(), P.save_only_these_names('a')),
              lambda: jax.checkpoint(make_f4(), policy=JP.save_only_these_names('a')), ARGS_F),
    "cell18": (lambda: (make_loss(False), None), lambda: make_loss(False), ARGS_LOSS),
    "cell21": (lambda: (make_loss(True), None), lambda: make_loss(True), ARGS_LOSS),
    "cell28": (lambda: (recursive_checkpoint([jnp.sin] * 8, rp.checkpoint), None),
               lambda: recursive_checkpoint([jnp.sin] * 8, jax.checkpoint), (3.,)),
}


@pytest.mark.parametrize("cell", list(CELL_FUNCS))
def test_printed_lines_match_jax_exactly(cell):
    """Type, description and source position, in order: print_saved_residuals parity."""
    make_ours, make_jax, args = CELL_FUNCS[cell]
    fun, policy = make_ours()
    module = rp.export_vjp(fun, *args)
    ours = rp.saved_residuals(module, policy=policy)
    assert lines_ours(ours) == lines_jax(make_jax(), *args)


def test_print_saved_residuals_prints_like_jax():
    ours, theirs = io.StringIO(), io.StringIO()
    rp.print_saved_residuals(make_f(g), *ARGS_F, file=ours)
    with contextlib.redirect_stdout(theirs):
        jax.ad_checkpoint.print_saved_residuals(make_f(g), *ARGS_F)
    assert ours.getvalue() == theirs.getvalue()
    assert ours.getvalue().count("\n") == sum(jax_residual_types(make_f(g), *ARGS_F).values())
