"""Scaling benchmark: time and memory of the default pipeline against module size.

For every family of `families.FAMILIES`, at each target size (ops of the joint
module after inlining: the program the passes rewrite), it exports the joint VJP
once, times JAX's own trace+lower of the same joint function, and runs
`rp.remat(module, policy, mode=...)` for each policy and mode: best-of-`repeat`
wall time, the time of each pipeline step (`Module.timings`), and the extra peak
resident memory of the process during the call (Linux high-water mark, reset
before it). Results go to `results/scaling.json`; `render` builds the page.

Targets (issue: "The remat engine as a substrate"):
* every pass's growth exponent k (t ~ n^k) between consecutive sizes <= 1.15
  (steps that take under NOISE_S at both sizes are too small to measure);
* the pipeline <= 1 s per 10k ops at every size, and <= JAX's trace+lower time;
* extra peak RSS during rp.remat <= 10x the module's text size (after inlining: the
  program the passes rewrite; MLIR text with locations, as `Module.save` writes it).
"""
from __future__ import annotations

import gc
import math
import sys
import time

import jax

import remat_passes as rp
from tools.benchmarks import common
from tools.benchmarks.families import DESCRIPTIONS, FAMILIES

SIZES = (2500, 10000, 40000, 160000)
POLICIES = ("nothing_saveable", "dots_saveable", "names")
MODES = ("joint", "split")
MAX_EXPONENT = 1.15
TARGET_S_PER_10K = 1.0
MAX_RSS_RATIO = 10.0
NOISE_S = 0.02


def make_policy(name: str, n: int):
    if name == "names":   # every 10th layer output kept
        return rp.policies.save_only_these_names(*[f"layer{i}" for i in range(0, n, 10)])
    return name


def inlined_ops(module) -> int:
    copy = module.clone()
    rp.run_pipeline(copy.op, rp.parse_pipeline("builtin.module(inline)"))
    return common.count_ops(copy.op)


def calibrate(family) -> tuple[float, float]:
    """ops(n) ~ per * n + fixed, from two small exports (inlined op counts)."""
    a, b = 4, 12
    na = inlined_ops(rp.export_vjp(*_fun_args(family, a)))
    nb = inlined_ops(rp.export_vjp(*_fun_args(family, b)))
    per = (nb - na) / (b - a)
    return per, na - per * a


def _fun_args(family, n):
    f, args = FAMILIES[family](n)
    return (f, *args)


def jax_trace_lower_seconds(f, args) -> float:
    """JAX's own trace + lower of the joint VJP function (a fresh function: no caches)."""
    n = len(args)
    out = jax.eval_shape(f, *args)

    def joint(*a):
        value, vjp = jax.vjp(f, *a[:n])
        return value, vjp(a[n])
    ct = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype), out)
    t0 = time.perf_counter()
    jax.jit(joint).lower(*args, ct)
    return time.perf_counter() - t0


def run_case(module, policy, mode, repeat) -> dict:
    best = None
    for _ in range(repeat):
        gc.collect()
        with common.PeakRSS() as rss:
            t0 = time.perf_counter()
            out = rp.remat(module, policy, mode=mode)
            seconds = time.perf_counter() - t0
        steps: dict = {}
        for name, s in out.timings:
            steps[name] = steps.get(name, 0.0) + s
        run = {"seconds": seconds, "steps": steps, "rss_extra": rss.extra,
               "ops_out": common.count_ops(out.op), "residuals": len(out.residuals)}
        if best is None or seconds < best["seconds"]:
            best = run
        del out
    return best


