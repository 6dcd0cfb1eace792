"""The benchmark page (docs/benchmarks.md) and its plot, built from the JSON results.

`render()` reads `results/models.json`, `results/budgets.json`,
`results/scaling.json` and `results/memory.json` (all four must exist), writes
docs/benchmarks.md, docs/img/residuals_vs_flops.png and
docs/img/planner_pareto.png, and keeps the hand-written analysis between the
`analysis:begin/end` markers of the page it replaces.
"""
from __future__ import annotations

import collections
import math
import os
import re

from tools.benchmarks import common
from tools.benchmarks.common import fmt_bytes, fmt_res
from tools.benchmarks.models import SCAN_CASES

ROOT = str(common.ROOT)
PAGE = common.ROOT / "docs" / "benchmarks.md"
PLOT = common.ROOT / "docs" / "img" / "residuals_vs_flops.png"
PARETO = common.ROOT / "docs" / "img" / "planner_pareto.png"
FLOPS_TOLERANCE_PP = 1.0   # target: our extra FLOPs <= JAX's + 1 percentage point


def device_and_host(row: dict, side: str) -> int:
    """Residual bytes of one side ('ours' or 'jax'), device and host together."""
    return row[f"{side}_dev"] + row[f"{side}_host"]


def extra_pct(c, base):
    return (c - base) / base * 100.0


def misses(row: dict, base: float) -> list[str]:
    if row.get('error'):
        return ["error"]
    out = []
    if row['ours_dev'] > row['jax_dev'] or device_and_host(row, 'ours') > device_and_host(row, 'jax'):
        out.append("bytes")
    if extra_pct(row['ours_cost'], base) > extra_pct(row['jax_cost'], base) + FLOPS_TOLERANCE_PP:
        out.append("flops")
    return out



def fmt_ms(s) -> str:
    return "n/a" if s is None or math.isnan(s) else f"{s * 1e3:.0f}" if s >= 0.1 else \
        f"{s * 1e3:.1f}"


def fmt_pct(p) -> str:
    return "n/a" if math.isnan(p) else f"{p:+.1f}%"


def residual_diff(row: dict, limit=5) -> list[str]:
    """Residuals one side saves and the other does not, matched by type (multiset
    difference; descriptions differ in wording between the two sides)."""
    def by_type(res):
        d = collections.defaultdict(list)
        for t, desc in res:
            d[t].append(desc)
        return d
    ours, theirs = by_type(row['ours_res']), by_type(row['jax_res'])
    lines = []
    for side, a, b in (("only ours", ours, theirs), ("only JAX", theirs, ours)):
        extra = []
        for t in a:
            k = len(a[t]) - len(b.get(t, []))
            if k > 0:
                # show the descriptions the other side has least of
                other = collections.Counter(b.get(t, []))
                descs = [d for d in a[t] if not other.pop(d, 0)] or a[t]
                extra.append((t, k, collections.Counter(descs[-k:] if len(descs) >= k else descs)))
        if not extra:
            continue
        total = sum(k for _, k, _ in extra)
        nbytes = 0
        shown = []
        for t, k, descs in sorted(extra, key=lambda e: -e[1]):
            nbytes += k * type_bytes_str(t)
        for t, k, descs in sorted(extra, key=lambda e: -e[1] * type_bytes_str(e[0]))[:limit]:
            d = "; ".join(_short_desc(x) for x in list(descs)[:2])
            shown.append(f"{k}x `{t}` ({d})")
        more = len(extra) - min(len(extra), limit)
        lines.append(f"{side}: {total} residuals, {fmt_bytes(nbytes)}: " + ", ".join(shown)
                     + (f", and {more} more types" if more else ""))
    return lines


_DTYPE_BYTES = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "i64": 8, "i32": 4, "i16": 2,
                "i8": 1, "u8": 1, "i1": 1, "bool": 1, "u32": 4, "u64": 8}


