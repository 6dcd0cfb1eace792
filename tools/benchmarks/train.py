"""A training step through `rp.jit` beside `jax.jit`: step time and XLA's memory.

A small decoder (causal self-attention and a GELU MLP per layer, RMS norms, names on the
projections and the MLP activation) trained with optax AdamW. For each policy and form,
`rp.jit(step, policy=..., mode=...)` against `jax.jit(step)` and against `jax.jit` of the
same step with `jax.checkpoint(loss, policy)` (JAX's own remat), and with `rp.jit(loss,
policy)` differentiated by the step (`jax.grad(rp.jit(loss))`): the median step time of
`--steps` steps after 3 warm-up steps (`block_until_ready`), the commands interleaved
round by round so that load on the shared machine hits all alike, and XLA's
`memory_analysis()` of what ran (temp + arguments + outputs - aliased; the split form runs
two executables, the backward's arguments being what the forward handed over: the larger).

`cold_start` times the first call of a fresh process (export, remat, compile, run), each in
its own Python process: with no cache, with rp.jit's disk cache of rewritten modules, and
with it and JAX's compilation cache, beside `jax.jit` without and with JAX's cache.
"""
from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from tools.benchmarks import common

D, HEADS, T, BATCH, LAYERS = 128, 4, 64, 8, 4
POLICIES = ["nothing_saveable", "dots_saveable", "save_only_these_names('mlp_act')",
            "save_only_these_names('resid')"]


def init(key):
    def dense(k, n, m):
        return jax.random.normal(k, (n, m)) / np.sqrt(n)
    layers = []
    for i in range(LAYERS):
        k = jax.random.split(jax.random.fold_in(key, i), 4)
        layers.append({"qkv": dense(k[0], D, 3 * D), "out": dense(k[1], D, D),
                       "w1": dense(k[2], D, 4 * D), "w2": dense(k[3], 4 * D, D),
                       "n1": jnp.ones(D), "n2": jnp.ones(D)})
    return layers