def measure_one(family, size, policies=POLICIES, modes=MODES, repeat=3) -> list[dict]:
    """Every policy and mode of one family at one size (run in a fresh process by `measure`,
    so that one size's heap does not slow the next down)."""
    per, fixed = calibrate(family)
    n = max(1, round((size - fixed) / per))
    f, *args = _fun_args(family, n)
    t0 = time.perf_counter()
    module = rp.export_vjp(f, *args)
    export_s = time.perf_counter() - t0
    jax_s = min(jax_trace_lower_seconds(f, args) for _ in range(repeat))
    ops_in = common.count_ops(module.op)
    inlined = module.clone()
    rp.run_pipeline(inlined.op, rp.parse_pipeline("builtin.module(inline)"))
    ops = common.count_ops(inlined.op)
    text_bytes = len(module.text(debug_info=True).encode())
    inlined_text_bytes = len(inlined.text(debug_info=True).encode())
    del inlined
    rows = []
    for policy in policies:
        for mode in modes:
            r = run_case(module, make_policy(policy, n), mode, repeat)
            r.update(family=family, size=size, n=n, ops=ops, ops_in=ops_in,
                     text_bytes=text_bytes, inlined_text_bytes=inlined_text_bytes,
                     export_s=export_s, jax_s=jax_s, policy=policy, mode=mode)
            rows.append(r)
    return rows


