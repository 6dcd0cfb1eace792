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
  on the device profile, `DeviceProfile.op_seconds`);
* a_v = 1: v is available in the backward; if p = producer(v) is not
  recomputed, v is saved (b_v bytes on the device) or offloaded (2 b_v over
  the host link);
* a_v = 1 for every value a backward op reads; r_p => a_u for every u that p
  reads; r_p => a_v for p's own results.

Minimise sum c_p r_p + offload costs subject to saved bytes <= budget. Inside
a scan loop pair the same model is built on the forward body, per iteration,
with bytes and costs times the trip count (stacked values are the saved ones).

Two solvers:

* `exact`: the integer program, SciPy's `milp` (HiGHS);
* `lagrangian`: for a multiplier lambda (seconds per byte), minimise
  cost + lambda * bytes. With the budget moved into the objective every
  constraint is an implication x => y, so the problem is a minimum-weight
  closure, i.e. one minimum s-t cut (SciPy's `maximum_flow`); lambda is
  searched by bisection for the cheapest cut within the budget, and the
  budget left over is then spent greedily on saving the most expensive
  recomputed ops whose inputs stay available.

`resolve(policies, analysis, ...)` turns every `auto` policy into a
`PlannedPolicy`: the per-op verdicts of the solution, read by the engine
exactly like any other policy.
"""
from __future__ import annotations

import dataclasses
import math
import re
import time

import numpy as np

from remat_passes import contract, flops, graph, scan_pairs
from remat_passes.mlir import RematError, ir, op_id
from remat_passes.policies import Offloadable, Policy, Recompute, Saveable, everything_saveable

_SAVE = everything_saveable   # for the ops a plan leaves undecided (free ones, say)
ROUNDING = "stablehlo.reduce_precision"   # what insert-reduce-precision inserts

# ------------------------------------------------------------ device costs --
_DOT_OPS = ("stablehlo.dot_general", "stablehlo.dot", "stablehlo.convolution")
_FUSIBLE = {"stablehlo." + n for n in flops.ELEMENTWISE} | {
    "stablehlo.reshape", "stablehlo.broadcast_in_dim", "stablehlo.transpose",
    "stablehlo.convert", "stablehlo.slice", "stablehlo.concatenate", "stablehlo.iota",
    "stablehlo.constant", "stablehlo.custom_call", "stablehlo.optimization_barrier",
    "stablehlo.bitcast_convert", "stablehlo.pad", "stablehlo.reverse", "stablehlo.reduce",
    "stablehlo.select", "stablehlo.clamp", "stablehlo.dynamic_slice",
    "stablehlo.dynamic_update_slice"}


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """Published peak figures of a device, for a roofline cost of recomputation."""
    name: str
    matrix_flops: float      # FLOP/s of dots and convolutions (f32 unless bf16/f16 given)
    vector_flops: float      # FLOP/s of elementwise arithmetic
    memory_bandwidth: float  # bytes/s of device memory
    host_bandwidth: float    # bytes/s of the link to host memory (one way)
    low_precision_speedup: float = 1.0   # matrix FLOP/s of bf16/f16 over f32
    source: str = ""

    def op_seconds(self, op, cost_model) -> float:
        """Time to recompute `op`: dots, convolutions and other ops that materialize their
        result are max(FLOPs / peak, bytes / bandwidth); elementwise arithmetic, reductions
        and data movement, which XLA fuses with their producers and consumers, cost their
        FLOPs only."""
        name = op.name
        f = cost_model.op_flops(op)
        if name in _DOT_OPS:
            peak = self.matrix_flops
            try:
                elem = str(op.results[0].type.element_type)
            except AttributeError:
                elem = ""
            if elem in ("bf16", "f16"):
                peak *= self.low_precision_speedup
            return max(f / peak, flops.op_bytes(op) / self.memory_bandwidth)
        if name in _FUSIBLE:
            return f / self.vector_flops
        return max(f / self.vector_flops, flops.op_bytes(op) / self.memory_bandwidth)

    def rounding_seconds(self, elements: int) -> float:
        """A reduce_precision over `elements` (fused: one FLOP each, as XLA counts it)."""
        return elements / self.vector_flops

    def offload_seconds(self, nbytes: int) -> float:
        """To host after the forward and back before the backward."""
        return 2.0 * nbytes / self.host_bandwidth


PROFILES = {
    "cpu": DeviceProfile(
        "cpu", matrix_flops=1.0e12, vector_flops=1.0e12, memory_bandwidth=1.0e11,
        host_bandwidth=1.0e11,
        source="a server CPU: ~1 TFLOP/s f32 with AVX-512 FMA on all cores, ~100 GB/s DRAM; "
               "host memory is the same DRAM"),
    "h100": DeviceProfile(
        "h100", matrix_flops=494.7e12, vector_flops=66.9e12, memory_bandwidth=3.35e12,
        host_bandwidth=64e9, low_precision_speedup=2.0,
        source="NVIDIA H100 SXM5 datasheet: 494.7 TFLOP/s TF32 / 989.4 BF16 tensor (dense), "
               "66.9 TFLOP/s FP32, 3.35 TB/s HBM3; PCIe Gen5 x16 64 GB/s to host"),
    "tpu-v5e": DeviceProfile(
        "tpu-v5e", matrix_flops=197e12, vector_flops=197e12 / 16, memory_bandwidth=819e9,
        host_bandwidth=32e9,
        source="Google Cloud TPU v5e: 197 TFLOP/s BF16, 819 GB/s HBM2e; host link taken as "
               "PCIe Gen4 x16, 32 GB/s (not published per chip)"),
    # No device: the cost is the FLOP count itself, as XLA's cost analysis counts it (one
    # 'second' per FLOP, memory traffic free); an offloaded byte costs one FLOP each way.
    "flops": DeviceProfile(
        "flops", matrix_flops=1.0, vector_flops=1.0, memory_bandwidth=math.inf,
        host_bandwidth=1.0,
        source="no device: recomputation costs its FLOP count (XLA's counting rules), "
               "memory traffic is free, offloading costs one FLOP per byte each way"),
}


def default_device() -> str:
    """The profile of the JAX backend in use (cpu, gpu -> h100, tpu -> tpu-v5e)."""
    try:
        import jax
        backend = jax.default_backend()
    except Exception:   # no JAX backend: the CPU figures
        return "cpu"
    return {"gpu": "h100", "cuda": "h100", "rocm": "h100", "tpu": "tpu-v5e"}.get(backend, "cpu")


# ----------------------------------------------------------------- budgets --
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


@dataclasses.dataclass(frozen=True)
class Budget:
    """Bytes, or a fraction of the residual bytes without remat."""
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
        return Budget(nbytes=int(value))
    text = str(value).strip()
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*%", text)
    if m:
        fraction = float(m.group(1)) / 100
        if fraction < 0:
            raise ValueError(f"a budget cannot be negative, got {text}")
        return Budget(fraction=fraction)
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read budget '{text}': expected bytes (an integer), bytes "
                         "with a unit (512MiB, 2GiB, 1.5GB) or a percentage (50%)")
    return Budget(nbytes=int(float(m.group(1)) * _UNITS[m.group(2).lower()]))


# ------------------------------------------------------------------ policy --
class AutoPolicy(Policy):
    """`auto(budget=..., offload=None, device=None, objective='residuals', solver='auto')`.

    Not an op-by-op policy: remat-partial-eval replaces it by the solution of the
    planner before it decides anything (`resolve`)."""

    def __init__(self, budget, offload=None, device=None, objective="residuals",
                 solver="auto"):
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
        self.offload, self.device, self.objective, self.solver = offload, device, objective, solver
        parts = [f"budget={self.budget}"]
        if offload:
            parts.append(f"offload={offload}")
        if device:
            parts.append(f"device={device}")
        if objective != "residuals":
            parts.append(f"objective={objective}")
        if solver != "auto":
            parts.append(f"solver={getattr(solver, '__name__', solver)}")
        super().__init__(self._unresolved, f"auto({', '.join(parts)})")

    def _unresolved(self, op):
        raise RematError(f"error: {self.spec} decides for a whole function; it is resolved "
                         "by remat-partial-eval, not called op by op")

    @property
    def profile(self) -> DeviceProfile:
        return PROFILES[self.device or default_device()]


def auto(budget, offload=None, device=None, objective="residuals", solver="auto"):
    """The memory-budget planner as a policy: see remat_passes.planner."""
    try:
        return AutoPolicy(budget, offload, device, objective, solver)
    except ValueError as e:
        raise RematError(f"error: {e}") from None


class PlannedPolicy(Policy):
    """The solution of the planner for one function: a verdict per op (by identity)."""

    def __init__(self, spec: str, verdicts: dict, fallback, report: "PlanReport"):
        self.verdicts = verdicts      # op_id -> verdict
        self.fallback = fallback      # for ops the planner did not decide
        self.report = report
        super().__init__(self._verdict, spec)

    def _verdict(self, op):           # never called: see verdict_for_op
        raise AssertionError("PlannedPolicy is read by op identity")

    def verdict_for_op(self, op, op_info_verdict):
        v = self.verdicts.get(op_id(op))
        return v if v is not None else op_info_verdict(self.fallback)


# ------------------------------------------------------------------- model --
@dataclasses.dataclass
class Problem:
    """The planning problem over integer node ids.

    Op nodes (recompute variables) and value nodes (availability variables) share one
    id space: ops first. `edges`: implication (x, y): x selected => y selected."""
    op_cost: np.ndarray           # seconds per op node (times trip count in loop bodies)
    value_bytes: np.ndarray       # bytes per value node (times trip count in loop bodies)
    value_producer: np.ndarray    # op node of the value, or -1 (an argument: never recomputed)
    recomputable: np.ndarray      # bool per op node
    needed: np.ndarray            # bool per value node: a backward op reads it
    reads: list                   # per op node, the value nodes it reads
    offload_cost: np.ndarray | None   # seconds per value node (inf: cannot move), or None
                                      # (no offload)
    ops: list                     # per op node, the ir.Operation
    values: list                  # per value node, the ir.Value
    labels: list                  # per op node: "top" or the scan loop it is in
    keep_cost: np.ndarray | None = None   # seconds per value node when it is kept (saved or
                                          # offloaded) and a recomputation reads it: the
                                          # reduce_precision insert-reduce-precision puts
                                          # on such a floating-point value the forward
                                          # reads too
    markers: np.ndarray | None = None     # bool per op node: a checkpoint-name marker
    through: np.ndarray | None = None     # bool per op node: a recomputed copy computes
                                          # nothing (a marker, data movement), so
                                          # insert-reduce-precision looks through it

    @property
    def n_ops(self) -> int:
        return len(self.op_cost)

    @property
    def n_values(self) -> int:
        return len(self.value_bytes)

    def __post_init__(self):
        if self.keep_cost is None:
            self.keep_cost = np.zeros(self.n_values)
        if self.markers is None:
            self.markers = np.zeros(self.n_ops, bool)
        if self.through is None:
            self.through = self.markers.copy()
        lengths = np.array([len(r) for r in self.reads], dtype=np.int64)
        self.read_rows = np.repeat(np.arange(self.n_ops), lengths)   # op node per read
        self.read_flat = np.concatenate(self.reads) if self.reads else np.zeros(0, np.int64)
        self.has_producer = self.value_producer >= 0

    def demand(self, recompute: np.ndarray) -> np.ndarray:
        """Per value: how many reasons it has to be available (needed, recomputed readers)."""
        return self.needed.astype(np.int64) + np.bincount(
            self.read_flat[recompute[self.read_rows]], minlength=self.n_values)

    def rounded(self, recompute: np.ndarray, kept: np.ndarray) -> np.ndarray:
        """Per value: kept, and read by a recomputation (directly, or through recomputed
        ops that compute nothing): what insert-reduce-precision rounds."""
        def read_by(ops):
            return np.bincount(self.read_flat[ops[self.read_rows]],
                               minlength=self.n_values) > 0
        reached = read_by(recompute & ~self.through)
        through = recompute & self.through
        while True:
            via = np.zeros(self.n_ops, bool)
            via[self.value_producer[reached & self.has_producer]] = True
            more = reached | read_by(via & through)
            if (more == reached).all():
                return kept & reached
            reached = more

    def round_reads(self) -> tuple:
        """The reads that can make a value rounded: (op node, value node) of the reads of
        recomputable ops that compute something, and (op node, value node, result value
        node) of those of recomputable ops looked through, whose result passes it on."""
        ops, values = self.read_rows, self.read_flat
        on = self.recomputable[ops]
        direct = on & ~self.through[ops]
        via = on & self.through[ops]
        results = [[] for _ in range(self.n_ops)]
        for v in np.nonzero(self.has_producer)[0]:
            results[self.value_producer[v]].append(int(v))
        passed = [(int(o), int(v), w) for o, v in zip(ops[via], values[via])
                  for w in results[o]]
        return (ops[direct], values[direct]), passed

    def recomputed_values(self, recompute: np.ndarray) -> np.ndarray:
        out = np.zeros(self.n_values, bool)
        out[self.has_producer] = recompute[self.value_producer[self.has_producer]]
        return out


@dataclasses.dataclass
class Solution:
    recompute: np.ndarray         # bool per op node
    available: np.ndarray         # bool per value node
    offloaded: np.ndarray         # bool per value node
    device_bytes: int
    cost: float
    method: str
    seconds: float
    budget: int
    lower_bound: float | None = None

    def saved(self, p: Problem) -> np.ndarray:
        prod = p.value_producer
        rec = np.zeros(p.n_values, bool)
        has = prod >= 0
        rec[has] = self.recompute[prod[has]]
        return self.available & ~rec & ~self.offloaded


def evaluate(p: Problem, recompute: np.ndarray, offload_ok=None) -> tuple:
    """(available, offloaded, device bytes, cost) of recomputing exactly `recompute`: what
    must be available follows from it; values available but not recomputed are saved, or
    offloaded where `offload_ok` says moving them is cheaper."""
    available = p.demand(recompute) > 0
    rec_v = p.recomputed_values(recompute)
    kept = available & ~rec_v
    offloaded = kept & offload_ok & np.isfinite(p.offload_cost) if offload_ok is not None \
        else np.zeros(p.n_values, bool)
    device = int(p.value_bytes[kept & ~offloaded].sum())
    cost = float(p.op_cost[recompute].sum())
    cost += float(p.keep_cost[p.rounded(recompute, kept)].sum())
    if p.offload_cost is not None:
        cost += float(p.offload_cost[offloaded].sum())
    return available, offloaded, device, cost


def feasible(p: Problem, recompute: np.ndarray) -> bool:
    """Every read of a recomputed op is available: an argument, saved, or recomputed."""
    return bool(recompute[~p.recomputable].sum() == 0)


# ----------------------------------------------------------------- solvers --
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


def solve_lagrangian(p: Problem, budget: int, iterations: int = 40,
                     improve_seconds: float | None = None) -> Solution:
    """Bisection on the multiplier; the cuts next to the budget are repaired into it (see
    below), and the cheapest plan is improved by large-neighbourhood search for
    `improve_seconds` (default: 0.2 ms per node of the problem, from 1 s to 10 s)."""
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
        improve = improve_seconds if improve_seconds is not None else \
            max(1.0, min(10.0, 2e-4 * (p.n_ops + p.n_values)))
        rec, ok = _neighbourhoods(p, best[0], budget, best[1], time.perf_counter() + improve)
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
    from scipy.optimize import Bounds, LinearConstraint, milp
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
    res = milp(np.array(cost) + 1e-30, integrality=np.ones(len(chains)),
               bounds=Bounds(0, 1),
               constraints=[LinearConstraint(np.array([freed], float), need, np.inf)],
               options={"time_limit": 5.0})
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
        self.c = np.concatenate([p.op_cost / self.unit, eps * p.value_bytes] +
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
              values: np.ndarray | None = None):
        """The recompute set (and offload choice), or None; `fixed` (bool per op) pins
        those ops' recompute variables to `values`."""
        from scipy.optimize import Bounds, milp
        lower, upper = np.zeros(self.n), self.upper.copy()
        if fixed is not None:
            n_ops = self.p.n_ops
            lower[:n_ops][fixed] = values[fixed]
            upper[:n_ops][fixed] = values[fixed]
        res = milp(self.c, integrality=self.integrality, bounds=Bounds(lower, upper),
                   constraints=self.constraints,
                   options={"time_limit": time_limit, "mip_rel_gap": 1e-6})
        if res.x is None or res.status != 0:
            return None
        x = np.round(res.x).astype(bool)
        offload_ok = x[self.o0:self.o0 + self.p.n_values] if self.p.offload_cost is not None \
            else None
        return x[:self.p.n_ops], offload_ok, (getattr(res, "mip_dual_bound", None) or 0.0)


def solve_exact(p: Problem, budget: int, time_limit: float = 60.0) -> Solution | None:
    """The integer program with HiGHS; None if it did not finish within `time_limit`."""
    start = time.perf_counter()
    model = _Milp(p, budget)
    out = model.solve(max(time_limit - (time.perf_counter() - start), 1.0))
    if out is None:
        return None
    rec, offload_ok, bound = out
    recompute = _drop_unneeded(p, rec)
    avail_, offl, device, cost = evaluate(p, recompute, offload_ok)
    return Solution(recompute, avail_, offl, device, cost, "exact",
                    time.perf_counter() - start, budget, lower_bound=bound * model.unit)


def _neighbourhoods(p: Problem, rec: np.ndarray, budget: int, offload_ok, deadline: float,
                    window: int = 1000):
    """Large-neighbourhood search: free the recompute decisions of a window of ops (in
    program order), keep every other one, solve that small integer program exactly;
    keep what costs less. Windows overlap by half and sweep until `deadline` (a problem
    of at most `window` ops is one window: solved exactly)."""
    if time.perf_counter() >= deadline or p.n_ops < 2:
        return rec, offload_ok
    model = _Milp(p, budget)
    cost = evaluate(p, rec, offload_ok)[3]
    start = 0
    while time.perf_counter() < deadline:
        fixed = np.ones(p.n_ops, bool)
        fixed[start:start + window] = False
        out = model.solve(max(deadline - time.perf_counter(), 0.5), fixed,
                          rec.astype(float))
        if out is not None:
            trial = _drop_unneeded(p, out[0])
            ok = out[1] if out[1] is not None else offload_ok
            e = evaluate(p, trial, ok)
            if e[2] <= budget and e[3] < cost - 1e-18:
                rec, offload_ok, cost = trial, ok, e[3]
        if window >= p.n_ops:
            break
        start += window // 2
        if start >= p.n_ops:
            start = 0
    return rec, offload_ok


# ------------------------------------------------------------- the problem --
class _Builder:
    """Collects op and value nodes; one per (op or value) object, keyed by identity."""

    def __init__(self, profile: DeviceProfile, offload: bool):
        self.profile = profile
        self.offload = offload
        self.cost_model = flops.CostModel()
        self.op_index: dict = {}       # op_id -> node
        self.value_index: dict = {}    # ir.Value -> node
        self.ops, self.values, self.labels = [], [], []
        self.op_cost, self.recomputable, self.reads = [], [], []
        self.value_bytes, self.value_producer, self.needed = [], [], []
        self.keep_cost, self.markers, self.through = [], [], []
        self.flops: list = []
        # loop-body ops the model leaves out as free (computed from invariants and re-sliced
        # inputs alone: never stacked); the plan recomputes them, as the model assumes
        self.free_ops: list = []

    def op(self, op, recomputable: bool, scale: int, label: str) -> int:
        node = len(self.ops)
        self.op_index[op_id(op)] = node
        self.ops.append(op)
        self.labels.append(label)
        f = self.cost_model.op_flops(op) if recomputable else 0.0
        self.flops.append(f * scale)
        self.op_cost.append(self.profile.op_seconds(op, self.cost_model) * scale
                            if recomputable else 0.0)
        self.recomputable.append(recomputable)
        marker = contract.checkpoint_name(op) is not None
        self.markers.append(marker)
        self.through.append(marker or scan_pairs.moves_data(op))
        self.reads.append([])
        return node

    def value(self, v, producer: int, scale: int, forward_use: bool = False) -> int:
        """A value node; `forward_use`: the forward reads it too, so that keeping it makes
        insert-reduce-precision round it when a recomputed op reads it."""
        node = len(self.values)
        self.value_index[v] = node
        self.values.append(v)
        self.value_bytes.append(graph.type_bytes(v.type) * scale)
        elem = str(getattr(v.type, "element_type", ""))
        rounded = (producer >= 0 and forward_use and elem.startswith(("f", "bf"))
                   and v.owner.operation.name != ROUNDING)
        self.keep_cost.append(self.profile.rounding_seconds(
            graph.type_elements(v.type) * scale) if rounded else 0.0)
        self.value_producer.append(producer)
        self.needed.append(False)
        return node

    def _offload_cost(self, vb: np.ndarray) -> np.ndarray:
        """Moving a value to host and back; only what a recomputable op produces can move
        (an argument stays where the caller put it; an op under another policy, or one
        nothing may recompute, keeps its own verdict)."""
        prod = np.array(self.value_producer, dtype=np.int64)
        movable = prod >= 0
        movable[movable] = np.array(self.recomputable, bool)[prod[movable]]
        return np.where(movable, np.array([self.profile.offload_seconds(b) for b in vb]),
                        np.inf)

    def problem(self) -> Problem:
        vb = np.array(self.value_bytes, dtype=np.float64)
        return Problem(
            op_cost=np.array(self.op_cost, dtype=np.float64), value_bytes=vb,
            value_producer=np.array(self.value_producer, dtype=np.int64),
            recomputable=np.array(self.recomputable, dtype=bool),
            needed=np.array(self.needed, dtype=bool),
            reads=[np.array(sorted(set(r)), dtype=np.int64) for r in self.reads],
            offload_cost=self._offload_cost(vb) if self.offload else None,
            ops=self.ops, values=self.values, labels=self.labels,
            keep_cost=np.array(self.keep_cost, dtype=np.float64),
            markers=np.array(self.markers, dtype=bool),
            through=np.array(self.through, dtype=bool))


def build_problem(a, scope_re, kept_whole, profile: DeviceProfile, offload: bool,
                  governed) -> tuple[Problem, _Builder]:
    """The planning problem of function analysis `a` for the ops `governed(pos)` selects
    (those under the auto policy); every other forward op keeps its own verdict and is
    modelled as saved where the backward needs it."""
    b = _Builder(profile, offload)
    chains = a.scope_chains(scope_re)
    arg_node = {}
    for i, v in enumerate(a.args):
        if i not in a.cotangent_vids:
            arg_node[i] = b.value(v, -1, 1)
    vid_node = dict((vid, node) for vid, node in arg_node.items())
    stacked = set()      # results of forward scan loops that stack per-iteration values:
    pairs = [q for q in a.scan_pairs if _modelled(q)]   # their bytes are the loop body's
    for pair in pairs:
        base = a.result_base[a.position[op_id(pair.fwd.op)]]
        stacked.update(base + k for k in pair.fwd.stacked)
    for pos, op in enumerate(a.ops):
        if a.backward[pos] or a.free[pos]:
            continue
        rec = (not a.side_effect[pos] and pos not in kept_whole and governed(pos)
               and op.name not in ("func.call", graph.MANUAL_COMPUTATION))
        # (a shard_map body is not planned: its ops get the fallback verdict, save, and
        # the manual-computation rule then saves it whole, as the model does)
        node = b.op(op, rec, 1, "top")
        for vid in a.results(pos):
            if vid not in stacked:
                forward_use = any(u < len(a.ops) and not a.backward[u] for u in a.users(vid))
                vid_node[vid] = b.value(a.value(vid), node, 1, forward_use)
        for vid in a.reads(pos):
            if vid in vid_node:
                b.reads[node].append(vid_node[vid])
        if chains[pos]:   # checkpoint scope inputs are saved (jax.checkpoint saves arguments)
            for vid in a.reads(pos):
                if vid in vid_node and (a.producer[vid] < 0 or chains[a.producer[vid]] != chains[pos]):
                    b.needed[vid_node[vid]] = True
    for pos in range(len(a.ops)):
        if a.backward[pos]:
            for vid in a.reads(pos):
                if vid in vid_node:
                    b.needed[vid_node[vid]] = True
    for pair in pairs:
        _add_pair(b, pair, vid_node, a)
    return b.problem(), b


def _modelled(pair) -> bool:
    """Unrolled steps (blocks of sub-steps) are left to the fallback: saved as exported."""
    return not any(scan_pairs.unrolled_parts(pair.fwd.stacked[k].value) is not None
                   for k in pair.links.values())


def _add_pair(b: _Builder, pair, vid_node, a) -> None:
    """The forward body of a scan pair, per iteration: ops and values times the trip count;
    the stacked values the backward loop reads are needed."""
    from remat_passes.scan_rewrite import _Planner
    fwd = pair.fwd
    n = fwd.trip_count
    facts = _Planner(pair, lambda v: Saveable)
    label = f"scan loop at {graph.source_position(fwd.op)[0] or 'top'}"
    body_ops = [op.operation for op in fwd.body.operations][:-1]
    node_of: dict = {}
    # the loop's invariant operands, by body argument: a recomputed body op that reads one
    # (directly or through free ops) needs it available
    invariant_node = {}
    for k in fwd.invariant:
        vid = a.vid(fwd.op.operands[k])
        if vid in vid_node:
            invariant_node[fwd.body.arguments[k]] = vid_node[vid]
    invariants_of: dict = {}       # free value -> the invariant nodes it is computed from

    def step(u):                   # (graph.post_order: operands first, no recursion)
        if u in invariant_node:
            invariants_of[u] = {invariant_node[u]}
        elif not isinstance(u, ir.OpResult) or facts.free_kind(u) is None:
            invariants_of[u] = set()
        else:
            reads = graph.read_values(u.owner.operation)
            pending = [w for w in reads if w not in invariants_of]
            if pending:
                return pending
            invariants_of[u] = set().union(*(invariants_of[w] for w in reads))
        return None

    for arg in fwd.body.arguments:
        k = arg.arg_number
        if k in fwd.invariant or k == fwd.counter or facts.free_kind(arg) is not None:
            continue
        node_of[arg] = b.value(arg, -1, n)          # a carry-in: stacked if needed
    for op in body_ops:
        results = list(op.results)
        if results and all(facts.free_kind(r) is not None for r in results):
            b.free_ops.append(op)                   # invariant or re-sliced: never stacked
            continue
        rec = not graph.is_side_effecting(op) and scan_pairs.analyse_forward(op) is None
        node = b.op(op, rec, n, label)
        for r in results:
            node_of[r] = b.value(r, node, n, _used_beyond_stacking(r))
        for u in graph.read_values(op):
            if u in node_of:
                b.reads[node].append(node_of[u])
            elif facts.free_kind(u) is not None:
                b.reads[node].extend(graph.post_order(u, invariants_of, step))
    for m, k in pair.links.items():    # the stacked values the backward loop reads
        v = fwd.stacked[k].value
        if v in node_of:
            b.needed[node_of[v]] = True
        elif facts.free_kind(v) is not None:   # re-derived from the invariants instead
            for node in graph.post_order(v, invariants_of, step):
                b.needed[node] = True


def _used_beyond_stacking(v) -> bool:
    """Does a loop body read `v` other than to stack it (what makes insert-reduce-precision
    round a stacked value: `round_stacked`)?"""
    for use in v.uses:
        op = use.owner.operation
        if op.name in ("stablehlo.reshape", "stablehlo.broadcast_in_dim") and all(
                u.owner.operation.name == "stablehlo.dynamic_update_slice"
                for u in op.results[0].uses):
            continue
        return True
    return False


# ---------------------------------------------------------------- reporting --
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

    def cost_text(self, cost: float) -> str:
        """A modelled cost in its unit: seconds on a device, FLOPs on the `flops` profile."""
        return format_flop(cost) if self.device == "flops" else format_seconds(cost)

    def with_flops(self, flop_count: float, cost: float) -> str:
        """'2.05 kFLOP, 2.05 ns' (the FLOPs once on the `flops` profile)."""
        text = format_flop(flop_count)
        return text if self.device == "flops" else f"{text}, {format_seconds(cost)}"

    def summary(self) -> str:
        s = self.solution
        text = (f"{self.policy}: budget {self.budget} B (minimum {self.minimum} B, no remat "
                f"{self.no_remat} B); plan keeps {s.device_bytes} B on the device and "
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


def _verdicts(p: Problem, sol: Solution, offload_kind) -> dict:
    out = {}
    prod = p.value_producer
    offloaded_ops = set(int(prod[v]) for v in np.nonzero(sol.offloaded)[0] if prod[v] >= 0)
    for node, op in enumerate(p.ops):
        if sol.recompute[node]:
            out[op_id(op)] = Recompute
        elif node in offloaded_ops:
            out[op_id(op)] = Offloadable("device", offload_kind)
        else:
            out[op_id(op)] = Saveable
    return out


def solve(p: Problem, budget: int, solver="auto", exact_limit: float = 60.0,
          compare_exact: bool = False) -> tuple[Solution, Solution | None]:
    """(the solution, the exact one if it was computed). `solver`: 'auto' (exact up to
    20,000 nodes, else lagrangian), 'exact', 'lagrangian', or a function
    `(problem, budget) -> recompute` (bool per op node) for experiments and baselines."""
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


def plan_auto(policy: AutoPolicy, a, scope_re, kept_whole, governed, *,
              compare_exact=False) -> tuple[dict, PlanReport]:
    """Solve `policy` for analysis `a`: ({op_id: verdict}, report)."""
    profile = policy.profile
    p, b = build_problem(a, scope_re, kept_whole, profile, policy.offload is not None,
                         governed)
    no_remat = int(p.value_bytes[p.needed].sum())
    budget = policy.budget.resolve(no_remat)
    minimum = minimum_bytes(p)
    if budget < minimum:
        raise RematError(
            f"error: {policy.spec}: the budget, {budget} B, is below the minimum this "
            f"function can keep, {minimum} B (arguments the backward reads, outputs of "
            "side-effecting ops and values nothing may recompute); without remat it keeps "
            f"{no_remat} B")
    sol, exact = solve(p, budget, policy.solver, compare_exact=compare_exact)
    verdicts = _verdicts(p, sol, policy.offload)
    for op in b.free_ops:      # (the fallback, save, would stack what the model never does)
        verdicts.setdefault(op_id(op), Recompute)
    cost = {op_id(op): (op.name, b.flops[n], p.op_cost[n]) for n, op in enumerate(p.ops)}
    from remat_passes.report import describe_value
    recomputed = []
    for n in np.nonzero(sol.recompute)[0]:
        op = p.ops[n]
        what = (f"{graph.jax_type_str(op.results[0].type)} "
                f"{describe_value(op.results[0], a.func_op)}") if len(op.results) else op.name
        recomputed.append((what, b.flops[n], p.op_cost[n], p.labels[n]))
    report = PlanReport(policy.spec, budget, minimum, no_remat, sol, exact, profile.name,
                        (p.n_ops, p.n_values), cost, recomputed)
    return verdicts, report


def resolve(policies, a, scope_re, kept_whole, *, compare_exact=False):
    """Replace the auto policies of a ScopePolicies by their solutions (PlannedPolicy).
    Returns the reports."""
    reports = []
    if isinstance(policies.module_policy, AutoPolicy):
        auto_policy = policies.module_policy
        chains = a.scope_chains(scope_re)
        verdicts, report = plan_auto(auto_policy, a, scope_re, kept_whole,
                                     lambda pos: not chains[pos], compare_exact=compare_exact)
        policies.module_policy = PlannedPolicy(auto_policy.spec, verdicts, _SAVE, report)
        reports.append(report)
    for key, pol in list(policies.recorded.items()):
        if isinstance(pol, AutoPolicy):
            chains = a.scope_chains(scope_re)

            def governed(pos, key=key, chains=chains):
                return bool(chains[pos]) and graph.scope_key(chains[pos][0]) == key
            verdicts, report = plan_auto(pol, a, scope_re, kept_whole, governed,
                                         compare_exact=compare_exact)
            policies.recorded[key] = PlannedPolicy(pol.spec, verdicts, _SAVE, report)
            reports.append(report)
    if isinstance(policies.scope_policy, AutoPolicy):
        raise RematError("error: region-policy=auto(...) is not supported: give the scopes "
                         "made by region-regex a fixed policy, or use auto as the module policy")
    return reports


def has_auto(policies) -> bool:
    return isinstance(policies.module_policy, AutoPolicy) or any(
        isinstance(p, AutoPolicy) for p in policies.recorded.values())



# ------------------------------------------------------------ peak objective --
def for_peak(policy: AutoPolicy, module, func: str, remat_options: dict) -> AutoPolicy:
    """objective=peak: the residual-budget policy whose plan is the cheapest among those
    whose joint form's static peak estimate fits the budget. Tries residual budgets from
    the minimum to no remat (13 of them) on copies of `module`: the peak is not monotone
    in the residual bytes (recomputing more can raise it: what is recomputed is live at
    once), so every candidate is measured. A percentage is of the no-remat peak."""
    from remat_passes import pipeline
    from remat_passes.memory import estimate_memory
    lo, hi = bounds(module, func, policy)
    trials: dict = {}

    def trial(rb):
        if rb not in trials:
            candidate = auto(rb, offload=policy.offload, device=policy.device,
                             solver=policy.solver)
            candidate.spec = f"{policy.spec} (residual budget {rb} B)"
            out = pipeline.remat(module, candidate, mode="joint", func=func, **remat_options)
            trials[rb] = (estimate_memory(out)[func].peak_bytes,
                          out.plan_reports[0].solution.cost, candidate)
        return trials[rb]
    budget = policy.budget.resolve(trial(hi)[0])   # a percentage: of the no-remat peak
    tried = [trial(int(lo + (hi - lo) * k / 12)) for k in range(13)]
    fits = [t for t in tried if t[0] <= budget]
    if not fits:
        lowest = min(t[0] for t in tried)
        raise RematError(
            f"error: {policy.spec}: the peak budget, {budget} B, is below the lowest joint "
            f"peak the plans reach, {lowest} B (without remat: {trial(hi)[0]} B)")
    return min(fits, key=lambda t: t[1])[2]


def recompute_seconds(module, policy, func: str = "main", device: str | None = None,
                      mode: str = "joint") -> float:
    """What the recomputation of `policy`'s plan for `module` costs in the planner's model,
    to compare any policy with auto on the same scale: the ops remat-partial-eval clones
    and the reduce_precision ops insert-reduce-precision then adds on what is kept (what
    `auto` minimises counts both), loop bodies times their trip count. `mode="split"`:
    of the split form."""
    from remat_passes import contract, pipeline
    from remat_passes.passes.inline import Inline
    from remat_passes.passes.insert_reduce_precision import InsertReducePrecision
    from remat_passes.passes.remat_partial_eval import RematPartialEval
    profile = PROFILES[device or default_device()]
    out = module.clone()
    pipeline.run_pipeline(out.op, [Inline(), RematPartialEval(policy=policy, func=func,
                                                              mode=mode)])
    funcs = [graph.find_func(out.op, name).operation
             for name in ([func] if mode == "joint" else [f"{func}_fwd", f"{func}_bwd"])]
    existing = set()

    def walk(op, visit, scale=1):
        for inner in op.regions:
            for block in inner.blocks:
                n = scale * ((flops.trip_count(op) or 1) if op.name == "stablehlo.while"
                             else 1)
                for o in block.operations:
                    visit(o.operation, n)

    def note(o, n):
        if o.name == ROUNDING:
            existing.add(op_id(o))
        elif len(o.regions):
            walk(o, note, n)
    for f in funcs:
        walk(f, note)
    pipeline.run_pipeline(out.op, [InsertReducePrecision(func=func)])
    cost_model = flops.CostModel(out.op)
    total = 0.0

    def add(o, n):
        nonlocal total
        if contract.is_recompute_clone(o):
            total += profile.op_seconds(o, cost_model) * n
        elif o.name == ROUNDING and op_id(o) not in existing:
            total += profile.rounding_seconds(graph.type_elements(o.results[0].type)) * n
        elif len(o.regions):
            walk(o, add, n)
    with out.op.context:
        for f in funcs:
            walk(f, add)
    return total


def bounds(module, func: str = "main", policy: AutoPolicy | None = None) -> tuple[int, int]:
    """(minimum, no-remat) residual bytes a plan can have for `func` of `module`."""
    p = problem_for(module, func, policy)
    return minimum_bytes(p), int(p.value_bytes[p.needed].sum())


def problem_for(module, func: str = "main", policy: AutoPolicy | None = None) -> Problem:
    """The planning problem `auto` solves for `func` of a copy of `module` (inlined; no
    checkpoint regions of their own: every forward op is governed), for the solvers and
    benchmarks to work on directly."""
    from remat_passes import pipeline
    from remat_passes.passes import PassState
    from remat_passes.rules import RULES
    policy = policy or AutoPolicy(0)
    copy = module.clone()
    state = PassState()
    pipeline.run_pipeline(copy.op, pipeline.parse_pipeline("builtin.module(inline)"), state)
    with copy.op.context:
        a = state.analysis(graph.find_func(copy.op, func))
        kept = {}
        for rule in RULES.values():
            kept.update(rule.kept_whole(a))
        p, _ = build_problem(a, None, set(kept), policy.profile, policy.offload is not None,
                             lambda pos: True)
    p.module = copy      # the ops and values it names live in this copy
    return p


# ------------------------------------------------------------------- pareto --
@dataclasses.dataclass
class ParetoPoint:
    budget: int                 # the budget asked for (residual bytes)
    residual_bytes: int         # what the split form's <f>_fwd keeps on the device
    host_bytes: int             # what it moves to host memory
    extra_flops: float          # FLOPs recomputed (fwd + bwd of the split form, over no remat)
    extra_pct: float            # ... as % of the no-remat split's FLOPs
    joint_peak: int             # static program-order peak estimate of the joint form
    solve_seconds: float
    method: str


def pareto(module, budgets=None, *, points: int = 20, offload=None, device=None,
           func: str = "main", solver: str = "auto") -> list[ParetoPoint]:
    """Budget -> residual bytes, extra FLOPs, joint peak and solve time, for a sweep of
    budgets (by default `points` from the minimum to no remat). A larger budget never
    costs more: a point whose plan costs more than the plan of a smaller budget takes
    that plan instead."""
    from remat_passes import pipeline
    from remat_passes.memory import estimate_memory
    base = pipeline.remat(module, None, mode="split", func=func)
    base_flops = flops.function_flops(base, f"{func}_fwd") + \
        flops.function_flops(base, f"{func}_bwd")
    lo, hi = bounds(module, func, AutoPolicy(0, offload=offload, device=device))
    if budgets is None:
        budgets = sorted({int(lo + (hi - lo) * k / max(points - 1, 1)) for k in range(points)})
    out = []
    best = None      # (budget, point) of the cheapest plan so far
    for b in sorted(budgets):
        policy = auto(b, offload=offload, device=device, solver=solver)
        split = pipeline.remat(module, policy, mode="split", func=func)
        joint = pipeline.remat(module, policy, mode="joint", func=func)
        rep = split.plan_reports[0]
        total = flops.function_flops(split, f"{func}_fwd") + \
            flops.function_flops(split, f"{func}_bwd")
        dev = sum(r.bytes for r in split.residuals
                  if r.offload is None or r.offload.dst not in ("pinned_host", "unpinned_host"))
        host = sum(r.bytes for r in split.residuals) - dev
        point = ParetoPoint(b, dev, host, total - base_flops,
                            (total - base_flops) / base_flops * 100 if base_flops else 0.0,
                            estimate_memory(joint)[func].peak_bytes, rep.solution.seconds,
                            rep.solution.method)
        if best is not None and best.extra_flops < point.extra_flops:
            point = dataclasses.replace(best, budget=b, solve_seconds=point.solve_seconds)
        best = point
        out.append(point)
    return out


def format_pareto(points: list[ParetoPoint]) -> str:
    from remat_passes.memory import format_bytes
    lines = ["budget | residuals (device) | host | extra FLOPs | joint peak | solve",
             "---|---|---|---|---|---"]
    for q in points:
        lines.append(f"{format_bytes(q.budget)} | {format_bytes(q.residual_bytes)} | "
                     f"{format_bytes(q.host_bytes)} | {format_flop(q.extra_flops)} "
                     f"({q.extra_pct:+.1f}%) | {format_bytes(q.joint_peak)} | "
                     f"{q.solve_seconds:.3f} s {q.method}")
    return "\n".join(lines)
