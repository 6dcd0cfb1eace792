"""CLI start-up: wall time of short `remat-opt` runs against `import jax` (issue 15).

Each command runs in a fresh process, `--repeat` times in an interleaved order (so
a burst of load on the shared machine hits every command alike); the page gives
the best and the median, and each command's median as a fraction of `import jax`'s.
The target: `--version`, `--help`, `--list-passes` and pipelines of passes that
need no JAX start in at most half the time of `import jax`. `auto` is timed beside
them: it needs no JAX either, but imports SciPy's optimizer and igraph.
"""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from tools.benchmarks import common


def _cli() -> list[str]:
    exe = shutil.which("remat-opt", path=str(common.Path(sys.executable).parent))
    return [exe] if exe else [sys.executable, "-m", "remat_passes.cli"]


TINY = """func.func @main(%x: tensor<8xf32>, %ct: tensor<8xf32> {remat.cotangent}) -> tensor<8xf32> {
  %0 = stablehlo.sine %x : tensor<8xf32>
  %1 = stablehlo.cosine %x : tensor<8xf32>
  %2 = stablehlo.multiply %ct, %1 : tensor<8xf32>
  return %2 : tensor<8xf32>
}
"""


def commands(tiny: str) -> dict[str, list[str]]:
    """What is timed; `tiny` is the path of a one-function joint module (TINY), so the
    pipeline runs measure start-up, not work."""
    cli = _cli()
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        "python -c 'import jax'": [sys.executable, "-c", "import jax"],
        "remat-opt --version": cli + ["--version"],
        "remat-opt --help": cli + ["--help"],
        "remat-opt --list-passes": cli + ["--list-passes"],
        "remat-opt tiny.mlir --pass-pipeline='builtin.module(inline,cse)'":
            cli + [tiny, "--pass-pipeline=builtin.module(inline,cse)"],
        "remat-opt tiny.mlir --remat-partial-eval='policy=nothing_saveable'":
            cli + [tiny, "--remat-partial-eval=policy=nothing_saveable"],
        "remat-opt tiny.mlir --print-memory": cli + [tiny, "--print-memory"],
        "remat-opt tiny.mlir --remat-partial-eval='policy=auto(50%)'":
            cli + [tiny, "--remat-partial-eval=policy=auto(50%)"],
    }


def measure(repeat: int, log) -> dict:
    with tempfile.TemporaryDirectory() as d:
        tiny = os.path.join(d, "tiny.mlir")
        with open(tiny, "w") as f:
            f.write(TINY)
        cmds = commands(tiny)
        times: dict[str, list[float]] = {name: [] for name in cmds}
        for i in range(repeat):
            for name, argv in cmds.items():
                t = time.perf_counter()
                done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      check=False)
                times[name].append(time.perf_counter() - t)
                if done.returncode != 0:
                    raise SystemExit(f"{name} failed: {done.stderr.decode()[-500:]}")
            log(f"startup: round {i + 1}/{repeat}")
    return {"meta": common.machine(), "repeat": repeat,
            "rows": [[name, ts] for name, ts in times.items()]}     # (JSON keeps the order)


def render(data) -> str:
    times = dict(data["rows"])
    jax_median = statistics.median(times["python -c 'import jax'"])
    meta = data["meta"]
    parts = ["## CLI start-up", "",
             f"Wall time of short runs, each in a fresh process, {data['repeat']} rounds "
             f"interleaved ({meta['cpus']} CPUs, Python {meta['python']}, jax {meta['jax']}, "
             f"commit {meta['commit']}). The CLI imports JAX only when a step needs it (a "
             "serialized `Exported`, a portable artifact, `score=xla`), so these runs "
             "never do (`auto` prices ops for the platform JAX would run on without "
             "starting it). Target: at most half of `import jax`, but for `auto`, which "
             "imports SciPy's optimizer (HiGHS) and igraph, and igraph imports "
             "matplotlib.pyplot where that is installed (the `test` extra installs it). "
             "Regenerate with "
             "`python -m tools.benchmarks startup`.", "",
             "| command | best | median | median / `import jax` |", "|---|---:|---:|---:|"]
    for name, ts in times.items():
        med = statistics.median(ts)
        parts.append(f"| {name} | {min(ts) * 1000:.0f} ms | {med * 1000:.0f} ms | "
                     f"{med / jax_median:.2f} |")
    return "\n".join(parts) + "\n"
