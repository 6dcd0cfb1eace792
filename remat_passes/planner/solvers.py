"""The solvers of the planning problem: exact (an integer program, SciPy's `milp`, HiGHS)
and lagrangian (minimum cuts, igraph's max-flow, over a bisection of the multiplier).

`solve(problem, budget, solver)` picks one (`solve_all`: several budgets, side by side, into
its memo); `minimum_bytes` is the least a plan can keep.

What `auto` returns does not depend on a clock: its searches stop on work done
(branch-and-bound nodes for HiGHS, windows for the neighbourhood search), and HiGHS is
deterministic for a given node limit, so the same module and budget give the same plan on a
loaded machine as on an idle one. The integer program also has a clock
(`AUTO_EXACT_SECONDS`, to keep planning fast where HiGHS's root work alone takes seconds):
when the clock stops it first, its plan is set aside and the Lagrangian one is used. Only a
search whose nodes are unexpectedly slow meets `SAFETY_SECONDS`. So that clock can still
give another plan under another load, a solution is kept for the process (`SOLVED`, by the
problem's content and the budget): objective=peak and monotone plan trial residual budgets
and then the one they chose again, and the plan they keep must be the plan they weighed
(measured, the benchmark GPT's budgets page refreshed while the test suite ran: the trial
of objective=peak at 16,832,175 B fitted, its plan made again peaked at 17,676,828 B).

The integer program's plan counts as proven ("exact") when HiGHS has shown that no plan
costs half the cheapest op's time less (`PROOF_GAP`, beside its relative gap of 1e-6). The
ops' costs are multiples of the cheapest one's but for a few (2,040 of the 2,041 costed ops
of the 10k-op transformer): where all are, plans differ in cost by whole multiples, so the
plan is the optimum; otherwise it costs at most half that op more. On that transformer at
3/4 of its budget range HiGHS found it in 1.7 s and took 34 s more to close the last 0.4.
"""
from __future__ import annotations

import collections
import hashlib
import math
import os
import time

import numpy as np

from remat_passes.planner import highs
from remat_passes.planner.model import Problem, Solution, evaluate
from remat_passes.planner.trials import kept

AUTO_EXACT_NODES = 400      # 'auto': branch-and-bound nodes the integer program may take
AUTO_EXACT_WORK = 1_000_000 # before the Lagrangian solve is tried too, at most this many
                            # nodes times the problem's size (about 1 s on a core)
AUTO_EXACT_SECONDS = 2.5    # and its clock: stopped by it, its plan is not used
PROOF_GAP = 0.5             # the integer program's plan is proven when no plan can cost
                            # this much less, in units of the cheapest op (where every cost
                            # is on that op's grid, as all but a few are, the optimum)
MOVE_TIE = 1e-6             # the integer program's tie-breaker toward moving ops: a
                            # fraction of what each would cost were it not moved
WINDOW_NODES = 200          # nodes per window of the neighbourhood search
LNS_WINDOWS = 12            # windows the neighbourhood search solves: one per 5,000 nodes
LNS_NODES_PER_WINDOW = 5000 # of the problem, at least 2, at most LNS_WINDOWS
SAFETY_SECONDS = 20.0       # a search still running after this long stops anyway
SOLVED: collections.OrderedDict = collections.OrderedDict()   # (problem, budget, ...) ->
SOLVED_MEMO = 128           # its solutions, for the process (the oldest go first; at
                            # 100k ops one holds about 0.3 MB)


def _mins(p: Problem, lam: float) -> np.ndarray:
    """What keeping each value costs at multiplier `lam`: its bytes, or moving it."""
    keep = lam * p.value_bytes
    if p.offload_cost is not None:
        keep = np.minimum(keep, p.offload_cost)
    return keep


