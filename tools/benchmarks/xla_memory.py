"""Memory as XLA allocates it: our split halves beside JAX's, the estimate's error, and XLA's
footprint along a sweep of `auto` budgets.

For each comparison model and each policy applied to the whole model, both split forms are
compiled with XLA on this backend: ours (`rp.remat(..., mode="split")`: `main_fwd`, then
`main_bwd`; on CPU as rp.jit builds it there, tied to the cotangent and untied, the smaller
kept) and JAX's (`jax.vjp` of `jax.checkpoint(model, policy)`, forward and backward
jitted separately, as in the models benchmark). From XLA's `memory_analysis()` of each
executable: temp (scratch) bytes, argument and output bytes; the footprint of a half is
temp + arguments + outputs - aliased (`common.xla_footprint`). Beside them, our static
estimate of each half (`rp.estimate_memory(split, model="xla")[half].peak_bytes`) and its
error against XLA's footprint, and that of the default program-order model.

Then the joint form, one program: ours (`rp.remat(..., mode='joint')`) beside `jax.jit` of
`jax.vjp` of `jax.checkpoint(model, policy)`. Ours are made as `rp.jit` makes them on this
backend: on CPU with `tie_to_cotangent` (XLA:CPU deletes optimization barriers before it
schedules; the tie keeps the recomputation where the plan put it); where XLA keeps barriers
(GPU), with one barrier per recomputation and one per checkpoint region, the smaller. So
the comparison is of what each tool gives a user here.

Then, per model, `auto(budget=b)` for 10 budgets from the least a plan can keep to no remat:
the activation bytes the plan keeps, whether it recomputes in two levels, and XLA's footprint
of the larger half, which should not rise as the budget falls. Added to stored results on
request: the same sweep under `monotone` (`--monotone`), and `objective=peak` at 10 peak
budgets (`--peak`), whose XLA footprints should not rise either.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

import remat_passes as rp
from remat_passes import jax_compat
from remat_passes.ir import contract, graph
from remat_passes.api.variants import (barrier_variants, fences_chains, needs_tie,
                                       recomputes_nothing, rounding)
from remat_passes.core.residuals import activation_bytes
from remat_passes.core.split import drop_passthrough
from remat_passes.cost.memory import estimate_memory
from remat_passes.passes.fences import CHAINS_FENCED
from tools.benchmarks import common, ynn_probe
from tools.benchmarks.cases import cases_for, jax_function
from tools.benchmarks.models import MODELS, _identity

SWEEP_POINTS = 10
TEMP_SLACK = 1.02          # ours <= JAX's + 2%
ESTIMATE_TOLERANCE = 0.15  # |estimate - XLA| / XLA


def jax_halves(fun, args) -> list[dict]:
    store = {}

    def fwd(*a):
        out, vjp_fn = jax.vjp(fun, *a)
        leaves, store["tree"] = jax.tree_util.tree_flatten(vjp_fn)
        return out, leaves
    fwd_c = jax.jit(fwd).lower(*args).compile()
    out, leaves = fwd_c(*args)

    def bwd(leaves, ct):
        return jax.tree_util.tree_unflatten(store["tree"], leaves)(ct)
    bwd_c = jax.jit(bwd).lower(leaves, jnp.ones_like(out)).compile()
    return [common.xla_memory(fwd_c), common.xla_memory(bwd_c)]


def _joint(compiled) -> dict:
    return common.xla_memory(compiled)


def _jax_joint(fun, args, ct) -> dict:
    return _joint(jax.jit(lambda *a: jax.vjp(fun, *a)[1](ct)).lower(*args).compile())


def rounded_joint(module, policy, joint, tie: bool, groups: str):
    """The joint form with its residuals rounded, where rp.jit builds it beside `joint`
    (which recomputes nothing; rp.jit runs the smaller), else None."""
    if not recomputes_nothing(module, joint):
        return None
    return rp.remat(module, policy, tie_to_cotangent=tie, barrier_groups=groups,
                    fence_chains=fences_chains(), **rounding("joint", read_back=True))


def our_joint(module, policy, args, ct, each=None) -> dict:
    """Our joint form as rp.jit builds it on this backend (`barrier_variants`: on CPU tied
    to the cotangent; where XLA keeps barriers, per use and per region; where nothing is
    recomputed, with the residuals rounded and not): the one with the smaller footprint
    (`barriers` says which grouping, `round_read_back` whether rounded; the first of
    equals). `each(joint, figures)` is called after each variant is compiled."""
    best = None
    for v in barrier_variants("joint"):
        joint = rp.remat(module, policy, tie_to_cotangent=v.tie, barrier_groups=v.groups,
                         fence_chains=fences_chains(), **rounding("joint"))
        m = _joint(rp.compile(joint, "main").lower(*args, ct).compile())
        if each:
            each(joint, m)
        if best is None or common.xla_footprint(m) < common.xla_footprint(best[1]):
            best = (joint, m, v)
    rounded = rounded_joint(module, policy, best[0], best[2].tie, best[2].groups)
    if rounded is not None:
        m = _joint(rp.compile(rounded, "main").lower(*args, ct).compile())
        if each:
            each(rounded, m)
        if common.xla_footprint(m) < common.xla_footprint(best[1]):
            m["round_read_back"] = True
            best = (rounded, m, best[2])
    joint, m, v = best
    if not m.get("round_read_back"):
        m.update(rounding("joint"))       # (as rp.remat's options)
    m["barriers"], m["rounding_considered"] = v.groups, True
    m["loop_constants_inside"] = True     # (sink-loop-constants, 58d8aa4 on)
    m["fence_chains"] = fences_chains()
    m["estimate"] = int(estimate_memory(joint, model="xla")["main"].peak_bytes)
    m["estimate_program_order"] = int(estimate_memory(joint)["main"].peak_bytes)
    return m


def as_run(split) -> tuple:
    """`split` as rp.jit runs it: a copy whose forward does not return the residuals that
    are arguments of the function (`drop_passthrough`, so that XLA does not copy them into
    new buffers; the backward is given them as they are). (the copy, how many results of
    the forward are outputs, {residual: forward argument})."""
    with split.op.context:
        entries = contract.all_entries(graph.find_func(split.op, "main_fwd"), "res_attrs")
    n_out = sum(1 for e in entries if contract.RESIDUAL not in e)
    run = split.clone()
    return run, n_out, drop_passthrough(run.op, n_out)


def our_halves(split, args) -> list[dict]:
    """XLA's memory of each half of `split` as rp.jit runs them (`as_run`), and the
    estimates of the same halves, marked `arguments_to_backward` (rows measured before
    e1ee82f handed the arguments through the forward, and are estimated so)."""
    run, n_out, passthrough = as_run(split)
    est = estimate_memory(run, model="xla")
    order = estimate_memory(run)
    fwd_c = rp.compile(run, "main_fwd").lower(*args).compile()
    res = fwd_c(*args)
    res = list(res) if isinstance(res, (tuple, list)) else [res]   # (one result: the output)
    flat, made = jax.tree_util.tree_leaves(args), iter(res[n_out:])
    residuals = [flat[passthrough[r]] if r in passthrough else next(made)
                 for r in range(len(passthrough) + len(res) - n_out)]
    bwd_c = rp.compile(run, "main_bwd").lower(*residuals, jnp.ones_like(res[0])).compile()
    halves = []
    for name, compiled in (("main_fwd", fwd_c), ("main_bwd", bwd_c)):
        m = common.xla_memory(compiled)
        m["estimate"] = int(est[name].peak_bytes)
        m["estimate_program_order"] = int(order[name].peak_bytes)
        m["arguments_to_backward"] = True
        halves.append(m)
    return halves


def our_split(module, policy, args, each=None, levels="auto") -> tuple:
    """Our split form as rp.jit builds it on this backend (`barrier_variants`: on CPU tied
    to the cotangent and not; where XLA keeps barriers, per use and per region; where
    fence-chains is on by default and placed a fence, the smallest again without it): the
    one with the smaller footprint of its larger half (the first of equals). Returns (split
    module, its halves, tied); each half says its grouping (`barriers`). `each(split)` is
    called after each variant is compiled (xla_dump: which dump files it wrote). `levels`:
    remat-partial-eval's (the sweep sets a two-level plan beside its one-level one)."""
    best = None
    for v in barrier_variants("split"):
        split = rp.remat(module, policy, mode="split", tie_to_cotangent=v.tie, levels=levels,
                         fence_chains=fences_chains(), barrier_groups=v.groups,
                         **rounding("split"))
        halves = our_halves(split, args)
        if each is not None:
            each(split)
        for half in halves:
            half["barriers"] = v.groups
            half.update(rounding("split"))      # (as rp.remat's options)
            half["host_copy_after_barrier"] = True    # (annotate-host-offload, c195506 on)
            half["loop_constants_inside"] = True      # (sink-loop-constants, 58d8aa4 on)
            half["fence_chains"] = fences_chains()
        if best is None or common.xla_peak(halves) < common.xla_peak(best[1]):
            best = (split, halves, v)
    if fences_chains() and any(CHAINS_FENCED in r for r in best[0].remarks):
        # (rp.jit's `_unfenced`: the smallest again without fence-chains, where it fenced)
        split, halves, v = best
        unfenced = rp.remat(module, policy, mode="split", tie_to_cotangent=v.tie,
                            levels=levels, barrier_groups=v.groups,
                            **rounding("split"))
        again = our_halves(unfenced, args)
        if each is not None:
            each(unfenced)
        if common.xla_peak(again) < common.xla_peak(halves):
            measured = set(again[0])      # (the rest says how it was built)
            for half, old in zip(again, halves):
                half.update({k: old[k] for k in old if k not in measured},
                            fence_chains=False)
            best = (unfenced, again, v)
    return best[0], best[1], best[2].tie


