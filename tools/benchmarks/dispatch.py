"""The cost of a call: `rp.jit` beside `jax.jit` on steps whose compute is negligible.

A gradient step of a dict of N tiny parameters (4 floats each; the loss a sum of tanh) and
a batch, returning the new parameters and the loss, so that a call is almost all dispatch:
flattening the arguments, finding the program, running it, building the results. For
N in 1, 10, 44 (the benchmark GPT's leaves) and 200, for a call that also passes the
learning rate as a Python float, and for one whose batch is a NumPy array: `jax.jit(step)`
(its C++ dispatch), `rp.jit(step)` (joint, the default) and `rp.jit(step, mode="split")`
(two executables). Then an Equinox MLP of 11
layers (its activation function a leaf that is not an array) beside `eqx.filter_jit`,
where Equinox is installed. Each call is timed as the mean over `CALLS` calls after a
warm-up, each on the parameters the last one returned, `--rounds` rounds interleaved over
the commands (a burst of load on the shared machine hits each alike); the page gives the
median.
"""
from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from tools.benchmarks import common

LEAVES = (1, 10, 44, 200)
CALLS = 200
# rp.jit's call (joint) costs at most jax.jit's + this share of it + a constant, at every size
# (a Python layer over jax's C++ dispatch: it flattens the arguments and keys each array's
# abstract value and sharding, whose comparison is Python code in JAX)
TARGET_SHARE, TARGET_CONSTANT = 0.4, 5e-6


def make_step(with_rate: bool):
    """A step of a dict of parameters, and its arguments but the parameters."""
    def loss(params, x):
        return sum(jnp.sum(jnp.tanh(p * x)) for p in params.values())

    def step(params, x, rate=0.1):
        value, grads = jax.value_and_grad(loss)(params, x)
        return jax.tree.map(lambda p, g: p - rate * g, params, grads), value

    return step, (jnp.ones((4,)), 0.1) if with_rate else (jnp.ones((4,)),)


def _equinox_step(eqx):
    def loss(model, x):
        return jnp.sum(model(x) ** 2)

    def step(model, x):
        value, grads = eqx.filter_value_and_grad(loss)(model, x)
        return jax.tree.map(lambda p, g: p - 0.1 * g if eqx.is_array(p) else p, model,
                            grads), value
    return step


def cases():
    """(name, leaves, what rp.jit is beside: its name and the function, the step, its
    parameters, its other arguments)."""
    for n in LEAVES:
        params = {f"w{i:03d}": jnp.full((4,), 0.01 * i) for i in range(n)}
        step, rest = make_step(False)
        yield f"{n} array{'s' if n > 1 else ''}", n, "jax.jit", jax.jit, step, params, rest
    step, rest = make_step(True)
    params = {f"w{i:03d}": jnp.full((4,), 0.01 * i) for i in range(44)}
    yield "44 arrays and a Python float", 44, "jax.jit", jax.jit, step, params, rest
    step, _ = make_step(False)
    yield ("44 arrays and a NumPy batch", 44, "jax.jit", jax.jit, step, params,
           (np.ones((4,), np.float32),))
    try:
        import equinox as eqx
    except ImportError:      # (the `bench` extra installs it)
        return
    model = eqx.nn.MLP(4, 4, 4, depth=10, key=jax.random.key(0))
    yield ("an Equinox MLP of 11 layers (its activation function a static leaf)",
           len(jax.tree.leaves(eqx.filter(model, eqx.is_array))), "eqx.filter_jit",
           eqx.filter_jit, _equinox_step(eqx), model, (jnp.ones((4,)),))


def _per_call(fun, params, rest) -> float:
    """Seconds per call of `fun` over CALLS calls, each on the parameters the last one
    returned (new arrays every call, as a training loop gives them)."""
    start = time.perf_counter()
    for _ in range(CALLS):
        params, _ = fun(params, *rest)
    jax.block_until_ready(jax.tree.leaves(params))
    return (time.perf_counter() - start) / CALLS


def _arrays(tree) -> list:
    return [x for x in jax.tree.leaves(tree) if isinstance(x, jax.Array)]


