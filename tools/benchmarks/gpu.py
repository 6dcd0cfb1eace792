"""XLA's memory and step time of every plan beside `jax.checkpoint`, on the device JAX runs on
(made for a GPU: `python -m tools.benchmarks gpu` on the device machine).

For every benchmark model x every fixed policy (and `auto` at each fixed policy's own
activation bytes) x joint and split form: `rp.jit` of the model's gradient step
(`jax.value_and_grad` of the loss) beside `jax.jit(jax.value_and_grad(jax.checkpoint(
loss, policy)))`, JAX's own remat of the same policy. Per run: XLA's
`compiled.memory_analysis()` of each executable (temp, argument, output bytes, and the
peak where the backend reports one), the median step time of `--steps` steps after 3
warm-up steps (`block_until_ready`), and the loss (ours must equal JAX's).

Rows are appended to the JSON as they are measured, so a run that stops (the device
machine's 10-minute limit: `--time-limit`) is resumed by running the same command again:
rows already there are skipped. `--dry-run` is the CPU check of the harness itself (a tiny
MLP, one policy; `test_gpu_harness.py` runs it in CI).
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp

import remat_passes as rp
from remat_passes.core.residuals import activation_bytes
from tools.benchmarks import common
from tools.benchmarks.cases import cases_for, jax_function
from tools.benchmarks.models import MODELS, _identity, make_mlp

FORMS = ("joint", "split")


def _time(fn, args, steps: int) -> tuple[list, float]:
    for _ in range(3):
        out = jax.block_until_ready(fn(*args))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return times, float(jnp.asarray(jax.tree_util.tree_leaves(out)[0]).sum())


def _gradient_step(loss):
    def step(params, batch):
        return jax.value_and_grad(loss)(params, batch)
    return step


def _key(row) -> tuple:
    return (row["model"], row["policy"], row["who"], row["form"])


def runs(model, only=None):
    """(policy label, who, form, make): every run of one model; `make()` gives (the
    function to time, its executables)."""
    out = []
    params, batch = model.args
    for case in cases_for(model):
        if only is not None and case.short not in only:
            continue
        if case.kind == "layers":
            ours_loss = model.build(lambda fn: rp.checkpoint(fn))
            ours_policy = None
        else:
            ours_loss = model.build(_identity)
            ours_policy = case.our_policy
        for form in FORMS:
            def make(loss=ours_loss, policy=ours_policy, form=form):
                fn = rp.jit(_gradient_step(loss), policy=policy, mode=form)
                return fn, fn.lower(params, batch)
            out.append((case.label, "ours", form, make))
        if case.kind != "plain":
            def make_jax(case=case):
                fn = jax.jit(jax.value_and_grad(jax_function(model, case)))
                return fn, None
            out.append((case.label, "jax.checkpoint", "joint", make_jax))
        if case.kind == "whole" and "offload" not in case.label:
            for form in FORMS:       # auto at this policy's own activation bytes
                def make_auto(case=case, form=form, loss=ours_loss):
                    fixed = rp.jit(_gradient_step(loss), policy=case.our_policy,
                                   mode="split").lower(params, batch)
                    budget = activation_bytes(fixed.residuals)
                    fn = rp.jit(_gradient_step(loss), policy=f"auto(budget={budget})",
                                mode=form)
                    return fn, fn.lower(params, batch)
                out.append((f"auto at {case.label}", "ours", form, make_auto))
    return out


def measure(models=tuple(MODELS), only=None, steps: int = 20, path: Path | None = None,
            time_limit: float | None = None, log=print, dry_run: bool = False,
            retry_failed: bool = False) -> dict:
    """`retry_failed`: measure again the runs a previous run recorded as failed (after a
    fix), instead of keeping their failure."""
    path = Path(path or common.RESULTS / "gpu.json")
    data = json.loads(path.read_text()) if path.exists() else {
        "meta": common.machine(), "device": jax.devices()[0].device_kind,
        "backend": jax.default_backend(), "steps": steps, "rows": []}
    if retry_failed:
        data["rows"] = [r for r in data["rows"] if "error" not in r]
    done = {_key(r) for r in data["rows"]}
    start = time.perf_counter()
    chosen = {"mlp": lambda: make_mlp(batch=8, width=32, depth=2, d_in=16, d_out=8)} \
        if dry_run else {k: MODELS[k] for k in models}
    for key, make_model in chosen.items():
        model = make_model()
        args = model.args
        for label, who, form, make in runs(model, only):
            row = {"model": key, "policy": label, "who": who, "form": form}
            if _key(row) in done:
                continue
            if time_limit is not None and time.perf_counter() - start > time_limit:
                log(f"gpu: time limit reached; run again to resume ({path})")
                data["complete"] = False
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(data, indent=1))
                return data
            try:
                fn, lowered = make()
                if lowered is None:      # jax.jit: its one executable
                    executables = [fn.lower(*args).compile()]
            except Exception as e:     # a failure is a result too: kept, and the run goes on
                row["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}"
                data["rows"].append(row)
                log(f"gpu: {key} {label} {who} {form}: FAILED {row['error']}")
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(data, indent=1))
                continue
            if lowered is not None:
                executables = list(lowered.executables)
                row["activations"] = activation_bytes(lowered.residuals)
                row["host_residuals"] = sum(
                    r.bytes for r in lowered.residuals
                    if r.offload is not None and "host" in str(r.offload.dst))
            row["memory"] = [common.xla_memory(e) for e in executables]
            row["times"], row["loss"] = _time(fn, args, steps)
            data["rows"].append(row)
            log(f"gpu: {key} {label} {who} {form}: "
                f"{statistics.median(row['times']) * 1e3:.2f} ms, "
                f"temp {sum(m['temp'] for m in row['memory']):,} B")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(data, indent=1))
    data["complete"] = True
    path.write_text(json.dumps(data, indent=1))
    return data


def _summary(rows) -> list[str]:
    """Per model x policy that JAX also runs: our footprint and median step time over
    `jax.checkpoint`'s, joint and split."""
    by_key = {_key(r): r for r in rows}
    lines = ["Ours over `jax.checkpoint` of the same policy (footprint; median step time). "
             "These models take about a millisecond a step, so the step times are dominated "
             "by launches and vary by tens of percent between runs.", "",
             "| model | policy | joint footprint | joint step | split footprint | split step |",
             "|---|---|---:|---:|---:|---:|"]
    over = []
    for r in rows:
        if r["who"] != "jax.checkpoint" or "error" in r:
            continue
        peak, step = common.xla_peak(r["memory"]), statistics.median(r["times"])
        cells = []
        for form in FORMS:
            o = by_key.get((r["model"], r["policy"], "ours", form))
            if o is None or "error" in o:
                cells += ["failed" if o else "", ""]
                continue
            ratio = common.xla_peak(o["memory"]) / peak
            if ratio > 1.02:
                over.append(f"{r['model']} {form} `{r['policy']}` {ratio:.2f}x")
            cells += [f"{ratio:.2f}x", f"{statistics.median(o['times']) / step:.2f}x"]
        lines.append(f"| {r['model']} | `{r['policy']}` | " + " | ".join(cells) + " |")
    lines += ["", f"Footprint above JAX's + 2%: {len(over)} runs" + (": " + "; ".join(over)
                                                                    if over else "") + ".", ""]
    return lines


