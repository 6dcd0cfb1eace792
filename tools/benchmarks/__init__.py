"""Benchmarks of remat_passes (not tests): one set of model definitions, measurements to
JSON, and the markdown page and plots built from the JSON.

    python -m tools.benchmarks models    # vs jax.checkpoint on real models (docs/benchmarks.md)
    python -m tools.benchmarks scaling   # pass time and memory vs module size
    python -m tools.benchmarks memory    # static peak-memory figures
    python -m tools.benchmarks render    # rebuild docs/benchmarks.md from the JSON files

Run from the repository root after `pip install -e ".[bench]"`. Modules:

* `models`   - every model: the benchmark models, the scaling families, the memory figures
               (the tests import them from here too);
* `cases`    - the (model, policy) cases, generated from the policy table;
* `measure`  - runs cases and scaling sizes, writes `tools/benchmarks/results/*.json`;
* `render`   - the markdown tables and plots from those files.
"""
