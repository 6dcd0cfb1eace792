"""auto(budget=...): the cheapest recomputation whose residuals fit a memory budget.

Per forward value the backward needs, the planner chooses: save it (device
memory, counted against the budget), recompute it just in time (once, shared
by its backward users, as the engine does), or, with `offload=`, move it to
host memory. Recomputing an op needs every value it reads to be available
in the backward too (saved, recomputed, an argument or a free constant);
side-effecting ops, random numbers without explicit state, results of ops
kept whole (scan loops: decided per iteration inside) and ops in checkpoint
regions with their own policies are never recomputed by it.

The model, per op p and value v (`Problem`):

* r_p = 1: p is recomputed, at cost c_p (a roofline of its FLOPs and bytes
  on the device profile, `DeviceProfile.op_seconds`); c_p = 0 where only the
  backward reads p's results (a cosine for a sine's derivative): the forward
  computed p only to keep it, so recomputed it moves into the backward, its
  forward copy erased, and costs no more than without remat;
* a_v = 1: v is available in the backward; if p = producer(v) is not
  recomputed, v is saved (b_v bytes on the device) or offloaded (2 b_v over
  the host link);
* a_v = 1 for every value a backward op reads; r_p => a_u for every u that p
  reads; r_p => a_v for p's own results.

Minimise sum c_p r_p + offload costs subject to saved bytes <= budget. Inside
a scan loop pair the same model is built on the forward body, per iteration,
with bytes and costs times the trip count (stacked values are the saved ones).
The ops in a `lax.cond`'s branches are a chain of op nodes, each a step that
recomputes more of them (`case_model`).

Two solvers:

* `exact`: the integer program, SciPy's `milp` (HiGHS);
* `lagrangian`: for a multiplier lambda (seconds per byte), minimise
  cost + lambda * bytes. With the budget moved into the objective every
  constraint is an implication x => y, so the problem is a minimum-weight
  closure, i.e. one minimum s-t cut (igraph's max-flow); lambda is
  searched by bisection for the cheapest cut within the budget, and the
  budget left over is then spent greedily on saving the most expensive
  recomputed ops whose inputs stay available.

`resolve(policies, analysis, ...)` turns every `auto` policy into a
`PlannedPolicy`: the per-op verdicts of the solution, read by the engine
exactly like any other policy.

Modules: `model` (the problem and `build_problem` from an analysis; `scope_model`,
how the ops under another policy, a checkpoint region's own, enter it; `case_model`,
how a cond does), `solvers` (`highs`: SciPy's `milp`, quiet),
`resolve` (the auto policies in force to plans), `report` (what a plan says). The
planner reads an analysis and never runs a pass: what needs whole pipelines (the
peak objective's trials, `bounds`, `pareto`) drives it from above.
"""
