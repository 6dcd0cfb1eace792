"""remat_passes: gradient checkpointing (rematerialization) as MLIR passes over StableHLO.

The public names below are loaded on first use (PEP 562), so `import remat_passes`
and the CLI's `--version`/`--help` do not pay for importing JAX; the installed
jaxlib's version is checked at import, jax's when it is first imported (jax.bridge).
"""
from remat_passes import jax_compat as _jax_compat

_jax_compat.check_installed_version(("jaxlib",))   # a clear ImportError on an unsupported jaxlib

__version__ = "0.1.0"

# public name -> the module that defines it (or is it, for the names in _MODULES)
_MODULES = {"policies"}
_EXPORTS = {
    "policies": "policy.policies",
    **{name: "jax.bridge" for name in (
        "checkpoint", "checkpoint_name", "export", "export_vjp", "from_exported",
        "names_as_markers", "scan")},
    "compile": "jax.run", "to_exported": "jax.run",
    **{name: "cost.memory" for name in ("FunctionMemory", "MemoryEstimate", "estimate_memory")},
    "format_memory": "cost.memory_report",
    "RematError": "ir.mlir",
    "Module": "jax.module", "load": "jax.module",
    "remat": "api.remat", "run_pipeline": "passes.manager", "parse_pipeline": "passes.manager",
    "jit": "api.jit",
    **{name: "api.sweeps" for name in ("ParetoPoint", "pareto", "bounds", "recompute_seconds",
                                       "PolicyPoint", "policy_points", "plot_pareto")},
    **{name: "api.residuals" for name in (
        "Residual", "print_fwd_bwd", "print_saved_residuals", "saved_residuals")},
}

__all__ = [
    "Module", "load", "from_exported", "to_exported", "compile", "export", "export_vjp",
    "names_as_markers",
    "checkpoint", "checkpoint_name", "scan", "policies", "remat", "run_pipeline", "parse_pipeline",
    "saved_residuals", "print_saved_residuals", "print_fwd_bwd", "Residual", "RematError",
    "estimate_memory", "format_memory", "MemoryEstimate", "FunctionMemory",
    "pareto", "ParetoPoint", "bounds", "recompute_seconds", "policy_points", "PolicyPoint",
    "plot_pareto",
    "jit",
    "__version__",
]


def __getattr__(name: str):
    import importlib
    if name not in _EXPORTS:
        raise AttributeError(f"module 'remat_passes' has no attribute {name!r}")
    module = importlib.import_module(f"remat_passes.{_EXPORTS[name]}")
    value = module if name in _MODULES else getattr(module, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
