"""Where the optimization barriers go, as XLA allocates it (made for a GPU: `python -m
tools.benchmarks barriers` on the device machine; XLA:CPU deletes barriers before it
schedules, so there the two groupings compile alike).

For every benchmark model x every policy applied to the whole model x joint and split form:
`rp.jit` of the model's gradient step with `barrier_groups="per-use"` (one barrier per
recomputation, at its consumer) and with `"per-region"` (one per checkpoint region, as
`jax.checkpoint`), beside `jax.jit(jax.value_and_grad(jax.checkpoint(loss, policy)))` (joint)
and JAX's split of it (`jax.vjp`, forward and backward jitted separately). Per run: XLA's
`memory_analysis()` of each executable. rp.jit's default on such a backend
(`barrier_groups="smaller"`) runs the one of the two with the smaller footprint; the checks
say whether that is within JAX's + 2% everywhere.

Rows are written as they are measured and a run that stops at `--time-limit` resumes.
`--dry-run` is the CPU check of the harness (a tiny MLP, one policy). `--fence-chains on`
(with `--out` another file) measures rp.jit's programs with place-optimization-barriers'
fence-chains forced on, which rp.jit leaves off on a GPU until it is measured there.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import jax

import remat_passes as rp
from tools.benchmarks import common
from tools.benchmarks.cases import cases_for, jax_function
from tools.benchmarks.gpu import _gradient_step
from tools.benchmarks.models import MODELS, _identity, make_mlp
from tools.benchmarks.xla_memory import jax_halves

GROUPINGS = ("per-use", "per-region")
SLACK = 1.02


def _ours(loss, policy, form, groups, args, fence_chains=None) -> list[dict]:
    fn = rp.jit(_gradient_step(loss), policy=policy, mode=form, barrier_groups=groups,
                fence_chains=fence_chains)
    return [common.xla_memory(e) for e in fn.lower(*args).executables]


def measure(models=tuple(MODELS), path: Path | None = None, time_limit: float | None = None,
            log=print, dry_run: bool = False, fence_chains: bool | None = None) -> dict:
    """`fence_chains`: rp.jit's (None: its default for the backend)."""
    backend = jax.default_backend()
    path = Path(path or common.RESULTS / f"barriers_{backend}.json")
    data = json.loads(path.read_text()) if path.exists() and not dry_run else {
        "meta": common.machine(), "device": jax.devices()[0].device_kind,
        "backend": backend, "rows": [], "fence_chains": fence_chains}
    if data.get("fence_chains") != fence_chains:
        raise SystemExit(f"error: {path} was measured with fence_chains="
                         f"{data.get('fence_chains')}, not {fence_chains}: give --out another "
                         "file")
    done = {(r["model"], r["policy"], r["form"]) for r in data["rows"]}
    chosen = {"mlp": lambda: make_mlp(batch=8, width=32, depth=2, d_in=16, d_out=8)} \
        if dry_run else {k: MODELS[k] for k in models}
    start = time.perf_counter()
    for form in ("joint", "split"):
        for key, make_model in chosen.items():
            model = make_model()
            loss = model.build(_identity)
            for case in cases_for(model):
                if case.kind != "whole" or (dry_run and case.short != "nothing"):
                    continue
                if (key, case.short, form) in done:
                    continue
                if time_limit is not None and time.perf_counter() - start > time_limit:
                    data["complete"] = False
                    path.write_text(json.dumps(data, indent=1))
                    log(f"barriers: time limit reached; run again to resume ({path})")
                    return data
                row = {"model": key, "policy": case.short, "label": case.label, "form": form}
                try:
                    for groups in GROUPINGS:
                        row[groups] = _ours(loss, case.our_policy, form, groups, model.args,
                                            fence_chains)
                    fun = jax_function(model, case)
                    row["jax"] = jax_halves(fun, model.args) if form == "split" else [
                        common.xla_memory(jax.jit(jax.value_and_grad(fun)).lower(
                            *model.args).compile())]
                except Exception as e:       # a failure is a row too
                    row["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}"
                data["rows"].append(row)
                log(f"barriers: {key} {case.short} {form}: " + (row.get("error") or ", ".join(
                    f"{w} {common.xla_peak(row[w]):,}" for w in GROUPINGS + ("jax",))))
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(data, indent=1))
    data["complete"] = True
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    return data