class _CutGraph:
    """The closure graph of a Problem, built once; one minimum cut per multiplier.

    Node ids: ops 0..n_ops-1, values n_ops.., then source and sink, then one node per
    value a recomputation can read. Selected = source side of the cut: an op recomputed,
    a value available, a value read by a recomputation (it pays its rounding unless its
    producer is recomputed too). A read through an op that computes nothing passes on
    from the op's results whether or not the op is recomputed (a cut cannot say "and"):
    the cut may pay a rounding the plan does not make; `evaluate` counts exactly.)"""

    def __init__(self, p: Problem):
        import igraph
        self.p = p
        n_ops, n_values = p.n_ops, p.n_values
        self.source, self.sink = n_ops + n_values, n_ops + n_values + 1
        rec = np.nonzero(p.recomputable)[0]
        imp = []                                   # implications x => y (infinite)
        for o in rec:
            imp.extend((o, n_ops + u) for u in p.reads[o])
        prod = p.value_producer
        for v in np.nonzero(prod >= 0)[0]:
            if p.recomputable[prod[v]]:
                imp.append((prod[v], n_ops + v))   # a recomputed op's results are available
        src, snk = self.source, self.sink
        (readers, read), passed = p.round_reads()
        values = np.unique(np.concatenate(
            [read, np.array([x for _, v, w in passed for x in (v, w)], np.int64)]))
        node = dict(zip(values.tolist(), range(snk + 1, snk + 1 + len(values))))
        imp.extend((int(o), node[int(v)]) for o, v in zip(readers, read))
        imp.extend((node[w], node[v]) for _, v, w in passed)
        self.n_imp = len(imp)
        costly = values[p.keep_cost[values] > 0]
        self.rounding = ([(node[int(v)], int(prod[v]) if prod[v] >= 0 and p.recomputable[prod[v]]
                           else snk) for v in costly], p.keep_cost[costly])
        ends = imp + [(src, o) for o in rec] + [(o, snk) for o in rec] + \
            [(src, n_ops + v) for v in range(n_values)] + \
            [(n_ops + v, snk) for v in range(n_values)] + self.rounding[0]
        self.rec = rec
        self.n_nodes = snk + 1 + len(values)
        self.graph = igraph.Graph(n=self.n_nodes, edges=ends, directed=True)
        movable = 0.0 if p.offload_cost is None else \
            float(p.offload_cost[np.isfinite(p.offload_cost)].sum())
        self.big = (float(p.op_cost.sum()) + movable + float(p.keep_cost.sum())) * 4 + 1.0

    def solve(self, lam: float) -> np.ndarray:
        """Recompute set minimising cost + lam * bytes (offload where cheaper)."""
        p = self.p
        keep = _mins(p, lam)
        big = self.big + float(keep.sum()) * 4
        # op weight: its cost minus the keeping it spares for its results
        spared = np.zeros(p.n_ops)
        has = p.value_producer >= 0
        np.add.at(spared, p.value_producer[has], keep[has] * p.recomputable[p.value_producer[has]])
        w_op = p.op_cost[self.rec] - spared[self.rec]
        w_val = keep.copy()
        forced = p.needed
        cap = np.concatenate([
            np.full(self.n_imp, big),
            np.maximum(-w_op, 0.0), np.maximum(w_op, 0.0),
            np.where(forced, big, np.maximum(-w_val, 0.0)), np.maximum(w_val, 0.0),
            self.rounding[1]])
        cut = self.graph.mincut(self.source, self.sink, capacity=cap.tolist())
        side = np.zeros(self.n_nodes, bool)
        side[cut.partition[0]] = True
        if not side[self.source]:       # igraph puts the source in the first set
            side = ~side
        recompute = np.zeros(p.n_ops, bool)
        recompute[self.rec] = side[self.rec]
        return recompute