def measure(keys=tuple(MODELS), log=print) -> dict:
    rows, sweeps = [], []
    tie = needs_tie()
    for key in keys:
        model = MODELS[key]()
        module = rp.export_vjp(model.build(_identity), *model.args)
        ct = jnp.ones_like(model.build(_identity)(*model.args))
        for case in cases_for(model):
            if case.kind not in ("whole", "plain"):
                continue
            split, halves, tied = our_split(module, case.our_policy, model.args)
            rows.append({"model": key, "policy": case.label, "short": case.short,
                         "ours": halves, "split_tied": tied,
                         "jax": jax_halves(jax_function(model, case), model.args),
                         "joint_ours": our_joint(module, case.our_policy, model.args, ct),
                         "joint_jax": _jax_joint(jax_function(model, case), model.args, ct),
                         "activations": activation_bytes(split.residuals)})
            log(f"xla: {key} {case.short}")
        lo, hi = rp.bounds(module)
        points = []
        for k in range(SWEEP_POINTS):
            b = int(lo + (hi - lo) * k / (SWEEP_POINTS - 1))
            split, halves, tied = our_split(module, rp.policies.auto(b), model.args)
            points.append({"budget": b, "halves": halves, "split_tied": tied,
                           "activations": activation_bytes(split.residuals),
                           "levels": 2 if any("recomputed in two levels" in r
                                              for r in split.remarks) else 1})
            if points[-1]["levels"] == 2:     # (did the second level pay on this backend?)
                points[-1]["one_level_peak"] = common.xla_peak(our_split(
                    module, rp.policies.auto(b), model.args, levels="1")[1])
        sweeps.append({"model": key, "points": points})
        log(f"xla: {key} sweep of {SWEEP_POINTS} budgets")
    meta = dict(common.machine(), device=jax.devices()[0].device_kind)
    return {"meta": meta, "tie_to_cotangent": tie, "rows": rows, "sweeps": sweeps}


def measure_monotone(data: dict, keys, rule: str = "larger", log=print) -> dict:
    """`xla --monotone`: the stored results with, at each sweep budget of the models `keys`,
    the plan of `auto(b, monotone=rule)` measured as the sweep's own (activations, XLA's
    halves, whether it took another budget's plan), the rule and the commit it was
    measured at."""
    out = dict(data, sweeps=[dict(s) for s in data["sweeps"]])
    for s in out["sweeps"]:
        if s["model"] not in keys:
            continue
        model = MODELS[s["model"]]()
        module = rp.export_vjp(model.build(_identity), *model.args)
        points = []
        for p in s["points"]:
            split, halves, tied = our_split(module, rp.policies.auto(p["budget"],
                                                                     monotone=rule),
                                            model.args)
            took = any(f"monotone={rule}): its plan would peak at" in r and
                       "planned at residual budget" in r for r in map(str, split.remarks))
            points.append(dict(p, monotone={"activations": activation_bytes(split.residuals),
                                            "halves": halves, "split_tied": tied,
                                            "other_budgets_plan": took}))
        s["points"] = points
        s["monotone_commit"] = common.git_commit()
        s["monotone_rule"] = rule
        log(f"xla: {s['model']} sweep with monotone={rule}")
    return out


