"""XLA's packing of its heap, replayed over a dump's own live ranges: why its temp allocation
can be larger than the most bytes its values hold at once (`xla_liveness`'s hole).

    XLA_FLAGS=--xla_dump_to=/tmp/dump JAX_ENABLE_COMPILATION_CACHE=false python my_program.py
    python -m tools.benchmarks.xla_heap /tmp/dump [NAME]

(The cache off: JAX's persistent compilation cache leaves the dump flag out of its key,
so a program it finds there is not compiled, and XLA dumps nothing of it.)

As read in XLA's heap simulator (heap_simulator.cc: `HeapSimulator::RunComputation`,
`GlobalDecreasingSizeBestFitHeap`, `ChooseBestHeapAlgorithm` over its spatial and temporal
orders), the packing of jaxlib 0.10 to 0.12:

* time is counted in events, not instructions: at each instruction, first each value it
  defines is allocated (in order of first use, last use, value id), then each value read
  there for the last time is freed, each event one tick; a value written in place of an
  operand freed by its instruction (same offset, in the dump) shares the operand's buffer:
  the operand is freed and the value joins it (one more tick), so the two are one
  allocation of two intervals;
* it packs twice and keeps the smaller heap: sizes first (larger first, then longer-lived
  by its own interval, then value id), live ranges first (the allocation's whole span,
  longer first, then larger, then value id);
* each allocation goes at the start of the smallest gap that holds it among the ones
  placed before it that overlap any of its intervals in time (ends rounded up to
  `ALIGNMENT`), the lowest such gap of equal size, else on top of them all.

Checked on XLA:CPU's own allocations: the replay gives XLA's temp to the byte in all 39
dumped programs tried on jaxlib 0.10 and 0.12 (the conv net's split halves and joint forms
under several plans and barrier forms, JAX's programs beside them, Gemma 3's bf16 halves), 9
of them with a hole (up to 262,144 B, one activation of the conv net); the sizes-first heap
is the smaller in some, the live-ranges-first one in others (Gemma 3 bf16's backward: 738,400
and 720,768 B, its values at most 688,192 B at once). `python -m tools.benchmarks.xla_dump`
prints it beside each program's peak.

The estimate does not pack. Tried (2026-11-29): the same packing over the buffers
`estimate_memory(model="xla")` lays out left the conv net's objective=peak joint program
(jaxlib 0.12, the plan for 2.42 MB) without the 262,144 B hole XLA leaves there (its
buffers packed into 1,951,744 B, 1,933,312 B live at once), and over the 162 programs of
the xla benchmark on jaxlib 0.12 it moved 21 estimates, 19 of them away from XLA's
footprint (the conv net's joint under everything_saveable: +3.6% -> +5.1%): a hole
depends on details of XLA's live ranges the estimate does not have.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from tools.benchmarks.xla_liveness import _INSTR, _TEMP, _live_ranges, _one, liveness

ALIGNMENT = 64      # (bytes) what reproduces XLA:CPU's offsets
_VALUE_ID = re.compile(r"value: <(\d+) ([\w.\-]+)(?:\{([\d,]*)\})? @\d+> "
                       r"\(size=(\d+),offset=(\d+)\)")


def replay(directory: str, name: str | None = None) -> dict:
    """XLA's heap of one dumped module, packed again: {'module', 'temp' (XLA's),
    'sizes_first', 'ranges_first', 'replayed' (the smaller), 'live' (the most bytes live at
    once, `xla_liveness`)}; None where the dump has no temp allocation or no live ranges."""
    d = Path(directory)
    assignment = _one(d, name, "after_optimizations-buffer-assignment.txt")
    module = assignment.name.split("after_optimizations")[0]
    temp = _TEMP.search(assignment.read_text())
    _, ranges = _live_ranges(d, module)
    if temp is None or ranges is None:
        return None
    hlo = next(d.glob(f"{module}after_optimizations.txt")).read_text()
    operands = {m.group(1): set(re.findall(r"%([\w.\-]+)", m.group(2)))
                for m in _INSTR.finditer(hlo[hlo.index("\nENTRY"):])}
    values = []
    for vid, value, index, size, offset in _VALUE_ID.findall(temp.group(2)):
        if (value, index or "") in ranges:
            first, last = ranges[(value, index or "")]
            values.append(dict(id=int(vid), name=value, first=first, last=last,
                               size=int(size), offset=int(offset)))
    heaps = _allocations(values, operands)
    sizes_first = pack(heaps, _SIZES_FIRST)
    ranges_first = pack(heaps, _RANGES_FIRST)
    return {"module": module, "temp": int(temp.group(1)), "sizes_first": sizes_first,
            "ranges_first": ranges_first, "replayed": min(sizes_first, ranges_first),
            "live": liveness(directory, name)["peak"]}


def _allocations(values, operands) -> list[dict]:
    """The heap's allocations in event time: [{'id', 'size', 'spans': [(first, last)] (its
    own first)}], a value written in place of its operand joining the operand's."""
    ticks = max(v["last"] for v in values) + 1
    made = [[] for _ in range(ticks)]
    freed = [[] for _ in range(ticks)]
    for v in sorted(values, key=lambda v: (v["first"], v["last"], v["id"])):
        made[v["first"]].append(v)
        freed[v["last"]].append(v)
    now, interval, joined = 0, {}, {}    # value id -> [start, end]; -> its allocation's id
    for i in range(ticks):
        for v in made[i]:
            over = next((u for u in freed[i] if u is not v and u["offset"] == v["offset"]
                         and u["name"] in operands.get(v["name"], ())), None)
            if over is not None:         # freed, then shared
                interval[over["id"]][1] = now
                freed[i].remove(over)
                now += 1
            joined[v["id"]] = joined[over["id"]] if over is not None else v["id"]
            interval[v["id"]] = [now, -1]
            now += 1
        for v in freed[i]:
            interval[v["id"]][1] = now
            now += 1
    heaps: dict = {}
    for v in sorted(values, key=lambda v: interval[v["id"]][0]):
        h = heaps.setdefault(joined[v["id"]], {"id": joined[v["id"]], "size": v["size"],
                                               "spans": []})
        h["size"] = max(h["size"], v["size"])
        h["spans"].append(tuple(interval[v["id"]]))
    return list(heaps.values())


