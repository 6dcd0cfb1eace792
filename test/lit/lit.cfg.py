# lit configuration for remat_passes: every .mlir file here is a test whose
# RUN lines call `remat-opt` and `filecheck` (both on PATH once the project is
# installed with `pip install -e ".[test]"`).
import os

import lit.formats

config.name = "remat_passes"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir"]
config.excludes = ["lit.cfg.py", "Output", "inputs"]
config.test_source_root = os.path.dirname(__file__)
config.environment["PATH"] = os.environ.get("PATH", "")
# jax is quiet about missing accelerators only when told the platform.
config.environment["JAX_PLATFORMS"] = os.environ.get("JAX_PLATFORMS", "cpu")
for var in ("HOME", "VIRTUAL_ENV", "PYTHONPATH", "TMPDIR"):
    if var in os.environ:
        config.environment[var] = os.environ[var]
# A remat-opt process can die inside jaxlib's native code on a loaded shared machine (a
# segfault at the same instruction whatever the input; test/python/conftest.py says more).
# The tests are deterministic, so a second run that passes means the first one crashed:
# lit runs a failed test once more and reports it as FLAKYPASS, not PASS.
config.test_retry_attempts = 1
