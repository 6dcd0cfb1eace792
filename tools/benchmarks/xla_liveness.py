"""XLA's own peak of a compiled program, read from an XLA dump: where its scratch buffer is
fullest, and which values fill it. The counterpart of `estimate_memory`'s "live at the
peak" line, for finding what the estimate misses.

    XLA_FLAGS=--xla_dump_to=/tmp/dump JAX_ENABLE_COMPILATION_CACHE=false python my_program.py
    python -m tools.benchmarks.xla_liveness /tmp/dump [NAME]

(The cache off: JAX's persistent compilation cache leaves the dump flag out of its key,
so a program it finds there is not compiled, and XLA dumps nothing of it.)

NAME picks the module whose dump file names contain it (e.g. `jit_main_bwd`; by default the
last module dumped). From `*after_optimizations.txt` (the scheduled HLO: the ENTRY's
instructions in the order they run), `*buffer-assignment.txt` (the values of the
`preallocated-temp` allocation, their sizes and offsets) and XLA's own live ranges
(`*-live-range.txt`: each value from its definition to its last use, through tuples and
barriers; where a dump lacks it, from `*buffer-assignment-values.txt`'s uses in the
entry), the program point where the live values cover the most of the allocation (values
written in place of an operand share its bytes) is XLA's peak of its scratch. A fusion's
thread-local values are not counted, nor, without XLA's live ranges, those of nested
computations (a loop body).

The allocation can be larger than that peak: XLA packs the values into it by a best-fit
heap over their live ranges, and a freed hole too small for a later value is left unused
(measured: the conv net's objective=peak joint program on jaxlib 0.12, 262,144 B of its
2,195,456 B). `gap` is that difference, which no liveness estimate sees; `xla_heap` packs
the heap again as XLA does, to see where it comes from.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

_VALUE = re.compile(r"value: <\d+ ([\w.\-]+)(?:\{([\d,]*)\})? @\d+> "
                    r"\(size=(\d+),offset=(\d+)\): (\S+)")
_TEMP = re.compile(r"allocation \d+: size (\d+),(?: page \d+,)? preallocated-temp:\n"
                   r"((?: value:.*\n)+)")      # (`page N,`: newer XLA)
_USES = re.compile(r"<\d+ ([\w.\-]+) @\d+>\n positions:\n(?:  .*\n)+ uses:\n((?:  .*\n)+)")
_INSTR = re.compile(r"^\s+(?:ROOT )?%?([\w.\-]+) = (.*)$", re.M)
_RANGE = re.compile(r"^    ([\w.\-]+)\{([\d,]*)\}:(\d+)-(\d+)$", re.M)   # live-range.txt
_SEQUENCE = re.compile(r"^    (\d+):([\w.\-]+)$", re.M)


def _one(directory: Path, name: str | None, suffix: str) -> Path:
    files = list(directory.glob(f"module_*{suffix}"))
    if name:
        files = [f for f in files if name in f.name]
    if not files:
        raise SystemExit(f"error: no '*{suffix}' file{f' with {name!r}' if name else ''} "
                         f"in {directory} (XLA dumps a program only when it compiles it: "
                         "one that JAX's persistent compilation cache already holds is "
                         "not; dump with JAX_ENABLE_COMPILATION_CACHE=false)")
    # the newest written (the module numbers are ids, not an order; as text they sort
    # module_264071 before module_84100)
    return max(files, key=lambda f: (f.stat().st_mtime_ns, f.name))


def liveness(directory: str, name: str | None = None, top: int = 12) -> dict:
    """XLA's scratch peak of one dumped module: {'temp', 'peak', 'gap' (temp - peak),
    'at', 'index', 'of', 'values': [(bytes, value, shape)], 'module', 'ranges' ('xla' where
    XLA's live ranges were read, 'uses' where they came from the uses)}."""
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
        return {"module": module, "temp": 0, "peak": 0, "gap": 0, "at": None, "index": -1,
                "of": len(order), "values": [], "ranges": None}
    sequence, ranges = _live_ranges(d, module)
    if ranges is not None:      # (its sequence: every computation's, as XLA numbers them)
        order, position = sequence, {n: i for i, n in enumerate(sequence)}
        uses = {}
    else:
        uses = {m.group(1): re.findall(r"^  ([\w.\-]+), operand", m.group(2), re.M)
                for m in _USES.finditer(uses_text)}
    spans = []
    for value, index, size, offset, shape in _VALUE.findall(temp.group(2)):
        if value not in position:
            continue                   # (not an entry instruction)
        if ranges is not None and (value, index) in ranges:
            first, last = ranges[(value, index)]
        else:
            first = position[value]
            last = max([position[u] for u in uses.get(value, []) if u in position] + [first])
        spans.append((first, last, int(size), int(offset), value, shape))
    if not order:
        return {"module": module, "temp": int(temp.group(1)), "peak": 0,
                "gap": int(temp.group(1)), "at": None, "index": -1, "of": 0, "values": [],
                "ranges": None}
    # the bytes of the allocation in use at each instruction: the union of the live values'
    # [offset, offset + size) (a value written in place of an operand dying there shares it)
    live = [_covered([(o, o + n) for a, b, n, o, _, _ in spans if a <= i <= b])
            for i in range(len(order))]
    peak = max(range(len(order)), key=lambda i: live[i])
    at_peak = sorted(((n, v, sh) for a, b, n, o, v, sh in spans if a <= peak <= b),
                     reverse=True)
    return {"module": module, "temp": int(temp.group(1)), "peak": live[peak],
            "gap": int(temp.group(1)) - live[peak], "at": order[peak], "index": peak,
            "of": len(order), "values": at_peak[:top],
            "ranges": "xla" if ranges is not None else "uses"}



def _live_ranges(directory: Path, module: str) -> tuple:
    """XLA's own live ranges of the module's values: (its instruction sequence, {(value,
    shape index): (first, last)} in positions of that sequence), or (None, None) where the
    dump has no `*-live-range.txt` (older XLA)."""
    files = list(directory.glob(f"{module}after_optimizations-live-range.txt"))
    if not files:
        return None, None
    text = files[0].read_text()
    sequence = [m.group(2) for m in sorted(_SEQUENCE.finditer(text),
                                           key=lambda m: int(m.group(1)))]
    return sequence, {(m.group(1), m.group(2)): (int(m.group(3)), int(m.group(4)))
                      for m in _RANGE.finditer(text)}


def _covered(intervals: list) -> int:
    """The length of the union of [start, end) intervals."""
    total, end = 0, -1
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def headline(r: dict) -> str:
    """The temp allocation, the peak of its values and where, and the hole between them."""
    gap = f"; {r['gap']:,} B of it a hole in XLA's packing" if r["gap"] else ""
    return (f"temp allocation {r['temp']:,} B; its values peak at {r['peak']:,} B at "
            f"{r['at']} (instruction {r['index']} of {r['of']}){gap}")


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return
    r = liveness(argv[0], argv[1] if len(argv) > 1 else None)
    print(f"{r['module'].rstrip('._')}: {headline(r)}")
    for size, value, shape in r["values"]:
        print(f"  {size:>12,} B  {value}  {shape}")


if __name__ == "__main__":
    main()