def measure(rounds: int, log) -> dict:
    import remat_passes as rp
    rows = []
    for name, n, base, base_jit, step, params, rest in cases():
        funs = {base: base_jit(step),
                "rp.jit": rp.jit(step, policy="nothing_saveable"),
                "rp.jit split": rp.jit(step, policy="nothing_saveable", mode="split")}
        want = funs[base](params, *rest)
        for who, fun in funs.items():
            got = fun(params, *rest)        # (built and warm)
            err = max(float(jnp.max(jnp.abs(a - b)))
                      for a, b in zip(_arrays(got), _arrays(want)))
            if err > 1e-6:
                raise SystemExit(f"dispatch: {who} on {name}: results differ from {base}'s "
                                 f"by {err}")
            _per_call(fun, params, rest)
        times = {who: [] for who in funs}
        for _ in range(rounds):
            for who, fun in funs.items():
                times[who].append(_per_call(fun, params, rest))
        rows.append({"name": name, "leaves": n, "beside": base, "times": times})
        log(f"dispatch: {name}: " + ", ".join(
            f"{who} {statistics.median(ts) * 1e6:.1f} us" for who, ts in times.items()))
    return {"meta": common.machine(), "rounds": rounds, "calls": CALLS, "rows": rows}


def checks(data) -> list[tuple[str, bool]]:
    """rp.jit's joint call within the call it is beside (jax.jit's, eqx.filter_jit's) +
    TARGET_SHARE of it + TARGET_CONSTANT, at every size."""
    out = []
    for r in data["rows"]:
        base = r.get("beside", "jax.jit")
        ours, theirs = (statistics.median(r["times"][who]) for who in ("rp.jit", base))
        limit = theirs * (1 + TARGET_SHARE) + TARGET_CONSTANT
        out.append((f"{r['name']}: rp.jit's call {ours * 1e6:.1f} us, {base}'s "
                    f"{theirs * 1e6:.1f} us (target <= {limit * 1e6:.1f} us: + "
                    f"{TARGET_SHARE:.0%} + {TARGET_CONSTANT * 1e6:.0f} us)", ours <= limit))
    return out


def render(data) -> str:
    meta = data["meta"]
    parts = ["## The cost of a call", "",
             "A gradient step of a dict of N tiny parameters and a batch, returning the new "
             "parameters and the loss, so that a call is almost all dispatch (each call on the "
             "parameters the last one returned, as in a training loop): `jax.jit(step)`, "
             "`rp.jit(step)` (joint, the default) and `rp.jit(step, mode=\"split\")` (two "
             "executables); and the same for an Equinox MLP (4 wide), beside "
             "`eqx.filter_jit`. A call with no NNX object whose dynamic leaves are device "
             "arrays, NumPy arrays, Python numbers or leaves made static, like an earlier one, "
             "runs its program after one flatten and a dict lookup (`api/call_cache.py`); "
             "calls with NNX objects take rp.jit's full way. Median over "
             f"{data['rounds']} interleaved rounds of the mean of {data['calls']} calls "
             f"({meta['cpus']} CPUs, jax {meta['jax']}, commit {meta['commit']}; timings on "
             "a shared machine: compare within a run). Regenerate with "
             "`python -m tools.benchmarks dispatch`.", "",
             "| arguments | beside | its call | rp.jit | / its | rp.jit split | / its |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in data["rows"]:
        med = {who: statistics.median(ts) for who, ts in r["times"].items()}
        base = r.get("beside", "jax.jit")
        theirs = med[base]
        parts.append(f"| {r['name']} | {base} | {theirs * 1e6:.1f} us | "
                     f"{med['rp.jit'] * 1e6:.1f} us | {med['rp.jit'] / theirs:.2f} | "
                     f"{med['rp.jit split'] * 1e6:.1f} us | "
                     f"{med['rp.jit split'] / theirs:.2f} |")
    parts.append("")
    parts += [f"- {'pass' if ok else 'FAIL'}: {text}" for text, ok in checks(data)]
    return "\n".join(parts) + "\n"
