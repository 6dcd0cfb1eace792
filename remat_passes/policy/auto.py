"""`auto(budget=...)` as a policy: its spec, its budget, and the plan it becomes.

`AutoPolicy` decides for a whole function, so the planner (`remat_passes.planner`)
resolves it before the engine asks it about an op: `planner.resolve` replaces it
by a `PlannedPolicy`, the solution's per-op verdicts, read like any other policy.
Budgets count activations: what the backward keeps beyond the function's own
arguments; they are bytes, '512MiB', '2GiB' or a percentage of the activations kept
without remat.
"""
from __future__ import annotations

import dataclasses
import math
import re

from remat_passes.cost.devices import PROFILES, DeviceProfile, default_device
from remat_passes.ir.mlir import RematError, op_id
from remat_passes.policy.base import Policy

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


@dataclasses.dataclass(frozen=True)
class Budget:
    """Bytes, or a fraction of the activations kept without remat."""
    nbytes: int | None = None
    fraction: float | None = None

    def resolve(self, no_remat_bytes: int) -> int:
        if self.nbytes is not None:
            return self.nbytes
        return int(self.fraction * no_remat_bytes)

    def __str__(self) -> str:
        if self.nbytes is not None:
            return f"{self.nbytes}"
        return f"{self.fraction * 100:g}%"


def parse_budget(value) -> Budget:
    """512MiB, 2GiB, 1e9, 50%, or an int (bytes)."""
    if isinstance(value, Budget):
        return value
    if isinstance(value, bool):
        raise ValueError(f"a budget is bytes or a percentage, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a budget cannot be negative, got {value}")
        return Budget(nbytes=value)
    if isinstance(value, float):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"a budget is a finite number of bytes, not negative, got {value!r}")
        return Budget(nbytes=int(value))
    text = str(value).strip()
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*%", text)
    if m:
        fraction = float(m.group(1)) / 100
        if not math.isfinite(fraction):
            raise ValueError(f"cannot read budget '{text}': more than a float holds")
        return Budget(fraction=fraction)
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read budget '{text}': expected bytes (an integer), bytes "
                         "with a unit (512MiB, 2GiB, 1.5GB) or a percentage (50%)")
    nbytes = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not math.isfinite(nbytes):
        raise ValueError(f"cannot read budget '{text}': more bytes than a float holds")
    return Budget(nbytes=int(nbytes))


