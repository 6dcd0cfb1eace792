"""Other plans as cheap as the cheapest: which of them peaks lowest is left to the estimate.

The integer program's cost does not see when a recomputation runs, and its plan is one of
several that cost the same. A model of identical blocks has them in pairs: the benchmark
Equinox model at 536,689 B recomputes one block's MLP up-projection, f32[256,8,32] (34.52 us
on the `cpu` profile), and the same plan with the other block's costs the same, keeps the
same bytes and compiles to a split backward 6% smaller (XLA:CPU of jaxlib 0.12: 3,117,428 B
against 3,314,036 B). `equal_cost_plan(p, budget, first, toward)` solves a second integer
program over the same constraints, with the first program's optimum (to within
`SAME_COST`) as a bound on its cost, that recomputes the ops `toward` the end of the
forward pass ('later') or its start ('earlier') where it can: the bytes an op writes
weighted by its distance from that end. `auto(ties='peak')` (the default) weighs the
distinct plans by their estimated peaks (`passes.trial_plans`); `ties='later'` or
`'earlier'` plans with that one without weighing.

Like `solvers.solve`, it stops on work done (branch-and-bound nodes), not on a clock, and a
solution is kept for the process (`solvers.SOLVED`): the plan weighed is the plan planned.
"""
from __future__ import annotations

import time

import numpy as np

from remat_passes.planner import highs
from remat_passes.planner.model import Problem, Solution, evaluate
from remat_passes.planner.solvers import (AUTO_EXACT_NODES, AUTO_EXACT_SECONDS, AUTO_EXACT_WORK,
                                          SOLVED, SOLVED_MEMO, _drop_unneeded, _fingerprint,
                                          _memo_key, _Milp)
from remat_passes.planner.trials import kept

SAME_COST = 0.01    # in units of the cheapest op: what the other plan may cost over the
                    # first (the integer program's tie-breakers on saved bytes and moved ops
                    # add up to less than a thousandth of one)
LARGEST = 20000     # nodes of the largest problem weighed (as `solve`'s integer program)
TOWARD = ("later", "earlier")


def equal_cost_plan(p: Problem, budget: int, first: Solution, toward: str,
                    solver="auto") -> Solution | None:
    """A plan within `budget` that costs what `first` (`solve`'s plan, proven optimal)
    costs and recomputes ops `toward` one end of the forward pass; None where that is
    `first` itself, where `first` was not proven optimal (the Lagrangian solve, an integer
    program stopped early), where the plan offloads (its cost is the host link's) or where
    HiGHS did not finish within its nodes. Both directions are solved at once."""
    if toward not in TOWARD:
        raise ValueError(f"toward must be later or earlier, got {toward!r}")
    if callable(solver) or solver == "lagrangian" or first.method != "exact" \
            or p.offload_cost is not None or p.n_ops + p.n_values > LARGEST \
            or not first.recompute.any():
        return None
    key = ("equal cost",) + _memo_key(_fingerprint(p), budget, solver, 60.0, False)
    return kept(SOLVED, SOLVED_MEMO, key, lambda: _solve(p, budget, first))[toward]


def _solve(p: Problem, budget: int, first: Solution) -> dict:
    """{toward: its plan or None} (`equal_cost_plan`)."""
    import scipy.sparse as sp
    from scipy.optimize import Bounds, LinearConstraint
    start = time.perf_counter()
    none = dict.fromkeys(TOWARD)
    model = _Milp(p, budget)
    nodes = min(AUTO_EXACT_NODES, max(50, AUTO_EXACT_WORK // (p.n_ops + p.n_values)))
    out = model.solve(AUTO_EXACT_SECONDS, incumbent=True, nodes=nodes)
    if out is None or not model.proven or \
            not np.array_equal(_drop_unneeded(p, out[0]), first.recompute):
        return none        # (not the plan `solve` found: nothing to bound the cost by)
    written = np.zeros(p.n_ops)
    has = p.value_producer >= 0
    np.add.at(written, p.value_producer[has], p.value_bytes[has])
    written /= max(float(written.max()), 1.0)
    # (op nodes are in program order: the forward's first op is node 0)
    position = (np.arange(p.n_ops) + 1.0) / p.n_ops
    at_most = LinearConstraint(sp.csr_matrix(model.c.reshape(1, -1)), -np.inf,
                               model.objective + SAME_COST)
    found = {}
    for toward in TOWARD:
        weight = position if toward == "earlier" else 1.0 + 1.0 / p.n_ops - position
        objective = np.zeros(model.n)
        objective[:p.n_ops] = written * weight
        res = highs.milp(objective, integrality=model.integrality,
                         bounds=Bounds(np.zeros(model.n), model.upper),
                         constraints=model.constraints + [at_most],
                         options={"time_limit": AUTO_EXACT_SECONDS, "node_limit": nodes,
                                  "mip_rel_gap": 1e-4})
        # status 0: proven; 4: the node limit, with the best plan found (a clock's stop,
        # 1, is set aside: where it stops depends on the machine's load)
        if res.x is None or res.status not in (0, 4):
            found[toward] = None
            continue
        recompute = _drop_unneeded(p, np.round(res.x[:p.n_ops]).astype(bool))
        available, offloaded, device, cost = evaluate(p, recompute)
        found[toward] = None if np.array_equal(recompute, first.recompute) or \
            device > budget or cost > first.cost + SAME_COST * model.unit else \
            Solution(recompute, available, offloaded, device, cost,
                     f"exact, of equal cost, {toward}", time.perf_counter() - start, budget,
                     lower_bound=first.lower_bound)
    return found
