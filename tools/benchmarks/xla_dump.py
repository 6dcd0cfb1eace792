"""One program of the xla benchmark, dumped: where the `xla` estimate and XLA part.

    python -m tools.benchmarks.xla_dump MODEL POLICY DIR      (e.g. mlp none /tmp/dump)

MODEL is a key of the benchmark models, POLICY a short policy label (none, nothing, dots,
...). Our split form is built as `python -m tools.benchmarks xla` builds it on this backend
and compiled with XLA's dump on (`--xla_dump_to=DIR`). For each half it prints XLA's
footprint (`memory_analysis()`), XLA's scratch peak and the values filling it
(`xla_liveness`), and beside them the estimate's peak and its "live at the peak" line. Then
the same of JAX's split of `jax.checkpoint(model, policy)` (`jit_fwd`, `jit_bwd` in the
dump), to read where ours needs more scratch than JAX's. On a GPU this is what the
estimate is calibrated from: the dump directory holds the scheduled HLO and buffer
assignment to read further.
"""
from __future__ import annotations

import os
import sys


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
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

    import remat_passes as rp
    from remat_passes.cost.memory import estimate_memory, format_bytes
    from tools.benchmarks import common, xla_liveness, xla_memory
    from tools.benchmarks.cases import cases_for, jax_function
    from tools.benchmarks.models import MODELS, _identity
    if key not in MODELS:
        print(f"error: unknown model {key!r}; known: {', '.join(MODELS)}", file=sys.stderr)
        return 2
    model = MODELS[key]()
    cases = {c.short: c for c in cases_for(model) if c.kind in ("whole", "plain")}
    if short not in cases:
        print(f"error: unknown policy {short!r} for {key}; known: {', '.join(cases)}",
              file=sys.stderr)
        return 2
    module = rp.export_vjp(model.build(_identity), *model.args)
    split, halves, tied = xla_memory.our_split(module, cases[short].our_policy, model.args)
    halves = xla_memory.our_halves(split, model.args)   # the chosen form dumped last
    estimate = estimate_memory(split, model="xla")
    print(f"{key} {short}, split form{' tied to the cotangent' if tied else ''}, "
          f"backend {common.machine()['backend']}")
    for name, measured in zip(("main_fwd", "main_bwd"), halves):
        fp = common.xla_footprint(measured)
        f = estimate[name]
        print(f"\n@{name}: XLA footprint {fp:,} B (temp {measured['temp']:,}, arguments "
              f"{measured['args']:,}, outputs {measured['out']:,}); estimate "
              f"{f.peak_bytes:,} B ({(f.peak_bytes - fp) / fp:+.1%})")
        print("  estimate, live at the peak: " + "; ".join(
            f"{format_bytes(b)} {what}" for b, what in f.peak_values))
        _print_liveness(xla_liveness, directory, f"jit_{name}.")
    # JAX's split of jax.checkpoint(model, policy), compiled with the dump on too
    jax_halves = xla_memory.jax_halves(jax_function(model, cases[short]), model.args)
    for name, measured in zip(("fwd", "bwd"), jax_halves):
        print(f"\nJAX's {name}: XLA footprint {common.xla_footprint(measured):,} B (temp "
              f"{measured['temp']:,}, arguments {measured['args']:,}, outputs "
              f"{measured['out']:,})")
        _print_liveness(xla_liveness, directory, f"jit_{name}.")
    return 0


def _print_liveness(xla_liveness, directory, name) -> None:
    """XLA's scratch peak of the dump's newest module called `name` and its values."""
    try:
        r = xla_liveness.liveness(directory, name)
    except SystemExit as e:
        print(f"  XLA: {e}")
        return
    print(f"  XLA: temp allocation {r['temp']:,} B; its values peak at {r['peak']:,} B "
          f"at {r['at']} (instruction {r['index']} of {r['of']})")
    for size, value, shape in r["values"]:
        print(f"    {size:>12,} B  {value}  {shape}")


if __name__ == "__main__":
    sys.exit(main())
