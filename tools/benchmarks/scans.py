"""Long scans: `segment-scans` beside the two-level scheme written by hand with `jax.checkpoint`.

A recurrent scan (`h = tanh(h @ W + x @ U)`, an 8x64 carry) of n steps, per segment length k:

* ours: `rp.remat(export_vjp(rnn), scan_segments=k)` (no per-iteration policy: a slot keeps
  what the body's backward reads), compiled with XLA;
* JAX's hand-written scheme: an outer `lax.scan` over n/k segments of
  `jax.checkpoint(inner lax.scan of k steps)` (with k1xk2, the inner scan is itself one of
  checkpointed sub-segments), `jax.jit(jax.grad(...))`.

Per row: XLA's scratch (temp) bytes of the gradient program, FLOPs as `remat_passes` counts
them (`cost.flops.function_flops` of the exported VJP, loops times their trip counts; XLA's
own `cost_analysis()` counts a loop body once), and the gradient's largest error against
`jax.grad` of the plain scan. The first row of each n is the scan without segments.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

import remat_passes as rp
from remat_passes.core.residuals import activation_bytes
from remat_passes.cost.flops import function_flops
from tools.benchmarks import common

CARRY, WIDTH, INPUT = 8, 64, 32
CASES = {256: (4, 8, 16, 32, 64, (64, 8), (16, 4)), 4096: (16, 64, 256, (256, 16), (512, 64))}
FLOPS_SLACK = 1.01      # ours <= the hand-written scheme's + 1%
SWEEP_POINTS = 10
TEMP_SLACK = 1.02       # XLA scratch: ours <= the hand-written scheme's + 2%


def _step(W, U):
    def step(h, x):
        return jnp.tanh(h @ W + x @ U), None
    return step


def rnn(params, xs):
    W, U = params
    h, _ = jax.lax.scan(_step(W, U), jnp.zeros((CARRY, WIDTH)), xs)
    return (h ** 2).sum()


def two_level(k):
    """The scheme one writes by hand: checkpointed segments of k steps, scanned."""
    return hand_written([k])


def hand_written(levels):
    """Checkpointed segments of levels[0] steps, each a scan of checkpointed sub-segments of
    levels[1] steps, ...: the nesting one writes by hand (lengths must divide)."""
    def loss(params, xs):
        W, U = params

        def run(h, block, depth):
            if depth == len(levels):
                return jax.lax.scan(_step(W, U), h, block)[0]
            inner = levels[depth]

            @jax.checkpoint
            def segment(h, sub):
                return run(h, sub, depth + 1), None
            sub = block.reshape(block.shape[0] // inner, inner, *block.shape[1:])
            return jax.lax.scan(segment, h, sub)[0]
        h = run(jnp.zeros((CARRY, WIDTH)), xs, 0)
        return (h ** 2).sum()
    return loss


def _error(got, want) -> float:
    """The largest difference of the floating-point leaves (an integer input's cotangent is
    float0 in JAX and a boolean zero in the module: nothing to compare)."""
    pairs = zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want))
    return max((float(jnp.abs(jnp.asarray(a, jnp.float32) - jnp.asarray(b, jnp.float32)).max())
                for a, b in pairs if jnp.issubdtype(jnp.asarray(a).dtype, jnp.floating)),
               default=0.0)


def measure(cases=CASES, log=print, sweeps: bool = True) -> dict:
    rows = []
    for n, ks in cases.items():
        key = jax.random.PRNGKey(n)
        k1, k2, k3 = jax.random.split(key, 3)
        params = (jax.random.normal(k1, (WIDTH, WIDTH)) * 0.1,
                  jax.random.normal(k2, (INPUT, WIDTH)) * 0.1)
        xs = jax.random.normal(k3, (n, CARRY, INPUT))
        ct = jnp.float32(1.0)
        want = jax.grad(rnn)(params, xs)
        module = rp.export_vjp(rnn, params, xs)
        for k in (0,) + tuple(ks):
            levels = list(k) if isinstance(k, tuple) else [k]
            ours = rp.remat(module, scan_segments=levels if k else 0)
            compiled = rp.compile(ours, "main").lower(params, xs, ct).compile()
            row = {"n": n, "k": "x".join(map(str, levels)), "temp": compiled.memory_analysis().temp_size_in_bytes,
                   "flops": function_flops(ours),
                   "error": _error(compiled(params, xs, ct)[1], want)}
            if k:
                hand = hand_written(levels)
                jc = jax.jit(jax.grad(hand)).lower(params, xs).compile()
                row["jax"] = {"temp": jc.memory_analysis().temp_size_in_bytes,
                              "flops": function_flops(rp.export_vjp(hand, params, xs)),
                              "error": _error(jc(params, xs), want)}
            rows.append(row)
            log(f"scans: n={n} k={row['k']}: temp {row['temp']:,} B")
    return {"meta": common.machine(), "carry": [CARRY, WIDTH], "rows": rows,
            "sweeps": measure_sweeps(log) if sweeps else []}


def sweep(name, fun, args, log=print, points=SWEEP_POINTS) -> dict:
    """`auto(budget=b)` from an eighth of the least a per-iteration plan keeps up to no
    remat: what each plan keeps, its FLOPs, its gradient error, how many levels."""
    module = rp.export_vjp(fun, *args)
    lo, hi = rp.bounds(module)
    out, vjp = jax.vjp(fun, *args)
    ct = jnp.ones_like(out)
    want = vjp(ct)
    rows = []
    for q in range(points):
        b = int(lo / 8 + (hi - lo / 8) * q / (points - 1))
        try:
            plan = rp.remat(module, f"auto(budget={b})")
        except rp.RematError as e:
            rows.append({"budget": b,        # (the first clause: what it cannot keep)
                         "error_text": str(e).splitlines()[0].split(" (")[0]})
            continue
        got = rp.compile(plan, "main")(*args, ct)[1]
        rows.append({"budget": b, "kept": activation_bytes(plan.residuals, plan.segmented), "flops": function_flops(plan),
                     "levels": [d.levels for d in plan.segmented], "error": _error(got, want)})
        log(f"scans: sweep {name} budget {b:,}: keeps {rows[-1]['kept']:,} B")
    return {"name": name, "per_iteration_least": lo, "no_remat": hi, "points": rows}


def measure_sweeps(log=print) -> list:
    from tools.benchmarks.models import MODELS, _identity
    n = 4096
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(1), 3)
    params = (jax.random.normal(k1, (WIDTH, WIDTH)) * 0.1,
              jax.random.normal(k2, (INPUT, WIDTH)) * 0.1)
    xs = jax.random.normal(k3, (n, CARRY, INPUT))
    gpt = MODELS["gpt-scan"]()
    return [sweep(f"rnn, {n} steps", rnn, (params, xs), log),
            sweep("gpt-scan", gpt.build(_identity), gpt.args, log)]


def checks(data) -> list[tuple[str, bool]]:
    out = []
    for r in data["rows"]:
        where = f"n={r['n']} k={r['k']}"
        out.append((f"{where}: gradient error {r['error']:.1e}", r["error"] <= 1e-5))
        if "jax" not in r:
            continue
        j = r["jax"]
        out.append((f"{where}: FLOPs {r['flops']:,.0f} vs the hand-written scheme's "
                    f"{j['flops']:,.0f}", r["flops"] <= j["flops"] * FLOPS_SLACK))
        out.append((f"{where}: XLA scratch {r['temp']:,} B vs the hand-written scheme's "
                    f"{j['temp']:,} B", r["temp"] <= j["temp"] * TEMP_SLACK))
    for sw in data.get("sweeps", []):
        done = [p for p in sw["points"] if "kept" in p]
        for p in done:
            out.append((f"sweep {sw['name']} budget {p['budget']:,}: keeps {p['kept']:,} B",
                        p["kept"] <= p["budget"]))
            out.append((f"sweep {sw['name']} budget {p['budget']:,}: gradient error "
                        f"{p['error']:.1e}", p["error"] <= 1e-4))
        for a, b in zip(done, done[1:]):
            out.append((f"sweep {sw['name']}: FLOPs {b['flops']:,.0f} at {b['budget']:,} B "
                        f"after {a['flops']:,.0f} at {a['budget']:,} B",
                        b["flops"] <= a["flops"] * 1.0001))
    return out


def render(data) -> str:
    meta = data["meta"]
    c, w = data["carry"]
    parts = ["## Long scans: segments", "",
             f"A recurrent scan with a {c}x{w} carry, n steps, in segments of k (`rp.remat(module, "
             "scan_segments=k)`; k1xk2: segments rerun in sub-segments, three levels) beside "
             "the same scheme written by hand (an outer `lax.scan` of `jax.checkpoint`ed "
             "inner scans of k steps, nested once more for k1xk2). XLA's scratch bytes of "
             "the gradient program, FLOPs as `remat_passes` counts them (trip counts included), "
             f"the gradient's error against `jax.grad` ({meta['backend']}, jax {meta['jax']}, "
             f"commit {meta['commit']}). k = 0 is the scan without segments. Regenerate with "
             "`python -m tools.benchmarks scans`.", "",
             "| n | k | XLA scratch ours / by hand | FLOPs ours / by hand | error ours / by hand |",
             "|---:|---:|---:|---:|---:|"]
    for r in data["rows"]:
        j = r.get("jax")
        if j is None:
            parts.append(f"| {r['n']} | {r['k']} | {r['temp']:,} | {r['flops']:,.0f} | "
                         f"{r['error']:.1e} |")
            continue
        parts.append(f"| {r['n']} | {r['k']} | {r['temp']:,} / {j['temp']:,} "
                     f"({r['temp'] / j['temp']:.2f}) | {r['flops']:,.0f} / {j['flops']:,.0f} "
                     f"({r['flops'] / j['flops']:.3f}) | {r['error']:.1e} / {j['error']:.1e} |")
    for sw in data.get("sweeps", []):
        parts += ["", f"`auto(budget=b)` over {sw['name']}: from an eighth of the least a "
                  f"per-iteration plan keeps ({sw['per_iteration_least']:,} B) up to no remat "
                  f"({sw['no_remat']:,} B). Below that least the planner segments the scan "
                  "(levels: segment lengths per loop).", "",
                  "| budget | keeps | FLOPs | levels | gradient error |",
                  "|---:|---:|---:|---|---:|"]
        for p in sw["points"]:
            if "kept" not in p:
                parts.append(f"| {p['budget']:,} | {p['error_text']} | | | |")
                continue
            levels = "; ".join("x".join(map(str, lv)) for lv in p["levels"]) or "none"
            parts.append(f"| {p['budget']:,} | {p['kept']:,} | {p['flops']:,.0f} | {levels} | "
                         f"{p['error']:.1e} |")
    results = checks(data)
    missed = [t for t, ok in results if not ok]
    parts += ["", f"Checks: {len(results) - len(missed)} of {len(results)} pass (gradients "
              "within 1e-5 of `jax.grad` (1e-4 along the sweeps), FLOPs at most the "
              "hand-written scheme's + 1%, XLA scratch at most its + 2%; along the sweeps, "
              "bytes within the budget and FLOPs never rising as the budget grows). Missed:", ""]
    parts += [f"- {t}" for t in missed] or ["- none"]
    return "\n".join(parts) + "\n"
