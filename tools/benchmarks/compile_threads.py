"""rp.jit's build with its XLA compiles side by side against one after another.

`REMAT_PASSES_COMPILE_THREADS` (`jax_run.compiling`) sets how many of a build's compiles run
at once; by default one per CPU on the CPU backend and one on a GPU, where XLA autotunes on
the device as it compiles and the side-by-side build was not measured. This measures it on
the training benchmark's step (`train.py`: a 4-layer decoder with AdamW), in each form and
under two policies: a fresh `rp.jit` (no disk cache) built with `--threads` compile threads
and with one, the two interleaved round by round so that load on the machine hits both
alike. Per case: the median build seconds of each, and whether every build chose the same
variant with the same footprints (what each variant measured) and the same rewritten
module. A different choice, or different footprints, would mean that compiles side by side
change what XLA builds (autotuning under contention), which the GPU default waits on.

    python -m tools.benchmarks.compile_threads [--threads N] [--rounds R] [--out FILE]

(on a device machine run it through `device_round.sh compile-threads`, which sets
JAX_PLATFORMS=cuda; by default here it runs on the backend JAX picks.)
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time

import jax

from tools.benchmarks import train

CASES = [(mode, policy) for mode in ("joint", "split")
         for policy in ("nothing_saveable", "dots_saveable")]


def _build(mode: str, policy: str, threads: int, args) -> dict:
    """One build of the step in `mode` under `policy` with `threads` compile threads: its
    seconds and what it chose."""
    import remat_passes as rp
    from remat_passes.jax import run as jax_run
    os.environ[jax_run.COMPILE_THREADS_ENV] = str(threads)
    jitted = rp.jit(train.make_step(train.loss, train.optimizer()), policy=policy, mode=mode,
                    cache_dir=False)
    t0 = time.perf_counter()
    lowered = jitted.lower(*args)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "chose": lowered.barriers,
            "footprints": dict(sorted(lowered.footprints.items())),
            "footprint": lowered.footprint(),
            "module": hashlib.sha256(lowered.module.bytecode()).hexdigest()[:16]}


def measure(threads: int, rounds: int, log=print) -> dict:
    _, params, opt_state, x, y = train._setup()
    args = (params, opt_state, x, y)
    rows = []
    for mode, policy in CASES:
        runs: dict = {threads: [], 1: []}
        for r in range(rounds):
            for n in ((threads, 1) if r % 2 == 0 else (1, threads)):
                runs[n].append(_build(mode, policy, n, args))
        same = all(b[k] == runs[1][0][k] for n in runs for b in runs[n]
                   for k in ("chose", "footprints", "footprint", "module"))
        row = {"mode": mode, "policy": policy, "threads": threads,
               "seconds_side_by_side": statistics.median(b["seconds"] for b in runs[threads]),
               "seconds_one_at_a_time": statistics.median(b["seconds"] for b in runs[1]),
               "same_choice": same, "builds": {str(n): runs[n] for n in runs}}
        rows.append(row)
        log(f"compile_threads: {mode} {policy}: {threads} threads "
            f"{row['seconds_side_by_side']:.2f} s, one at a time "
            f"{row['seconds_one_at_a_time']:.2f} s (medians of {rounds}); "
            f"{'same' if same else 'DIFFERENT'} choice and footprints "
            f"({runs[1][0]['chose']}: {runs[1][0]['footprint']:,} B)")
    return {"backend": jax.default_backend(),
            "device": str(jax.devices()[0].device_kind), "cpus": os.cpu_count(),
            "jax": jax.__version__, "rounds": rounds, "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.benchmarks.compile_threads",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2,
                    help="compile threads of the side-by-side builds (default: the CPUs)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="builds of each setting per case (default 3)")
    ap.add_argument("--out", help="write the results as JSON to this file")
    a = ap.parse_args(argv)
    if a.threads < 2 or a.rounds < 1:
        ap.error("--threads must be 2 or more and --rounds 1 or more")
    data = measure(a.threads, a.rounds)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(data, f, indent=1)
    return 0 if all(r["same_choice"] for r in data["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