def render(data) -> str:
    on_gpu = data.get("backend") == "gpu"
    head = "## On a GPU" if on_gpu else f"## On the {data.get('backend', '?')} backend"
    parts = [head, "",
             f"Device: {data.get('device')} (backend {data.get('backend')}, jax "
             f"{data['meta']['jax']}, commit {data['meta']['commit']}). XLA's "
             "`memory_analysis()` of what ran and the median step time of "
             f"{data.get('steps')} steps of the model's gradient step: `rp.jit` (joint, split) "
             "beside `jax.jit` of `jax.checkpoint(loss, policy)`. Footprint: temp + arguments + "
             "outputs - aliased (`common.xla_footprint`); for the split form the larger of its "
             "two executables. A run that failed to compile is a row too. Regenerate with `python -m tools.benchmarks gpu` on the "
             "device (it resumes where a run stopped), then `render`.", ""]
    if not data.get("complete", False):
        parts += ["**Incomplete run**: run the command again to finish it.", ""]
    parts += _summary(data["rows"])
    by_model: dict = {}
    for r in data["rows"]:
        by_model.setdefault(r["model"], []).append(r)
    for model, rows in by_model.items():
        parts += [f"**{model}**", "",
                  "| policy | who | form | XLA temp | footprint | step | loss |",
                  "|---|---|---|---:|---:|---:|---:|"]
        for r in rows:
            if "error" in r:
                parts.append(f"| {r['policy']} | {r['who']} | {r['form']} | failed: "
                             f"{r['error']} | | | |")
                continue
            parts.append(f"| {r['policy']} | {r['who']} | {r['form']} | "
                         f"{sum(m['temp'] for m in r['memory']):,} B | "
                         f"{common.xla_peak(r['memory']):,} B | "
                         f"{statistics.median(r['times']) * 1e3:.2f} ms | {r['loss']:.6g} |")
        parts.append("")
    return "\n".join(parts) + "\n"
