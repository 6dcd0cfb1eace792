"""remat_passes: gradient checkpointing (rematerialization) as MLIR passes over StableHLO."""
from remat_passes import jax_compat as _jax_compat

_jax_compat.check_installed_version()   # a clear ImportError on an unsupported jax/jaxlib

from remat_passes import policies
from remat_passes.jax_bridge import (checkpoint, checkpoint_name, compile, export,
                                     export_vjp, from_exported, names_as_markers, to_exported)
from remat_passes.memory import FunctionMemory, MemoryEstimate, estimate_memory, format_memory
from remat_passes.mlir import RematError
from remat_passes.module import Module, load
from remat_passes.pipeline import remat, run_pipeline, parse_pipeline
from remat_passes.planner import ParetoPoint, pareto
from remat_passes.report import Residual, print_fwd_bwd, print_saved_residuals, saved_residuals

__version__ = "0.1.0"

__all__ = [
    "Module", "load", "from_exported", "to_exported", "compile", "export", "export_vjp",
    "names_as_markers",
    "checkpoint", "checkpoint_name", "policies", "remat", "run_pipeline", "parse_pipeline",
    "saved_residuals", "print_saved_residuals", "print_fwd_bwd", "Residual", "RematError",
    "estimate_memory", "format_memory", "MemoryEstimate", "FunctionMemory",
    "pareto", "ParetoPoint",
    "__version__",
]