def type_bytes_str(t: str) -> int:
    m = re.match(r"([a-z0-9]+)(?:<[^>]*>)?\[([0-9,]*)\]", t)
    if not m:
        return 0
    n = 1
    for d in filter(None, m.group(2).split(",")):
        n *= int(d)
    return n * _DTYPE_BYTES.get(m.group(1), 4)


def _short_desc(desc: str) -> str:
    desc = desc.replace(ROOT + "/", "")
    desc = re.sub(r"/\S*/site-packages/", "", desc)
    desc = re.sub(r"(\w+\.<locals>\.)+", "", desc)
    return desc


def model_table(meta: dict, rows: list[dict]) -> list[str]:
    base = meta["base_cost"]
    out = [f"### {meta['title']}", "", meta['description'] + ".", "",
           f"Joint VJP module: {meta['n_ops']:,} ops; {meta['n_params']:,} parameters. "
           f"Export (`rp.export_vjp`): {fmt_ms(meta['export_s'])} ms "
           f"({fmt_ms(meta['export_layers_s'])} ms with per-layer `rp.checkpoint` regions). "
           f"No-remat split (plain `jax.vjp`): {base / 1e6:.1f} MFLOP fwd+bwd.", "",
           "| policy | residuals ours | residuals JAX | ours/JAX | extra FLOPs ours | "
           "extra FLOPs JAX | peak (joint) ours | peak (joint) JAX | pass ms split / joint "
           "| JAX trace+lower ms | max abs grad err | targets |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|"]
    for r in rows:
        if r.get('error'):
            out.append(f"| `{r['label']}` | error: {r['error'][:120]} |" + " |" * 10)
            continue
        m = misses(r, base)
        ratio = device_and_host(r, 'ours') / device_and_host(r, 'jax') if device_and_host(r, 'jax') else float("nan")
        out.append(
            f"| `{r['label']}` | {fmt_res(r['ours_dev'], r['ours_host'])} ({r['ours_n']}) "
            f"| {fmt_res(r['jax_dev'], r['jax_host'])} ({r['jax_n']}) | {ratio:.2f} "
            f"| {fmt_pct(extra_pct(r['ours_cost'], base))} | {fmt_pct(extra_pct(r['jax_cost'], base))} "
            f"| {fmt_bytes(r['ours_peak'])} | {fmt_bytes(r['jax_peak'])} "
            f"| {fmt_ms(r['pass_s'])} / {fmt_ms(r['pass_joint_s'])} | {fmt_ms(r['jax_lower_s'])} "
            f"| {r['grad_err']:.1e} | {'ok' if not m else 'MISS: ' + ', '.join(m)} |")
    out.append("")
    return out