def solve_lagrangian(p: Problem, budget: int, iterations: int = 40) -> Solution:
    """Bisection on the multiplier; the cuts next to the budget are repaired into it (see
    below), and the cheapest plan is improved by large-neighbourhood search
    (`_neighbourhoods`)."""
    start = time.perf_counter()
    graph = _CutGraph(p)
    offload_ok = None if p.offload_cost is None else np.isfinite(p.offload_cost)
    seen: list = []

    def run(lam):
        rec = _drop_unneeded(p, graph.solve(lam))
        ok = None if offload_ok is None else (p.offload_cost <= lam * p.value_bytes)
        device = evaluate(p, rec, ok)[2]
        seen.append((rec, ok, device, lam))
        return device

    lo, hi = 0.0, None
    if run(0.0) > budget:
        total_cost = float(p.op_cost.sum()) + 1e-30
        positive = p.value_bytes[p.value_bytes > 0]
        hi = total_cost / (float(positive.min()) if len(positive) else 1.0) * 4
        if run(hi) <= budget:
            for _ in range(iterations):
                mid = math.sqrt(max(lo, hi * 1e-12) * hi)
                if run(mid) <= budget:
                    hi = mid
                else:
                    lo = mid
                if hi / max(lo, hi * 1e-12) < 1.0 + 1e-6:
                    break
    best = None

    def consider(rec, ok):
        nonlocal best
        rec = _spend_slack(p, rec, budget, ok)
        cost = evaluate(p, rec, ok)[3]
        if best is None or cost < best[2]:
            best = (rec, ok, cost)
    seen.sort(key=lambda t: t[3])       # by multiplier: less recomputation first
    # repair the cuts next to where the bytes cross the budget: the cheapest one within it
    # spends its slack; the one just over it is shrunk into it; and between the two, whole
    # chains are chosen by a small knapsack
    feasible = [t for t in seen if t[2] <= budget]
    over = [t for t in seen if t[2] > budget]
    if feasible:
        tight = max(feasible, key=lambda t: t[2])
        consider(tight[0], tight[1])
        if over:
            loose = min(over, key=lambda t: t[2])
            shrunk = _shrink_to_budget(p, loose[0], budget, loose[1])
            if shrunk is not None:
                consider(shrunk, loose[1])
            consider(_merge_components(p, tight[0], loose[0], budget, tight[1]), tight[1])
    if best is None:                    # the minimum is above the budget: caller reports
        rec, ok, _, _ = seen[-1]
        best = (rec, ok, evaluate(p, rec, ok)[3])
    else:
        rec, ok = _neighbourhoods(p, best[0], budget, best[1],
                                  time.perf_counter() + SAFETY_SECONDS)
        best = (rec, ok, evaluate(p, rec, ok)[3])
    avail, off, device, cost = evaluate(p, best[0], best[1])
    return Solution(best[0], avail, off, device, cost, "lagrangian",
                    time.perf_counter() - start, budget)


def _merge_components(p: Problem, rec: np.ndarray, fewer: np.ndarray, budget: int,
                      offload_ok) -> np.ndarray:
    """Between two neighbouring cuts, `fewer` (over the budget) inside `rec` (within it,
    recomputing more): the ops only `rec` recomputes fall into connected chains. Choose
    which chains to recompute on top of `fewer` -- a small 0/1 knapsack (the least cost
    that brings the bytes within the budget), solved exactly with HiGHS, each chain's
    bytes measured on its own -- then check the union, and fall back to `rec`."""
    from scipy.optimize import Bounds, LinearConstraint
    diff = rec & ~fewer
    nodes = [int(o) for o in np.nonzero(diff)[0]]
    if not nodes:
        return rec
    parent = {o: o for o in nodes}

    def find(o):
        while parent[o] != o:
            parent[o] = parent[parent[o]]
            o = parent[o]
        return o
    prod = p.value_producer
    for o in nodes:
        for u in p.reads[o]:
            q = int(prod[u])
            if q in parent:
                parent[find(o)] = find(q)
    groups: dict = {}
    for o in nodes:
        groups.setdefault(find(o), []).append(o)
    chains = list(groups.values())
    base = evaluate(p, fewer, offload_ok)
    need = base[2] - budget                   # bytes to free
    freed, cost = [], []
    for members in chains:
        trial = fewer.copy()
        trial[members] = True
        e = evaluate(p, trial, offload_ok)
        freed.append(base[2] - e[2])
        cost.append(e[3] - base[3])
    if len(chains) > 5000 or max(freed) <= 0:
        return rec
    res = highs.milp(np.array(cost) + 1e-30, integrality=np.ones(len(chains)),
               bounds=Bounds(0, 1),
               constraints=[LinearConstraint(np.array([freed], float), need, np.inf)],
               options={"node_limit": AUTO_EXACT_NODES, "time_limit": SAFETY_SECONDS})
    if res.x is None:
        return rec
    trial = fewer.copy()
    for take, members in zip(np.round(res.x), chains):
        if take:
            trial[members] = True
    trial = _drop_unneeded(p, trial)
    return trial if evaluate(p, trial, offload_ok)[2] <= budget else rec


