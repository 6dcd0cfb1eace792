"""Reports: saved residuals (as JAX prints them) and forward/backward side by side."""
from __future__ import annotations

from remat_passes import graph
from remat_passes.module import Module
from remat_passes.passes.remat_partial_eval import Residual


def _as_module(fun_or_module, args) -> Module:
    if isinstance(fun_or_module, Module):
        if args:
            raise TypeError("arguments are only taken with a function, not with a Module")
        return fun_or_module
    from remat_passes.jax_bridge import export_vjp
    return export_vjp(fun_or_module, *args)


def saved_residuals(fun_or_module, *args, policy=None) -> list[Residual]:
    """The residuals remat-partial-eval saves: arguments first, then values in program order.

    With `policy=None` regions follow their recorded policies and everything
    outside regions is saved, as JAX does for code without jax.checkpoint.
    """
    from remat_passes.pipeline import remat
    return remat(_as_module(fun_or_module, args), policy).residuals


def print_saved_residuals(fun_or_module, *args, policy=None, file=None) -> None:
    for r in saved_residuals(fun_or_module, *args, policy=policy):
        print(str(r), file=file)


def residual_bytes(residuals) -> int:
    return sum(r.bytes for r in residuals)


def print_fwd_bwd(fun_or_module, *args, policy=None, width: int = 240, file=None) -> None:
    """The split forward and backward functions side by side (like the notebook's)."""
    from rich.console import Console
    from rich.table import Table

    from remat_passes.pipeline import remat
    module = _as_module(fun_or_module, args)
    split = remat(module, policy, mode="split")
    funcs = {graph.func_name(op): op for op in split.op.body.operations
             if op.operation.name == "func.func"}
    table = Table(show_header=False, show_lines=True, padding=(1, 2, 0, 2), box=None)
    table.add_row("[bold green]forward computation:", "[bold green]backward computation:")
    table.add_row(str(funcs["main_fwd"]), str(funcs["main_bwd"]))
    Console(width=width, file=file).print(table)