def render_models(data, png_rel, extra_md=None) -> str:
    """The comparison with jax.checkpoint: method, plot, summary, kept analysis, tables."""
    rows, meta, m = data["rows"], data["models"], data["machine"]
    by_model = collections.defaultdict(list)
    for r in rows:
        by_model[r['model']].append(r)
    n_pairs = len(rows)
    missed = [(r, misses(r, meta[r['model']]["base_cost"])) for r in rows]
    missed = [(r, m) for r, m in missed if m]
    literals = sum(r['jax_literals'] for r in rows)
    L = [
        "# Benchmarks: remat_passes vs. hand-written `jax.checkpoint`",
        "",
        "<!-- Generated by `python -m tools.benchmarks render` from tools/benchmarks/results/"
        "*.json; edit the tools, not this file, except between the analysis:begin/end markers "
        "(that block is kept on regeneration). -->",
        "",
        "Regenerate this page with `python -m tools.benchmarks all` (measures everything, about "
        "1.5 hours on 2 cores) or one part at a time: `models`, `budgets`, `scaling`, `memory`, "
        "then "
        "`render` (needs `pip install -e \".[bench]\"`). The comparison below: "
        f"{m['date']}, {n_pairs} model x policy pairs, {m['cpu']}, {m['cpus']} cpus, "
        f"python {m['python']}, jax {m['jax']} ({m['backend']}), remat_passes "
        f"{m['remat_passes']} at {m['commit']}, timings best of {data['repeat']}. The machine is "
        "shared and noisy: compare numbers within a row (measured side by side), not across "
        "runs.",
        "",
        "## What is compared",
        "",
        "For each model we export the joint VJP once with `rp.export_vjp` (no `jax.checkpoint` "
        "in the model code) and run `rp.remat(module, policy, mode='split')`; the JAX side is "
        "the same model written by hand with `jax.checkpoint(model, policy=...)` around the "
        "whole loss (or `jax.checkpoint` around each layer for *per-layer regions*, where our "
        "side wraps each layer in `rp.checkpoint`). `none (no remat)` is the model without any "
        "checkpoint on both sides (our policy `None`).",
        "",
        "*Scan over layers* (`mlp-scan`, `gpt-scan`): the layers' parameters are stacked on a "
        "leading axis and run by `lax.scan`. Ours is still `rp.remat(rp.export_vjp(f), policy)`: "
        "the policy applies per iteration inside the scan's forward/backward while pair, and "
        "to the whole module outside it. JAX's side is written the usual way, "
        "`lax.scan(jax.checkpoint(layer, policy=...))`, and, so that it means the same as our "
        "module policy, every piece outside the loop (MLP: the first layer, head + loss; "
        "GPT: the embedding, final norm + head + loss) is in its own `jax.checkpoint(piece, "
        "policy=...)` too. *Per-layer regions* are `lax.scan(rp.checkpoint(layer))` vs. "
        "`lax.scan(jax.checkpoint(layer))` (plus the MLP's first layer), with no policy "
        "outside the regions on either side. These two models run a subset of the policies "
        f"({', '.join(SCAN_CASES)} in the plot's labels) to keep the run short.",
        "",
        "- **residuals**: ours = `sum(r.bytes for r in out.residuals)` of the split form (count "
        "in parentheses); JAX = the avals JAX's own `saved_residuals` reports for "
        "the hand-written checkpointed function, summed. Both count function arguments the "
        "backward pass reads (parameters, inputs). Entries JAX reports as `from a literal` "
        f"(scalars, not memory) are dropped: {literals} such entries in this run. Values "
        "offloaded to host memory (`pinned_host`) are listed separately as `+ ... host`.",
        "- **extra FLOPs**: XLA's cost analysis (`flops + transcendentals` of "
        "`jax.jit(...).lower(...).compile().cost_analysis()`) of the compiled forward plus the "
        "compiled backward of each split form, as % over JAX's no-remat split (plain "
        "`jax.vjp`, forward and backward jitted separately: the same baseline for both "
        "columns). Ours: `rp.compile(out, 'main_fwd')` / `'main_bwd'` (an `Exported.call` "
        "under `jax.jit`). JAX: forward = `jax.vjp(f_ckpt, *args)` returning the leaves of "
        "the VJP function (`jax.tree_util.tree_flatten(vjp_fn)`), backward = the VJP "
        "function rebuilt from those leaves, applied to the cotangent. Split forms because "
        "XLA:CPU undoes recomputation inside one joint program (DESIGN.md §5). XLA's cost "
        "analysis counts a `while` body once whatever its trip count (checked: a `lax.scan` over "
        "2, 3 or 8 layers reports the same FLOPs), so for the scanned models both sides and the "
        "baseline are counted instead on the StableHLO of the same split forms "
        "(`remat_passes.flops`: XLA's counting rules, `while` bodies times their constant "
        "trip count; on loop-free programs it equals XLA's count, see "
        "`test/python/test_flops.py`). The scanned tables' "
        "percentages are therefore not XLA numbers, and only comparable within those tables.",
        "- **peak (joint)**: the static program-order liveness estimate "
        "`remat_passes.cost.memory.estimate_memory(...).peak_bytes` (`rp.estimate_memory`) of "
        "our joint form "
        "(`rp.remat(..., mode='joint')`) and, for reference, of JAX's own joint program "
        "(the StableHLO of `jax.jit(jax.value_and_grad(f_ckpt))`, same estimator).",
        "- **pass ms**: `rp.remat(module, policy, mode='split')` / `mode='joint'` (clone + "
        "passes + verifier). **JAX trace+lower ms**: "
        "`jax.jit(jax.value_and_grad(jax.checkpoint(model, policy))).lower(...)` on a fresh "
        "function. Our own front-end cost is the export time in each model's header.",
        "- **max abs grad err**: our split forward + backward (compiled with XLA) vs. "
        "`jax.grad` of the model without remat (float gradients only).",
        f"- **targets**: residual bytes ours <= JAX (device bytes and device+host bytes), and "
        f"extra FLOPs ours <= JAX + {FLOPS_TOLERANCE_PP:g} percentage point.",
        "",
        f"![residual memory vs. recompute FLOPs]({png_rel})",
        "",
        "*Residual bytes (device; split form) vs. extra FLOPs over the no-remat split, per "
        "policy. Filled: remat_passes; open: hand-written `jax.checkpoint`. Labels: none = no "
        "remat, all = everything_saveable, nothing, dots, dots_nb = "
        "dots_with_no_batch_dims_saveable, only / but / except = the name policies, both = "
        "save_from_both_policies, off_dots / off_names = the offload policies (device bytes "
        "only), layers = per-layer regions.*",
        "",
        "## Summary",
        "",
    ]
    if missed:
        L.append(f"{n_pairs - len(missed)} of {n_pairs} pairs meet both targets. Misses:")
        L.append("")
        for r, m in missed:
            base = meta[r['model']]["base_cost"]
            L.append(f"- **{r['model']} / `{r['label']}`** ({', '.join(m)}): residuals "
                     f"{fmt_res(r['ours_dev'], r['ours_host'])} ours vs {fmt_res(r['jax_dev'], r['jax_host'])} "
                     f"JAX; extra FLOPs {fmt_pct(extra_pct(r['ours_cost'], base))} ours vs "
                     f"{fmt_pct(extra_pct(r['jax_cost'], base))} JAX.")
            for line in residual_diff(r) if not r.get('error') else [r['error']]:
                L.append(f"  - {line}")
            if "flops" in m:
                n, b, n_arg, b_arg = r['rounded']
                L.append(f"  - insert-reduce-precision rounds {n} values ({fmt_bytes(b)}) in our "
                         f"forward, {n_arg} of them function arguments ({fmt_bytes(b_arg)}); "
                         "JAX rounds residuals only inside `jax.checkpoint`, and never "
                         "arguments.")
    else:
        L.append(f"All {n_pairs} pairs meet both targets.")
    L.append("")
    bad_grad = [r for r in rows if not r.get('error') and not r['grad_err'] <= 1e-4]
    L.append("Gradients: max abs error vs. `jax.grad` over all pairs "
             f"{max((r['grad_err'] for r in rows if not r.get('error')), default=float('nan')):.1e} "
             f"(JAX's own split: {max((r['jax_grad_err'] for r in rows if not r.get('error')), default=float('nan')):.1e})"
             + ("; above 1e-4: " + ", ".join(r['model'] + "/" + r['short'] for r in bad_grad) + "."
                if bad_grad else "."))
    L.append("")
    if extra_md:
        L += [extra_md.strip(), ""]
    L += ["## Results per model", ""]
    for key in meta:
        L += model_table(meta[key], by_model[key])
    return "\n".join(L) + "\n"


