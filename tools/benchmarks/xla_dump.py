"""One program of the xla benchmark, dumped: where the `xla` estimate and XLA part.

    python -m tools.benchmarks.xla_dump MODEL POLICY DIR [--joint]   (e.g. mlp none
                                                     /tmp/dump, gpt auto=0 /tmp/dump)

MODEL is a key of the benchmark models, POLICY a short policy label (none, nothing, dots,
...) or `auto=BYTES` (an `auto` plan at that budget, as a point of the benchmark's sweep). Our split form is built as `python -m tools.benchmarks xla` builds it on this backend
and compiled with XLA's dump on (`--xla_dump_to=DIR`). For each half it prints XLA's
footprint (`memory_analysis()`), XLA's scratch peak and the values filling it
(`xla_liveness`), and beside them the estimate's peak and its "live at the peak" line. Then
the same of JAX's split of `jax.checkpoint(model, policy)` (`jit_fwd`, `jit_bwd` in the
dump; not for an `auto` plan), to read where ours needs more scratch than JAX's. On a GPU this is what the
estimate is calibrated from: the dump directory holds the scheduled HLO and buffer
assignment to read further. With `--joint`, the same of the joint form as rp.jit builds it
on this backend (the xla benchmark's `joint_ours`: `jit_main` in the dump) beside JAX's
joint program (`jax.vjp` of `jax.checkpoint(model, policy)` under one `jax.jit`), where
barriers decide (XLA:GPU, XLA:CPU from jaxlib 0.11) the form rp.jit runs.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    joint = "--joint" in argv
    argv = [a for a in argv if a != "--joint"]
    if len(argv) != 3 or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    key, short, directory = argv
    # before XLA's client starts: the dump flag, and on CPU what the xla benchmark sets
    from tools.benchmarks import ynn_probe
    flags = [os.environ.get("XLA_FLAGS", ""), f"--xla_dump_to={directory}"]
    if ynn_probe.supported():
        flags.append(ynn_probe.YNN_OFF)
    os.environ["XLA_FLAGS"] = " ".join(f for f in flags if f)
    # JAX's persistent compilation cache leaves --xla_dump_to out of its key: a program
    # found there (JAX_COMPILATION_CACHE_DIR set, or a cache from an earlier run) is not
    # compiled, so XLA would dump nothing of it
    import jax
    jax.config.update("jax_enable_compilation_cache", False)

    import remat_passes as rp
    from remat_passes.cost.memory import estimate_memory
    from tools.benchmarks import common, xla_liveness, xla_memory
    from tools.benchmarks.cases import cases_for, jax_function
    from tools.benchmarks.models import MODELS, _identity
    if key not in MODELS:
        print(f"error: unknown model {key!r}; known: {', '.join(MODELS)}", file=sys.stderr)
        return 2
    model = MODELS[key]()
    cases = {c.short: c for c in cases_for(model) if c.kind in ("whole", "plain")}
    budget = short[len("auto="):] if short.startswith("auto=") else None
    if budget is not None and not budget.isdigit():
        print(f"error: auto=BYTES takes a whole number of bytes, got {budget!r}",
              file=sys.stderr)
        return 2
    if budget is None and short not in cases:
        print(f"error: unknown policy {short!r} for {key}; known: {', '.join(cases)}, "
              "auto=BYTES", file=sys.stderr)
        return 2
    policy = rp.policies.auto(int(budget)) if budget is not None else cases[short].our_policy
    module = rp.export_vjp(model.build(_identity), *model.args)
    # Each variant's compile writes its own files; JAX compiles a module it has compiled
    # before only once, so a variant may write none for a half (the same as an earlier
    # one's). The chosen variant's files go to DIR/ours, JAX's to DIR/jax.
    dump, seen, made = Path(directory), set(), []

    def fresh() -> set:
        new = (set(dump.glob("module_*")) if dump.exists() else set()) - seen
        seen.update(new)
        return new
    if joint:
        return _joint(model, module, policy, None if budget is not None else cases[short],
                      key, short, dump, fresh)
    split, halves, tied = xla_memory.our_split(module, policy, model.args,
                                               each=lambda s: made.append((s, fresh())))
    ours = _gather(dump / "ours", made, split, ("jit_main_fwd.", "jit_main_bwd."))
    estimate = estimate_memory(split, model="xla")
    print(f"{key} {short}, split form{' tied to the cotangent' if tied else ''}, "
          f"backend {common.machine()['backend']}")
    for name, measured in zip(("main_fwd", "main_bwd"), halves):
        _print_ours(name, measured, estimate[name], ours)
    if budget is not None:
        return 0      # (a plan of ours: JAX has no such policy to set beside it)
    # JAX's split of jax.checkpoint(model, policy), compiled with the dump on too
    jax_halves = xla_memory.jax_halves(jax_function(model, cases[short]), model.args)
    theirs = _gather(dump / "jax", [(None, fresh())], None, ("jit_fwd.", "jit_bwd."))
    for name, measured in zip(("fwd", "bwd"), jax_halves):
        print(f"\nJAX's {name}: XLA footprint {common.xla_footprint(measured):,} B (temp "
              f"{measured['temp']:,}, arguments {measured['args']:,}, outputs "
              f"{measured['out']:,})")
        _print_liveness(xla_liveness, theirs, f"jit_{name}.")
    return 0


def _joint(model, module, policy, case, key, short, dump, fresh) -> int:
    """`--joint`: our joint form as rp.jit builds it (the variant `xla_memory.our_joint`
    chose: the first of the smallest), then JAX's joint program where `case` is a policy
    of JAX's."""
    import jax.numpy as jnp
    from remat_passes.cost.memory import estimate_memory
    from tools.benchmarks import common, xla_liveness, xla_memory
    from tools.benchmarks.cases import jax_function
    from tools.benchmarks.models import _identity
    ct = jnp.ones_like(model.build(_identity)(*model.args))
    made = []
    measured = xla_memory.our_joint(module, policy, model.args, ct, each=lambda j, m: (
        made.append((j, fresh(), common.xla_footprint(m)))))
    fp = common.xla_footprint(measured)
    chosen = next(j for j, _, f in made if f == fp)
    ours = _gather(dump / "ours", [(j, files) for j, files, _ in made], chosen, ("jit_main.",))
    estimate = estimate_memory(chosen, model="xla")["main"]
    rounded = ", residuals rounded" if measured.get("round_read_back") else ""
    print(f"{key} {short}, joint form ({measured['barriers']}{rounded}), backend "
          f"{common.machine()['backend']}")
    _print_ours("main", measured, estimate, ours)
    if case is None:
        return 0      # (a plan of ours: JAX has no such policy to set beside it)
    theirs_measured = xla_memory._jax_joint(jax_function(model, case), model.args, ct)
    theirs = dump / "jax"
    theirs.mkdir(parents=True, exist_ok=True)
    for f in fresh():
        if f.is_file():
            shutil.copy2(f, theirs / f.name)
    print(f"\nJAX's joint: XLA footprint {common.xla_footprint(theirs_measured):,} B (temp "
          f"{theirs_measured['temp']:,}, arguments {theirs_measured['args']:,}, outputs "
          f"{theirs_measured['out']:,})")
    _print_liveness(xla_liveness, theirs, None)
    return 0


