"""What a plan says to the user: `PlanReport` (budget, minimum, cost, what is recomputed)."""
from __future__ import annotations

import dataclasses

from remat_passes.planner.model import Solution


@dataclasses.dataclass
class PlanReport:
    policy: str
    budget: int
    minimum: int
    no_remat: int
    solution: Solution
    exact: Solution | None
    device: str
    problem_size: tuple          # (ops, values)
    recompute_cost: dict         # op_id -> (op name, FLOPs, seconds) of recomputing it
    recomputed: list             # (value described as JAX would, FLOPs, seconds, where)
                                 # per op the plan recomputes (computed before any rewrite)
    argument_bytes: int = 0      # the function's arguments the plan keeps (not counted)
    unpriced: list = dataclasses.field(default_factory=list)
                                 # the targets of the custom calls it recomputes whose
                                 # cost it cannot know (flops.unpriced_target), one per op

    def cost_text(self, cost: float) -> str:
        """A modelled cost in its unit: seconds on a device, FLOPs on the `flops` profile."""
        return format_flop(cost) if self.device == "flops" else format_seconds(cost)

    def with_flops(self, flop_count: float, cost: float) -> str:
        """'2.05 kFLOP, 2.05 ns' (the FLOPs once on the `flops` profile)."""
        text = format_flop(flop_count)
        return text if self.device == "flops" else f"{text}, {format_seconds(cost)}"

    def summary(self) -> str:
        s = self.solution
        text = (f"{self.policy}: budget {self.budget} B of activations (minimum "
                f"{self.minimum} B, no remat {self.no_remat} B); plan keeps {s.device_bytes} B "
                f"of activations on the device (and {self.argument_bytes} B of arguments) and "
                f"recomputes {len(self.recomputed)} op(s), "
                f"{format_flop(sum(f for _, f, _, _ in self.recomputed))}"
                + ("; " if self.device == "flops" else
                   f" ({self.cost_text(s.cost)} on {self.device}); "))
        if s.method == "no-remat":
            text += "every residual fits: nothing to solve"
        else:
            text += (f"solved by {s.method} in {s.seconds:.3f} s over "
                     f"{self.problem_size[0]} ops and {self.problem_size[1]} values")
        if self.exact is not None and s.method != "exact":
            gap = (s.cost - self.exact.cost) / self.exact.cost * 100 if self.exact.cost else 0.0
            text += f" (exact optimum {self.cost_text(self.exact.cost)}: gap {gap:.2f}%)"
        return text


def format_flop(f: float) -> str:
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if f >= scale:
            return f"{f / scale:.3g} {unit}"
    return f"{f:.0f} FLOP"


def format_seconds(t: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if t >= scale:
            return f"{t / scale:.3g} {unit}"
    return f"{t * 1e12:.3g} ps"
