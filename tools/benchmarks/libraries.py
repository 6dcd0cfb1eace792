"""rp.jit of training steps written for Flax NNX and Equinox, beside those libraries' jits.

One model in both libraries: `BLOCKS` residual blocks (LayerNorm, Linear d -> 4d, GELU,
Linear 4d -> d) and a linear head, softmax cross-entropy, optax AdamW, a batch of `BATCH`
vectors of `D`. Each step is written as the library writes it: Flax NNX's updates the Module
and the Optimizer in place (`optimizer.update(model, grads)`), Equinox's returns the model
and the optimizer state (`eqx.filter_value_and_grad`, `eqx.apply_updates`), its Module
holding the activation function (a leaf that is not an array). Per library: its own jit
(`nnx.jit`, `eqx.filter_jit`), that jit with the loss in the library's checkpoint
(`nnx.remat`, `eqx.filter_checkpoint`) under `CHECKPOINTED` policies, that jit with the
loss in `rp.jit(loss, policy=P)` (differentiated from outside, by the library's
value_and_grad) under the same policies, and `rp.jit(step, policy=P)`, with nothing donated
and with
the model and optimizer donated. Measured: the losses of `STEPS` steps from the same initial
state, XLA's `memory_analysis()` of the program that ran (temp bytes; footprint: temp +
arguments + outputs - aliased), and the median step time over `--steps` steps after 3
warm-up steps, the runners interleaved round by round.
"""
from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp

from tools.benchmarks import common

D, BLOCKS, BATCH, CLASSES = 256, 6, 512, 10
POLICIES = ("dots_saveable", "nothing_saveable")
# the policies also run through the library's own checkpoint (nnx.remat,
# eqx.filter_checkpoint: jax.checkpoint) around the loss, under its jit
CHECKPOINTED = ("dots_saveable",)
STEPS = 3       # (the losses compared)
# rp.jit's step beside the library's own checkpoint of the same policy: at most this many
# times its median (on XLA:CPU rp.jit recomputes what the library's checkpoint, its barriers
# deleted, does not; fold-dot-transposes took the Equinox step from 1.34x to about 1.0x)
STEP_SLACK = 1.15


def _data():
    x = jax.random.normal(jax.random.key(1), (BATCH, D))
    return x, jnp.arange(BATCH) % CLASSES


def _xent(logits, y):
    import optax
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def _rp_jits() -> list:
    """(row name, policy, rp.jit's other options) of the rp.jit runners: each policy, and
    on CPU `dots_saveable` also untied (`tie_to_cotangent=False`: XLA:CPU then undoes the
    recomputation, and the step takes the time it takes without remat)."""
    out = [(f"rp.jit {p}", p, {}) for p in POLICIES]
    if jax.default_backend() == "cpu":
        out.append(("rp.jit dots_saveable, untied", "dots_saveable",
                    {"tie_to_cotangent": False}))
    return out


# ---------------------------------------------------------------- Flax NNX --
def nnx_runners(donate: bool) -> dict:
    """name -> (a function of no arguments running one step on its own objects, the
    compiled program's memory)."""
    import optax
    from flax import nnx

    import remat_passes as rp

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.norm = nnx.LayerNorm(D, rngs=rngs)
            self.up, self.down = nnx.Linear(D, 4 * D, rngs=rngs), nnx.Linear(4 * D, D, rngs=rngs)

        def __call__(self, x):
            return x + self.down(jax.nn.gelu(self.up(self.norm(x))))

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.blocks = getattr(nnx, "List", list)([Block(rngs) for _ in range(BLOCKS)])
            self.head = nnx.Linear(D, CLASSES, rngs=rngs)

        def __call__(self, x):
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    def make_step(checkpoint=None, rp_loss=None):
        def loss(m, x, y):
            return _xent(m(x), y)
        if checkpoint is not None:
            loss = nnx.remat(loss, policy=getattr(jax.checkpoint_policies, checkpoint))
        if rp_loss is not None:
            loss = rp.jit(loss, policy=rp_loss)

        def step(model, optimizer, x, y):
            value, grads = nnx.value_and_grad(loss)(model, x, y)
            optimizer.update(model, grads)
            return value
        return step

    step = make_step()
    x, y = _data()
    donated = dict(donate_argnums=(0, 1)) if donate else {}
    jits = {"nnx.jit": nnx.jit(step, **donated)}
    jits.update({f"nnx.jit, nnx.remat {p}": nnx.jit(make_step(p), **donated)
                 for p in CHECKPOINTED})
    jits.update({f"nnx.jit, rp.jit(loss) {p}": nnx.jit(make_step(rp_loss=p), **donated)
                 for p in CHECKPOINTED})
    jits.update({name: rp.jit(step, policy=p, **donated, **options)
                 for name, p, options in _rp_jits()})
    out = {}
    for name, jitted in jits.items():
        model = Net(nnx.Rngs(0))
        optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
        lowered = jitted.lower(model, optimizer, x, y)
        executables = lowered.executables if name.startswith("rp.jit") else \
            [lowered.compile()]
        out[name] = (lambda j=jitted, m=model, o=optimizer: j(m, o, x, y),
                     [common.xla_memory(e) for e in executables])
    return out