def _norm(x, scale):
    return x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def loss(params, x, y):
    import remat_passes as rp
    h = x
    mask = jnp.tril(jnp.ones((T, T), bool))
    for p in params:
        h = rp.checkpoint_name(h, "resid")      # each layer's input
        qkv = rp.checkpoint_name(_norm(h, p["n1"]) @ p["qkv"], "qkv")
        q, k, v = (a.reshape(BATCH, T, HEADS, D // HEADS) for a in jnp.split(qkv, 3, -1))
        s = jnp.einsum("bthd,bshd->bhts", q, k) / np.sqrt(D // HEADS)
        a = jax.nn.softmax(jnp.where(mask, s, -1e9), axis=-1)
        ctx = jnp.einsum("bhts,bshd->bthd", a, v).reshape(BATCH, T, D)
        h = h + rp.checkpoint_name(ctx @ p["out"], "attn_out")
        m = rp.checkpoint_name(jax.nn.gelu(_norm(h, p["n2"]) @ p["w1"]), "mlp_act")
        h = h + m @ p["w2"]
    return jnp.mean((h - y) ** 2)


def make_step(loss_fn, opt):
    import optax

    def step(params, opt_state, x, y):
        value, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value
    return step


def _jax_twin(spec: str):
    cp = jax.checkpoint_policies
    if spec.startswith("save_only_these_names"):
        return cp.save_only_these_names(spec.split("'")[1])
    return getattr(cp, spec)


def optimizer():
    import optax
    return optax.adamw(1e-3)


def _setup() -> tuple:
    """(step, params, opt_state, x, y): the training step and its inputs."""
    opt = optimizer()
    params = init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (BATCH, T, D))
    y = jax.random.normal(jax.random.key(2), (BATCH, T, D))
    return make_step(loss, opt), params, opt.init(params), x, y


def measure(steps: int = 20, log=print) -> dict:
    import remat_passes as rp
    step, params, state, x, y = _setup()
    runs = {"jax.jit": jax.jit(step)}
    memory = {"jax.jit": [common.xla_memory(jax.jit(step).lower(params, state, x, y).compile())]}
    compile_s = {}
    plain = rp.jit(step, mode="joint")       # no policy: the program jax.jit runs, plus our export
    t0 = time.perf_counter()
    lowered = plain.lower(params, state, x, y)
    memory["rp.jit no policy joint"] = [common.xla_memory(e) for e in lowered.executables]
    compile_s["rp.jit no policy joint"] = time.perf_counter() - t0
    runs["rp.jit no policy joint"] = plain
    for spec in POLICIES:
        ckpt = jax.jit(make_step(jax.checkpoint(loss, policy=_jax_twin(spec)), optimizer()))
        runs[f"jax.checkpoint {spec}"] = ckpt
        compiled = ckpt.lower(params, state, x, y).compile()
        memory[f"jax.checkpoint {spec}"] = [common.xla_memory(compiled)]
        # the loss alone through rp.jit, differentiated by the step (api/differentiated)
        name = f"jax.grad(rp.jit(loss)) {spec}"
        t0 = time.perf_counter()
        outside = jax.jit(make_step(rp.jit(loss, policy=spec), optimizer()))
        compiled = outside.lower(params, state, x, y).compile()
        compile_s[name] = time.perf_counter() - t0
        runs[name], memory[name] = outside, [common.xla_memory(compiled)]
        log(f"train: built {name} in {compile_s[name]:.1f} s")
        for mode, tie in (("joint", None), ("joint", False), ("split", None)):
            if tie is False and jax.default_backend() != "cpu":
                continue       # the tie is on by default only on CPU
            name = f"rp.jit {spec} {mode}" + (", untied" if tie is False else "")
            fn = rp.jit(step, policy=spec, mode=mode, tie_to_cotangent=tie)
            t0 = time.perf_counter()
            lowered = fn.lower(params, state, x, y)
            compile_s[name] = time.perf_counter() - t0
            runs[name] = fn
            memory[name] = [common.xla_memory(e) for e in lowered.executables]
            log(f"train: built {name} in {compile_s[name]:.1f} s")
    times: dict = {name: [] for name in runs}
    for name, fn in runs.items():          # warm-up
        for _ in range(3):
            jax.block_until_ready(fn(params, state, x, y))
    for i in range(steps):
        for name, fn in runs.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn(params, state, x, y))
            times[name].append(time.perf_counter() - t0)
    losses = {name: float(fn(params, state, x, y)[2]) for name, fn in runs.items()}
    cold = cold_start(log)
    meta = dict(common.machine(), device=jax.devices()[0].device_kind)
    return {"meta": meta, "steps": steps, "cold_start": cold,
            "model": {"d": D, "heads": HEADS, "t": T, "batch": BATCH, "layers": LAYERS},
            "rows": [{"name": name, "times": times[name], "memory": memory[name],
                      "loss": losses[name], "build_s": compile_s.get(name)}
                     for name in runs]}


COLD_POLICY, COLD_MODE = "nothing_saveable", "split"


def first_call(kind: str, rp_cache: str | None, jax_cache: str | None) -> dict:
    """In this (fresh) process: seconds to the first step's result, through `kind`
    ("rp.jit" or "jax.jit"), with the caches given (None: none)."""
    import remat_passes as rp
    if jax_cache:
        jax.config.update("jax_compilation_cache_dir", jax_cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    step, params, state, x, y = _setup()
    jax.block_until_ready((params, state, x, y))
    fn = rp.jit(step, policy=COLD_POLICY, mode=COLD_MODE, cache_dir=rp_cache or False) \
        if kind == "rp.jit" else jax.jit(step)
    t0 = time.perf_counter()
    jax.block_until_ready(fn(params, state, x, y))
    seconds = time.perf_counter() - t0
    if kind != "rp.jit":
        return {"seconds": seconds, "from_cache": None, "pipeline_s": None}
    lowered = fn.lower(params, state, x, y)
    return {"seconds": seconds, "from_cache": lowered.from_cache,
            "pipeline_s": sum(t for _, t in getattr(lowered.module, "timings", []))}


def cold_start(log=print, repeat: int = 2) -> list[dict]:
    """First-call seconds of fresh processes (best of `repeat`), caches as named."""
    import json
    import subprocess
    import sys
    import tempfile

    def fresh(kind, rp_cache, jax_cache) -> dict:
        code = ("import json; from tools.benchmarks import train; "
                f"print(json.dumps(train.first_call({kind!r}, {rp_cache!r}, {jax_cache!r})))")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True)
        return json.loads(proc.stdout.strip().splitlines()[-1])

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        rp_dir, jax_dir, jit_dir = (f"{tmp}/{n}" for n in ("rp", "jax", "jit"))
        fresh("rp.jit", rp_dir, jax_dir)          # fills both caches
        fresh("jax.jit", None, jit_dir)
        for name, args in (("rp.jit, no cache", ("rp.jit", None, None)),
                           ("rp.jit, rp cache", ("rp.jit", rp_dir, None)),
                           ("rp.jit, rp cache + JAX cache", ("rp.jit", rp_dir, jax_dir)),
                           ("jax.jit, no cache", ("jax.jit", None, None)),
                           ("jax.jit, JAX cache", ("jax.jit", None, jit_dir))):
            runs = [fresh(*args) for _ in range(repeat)]
            best = min(runs, key=lambda r: r["seconds"])
            rows.append({"name": name, **best})
            log(f"train: first call, {name}: {best['seconds']:.2f} s")
    return rows


def checks(data) -> list[tuple[str, bool]]:
    """Dispatch at jax.jit's speed: with no policy (the same program) within 10% of
    jax.jit; under a policy, the joint form without the tie within 10% of JAX's own remat
    of it (`jax.checkpoint(loss, policy)`: the same program, whose recomputation XLA:CPU
    undoes alike). Memory: under every policy that saves more than nothing, XLA's peak of
    what rp.jit runs by default (joint, tied on CPU) and of its split form is below
    jax.jit's; the loss alone through rp.jit, differentiated by the step
    (`jax.grad(rp.jit(loss))`), within jax.checkpoint's peak + 2%. Every loss equal."""
    rows = {r["name"]: r for r in data["rows"]}
    on_cpu = data["meta"]["backend"] == "cpu"
    base = statistics.median(rows["jax.jit"]["times"])
    base_peak = common.xla_peak(rows["jax.jit"]["memory"])
    out = []
    for name, r in rows.items():
        med = statistics.median(r["times"])
        if name == "rp.jit no policy joint":
            out.append((f"{name}: step time {med / base:.2f}x jax.jit's (target <= 1.10)",
                        med / base <= 1.10))
        elif name.startswith("rp.jit") and (name.endswith(" joint, untied") or (
                not on_cpu and name.endswith(" joint") and "no policy" not in name)):
            # (off the CPU the joint form is untied by default: no separate row)
            spec = name[len("rp.jit "):].rsplit(" joint", 1)[0]
            ref = statistics.median(rows[f"jax.checkpoint {spec}"]["times"])
            out.append((f"{name}: step time {med / ref:.2f}x jax.checkpoint's (target <= 1.10)",
                        med / ref <= 1.10))
        if name.startswith("rp.jit") and "nothing_saveable" not in name \
                and name.endswith((" joint", " split")) and "no policy" not in name:
            p = common.xla_peak(r["memory"])
            out.append((f"{name}: XLA peak {p / base_peak:.2f}x jax.jit's (target < 1)",
                        p < base_peak))
        elif name.startswith("jax.grad(rp.jit(loss))"):
            spec = name[len("jax.grad(rp.jit(loss)) "):]
            p = common.xla_peak(r["memory"])
            ref = common.xla_peak(rows[f"jax.checkpoint {spec}"]["memory"])
            out.append((f"{name}: XLA peak {p / ref:.2f}x jax.checkpoint's (target <= 1.02)",
                        p <= 1.02 * ref))
        if name.startswith(("rp.jit", "jax.grad(rp.jit")):
            close = abs(r["loss"] - rows["jax.jit"]["loss"]) <= 2e-5 * abs(rows["jax.jit"]["loss"])
            out.append((f"{name}: loss {r['loss']:.6f} = jax.jit's {rows['jax.jit']['loss']:.6f}",
                        close))
    cold = {r["name"]: r for r in data.get("cold_start", [])}
    if cold:
        out.append(("a fresh process reads the rewrite from rp.jit's disk cache",
                    bool(cold["rp.jit, rp cache"]["from_cache"])))
        a = cold["rp.jit, no cache"]["pipeline_s"]
        b = cold["rp.jit, rp cache"]["pipeline_s"]
        out.append((f"with the disk cache the pipeline takes {b:.2f} s (without: {a:.2f} s)",
                    b == 0 < a))
    return out


def render(data) -> str:
    rows = data["rows"]
    base = statistics.median(next(r for r in rows if r["name"] == "jax.jit")["times"])
    m, meta = data["model"], data["meta"]
    on_cpu = meta["backend"] == "cpu"
    where = (f"{meta['cpus']} CPUs" if on_cpu else
             f"{meta.get('device', 'a GPU')}, {meta['cpus']} host CPUs")
    backend_text = (
        "XLA:CPU deletes "
        "optimization barriers before it schedules, so `jax.checkpoint` saves nothing "
        "here; rp.jit ties each recomputation to the cotangent by data on CPU "
        "(`tie_to_cotangent`, its default there), so that its plans keep their saving. "
        if on_cpu else
        "XLA:GPU keeps optimization barriers, so `jax.checkpoint` saves what its policy "
        "says and rp.jit does not tie its recomputations to the cotangent (its default "
        "off the CPU). Measured on the device machine (`bash tools/benchmarks/"
        "device_round.sh train`; results/train_gpu.json): a step of this model takes "
        "about a millisecond there, so its step times are mostly dispatch and launch. ")
    parts = ["## Training with rp.jit" + ("" if on_cpu else " on a GPU"), "",
             f"A decoder of {m['layers']} layers (d={m['d']}, {m['heads']} heads, "
             f"{m['t']} tokens, batch {m['batch']}) trained with optax AdamW: `rp.jit(step, "
             "policy=P, mode=M)` beside `jax.jit(step)` and `jax.jit` of the step with "
             "`jax.checkpoint(loss, P)`. Median of "
             f"{data['steps']} steps after 3 warm-up steps, interleaved ({where}, "
             f"jax {meta['jax']}, commit {meta['commit']}); memory is XLA's "
             "`memory_analysis()` of the executables that ran: temp + arguments + outputs, less "
             "outputs written into donated arguments (`common.xla_footprint`), and "
             "for the split form the larger of its two executables. " + backend_text +
             "`nothing_saveable` over the whole step recomputes the whole forward at the "
             "start of the backward: no saving in any form (that takes per-layer "
             "checkpoints, e.g. `save_only_these_names('resid')` on each layer's input). "
             "`jax.grad(rp.jit(loss)) P`: the same step under `jax.jit`, with the loss alone "
             "through `rp.jit(loss, policy=P)`, differentiated by the step's "
             "`jax.value_and_grad` (see [the tutorial](tutorial.md#0-in-a-training-loop-rpjit)); "
             "its build is the first call's lowering and compilation. "
             + ("Regenerate with `python -m tools.benchmarks train`." if on_cpu else ""), "",
             "| step | median step | / jax.jit | XLA peak | build |",
             "|---|---:|---:|---:|---:|"]
    for r in rows:
        med = statistics.median(r["times"])
        build = f"{r['build_s']:.1f} s" if r["build_s"] is not None else ""
        parts.append(f"| {r['name']} | {med * 1000:.1f} ms | {med / base:.2f} | "
                     f"{common.xla_peak(r['memory']):,} B | {build} |")
    cold = data.get("cold_start")
    if cold:
        parts += ["", f"The first call of a fresh process (`{COLD_POLICY}`, {COLD_MODE}; best of "
                  "2 processes): export, remat and XLA's compilation, then one step. rp.jit's "
                  "disk cache (`cache_dir=`, `$REMAT_PASSES_CACHE_DIR`) skips the pipeline "
                  "and keeps which of the programs a build weighed ran, so that a later "
                  "process compiles only that one; JAX's compilation cache skips XLA's "
                  "compilation.", "",
                  "| first call | seconds | of which the remat pipeline | rewrite from the disk "
                  "cache |", "|---|---:|---:|---|"]
        for r in cold:
            hit = "" if r["from_cache"] is None else "yes" if r["from_cache"] else "no"
            pipe = "" if r["pipeline_s"] is None else f"{r['pipeline_s']:.2f}"
            parts.append(f"| {r['name']} | {r['seconds']:.2f} | {pipe} | {hit} |")
    parts += ["", "Checks:", ""]
    parts += [f"- {'pass' if ok else 'MISS'}: {text}" for text, ok in checks(data)]
    return "\n".join(parts) + "\n"
