"""Models from libraries nobody here wrote, against our passes: the model zoo.

Each library is installed on demand, pinned, into its own folder (`.zoo/<library>`,
git-ignored) with `pip install --target`, and appended to `sys.path` after this
environment's packages, so that the JAX installed here (the one under test) is the one
that runs. Per model:

* every fixed whole-model policy: our residuals (count and bytes) beside what
  `jax.checkpoint(loss, policy)` saves in the installed JAX, the largest gradient error
  against `jax.grad` of the model as the library wrote it, XLA's footprint of the joint
  program (ours as `rp.jit` builds it on this backend, tied on CPU; JAX's `jax.jit` of
  `jax.vjp` of `jax.checkpoint(loss, policy)`), and the pass time (`rp.remat`);
* `auto` at the budget of `dots_saveable`'s activations: within it, exact gradients;
* the library's own remat setting (RecurrentGemma's `gradient_checkpointing=True`, which
  wraps its blocks in `jax.checkpoint`): JAX's residuals beside ours with the model's
  checkpoints applied by JAX at export (`jax_checkpoint="jax"`) and made regions our passes
  apply (`jax_checkpoint="regions"`).

Libraries today: RecurrentGemma (`recurrentgemma[jax]==1.0.1`, a tiny Griffin with a
native `lax.scan` recurrence). Not yet here: Gemma 3 (`gemma`, which pulls TensorFlow
through `kauldron`), keras-hub and MaxText (Python 3.12).
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from tools.benchmarks import common

ZOO = Path(__file__).resolve().parents[2] / ".zoo"
LIBRARIES = {"recurrentgemma": ["recurrentgemma[jax]==1.0.1"]}
POLICIES = ("everything_saveable", "nothing_saveable", "dots_saveable",
            "dots_with_no_batch_dims_saveable")
GRAD_TOL = 1e-5           # max |ours - jax.grad| / max |jax.grad|


def install(library: str, log=print) -> Path:
    """The folder `library` is installed in (installed now if it is not yet)."""
    target = ZOO / library
    if not (target / ".installed").exists():
        log(f"zoo: installing {' '.join(LIBRARIES[library])} into {target}")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(target),
                        *LIBRARIES[library]], check=True)
        (target / ".installed").write_text(" ".join(LIBRARIES[library]) + "\n")
    if str(target) not in sys.path:
        sys.path.append(str(target))      # after ours: the JAX under test stays first
    return target


def recurrentgemma_model(gradient_checkpointing: bool = False):
    """(loss, params, description): a tiny Griffin (recurrent, local attention, recurrent
    blocks), next-token loss on fixed random tokens."""
    from recurrentgemma import common as rg_common
    from recurrentgemma import jax as rg
    batch, seq, vocab = 2, 16, 128
    blocks = (rg_common.TemporalBlockType.RECURRENT, rg_common.TemporalBlockType.ATTENTION,
              rg_common.TemporalBlockType.RECURRENT)
    config = rg.GriffinConfig(vocab_size=vocab, width=64, mlp_expanded_width=128, num_heads=2,
                              block_types=blocks, embeddings_scale_by_sqrt_dim=True,
                              attention_window_size=8, logits_soft_cap=30.0,
                              scan_type=rg_common.ScanType.LINEAR_NATIVE)
    tokens = jax.random.randint(jax.random.key(0), (batch, seq), 0, vocab)
    positions = jnp.broadcast_to(jnp.arange(seq), (batch, seq))
    model = rg.Griffin(config, gradient_checkpointing=gradient_checkpointing)
    params = model.init(jax.random.key(1), tokens, positions)

    def loss(params):
        logits, _ = model.apply(params, tokens, positions)
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, tokens[..., None], -1))
    return loss, params, ("Griffin, 3 blocks (recurrent, local attention, recurrent), width 64, "
                          f"batch {batch}, {seq} tokens, f32")


MODELS = {"recurrentgemma": ("recurrentgemma", recurrentgemma_model)}


def _jax_residuals(fun, *args) -> tuple[int, int]:
    from remat_passes.jax_compat import jax_saved_residuals
    avals = [aval for aval, _ in jax_saved_residuals(fun, *args)]
    return len(avals), sum(int(np.prod(a.shape)) * a.dtype.itemsize for a in avals)


def _ours(residuals) -> tuple[int, int]:
    return len(residuals), sum(r.bytes for r in residuals)


def _grad_error(module, args, reference) -> float:
    flat = jax.tree.leaves(module.call(*args, jnp.ones(())))
    got, want = flat[1:], jax.tree.leaves(reference)
    scale = max(float(np.max(np.abs(np.asarray(w)))) for w in want) or 1.0
    return max(float(np.max(np.abs(np.asarray(g) - np.asarray(w)))) for g, w in
               zip(got, want)) / scale


def _joint_footprints(module, loss, policy, args) -> tuple[int, int]:
    import remat_passes as rp
    ct = jnp.ones(())
    ours = rp.compile(module, "main").lower(*args, ct).compile()
    fun = jax.checkpoint(loss, policy=getattr(jax.checkpoint_policies, policy))
    theirs = jax.jit(lambda *a: jax.vjp(fun, *a)[1](ct)).lower(*args).compile()
    return (common.xla_footprint(common.xla_memory(ours)),
            common.xla_footprint(common.xla_memory(theirs)))


def measure(keys=tuple(MODELS), log=print) -> dict:
    import remat_passes as rp
    from remat_passes.api.jit import needs_tie
    from remat_passes.core.residuals import activation_bytes
    tie = needs_tie()
    rows, own, meta_models = [], [], {}
    for key in keys:
        library, make = MODELS[key]
        install(library, log)
        loss, params, description = make()
        meta_models[key] = {"library": " ".join(LIBRARIES[library]), "model": description}
        module = rp.export_vjp(loss, params)
        reference = jax.grad(loss)(params)
        budget = None
        for policy in POLICIES:
            t0 = time.perf_counter()
            out = rp.remat(module, policy, tie_to_cotangent=tie)
            seconds = time.perf_counter() - t0
            jax_policy = getattr(jax.checkpoint_policies, policy)
            ours_fp, jax_fp = _joint_footprints(out, loss, policy, (params,))
            row = {"model": key, "policy": policy, "ours": _ours(out.residuals),
                   "jax": _jax_residuals(jax.checkpoint(loss, policy=jax_policy), params),
                   "grad_error": _grad_error(out, (params,), reference), "remat_s": seconds,
                   "footprint": [ours_fp, jax_fp], "activations": activation_bytes(out.residuals)}
            rows.append(row)
            if policy == "dots_saveable":
                budget = row["activations"]
            log(f"zoo: {key} {policy}")
        out = rp.remat(module, rp.policies.auto(budget), tie_to_cotangent=tie)
        rows.append({"model": key, "policy": f"auto(budget={budget})", "budget": budget,
                     "ours": _ours(out.residuals), "activations": activation_bytes(out.residuals),
                     "grad_error": _grad_error(out, (params,), reference)})
        log(f"zoo: {key} auto")
        gloss, gparams, _ = make(gradient_checkpointing=True)
        entry = {"model": key, "setting": "gradient_checkpointing=True",
                 "jax_saves": _jax_residuals(gloss, gparams)}
        for how in ("jax", "regions"):
            m = rp.remat(rp.export_vjp(gloss, gparams, jax_checkpoint=how))
            entry[f"export_{how}"] = _ours(m.residuals)
        own.append(entry)
        log(f"zoo: {key} own remat")
    return {"meta": common.machine(), "models": meta_models, "tie_to_cotangent": tie,
            "rows": rows, "own": own}


def checks(data) -> list[tuple[str, bool]]:
    """Gradients within GRAD_TOL of jax.grad; residual bytes at most JAX's; the joint
    footprint at most JAX's + 2%; auto within its budget; the library's own remat, made
    regions, keeps at most JAX's bytes."""
    out = []
    for r in data["rows"]:
        name = f"{r['model']} {r['policy']}"
        out.append((f"{name}: gradient error {r['grad_error']:.1e} (relative to the largest)",
                    r["grad_error"] <= GRAD_TOL))
        if "jax" in r:
            out.append((f"{name}: residual bytes {r['ours'][1]:,} vs JAX's {r['jax'][1]:,}",
                        r["ours"][1] <= r["jax"][1]))
            a, b = r["footprint"]
            out.append((f"{name}: joint footprint {a:,} B vs JAX's {b:,} B", a <= b * 1.02))
        if "budget" in r:
            out.append((f"{name}: activations {r['activations']:,} B within the budget",
                        r["activations"] <= r["budget"]))
    for e in data["own"]:
        out.append((f"{e['model']} {e['setting']}, made regions: {e['export_regions'][1]:,} B "
                    f"vs JAX's {e['jax_saves'][1]:,} B",
                    e["export_regions"][1] <= e["jax_saves"][1]))
    return out


