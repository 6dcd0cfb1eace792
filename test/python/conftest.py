import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The benchmark models (tools/benchmarks) are shared with the tests that need them.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax  # noqa: E402

# Gradients are compared in f32 at rtol 1e-5; keep XLA:CPU deterministic.
jax.config.update("jax_default_matmul_precision", "highest")
