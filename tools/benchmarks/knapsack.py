"""A baseline planner that judges each saved tensor on its own, as PyTorch's
`activation_memory_budget` does.

PyTorch's min-cut partitioner turns a memory budget into a 0/1 knapsack: every
tensor the backward could read has a size and a runtime (the estimated runtime of
the op that produces it), and the knapsack keeps the tensors that save the most
runtime within the budget; everything else is recomputed. The recompute of each
tensor is priced as if it were independent of the others, so a tensor whose
operands are recomputed too costs more than the knapsack thought, and the
recomputation can need inputs nobody counted.

`knapsack_solver` is that rule over our planning problem, for
`rp.policies.auto(budget, solver=knapsack_solver)`: the same budget, the same
cost model and the same rewrite as `auto`, only the decision differs. The
knapsack is solved exactly (SciPy's `milp`), as PyTorch's `ilp_knapsack` does.
"""
from __future__ import annotations

import numpy as np

from remat_passes.planner.model import Problem


def knapsack_solver(p: Problem, budget: int) -> np.ndarray:
    """The recompute set (bool per op node) of the independent knapsack."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    prod = p.value_producer
    has = prod >= 0
    candidate = p.needed & has
    candidate[has] &= p.recomputable[prod[has]]
    # what must be kept whatever the choice: needed values nothing can recompute
    room = budget - int(p.value_bytes[p.needed & ~candidate].sum())
    items = np.nonzero(candidate)[0]
    save = np.zeros(p.n_values, bool)
    if len(items) and room > 0:
        weight = p.value_bytes[items].astype(float)
        runtime = p.op_cost[prod[items]]
        res = milp(-runtime, integrality=np.ones(len(items)), bounds=Bounds(0, 1),
                   constraints=[LinearConstraint(weight[None, :], -np.inf, float(room))])
        if res.x is not None:
            save[items[np.round(res.x).astype(bool)]] = True
    recompute = p.recomputable.copy()
    recompute[prod[save]] = False
    return recompute
