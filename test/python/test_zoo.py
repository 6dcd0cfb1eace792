"""The model-zoo benchmark's checks and page section, on a made-up result (the benchmark
itself installs other libraries, so it runs outside the test suite)."""
from __future__ import annotations

from tools.benchmarks import zoo


def _data(ours_bytes=100, grad_error=1e-7, footprint=(100, 100), activations=10):
    return {"meta": {"backend": "cpu", "cpus": 2, "jax": "x", "commit": "c"},
            "models": {"m": {"library": "lib==1", "model": "tiny"}},
            "tie_to_cotangent": True,
            "rows": [{"model": "m", "policy": "dots_saveable", "ours": [3, ours_bytes],
                      "jax": [4, 100], "grad_error": grad_error, "remat_s": 0.1,
                      "footprint": list(footprint), "activations": activations},
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


def test_render_lists_every_row_and_the_library_pin():
    text = zoo.render(_data(grad_error=1e-3))
    assert "## Model zoo" in text and "`lib==1`" in text
    assert "| `dots_saveable` | 3 / 4 |" in text and "auto(budget=10)" in text
    assert "remat=True" in text and "Missed:" in text and "gradient error" in text