# ----------------------------------------------------------------- Equinox --
def equinox_runners(donate: bool) -> dict:
    """As `nnx_runners`, for the Equinox step (its state carried between calls)."""
    import equinox as eqx
    import optax

    import remat_passes as rp

    class Block(eqx.Module):
        norm: eqx.nn.LayerNorm
        up: eqx.nn.Linear
        down: eqx.nn.Linear
        act: object

        def __init__(self, key):
            k1, k2 = jax.random.split(key)
            self.norm, self.act = eqx.nn.LayerNorm(D), jax.nn.gelu
            self.up, self.down = eqx.nn.Linear(D, 4 * D, key=k1), eqx.nn.Linear(4 * D, D, key=k2)

        def __call__(self, x):
            return x + self.down(self.act(self.up(self.norm(x))))

    class Net(eqx.Module):
        blocks: list
        head: eqx.nn.Linear

        def __init__(self, key):
            keys = jax.random.split(key, BLOCKS + 1)
            self.blocks = [Block(k) for k in keys[:BLOCKS]]
            self.head = eqx.nn.Linear(D, CLASSES, key=keys[-1])

        def __call__(self, x):
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    opt = optax.adamw(1e-3)

    def make_step(checkpoint=None, rp_loss=None):
        def loss(m, x, y):
            return _xent(jax.vmap(m)(x), y)
        if checkpoint is not None:
            loss = eqx.filter_checkpoint(loss, policy=getattr(jax.checkpoint_policies,
                                                              checkpoint))
        if rp_loss is not None:
            loss = rp.jit(loss, policy=rp_loss)

        def step(model, opt_state, x, y):
            value, grads = eqx.filter_value_and_grad(loss)(model, x, y)
            updates, opt_state = opt.update(grads, opt_state, eqx.filter(model, eqx.is_array))
            return eqx.apply_updates(model, updates), opt_state, value
        return step

    step = make_step()
    x, y = _data()
    # (eqx.filter_jit donates all of the arguments or none: donated, both runners donate the
    # batch too, and each call gets a copy of it)
    donation = "all" if donate else "none"
    jits = {"eqx.filter_jit": eqx.filter_jit(step, donate=donation)}
    jits.update({f"eqx.filter_jit, eqx.filter_checkpoint {p}":
                 eqx.filter_jit(make_step(p), donate=donation) for p in CHECKPOINTED})
    jits.update({f"eqx.filter_jit, rp.jit(loss) {p}":
                 eqx.filter_jit(make_step(rp_loss=p), donate=donation) for p in CHECKPOINTED})
    jits.update({name: rp.jit(step, policy=p, **options, **(
        dict(donate_argnums=(0, 1, 2, 3)) if donate else {}))
        for name, p, options in _rp_jits()})
    out = {}
    for name, jitted in jits.items():
        model = Net(jax.random.key(0))
        state = [model, opt.init(eqx.filter(model, eqx.is_array))]
        lowered = jitted.lower(*state, x, y)
        executables = lowered.executables if name.startswith("rp.jit") else \
            [lowered.compile().compiled]

        def run(j=jitted, s=state):
            batch = (jnp.copy(x), jnp.copy(y)) if donate else (x, y)
            s[0], s[1], loss = j(s[0], s[1], *batch)
            return loss
        out[name] = (run, [common.xla_memory(e) for e in executables])
    return out


LIBRARIES = {"flax-nnx": nnx_runners, "equinox": equinox_runners}


def measure(steps: int = 20, log=print) -> dict:
    rows = []
    for library, make in LIBRARIES.items():
        for donate in (False, True):
            runners = make(donate)
            losses = {name: [float(run()) for _ in range(STEPS)]
                      for name, (run, _) in runners.items()}
            times = {name: [] for name in runners}
            for name, (run, _) in runners.items():      # warm-up
                for _ in range(3):
                    jax.block_until_ready(run())
            for _ in range(steps):
                for name, (run, _) in runners.items():
                    t0 = time.perf_counter()
                    jax.block_until_ready(run())
                    times[name].append(time.perf_counter() - t0)
            for name, (_, memory) in runners.items():
                rows.append({"library": library, "donated": donate, "name": name,
                             "losses": losses[name], "memory": memory, "times": times[name]})
                log(f"libraries: {library}{', donated' if donate else ''}, {name}: "
                    f"temp {memory[0]['temp']:,} B, "
                    f"{statistics.median(times[name]) * 1000:.1f} ms")
    return {"meta": common.machine(), "steps": steps,
            "model": {"d": D, "blocks": BLOCKS, "batch": BATCH, "classes": CLASSES},
            "rows": rows}


def _groups(data) -> dict:
    groups: dict = {}
    for r in data["rows"]:
        groups.setdefault((r["library"], r["donated"]), []).append(r)
    return groups


