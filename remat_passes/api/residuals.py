"""Saved residuals and the forward/backward side by side, for a function or a Module."""
from __future__ import annotations

from remat_passes.api.remat import remat
from remat_passes.core.residuals import Residual
from remat_passes.ir import graph


def _as_module(fun_or_module, args):
    from remat_passes.jax.module import Module
    if isinstance(fun_or_module, Module):
        if args:
            raise TypeError("arguments are only taken with a function, not with a Module")
        return fun_or_module
    from remat_passes.jax.bridge import export_vjp
    return export_vjp(fun_or_module, *args)


def saved_residuals(fun_or_module, *args, policy=None) -> list[Residual]:
    """The residuals remat-partial-eval saves: arguments first, then values in program order.

    With `policy=None` regions follow their recorded policies and everything
    outside regions is saved, as JAX does for code without jax.checkpoint.
    """
    return remat(_as_module(fun_or_module, args), policy).residuals


def print_saved_residuals(fun_or_module, *args, policy=None, file=None) -> None:
    for r in saved_residuals(fun_or_module, *args, policy=policy):
        print(str(r), file=file)


def print_fwd_bwd(fun_or_module, *args, policy=None, width: int = 240, file=None) -> None:
    """The split forward and backward functions side by side (like the notebook's)."""
    from rich.console import Console
    from rich.table import Table
    module = _as_module(fun_or_module, args)
    split = remat(module, policy, mode="split")
    funcs = {graph.func_name(op): op for op in split.op.body.operations
             if op.operation.name == "func.func"}
    table = Table(show_header=False, show_lines=True, padding=(1, 2, 0, 2), box=None)
    table.add_row("[bold green]forward computation:", "[bold green]backward computation:")
    table.add_row(str(funcs["main_fwd"]), str(funcs["main_bwd"]))
    Console(width=width, file=file).print(table)
