"""What every pass shares: `ModulePass` (a dataclass with typed options), `PipelinePass`,
option parsers, and `PassState` (the analyses and results one pipeline run shares).

A pass of ours is a dataclass subclass of `ModulePass` (as in xDSL): a
kebab-case `name`, a one-line `summary`, its options as typed fields made with
`option(...)`, and `apply(module_op, state)` that rewrites an `ir.Module` in
place. Options are written in pipeline syntax with the field name in
kebab-case (`region_regex` is `region-regex=...`); one generic parser
(`ModulePass.from_options`) reads them all. A `PipelinePass` is a named list of
passes (`expand`); the pipeline runner (`passes.manager`) expands it, so
verification and IR dumps happen after each of its steps.
"""
from __future__ import annotations

import dataclasses
import difflib
import re
import sys
import time
from typing import Any, Callable, ClassVar

from remat_passes.ir.mlir import RematError


class Progress:
    """A progress bar on standard error for work that takes long, shown once it has taken a
    second and only on a terminal (logs and tests see nothing); `total` None: a count with
    no end known. Also a context manager, which takes the bar down however the work ends.
    One bar shows at a time (a sweep's, not also those of the plans it makes)."""

    showing: ClassVar[bool] = False

    def __init__(self, total: int | None, what: str):
        self.done, self.shown = 0, False
        self.start = time.perf_counter()
        self.bar = None
        if sys.stderr.isatty():      # (made now, so its clock starts with the work)
            from rich import progress as rich_progress
            from rich.console import Console
            count = rich_progress.MofNCompleteColumn() if total is not None else \
                rich_progress.TextColumn("{task.completed}")
            self.bar = rich_progress.Progress(
                rich_progress.TextColumn("{task.description}"), rich_progress.BarColumn(),
                count, rich_progress.TimeElapsedColumn(), transient=True,
                console=Console(stderr=True))
            self.task = self.bar.add_task(what, total=total)

    def advance(self) -> None:
        if self.bar is not None:
            if not self.shown and not Progress.showing and \
                    time.perf_counter() - self.start > 1.0:
                self.bar.start()
                self.shown = Progress.showing = True
            self.bar.update(self.task, completed=self.done)
        self.done += 1

    def close(self) -> None:
        if self.shown:
            self.bar.stop()
            Progress.showing = False
        self.bar, self.shown = None, False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def parse_bool(text: str) -> bool:
    t = text.strip().lower()
    if t in ("true", "1", "yes", "on"):
        return True
    if t in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got '{text}'")


def parse_regex(text: str) -> re.Pattern:
    try:
        return re.compile(text)
    except re.error as e:
        raise ValueError(f"invalid regex '{text}': {e}") from None


def parse_int_list(text: str) -> list[int]:
    text = text.strip().strip("[]{}")
    if not text:
        return []
    try:
        return [int(t) for t in text.split(",")]
    except ValueError:
        raise ValueError(f"expected a comma-separated list of integers, got '{text}'") from None


_PARSERS = {bool: parse_bool, int: int, str: str, "bool": parse_bool, "int": int, "str": str}


def option(default, help: str, parse: Callable[[str], Any] | None = None):
    """A pass option: a dataclass field with its help text and text parser (by default
    from the field's type: str, int, bool)."""
    return dataclasses.field(default=default, metadata={"help": help, "parse": parse})


