"""The memory-budget planner, `auto(budget=...)`, on the benchmark models.

For every comparison model, side by side in one run:

* every fixed policy P (ours, which equals JAX's: see the models table), and
  `auto(budget = P's activation bytes)` beside it (residuals beyond the arguments); the cheapest fixed policy that
  fits the same budget; offloading policies against `auto(..., offload=pinned_host)`;
* a sweep of 20 budgets from the minimum to no remat: activation bytes, cost,
  joint peak estimate, solve time, gradient error of the split and the joint
  form against `jax.grad`; and the independent knapsack (`knapsack.py`, how
  PyTorch's budget decides) at the same budgets;
* `auto(budget = P's bytes, score=xla)`: the candidate plans compiled, the one with the
  fewest FLOPs in XLA's compiled count kept, against the fixed policy with the fewest;
* the scalable solver against the exact one at every budget of the sweep;
* `objective=peak`: 8 peak budgets, the joint peak estimate against each.

Costs are what recomputation costs: XLA's cost analysis (flops + transcendentals) of the
compiled split forward + backward over the no-remat split, or `remat_passes.flops` for
the scanned models (XLA counts a loop body once). The planner itself minimises its
roofline model of the device (`device=cpu` here: dots and elementwise ops at the same
FLOP rate, so its objective is close to a FLOP count); that model's seconds are kept too.

And the solver alone on larger modules (the `transformer` scaling family at about 10k
and 100k ops): the time to plan, and the exact solve where it finishes in 60 s.
Results: `results/budgets.json`.
"""
from __future__ import annotations

import os
import time

import remat_passes as rp
from remat_passes.api.variants import fences_chains, needs_tie, recomputes_nothing, rounding
from remat_passes.api.sweeps import bounds, problem_for, recompute_seconds
from remat_passes.core.residuals import activation_bytes
from remat_passes.cost.devices import PROFILES
from remat_passes.cost.memory import estimate_memory
from remat_passes.cost.xla_schedule import peak_forms
from remat_passes.planner.solvers import minimum_bytes, solve, solve_exact, solve_lagrangian
from remat_passes.policy.auto import AutoPolicy, auto
from tools.benchmarks import common
from tools.benchmarks.cases import cases_for
from tools.benchmarks.knapsack import knapsack_solver
from tools.benchmarks.measure import run_joint_form, run_split_form
from tools.benchmarks.models import HELD_OUT, MODELS, Model, _identity

PAGE_MODELS = {**MODELS, **HELD_OUT}   # the benchmark models, then the held-out decoder

DEVICE = "cpu"          # the planner's cost profile in every run here (stated in the page)
SWEEP = 20
PEAK_POINTS = 8
PEAK_MODEL = "xla"      # the estimate objective=peak bounds (rp.estimate_memory's model)
LEVELS = "1"            # one level of recomputation: the plans this page compares (stated there)


def device_bytes(out) -> tuple[int, int]:
    """(device, host) bytes of a split module's residuals beyond the function's arguments
    (the activations: what a budget counts)."""
    host = sum(r.bytes for r in out.residuals
               if r.offload is not None and "host" in str(r.offload.dst))
    return activation_bytes(out.residuals), host


def joint_form(module, policy, groups="per-use", tie=True, rounded=False):
    """The joint form whose peak this page gives: as rp.jit builds it (where XLA deletes
    optimization barriers, on CPU, the recomputation tied to the cotangent; untied, the
    estimate has XLA:CPU run it as early as it can, as XLA does; where XLA keeps barriers
    through fusion, duplicated chains fenced; the residuals rounded as there,
    `rounding`), with barriers `groups`, residuals all `rounded` (rp.remat's
    round_read_back)."""
    return rp.remat(module, policy, mode="joint", levels=LEVELS, barrier_groups=groups,
                    tie_to_cotangent=needs_tie() and tie, fence_chains=fences_chains(),
                    **rounding("joint", read_back=rounded))


def joint_peak(module, policy) -> tuple[int, object]:
    """(joint peak estimate, joint form) of `policy`'s plan, weighed as objective=peak
    weighs its trial plans: built in each of `peak_forms`, the lowest estimate. (With
    barriers per use alone, the conv net's plan that recomputes nothing is estimated at
    3,239,552 B on jaxlib 0.12, per region at 2,453,120 B: objective=peak chose it for a
    budget between the two, and the page measured the other program.)"""
    built = [joint_form(module, policy, **form) for form in peak_forms(True)]
    if recomputes_nothing(module, built[0]):
        built += [joint_form(module, policy, **form) for form in peak_forms(False)[len(built):]]
    return min((int(estimate_memory(out, model=PEAK_MODEL).peak_bytes), k, out)
               for k, out in enumerate(built))[::2]