def _clusters(pts):
    """Group points that coincide on the plot (log x, linear y) so each group gets one label."""
    xs = [math.log10(p[0]) for p in pts]
    ys = [p[1] for p in pts]
    xr = (max(xs) - min(xs)) or 1.0
    yr = (max(ys) - min(ys)) or 1.0
    clusters = []
    for p, lx in zip(pts, xs):
        for c in clusters:
            if abs(c["lx"] - lx) < 0.025 * xr and abs(c["y"] - p[1]) < 0.025 * yr:
                c["items"].append(p)
                break
        else:
            clusters.append(dict(lx=lx, y=p[1], x=p[0], items=[p]))
    return clusters


def _label(ax, clusters, points_per_px):
    """One label per cluster, right of it, moved up/down to avoid the labels placed so far."""
    right = ax.get_window_extent().x1 * points_per_px   # keep labels inside the axes
    placed = []   # boxes in points (x0, y0, x1, y1): the markers, then each label placed
    for c in clusters:
        px, py = ax.transData.transform((c["x"], c["y"])) * points_per_px
        placed.append((px - 6, py - 6, px + 6, py + 6))
    for c in sorted(clusters, key=lambda c: (-c["y"], c["lx"])):
        labels = list(dict.fromkeys(p[3] for p in c["items"]))
        sides = {p[2] for p in c["items"]}
        text = "/".join(labels) + ("" if sides == {"ours", "jax"} else
                                   " (ours)" if sides == {"ours"} else " (JAX)")
        color = "black" if sides == {"ours", "jax"} else \
            ("tab:blue" if sides == {"ours"} else "tab:orange")
        px, py = ax.transData.transform((c["x"], c["y"])) * points_per_px
        w, h = 4.1 * len(text), 8.5
        candidates = [(9, dy) for dy in (-3, 6, -12, 15, -21, 24, -30, 33)] + \
            [(-9 - w, dy) for dy in (-3, 6, -12, 15)]
        for dx, dy in candidates:
            box = (px + dx, py + dy, px + dx + w, py + dy + h)
            inside = right is None or box[2] <= right
            if inside and not any(box[0] < q[2] and q[0] < box[2] and box[1] < q[3]
                                  and q[1] < box[3] for q in placed):
                break
        else:
            dx, dy = candidates[0]
            box = (px + dx, py + dy, px + dx + w, py + dy + h)
        placed.append(box)
        ax.annotate(text, (c["x"], c["y"]), fontsize=7, color=color,
                    xytext=(dx, dy), textcoords="offset points")