def checks(data) -> list[tuple[str, bool]]:
    """Each step's losses are the library jit's (relative 2e-5); rp.jit's XLA footprint is
    below the library jit's under `dots_saveable`, within it + 2% under `nothing_saveable`
    (over the whole step that recomputes the whole forward at the start of the backward);
    untied, none; and within the library's own checkpoint's of the same policy + 2%, its
    median step within `STEP_SLACK` times that checkpoint's."""
    out = []
    for (library, donated), rows in _groups(data).items():
        ref = rows[0]
        where = f"{library}{', donated' if donated else ''}"
        base = common.xla_peak(ref["memory"])
        # (the library's checkpoint by policy; rp.jit's rows, of the step or of the loss,
        # end in theirs)
        checkpointed = {r["name"].rsplit(" ", 1)[1]: r for r in rows[1:]
                        if "rp.jit" not in r["name"]}
        for r in rows[1:]:
            same = all(abs(a - b) <= 2e-5 * abs(b) for a, b in zip(r["losses"], ref["losses"]))
            out.append((f"{where}, {r['name']}: losses {r['losses']} = {ref['name']}'s", same))
            if r["name"].endswith(", untied") or "rp.jit" not in r["name"]:
                continue       # (untied, XLA:CPU undoes the recomputation: no saving to check)
            peak = common.xla_peak(r["memory"])
            limit = base if "dots" in r["name"] else 1.02 * base
            out.append((f"{where}, {r['name']}: XLA footprint {peak / base:.2f}x "
                        f"{ref['name']}'s (target {'< 1' if 'dots' in r['name'] else '<= 1.02'})",
                        peak < limit if "dots" in r["name"] else peak <= limit))
            theirs = checkpointed.get(r["name"].rsplit(" ", 1)[1])
            if theirs is not None:
                other = common.xla_peak(theirs["memory"])
                out.append((f"{where}, {r['name']}: XLA footprint {peak / other:.2f}x "
                            f"{theirs['name']}'s (target <= 1.02)", peak <= 1.02 * other))
                ratio = statistics.median(r["times"]) / statistics.median(theirs["times"])
                out.append((f"{where}, {r['name']}: median step {ratio:.2f}x "
                            f"{theirs['name']}'s (target <= {STEP_SLACK}; timed on a shared "
                            "machine, in one interleaved run)", ratio <= STEP_SLACK))
    return out


def render(data) -> str:
    m, meta = data["model"], data["meta"]
    parts = ["## Flax NNX and Equinox steps through rp.jit", "",
             f"One model in both libraries: {m['blocks']} residual blocks (LayerNorm, Linear "
             f"{m['d']} -> {4 * m['d']}, GELU, Linear back) and a linear head, softmax "
             f"cross-entropy, AdamW, batch {m['batch']}. Each step is written as its library "
             "writes it (NNX: `optimizer.update(model, grads)` in place; Equinox: "
             "`eqx.filter_value_and_grad`, the model returned, its activation function a "
             "leaf) and run through the library's jit, through it with the loss in the "
             "library's checkpoint (`nnx.remat`, `eqx.filter_checkpoint`: jax.checkpoint) "
             f"under {', '.join(f'`{p}`' for p in CHECKPOINTED)}, through it with the loss "
             "in `rp.jit(loss, policy=P)` (\"rp.jit(loss)\": differentiated from outside, by "
             "the library's value_and_grad) under the same, and through "
             "`rp.jit(step, policy=P)`, with nothing donated and with the model and "
             "optimizer donated. "
             f"Median of {data['steps']} steps after 3 warm-up steps, interleaved "
             f"({meta['cpus']} CPUs, jax {meta['jax']}, commit {meta['commit']}); memory is "
             "XLA's `memory_analysis()` of what ran (footprint: temp + arguments + outputs, "
             "less outputs written into donated arguments). On CPU rp.jit runs the "
             "recomputation tied to the cotangent by data (`tie_to_cotangent`, its default "
             "there), without which XLA:CPU may undo it: the rows \"untied\" are "
             "`tie_to_cotangent=False`, for the memory and the time the tie accounts for "
             "(timings on a shared 2-core machine: compare within a run). Regenerate with "
             "`python -m tools.benchmarks libraries`.", "",
             "| library | step | XLA temp | XLA footprint | / library jit | median step |",
             "|---|---|---:|---:|---:|---:|"]
    for (library, donated), rows in _groups(data).items():
        base = common.xla_peak(rows[0]["memory"])
        for r in rows:
            peak = common.xla_peak(r["memory"])
            parts.append(f"| {library}{', donated' if donated else ''} | {r['name']} | "
                         f"{max(e['temp'] for e in r['memory']):,} B | {peak:,} B | "
                         f"{peak / base:.2f} | "
                         f"{statistics.median(r['times']) * 1000:.1f} ms |")
    parts += ["", "Checks:", ""]
    parts += [f"- {'pass' if ok else 'MISS'}: {text}" for text, ok in checks(data)]
    return "\n".join(parts) + "\n"