def point(model: Model, module, policy, ref, joint=False) -> dict:
    """One policy on one model: bytes, cost, model seconds, grads (split, its residuals
    rounded as rp.jit rounds them on this backend: `rounding`; joint too)."""
    rounds = rounding("split")
    t = time.perf_counter()
    split = rp.remat(module, policy, mode="split", levels=LEVELS, **rounds)
    pass_s = time.perf_counter() - t
    dev, host = device_bytes(split)
    planned: dict = {}
    cost, err = run_split_form(model, split, ref, planned)
    row = {"dev": dev, "host": host, "cost": cost, "cost_lowered": planned["cost"],
           "err": err, "pass_s": pass_s,
           "model_s": recompute_seconds(module, policy, device=DEVICE, mode="split",
                                        levels=LEVELS,
                                        round_exact=rounds.get("round_exact", True))}
    # with the transfers of what it offloads: what auto(offload=...) minimises
    row["total_s"] = row["model_s"] + PROFILES[DEVICE].offload_seconds(host)
    kept = [r.split(". Kept ", 1)[1] for r in split.remarks if "score=xla" in str(r)
            and ". Kept " in str(r)]
    if kept:      # auto(score=xla): which candidate XLA's count chose
        row["kept"] = kept[0]
    if split.plan_reports:
        sol = split.plan_reports[0].solution
        row.update(solve_s=sol.seconds, method=sol.method, planned_s=sol.cost)
    if joint:
        row["peak"], out = joint_peak(module, policy)
        row["err_joint"] = run_joint_form(model, out, ref)
    return row


def measure_model(model: Model, progress) -> dict:
    import jax
    args = model.args
    progress(f"{model.key}: export + reference")
    ref = jax.jit(jax.grad(model.build(_identity), argnums=(0, 1), allow_int=True))(*args)
    module = rp.export_vjp(model.build(_identity), *args)
    lo, hi = bounds(module, policy=AutoPolicy(0, device=DEVICE))
    base = point(model, module, None, ref, joint=True)
    out = {"title": model.title, "n_ops": common.count_ops(module), "min": lo, "no_remat": hi,
           "rounding": rounding("split"),   # (rp.remat's options: how residuals are rounded)
           "xla_flags": os.environ.get("XLA_FLAGS", ""),
           "base_cost": base["cost"], "base_cost_lowered": base["cost_lowered"],
           "base_peak": base["peak"], "fixed": [], "at_fixed": [],
           "sweep": [], "peak": []}
    # ------------------------------------------------------------ fixed policies --
    for case in cases_for(model):
        if case.kind != "whole":
            continue
        progress(f"{model.key}: {case.short}")
        row = point(model, module, case.our_policy, ref)
        row.update(short=case.short, label=case.label)
        out["fixed"].append(row)
    for f in out["fixed"]:
        progress(f"{model.key}: auto at {f['short']}")
        offload = "pinned_host" if f["host"] else None
        try:
            a = point(model, module, auto(f["dev"], offload=offload, device=DEVICE),
                      ref)
        except rp.RematError as e:
            a = {"error": str(e)}
        # the cheapest fixed policy within the budget, in the planner's model (the modelled
        # recompute time; where offloading is allowed, with the transfers)
        fits = [g for g in out["fixed"] if g["dev"] <= f["dev"] and (offload or not g["host"])]
        cheapest = min(fits, key=lambda g: (g["total_s"] if offload else g["model_s"], g["dev"]))
        row = {"short": f["short"], "budget": f["dev"], "offload": offload, "auto": a,
               "cheapest": cheapest["short"]}
        if not offload:   # the FLOP-count profile, against the fixed policies in XLA's count
            try:
                row["auto_flops"] = point(model, module, auto(f["dev"], device="flops"),
                                          ref)
            except rp.RematError as e:
                row["auto_flops"] = {"error": str(e)}
            row["cheapest_flops"] = min(fits, key=lambda g: (g["cost_lowered"], g["dev"]))["short"]
            # score=xla: candidates compiled, kept by XLA's count of the compiled programs
            try:
                row["auto_xla"] = point(model, module, auto(f["dev"], device=DEVICE,
                                                            score="xla"), ref)
            except rp.RematError as e:
                row["auto_xla"] = {"error": str(e)}
            row["cheapest_compiled"] = min(fits, key=lambda g: (g["cost"], g["dev"]))["short"]
        out["at_fixed"].append(row)
    # --------------------------------------------------------------------- sweep --
    # (priced as the plans `point` builds: the residuals rounded as rp.jit rounds them here)
    problem = problem_for(module, policy=AutoPolicy(0, device=DEVICE),
                          round_exact=rounding("split").get("round_exact", True))
    budgets = sorted({int(lo + (hi - lo) * k / (SWEEP - 1)) for k in range(SWEEP)})
    for b in budgets:
        progress(f"{model.key}: sweep {b} B")
        row = {"budget": b,
               "auto": point(model, module, auto(b, device=DEVICE), ref, joint=True),
               "knapsack": point(model, module,
                                 auto(b, device=DEVICE, solver=knapsack_solver), ref)}
        t = time.perf_counter()
        lag = solve_lagrangian(problem, b)
        row["lagrangian"] = {"cost": lag.cost, "dev": lag.device_bytes,
                             "s": time.perf_counter() - t}
        ex = solve_exact(problem, b, time_limit=60.0)
        row["exact"] = None if ex is None else {"cost": ex.cost, "dev": ex.device_bytes,
                                                "s": ex.seconds}
        out["sweep"].append(row)
    out["peak"] = objective_peak(model, module, _lowest_peak(out), base["peak"], progress)
    return out