def _shrink_to_budget(p: Problem, recompute: np.ndarray, budget: int, offload_ok,
                      frozen=frozenset()):
    """Greedy from a plan over the budget: recompute more (never the ops in `frozen`), best
    bytes freed per second of recomputation first, until it fits (None if it cannot)."""
    recompute = recompute.copy()
    demand = _demand(p, recompute)
    prod = p.value_producer
    results = _results_of(p)
    device = evaluate(p, recompute, offload_ok)[2]
    kept = lambda v: demand[v] > 0 and not (prod[v] >= 0 and recompute[prod[v]])  # noqa: E731

    def freed(o):
        gain = sum(int(p.value_bytes[v]) for v in results.get(o, ()) if kept(v))
        cost = sum(int(p.value_bytes[u]) for u in p.reads[o]
                   if demand[u] == 0 and not (prod[u] >= 0 and recompute[prod[u]]))
        return gain - cost
    candidates = [int(o) for o in np.nonzero(p.recomputable & ~recompute)[0]
                  if int(o) not in frozen]
    candidates.sort(key=lambda o: p.op_cost[o] / max(freed(o), 1e-9) if freed(o) > 0
                    else math.inf)
    for o in candidates:
        if device <= budget:
            break
        gain = freed(o)
        if gain <= 0 or not any(demand[v] for v in results.get(o, ())):
            continue
        recompute[o] = True
        demand[p.reads[o]] += 1
        device -= gain
    device = evaluate(p, recompute, offload_ok)[2]
    return recompute if device <= budget else None


def _results_of(p: Problem) -> dict:
    results: dict = {}
    for v in np.nonzero(p.value_producer >= 0)[0]:
        results.setdefault(int(p.value_producer[v]), []).append(int(v))
    return results


def _demand(p: Problem, recompute: np.ndarray) -> np.ndarray:
    return p.demand(recompute)


def _drop_unneeded(p: Problem, recompute: np.ndarray) -> np.ndarray:
    """Do not recompute ops none of whose results is demanded; repeated until none is left,
    so a chain that only fed such ops goes too (whole arrays per round)."""
    recompute = recompute.copy()
    prod = p.value_producer[p.has_producer]
    while True:
        demanded = np.zeros(p.n_ops, bool)
        demanded[prod[p.demand(recompute)[p.has_producer] > 0]] = True
        idle = recompute & ~demanded
        if not idle.any():
            return recompute
        recompute &= ~idle


def _spend_slack(p: Problem, recompute: np.ndarray, budget: int, offload_ok) -> np.ndarray:
    """Greedy repair: while the budget allows, stop recomputing the op that spares the most
    cost per byte it then needs saved."""
    recompute = recompute.copy()
    demand = _demand(p, recompute)
    prod = p.value_producer
    results: dict = {}
    for v in np.nonzero(prod >= 0)[0]:
        results.setdefault(int(prod[v]), []).append(int(v))
    _, _, device, _ = evaluate(p, recompute, offload_ok)
    slack = budget - device
    if slack <= 0:
        return recompute

    def extra_bytes(o):
        add = sum(int(p.value_bytes[v]) for v in results.get(o, ()) if demand[v] > 0)
        freed = 0
        for u in p.reads[o]:
            if demand[u] == 1 and not (prod[u] >= 0 and recompute[prod[u]]):
                freed += int(p.value_bytes[u])
        return add - freed

    candidates = [int(o) for o in np.nonzero(recompute)[0]]
    candidates.sort(key=lambda o: -p.op_cost[o] / max(extra_bytes(o), 1))
    for o in candidates:
        if not recompute[o] or p.op_cost[o] <= 0:
            continue
        need = extra_bytes(o)
        if need > slack:
            continue
        recompute[o] = False
        demand[p.reads[o]] -= 1
        slack -= need
    return _drop_unneeded(p, recompute)