def _SIZES_FIRST(h):
    first, last = h["spans"][0]
    return (-h["size"], first - last, h["id"])


def _RANGES_FIRST(h):
    first = min(a for a, _ in h["spans"])
    last = max(b for _, b in h["spans"])
    return (first - last, -h["size"], h["id"])


def pack(heaps, order) -> int:
    """The heap size best-fit packing gives `heaps` taken in `order`."""
    placed, top = [], 0           # (start, end, offset, aligned end) per interval
    for h in sorted(heaps, key=order):
        used = sorted((o, e) for a, b, o, e in placed
                      if any(a <= last and first <= b for first, last in h["spans"]))
        gap, at = None, 0
        for offset, end in used:
            if offset - at >= h["size"] and (gap is None or offset - at < gap[1] - gap[0]):
                gap = (at, offset)
            at = max(at, end)
        offset = gap[0] if gap else at
        end = -(-(offset + h["size"]) // ALIGNMENT) * ALIGNMENT
        placed += [(first, last, offset, end) for first, last in h["spans"]]
        top = max(top, offset + h["size"])
    return top


def headline(r: dict) -> str:
    match = "XLA's" if r["replayed"] == r["temp"] else f"not XLA's {r['temp']:,} B"
    return (f"XLA's packing replayed: sizes first {r['sizes_first']:,} B, live ranges first "
            f"{r['ranges_first']:,} B ({match}; its values at most {r['live']:,} B at once)")


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return
    r = replay(argv[0], argv[1] if len(argv) > 1 else None)
    if r is None:
        raise SystemExit("error: the dump has no temp allocation or no live ranges "
                         "(*-live-range.txt) to replay")
    print(f"{r['module'].rstrip('._')}: {headline(r)}")


if __name__ == "__main__":
    main()