def measure_peak(data: dict, keys, log=print, compiled: bool = False) -> dict:
    """`xla --peak`: the stored results with, for each model of `keys`, `auto(b,
    objective=peak)` at `SWEEP_POINTS` peak budgets from the lowest joint peak estimate of
    the plans at 13 residual budgets (the trial budgets objective=peak weighs: the least a
    plan can keep to no remat) to no remat's: XLA's footprint of the joint form as rp.jit
    builds it (what objective=peak bounds, through its estimate), of the split form's larger
    half, the estimate and the activations kept, at this commit. `compiled` (`--compiled`):
    at each budget also `auto(b, objective=peak, score=xla)`, which weighs its trial plans
    by XLA's footprint of each compiled (its point's "compiled": the same figures, or the
    error where no compiled trial fits); without it, the stored sweep's are kept where its
    budgets are the same (with the commit they were measured at, "compiled_commit")."""
    tie = needs_tie()
    stored = {s["model"]: s for s in data.get("peak_sweeps", [])}
    sweeps = [s for s in data.get("peak_sweeps", []) if s["model"] not in keys]
    for key in keys:
        model = MODELS[key]()
        module = rp.export_vjp(model.build(_identity), *model.args)
        ct = jnp.ones_like(model.build(_identity)(*model.args))
        lo, hi = rp.bounds(module)

        def estimate(policy):
            joint = rp.remat(module, policy, tie_to_cotangent=tie, fence_chains=fences_chains(),
                             **rounding("joint"))
            return int(estimate_memory(joint, model="xla")["main"].peak_bytes)
        low = min(estimate(rp.policies.auto(int(lo + (hi - lo) * k / 12))) for k in range(13))
        high = estimate(None)
        def point(b, score):
            policy = rp.policies.auto(b, objective="peak", score=score)
            try:
                joint = our_joint(module, policy, model.args, ct)
                split, halves, tied = our_split(module, policy, model.args)
            except rp.RematError as e:
                return {"budget": b, "error": str(e)}
            return {"budget": b, "joint": joint, "halves": halves, "split_tied": tied,
                    "activations": activation_bytes(split.residuals)}
        points = []
        for b in sorted({int(low + (high - low) * k / (SWEEP_POINTS - 1))
                         for k in range(SWEEP_POINTS)}):    # (one where low is high: mlp)
            points.append(point(b, "model"))
            if compiled:
                points[-1]["compiled"] = point(b, "xla")
        sweep = {"model": key, "commit": common.git_commit(), "points": points,
                 "checked": True}     # (objective=peak checks its plan against XLA)
        if compiled:
            sweeps.append(sweep)
        else:
            sweeps.append(_with_stored_compiled(sweep, stored.get(key)))
        log(f"xla: {key} sweep of {SWEEP_POINTS} peak budgets (objective=peak)")
    return dict(data, peak_sweeps=_in_sweep_order(sweeps, data))


def _with_stored_compiled(sweep: dict, old: dict | None) -> dict:
    """`sweep` with the score=xla points of `old` (the stored sweep of the same model),
    where both have the same budgets."""
    if old is None or [p["budget"] for p in old["points"]] != \
            [p["budget"] for p in sweep["points"]] or \
            not all("compiled" in p for p in old["points"]):
        return sweep
    for p, q in zip(sweep["points"], old["points"]):
        p["compiled"] = q["compiled"]
    return dict(sweep, compiled_commit=old.get("compiled_commit", old["commit"]))


def _in_sweep_order(peak_sweeps, data) -> list:
    """`peak_sweeps` in the order of `data`'s sweeps (models it has none of last)."""
    order = [s["model"] for s in data["sweeps"]]
    return sorted(peak_sweeps, key=lambda s: order.index(s["model"]) if s["model"] in order
                  else len(order))


_TWIN_KEYS = ("monotone_commit", "monotone_rule")   # what a sweep says of its twins


def merge_monotone(stored: dict, part: dict) -> dict:
    """`xla --merge-monotone-from`: the stored results with the monotone twins a part
    measured (a copy of the stored results that `xla --monotone --models KEY` added to, as
    device_round.sh's MONOTONE jobs hand them back). A part's sweep is taken where its
    twin differs from the stored one (its points, rule or commit); the sweep's own points
    and rows stay the stored ones. The budgets have to be the stored sweep's."""
    out = dict(stored, sweeps=[dict(s) for s in stored["sweeps"]])
    by_model = {s["model"]: s for s in out["sweeps"]}
    for s in part["sweeps"]:
        t = by_model.get(s["model"])
        if t is None or not all("monotone" in p for p in s["points"]):
            continue
        if [p["monotone"] for p in s["points"]] == [p.get("monotone") for p in t["points"]] \
                and all(s.get(k) == t.get(k) for k in _TWIN_KEYS):
            continue
        if [p["budget"] for p in s["points"]] != [p["budget"] for p in t["points"]]:
            raise ValueError(f"{s['model']}: the part's sweep budgets are not the stored ones")
        t.update(_twins_of(s, into=t))
    return out


def _twins_of(source: dict, into: dict) -> dict:
    """Sweep `into` with the monotone twins (and their rule and commit) of `source`, a sweep
    of the same budgets."""
    return dict(into, points=[dict(p, monotone=q["monotone"])
                              for p, q in zip(into["points"], source["points"])],
                **{k: source[k] for k in _TWIN_KEYS if k in source})


def merge_peak(stored: dict, part: dict) -> dict:
    """`xla --merge-peak-from`: the stored results with the objective=peak sweeps a part
    measured (a copy of the stored results that `xla --peak --models KEY` added to, as
    device_round.sh's PEAK jobs hand them back): each of the part's sweeps takes the place
    of its model's; every other figure stays."""
    sweeps = {s["model"]: s for s in stored.get("peak_sweeps", [])}
    sweeps.update((s["model"], s) for s in part.get("peak_sweeps", []))
    return dict(stored, peak_sweeps=_in_sweep_order(sweeps.values(), stored))


