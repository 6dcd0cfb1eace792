"""Residuals as JAX describes them: `Residual`, where a saved value comes from, and their bytes."""
from __future__ import annotations

import dataclasses

from remat_passes.analysis import scan_pairs
from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import ir
from remat_passes.ir.verdicts import Offloadable


@dataclasses.dataclass
class Residual:
    """One saved residual, described the way JAX's saved_residuals does."""
    type: str            # 'f32[5,4]'
    description: str     # 'from the argument W1' / 'output of sin from f.py:3:4 (g)'
    bytes: int
    offload: Offloadable | None = None
    note: str | None = None   # auto(budget=...): what recomputing it would have cost
    # symbolic dimensions (not in `bytes`): bytes per unit of their product, and its name
    # ('b', 'b*s'; None where a dimension's symbol is unknown)
    unit_bytes: int | None = None
    symbols: str | None = None
    argument: bool = False    # one of the function's own arguments (not an activation)

    def __str__(self):
        text = f"{self.type} {self.description}"
        return text if self.note is None else f"{text} ({self.note})"


def describe_value(value, func_op, analysis=None) -> str:
    """JAX's words for where a residual comes from (`analysis`, when given, answers which
    value a scan loop result stacks)."""
    if isinstance(value, ir.BlockArgument):
        return f"from the argument {graph.arg_name(func_op, value.arg_number)}"
    op = value.owner
    pos, fn = graph.source_position(op)
    where = f" from {pos}" if pos else ""
    where += f" ({fn})" if fn else ""
    if op.name == scan_pairs.WHILE:
        inner = analysis.stacked_value(value) if analysis is not None else \
            scan_pairs.stacked_value(op, value.result_number)
        if inner is not None:
            what = ("the carry-in" if isinstance(inner, ir.BlockArgument)
                    else describe_value(inner, func_op))
            return f"{what} of each iteration, stacked by the scan loop{where}"
    name = contract.checkpoint_name(op)
    if name is not None:
        return f"named '{name}'{where}"
    return f"output of {graph.jax_primitive(op)}{where}"


def residual(value, func_op, offload=None, analysis=None, dims=None,
             global_type=None) -> Residual:
    """`dims` (a symbolic.DimNames of `func_op`) names symbolic dimensions: `f32[b,4]`.
    `global_type`: the type a per-device value of a GSPMD manual region is kept as."""
    t = value.type if global_type is None else global_type
    unit = graph.dynamic_unit_bytes(t)
    symbols = dims.symbols(value) if dims is not None and unit is not None else None
    note = None if unit is None else (
        f"{unit} bytes per unit of {symbols}, not counted in the total" if symbols else
        f"{unit} bytes per unit of its dynamic dimensions, not counted in the total")
    type_str = dims.type_str(value) if dims is not None and global_type is None else \
        graph.jax_type_str(t)
    return Residual(type_str, describe_value(value, func_op, analysis),
                    graph.type_bytes(t), offload, note, unit, symbols,
                    isinstance(value, ir.BlockArgument))


def residual_bytes(residuals) -> int:
    return sum(r.bytes for r in residuals)


def activation_bytes(residuals, segmented=()) -> int:
    """What `auto`'s budgets count: residuals kept in device memory beyond the function's
    own arguments; with `segmented` (segment-scans' reports, `delta_bytes` each), as they
    are after the scans were cut into segments."""
    return sum(r.bytes for r in residuals if not r.argument and
               (r.offload is None or r.offload.dst not in contract.HOST_KINDS)) \
        + sum(s.delta_bytes for s in segmented)


def residual_bytes_text(residuals) -> str:
    """'64 bytes', or with symbolic sizes '64 bytes + 32 bytes per unit of b'."""
    per: dict[str, int] = {}
    for r in residuals:
        if r.unit_bytes is not None:
            key = r.symbols or "unnamed dynamic dimensions"
            per[key] = per.get(key, 0) + r.unit_bytes
    return " + ".join([f"{residual_bytes(residuals)} bytes"] +
                      [f"{n} bytes per unit of {k}" for k, n in per.items()])