def measure(sizes=SIZES, families=tuple(FAMILIES), policies=POLICIES, modes=MODES,
            repeat=3, log=print) -> dict:
    import json
    import subprocess
    rows = []
    for family in families:
        for size in sizes:
            cmd = [sys.executable, "-m", "tools.benchmarks.scaling", "--one", family, str(size),
                   "--policies", ",".join(policies), "--modes", ",".join(modes),
                   "--repeat", str(repeat)]
            proc = subprocess.run(cmd, cwd=common.ROOT, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
            for r in json.loads(proc.stdout.strip().splitlines()[-1]):
                rows.append(r)
                log(f"{family:15s} {r['ops']:>7,} ops {r['policy']:17s} {r['mode']:5s} "
                    f"{r['seconds']:7.2f} s ({r['seconds'] / r['ops'] * 1e4:.2f} s/10k ops, "
                    f"JAX {r['jax_s']:.2f} s) rss x{(r['rss_extra'] or 0) / r['inlined_text_bytes']:.1f}")
    return {"machine": common.machine(), "repeat": repeat, "rows": rows,
            "descriptions": DESCRIPTIONS}


# ------------------------------------------------------------------ report --
def exponent(t1, t2, n1, n2):
    if t1 <= 0 or t2 <= 0:
        return None
    return math.log(t2 / t1) / math.log(n2 / n1)


def checks(data) -> list[dict]:
    """Per (family, policy, mode, step): growth exponents between consecutive sizes."""
    out = []
    groups: dict = {}
    for r in data["rows"]:
        groups.setdefault((r["family"], r["policy"], r["mode"]), []).append(r)
    for key, rows in groups.items():
        rows.sort(key=lambda r: r["ops"])
        steps = sorted({s for r in rows for s in r["steps"]} | {"pipeline"})
        for step in steps:
            for a, b in zip(rows, rows[1:]):
                ta = a["seconds"] if step == "pipeline" else a["steps"].get(step, 0.0)
                tb = b["seconds"] if step == "pipeline" else b["steps"].get(step, 0.0)
                k = exponent(ta, tb, a["ops"], b["ops"])
                out.append({"family": key[0], "policy": key[1], "mode": key[2], "step": step,
                            "from": a["ops"], "to": b["ops"], "k": k,
                            "measurable": max(ta, tb) >= NOISE_S})
    return out


def render(data) -> str:
    m = data["machine"]
    rows = data["rows"]
    L = ["## Scaling: pass time and memory against module size", ""]
    L.append(f"Regenerate with `python -m tools.benchmarks scaling` (this run: {m['date']}, "
             f"{m['cpu']}, {m['cpus']} cpus, python {m['python']}, jax {m['jax']} "
             f"({m['backend']}), remat_passes {m['remat_passes']} at {m['commit']}; "
             f"best of {data['repeat']}; the machine is shared and noisy, so compare within a "
             "run). Ops are counted after inlining (the program the passes rewrite); "
             "`jitted-calls` has fewer before (`ops in`, and `in` text). Text = the module's MLIR "
             "text with locations (what `Module.save` writes), after inlining. JAX = "
             "`jax.jit(joint).lower(...)` of the same joint VJP function (trace + lower), "
             "measured in the same run. RSS = extra peak resident memory of the process during "
             "`rp.remat`, as a multiple of that text size. Each family and size runs in a "
             "fresh process.")
    L.append("")
    ks = checks(data)
    worst_k = max((c["k"] for c in ks if c["measurable"] and c["k"] is not None), default=None)
    slow = [r for r in rows if r["seconds"] / r["ops"] * 1e4 > TARGET_S_PER_10K]
    behind = [r for r in rows if r["seconds"] > r["jax_s"]]
    rss = [r["rss_extra"] / r["inlined_text_bytes"] for r in rows if r["rss_extra"] is not None]
    L.append("| target | result |")
    L.append("|---|---|")
    L.append(f"| growth exponent of every pass <= {MAX_EXPONENT} | worst {worst_k:.2f} "
             f"({sum(1 for c in ks if c['measurable'] and c['k'] is not None and c['k'] > MAX_EXPONENT)} "
             f"of {sum(1 for c in ks if c['measurable'])} measurable pairs above) |"
             if worst_k is not None else "| growth exponent | no measurable pairs |")
    L.append(f"| pipeline <= {TARGET_S_PER_10K:g} s per 10k ops | "
             f"worst {max(r['seconds'] / r['ops'] * 1e4 for r in rows):.2f} s "
             f"({len(slow)} of {len(rows)} runs above) |")
    L.append(f"| pipeline <= JAX trace+lower | worst ratio "
             f"{max(r['seconds'] / r['jax_s'] for r in rows):.2f} "
             f"({len(behind)} of {len(rows)} runs above) |")
    if rss:
        L.append(f"| extra peak RSS <= {MAX_RSS_RATIO:g}x text size | worst {max(rss):.1f}x |")
    L.append("")
    for family in dict.fromkeys(r["family"] for r in rows):
        fr = [r for r in rows if r["family"] == family]
        L.append(f"### {family}: {data['descriptions'].get(family, '')}")
        L.append("")
        L.append("| ops | ops in | text | JAX s | policy | mode | s | s/10k ops | vs JAX | "
                 "RSS x text | slowest step |")
        L.append("|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---|")
        for r in sorted(fr, key=lambda r: (r["ops"], r["policy"], r["mode"])):
            step, st = max(r["steps"].items(), key=lambda kv: kv[1])
            rssx = "—" if r["rss_extra"] is None else \
                f"{r['rss_extra'] / r['inlined_text_bytes']:.1f}"
            text = f"{r['inlined_text_bytes'] / 2**20:.1f} MiB"
            if r["inlined_text_bytes"] != r["text_bytes"]:
                text += f" ({r['text_bytes'] / 2**20:.1f} MiB in)"
            L.append(f"| {r['ops']:,} | {r['ops_in']:,} | {text} | "
                     f"{r['jax_s']:.2f} | {r['policy']} | {r['mode']} | {r['seconds']:.2f} | "
                     f"{r['seconds'] / r['ops'] * 1e4:.2f} | {r['seconds'] / r['jax_s']:.2f} | "
                     f"{rssx} | {step} {st:.2f} s |")
        L.append("")
        fk = [c for c in ks if c["family"] == family and c["measurable"] and c["k"] is not None]
        if fk:
            by_step: dict = {}
            for c in fk:
                by_step.setdefault(c["step"], []).append(c["k"])
            L.append("Growth exponents k (t ~ n^k, consecutive sizes, all policies and modes; "
                     f"steps under {NOISE_S * 1000:g} ms left out): " + "; ".join(
                         f"{s} max {max(v):.2f}" for s, v in sorted(by_step.items())))
            L.append("")
    return "\n".join(L) + "\n"


def main(argv) -> int:
    import argparse
    import json
    ap = argparse.ArgumentParser(prog="python -m tools.benchmarks scaling",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--one", nargs=2, metavar=("FAMILY", "SIZE"),
                    help="measure one family at one size and print the rows as JSON")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--repeat", type=int, default=3, help="timings: best of N (default 3)")
    args = ap.parse_args(argv)
    if args.one:
        rows = measure_one(args.one[0], int(args.one[1]), args.policies.split(","),
                           args.modes.split(","), args.repeat)
        print(json.dumps(rows))
        return 0
    data = measure([int(s) for s in args.sizes.split(",")], args.families.split(","),
                   args.policies.split(","), args.modes.split(","), args.repeat,
                   log=lambda s: print(s, file=sys.stderr, flush=True))
    path = common.write_json("scaling", data)
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    import os
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.exit(main(sys.argv[1:]))
