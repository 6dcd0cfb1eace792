"""`--verify-diagnostics`, as in `mlir-opt`: the input says, in comments, which errors and
remarks the passes must produce where, and the run checks exactly that.

    // expected-remark @+1 {{kept whole}}
    func.func @main(...)

`expected-error` / `expected-remark` / `expected-warning`, on the line they are about or
pointing at it with `@+N`, `@-N`, `@above`, `@below`; the text between `{{` and `}}` must be
part of the diagnostic. A diagnostic nobody expected fails the run too. Remarks are
located where the pass says they are about (a function's own location), errors by the
`file:line:col` they carry.
"""
from __future__ import annotations

import dataclasses
import re

from remat_passes.ir import mlir

_EXPECTED = re.compile(r"//\s*expected-(error|remark|warning)\s*"
                       r"(?:@\s*(\+\d+|-\d+|above|below))?\s*\{\{(.*?)\}\}")
_LINE = re.compile(r":(\d+):\d+(?::|$)")


class Remark(str):
    """A remark of a pass: its text (it is the string), and `location`, the `ir.Location` of
    what it is about (None when it is about nothing in particular)."""

    location = None

    def __new__(cls, text: str, location=None):
        self = super().__new__(cls, text)
        self.location = location
        return self


@dataclasses.dataclass
class Diagnostic:
    kind: str          # "error", "remark" or "warning"
    line: int | None   # in the input; None: no location
    text: str


@dataclasses.dataclass
class Expected:
    kind: str
    line: int          # the line it is about
    text: str
    at: int            # the line the comment is on


def expectations(text: str) -> list[Expected]:
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in _EXPECTED.finditer(line):
            where = m.group(2)
            target = n if where is None else n - 1 if where == "above" else \
                n + 1 if where == "below" else n + int(where)
            out.append(Expected(m.group(1), target, m.group(3), n))
    return out


def of_remark(remark) -> Diagnostic:
    loc = getattr(remark, "location", None)
    line = None
    if loc is not None:
        m = _LINE.search(mlir.format_location(loc))
        line = int(m.group(1)) if m else None
    return Diagnostic("remark", line, str(remark))


def of_error(message: str) -> Diagnostic:
    first = message.splitlines()[0] if message else ""
    m = re.match(r"^.*?:(\d+):\d+: error: (.*)$", first)
    if m:
        return Diagnostic("error", int(m.group(1)), m.group(2))
    return Diagnostic("error", None, first.removeprefix("error: "))


def check(expected: list[Expected], produced: list[Diagnostic], filename: str) -> list[str]:
    """What does not match, as `file:line: error: ...` lines (none: the run is right)."""
    left = list(produced)
    problems = []
    for e in expected:
        hit = next((d for d in left if d.kind == e.kind and d.line == e.line
                    and e.text in d.text), None)
        if hit is None:
            problems.append(f"{filename}:{e.at}: error: expected {e.kind} \"{e.text}\" was not "
                            "produced")
        else:
            left.remove(hit)
    for d in left:
        where = f"{filename}:{d.line}" if d.line is not None else filename
        problems.append(f"{where}: error: unexpected {d.kind}: {d.text}")
    return problems
