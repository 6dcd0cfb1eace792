"""Plans as cheap as the cheapest (planner/working_set.py) and auto's `ties`: by default
auto weighs them by their estimated peaks and plans with the lowest.

The case: the benchmark Equinox model (two identical blocks) at 536,689 B of activations.
The integer program recomputes one block's MLP up-projection; recomputing the other's
instead costs the same and keeps the same bytes, and its split form compiles smaller on
XLA:CPU (jaxlib 0.12: 3,117,428 B against 3,314,036 B)."""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from remat_testlib import assert_trees_close, leaves, reference_vjp, run_split

import remat_passes as rp
from remat_passes.api.sweeps import recompute_seconds
from remat_passes.core.residuals import activation_bytes
from remat_passes.ir.mlir import RematError
from remat_passes.passes.trial_plans import planning_problem
from remat_passes.planner import solvers, working_set

P = rp.policies
BUDGET = 536689


def equinox():
    from tools.benchmarks import models
    model = models.make_equinox()
    fun = model.build(models._identity)
    return model, fun, rp.export_vjp(fun, *model.args)


def test_an_equal_cost_plan_costs_what_the_cheapest_costs_and_fits():
    """Each direction's plan is another plan than the integer program's where there is
    one, within the budget, at its cost (to `SAME_COST` of the cheapest op), and lower
    in its own objective than the first plan (the bytes the recomputed ops write, weighted
    by their distance from the end of the forward pass it goes toward); a plan not proven
    optimal gets none; solved once per process."""
    _, _, m = equinox()
    p = planning_problem(m, "main", P.auto(0, ties="none"), round_exact=False)
    first = solvers.solve(p, BUDGET)[0]
    assert first.method == "exact"
    unit = p.op_cost[p.op_cost > 0].min()
    later = working_set.equal_cost_plan(p, BUDGET, first, "later")
    assert later is not None and not np.array_equal(later.recompute, first.recompute)
    assert later.device_bytes <= BUDGET
    assert later.cost <= first.cost + working_set.SAME_COST * unit
    # the bytes each op writes, weighted by its distance from the end it is toward (op
    # nodes are in program order): lower for that direction's plan than for the first
    written = np.zeros(p.n_ops)
    has = p.value_producer >= 0
    np.add.at(written, p.value_producer[has], p.value_bytes[has])
    position = (np.arange(p.n_ops) + 1.0) / p.n_ops
    toward = {"later": written * (1.0 + 1.0 / p.n_ops - position), "earlier": written * position}
    assert toward["later"] @ later.recompute < toward["later"] @ first.recompute
    earlier = working_set.equal_cost_plan(p, BUDGET, first, "earlier")
    if earlier is not None:
        assert earlier.cost <= first.cost + working_set.SAME_COST * unit
        assert earlier.device_bytes <= BUDGET
        assert toward["earlier"] @ earlier.recompute < toward["earlier"] @ first.recompute
    assert working_set.equal_cost_plan(p, BUDGET, first, "later") is later
    assert working_set.equal_cost_plan(
        p, BUDGET, dataclasses.replace(first, method="lagrangian"), "later") is None
    with pytest.raises(ValueError, match="toward must be later or earlier"):
        working_set.equal_cost_plan(p, BUDGET, first, "sideways")


def test_auto_keeps_the_equal_cost_plan_that_peaks_lowest():
    """The default (ties=peak) weighs the plans as cheap as the cheapest and keeps the
    one whose estimated peak is lowest: here another than the integer program's (a remark
    gives each one's estimated peak), and XLA agrees that it is smaller. It costs what the
    integer program's costs, keeps within the budget, is the plan ties=<that direction>
    makes, and its gradients are jax.vjp's."""
    from tools.benchmarks import common, xla_memory
    model, fun, m = equinox()
    out, ct, grads = reference_vjp(fun, model.args)

    def measured(policy):
        split, halves, _ = xla_memory.our_split(m, policy, model.args)
        got, _ = run_split(split, model.args, ct, 1)
        assert_trees_close(got, leaves(out) + leaves(grads))
        return split, common.xla_peak(halves)
    first, first_peak = measured(P.auto(BUDGET, ties="none"))
    assert not [r for r in first.remarks if "cost the same" in str(r)]
    chosen, peak = measured(P.auto(BUDGET))
    remarks = [str(r) for r in chosen.remarks if "plans cost the same" in str(r)]
    assert len(remarks) == 1, remarks
    weighed = dict(re.findall(r"(the integer program|later|earlier)'s (\d+) B", remarks[0]))
    kept = re.search(r"kept (later|earlier)'s$", remarks[0]).group(1)
    assert "the integer program" in weighed and len(weighed) >= 2, remarks
    assert int(weighed[kept]) == min(int(v) for v in weighed.values())
    assert int(weighed[kept]) < int(weighed["the integer program"])
    assert activation_bytes(chosen.residuals) <= BUDGET
    cost = recompute_seconds(m, P.auto(BUDGET), mode="split", round_exact=False)
    assert cost == pytest.approx(
        recompute_seconds(m, P.auto(BUDGET, ties="none"), mode="split", round_exact=False),
        rel=1e-6)
    assert peak < first_peak, (peak, first_peak)     # XLA agrees with the estimate
    forced = P.auto(BUDGET, ties=kept)
    assert rp.remat(m, forced, mode="split", round_exact=False).text() == \
        rp.remat(m, P.auto(BUDGET), mode="split", round_exact=False).text()


def test_ties_is_an_option_of_auto():
    assert P.auto("1MiB").ties == "peak" and "ties" not in P.auto("1MiB").spec
    assert P.auto("1MiB", ties="later").spec == "auto(budget=1048576, ties=later)"
    assert rp.policies.parse_policy("auto(1MiB, ties=earlier)").ties == "earlier"
    with pytest.raises(RematError, match="ties must be peak, later, earlier or none"):
        P.auto("1MiB", ties="sideways")
