"""Symbolic shapes (`jax.export.symbolic_shape`): the default pipeline compiles a
symbolic-batch training step, which then runs for several batch sizes with the same
results as the step itself; reports name symbolic dimensions as JAX does (`f32[b,4]`),
and `?` where the names are gone."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export as jax_export
from remat_testlib import assert_trees_close, run_process

import remat_passes as rp


def loss(W, x):
    h = jnp.sin(x @ W)
    return jnp.sum(jnp.tanh(h @ W))


def step(W, x):
    value, grad = jax.value_and_grad(loss)(W, x)
    return value, W - 0.1 * grad


# (the offload policy's placement calls took the symbolic shape without it as an operand:
# shape refinement could not see through them, and XLA refused the module)
@pytest.mark.parametrize("policy", ["nothing_saveable", "dots_saveable", None,
                                    "offload_dot_with_no_batch_dims(device, pinned_host)"])
def test_symbolic_batch_step_compiles_and_runs_for_several_batches(policy):
    (b,) = jax_export.symbolic_shape("b")
    W = jnp.asarray(np.random.default_rng(0).normal(size=(4, 4)) * 0.5, jnp.float32)
    exp = jax_export.export(jax.jit(step))(W, jax.ShapeDtypeStruct((b, 4), jnp.float32))
    out = rp.remat(rp.from_exported(exp), policy)
    for n in (1, 3, 8):
        x = jnp.asarray(np.random.default_rng(n).normal(size=(n, 4)), jnp.float32)
        assert_trees_close(out.call(W, x), jax.jit(step)(W, x))
    if policy == "nothing_saveable":
        assert "optimization_barrier" in str(out)      # the data values are still behind one
    if policy and policy.startswith("offload"):
        assert "annotate_device_placement" in str(out) and "indices_of_shape_operands" in str(out)


def test_a_split_half_with_dynamic_dimensions_is_a_clear_error_to_call():
    """Only an exported @main keeps the symbolic shapes JAX calls a function with; a split
    half was called with a dimension of -2**63 and JAX's error said "Shape mismatch ...
    expected (-9223372036854775808, 4)". Now it says what is missing and what to do."""
    (b,) = jax_export.symbolic_shape("b")
    W = jnp.ones((4, 4), jnp.float32)
    m = rp.export_vjp(loss, W, jax.ShapeDtypeStruct((b, 4), jnp.float32))
    split = rp.remat(m, "nothing_saveable", mode="split")
    with pytest.raises(rp.RematError, match="@main_fwd has dynamic dimensions.*export for "
                                            "concrete shapes"):
        split.call(W, jnp.ones((3, 4), jnp.float32), function="main_fwd")


def test_dynamic_dimensions_print_by_their_symbols():
    (b,) = jax_export.symbolic_shape("b")
    m = rp.export_vjp(loss, jax.ShapeDtypeStruct((4, 4), jnp.float32),
                      jax.ShapeDtypeStruct((b, 4), jnp.float32))
    res = rp.saved_residuals(m, policy="nothing_saveable")
    x = [r for r in res if r.type == "f32[b,4]"]
    assert len(x) == 1 and "16 bytes per unit of b," in str(x[0]), [str(r) for r in res]
    assert all("-9223372036854775808" not in str(r) for r in res)


def test_dynamic_dimensions_without_names_print_as_question_marks():
    """Once `inline` has erased the names (an inlined module saved and read back), a
    symbolic dimension prints as `?`."""
    (b,) = jax_export.symbolic_shape("b")
    m = rp.export_vjp(loss, jax.ShapeDtypeStruct((4, 4), jnp.float32),
                      jax.ShapeDtypeStruct((b, 4), jnp.float32))
    copy = m.clone()
    rp.run_pipeline(copy.op, rp.parse_pipeline("builtin.module(inline)"))
    inlined = rp.Module.parse(str(copy))
    assert inlined.dim_symbols == {}
    res = rp.saved_residuals(inlined, policy="nothing_saveable")
    x = [r for r in res if r.type == "f32[?,4]"]
    assert len(x) == 1 and "16 bytes per unit of its dynamic dimensions" in str(x[0])