class AutoPolicy(Policy):
    """`auto(budget=..., offload=None, device=None, objective='residuals', solver='auto',
    score='model', monotone=False, check=True, ties='peak')`.

    Not an op-by-op policy: remat-partial-eval replaces it by the solution of the
    planner before it decides anything (`resolve`). `score='xla'`: among the planner's
    solution and JAX's fixed policies that fit the budget, keep the plan XLA's compiled
    programs count the fewest FLOPs in (remat-partial-eval compiles each; see
    `planner.resolve.by_compiled_cost`); with objective=peak, the peak of each trial plan is
    XLA's footprint of its compiled joint program instead of the estimate. `monotone`: where the plan for the budget would
    peak above a larger budget's plan, keep another (`planner.resolve.monotone_peak`; it
    plans up to 14 trial budgets): `'larger'` (or True) that larger budget's plan, which
    keeps more than the budget and recomputes no more; `'smaller'` the cheapest plan of a
    smaller budget that peaks no higher, which keeps within the budget and recomputes
    more (where there is none, the plan for the budget stands). `check` (objective=peak,
    score=model): compile the plan the estimate chooses and hold it to the budget as XLA
    allocates it, where the pipeline has a compiler (`planner.resolve.for_peak`); False:
    the estimate's plan, nothing compiled. `ties`: plans can cost the same and hold
    different bytes at once in the backward; 'peak' (the default, with objective=residuals
    and score=model, monotone off) plans the cheapest plan and, among the plans that cost
    the same, those that recompute ops toward the end of the forward pass or toward its
    start (`planner.working_set`), and keeps the one that peaks lowest (`estimate_memory`'s
    xla model; the integer program's first on a tie); 'later' or 'earlier' keeps that one
    without weighing, 'none' the integer program's first."""

    def __init__(self, budget, offload=None, device=None, objective="residuals",
                 solver="auto", score="model", monotone=False, check=True, ties="peak"):
        self.budget = parse_budget(budget)
        if offload not in (None, "pinned_host", "unpinned_host"):
            raise ValueError(f"offload must be pinned_host or unpinned_host, got {offload!r}")
        if device is not None and device not in PROFILES:
            raise ValueError(f"unknown device {device!r}; known: {', '.join(PROFILES)}")
        if objective not in ("residuals", "peak"):
            raise ValueError(f"objective must be residuals or peak, got {objective!r}")
        if not callable(solver) and solver not in ("auto", "exact", "lagrangian"):
            raise ValueError(f"solver must be auto, exact, lagrangian or a function, "
                             f"got {solver!r}")
        if score not in ("model", "xla"):
            raise ValueError(f"score must be model or xla, got {score!r}")
        if score == "xla" and offload is not None:
            raise ValueError("score=xla compares what XLA compiles, whose counts leave out "
                             "transfers: it does not take offload")
        monotone = _monotone_rule(monotone)
        if monotone and (objective != "residuals" or score != "model"):
            raise ValueError(f"monotone={monotone} holds a plan's peak to those of larger "
                             "budgets' plans; objective=peak bounds the peak itself and "
                             "score=xla compares FLOP counts: it takes neither")
        check = _flag("check", check)
        if not check and (objective != "peak" or score != "model"):
            raise ValueError("check=false leaves objective=peak's plan as estimated, not "
                             "compiled: it goes with objective=peak (and score=model, which "
                             "is the default; score=xla compiles every plan)")
        ties = str(ties).strip().lower()
        if ties not in ("peak", "later", "earlier", "none"):
            raise ValueError(f"ties must be peak, later, earlier or none, got {ties!r}")
        self.offload, self.device, self.objective, self.solver = offload, device, objective, solver
        self.ties = ties
        self.score = score
        self.check = check
        self.monotone = monotone    # '' (off), 'larger' or 'smaller'
        parts = [f"budget={self.budget}"]
        if offload:
            parts.append(f"offload={offload}")
        if device:
            parts.append(f"device={device}")
        if objective != "residuals":
            parts.append(f"objective={objective}")
        if solver != "auto":
            parts.append(f"solver={getattr(solver, '__name__', solver)}")
        if score != "model":
            parts.append(f"score={score}")
        if self.monotone:
            parts.append(f"monotone={self.monotone}")
        if not check:
            parts.append("check=false")
        if ties != "peak":
            parts.append(f"ties={ties}")
        super().__init__(self._unresolved, f"auto({', '.join(parts)})")

    def _unresolved(self, op):
        raise RematError(f"error: {self.spec} decides for a whole function; it is resolved "
                         "by remat-partial-eval, not called op by op")

    @property
    def profile(self) -> DeviceProfile:
        return PROFILES[self.device or default_device()]


def _flag(name: str, value) -> bool:
    """A bool from a bool or as a spec writes it (true, false, on, off, 1, 0)."""
    text = str(value).strip().lower()
    if text in ("true", "1", "on", "yes"):
        return True
    if text in ("false", "0", "off", "no"):
        return False
    raise ValueError(f"{name} must be true or false, got {value!r}")


def _monotone_rule(value) -> str:
    """'' (off), 'larger' or 'smaller', from a bool or as a spec writes it (a flag, `_flag`,
    or larger, smaller); true is 'larger'."""
    text = str(value).strip().lower()
    if text in ("larger", "smaller"):
        return text
    if text in ("none", ""):
        return ""
    try:
        return "larger" if _flag("monotone", value) else ""
    except ValueError:
        raise ValueError(f"monotone must be true, false, larger or smaller, got {value!r}") \
            from None


def auto(budget, offload=None, device=None, objective="residuals", solver="auto",
         score="model", monotone=False, check=True, ties="peak"):
    """The memory-budget planner as a policy: see remat_passes.planner."""
    try:
        return AutoPolicy(budget, offload, device, objective, solver, score, monotone, check,
                          ties)
    except ValueError as e:
        raise RematError(f"error: {e}") from None


class PlannedPolicy(Policy):
    """The solution of the planner for one function: a verdict per op (by identity)."""

    def __init__(self, spec: str, verdicts: dict, fallback, report):
        self.verdicts = verdicts      # op_id -> verdict
        self.fallback = fallback      # for ops the planner did not decide
        self.report = report
        super().__init__(self._verdict, spec)

    def replaced(self, old: int, new) -> None:
        """Op `new` replaces the op whose id was `old`: it takes that op's verdict."""
        if old in self.verdicts:
            self.verdicts[op_id(new)] = self.verdicts[old]

    def _verdict(self, op):           # never called: see policy.scopes.policy_verdict
        raise AssertionError("PlannedPolicy is read by op identity")