def monotone_rule(sweep) -> str:
    """The rule a sweep's monotone twin was measured with (those measured before there
    were two took a smaller budget's plan)."""
    return sweep.get("monotone_rule", "smaller")


def _took_another(m) -> bool:
    return m.get("other_budgets_plan", m.get("smaller_budgets_plan", False))


def results_name(backend: str) -> str:
    """The results file of a run on `backend` with the installed jax: `xla` for XLA:CPU of
    the oldest supported jaxlib (0.10, CI's first leg; the figures `--print-memory` quotes),
    `xla_cpu_jax0_12` (and so on) for a later one, whose XLA:CPU differs (it keeps
    optimization barriers through fusion and scheduling: jax_compat), and
    `xla_gpu` on a GPU."""
    if backend != "cpu":
        return f"xla_{backend}"
    if jax_compat.xla_cpu_fuses_across_barriers():
        return "xla"
    return "xla_cpu_jax" + "_".join(jax.__version__.split(".")[:2])


def read_parts(paths) -> list[dict]:
    """The results in `paths`: JSON files of `xla` runs, or archives (.tgz) holding them (as
    `device_round.sh --parallel` hands them back), in the order given. In an archive, a
    results file under a folder `RUN_KEY/` (device_round.sh's copy of the tree for model
    KEY) keeps only KEY's figures: the MONOTONE and PEAK runs add to a copy of every
    stored result, and the other models' stale copies would undo what an earlier part
    brought."""
    import json
    import tarfile
    parts = []
    for path in paths:
        if str(path).endswith((".tgz", ".tar.gz")):
            try:
                with tarfile.open(path) as tar:
                    for member in sorted(tar.getmembers(), key=lambda m: m.name):
                        if member.isfile() and member.name.endswith(".json"):
                            part = json.load(tar.extractfile(member))
                            parts.append(_own_model_only(part, member.name.split("/")[0]))
            except tarfile.TarError as e:
                raise ValueError(f"{path}: {e}") from None
        else:
            with open(path) as f:
                parts.append(json.load(f))
    for p in parts:
        if not isinstance(p, dict) or "rows" not in p or "backend" not in p.get("meta", {}):
            raise ValueError("not the results of `python -m tools.benchmarks xla`")
    return parts


def _own_model_only(part, folder: str):
    """`part` with only the figures of the model whose key ends `folder` (`mono_gpt-scan`:
    gpt-scan), where one does; else `part` as it is."""
    if not isinstance(part, dict):
        return part
    models = {x.get("model") for key in ("rows", "sweeps", "peak_sweeps")
              for x in part.get(key, []) if isinstance(x, dict)}
    own = [m for m in models if m and folder.endswith("_" + m)]
    if len(own) != 1:
        return part
    return dict(part, **{key: [x for x in part[key] if x.get("model") == own[0]]
                         for key in ("rows", "sweeps", "peak_sweeps") if key in part})


def merge(stored: dict | None, new: dict, log=None) -> dict:
    """`xla --merge`: the stored results with the rows and sweeps of the models `new`
    measured replaced by its own (in the stored order, new models last). `meta["measured"]`
    keeps each model's commit and device; where they differ, the meta's commit and device
    say which models were measured at which. A stored sweep's monotone twins (`xla
    --monotone`, which a plain run does not measure) stay where the new sweep measured
    every point as the stored one did (`_same_sweep`: the twins were measured beside those
    programs); elsewhere they go, and `log` says so."""
    if not stored or stored["meta"].get("backend") != new["meta"]["backend"]:
        return new
    models = {r["model"] for r in new["rows"]} | {s["model"] for s in new["sweeps"]}
    out = dict(stored, meta=dict(new["meta"]))
    out["rows"] = [r for r in stored["rows"] if r["model"] not in models] + new["rows"]
    old_sweeps = {s["model"]: s for s in stored["sweeps"]}
    out["sweeps"] = [s for s in stored["sweeps"] if s["model"] not in models] + [
        _with_twins(s, old_sweeps.get(s["model"]), log) for s in new["sweeps"]]
    order = list(dict.fromkeys([r["model"] for r in stored["rows"]] +
                               [r["model"] for r in new["rows"]]))
    out["rows"].sort(key=lambda r: order.index(r["model"]))
    out["sweeps"].sort(key=lambda s: order.index(s["model"]))
    if new.get("peak_sweeps"):    # (a run of `xla` alone measures none: the stored stay)
        out = merge_peak(out, new)
    before = stored["meta"].get("measured") or {m: _measured(stored["meta"]) for m in order}
    measured = {m: _measured(new["meta"]) if m in models else before[m] for m in order}
    out["meta"]["measured"] = measured
    for f in ("commit", "device", "estimates_commit"):
        groups: dict = {}
        for m in order:
            groups.setdefault(measured[m].get(f), []).append(m)
        if len(groups) > 1:
            out["meta"][f] = "; ".join(f"{v} for {', '.join(ms)}" for v, ms in groups.items())
    if all(measured[m].get("estimates_commit") == measured[m].get("commit") for m in order):
        out["meta"].pop("estimates_commit", None)      # (none made again)
    elif len({measured[m].get("estimates_commit") for m in order}) == 1:
        out["meta"]["estimates_commit"] = measured[order[0]]["estimates_commit"]
    return out


def _same_sweep(a: dict, b: dict) -> bool:
    """Two measurements of a model's sweep found the same: the same budgets, and at each
    the same plan (activations kept) and the same XLA figures of its halves."""
    def figures(s):
        return [(p["budget"], p.get("activations"), p.get("halves")) for p in s["points"]]
    return figures(a) == figures(b)


def _with_twins(new: dict, old: dict | None, log) -> dict:
    """`new`, a sweep a plain run measured, with `old`'s monotone twins where `_same_sweep`."""
    if old is None or not old["points"] or not all("monotone" in p for p in old["points"]):
        return new
    if not _same_sweep(new, old):
        if log:
            log(f"xla: {new['model']}: its sweep measured differently; its monotone "
                f"twins ({monotone_rule(old)}) are dropped: measure them again "
                f"(xla --monotone --models {new['model']})")
        return new
    return _twins_of(old, into=new)


