"""XLA's own peak of a compiled program, read from an XLA dump: where its scratch buffer is
fullest, and which values fill it. The counterpart of `estimate_memory`'s "live at the
peak" line, for finding what the estimate misses.

    XLA_FLAGS=--xla_dump_to=/tmp/dump python my_program.py
    python -m tools.benchmarks.xla_liveness /tmp/dump [NAME]

NAME picks the module whose dump file names contain it (e.g. `jit_main_bwd`; by default the
last module dumped). From `*after_optimizations.txt` (the scheduled HLO: the ENTRY's
instructions in the order they run), `*buffer-assignment.txt` (the values of the
`preallocated-temp` allocation and their sizes) and `*buffer-assignment-values.txt` (each
value's uses), each temp value is live from its instruction to its last use in the entry;
the program point where they cover the most of the allocation (values written in place
of an operand share its bytes) is XLA's peak of its scratch. Values of nested
computations (a loop body, a fusion's thread-local values) are not counted.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

_VALUE = re.compile(r"value: <\d+ ([\w.\-]+) @\d+> \(size=(\d+),offset=(\d+)\): (\S+)")
_TEMP = re.compile(r"allocation \d+: size (\d+),(?: page \d+,)? preallocated-temp:\n"
                   r"((?: value:.*\n)+)")      # (`page N,`: newer XLA)
_USES = re.compile(r"<\d+ ([\w.\-]+) @\d+>\n positions:\n(?:  .*\n)+ uses:\n((?:  .*\n)+)")
_INSTR = re.compile(r"^\s+(?:ROOT )?%?([\w.\-]+) = (.*)$", re.M)


def _one(directory: Path, name: str | None, suffix: str) -> Path:
    files = list(directory.glob(f"module_*{suffix}"))
    if name:
        files = [f for f in files if name in f.name]
    if not files:
        raise SystemExit(f"error: no '*{suffix}' file{f' with {name!r}' if name else ''} "
                         f"in {directory}")
    # the newest written (the module numbers are ids, not an order; as text they sort
    # module_264071 before module_84100)
    return max(files, key=lambda f: (f.stat().st_mtime_ns, f.name))


def liveness(directory: str, name: str | None = None, top: int = 12) -> dict:
    """XLA's scratch peak of one dumped module: {'temp', 'peak', 'at', 'index', 'of',
    'values': [(bytes, value, shape)], 'module'}."""
    d = Path(directory)
    assignment = _one(d, name, "after_optimizations-buffer-assignment.txt")
    module = assignment.name.split("after_optimizations")[0]      # the files' prefix
    hlo = next(d.glob(f"{module}after_optimizations.txt")).read_text()
    values_file = list(d.glob(f"{module}after_optimizations-buffer-assignment-values.txt"))
    text = assignment.read_text()
    uses_text = values_file[0].read_text() if values_file else text
    entry = hlo[hlo.index("\nENTRY"):]
    entry = entry[:entry.find("\n}") + 1] if "\n}" in entry else entry
    order = [m.group(1) for m in _INSTR.finditer(entry)]
    position = {n: i for i, n in enumerate(order)}
    temp = _TEMP.search(text)
    if temp is None:
        return {"module": module, "temp": 0, "peak": 0, "at": None, "index": -1,
                "of": len(order), "values": []}
    uses = {m.group(1): re.findall(r"^  ([\w.\-]+), operand", m.group(2), re.M)
            for m in _USES.finditer(uses_text)}
    spans = []
    for value, size, offset, shape in _VALUE.findall(temp.group(2)):
        if value not in position:
            continue                   # (not an entry instruction)
        first = position[value]
        last = max([position[u] for u in uses.get(value, []) if u in position] + [first])
        spans.append((first, last, int(size), int(offset), value, shape))
    if not order:
        return {"module": module, "temp": int(temp.group(1)), "peak": 0, "at": None,
                "index": -1, "of": 0, "values": []}
    # the bytes of the allocation in use at each instruction: the union of the live values'
    # [offset, offset + size) (a value written in place of an operand dying there shares it)
    live = [_covered([(o, o + n) for a, b, n, o, _, _ in spans if a <= i <= b])
            for i in range(len(order))]
    peak = max(range(len(order)), key=lambda i: live[i])
    at_peak = sorted(((n, v, sh) for a, b, n, o, v, sh in spans if a <= peak <= b),
                     reverse=True)
    return {"module": module, "temp": int(temp.group(1)), "peak": live[peak],
            "at": order[peak], "index": peak, "of": len(order), "values": at_peak[:top]}


def _covered(intervals: list) -> int:
    """The length of the union of [start, end) intervals."""
    total, end = 0, -1
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return
    r = liveness(argv[0], argv[1] if len(argv) > 1 else None)
    print(f"{r['module'].rstrip('._')}: temp allocation {r['temp']:,} B; its values peak at "
          f"{r['peak']:,} B at {r['at']} (instruction {r['index']} of {r['of']})")
    for size, value, shape in r["values"]:
        print(f"  {size:>12,} B  {value}  {shape}")


if __name__ == "__main__":
    main()