class _Milp:
    """The integer program of a Problem (variables: recompute per op, saved and, with
    offload, offloaded per value, then rounded per value whose rounding a recomputation
    can cost), built once; solved whole or with most ops fixed."""

    def __init__(self, p: Problem, budget: int):
        self.proven = False     # did the last solve prove its plan optimal?
        import scipy.sparse as sp
        from scipy.optimize import LinearConstraint
        self.p = p
        n_ops, n_values = p.n_ops, p.n_values
        off = p.offload_cost is not None
        (readers, read), passed = p.round_reads()
        read_values = np.unique(np.concatenate(
            [read, np.array([x for _, v, w in passed for x in (v, w)], np.int64)]))
        round_values = read_values[p.keep_cost[read_values] > 0]
        self.s0, self.o0 = n_ops, n_ops + n_values
        self.t0 = n_ops + n_values * (2 if off else 1)
        self.r0 = self.t0 + len(read_values)
        self.n = self.r0 + len(round_values)
        # Costs in units of the cheapest positive one (HiGHS's gap tolerances are absolute
        # too: seconds of tiny ops would all look equal); saving a byte costs a tie-breaker
        # far below any op, so nothing is saved that does not need to be.
        positive = p.op_cost[p.op_cost > 0]
        self.unit = float(positive.min()) if len(positive) else 1.0
        eps = 1e-3 / max(float(p.value_bytes.sum()), 1.0)
        movable = np.isfinite(p.offload_cost) if off else None
        # Recomputing an op that moves into the backward costs nothing; among plans of
        # equal cost the program prefers those that move more (a tie-breaker far below
        # any op, of each one's cost were it not moved), which also keeps HiGHS from
        # wandering among them (the benchmark GPT at 2.6 MB, device=flops: 2.2 s -> 0.3 s)
        ops = p.op_cost - MOVE_TIE * p.moved_cost
        self.c = np.concatenate([ops / self.unit, eps * p.value_bytes] +
                                ([np.where(movable, p.offload_cost, 0.0) / self.unit]
                                 if off else []) +
                                [np.zeros(len(read_values)),
                                 p.keep_cost[round_values] / self.unit])
        rows, cols, data, lo = [], [], [], []

        def avail(row, v):
            rows.append(row), cols.append(self.s0 + v), data.append(1.0)
            if off:
                rows.append(row), cols.append(self.o0 + v), data.append(1.0)
            pr = p.value_producer[v]
            if pr >= 0 and p.recomputable[pr]:
                rows.append(row), cols.append(int(pr)), data.append(1.0)

        r = 0
        for v in np.nonzero(p.needed)[0]:
            avail(r, int(v))
            lo.append(1.0)
            r += 1
        for o in np.nonzero(p.recomputable)[0]:
            for u in p.reads[o]:
                avail(r, int(u))
                rows.append(r), cols.append(int(o)), data.append(-1.0)
                lo.append(0.0)
                r += 1
        # read_v >= a recomputed reader; read_v >= read_w + recomputed op looked through
        # (w one of its results) - 1; rounded_v >= read_v + kept_v - 1 (saved or offloaded)
        t = dict(zip(read_values.tolist(), range(self.t0, self.r0)))

        def row(terms, bound):
            nonlocal r
            for col, coef in terms:
                rows.append(r), cols.append(col), data.append(coef)
            lo.append(bound)
            r += 1
        for o, v in zip(readers.tolist(), read.tolist()):
            row([(t[v], 1.0), (o, -1.0)], 0.0)
        for o, v, w in passed:
            row([(t[v], 1.0), (t[w], -1.0), (o, -1.0)], -1.0)
        for v, col in zip(round_values.tolist(), range(self.r0, self.n)):
            row([(col, 1.0), (t[v], -1.0), (self.s0 + v, -1.0)] +
                ([(self.o0 + v, -1.0)] if off else []), -1.0)
        A = sp.csr_matrix((data, (rows, cols)), shape=(r, self.n))
        bytes_row = sp.csr_matrix((p.value_bytes.astype(float),
                                   (np.zeros(n_values, int), self.s0 + np.arange(n_values))),
                                  shape=(1, self.n))
        self.constraints = [LinearConstraint(A, np.array(lo), np.full(r, np.inf)),
                            LinearConstraint(bytes_row, -np.inf, float(budget))]
        self.upper = np.ones(self.n)
        self.upper[:n_ops][~p.recomputable] = 0.0
        if off:
            self.upper[self.o0:self.t0][~movable] = 0.0
        self.integrality = np.ones(self.n)
        self.integrality[self.t0:] = 0.0     # (0 or 1 at the optimum: bounded below only)

    def solve(self, time_limit: float, fixed: np.ndarray | None = None,
              values: np.ndarray | None = None, incumbent: bool = False,
              nodes: int | None = None):
        """The recompute set (and offload choice), or None; `fixed` (bool per op) pins
        those ops' recompute variables to `values`. `incumbent`: at the time limit or after
        `nodes` branch-and-bound nodes, the best plan found so far rather than None (then
        not proven optimal; `stopped` says by what)."""
        from scipy.optimize import Bounds
        lower, upper = np.zeros(self.n), self.upper.copy()
        if fixed is not None:
            n_ops = self.p.n_ops
            lower[:n_ops][fixed] = values[fixed]
            upper[:n_ops][fixed] = values[fixed]
        options = {"time_limit": time_limit, "mip_rel_gap": 1e-6, "mip_abs_gap": PROOF_GAP}
        if nodes is not None:
            options["node_limit"] = nodes
        res = highs.milp(self.c, integrality=self.integrality, bounds=Bounds(lower, upper),
                   constraints=self.constraints, options=options)
        # status 1: the time limit; 4: here, the node limit (SciPy has no code of its own)
        if res.x is None or not (res.status == 0 or incumbent and res.status in (1, 4)):
            return None
        self.proven = res.status == 0
        self.stopped = {0: None, 1: "time limit"}.get(res.status, "node limit")
        self.objective = float(res.fun)      # (working_set bounds a second program by it)
        x = np.round(res.x).astype(bool)
        offload_ok = x[self.o0:self.o0 + self.p.n_values] if self.p.offload_cost is not None \
            else None
        return x[:self.p.n_ops], offload_ok, (getattr(res, "mip_dual_bound", None) or 0.0)