def _lowest_peak(out: dict) -> int:
    """The lowest joint peak a plan of the sweep reaches (not always the tightest budget's:
    at budget 0 the backward recomputes the whole forward at once)."""
    return min(r["auto"]["peak"] for r in out["sweep"])


def objective_peak(model: Model, module, lowest: int, highest: int, progress) -> list:
    """auto(objective=peak) at PEAK_POINTS peak budgets from `lowest` (the lowest joint peak
    of the sweep's plans) to `highest` (no remat's): the joint peak estimate of each plan,
    the estimate's own (check=false: this page counts the planner's figures; the plan
    checked against XLA is measured by `xla --peak`)."""
    rows = []
    for k in range(PEAK_POINTS):
        b = int(lowest + (highest - lowest) * k / (PEAK_POINTS - 1))
        progress(f"{model.key}: peak budget {b} B")
        t = time.perf_counter()
        try:
            peak, joint = joint_peak(module, auto(b, device=DEVICE, objective="peak",
                                                  check=False))
            rep = joint.plan_reports[0]
            rows.append({"budget": b, "peak": peak,
                         "model_s": rep.solution.cost, "s": time.perf_counter() - t})
        except rp.RematError as e:
            rows.append({"budget": b, "error": str(e)})
    return rows


def refresh_peaks(data: dict, progress=print) -> dict:
    """The joint peak figures of stored results (the no-remat peak, each sweep point's, the
    objective=peak section) measured again with the current estimate, the rest kept: for a
    change to the peak estimate alone. The commit they were measured at is in
    machine["peaks_commit"]."""
    for key, out in data["models"].items():
        model = PAGE_MODELS[key]()
        module = rp.export_vjp(model.build(_identity), *model.args)
        progress(f"{key}: joint peaks")
        out["base_peak"] = joint_peak(module, None)[0]
        for row in out["sweep"]:
            row["auto"]["peak"] = joint_peak(module, auto(row["budget"], device=DEVICE))[0]
        out["peak"] = objective_peak(model, module, _lowest_peak(out), out["base_peak"],
                                     progress)
    data["machine"]["peaks_commit"] = common.machine()["commit"]
    return data


def scale(sizes=(40, 400), progress=print) -> list:
    """The solver alone on the transformer scaling family at ~10k and ~100k ops."""
    from tools.benchmarks import families
    rows = []
    for n in sizes:
        progress(f"solver scale: transformer {n}")
        fun, args = families.transformer(n)
        module = rp.export_vjp(fun, *args)
        t = time.perf_counter()
        p = problem_for(module, policy=AutoPolicy(0, device=DEVICE))
        build_s = time.perf_counter() - t
        lo, hi = minimum_bytes(p), p.no_remat_bytes()
        row = {"n": n, "n_ops": common.count_ops(module), "nodes": p.n_ops + p.n_values,
               "build_s": build_s, "points": []}
        for frac in (0.25, 0.5, 0.75):
            b = int(lo + (hi - lo) * frac)
            t = time.perf_counter()
            sol, _ = solve(p, b, "auto")
            auto_s = time.perf_counter() - t
            t = time.perf_counter()
            lag = solve_lagrangian(p, b)
            lag_s = time.perf_counter() - t
            ex = solve_exact(p, b, time_limit=60.0)
            row["points"].append({
                "frac": frac, "budget": b, "auto_method": sol.method, "auto_s": auto_s,
                "auto_cost": sol.cost, "lag_s": lag_s, "lag_cost": lag.cost,
                "lag_dev": lag.device_bytes,
                "exact_s": None if ex is None else ex.seconds,
                "exact_cost": None if ex is None else ex.cost})
        t = time.perf_counter()
        rp.remat(module, auto(int(lo + (hi - lo) * 0.5), device=DEVICE))
        row["remat_s"] = time.perf_counter() - t
        rows.append(row)
    return rows


def measure(keys=tuple(PAGE_MODELS), progress=print, sizes=(40, 400)) -> dict:
    models = {}
    for key in keys:
        models[key] = measure_model(PAGE_MODELS[key](), progress)
    return {"machine": common.machine(), "device": DEVICE, "models": models,
            "scale": scale(sizes, progress) if sizes else []}