def _old_offload_program(row: dict) -> bool:
    """An offload policy's row measured before annotate-host-offload made the copy back to
    the device after the barrier holding the host value (c195506): its program is not the
    one the passes build now."""
    return "offload" in row.get("policy", "") and not row["ours"][0].get(
        "host_copy_after_barrier")


# The models whose programs sink-loop-constants changed when it came (58d8aa4; of the
# benchmark models, only the scanned GPT's loops carry a constant: its causal mask).
CHANGED_BY_SINKING = ("gpt-scan",)


def _before_loop_constants(row: dict) -> bool:
    """A row of CHANGED_BY_SINKING measured before sink-loop-constants: its program is not
    the one the passes build now."""
    return row["model"] in CHANGED_BY_SINKING and \
        not row["ours"][0].get("loop_constants_inside")


def _provenance_text(data: dict) -> str:
    """The page's sentences on which rows predate rp.jit's GPU rounding of read-back
    residuals, and which models' estimates were made again (`--re-estimate`), per model:
    a results file merged from pieces can mix both."""
    meta, text = data["meta"], ""
    unrounded = [m for m in dict.fromkeys(r["model"] for r in data["rows"])
                 if not any(r["ours"][0].get("round_read_back")
                            for r in data["rows"] if r["model"] == m)]
    if meta["backend"] == "gpu" and unrounded:
        which = "The split rows" if len(unrounded) == len(
            {r["model"] for r in data["rows"]}) else f"The split rows of {', '.join(unrounded)}"
        text += (f" {which} were measured before rp.jit rounded, on a GPU, the f32 residuals "
                 "the backward only reads back (`round_read_back`, as jax.checkpoint does); "
                 "the next run on the device measures that.")
    models = list(dict.fromkeys(r["model"] for r in data["rows"]))
    run = [m for m in models if all(r["ours"][0].get("arguments_to_backward")
                                    for r in data["rows"] if r["model"] == m)]
    if run:
        rest = [m for m in models if m not in run]
        text += (f" The split halves of {', '.join(run)} are measured as rp.jit runs them: "
                 "the forward does not return the residuals that are the function's own "
                 "arguments, and the backward is given them as they are (JAX's forward "
                 "returns them, so its footprint counts them among its outputs as well as "
                 "its arguments)" + (f"; those of {', '.join(rest)} were measured before "
                                     "(e1ee82f), with them returned" if rest else "") + ".")
    if meta["backend"] == "cpu":
        unrounded = [m for m in models if all(r["ours"][0].get("round_exact") is False
                                              for r in data["rows"] if r["model"] == m)]
        rest = [m for m in models if m not in unrounded]
        if unrounded:
            text += (f" {', '.join(unrounded)}: no f32 residual rounded, as rp.jit builds on "
                     "XLA:CPU since 8d13fe1 (`round_exact=False`)" + (
                         f"; {', '.join(rest)} measured before, with them rounded"
                         if rest else "") + ".")
        else:
            text += (" Measured before rp.jit stopped rounding f32 residuals on XLA:CPU "
                     "(8d13fe1): with them rounded.")
    changed = ((_old_offload_program,
                "The offload rows of {} were measured before annotate-host-offload made the "
                "copy back to the device after the optimization barrier that holds the host "
                "value (as JAX does)"),
               (_before_loop_constants,
                "The rows of {} were measured before sink-loop-constants built the constants "
                "a loop carries unchanged inside the loop (the causal mask: on CPU, 61,440 B "
                "less temp in each half)"))
    for test, sentence in changed:
        models = [m for m in dict.fromkeys(r["model"] for r in data["rows"])
                  if any(test(r) for r in data["rows"] if r["model"] == m)]
        if meta["backend"] == "gpu" and models:
            text += (" " + sentence.format(", ".join(models)) + "; their programs have "
                     "changed since, so their estimates are not made again; the next run on "
                     "the device measures them.")
    if meta["backend"] == "gpu" and any("offload" in r.get("policy", "") for r in data["rows"]):
        text += (" XLA:GPU's figures for a program with host offload vary from one process to "
                 "the next, JAX's own as much as ours (jax 0.11.2, H200s, 2026-11-27: JAX's "
                 "split backward of equinox under `offload_dot_with_no_batch_dims` needed "
                 "3,613,800, 3,875,944 and 4,351,080 B of temp in four processes, ours "
                 "3,293,256 B in three; JAX's GPT joint under "
                 "`save_and_offload_only_these_names` 12,590,760, 14,163,624 and "
                 "15,735,464 B): read an offload row's ratio as one draw, its estimate error "
                 "against a moving figure.")
    unconsidered = [m for m in dict.fromkeys(r["model"] for r in data["rows"]) if any(
        "rounding_considered" not in r.get("joint_ours", {"rounding_considered": 1})
        for r in data["rows"] if r["model"] == m)]
    if unconsidered:
        text += (f" The joint rows of {', '.join(unconsidered)} were measured before rp.jit "
                 "also built the joint form with its residuals rounded where nothing is "
                 "recomputed (and ran the smaller): theirs is the unrounded program's figure, "
                 "an upper bound of what rp.jit runs now.")
    measured = meta.get("measured") or {}
    again = {m: v["estimates_commit"] for m, v in measured.items()
             if v.get("estimates_commit") and v["estimates_commit"] != v.get("commit")}
    if not measured and meta.get("estimates_commit"):
        again = {None: meta["estimates_commit"]}
    if again:
        groups: dict = {}
        for m, c in again.items():
            groups.setdefault(c, []).append(m)
        at = "; ".join(f"at {c}" + (f" for {', '.join(ms)}" if None not in ms and
                                    len(again) < len(measured) else "")
                       for c, ms in groups.items())
        text += (f" The estimates were made again {at} from the same exports "
                 "(`--re-estimate`: the estimate is static, XLA's figures are the measured "
                 "ones).")
    return text


def _measured(meta: dict) -> dict:
    """What `merge` keeps per model: the commit and device it was measured at, and the
    commit its estimates were made at (`--re-estimate`; else the measuring one)."""
    return {"commit": meta.get("commit"), "device": meta.get("device"),
            "estimates_commit": meta.get("estimates_commit", meta.get("commit"))}