def solve_exact(p: Problem, budget: int, time_limit: float = 60.0,
                incumbent: bool = False, nodes: int | None = None) -> Solution | None:
    """The integer program with HiGHS; None if it did not finish within `time_limit`
    seconds (and `nodes` branch-and-bound nodes, if given). `incumbent`: then the best
    plan it found, if any, its method "exact (time limit)" or "exact (node limit)"."""
    start = time.perf_counter()
    model = _Milp(p, budget)
    out = model.solve(max(time_limit - (time.perf_counter() - start), 1.0),
                      incumbent=incumbent, nodes=nodes)
    if out is None:
        return None
    rec, offload_ok, bound = out
    recompute = _drop_unneeded(p, rec)
    avail_, offl, device, cost = evaluate(p, recompute, offload_ok)
    return Solution(recompute, avail_, offl, device, cost,
                    "exact" if model.proven else f"exact ({model.stopped})",
                    time.perf_counter() - start, budget, lower_bound=bound * model.unit)


def _neighbourhoods(p: Problem, rec: np.ndarray, budget: int, offload_ok, deadline: float,
                    window: int = 1000):
    """Large-neighbourhood search: free the recompute decisions of a window of ops (in
    program order), keep every other one, solve that small integer program (up to
    `WINDOW_NODES` nodes); keep what costs less. Windows overlap by half and sweep the
    program, and sweep it again while a sweep gains, up to a number of windows in all that
    grows with the problem (`LNS_NODES_PER_WINDOW`; a problem of at most `window` ops is
    one window). `deadline` is only a safety net."""
    if p.n_ops < 2:
        return rec, offload_ok
    model = _Milp(p, budget)
    cost = evaluate(p, rec, offload_ok)[3]
    starts = [0]
    while starts[-1] + window < p.n_ops:
        starts.append(starts[-1] + window // 2)
    windows = min(LNS_WINDOWS, max(2, (p.n_ops + p.n_values) // LNS_NODES_PER_WINDOW))
    solved = 0
    while solved < windows:
        gained = False
        for start in starts[:windows - solved]:
            if time.perf_counter() >= deadline:
                return rec, offload_ok
            fixed = np.ones(p.n_ops, bool)
            fixed[start:start + window] = False
            out = model.solve(max(deadline - time.perf_counter(), 0.5), fixed,
                              rec.astype(float), incumbent=True, nodes=WINDOW_NODES)
            solved += 1
            if out is not None:
                trial = _drop_unneeded(p, out[0])
                ok = out[1] if out[1] is not None else offload_ok
                e = evaluate(p, trial, ok)
                if e[2] <= budget and e[3] < cost - 1e-18:
                    rec, offload_ok, cost, gained = trial, ok, e[3], True
        if not gained or len(starts) == 1:
            break
    return rec, offload_ok


def solve(p: Problem, budget: int, solver="auto", exact_limit: float = 60.0,
          compare_exact: bool = False) -> tuple[Solution, Solution | None]:
    """(the solution, the exact one if it was computed). `solver`: 'auto' (on problems of
    up to 20,000 nodes the integer program for `AUTO_EXACT_NODES` branch-and-bound nodes,
    fewer on a large problem, within `AUTO_EXACT_SECONDS`;
    if it has not proven its plan optimal by then, the Lagrangian solve too, and the
    cheaper of the two; beyond 20,000 nodes the Lagrangian solve), 'exact' (up to
    `exact_limit` seconds), 'lagrangian', or
    a function `(problem, budget) -> recompute` (bool per op node) for experiments and
    baselines."""
    if callable(solver):                 # (a function may keep state: solved each time)
        return _solve(p, budget, solver, exact_limit, compare_exact)
    return kept(SOLVED, SOLVED_MEMO,
                _memo_key(_fingerprint(p), budget, solver, exact_limit, compare_exact),
                lambda: _solve(p, budget, solver, exact_limit, compare_exact))


SIDE_BY_SIDE_MAX = 8        # solve_all's threads, at most (and no more than the cores)


def solve_all(p: Problem, budgets, solver="auto") -> None:
    """`solve(p, b, solver)` for each budget of `budgets` not solved yet, in threads on the
    cores this process may use (HiGHS runs without the GIL), into `solve`'s memo: the plans
    solved one by one (module docstring), for the trial plans of objective=peak and monotone
    (the benchmark Equinox's 11 trial budgets on 2 cores: 10.5 s -> 5.5 s)."""
    if callable(solver):
        return
    fingerprint = _fingerprint(p)
    key = {b: _memo_key(fingerprint, b, solver, 60.0, False) for b in dict.fromkeys(budgets)}
    todo = [b for b, k in key.items() if k not in SOLVED]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    workers = min(len(todo), cores or 1, SIDE_BY_SIDE_MAX)
    if workers < 2:
        return
    def one(b):
        try:
            return _solve(p, b, solver, 60.0, False)
        except Exception:    # (left to `solve` to raise where it would)
            return None
    from concurrent.futures import ThreadPoolExecutor
    with highs.quiet(), ThreadPoolExecutor(workers, "remat-passes-solve") as pool:
        highs.side_by_side = True
        try:
            solved = list(pool.map(one, todo))
        finally:
            highs.side_by_side = False
    for b, out in zip(todo, solved):
        if out is not None:
            kept(SOLVED, SOLVED_MEMO, key[b], lambda out=out: out)


def _memo_key(fingerprint: str, budget: int, solver, exact_limit: float, compare_exact: bool):
    """`solve`'s memo key: the problem (`_fingerprint`), the budget, what the solve reads."""
    return (fingerprint, budget, solver, exact_limit, compare_exact, AUTO_EXACT_NODES,
            AUTO_EXACT_WORK, AUTO_EXACT_SECONDS, WINDOW_NODES, LNS_WINDOWS, LNS_NODES_PER_WINDOW)


def _fingerprint(p: Problem) -> str:
    """The problem's content: equal for the same function planned again (a copy of the
    module, another pass run), whatever the objects."""
    h = hashlib.sha256()
    for a in (p.op_cost, p.value_bytes, p.value_producer, p.recomputable, p.needed,
              p.read_rows, p.read_flat, p.keep_cost, p.markers, p.through,
              p.offload_cost, p.argument_bytes, p.moved_cost):
        h.update(b"-" if a is None else np.ascontiguousarray(a).tobytes())
    h.update(repr(p.labels).encode())
    return h.hexdigest()


def _solve(p: Problem, budget: int, solver, exact_limit: float,
           compare_exact: bool) -> tuple[Solution, Solution | None]:
    exact = None
    nothing = np.zeros(p.n_ops, bool)
    avail, off, device, cost = evaluate(p, nothing)
    if device <= budget:   # everything fits: recompute nothing
        return Solution(nothing, avail, off, device, cost, "no-remat", 0.0, budget), None
    markers = _drop_unneeded(p, p.recomputable & p.markers)
    avail, off, device, cost = evaluate(p, markers)
    if device <= budget:   # recomputing checkpoint-name markers
        return Solution(markers, avail, off, device, cost, "no-remat", 0.0, budget), None
    if callable(solver):
        start = time.perf_counter()
        recompute = _drop_unneeded(p, np.asarray(solver(p, budget), bool) & p.recomputable)
        avail, off, device, cost = evaluate(p, recompute)
        return Solution(recompute, avail, off, device, cost,
                        getattr(solver, "__name__", "custom"), time.perf_counter() - start,
                        budget), None
    if solver == "auto" and p.n_ops + p.n_values <= 20000 and not compare_exact:
        nodes = min(AUTO_EXACT_NODES, max(50, AUTO_EXACT_WORK // (p.n_ops + p.n_values)))
        found = solve_exact(p, budget, min(exact_limit, AUTO_EXACT_SECONDS), incumbent=True,
                            nodes=nodes)
        if found is not None and found.method == "exact (time limit)":
            found = None        # where the clock stopped it depends on the machine's load
        if found is not None and found.method == "exact":
            return found, found
        sol = solve_lagrangian(p, budget)
        if found is not None and found.cost < sol.cost and found.device_bytes <= budget:
            return found, None
        return sol, None
    if solver == "exact" or (solver == "auto" and p.n_ops + p.n_values <= 20000):
        exact = solve_exact(p, budget, exact_limit)
        if exact is not None and solver != "lagrangian" and not compare_exact:
            return exact, exact
    sol = solve_lagrangian(p, budget)
    if compare_exact and exact is None:
        exact = solve_exact(p, budget, exact_limit)
    if exact is not None and exact.cost < sol.cost and exact.device_bytes <= budget:
        return (exact if solver != "lagrangian" else sol), exact
    return sol, exact


def minimum_bytes(p: Problem) -> int:
    """The fewest device bytes any plan keeps: one minimum cut with the bytes alone as
    weights (recomputing everything is not always it: a recomputation may need arguments
    that the backward does not read otherwise)."""
    if p.n_ops == 0:
        return evaluate(p, np.zeros(0, bool))[2]
    positive = p.value_bytes[p.value_bytes > 0]
    smallest = float(positive.min()) if len(positive) else 1.0
    lam = (float(p.op_cost.sum()) + 1.0) / smallest * 1e6
    rec = _drop_unneeded(p, _CutGraph(p).solve(lam))
    ok = None if p.offload_cost is None else np.isfinite(p.offload_cost)
    return evaluate(p, rec, ok)[2]
