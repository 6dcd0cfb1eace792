"""Reports (print_saved_residuals, print_fwd_bwd) and regions made from name scopes."""
import io
import sys

import jax
import jax.numpy as jnp
import pytest
from remat_testlib import assert_same_residual_types, run_process

import remat_passes as rp


def _block(W, x):
    return jnp.sin(jnp.sin(W @ x))


def _scoped(W1, W2, x):
    # Name scopes as Flax/Equinox modules leave them in the name stack.
    with jax.named_scope("layers_0"):
        x = _block(W1, x)
    with jax.named_scope("layers_1"):
        x = _block(W2, x)
    return jnp.sum(x)


def _checkpointed(W1, W2, x):
    x = jax.checkpoint(_block)(W1, x)
    x = jax.checkpoint(_block)(W2, x)
    return jnp.sum(x)


ARGS = (jnp.full((4, 4), 0.1), jnp.full((4, 4), 0.2), jnp.linspace(0.0, 1.0, 4))


@pytest.fixture(scope="module")
def scoped_module():
    return rp.export_vjp(_scoped, *ARGS)


def test_region_regex_turns_scopes_into_checkpoints(scoped_module):
    """region_regex makes each matching scope a region (default nothing_saveable):
    the residuals are those of jax.checkpoint around each layer."""
    out = rp.remat(scoped_module, None, region_regex=r"layers_\d+")
    assert_same_residual_types(out.residuals, _checkpointed, *ARGS)
    plain = rp.remat(scoped_module, None)
    assert len(plain.residuals) > len(out.residuals)


def test_region_regex_gradients(scoped_module):
    out = rp.remat(scoped_module, None, region_regex=r"layers_\d+")
    value, grads = out.call(*ARGS, jnp.float32(1.0))
    ref_value, ref_grads = jax.value_and_grad(_scoped, argnums=(0, 1, 2))(*ARGS)
    assert jnp.allclose(value, ref_value, rtol=1e-5)
    for g, r in zip(grads, ref_grads):
        assert jnp.allclose(g, r, rtol=1e-5, atol=1e-6)


def test_region_regex_on_the_command_line(scoped_module, tmp_path):
    path = tmp_path / "scoped.mlir"
    scoped_module.save(str(path))
    cmd = [sys.executable, "-m", "remat_passes.cli", str(path), "--print-saved-residuals",
           r"--remat-partial-eval=region-regex=layers_\d+ region-policy=dots_saveable"]
    proc = run_process(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if not ln.startswith("//")]
    expected = rp.remat(scoped_module, None, region_regex=r"layers_\d+")
    # region-policy=dots_saveable keeps each layer's dot outputs instead of recomputing them
    assert sum("output of dot_general" in ln for ln in lines) == 2
    # ... on top of what the default region policy (nothing_saveable) saves
    assert len(lines) == len(expected.residuals) + 2


def test_print_saved_residuals_prints_one_line_per_residual(scoped_module):
    buf = io.StringIO()
    rp.print_saved_residuals(scoped_module, policy="nothing_saveable", file=buf)
    lines = buf.getvalue().splitlines()
    assert lines == [str(r) for r in rp.saved_residuals(scoped_module, policy="nothing_saveable")]
    assert lines[0] == "f32[4,4] from the argument W1"


def test_print_saved_residuals_takes_a_function_and_its_arguments():
    buf = io.StringIO()
    rp.print_saved_residuals(_block, ARGS[0], ARGS[2], file=buf)
    assert buf.getvalue().splitlines()[:2] == ["f32[4,4] from the argument W",
                                               "f32[4] from the argument x"]


def test_print_fwd_bwd_shows_both_halves(scoped_module):
    buf = io.StringIO()
    rp.print_fwd_bwd(scoped_module, policy="nothing_saveable", file=buf, width=300)
    text = buf.getvalue()
    assert "forward computation:" in text and "backward computation:" in text
    assert "@main_fwd" in text and "@main_bwd" in text
    # under nothing_saveable the backward recomputes the sines from the arguments
    bwd_half = "".join(line[len(line) // 2:] for line in text.splitlines())
    assert "stablehlo.sine" in bwd_half


def test_a_training_step_is_not_differentiated_again():
    """print_saved_residuals(step, ...) of a function that computes its own gradients says
    so and points to rp.export / rp.jit, instead of reporting its gradient's residuals."""
    import jax

    def loss(w, x):
        return jnp.sum(jnp.sin(x @ w))

    def step(w, x):
        return w - 0.1 * jax.grad(loss)(w, x), jnp.int32(0)
    w, x = jnp.ones((3, 3)), jnp.ones((2, 3))
    with pytest.raises(rp.RematError, match="step computes its own gradients.*rp.export"):
        rp.print_saved_residuals(step, w, x)
    residuals = rp.saved_residuals(rp.export(step, w, x))      # the step as it is
    assert [r.description for r in residuals][:2] == ["from the argument w",
                                                      "from the argument x"]
    assert rp.saved_residuals(loss, w, x)       # a plain function is still differentiated


def test_progress_bar_on_a_terminal_after_a_second_one_at_a_time(monkeypatch):
    """Long work (a pareto sweep, auto's trial plans) shows a bar on standard error: only
    where that is a terminal, only once the work has taken a second, one bar at a time
    (a sweep's, not also those of the plans it makes), taken down however the work ends."""
    from remat_passes.passes.base import Progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    err = Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    with Progress(None, "outer work") as outer:
        outer.advance()
        assert not outer.shown and err.getvalue() == ""      # under a second: nothing
        outer.start -= 2
        outer.advance()
        assert outer.shown and Progress.showing
        with Progress(3, "inner work") as inner:
            inner.start -= 2
            inner.advance()
            assert not inner.shown                           # the outer bar is showing
    assert not Progress.showing and "outer work" in err.getvalue()
    assert "inner work" not in err.getvalue()
    with pytest.raises(ValueError):
        with Progress(None, "failing work") as failing:
            failing.start -= 2
            failing.advance()
            assert failing.shown
            raise ValueError
    assert not Progress.showing
    monkeypatch.setattr(sys, "stderr", io.StringIO())        # not a terminal: no bar
    quiet = Progress(None, "logged work")
    quiet.start -= 2
    quiet.advance()
    assert not quiet.shown