def _print_ours(name, measured, f, directory) -> None:
    """One function of ours: XLA's footprint (`measured`) beside the estimate `f` and what
    each holds at its peak (XLA's from the dump in `directory`)."""
    from remat_passes.cost.memory_report import format_bytes
    from tools.benchmarks import common, xla_liveness
    fp = common.xla_footprint(measured)
    print(f"\n@{name}: XLA footprint {fp:,} B (temp {measured['temp']:,}, arguments "
          f"{measured['args']:,}, outputs {measured['out']:,}); estimate "
          f"{f.peak_bytes:,} B ({(f.peak_bytes - fp) / fp:+.1%})")
    print("  estimate, live at the peak: " + "; ".join(
        f"{format_bytes(b)} {what}" for b, what in f.peak_values))
    _print_liveness(xla_liveness, directory, f"jit_{name}.")


def _gather(target: Path, made: list, chosen, names) -> Path:
    """Copy into `target` the dump files of the variant `chosen` (of `made`: [(module,
    its new files)]) for each program name of `names`, or, where its compile wrote none
    (JAX had compiled that module already), the latest earlier variant's."""
    target.mkdir(parents=True, exist_ok=True)
    upto = next(i for i, (m, _) in enumerate(made) if m is chosen)
    for name in names:
        for _, files in reversed(made[:upto + 1]):
            mine = [f for f in files if name in f.name]
            if mine:
                for f in mine:
                    shutil.copy2(f, target / f.name)
                break
    return target


def _print_liveness(xla_liveness, directory, name) -> None:
    """XLA's scratch peak of the module called `name` dumped in `directory`, its heap
    packed again (`xla_heap`: where a hole comes from) and its values."""
    from tools.benchmarks import xla_heap
    try:
        r = xla_liveness.liveness(directory, name)
    except SystemExit as e:
        print(f"  XLA: {e}")
        return
    print(f"  XLA: {xla_liveness.headline(r)}")
    replayed = xla_heap.replay(directory, name)
    if replayed is not None:
        print(f"  {xla_heap.headline(replayed)}")
    for size, value, shape in r["values"]:
        print(f"    {size:>12,} B  {value}  {shape}")


if __name__ == "__main__":
    sys.exit(main())