def reestimate(data: dict, log=print) -> dict:
    """`xla --re-estimate`: the stored results with the `xla` estimate of every row (split
    halves and joint) made again by this checkout, for the backend they were measured on;
    XLA's figures are kept. The estimate is static: rebuilt from the same export with the
    grouping and tie each row records, it is what a run on that device would compute now,
    so a change to the memory model is checked against a device's measurements without the
    device. The export must be the measured one: the jax version has to match."""
    import jax
    meta = data["meta"]
    if meta.get("jax") != jax.__version__:
        raise SystemExit(f"error: the results were measured with jax {meta.get('jax')}, this "
                         f"is jax {jax.__version__}: the exported programs may differ; "
                         f"re-estimate with jax {meta.get('jax')}")
    backend = meta["backend"]
    for key in dict.fromkeys(r["model"] for r in data["rows"]):
        model = MODELS[key]()
        module = rp.export_vjp(model.build(_identity), *model.args)
        cases = {c.short: c for c in cases_for(model)}
        for r in (r for r in data["rows"] if r["model"] == key):
            if backend != "cpu" and (_old_offload_program(r) or _before_loop_constants(r)):
                continue    # measured on a program built differently (see _provenance_text)
            policy = cases[r["short"]].our_policy
            split = rp.remat(module, policy, mode="split", tie_to_cotangent=r["split_tied"],
                             barrier_groups=r["ours"][0].get("barriers", "per-use"),
                             round_read_back=r["ours"][0].get("round_read_back", False),
                             round_exact=r["ours"][0].get("round_exact", True),
                             fence_chains=r["ours"][0].get("fence_chains", False))
            if r["ours"][0].get("arguments_to_backward"):
                split = as_run(split)[0]          # (as measured: see our_halves)
            est = estimate_memory(split, model="xla", backend=backend)
            order = estimate_memory(split)
            for half, name in zip(r["ours"], ("main_fwd", "main_bwd")):
                half["estimate"] = int(est[name].peak_bytes)
                half["estimate_program_order"] = int(order[name].peak_bytes)
            joint = rp.remat(module, policy, tie_to_cotangent=needs_tie(backend),
                             barrier_groups=r["joint_ours"].get("barriers", "per-use"),
                             round_read_back=r["joint_ours"].get("round_read_back", False),
                             round_exact=r["joint_ours"].get("round_exact", True),
                             fence_chains=r["joint_ours"].get("fence_chains", False))
            r["joint_ours"]["estimate"] = int(
                estimate_memory(joint, model="xla", backend=backend)["main"].peak_bytes)
            r["joint_ours"]["estimate_program_order"] = int(
                estimate_memory(joint)["main"].peak_bytes)
        log(f"xla: {key} re-estimated")
    commit = common.git_commit()
    data["meta"]["estimates_commit"] = commit
    for m in data["meta"].get("measured", {}).values():
        m["estimates_commit"] = commit
    return data


def _groups_text(data, joint: bool = False) -> str:
    """Where XLA keeps barriers: which groupings the stored rows were built with."""
    if any("barriers" in (r["joint_ours"] if joint else r["ours"][0]) for r in data["rows"]):
        return (", as rp.jit makes it here: with one barrier per recomputation and one per "
                "checkpoint region, the one with the smaller footprint (marked ‡ where that "
                "is per region)")
    return (", one barrier per recomputation: measured before this benchmark built the "
            "per-region grouping beside it, as rp.jit does on this backend (the barriers "
            "section below has both)")


def _ratio(a: int, b: int) -> float:
    return a / b if b else (1.0 if a == 0 else float("inf"))


def _fewer_residuals(r, i: int) -> str:
    """Where our half holds fewer residual bytes than JAX's (the forward's outputs, the
    backward's arguments), a value JAX returns can be scratch in ours: say so, with the
    footprints, beside a temp figure."""
    side = "out" if i == 0 else "args"
    fewer = r["jax"][i][side] - r["ours"][i][side]
    if fewer <= 0:
        return ""
    a, b = common.xla_footprint(r["ours"][i]), common.xla_footprint(r["jax"][i])
    return (f" (ours holds {fewer:,} B fewer residuals; footprint {a:,} B vs {b:,} B, "
            f"{_ratio(a, b):.2f}x)")


def _render_peak_sweeps(data) -> list[str]:
    """The objective=peak sweeps (`xla --peak`), where measured."""
    if not data.get("peak_sweeps"):
        return []
    parts = ["", f"`auto(budget=b, objective=peak)` (`xla --peak`) along {SWEEP_POINTS} peak "
             "budgets from the lowest joint peak estimate of the plans at its 13 trial "
             "residual budgets to no remat's: the joint form's estimate "
             "(`rp.estimate_memory(joint, model='xla')`, what objective=peak keeps within "
             "the budget; in the sweeps marked §, measured since 3410fa6, its plan is then "
             "checked against XLA's footprint of it compiled: see "
             "[policies.md](policies.md)), the activations the plan keeps, XLA's footprint "
             "of the joint form "
             "as rp.jit builds it (and against the budget) and of the split form's larger "
             "half.", "",
             "| model | peak budget | estimate | activations | XLA joint footprint | "
             "XLA split footprint |", "|---|---:|---:|---:|---:|---:|"]
    for s in data["peak_sweeps"]:
        first = f" (at {s['commit']}{', §' if s.get('checked') else ''})"
        for p in s["points"]:
            parts.append(f"| {s['model']}{first} | {p['budget']:,} | " + _peak_cells(p, True))
            first = ""
    compiled = [s for s in data["peak_sweeps"] if all("compiled" in p for p in s["points"])]
    if compiled:
        parts += ["", "The same budgets with `auto(budget=b, objective=peak, score=xla)` "
                  "(`xla --peak --compiled`), which weighs each trial plan by XLA's footprint "
                  "of its joint program compiled instead of the estimate (see "
                  "[policies.md](policies.md)): the activations the plan keeps, XLA's "
                  "footprint of the joint form as rp.jit builds it (and against the budget) "
                  "and of the split form's larger half; where no compiled trial plan fits "
                  "the budget, the error it gives.", "",
                  "| model | peak budget | activations | XLA joint footprint | "
                  "XLA split footprint |", "|---|---:|---:|---:|---:|"]
        for s in compiled:
            first = f" (at {s.get('compiled_commit', s['commit'])})"
            for p in s["points"]:
                parts.append(f"| {s['model']}{first} | {p['budget']:,} | "
                             + _peak_cells(p["compiled"], False))
                first = ""
    return parts