def merge(stored: dict, new: dict) -> dict:
    """`new`'s models (and its large-module solves, where it has them) in place of the
    stored ones, each model's commit and date kept beside it (`machine["measured"]`)."""
    def stamp(data):
        return {"commit": data["machine"]["commit"], "date": data["machine"]["date"]}
    out = dict(stored, models={**stored["models"], **new["models"]})
    measured = {key: stamp(stored)
                for key in list(stored["models"]) + (["scale"] if stored["scale"] else [])}
    measured.update(stored["machine"].get("measured", {}))
    measured.update({key: stamp(new) for key in new["models"]})
    if new["scale"]:
        out["scale"] = new["scale"]
        measured["scale"] = stamp(new)
    out["models"] = {k: out["models"][k] for k in PAGE_MODELS if k in out["models"]}
    out["machine"] = dict(stored["machine"], measured=measured)
    return out


def checks(data) -> list[str]:
    """What the page asserts, recomputed from the results: the failures, as text."""
    bad = []
    for key, m in data["models"].items():
        for r in m["at_fixed"]:
            a = r["auto"]
            if "error" in a:
                bad.append(f"{key}: auto at {r['short']}: {a['error']}")
                continue
            cheapest = next(f for f in m["fixed"] if f["short"] == r["cheapest"])
            if a["dev"] > r["budget"]:
                bad.append(f"{key}: auto at {r['short']} keeps {a['dev']} B > {r['budget']} B")
            what = "total_s" if r["offload"] else "model_s"   # what auto minimises
            if a[what] > cheapest[what] * (1 + 1e-6) + 1e-15:
                bad.append(f"{key}: auto at {r['short']} costs {a[what]:.4g} ({what}) > "
                           f"{r['cheapest']} {cheapest[what]:.4g}")
            # device=flops, in XLA's count of the split as handed to XLA (its optimizer then
            # folds constants and duplicates cheap producers into fusions, which no plan
            # decides: the page shows that count beside it)
            _against_fewest(bad, key, m, r, "auto_flops", "auto(device=flops)",
                            "cheapest_flops", "cost_lowered", 1e-6)
            # score=xla, in XLA's count of the compiled programs
            _against_fewest(bad, key, m, r, "auto_xla", "auto(score=xla)",
                            "cheapest_compiled", "cost", 1e-3)
        costs = [r["auto"]["model_s"] for r in m["sweep"]]
        for r in m["sweep"]:
            if r["auto"]["dev"] > r["budget"]:
                bad.append(f"{key}: sweep {r['budget']} B keeps {r['auto']['dev']} B")
            if max(r["auto"]["err"], r["auto"]["err_joint"]) > 1e-4:
                bad.append(f"{key}: sweep {r['budget']} B gradient error")
            if r["exact"] and r["lagrangian"]["cost"] > r["exact"]["cost"] * 1.02 + 1e-15:
                bad.append(f"{key}: lagrangian gap > 2% at {r['budget']} B")
        rises = [(b / a - 1, a, b, r["budget"]) for a, b, r in
                 zip(costs, costs[1:], m["sweep"][1:]) if b > a * (1 + 1e-6)]
        if rises:
            worst = max(rises)
            bad.append(f"{key}: cost rises with the budget at {len(rises)} of "
                       f"{len(costs) - 1} steps, by up to {worst[0]:.2%} ({worst[1]:.4g} -> "
                       f"{worst[2]:.4g} s at {worst[3]:,} B)")
        for r in m["peak"]:
            if "error" in r or r["peak"] > r["budget"]:
                bad.append(f"{key}: objective=peak at {r['budget']} B: "
                           f"{r.get('error') or r['peak']}")
        peaks = [r for r in m["peak"] if "error" not in r]
        if any(b["model_s"] > a["model_s"] * (1 + 1e-6) for a, b in zip(peaks, peaks[1:])):
            bad.append(f"{key}: objective=peak cost rises with the budget")
    for row in data["scale"]:
        for q in row["points"]:
            limit = 5.0 if row["n_ops"] < 50_000 else 30.0
            if q["auto_s"] > limit:
                bad.append(f"solver: {row['n_ops']} ops took {q['auto_s']:.1f} s > {limit} s")
    return bad


def _against_fewest(bad, key, m, r, which, label, fewest_key, cost, tolerance) -> None:
    """The check of row `r`'s `which` plan: within the budget, exact gradients, and its
    `cost` at most the fixed policy's with the fewest within the budget, + `tolerance`."""
    got = r.get(which)
    if got is None:
        return
    fewest = next(f for f in m["fixed"] if f["short"] == r[fewest_key])
    if "error" in got:
        bad.append(f"{key}: {label} at {r['short']}: {got['error']}")
    elif got["dev"] > r["budget"]:
        bad.append(f"{key}: {label} at {r['short']} keeps {got['dev']} B > {r['budget']} B")
    elif got[cost] > fewest[cost] * (1 + tolerance):
        bad.append(f"{key}: {label} at {r['short']}: XLA counts {got[cost]:.6g} FLOPs > "
                   f"{fewest['short']} {fewest[cost]:.6g} + {tolerance:.1%}")
    elif got["err"] > 1e-4:
        bad.append(f"{key}: {label} at {r['short']}: gradient error {got['err']:.2g}")


