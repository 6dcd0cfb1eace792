"""A backward pass inside a loop body (gradient accumulation) or a cond branch
(regions/loop_backward.py).

`jax.grad` inside `lax.scan` over microbatches: the function's own top level has no
backward, each iteration has one. rp.remat and rp.jit apply the policy to each iteration:
the gradients are jax.jit's bit for bit, and XLA allocates less than for the program
without remat (and than for `jax.checkpoint` in the body, which XLA:CPU undoes)."""
from __future__ import annotations

from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat_passes as rp
from remat_passes import cli
from remat_testlib import jax_saved_residuals, jax_type, our_type

# (the gradients are compared with jax.jit's bit for bit: tools/test.sh runs these with
# XLA's default code generation)
pytestmark = pytest.mark.exact

LAYERS, D, BATCH, MICRO = 6, 64, 512, 3


def loss(ws, x):
    h = x
    for w in ws:
        h = rp.checkpoint_name(h, "layer_in")
        h = jnp.tanh(jnp.tanh(h @ w) * 1.5 + 0.1)
    return jnp.mean(h ** 2)


def accumulate(loss_fn):
    def step(ws, xs):
        def body(acc, x):
            g = jax.grad(loss_fn)(ws, x)
            return jax.tree.map(jnp.add, acc, g), None
        grads, _ = jax.lax.scan(body, jax.tree.map(jnp.zeros_like, ws), xs)
        return [w - 0.1 * g for w, g in zip(ws, grads)]
    return step


def args():
    ws = [jax.random.normal(jax.random.key(i), (D, D)) / np.sqrt(D) for i in range(LAYERS)]
    return ws, jax.random.normal(jax.random.key(99), (MICRO, BATCH, D))


@pytest.mark.parametrize("policy", ["nothing_saveable", "dots_saveable",
                                    "save_only_these_names('layer_in')", None])
def test_the_gradients_are_jax_jits(policy):
    step = accumulate(loss)
    module = rp.export(step, *args())
    out = rp.remat(module, policy)
    got = out.call(*args())
    want = jax.jit(step)(*args())
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(a, b)
    assert any("inside a loop body" in r and "@main_loop0 while the passes run" in r
               for r in out.remarks)
    assert "func.call" not in out.text() and "main_loop0" not in out.text()
    if policy == "save_only_these_names('layer_in')":
        named = [r for r in out.residuals if "layer_in" in r.description]
        assert len(named) == LAYERS, [r.description for r in out.residuals]


def test_rp_jit_allocates_less_than_without_remat():
    step = accumulate(loss)
    jitted = rp.jit(step, policy="dots_saveable")
    lowered = jitted.lower(*args())
    ours = lowered.executables[0].memory_analysis().temp_size_in_bytes
    plain = jax.jit(step).lower(*args()).compile().memory_analysis().temp_size_in_bytes
    ckpt = accumulate(jax.checkpoint(loss, policy=jax.checkpoint_policies.dots_saveable))
    for a, b in zip(jitted(*args()), jax.jit(ckpt)(*args())):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    # one microbatch's activations are what remat can save: 6 layers x 2 x 128 KiB here
    assert ours < 0.8 * plain, (ours, plain)


def test_sweeps_say_they_plan_a_functions_own_backward():
    module = rp.export(accumulate(loss), *args())
    for sweep, name in ((rp.bounds, "rp.bounds"), (rp.pareto, "rp.pareto")):
        with pytest.raises(rp.RematError, match=f"{name}: @main runs its backward pass inside "
                                                "a loop body.*export the step of one"):
            sweep(module)


def test_a_name_the_module_has_is_not_taken_again():
    """The outlined body gets a name no function of the module has (a module rewritten
    twice, or one with a function called main_loop0 already)."""
    module = rp.export(accumulate(loss), *args())
    once = rp.remat(module, "dots_saveable")
    twice = rp.remat(once, "dots_saveable")
    for a, b in zip(twice.call(*args()), jax.jit(accumulate(loss))(*args())):
        np.testing.assert_array_equal(a, b)
    # a public function called main_loop0 beside main
    text = module.text(debug_info=True)
    helper = ("  func.func public @main_loop0(%arg0: tensor<f32>) -> tensor<f32> {\n"
              "    return %arg0 : tensor<f32>\n  }\n")
    at = text.index("  func.func public @main")
    out = rp.remat(rp.Module.parse(text[:at] + helper + text[at:]), "dots_saveable")
    assert any("@main_loop1" in r for r in out.remarks), out.remarks


def test_nested_loops_and_split_form():
    """A loop over epochs around the one over microbatches: the inner body is the one
    rewritten. The split form has no place for a backward inside a loop: a clear error."""
    inner = accumulate(loss)

    def epochs(ws, xs):
        return jax.lax.fori_loop(0, 2, lambda i, w: inner(w, xs), ws)
    module = rp.export(epochs, *args())
    out = rp.remat(module, "dots_saveable")
    for a, b in zip(out.call(*args()), jax.jit(epochs)(*args())):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(rp.RematError, match="inside a loop body.*use mode='joint'"):
        rp.remat(module, "dots_saveable", mode="split")


