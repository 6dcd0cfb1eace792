#!/usr/bin/env python
"""Benchmark: how long `remat_passes.remat(module, policy, mode=...)` takes vs. module size.

Not a test. It exports joint VJP modules of a deep chain of many small layers
(`h = sin(tanh(h @ W[i % 8]))`, each layer output named `layer<i>` with
`checkpoint_name`) with `remat_passes.export_vjp`, choosing the depth so the
op count lands near each requested size (a linear fit from two small
calibration exports), counts the ops that really are in the module, and times
`remat_passes.remat` (clone + remat-partial-eval + strip-checkpoint-names +
verification: everything a user pays for) for several policies in joint and
split mode, best of N runs (`time.perf_counter`).

    python tools/bench_pass_time.py --sizes 1000,10000,100000 --repeat 3 --out bench.md

Prints a Markdown report to stdout (progress goes to stderr) and, with
`--out`, writes the same report to a file. Targets: <= 1 s per 10k ops
(<= 100 us/op) and linear growth (us/op roughly constant across sizes).

To profile one case, e.g. the 10k-op module under nothing_saveable:

    python tools/bench_pass_time.py --sizes 10000 --policies nothing_saveable \
        --modes joint --repeat 1 --profile prof.out
    python -c "import pstats; pstats.Stats('prof.out').sort_stats('cumtime').print_stats(40)"
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import math
import os
import platform
import signal
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,  # noqa: E402
                           TimeElapsedColumn)

import remat_passes as rp  # noqa: E402
from remat_passes.mlir import ir  # noqa: E402

TARGET_US_PER_OP = 100.0     # 1 s per 10k ops
LINEAR_EXPONENT_MAX = 1.15   # t ~ n^k with k above this counts as superlinear
N_WEIGHTS = 8                # W has shape (N_WEIGHTS, D, D); layer i uses W[i % N_WEIGHTS]
D = 4                        # feature width (tiny: we measure pass time, not FLOPs)
BATCH = 2
SAVE_EVERY = 10              # save_only_these_names keeps every 10th layer output

POLICY_NAMES = ["everything_saveable", "nothing_saveable", "dots_saveable",
                "save_only_these_names"]
MODES = ["joint", "split"]


# ------------------------------------------------------------------ model --
def chain_model(layers: int):
    def f(W, x):
        h = x
        for i in range(layers):
            h = jnp.tanh(h @ W[i % N_WEIGHTS])
            h = rp.checkpoint_name(jnp.sin(h), f"layer{i}")
        return jnp.sum(h)
    f.__name__ = f"chain{layers}"
    return f


def export_chain(layers: int) -> rp.Module:
    W = jnp.ones((N_WEIGHTS, D, D), jnp.float32) * 0.1
    x = jnp.ones((BATCH, D), jnp.float32)
    return rp.export_vjp(chain_model(layers), W, x)


def count_ops(module_op) -> int:
    """Ops inside functions (nested region ops included; module and func.func excluded)."""
    n = 0

    def visit(op):
        nonlocal n
        if op.name not in ("builtin.module", "func.func"):
            n += 1
        return ir.WalkResult.ADVANCE
    module_op.operation.walk(visit)
    return n


def layers_for(target_ops: int, fit: tuple[float, float]) -> int:
    per_layer, fixed = fit
    return max(1, round((target_ops - fixed) / per_layer))


def calibrate() -> tuple[float, float]:
    a, b = 8, 16
    na = count_ops(export_chain(a).op)
    nb = count_ops(export_chain(b).op)
    per_layer = (nb - na) / (b - a)
    return per_layer, na - per_layer * a


# --------------------------------------------------------------- policies --
def make_policy(name: str, layers: int):
    if name == "everything_saveable":
        return None     # remat's default: save everything (what JAX does without checkpoint)
    if name == "save_only_these_names":
        names = [f"layer{i}" for i in range(0, layers, SAVE_EVERY)]
        return rp.policies.save_only_these_names(*names)
    return getattr(rp.policies, name)


# ----------------------------------------------------------------- timing --
class RunTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float | None):
    """Raise RunTimeout in the main thread after `seconds` (the pass is Python, so
    the signal is seen between bytecodes / binding calls)."""
    if not seconds:
        yield
        return

    def handler(signum, frame):
        raise RunTimeout()
    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class GCTimer:
    """Seconds the cyclic garbage collector runs while enabled (via gc.callbacks)."""

    def __init__(self):
        self.seconds = 0.0
        self._t0 = 0.0

    def __call__(self, phase, info):
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._t0

    def __enter__(self):
        self.seconds = 0.0
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self)


def time_remat(module, policy, mode, repeat, timeout, profiler=None, disable_gc=False):
    """Best-of-`repeat` remat(): (seconds, GC seconds in that run, result op count,
    n residuals, note)."""
    best, best_gc = math.inf, 0.0
    out = None
    for _ in range(repeat):
        gc.collect()
        if disable_gc:
            gc.disable()
        try:
            with time_limit(timeout), GCTimer() as gct:
                if profiler is not None:
                    profiler.enable()
                try:
                    t0 = time.perf_counter()
                    out = rp.remat(module, policy, mode=mode)
                    dt = time.perf_counter() - t0
                finally:
                    if profiler is not None:
                        profiler.disable()
        except RunTimeout:
            return None, None, None, None, f"timeout > {timeout:g} s"
        except RecursionError as e:
            return None, None, None, None, f"RecursionError: {e}"
        finally:
            gc.enable()
        if dt < best:
            best, best_gc = dt, gct.seconds
    return best, best_gc, count_ops(out.op), len(out.residuals), ""


# ---------------------------------------------------------------- reports --
def fmt_s(x):
    return "—" if x is None else (f"{x:.3f}" if x < 10 else f"{x:.1f}")


def fmt_us(x):
    return "—" if x is None else f"{x:.1f}"


def growth(rows_by_size, sizes):
    """[(from, to, ratio of us/op, exponent k in t ~ n^k)] for consecutive sizes."""
    out = []
    for a, b in zip(sizes, sizes[1:]):
        ra, rb = rows_by_size.get(a), rows_by_size.get(b)
        if not ra or not rb or ra["seconds"] is None or rb["seconds"] is None:
            out.append((a, b, None, None))
            continue
        ratio = rb["us_per_op"] / ra["us_per_op"]
        k = math.log(rb["seconds"] / ra["seconds"]) / math.log(rb["ops"] / ra["ops"])
        out.append((a, b, ratio, k))
    return out


def render(meta, modules, rows, sizes, policies, modes) -> str:
    L = []
    L.append("# remat_passes: pass time vs. module size\n")
    L.append(f"- host: {meta['host']}; python {meta['python']}; jax {jax.__version__} "
             f"({jax.default_backend()}); remat_passes {rp.__version__}")
    L.append(f"- model: chain of `h = sin(tanh(h @ W[i % {N_WEIGHTS}]))` layers, "
             f"checkpoint_name'd `layer<i>`, f32[{BATCH},{D}] activations, "
             "exported with `remat_passes.export_vjp` (joint VJP: forward + backward in @main)")
    L.append(f"- timed: `remat_passes.remat(module, policy, mode=...)` (policy None for "
             "everything_saveable; module clone, remat-partial-eval, strip-checkpoint-names, "
             "verifier), "
             f"best of {meta['repeat']} (`time.perf_counter`); modules over "
             f"{meta['once_above']:,} ops timed once (column n); 'of which GC': seconds "
             "Python's cyclic GC ran inside that run (gc.callbacks)"
             + ("; **GC disabled during remat()**" if meta["disable_gc"] else ""))
    L.append(f"- targets: <= {TARGET_US_PER_OP:g} us/op (1 s per 10k ops); linear growth "
             f"(exponent k in t ~ n^k at most {LINEAR_EXPONENT_MAX})\n")

    L.append("## Modules\n")
    L.append("| target | layers | ops (in) | export s | clone s |")
    L.append("|---:|---:|---:|---:|---:|")
    for s in sizes:
        m = modules[s]
        L.append(f"| {s:,} | {m['layers']:,} | {m['ops']:,} | {fmt_s(m['export_s'])} "
                 f"| {fmt_s(m['clone_s'])} |")
    L.append("")

    L.append("## remat() time\n")
    L.append("| policy | mode | ops (in) | ops (out) | residuals | n | seconds | of which GC "
             "| us/op | s per 10k ops | target |")
    L.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|:---:|")
    for p in policies:
        for mode in modes:
            for s in sizes:
                r = rows.get((p, mode, s))
                if r is None:
                    continue
                ok = "—" if r["seconds"] is None else (
                    "ok" if r["us_per_op"] <= TARGET_US_PER_OP else "**MISS**")
                per10k = None if r["seconds"] is None else r["us_per_op"] / 100
                label = p if s == sizes[0] else ""
                note = f" ({r['note']})" if r["note"] else ""
                L.append(f"| {label} | {mode} | {r['ops']:,} | "
                         f"{'—' if r['ops_out'] is None else format(r['ops_out'], ',')} | "
                         f"{'—' if r['residuals'] is None else r['residuals']} | {r['repeat']} | "
                         f"{fmt_s(r['seconds'])}{note} | {fmt_s(r['gc'])} | "
                         f"{fmt_us(r['us_per_op'])} | "
                         f"{fmt_s(per10k)} | {ok} |")
    L.append("")

    if len(sizes) > 1:
        L.append("## Growth (us/op ratio between consecutive sizes; k: t ~ n^k)\n")
        head = " | ".join(f"{a:,} -> {b:,}" for a, b in zip(sizes, sizes[1:]))
        L.append(f"| policy | mode | {head} | linear? |")
        L.append("|---|---|" + "---:|" * (len(sizes) - 1) + ":---:|")
        for p in policies:
            for mode in modes:
                by_size = {s: rows.get((p, mode, s)) for s in sizes}
                g = growth(by_size, sizes)
                cells = []
                linear = True
                known = False
                for _, _, ratio, k in g:
                    if ratio is None:
                        cells.append("—")
                        continue
                    known = True
                    cells.append(f"x{ratio:.2f} (k={k:.2f})")
                    linear &= k <= LINEAR_EXPONENT_MAX
                verdict = "—" if not known else ("yes" if linear else "**no**")
                L.append(f"| {p} | {mode} | " + " | ".join(cells) + f" | {verdict} |")
        L.append("")

    timed = [r for r in rows.values() if r["seconds"] is not None]
    misses = [r for r in timed if r["us_per_op"] > TARGET_US_PER_OP]
    failed = [r for r in rows.values() if r["seconds"] is None]
    L.append("## Summary\n")
    L.append(f"- speed target (<= {TARGET_US_PER_OP:g} us/op): "
             + ("met by every run" if not misses and not failed else
                f"missed by {len(misses)} of {len(rows)} runs"
                + (f", {len(failed)} did not finish" if failed else "")))
    if timed:
        worst = max(timed, key=lambda r: r["us_per_op"])
        L.append(f"- slowest per op: {worst['policy']} / {worst['mode']} at {worst['ops']:,} ops: "
                 f"{worst['us_per_op']:.1f} us/op ({worst['seconds']:.2f} s)")
    return "\n".join(L) + "\n"


# ------------------------------------------------------------------- main --
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,10000,100000",
                    help="target op counts, comma-separated (default: 1000,10000,100000)")
    ap.add_argument("--repeat", type=int, default=3, help="best of N runs (default 3)")
    ap.add_argument("--once-above", type=int, default=50000, metavar="OPS",
                    help="modules with more ops than this are timed once, not best of N "
                         "(default 50000; 0: always best of N)")
    ap.add_argument("--out", help="also write the Markdown report to this file")
    ap.add_argument("--policies", default=",".join(POLICY_NAMES),
                    help=f"comma-separated subset of {','.join(POLICY_NAMES)}")
    ap.add_argument("--modes", default=",".join(MODES), help="joint,split or one of them")
    ap.add_argument("--timeout", type=float, default=0,
                    help="give up on a single remat() run after this many seconds (0: never)")
    ap.add_argument("--disable-gc", action="store_true",
                    help="run remat() with Python's cyclic GC off (isolates the GC's share)")
    ap.add_argument("--profile", metavar="FILE",
                    help="cProfile only the timed remat() calls; write pstats to FILE")
    args = ap.parse_args(argv)

    sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip()]
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for p in policies:
        if p not in POLICY_NAMES:
            ap.error(f"unknown policy {p!r}; choose from {', '.join(POLICY_NAMES)}")
    for m in modes:
        if m not in MODES:
            ap.error(f"unknown mode {m!r}; choose from joint, split")
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")

    console = Console(stderr=True)
    profiler = cProfile.Profile() if args.profile else None
    meta = {"host": f"{platform.machine()} {os.cpu_count()} cpus",
            "python": platform.python_version(), "repeat": args.repeat,
            "once_above": args.once_above or math.inf, "disable_gc": args.disable_gc}
    modules, rows = {}, {}

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=False) as progress:
        task = progress.add_task("calibrating", total=len(sizes) * (1 + len(policies) * len(modes)))
        fit = calibrate()
        for s in sizes:
            layers = layers_for(s, fit)
            progress.update(task, description=f"export {s:,} ops ({layers:,} layers)")
            t0 = time.perf_counter()
            module = export_chain(layers)
            export_s = time.perf_counter() - t0
            ops = count_ops(module.op)
            t0 = time.perf_counter()
            module.clone()
            clone_s = time.perf_counter() - t0
            modules[s] = {"layers": layers, "ops": ops, "export_s": export_s, "clone_s": clone_s}
            progress.advance(task)
            for p in policies:
                policy = make_policy(p, layers)
                for mode in modes:
                    progress.update(task, description=f"{s:,} ops: {p} / {mode}")
                    repeat = 1 if args.once_above and ops > args.once_above else args.repeat
                    secs, gc_s, ops_out, nres, note = time_remat(
                        module, policy, mode, repeat, args.timeout, profiler, args.disable_gc)
                    rows[(p, mode, s)] = {
                        "policy": p, "mode": mode, "size": s, "ops": ops, "ops_out": ops_out,
                        "residuals": nres, "seconds": secs, "gc": gc_s, "note": note,
                        "repeat": repeat,
                        "us_per_op": None if secs is None else secs / ops * 1e6}
                    progress.advance(task)
                    if secs is not None:
                        progress.console.print(f"{s:>7,} target ({ops:,} ops) {p:<22} {mode:<5} "
                                             f"{secs:8.3f} s  {secs / ops * 1e6:7.1f} us/op")
                    else:
                        progress.console.print(f"{s:>7,} target ({ops:,} ops) {p:<22} {mode:<5} "
                                             f"{note}")
            del module
        progress.update(task, description="done")

    report = render(meta, modules, rows, sizes, policies, modes)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)
    if profiler is not None:
        profiler.dump_stats(args.profile)
        console.print(f"profile written to {args.profile}")


if __name__ == "__main__":
    sys.exit(main())