class PassState:
    """What the passes of one pipeline run share.

    * `analysis(func_op)`: the `FunctionAnalysis` of a function, built on first
      use and kept until a pass drops it (the runner drops every analysis after
      a pass that does not declare `preserves_analyses`); a pass that rewrote a
      function and knows what it made can `keep` the analysis of the result;
    * region policies of checkpoint regions made with Python callables;
    * `dim_symbols`: names of the symbolic argument dimensions (`symbolic.argument_dims`,
      read by the runner before the first pass, as `inline` erases them);
    * results: residuals per function (remat-partial-eval), the segment length auto chose
      for scans (`planned_segments`) and what segment-scans did (`segmented`), remarks,
      timings;
    * `loop_bodies`: function -> the functions outline-loop-backwards made of its loop
      bodies (the runner runs a later pass that names the function on each of them);
    * `compiled_cost`: what `auto(score=xla)` compiles its candidates with,
      `(module_op, functions) -> (XLA's FLOP count, backend name)` (rp.remat and remat-opt
      give `remat_passes.jax.run.compiled_cost`; a bare pipeline has none);
    * `compiled_memory`: what `auto(objective=peak, score=xla)` compiles its trial plans
      with, `programs -> ([XLA's footprint in bytes of each], backend name)`, `programs`
      an iterable of (module_op, function) that it takes as its compiles go, side by side
      (likewise);
    * `progress`: while `auto` plans trial budgets (objective=peak, score=xla, monotone),
      the `Progress` each trial plan advances.
    """

    def __init__(self, region_policies=None, filename=None):
        self.region_policies = dict(region_policies or {})
        self.filename = filename
        self.residuals: dict = {}
        self.remarks: list = []
        self.timings: list = []      # (pass name, seconds) per step run
        self.plan_reports: dict = {} # function -> [planner.PlanReport] of auto policies
        self.dim_symbols: dict | None = None
        self.planned_segments: dict = {}   # function -> segment-scans' k that auto chose
        self.segmented: dict = {}          # function -> [scan_segments.Segmented]
        self.compiled_cost = None
        self.compiled_memory = None
        self.loop_bodies: dict = {}        # function -> [its outlined loop bodies]
        self.progress: Progress | None = None
        self._analyses: dict = {}

    def analysis(self, func_op, cotangent_indices=None):
        from remat_passes.analysis.function import FunctionAnalysis
        from remat_passes.ir import graph
        from remat_passes.ir.mlir import op_id
        name = graph.func_name(func_op)
        cached = self._analyses.get(name)
        if cached is not None and cached[0] == op_id(func_op) and cotangent_indices is None:
            return cached[1]
        a = FunctionAnalysis(func_op, cotangent_indices)
        self._analyses[name] = (op_id(func_op), a)
        return a

    def keep(self, func_op, analysis) -> None:
        """Hand on an analysis a pass built of what it made (see materialize.analysis_after)."""
        from remat_passes.ir import graph
        from remat_passes.ir.mlir import op_id
        self._analyses[graph.func_name(func_op)] = (op_id(func_op), analysis)

    def fork(self) -> "PassState":
        """A copy for a clone of the module, to run the rest of a pipeline on: what the
        passes recorded so far, copied; no analyses (they describe the original's ops)."""
        other = PassState(self.region_policies, self.filename)
        other.residuals = {k: list(v) for k, v in self.residuals.items()}
        other.remarks, other.timings = list(self.remarks), list(self.timings)
        other.plan_reports = {k: list(v) for k, v in self.plan_reports.items()}
        other.dim_symbols = None if self.dim_symbols is None else dict(self.dim_symbols)
        other.planned_segments = dict(self.planned_segments)
        other.segmented = {k: list(v) for k, v in self.segmented.items()}
        other.compiled_cost = self.compiled_cost
        other.compiled_memory = self.compiled_memory
        other.loop_bodies = {k: list(v) for k, v in self.loop_bodies.items()}
        return other

    def targets(self, func: str) -> list[str]:
        """The functions a pass that names `func` runs on: its outlined loop bodies where
        outline-loop-backwards made some, else `func` itself."""
        return self.loop_bodies.get(func) or [func]

    def results_of(self, func: str, field: str = "residuals") -> list:
        """A per-function result (`residuals`, `plan_reports`, `segmented`) of `func`,
        over the functions it ran on (`targets`)."""
        table = getattr(self, field)
        return [r for t in self.targets(func) for r in table.get(t, [])]

    def drop(self, name: str | None = None) -> None:
        """Forget the analysis of function `name` (all of them by default)."""
        if name is None:
            self._analyses.clear()
        else:
            self._analyses.pop(name, None)


@dataclasses.dataclass
class ModulePass:
    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    # Does the pass keep every analysis it was given valid (by reporting its edits)?
    preserves_analyses: ClassVar[bool] = False

    @classmethod
    def option_fields(cls) -> list[dataclasses.Field]:
        return [f for f in dataclasses.fields(cls) if "help" in f.metadata]

    @classmethod
    def option_name(cls, f: dataclasses.Field) -> str:
        return f.name.replace("_", "-")

    @classmethod
    def from_options(cls, given: dict[str, str]) -> "ModulePass":
        """The pass with options read from pipeline text ({'policy': 'dots_saveable'})."""
        fields = {cls.option_name(f): f for f in cls.option_fields()}
        values = {}
        for key, text in given.items():
            if key not in fields:
                close = difflib.get_close_matches(key, fields, n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else \
                    (f"; options: {', '.join(fields)}" if fields else "; it takes no options")
                raise RematError(f"error: unknown option '{key}' for pass '{cls.name}'{hint}")
            f = fields[key]
            parse = f.metadata["parse"] or _PARSERS.get(f.type, str)
            try:
                values[f.name] = parse(text)
            except (ValueError, RematError) as e:
                msg = str(e).removeprefix("error: ")
                raise RematError(f"error: bad value for option '{key}' of pass "
                                 f"'{cls.name}': {msg}") from None
        return cls(**values)

    def spec(self) -> str:
        """The pass in pipeline syntax, with the options that differ from the defaults."""
        opts = []
        for f in self.option_fields():
            value = getattr(self, f.name)
            if value != f.default:
                opts.append(f"{self.option_name(f)}={_show(value)}")
        return self.name + ("{" + " ".join(opts) + "}" if opts else "")

    def apply(self, module_op, state: PassState) -> None:
        raise NotImplementedError


def _show(value) -> str:
    if hasattr(value, "spec"):
        return value.spec
    if hasattr(value, "pattern"):
        return value.pattern
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


class PipelinePass(ModulePass):
    """A named pipeline: running it runs `expand()`'s passes one by one."""

    def expand(self) -> list[ModulePass]:
        raise NotImplementedError

    def apply(self, module_op, state: PassState) -> None:
        for p in self.expand():
            p.apply(module_op, state)


# Core MLIR passes registered in jaxlib's bindings: name -> (MLIR class name, summary).