def alternate(loss_fn):
    """A step that updates one half of the layers or the other as a flag says (lax.switch:
    two models trained in turn): each branch runs its own forward and backward."""
    def step(ws, x, which):
        def update(lo, hi):
            def branch():
                def part_loss(part):
                    return loss_fn(ws[:lo] + part + ws[hi:], x)
                g = jax.grad(part_loss)(ws[lo:hi])
                return ws[:lo] + [w - 0.1 * d for w, d in zip(ws[lo:hi], g)] + ws[hi:]
            return branch
        return jax.lax.switch(which, [update(0, LAYERS // 2), update(LAYERS // 2, LAYERS)])
    return step


JAX_POLICIES = {"nothing_saveable": jax.checkpoint_policies.nothing_saveable,
                "save_only_these_names('layer_in')":
                    jax.checkpoint_policies.save_only_these_names("layer_in")}


@pytest.mark.parametrize("policy", list(JAX_POLICIES))
def test_a_backward_in_each_cond_branch(policy):
    """jax.grad inside each branch of a lax.switch: each branch is rewritten on its own
    (@main_cond0, @main_cond1), the gradients are jax.jit's bit for bit whichever branch
    runs, and the policy holds inside each (under save_only_these_names, the named inputs
    of the layers whose backward each branch runs); what each keeps is what jax.checkpoint
    keeps around the branch's loss. The split form has no place for it. (Before, rp.jit
    said the step had no backward pass.)"""
    step = alternate(loss)
    ws, xs = args()
    module = rp.export(step, ws, xs[0], 0)
    out = rp.remat(module, policy)
    for which in (0, 1):
        for a, b in zip(out.call(ws, xs[0], which), jax.jit(step)(ws, xs[0], which)):
            np.testing.assert_array_equal(a, b)
    assert [r for r in out.remarks if "inside a cond branch" in r and "@main_cond" in r]
    assert any("@main_cond1 while the passes run" in r for r in out.remarks), out.remarks
    assert "func.call" not in out.text() and "main_cond0" not in out.text()
    # what jax.checkpoint saves around each branch's loss, of the values the forward makes
    def branch_loss(lo, hi):
        return jax.checkpoint(lambda part: loss(ws[:lo] + list(part) + ws[hi:], xs[0]),
                              policy=JAX_POLICIES[policy])
    theirs = Counter(jax_type(a) for lo, hi in ((0, LAYERS // 2), (LAYERS // 2, LAYERS))
                     for a, d in jax_saved_residuals(branch_loss(lo, hi), ws[lo:hi])
                     if not d.startswith("from the argument"))
    assert Counter(our_type(r) for r in out.residuals if not r.argument) == theirs
    with pytest.raises(rp.RematError, match="inside a cond branch.*use mode='joint'"):
        rp.remat(module, policy, mode="split")


def test_rp_jit_of_a_conditional_step_allocates_less_than_without_remat():
    """Through rp.jit (before: "has no backward pass"), the branch's activations are what
    remat saves, as in the loop above."""
    step = alternate(loss)
    ws, xs = args()
    jitted = rp.jit(step, policy="dots_saveable")
    for which in (0, 1):
        for a, b in zip(jitted(ws, xs[0], which), jax.jit(step)(ws, xs[0], which)):
            np.testing.assert_array_equal(a, b)
    ours = jitted.lower(ws, xs[0], 0).executables[0].memory_analysis().temp_size_in_bytes
    plain = jax.jit(step).lower(ws, xs[0], 0).compile().memory_analysis().temp_size_in_bytes
    assert ours < 0.8 * plain, (ours, plain)


def test_remat_opt(tmp_path, capsys):
    """remat-opt's remat pipeline does the same (outline-loop-backwards, the passes on each
    body, inline); remat-partial-eval alone says where the backward is."""
    path = tmp_path / "accumulate.mlir"
    rp.export(accumulate(loss), *args()).save(str(path))
    out = tmp_path / "out.mlir"
    assert cli.main([str(path), "--remat=policy=dots_saveable", "--print-saved-residuals",
                     "-o", str(out)]) == 0
    text = out.read_text()
    body = text[text.index("stablehlo.while"):]
    assert "stablehlo.optimization_barrier" in body and "func.call" not in text
    report = capsys.readouterr()
    assert "// saved residuals of @main_loop0" in report.out + report.err
    assert cli.main([str(path), "--remat-partial-eval=policy=nothing_saveable"]) == 1
    err = capsys.readouterr().err      # (the body calls a function: where JAX put the
    assert "run the inline pass first" in err or "outline-loop-backwards first" in err  # grad)
    assert cli.main([str(path), "--inline", "--remat-partial-eval=policy=nothing_saveable"]) == 1
    err = capsys.readouterr().err
    assert "backward runs inside a loop body (gradient accumulation" in err
    assert "run outline-loop-backwards first (the remat pipeline does, after inline)" in err


def test_a_complex_constant_in_the_body():
    """A loop body with a backward that reads a complex literal (`* 1j`): outlining it
    copies the literal into the body's function (cloned: the MLIR bindings cannot hand over
    a complex literal's attribute, and raised "Can't cast unknown element type" before); the
    result is jax.jit's bit for bit."""
    def closs(ws, x):
        h = jnp.tanh(x @ ws[0]).astype(jnp.complex64) * 1j
        return jnp.mean(jnp.real(h * jnp.conj(h)) + jnp.imag(h))
    step = accumulate(closs)
    ws, xs = [jnp.ones((4, 4)) * 0.1], jnp.ones((3, 2, 4))
    module = rp.export(step, ws, xs)
    assert "complex<f32>" in module.text()
    out = rp.remat(module, "nothing_saveable")
    for a, b in zip(jax.tree.leaves(out.call(ws, xs)), jax.tree.leaves(jax.jit(step)(ws, xs))):
        np.testing.assert_array_equal(a, b)