def plot(data, path):
    rows, meta = data["rows"], data["models"]
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    n = len(meta)
    cols = 2 if n > 1 else 1
    nrows = math.ceil(n / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(7.5 * cols, 5.4 * nrows), squeeze=False)
    to_label = []
    for ax, key in zip(axes.flat, meta):
        base = meta[key]["base_cost"]
        pts = []   # (bytes, extra %, side, short label)
        for r in rows:
            if r['model'] != key or r.get('error'):
                continue
            ours = (max(r['ours_dev'], 1), extra_pct(r['ours_cost'], base))
            jx = (max(r['jax_dev'], 1), extra_pct(r['jax_cost'], base))
            pts += [(*ours, "ours", r['short']), (*jx, "jax", r['short'])]
            if abs(math.log(ours[0] / jx[0])) > 0.02 or abs(ours[1] - jx[1]) > 0.5:
                ax.annotate("", xy=ours, xytext=jx, zorder=1,
                            arrowprops=dict(arrowstyle="->", color="0.6", lw=0.8))
        ax.scatter([p[0] for p in pts if p[2] == "jax"], [p[1] for p in pts if p[2] == "jax"],
                   marker="s", s=120, facecolors="none", edgecolors="tab:orange",
                   linewidths=1.5, label="jax.checkpoint by hand (split)", zorder=2)
        ax.scatter([p[0] for p in pts if p[2] == "ours"], [p[1] for p in pts if p[2] == "ours"],
                   marker="o", s=45, color="tab:blue", label="remat_passes (split)", zorder=3)
        ax.set_xscale("log")
        span = max(p[0] for p in pts) / min(p[0] for p in pts)
        ax.xaxis.set_major_locator(ticker.LogLocator(base=2.0,
                                                     subs=(1.0,) if span > 5 else (1.0, 1.5)))
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: fmt_bytes(int(round(v)))))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.margins(x=0.3, y=0.1)
        ax.set_title(meta[key]['title'])
        ax.set_xlabel("residual bytes on device, split form (log scale)")
        ax.set_ylabel("extra FLOPs over the no-remat split (%)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8, loc="center right")
        to_label.append((ax, _clusters(pts)))
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle("Residual memory vs. recompute FLOPs per policy "
                 "(XLA:CPU cost analysis, flops + transcendentals)")
    fig.tight_layout()
    for ax, clusters in to_label:   # after the layout: positions are final
        _label(ax, clusters, 72.0 / fig.dpi)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)



