"""Saved residuals and the forward/backward side by side, for a function or a Module."""
from __future__ import annotations

from remat_passes.api.remat import remat
from remat_passes.core.residuals import Residual
from remat_passes.ir import graph
from remat_passes.ir.mlir import RematError


_OWN_GRADIENTS = ("{name} computes its own gradients (a training step): "
                  "differentiating it again would report the residuals of its gradient; pass "
                  "rp.export({name}, *args) (the step as it is) or use "
                  "rp.jit({name}, policy=...).lower(*args).residuals")


def _as_module(fun_or_module, args):
    from remat_passes.jax.module import Module
    if isinstance(fun_or_module, Module):
        if args:
            raise TypeError("arguments are only taken with a function, not with a Module")
        return fun_or_module
    from remat_passes.jax.bridge import export, export_vjp
    name = getattr(fun_or_module, "__name__", "the function")
    if _differentiates_itself(export(fun_or_module, *args)):
        raise RematError("error: " + _OWN_GRADIENTS.format(name=name))
    return export_vjp(fun_or_module, *args)


def _differentiates_itself(module) -> bool:
    """Does the program hold a backward pass (ops under a JAX `transpose(` frame)?"""
    found = []

    def visit(op):
        if "transpose(" in graph.name_stack(op):
            found.append(op)
            return
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    if not found:
                        visit(inner.operation)
    with module.op.context:
        for op in module.op.body.operations:
            if not found:
                visit(op.operation)
    return bool(found)


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
