import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

# Gradients are compared in f32 at rtol 1e-5; keep XLA:CPU deterministic.
jax.config.update("jax_default_matmul_precision", "highest")
