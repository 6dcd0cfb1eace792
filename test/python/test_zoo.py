"""The model-zoo benchmark's checks and page section, on a made-up result (the benchmark
itself installs other libraries, so it runs outside the test suite)."""
from __future__ import annotations

import pytest

from tools.benchmarks import zoo


def _data(ours_bytes=100, grad_error=1e-7, footprint=(100, 100), activations=10,
          cli=None, bf16_difference=(0.0, 0.0)):
    return {"meta": {"backend": "cpu", "cpus": 2, "jax": "x", "commit": "c"},
            "models": {"m": {"library": "lib==1", "model": "tiny"},
                       "m-bf16": {"library": "lib==1", "model": "tiny, bf16"}},
            "tie_to_cotangent": True,
            "rows": [{"model": "m", "policy": "dots_saveable", "form": "joint",
                      "ours": [3, ours_bytes], "jax": [4, 100], "cli": cli or [3, ours_bytes],
                      "grad_error": grad_error, "no_policy_difference": grad_error,
                      "jax_difference": 0.0, "remat_s": 0.1,
                      "footprint": list(footprint), "activations": activations},
                     {"model": "m-bf16", "policy": "dots_saveable", "form": "split",
                      "ours": [3, 100], "jax": [4, 100], "cli": [3, 100], "grad_error": 1e-2,
                      "no_policy_difference": bf16_difference[0],
                      "jax_difference": bf16_difference[1], "remat_s": 0.1,
                      "activations": activations},
                     {"model": "m", "policy": "auto(budget=10)", "budget": 10, "ours": [3, 90],
                      "activations": activations, "grad_error": grad_error}],
            "own": [{"model": "m", "setting": "remat=True", "jax_saves": [5, 50],
                     "export_jax": [4, 40], "export_regions": [4, 40]}]}


def test_checks_pass_on_a_good_result_and_name_each_miss():
    assert all(ok for _, ok in zoo.checks(_data()))
    missed = [t for t, ok in zoo.checks(_data(ours_bytes=101, grad_error=1e-3,
                                              footprint=(103, 100), activations=11)) if not ok]
    assert any("gradient error" in t for t in missed)
    assert any("residual bytes 101" in t for t in missed)
    assert any("joint footprint 103" in t for t in missed)
    assert any("within the budget" in t for t in missed)
    assert any("difference from the module with no policy 1.0e-03" in t for t in missed)


def test_a_scanned_models_rows_are_held_to_jax_s_layers_by_activations():
    """Where JAX's side is the library's scan of `jax.checkpoint(layer, policy)` (`per_layer`),
    the ops outside its checkpoint keep copies of arguments that ours makes again from the
    arguments: the residual check compares activations (bytes beyond the arguments), and
    each split half's check its scratch plus the activations between the halves."""
    row = {"model": "m", "policy": "nothing_saveable", "form": "split", "per_layer": True,
           "ours": [3, 150], "jax": [5, 120, 90], "cli": [3, 150], "grad_error": 1e-7,
           "no_policy_difference": 0.0, "jax_difference": 0.0, "remat_s": 0.1,
           "activations": 20, "temp": [[160, 100], [180, 120]],
           "split_footprint": [[1, 1], [1, 1]]}
    data = dict(_data(), rows=[row], own=[])
    assert all(ok for _, ok in zoo.checks(data)), [t for t, ok in zoo.checks(data) if not ok]
    assert any("backward temp and activations 180 + 20 B vs JAX's 120 + 90 B" in t
               for t, _ in zoo.checks(data))
    row.update(activations=95, temp=[[100, 100], [120, 120]])
    missed = [t for t, ok in zoo.checks(data) if not ok]
    assert len(missed) == 3 and "activations 95 B vs JAX's 90 B" in missed[0], missed
    assert "(activations 95 / 90)" in zoo.render(data)