def checks(data) -> list[tuple[str, bool]]:
    """The smaller grouping (rp.jit's default there) within JAX's footprint + 2%, and in
    split form each half's footprint within JAX's + 2%, per row. (Not each half's temp
    bytes alone: JAX's forward also returns the parameters the backward reads, as copies,
    and its backward the batch's cotangent; XLA puts scratch values and loop-carried copies
    in those output buffers before it writes them, so its temp is smaller while its
    footprint is larger; see `temp_note`.)"""
    out = []
    for r in data["rows"]:
        if "error" in r:
            out.append((f"{r['model']} {r['policy']} {r['form']}: {r['error']}", False))
            continue
        best = min(GROUPINGS, key=lambda w: common.xla_peak(r[w]))
        ours, jax_ = common.xla_peak(r[best]), common.xla_peak(r["jax"])
        out.append((f"{r['model']} {r['policy']} {r['form']}: footprint {ours:,} B "
                    f"({best}) <= JAX's {jax_:,} B + 2%", ours <= jax_ * SLACK))
        if r["form"] == "split":
            for half, (o, j) in zip(("forward", "backward"), zip(r[best], r["jax"])):
                mine, theirs = common.xla_footprint(o), common.xla_footprint(j)
                out.append((f"{r['model']} {r['policy']} split {half} footprint {mine:,} B "
                            f"<= JAX's {theirs:,} B + 2%", mine <= theirs * SLACK))
    return out


def temp_note(data) -> str:
    """The split halves whose temp bytes alone are above JAX's, and what JAX's half returns
    beyond ours there."""
    above, extra = 0, []
    halves = 0
    for r in data["rows"]:
        if r["form"] != "split" or "error" in r:
            continue
        best = min(GROUPINGS, key=lambda w: common.xla_peak(r[w]))
        for o, j in zip(r[best], r["jax"]):
            halves += 1
            if o["temp"] > j["temp"] * SLACK:
                above += 1
                extra.append(j["out"] - o["out"])
    if not above:
        return f"Temp bytes alone: every split half within JAX's + 2% ({halves} halves)."
    return (f"Temp bytes alone are above JAX's + 2% in {above} of {halves} split halves, "
            f"but in each of them JAX's half returns {min(extra):,} to {max(extra):,} B more "
            "than ours (JAX's forward returns the parameters the backward reads, as copies; "
            "its backward also returns the batch's cotangent), and XLA keeps scratch values "
            "and loop-carried copies in those output buffers before it writes them; the "
            "footprint check above counts both.")


def render(data) -> str:
    lines = ["## Where the barriers go", "",
             f"XLA's footprint (temp + arguments + outputs; split: the larger half) of the "
             f"training step with one barrier per recomputation (per use) and one per "
             f"checkpoint region (per region, as `jax.checkpoint`), beside "
             f"`jax.checkpoint`'s own program (split: `jax.vjp` of it, forward and backward "
             f"jitted separately), on {data.get('device')} (backend "
             f"{data.get('backend')}, jax {data['meta']['jax']}, commit "
             f"{data['meta']['commit']}). rp.jit builds both there and runs the smaller "
             "(**bold**). Regenerate on the device with `python -m tools.benchmarks barriers`, "
             "then `render`.", ""]
    if not data.get("complete", False):
        lines += ["**Incomplete run**: run the command again to finish it.", ""]
    lines += ["| model | policy | form | per use | per region | jax.checkpoint | kept / JAX |",
              "|---|---|---|---:|---:|---:|---:|"]
    for r in data["rows"]:
        if "error" in r:
            lines.append(f"| {r['model']} | `{r['policy']}` | {r['form']} | failed: "
                         f"{r['error']} | | | |")
            continue
        sizes = {w: common.xla_peak(r[w]) for w in GROUPINGS + ("jax",)}
        best = min(GROUPINGS, key=sizes.get)
        cells = [f"**{sizes[w]:,}**" if w == best else f"{sizes[w]:,}" for w in GROUPINGS]
        lines.append(f"| {r['model']} | `{r['policy']}` | {r['form']} | " + " | ".join(cells)
                     + f" | {sizes['jax']:,} | {sizes[best] / sizes['jax']:.2f}x |")
    failed = [t for t, ok in checks(data) if not ok]
    lines += ["", f"Checks (footprint, and in split form each half's footprint, within "
              f"JAX's + 2%): {len(checks(data)) - len(failed)} of {len(checks(data))} hold"
              + (": not " + "; not ".join(failed) if failed else "") + ".", "",
              temp_note(data), ""]
    return "\n".join(lines) + "\n"