BLOCK_RE = r"<!-- {0}:begin -->\n(.*?)<!-- {0}:end -->"


def kept_block(path, name) -> str | None:
    try:
        with open(path) as f:
            m = re.search(BLOCK_RE.format(name), f.read(), re.S)
    except OSError:
        return None
    return m.group(1) if m else None


def block(name, body) -> str:
    return f"<!-- {name}:begin -->\n{body.strip()}\n<!-- {name}:end -->"


def render(page=PAGE, plot_path=PLOT, pareto_path=PARETO) -> str:
    """Write the page (and the plots) from the JSON results; returns the page."""
    from tools.benchmarks import budgets, memory_figures, scaling, startup
    results = {name: common.read_json(name) for name in ("models", "budgets", "scaling",
                                                          "memory", "startup")}
    missing = [n for n, d in results.items() if d is None]
    if missing:
        raise SystemExit(f"no results for {', '.join(missing)} in {common.RESULTS}: run "
                         f"python -m tools.benchmarks {' / '.join(missing)} first")
    analysis = kept_block(str(page), "analysis")
    extra = block("analysis", analysis) if analysis else None
    plot(results["models"], str(plot_path))
    budgets.plot(results["budgets"], str(pareto_path))
    parts = [render_models(results["models"], os.path.relpath(plot_path, page.parent), extra),
             budgets.render(results["budgets"], os.path.relpath(pareto_path, page.parent)),
             scaling.render(results["scaling"]), memory_figures.render(results["memory"]),
             startup.render(results["startup"])]
    from tools.benchmarks import xla_memory
    allocated = common.read_json("xla")       # (optional: python -m tools.benchmarks xla)
    if allocated is not None:
        parts.append(xla_memory.render(allocated))
    for path in sorted(common.RESULTS.glob("xla_cpu_jax*.json")):   # later jaxlibs' XLA:CPU
        later = common.read_json(path.stem)
        parts.append(xla_memory.render(
            later, f"Memory as XLA allocates it, jax {later['meta']['jax']} (XLA:CPU)"))
    on_device = common.read_json("xla_gpu")  # (optional: `xla` run on the device machine)
    if on_device is not None:
        parts.append(xla_memory.render(
            on_device, f"Memory as XLA allocates it on a GPU ({on_device['meta']['device']})"))
    calls = common.read_json("dispatch")     # (optional: python -m tools.benchmarks dispatch)
    if calls is not None:
        from tools.benchmarks import dispatch
        parts.append(dispatch.render(calls))
    for name in ("train", "train_gpu"):     # (optional: ... train; train_gpu: on the device)
        trained = common.read_json(name)
        if trained is not None:
            from tools.benchmarks import train
            parts.append(train.render(trained))
    libraries_steps = common.read_json("libraries")   # (optional: ... libraries)
    if libraries_steps is not None:
        from tools.benchmarks import libraries
        parts.append(libraries.render(libraries_steps))
    long_scans = common.read_json("scans")   # (optional: python -m tools.benchmarks scans)
    if long_scans is not None:
        from tools.benchmarks import scans
        parts.append(scans.render(long_scans))
    zoo_results = common.read_json("zoo")    # (optional: python -m tools.benchmarks zoo)
    if zoo_results is not None:
        from tools.benchmarks import zoo
        parts.append(zoo.render(zoo_results))
    groupings = common.read_json("barriers_gpu")   # (optional: `barriers` on the device)
    if groupings is not None:
        from tools.benchmarks import barriers
        parts.append(barriers.render(groupings))
    device = common.read_json("gpu")          # (optional: measured on the device machine)
    if device is not None:
        from tools.benchmarks import gpu
        parts.append(gpu.render(device))
    text = "\n".join(p.rstrip() + "\n" for p in parts)
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(text)
    return text