def _peak_cells(p: dict, estimate: bool) -> str:
    """The cells of one objective=peak point after its budget (`estimate`: with the joint
    form's estimate)."""
    if "error" in p:
        return f"{p['error']} |" + " |" * (3 if estimate else 2)
    fp = common.xla_footprint(p["joint"])
    return ((f"{p['joint']['estimate']:,} | " if estimate else "")
            + f"{p['activations']:,} | {fp:,} ({fp / p['budget']:.2f}) | "
            f"{common.xla_peak(p['halves']):,} |")


def _worst_rise(peaks: list) -> float:
    """Along a sweep (budgets rising), the most a footprint exceeds that of any larger
    budget, as a ratio (1.0: never)."""
    return max((peaks[k] / min(peaks[k + 1:]) for k in range(len(peaks) - 1)), default=1.0)


def checks(data) -> list[tuple[str, bool]]:
    """Temp bytes of each half <= JAX's + 2%; the joint form's footprint <= JAX's + 2%;
    XLA's footprint never rises as the budget falls (+2%); the estimate within 15% of XLA's
    footprint of each half."""
    out = []
    for r in data["rows"]:
        for i, half in enumerate(("fwd", "bwd")):
            ours, theirs = r["ours"][i]["temp"], r["jax"][i]["temp"]
            out.append((f"{r['model']} {r['short']} {half}: temp {ours:,} B vs JAX's "
                        f"{theirs:,} B" + _fewer_residuals(r, i), ours <= theirs * TEMP_SLACK))
            fp = common.xla_footprint(r["ours"][i])
            err = abs(r["ours"][i]["estimate"] - fp) / fp if fp else 0.0
            out.append((f"{r['model']} {r['short']} {half}: estimate off XLA's footprint by "
                        f"{err:.0%}", err <= ESTIMATE_TOLERANCE))
    for r in data["rows"]:
        if "joint_ours" not in r:
            continue
        ours, theirs = (common.xla_footprint(r[k]) for k in ("joint_ours", "joint_jax"))
        out.append((f"{r['model']} {r['short']} joint: footprint {ours:,} B vs JAX's "
                    f"{theirs:,} B", ours <= theirs * TEMP_SLACK))
        if "estimate" in r["joint_ours"] and ours:
            err = abs(r["joint_ours"]["estimate"] - ours) / ours
            out.append((f"{r['model']} {r['short']} joint: estimate off XLA's footprint by "
                        f"{err:.0%}", err <= ESTIMATE_TOLERANCE))
    for s in data["sweeps"]:
        forms = [("", [p["halves"] for p in s["points"]])]
        if all("monotone" in p for p in s["points"]):
            forms.append((f" (monotone={monotone_rule(s)})",
                          [p["monotone"]["halves"] for p in s["points"]]))
        for label, halves in forms:
            worst = _worst_rise([common.xla_peak(h) for h in halves])
            out.append((f"{s['model']} sweep{label}: XLA footprint at a budget at most "
                        f"{worst:.3f}x that of any larger budget", worst <= TEMP_SLACK))
    for s in data.get("peak_sweeps", []):
        points = [p for p in s["points"] if "error" not in p]
        out += [(f"{s['model']} objective=peak at {p['budget']:,} B: {p['error']}", False)
                for p in s["points"] if "error" in p]
        for label, peaks in (("joint", [common.xla_footprint(p["joint"]) for p in points]),
                             ("split", [common.xla_peak(p["halves"]) for p in points])):
            worst = _worst_rise(peaks)
            out.append((f"{s['model']} objective=peak sweep, {label}: XLA footprint at a "
                        f"budget at most {worst:.3f}x that of any larger budget",
                        worst <= TEMP_SLACK))
        over = max((common.xla_footprint(p["joint"]) / p["budget"] for p in points),
                   default=0.0)
        out.append((f"{s['model']} objective=peak sweep: XLA's joint footprint at most "
                    f"{over:.3f}x the peak budget", over <= 1 + ESTIMATE_TOLERANCE))
        fitted = [p["compiled"] for p in s["points"]
                  if "compiled" in p and "error" not in p["compiled"]]
        if fitted:
            # score=xla: what XLA allocates within the budget, never rising; a budget below
            # every compiled trial is refused (an error), not missed
            joint = [common.xla_footprint(p["joint"]) for p in fitted]
            worst = _worst_rise(joint)
            out.append((f"{s['model']} objective=peak score=xla sweep, joint: XLA footprint "
                        f"at a budget at most {worst:.3f}x that of any larger budget",
                        worst <= TEMP_SLACK))
            over = max((f / p["budget"] for f, p in zip(joint, fitted)), default=0.0)
            out.append((f"{s['model']} objective=peak score=xla sweep: XLA's joint footprint "
                        f"at most {over:.3f}x the peak budget", over <= 1))
    return out