def _rounding_text(models: dict) -> str:
    """The page's sentence on how each model's residuals were rounded (models measured
    before 8d13fe1 record nothing: rp.remat's defaults, f32 rounded)."""
    unrounded = [k for k, v in models.items() if v.get("rounding", {}).get("round_exact") is False]
    rounded = [k for k in models if k not in unrounded]
    text = ""
    if unrounded:
        text += (f"{', '.join(unrounded)}: no f32 residual rounded (`round_exact=False`, "
                 "rp.jit's choice on XLA:CPU since 8d13fe1), so neither `auto` nor a fixed "
                 "policy pays XLA:CPU's second computation of a rounded value (see "
                 "[passes.md](passes.md#insert-reduce-precision)).")
    if rounded:
        text += (" " if text else "") + (
            f"{', '.join(rounded)}: every saved float residual a recomputation reads rounded "
            "to its own type, as jax.checkpoint does (measured before rp.jit left the f32 "
            "ones out on XLA:CPU).")
    return text


def _flags_text(models: dict) -> str:
    """The page's sentence on the XLA flags each model was measured with (models measured
    before 2026-12-05 record none: XLA's defaults, YNNPACK fusions on where XLA:CPU has
    them)."""
    by_flags: dict = {}
    for key, m in models.items():
        by_flags.setdefault(m.get("xla_flags") or "", []).append(key)
    return " ".join(f"XLA flags for {', '.join(keys)}: " + (f"`{flags}`." if flags else
                                                             "XLA's defaults.")
                    for flags, keys in by_flags.items())


def _commits(machine: dict) -> str:
    """The commit measured at, or, for results merged from several runs, each part's."""
    measured = machine.get("measured")
    if not measured:
        return machine["commit"]
    if len({v["commit"] for v in measured.values()}) == 1:
        return next(iter(measured.values()))["commit"]
    by_commit: dict = {}
    order = [k for k in PAGE_MODELS if k in measured] + [k for k in measured
                                                         if k not in PAGE_MODELS]
    for key, v in ((k, measured[k]) for k in order):
        by_commit.setdefault((v["commit"], v["date"]), []).append(
            "the large-module solves" if key == "scale" else key)
    return "; ".join(f"{c} ({d}) for {', '.join(keys)}" for (c, d), keys in by_commit.items())


def relative(x: float, base: float) -> float:
    return (x - base) / base * 100 if base else 0.0



# ------------------------------------------------------------------- page --
def _pct(x, base) -> str:
    return f"{relative(x, base):+.1f}%"