def render(data) -> str:
    meta = data["meta"]
    parts = ["## Model zoo", "",
             "Models from libraries nobody here wrote, installed pinned into their own folder "
             "(`.zoo/`) by the benchmark itself, on the "
             f"{meta['backend']} backend ({meta['cpus']} CPUs, jax {meta['jax']}, commit "
             f"{meta['commit']}). Residuals are ours beside `jax.checkpoint(loss, policy)`'s "
             "in the installed JAX (count, bytes); the gradient error is the largest "
             "difference from `jax.grad` of the model as the library wrote it, over the "
             "largest gradient; the footprint is XLA's (temp + arguments + outputs - aliased) "
             "of the joint program: ours as `rp.jit` builds it here"
             + (" (tied to the cotangent on CPU)" if data.get("tie_to_cotangent") else "")
             + ", JAX's `jax.jit` of `jax.vjp` of the checkpointed loss. Regenerate with "
             "`python -m tools.benchmarks zoo`.", ""]
    for key, m in data["models"].items():
        parts += [f"### {key}: {m['model']}", "", f"`{m['library']}`", "",
                  "| policy | residuals ours / JAX | bytes ours / JAX | gradient error | "
                  "joint footprint ours / JAX | rp.remat |", "|---|---:|---:|---:|---:|---:|"]
        for r in data["rows"]:
            if r["model"] != key:
                continue
            if "jax" in r:
                a, b = r["footprint"]
                parts.append(f"| `{r['policy']}` | {r['ours'][0]} / {r['jax'][0]} | "
                             f"{r['ours'][1]:,} / {r['jax'][1]:,} | {r['grad_error']:.1e} | "
                             f"{a:,} / {b:,} ({a / b:.2f}) | {r['remat_s']:.2f} s |")
            else:
                parts.append(f"| `{r['policy']}` (the activations of `dots_saveable`) | "
                             f"{r['ours'][0]} | {r['ours'][1]:,} (activations "
                             f"{r['activations']:,}) | {r['grad_error']:.1e} | | |")
        for e in data["own"]:
            if e["model"] == key:
                j, x, g = e["jax_saves"], e["export_jax"], e["export_regions"]
                parts += ["", f"The library's own remat, `{e['setting']}` (its blocks in "
                          f"`jax.checkpoint`): JAX saves {j[0]} values ({j[1]:,} B). The "
                          f"passes keep {x[0]} ({x[1]:,} B) when JAX applies those checkpoints "
                          f"at export (`jax_checkpoint=\"jax\"`), and {g[0]} ({g[1]:,} B) when "
                          "they are regions the passes apply (`jax_checkpoint=\"regions\"`)."]
        parts.append("")
    results = checks(data)
    missed = [text for text, ok in results if not ok]
    parts += [f"Checks: {len(results) - len(missed)} of {len(results)} pass (gradients within "
              f"{GRAD_TOL:g} of jax.grad, residual bytes at most JAX's, the joint footprint at "
              "most JAX's + 2%, auto within its budget). Missed:", ""]
    parts += [f"- {text}" for text in missed] or ["- none"]
    return "\n".join(parts) + "\n"