def _jax_short(aval) -> str:
    """JAX's ShapedArray as our reports write types: float32[b,4] -> f32[b,4]."""
    return (str(aval).replace("ShapedArray(", "").rstrip(")")
            .replace("float32", "f32").replace(" ", ""))


def two_symbol_loss(W, x):             # x: (b, s, 4); a reshape multiplies b and s
    h = jnp.sin(x @ W)
    g = jnp.transpose(h, (1, 0, 2)) * jnp.cos(x).sum(axis=1)
    return jnp.sum(jnp.tanh(g.reshape(-1, 4) @ W))


@pytest.mark.parametrize("fn,spec", [(loss, "b, 4"), (two_symbol_loss, "b, s, 4")],
                         ids=["one-symbol", "two-symbols"])
@pytest.mark.parametrize("policy", ["nothing_saveable", "dots_saveable",
                                    "everything_saveable"])
def test_residual_types_name_their_symbols_as_jax_does(fn, spec, policy):
    """Every residual's type names its symbolic dimensions the way JAX's own
    saved_residuals does for jax.checkpoint with the same policy (`f32[b,4]`,
    `f32[b*s,4]`), and its note gives bytes per unit of them."""
    from remat_passes import jax_compat
    shape = jax_export.symbolic_shape(spec)
    args = (jax.ShapeDtypeStruct((4, 4), jnp.float32), jax.ShapeDtypeStruct(shape, jnp.float32))
    ours = rp.saved_residuals(rp.export_vjp(fn, *args), policy=policy)
    jax_policy = getattr(jax.checkpoint_policies, policy)
    theirs = jax_compat.jax_saved_residuals(jax.checkpoint(fn, policy=jax_policy), *args)
    # (everything_saveable: we also save the dimension size `i32[]` the backward's shape
    # computations read, where JAX's backward recomputes shapes from its residuals')
    ours_types = [r.type for r in ours if not (policy == "everything_saveable" and
                                               r.type == "i32[]")]
    assert sorted(ours_types) == sorted(_jax_short(a) for a, _ in theirs), \
        ([str(r) for r in ours], theirs)
    for r in ours:
        if "b" in r.type:
            assert r.symbols is not None and f"per unit of {r.symbols}," in str(r)


def test_print_memory_and_report_totals_name_the_symbols(tmp_path):
    """--print-memory counts values with symbolic dimensions as 0 bytes and says so,
    naming the symbols, for the joint function and both split halves; the
    saved-residuals header adds bytes per unit of them."""
    import sys
    (b,) = jax_export.symbolic_shape("b")
    m = rp.export_vjp(loss, jax.ShapeDtypeStruct((4, 4), jnp.float32),
                      jax.ShapeDtypeStruct((b, 4), jnp.float32))
    path = tmp_path / "sym.mlir"
    m.save(str(path))

    def run(*args):
        proc = run_process([sys.executable, "-m", "remat_passes.cli", str(path), *args,
                               "-o", str(tmp_path / "out.mlir")],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout
    joint = run("--remat=policy=dots_saveable", "--print-memory")
    assert "@main:" in joint and "values with symbolic dimensions (b)" in joint, joint
    split = run("--remat=policy=dots_saveable mode=split", "--print-memory")
    for half in ("@main_fwd:", "@main_bwd:"):
        line = next(l for l in split.splitlines() if l.startswith(half))
        assert "values with symbolic dimensions (b)" in line, split
    report = run("--remat=policy=dots_saveable", "--print-saved-residuals")
    assert "64 bytes + 48 bytes per unit of b" in report.splitlines()[0], report
    est = rp.estimate_memory(rp.remat(m, "dots_saveable"))["main"]
    assert est.symbolic_values > 0 and est.symbols == ("b",)