def render(data, png_rel: str) -> str:
    from tools.benchmarks.common import fmt_bytes, fmt_res
    m = data["machine"]
    bad = checks(data)
    models = data["models"]
    n_fixed = sum(len(v["at_fixed"]) for v in models.values())
    n_sweep = sum(len(v["sweep"]) for v in models.values())
    L = ["## The memory-budget planner: `auto(budget=...)`", "",
         f"Measured with `python -m tools.benchmarks budgets` ({m['date']}, {m['cpu']}, "
         f"{m['cpus']} cpus, jax {m['jax']}, remat_passes at {_commits(m)}), on the models "
         "above and a held-out decoder (`decoder`: rotary positions, grouped-query "
         "attention, SwiGLU, names `ctx` and `act`; `models.make_decoder`), which no "
         "change to the planner was tuned on. The planner runs with its `cpu` cost profile (`device=cpu`: dots and "
         "elementwise arithmetic at the same FLOP rate, so what it minimises is close to a "
         "FLOP count). **extra FLOPs**: as in the tables above, XLA's cost analysis of the "
         "compiled split forward + backward over the no-remat split (`remat_passes.flops` "
         "with loop trip counts for the scanned models). **residuals**: device bytes the split "
         "form's `main_fwd` keeps for `main_bwd` beyond the function's own arguments (the "
         "activations), which is what the budget bounds. Every program is built as `rp.jit` "
         "builds it on this backend, its residuals rounded as there (`variants.rounding`): "
         + _rounding_text(models) + " " + _flags_text(models), "",
         "These figures are of plans with one level of recomputation (`levels=1`). Since 2026-11-26 "
         "(`core/levels.py`), `auto` recomputes in two levels where that lowers the peak "
         "estimate by 15%: on these models, at budget 0 (GPT, Equinox, conv net; and the conv "
         "net at 0.15 MB), where at budget 0 it costs +60.5%, +53.9% and +36.5% extra FLOPs "
         "instead of +33.3%, +34.1% and +33.6% (jaxlib 0.12, at 56a5832) for a lower XLA footprint (see [passes.md](passes.md#two-levels-of-recomputation) and the sweeps of "
         "[Memory as XLA allocates it](#memory-as-xla-allocates-it)); `levels=1` gives the "
         "plans measured here.", "",
         "What is checked (recomputed from the results by `tools/benchmarks/budgets.py:checks` "
         "when the page is rendered): for every fixed policy P, `auto(budget = P's activation "
         "bytes)` keeps at most that many bytes and costs no more modelled recompute time "
         "(what it minimises) than the cheapest fixed policy within the same budget (with "
         "offloading: transfers included), and `auto(budget, device=flops)` costs no more "
         "extra FLOPs in XLA's count (of the programs handed to XLA, see below) than the "
         "fixed policy with the fewest within that budget; the modelled cost a plan is "
         "measured at is that of the rewritten module (`recompute_seconds`: what it "
         "recomputes and the roundings insert-reduce-precision adds); along a sweep of 20 budgets from the minimum to no "
         "remat the bytes never exceed the budget, the cost never rises as the budget grows "
         "and the gradients of the split and of the joint form equal `jax.grad`; the "
         "scalable solver is within 2% of the exact optimum wherever the exact solve "
         "finishes in 60 s; `objective=peak` keeps the joint peak estimate within its "
         "budget; planning a ~10k-op module takes at most 5 s and a ~100k-op one 30 s.", "",
         (f"**All checks pass** ({n_fixed} fixed-policy budgets, {n_sweep} sweep points, "
          f"{sum(len(v['peak']) for v in models.values())} peak budgets, "
          f"{sum(len(r['points']) for r in data['scale'])} large-module solves)."
          if not bad else "**Checks that fail:**\n\n" + "\n".join(f"- {b}" for b in bad)), "",
         "### Against every fixed policy, at its own budget", "",
         "| model | fixed policy P | P: residuals | P: extra FLOPs | auto: residuals | "
         "auto: extra FLOPs | cheapest fixed within the budget | its extra FLOPs | "
         "auto solve | auto(device=flops): extra FLOPs | fewest FLOPs fixed within the "
         "budget |", "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---|"]
    for key, d in models.items():
        fixed = {f["short"]: f for f in d["fixed"]}
        base, lbase = d["base_cost"], d["base_cost_lowered"]
        for r in d["at_fixed"]:
            f, a, c = fixed[r["short"]], r["auto"], fixed[r["cheapest"]]
            if "error" in a:
                L.append(f"| {key} | `{f['label']}` | {fmt_res(f['dev'], f['host'])} | "
                         f"{_pct(f['cost'], base)} | error: {a['error']} | | | | | | |")
                continue
            off = " (offload)" if r["offload"] else ""
            af, cf = r.get("auto_flops"), fixed.get(r.get("cheapest_flops"))
            flops_cols = "| |" if af is None else (
                f"| error: {af['error']} | |" if "error" in af else
                f"| {_pct(af['cost_lowered'], lbase)} [{_pct(af['cost'], base)}] "
                f"({fmt_bytes(af['dev'])}) | {cf['short']} {_pct(cf['cost_lowered'], lbase)} "
                f"[{_pct(cf['cost'], base)}] |")
            L.append(f"| {key} | `{f['label']}` | {fmt_res(f['dev'], f['host'])} | "
                     f"{_pct(f['cost'], base)} | {fmt_res(a['dev'], a['host'])}{off} | "
                     f"{_pct(a['cost'], base)} | {c['short']} | {_pct(c['cost'], base)} | "
                     f"{a['solve_s']:.2f} s {a['method']} {flops_cols}")
    L += ["", "Offloading rows (P moves residuals to host memory) compare "
          "`auto(budget, offload=pinned_host)`, which may offload too; the cheapest fixed policy "
          "there is the one with the least modelled time, recomputation plus transfers at the "
          "profile's host bandwidth. The last two columns plan with `device=flops` (the cost "
          "is the FLOP count itself) and compare in XLA's count of the split programs as they "
          "are handed to XLA (`cost_analysis()` of the lowered forward and backward, which "
          "`remat_passes.flops` equals): there auto must cost no more than the fixed policy "
          "with the fewest extra FLOPs within the same budget. In brackets, the same in XLA's "
          "count of the compiled executables, for reference: XLA's optimizer then folds "
          "constants and duplicates cheap producers into several fusions, which changes the "
          "count by up to a few percent in ways no plan decides (on the GPT, the no-remat "
          "split counts 2% more compiled than lowered, the dots_saveable one 0.5%), so there "
          "a fixed policy can come out a fraction of a percent below auto: what "
          "`score=xla` (next table) is for.", "",
          "### In XLA's count of the compiled programs: `auto(..., score=xla)`", "",
          "`auto(budget, score=xla)` plans the candidates (the planner's solution, the same "
          "at `device=flops`, JAX's fixed policies that need no names where they fit, and "
          "the planner's solution at each of their byte counts), compiles each one's split "
          "forward and backward with XLA and keeps the one XLA counts the fewest FLOPs in "
          "(`remat_passes.flops` for the scanned models, whose loop bodies XLA counts once). "
          "Checked: its extra FLOPs in the compiled count are at most those of the fixed "
          "policy with the fewest within the same budget + 0.1%, within the budget, with "
          "exact gradients. **pass s**: `rp.remat` with the candidates compiled.", "",
          "| model | budget (P) | auto(score=xla): residuals | its extra FLOPs | kept | "
          "fewest compiled FLOPs fixed within the budget | auto (score=model) | pass s |",
          "|---|---|---:|---:|---|---|---:|---:|"]
    for key, d in models.items():
        fixed = {f["short"]: f for f in d["fixed"]}
        base = d["base_cost"]
        for r in d["at_fixed"]:
            ax = r.get("auto_xla")
            if ax is None:
                continue
            cf, a = fixed[r["cheapest_compiled"]], r["auto"]
            model_col = "error" if "error" in a else _pct(a["cost"], base)
            if "error" in ax:
                L.append(f"| {key} | {r['short']} | error: {ax['error']} | | | | | |")
                continue
            L.append(f"| {key} | {r['short']} ({fmt_bytes(r['budget'])}) | "
                     f"{fmt_bytes(ax['dev'])} | {_pct(ax['cost'], base)} | "
                     f"{ax.get('kept', '')} | {cf['short']} {_pct(cf['cost'], base)} | "
                     f"{model_col} | {ax['pass_s']:.1f} |")
    L += ["", f"![auto sweeps against the fixed policies and the knapsack baseline]({png_rel})", "",
          "### Budget sweeps, and the independent knapsack", "",
          "`knapsack` is the baseline in `tools/benchmarks/knapsack.py`: a 0/1 knapsack over "
          "the tensors the backward reads, each priced by its own producing op alone, as "
          "PyTorch's `activation_memory_budget` decides; what it does not keep is recomputed "
          "by the same rewrite. Same budgets, same cost model; only the decision differs. Its "
          "bytes can exceed the budget: recomputing can need inputs the knapsack never "
          "counted.", ""]
    for key, d in models.items():
        base = d["base_cost"]
        L += [f"**{d['title']}** ({d['n_ops']} ops; minimum {fmt_bytes(d['min'])}, no remat "
              f"{fmt_bytes(d['no_remat'])}; no-remat joint peak {fmt_bytes(d['base_peak'])})",
              "", "| budget | auto: residuals | auto: extra FLOPs | knapsack: residuals | "
              "knapsack: extra FLOPs | auto: joint peak | solve | grad err split / joint |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in d["sweep"]:
            a, k = r["auto"], r["knapsack"]
            over = " (over)" if k["dev"] > r["budget"] else ""
            L.append(f"| {fmt_bytes(r['budget'])} | {fmt_bytes(a['dev'])} | "
                     f"{_pct(a['cost'], base)} | {fmt_bytes(k['dev'])}{over} | "
                     f"{_pct(k['cost'], base)} | {fmt_bytes(a['peak'])} | "
                     f"{a['solve_s']:.2f} s | {a['err']:.1e} / {a['err_joint']:.1e} |")
        L.append("")
    L += ["### Scalable solver against the exact one", "",
          "At every budget of the sweeps (modelled recompute time; `auto` itself solves "
          "exactly up to 20,000 nodes):", "",
          "| model | budgets where exact finished | max gap | lagrangian time (max) | "
          "exact time (max) |", "|---|---:|---:|---:|---:|"]
    for key, d in models.items():
        pairs = [(r["lagrangian"], r["exact"]) for r in d["sweep"] if r["exact"]]
        gaps = [relative(g["cost"], e["cost"]) for g, e in pairs if e["cost"] > 0]
        L.append(f"| {key} | {len(pairs)} of {len(d['sweep'])} | "
                 f"{max(gaps, default=0.0):.2f}% | "
                 f"{max(r['lagrangian']['s'] for r in d['sweep']):.2f} s | "
                 f"{max((e['s'] for _, e in pairs), default=float('nan')):.2f} s |")
    L += ["", "Larger modules (the `transformer` scaling family; budgets at 25/50/75% of the "
          "way from the minimum to no remat). `auto` is what `auto(budget=...)` runs; "
          "`rp.remat` is the whole pipeline with the plan, at the 50% budget:", "",
          "| module ops | problem nodes | budget | auto: method, time | lagrangian: time | "
          "exact (60 s limit): time | gap | build problem | rp.remat |",
          "|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    if data.get("scale_note"):
        L.insert(len(L) - 3, data["scale_note"] + "\n")
    for row in data["scale"]:
        for q in row["points"]:
            ex = "did not finish" if q["exact_s"] is None else f"{q['exact_s']:.1f} s"
            gap = "n/a" if q["exact_cost"] is None else \
                f"{relative(q['lag_cost'], q['exact_cost']):.2f}%"
            L.append(f"| {row['n_ops']:,} | {row['nodes']:,} | {int(q['frac'] * 100)}% | "
                     f"{q['auto_method']}, {q['auto_s']:.1f} s | {q['lag_s']:.1f} s | {ex} | "
                     f"{gap} | {row['build_s']:.1f} s | {row['remat_s']:.1f} s |")
    L += ["", "### `objective=peak`", "",
          "Peak budgets from the lowest joint peak of the sweep's plans to that of no "
          "remat; the joint form's peak estimate of the plan the estimate chooses "
          "(`check=false`; the plan checked against XLA, and what XLA allocates for it, are "
          "in [Memory as XLA allocates it](#memory-as-xla-allocates-it)) against each "
          "(`rp.estimate_memory"
          f"(joint, model='{PEAK_MODEL}')`, what objective=peak bounds, of the joint form as "
          "rp.jit builds it (on CPU tied to the cotangent, duplicated chains fenced where "
          "XLA:CPU keeps barriers through fusion; the lowest of the barrier groupings rp.jit "
          "compiles and runs the smaller of); the joint peaks on this page are "
          "that estimate"
          + (f", measured again at {m['peaks_commit']} when the estimate changed"
             if m.get("peaks_commit") else "") + "):", "",
          "| model | " + " | ".join(f"budget {k + 1}" for k in range(PEAK_POINTS)) + " |",
          "|---|" + "---:|" * PEAK_POINTS]
    for key, d in models.items():
        cells = []
        for r in d["peak"]:
            got = "error" if "error" in r else fmt_bytes(r["peak"])
            cells.append(f"{fmt_bytes(r['budget'])}: {got}")
        L.append(f"| {key} | " + " | ".join(cells) + " |")
    L += ["", "### XLA's memory of `auto`", "",
          "This section counts the planner's own figures. What XLA allocates for `auto` along "
          "its budgets is in the sweeps of [Memory as XLA allocates it]"
          "(#memory-as-xla-allocates-it) (CPU, built as `rp.jit` builds them there: tied to "
          "the cotangent, since XLA:CPU deletes optimization barriers or their unread "
          "results before it schedules, and in split form also untied, the smaller kept; "
          "of residual budgets, with and without `monotone`, and of peak budgets under "
          "`objective=peak`, `xla --peak`) "
          "and, where a device run exists, of its GPU section; the GPU training-step runs of "
          "`auto` at each fixed policy's bytes are in [On a GPU](#on-a-gpu).", ""]
    return "\n".join(L) + "\n"


def plot(data, path) -> None:
    """Residual bytes against extra FLOPs: the auto sweep and the knapsack as lines, every
    fixed policy as a point, one panel per model."""
    import math
    import os

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tools.benchmarks.common import fmt_bytes
    models = data["models"]
    cols = 2
    rows = math.ceil(len(models) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(7.0 * cols, 4.6 * rows), squeeze=False)
    for ax, (key, d) in zip(axes.flat, models.items()):
        base = d["base_cost"]
        mib = 2.0 ** 20
        for name, style in (("auto", dict(color="tab:blue", marker="o", ms=4)),
                            ("knapsack", dict(color="tab:red", marker="x", ms=5, ls="--"))):
            xs = [r[name]["dev"] / mib for r in d["sweep"]]
            ys = [relative(r[name]["cost"], base) for r in d["sweep"]]
            ax.plot(xs, ys, label=f"{name} (20 budgets)", **style)
        for f in d["fixed"]:
            x, y = f["dev"] / mib, relative(f["cost"], base)
            ax.scatter([x], [y], marker="s", s=60, facecolors="none",
                       edgecolors="tab:orange" if not f["host"] else "tab:green", zorder=3)
            ax.annotate(f["short"], (x, y), fontsize=7, xytext=(4, 4),
                        textcoords="offset points")
        ax.set_title(f"{d['title']}", fontsize=10)
        ax.set_xlabel("residual bytes on device (MiB)")
        ax.set_ylabel("extra FLOPs over no remat (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, title=f"fixed policies: squares (min {fmt_bytes(d['min'])})",
                  title_fontsize=7)
    for ax in list(axes.flat)[len(models):]:
        ax.axis("off")
    fig.suptitle("auto(budget=...) vs. fixed policies and the independent knapsack "
                 "(split forms; offloading policies in green)")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