def render(data, title: str = "Memory as XLA allocates it") -> str:
    meta = data["meta"]
    parts = [f"## {title}", "",
             "XLA's `memory_analysis()` of each split half on the "
             f"{meta['backend']} backend ({meta['cpus']} CPUs, jax {meta['jax']}, commit "
             f"{meta['commit']}): ours (`rp.remat(..., mode='split')`"
             + (", as rp.jit makes it on CPU: with the recomputation tied to the cotangent "
                "and without, the one with the smaller footprint (marked † where that is the "
                "untied one)" + (" and, on this jaxlib, with one barrier per recomputation "
                                 "and one per checkpoint region (marked ‡ where per region)"
                                 if any(r["ours"][0].get("barriers") == "per-region"
                                        for r in data["rows"]) else "")
                if data.get("tie_to_cotangent") else _groups_text(data))
             + ") beside JAX's split of "
             "`jax.checkpoint(model, policy)` (`jax.vjp`, forward and backward jitted "
             "separately). **temp** is XLA's scratch buffer; **footprint** = temp + arguments "
             "+ outputs - aliased; **estimate error** is that of `rp.estimate_memory(split, "
             "model='xla')` of the half against XLA's footprint (in parentheses: the default "
             "program-order model's). Regenerate with `python -m tools.benchmarks xla`"
             + (" on the device (all models at once: `bash tools/benchmarks/device_round.sh "
                "--parallel`, then `xla --merge-from` of what it hands back)"
                if meta["backend"] != "cpu" else "") + "."
             + (f" XLA flags: `{meta['xla_flags']}`." if meta.get("xla_flags") else "")
             + _provenance_text(data),
             ""]
    probe = ynn_probe.render(data.get("ynn_probe", {}))
    if probe:
        parts += [probe, ""]
    parts += ["| model | policy | fwd temp ours / JAX | bwd temp ours / JAX | fwd footprint "
             "ours / JAX | bwd footprint ours / JAX | estimate error fwd / bwd |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in data["rows"]:
        o, j = r["ours"], r["jax"]
        cells = []
        for i in (0, 1):
            cells.append(f"{o[i]['temp']:,} / {j[i]['temp']:,} "
                         f"({_ratio(o[i]['temp'], j[i]['temp']):.2f})")
        for i in (0, 1):
            a, b = common.xla_footprint(o[i]), common.xla_footprint(j[i])
            cells.append(f"{a:,} / {b:,} ({_ratio(a, b):.2f})")
        errs = []
        for i in (0, 1):
            fp = common.xla_footprint(o[i])
            errs.append(f"{(o[i]['estimate'] - fp) / fp:+.0%} "
                        f"({(o[i]['estimate_program_order'] - fp) / fp:+.0%})")
        cells.append(" / ".join(errs))
        mark = " †" if data.get("tie_to_cotangent") and r.get("split_tied") is False else ""
        mark += " ‡" if o[0].get("barriers") == "per-region" else ""
        parts.append(f"| {r['model']} | `{r['policy']}`{mark} | " + " | ".join(cells) + " |")
    tie = data.get("tie_to_cotangent")
    parts += ["", "The joint form, one program: XLA's footprint of ours (`rp.remat(..., "
              f"mode='joint'{', tie_to_cotangent=True' if tie else ''})`"
              + (", as `rp.jit` builds it on this backend" if tie else _groups_text(data, True))
              + ") beside `jax.jit` of `jax.vjp` of `jax.checkpoint(model, "
              "policy)`" + (". XLA:CPU deletes optimization barriers before it schedules, "
                            "so JAX's recomputation is undone here and its joint program "
                            "needs what no remat needs; the tie keeps ours where the plan "
                            "put it." if tie else ".") + " The estimate error is that of "
              "`rp.estimate_memory(joint, model='xla')` against XLA's footprint (in "
              "parentheses: the program-order model's)."
              + (" Where the plan recomputes nothing, rp.jit also builds it with the "
                 "residuals rounded to their own type, as jax.checkpoint rounds them, and runs "
                 "the smaller (marked § where that is the rounded one)."
                 if any(r.get("joint_ours", {}).get("round_read_back") for r in data["rows"])
                 else ""), "",
              "| model | policy | joint footprint ours / JAX | estimate error |",
              "|---|---|---:|---:|"]
    for r in data["rows"]:
        if "joint_ours" in r:
            a, b = (common.xla_footprint(r[k]) for k in ("joint_ours", "joint_jax"))
            o = r["joint_ours"]
            mark = (" ‡" if o.get("barriers") == "per-region" else "") + \
                (" §" if o.get("round_read_back") else "")
            err = (f"{(o['estimate'] - a) / a:+.0%} ({(o['estimate_program_order'] - a) / a:+.0%})"
                   if "estimate" in o and a else "")
            parts.append(f"| {r['model']} | `{r['policy']}`{mark} | {a:,} / {b:,} "
                         f"({_ratio(a, b):.2f}) | {err} |")
    mono = any("monotone" in p for s in data["sweeps"] for p in s["points"])
    parts += ["", f"`auto(budget=b)` along {SWEEP_POINTS} budgets from the least a plan can "
              "keep to no remat: activation bytes kept, the levels of recomputation "
              "remat-partial-eval chose (two where they lower the peak estimate by 15%, see "
              "[passes.md](passes.md#two-levels-of-recomputation); `-`: measured before it "
              "chose; beside a 2, XLA's footprint of the same budget's plan in one level, "
              "where measured) and XLA's footprint of the larger half."
              + (" Beside them, `auto(budget=b, monotone=rule)` (`xla --monotone`, with "
                 "the rule and at the commit a model's first row names; see "
                 "[policies.md](policies.md#auto)): the activations it keeps (* where it "
                 "took another budget's plan: a larger one's by the rule `larger`, a smaller "
                 "one's by `smaller`) and XLA's footprint." if mono else ""), "",
              "| model | budget | activations | levels | XLA footprint |"
              + (" monotone: activations | XLA footprint |" if mono else ""),
              "|---|---:|---:|---:|---:|" + ("---:|---:|" if mono else "")]
    for s in data["sweeps"]:
        first = True
        for p in s["points"]:
            held = ""
            if mono:
                m = p.get("monotone")
                held = " |" if m is None else (
                    f" {m['activations']:,}{' *' if _took_another(m) else ''} | "
                    f"{common.xla_peak(m['halves']):,} |")
            at = f" (monotone={monotone_rule(s)} at {s['monotone_commit']})" \
                if first and "monotone_commit" in s else ""
            first = False
            parts.append(f"| {s['model']}{at} | {p['budget']:,} | {p['activations']:,} | "
                         f"{p.get('levels', '-')}"
                         + (f" (1 level: {p['one_level_peak']:,})" if "one_level_peak" in p
                            else "") + f" | {common.xla_peak(p['halves']):,} |{held}")
    parts += _render_peak_sweeps(data)
    results = checks(data)
    missed = [text for text, ok in results if not ok]
    parts += ["", f"Checks: {len(results) - len(missed)} of {len(results)} pass (temp bytes "
              f"of each half and the joint footprint at most JAX's + 2%, the `xla` estimate within "
              f"{ESTIMATE_TOLERANCE:.0%} of XLA's footprint, the footprint never rising as "
              "the budget falls"
              + (f", objective=peak's joint footprint within its budget + "
                 f"{ESTIMATE_TOLERANCE:.0%}" if data.get("peak_sweeps") else "")
              + "). Missed:", ""]
    parts += [f"- {text}" for text in missed] or ["- none"]
    return "\n".join(parts) + "\n"
