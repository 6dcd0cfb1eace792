"""The estimate as text: `format_memory` (the CLI's `--print-memory` lines) and
`format_bytes`."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from remat_passes.cost.memory import MemoryEstimate


def format_bytes(n: int) -> str:
    """'512 B', '64.0 KiB', '3.27 MiB'."""
    if n < 1024:
        return f"{n} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{n:.2f} {unit}" if n < 10 else f"{n:.1f} {unit}"
    raise AssertionError("unreachable")


def format_memory(estimate: MemoryEstimate, peak_values: bool = False) -> str:
    """One line per function: peak (and where), arguments, results, residuals; with
    `peak_values`, a second line naming the largest buffers live at the peak."""
    lines = []
    for f in estimate:
        line = (f"@{f.name}: peak {format_bytes(f.peak_bytes)} ({f.peak_bytes} B) "
                f"at {f.peak_op}; arguments {format_bytes(f.argument_bytes)}; "
                f"results {format_bytes(f.result_bytes)}")
        if f.residual_bytes is not None:
            line += f"; residuals {format_bytes(f.residual_bytes)}"
        if f.symbolic_values:
            line += (f"; not counted: {f.symbolic_values} values with symbolic dimensions "
                     f"({', '.join(f.symbols)})")
        lines.append(line)
        if peak_values and f.peak_values:
            lines.append("  live at the peak: " + "; ".join(
                f"{format_bytes(b)} {what}" for b, what in f.peak_values))
    return "\n".join(lines)