def test_bf16_is_held_to_the_last_bit_where_jax_is_exact_and_remat_opt_must_agree():
    """A bf16 row's gradient error against jax.grad is not checked (bf16 rounding), but its
    difference from the module with no policy must be 0 where JAX's checkpoint is exact, and
    no larger than JAX's where it is not; remat-opt must report the Python API's residuals."""
    assert all(ok for _, ok in zoo.checks(_data(bf16_difference=(2e-3, 2e-3))))
    missed = [t for t, ok in zoo.checks(_data(bf16_difference=(2e-3, 0.0))) if not ok]
    assert len(missed) == 1 and "m-bf16 dots_saveable split" in missed[0]
    missed = [t for t, ok in zoo.checks(_data(cli=[4, 132])) if not ok]
    assert len(missed) == 1 and "remat-opt reports 4 residuals, 132 B" in missed[0]


def test_render_lists_every_row_and_the_library_pin():
    text = zoo.render(_data(grad_error=1e-3))
    assert "## Model zoo" in text and "`lib==1`" in text
    assert "| `dots_saveable` | joint | 3 / 4 / 3 |" in text and "auto(budget=10)" in text
    assert "| `dots_saveable` | split | 3 / 4 / 3 |" in text
    assert "remat=True" in text and "Missed:" in text and "gradient error" in text


def test_a_subset_run_replaces_its_models_and_keeps_the_others():
    """`zoo --models m` measures m alone: m's rows are the new ones, every other model's
    rows, own-remat entries and description stay, each model saying its commit."""
    old = _data()
    old["meta"]["commit"] = "old"
    new = {"meta": {"backend": "cpu", "cpus": 2, "jax": "y", "commit": "new"},
           "models": {"m": {"library": "lib==2", "model": "tiny again"}},
           "tie_to_cotangent": True,
           "rows": [dict(old["rows"][0], grad_error=5e-8)], "own": []}
    merged = zoo.merge(old, new)
    assert set(merged["models"]) == {"m", "m-bf16"}
    assert merged["models"]["m"]["commit"] == "new" and merged["models"]["m-bf16"]["commit"] \
        == "old"
    assert [r["model"] for r in merged["rows"]] == ["m-bf16", "m"]
    assert merged["rows"][1]["grad_error"] == 5e-8 and merged["own"] == []
    assert "measured at commit old" in zoo.render(merged)


def test_a_preset_spelled_as_our_policy_is_held_to_jax_s_bytes():
    """MaxText's presets: our `maxtext(preset)` on the model without its checkpoints must keep
    at most what JAX keeps for the model with them; the page says what it kept."""
    good = _data()
    good["own"][0].update(spelling="maxtext(full)", ours_spelled=[3, 50])
    assert all(ok for _, ok in zoo.checks(good))
    assert "`maxtext(full)` on the model without them keeps 3 (50 B)" in zoo.render(good)
    good["own"][0]["ours_spelled"] = [3, 51]
    missed = [t for t, ok in zoo.checks(good) if not ok]
    assert len(missed) == 1 and "maxtext(full)" in missed[0] and "51 B" in missed[0]


def test_a_library_for_a_newer_python_is_skipped_with_a_line(monkeypatch):
    said = []
    monkeypatch.setitem(zoo.NEEDS_PYTHON, "maxtext", (99, 0))
    data = zoo.measure(["maxtext-llama2"], said.append)
    assert data["rows"] == [] and "maxtext-llama2 skipped: maxtext needs Python 99.0" in said[0]


@pytest.mark.exact
@pytest.mark.slow
def test_the_flax_rows_hold():
    """The zoo's Flax model (linen blocks, plain and under `nn.remat`) measured live, with
    the flax this environment has (a test dependency, pinned as the zoo pins it): for every
    fixed policy in both forms, gradients within the zoo's tolerance of `jax.grad`, residual
    bytes at most `jax.checkpoint`'s, remat-opt's residuals the Python API's, `auto`
    within its budget, and `nn.remat` made regions at most JAX's bytes. (XLA:CPU's joint
    footprint and split temp bytes are figures of the benchmark page, not measured here.)"""
    pytest.importorskip("flax")
    data = zoo.measure(["flax"], lambda *a: None, use_environment=True, compiled=False)
    results = zoo.checks(data)
    assert not any("footprint" in t or " temp " in t for t, _ in results)
    assert len(results) >= 4 * 2 * 4, results
    assert all(ok for _, ok in results), [t for t, ok in results if not ok]
