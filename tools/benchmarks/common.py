"""Helpers shared by the benchmarks: machine facts, op counts, memory readings, JSON files."""
from __future__ import annotations

import datetime
import functools
import json
import os
import platform
import re
import subprocess
from pathlib import Path

import jax

import remat_passes as rp
from remat_passes.ir.mlir import ir

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"


@functools.cache
def git_commit() -> str:
    """The checkout's commit when the benchmark started (read as this module is imported: a
    run that outlasts a commit names the code it ran, not the one it finished beside;
    BENCH_COMMIT where a copy without .git measures: the device round's parallel runs)."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


git_commit()


def machine() -> dict:
    """What the numbers were measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"model name\s*:\s*(.*)", f.read())
            cpu = m.group(1).strip() if m else cpu
    except OSError:
        pass
    return {"date": datetime.date.today().isoformat(), "host": platform.machine(),
            "cpu": cpu, "cpus": os.cpu_count(), "python": platform.python_version(),
            "jax": jax.__version__, "backend": jax.default_backend(),
            "remat_passes": rp.__version__, "commit": git_commit()}


def count_ops(module_op) -> int:
    """Ops inside functions (nested region ops included; module and func.func excluded)."""
    n = 0

    def visit(op):
        nonlocal n
        if op.name not in ("builtin.module", "func.func"):
            n += 1
        return ir.WalkResult.ADVANCE
    getattr(module_op, "op", module_op).operation.walk(visit)
    return n


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        m = re.search(rf"{key}:\s+(\d+) kB", f.read())
    return int(m.group(1)) * 1024 if m else 0


def _trim() -> None:
    """Give freed heap memory back to the OS (glibc), so the next reading starts clean."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakRSS:
    """Extra peak resident memory of the process inside a `with` block (Linux: frees what
    the heap keeps, then resets the high-water mark through /proc/self/clear_refs).
    `extra` is None where unsupported."""

    def __enter__(self):
        import gc
        gc.collect()
        _trim()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.before = _status("VmRSS")
        except OSError:
            self.before = None
        self.extra = None
        return self

    def __exit__(self, *exc):
        if self.before is not None:
            self.extra = max(0, _status("VmHWM") - self.before)


def write_json(name: str, data) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return path


def read_json(name: str):
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


# ------------------------------------------------------------ page text --
def fmt_bytes(n) -> str:
    if n is None:
        return "n/a"
    if n < 1024:
        return f"{n} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024:
            return f"{n:.1f} {unit}" if n < 100 else f"{n:.0f} {unit}"
    return f"{n:.0f} TiB"


def fmt_res(dev, host) -> str:
    s = fmt_bytes(dev)
    if host:
        s += f" + {fmt_bytes(host)} host"
    return s


# ---------------------------------------------------------- XLA's memory --
def xla_memory(compiled) -> dict:
    """XLA's `memory_analysis()` of a compiled executable: temp, argument, output and
    aliased (donated argument reused for an output) bytes, and host temp bytes where the
    backend reports them."""
    m = compiled.memory_analysis()
    out = {"temp": int(m.temp_size_in_bytes), "args": int(m.argument_size_in_bytes),
           "out": int(m.output_size_in_bytes), "alias": int(m.alias_size_in_bytes)}
    host = getattr(m, "host_temp_size_in_bytes", None)
    if host:
        out["host_temp"] = int(host)
    reported = getattr(m, "peak_memory_in_bytes", None)
    if reported:      # kept for reference: on CPU it leaves the temp buffer out
        out["reported_peak"] = int(reported)
    return out


def xla_footprint(m: dict) -> int:
    """What one executable holds on the device while it runs: its arguments, its outputs
    (less those written into donated arguments) and its scratch (temp) buffer. (XLA:CPU's
    `peak_memory_in_bytes` leaves the temp buffer out, so it is not used.)"""
    return m["temp"] + m["args"] + m["out"] - m.get("alias", 0)


def xla_peak(memory: list) -> int:
    """One executable: its footprint. Two (a split form, forward then backward): the larger
    of the two, the backward's arguments being the residuals the forward handed over."""
    return max(xla_footprint(m) for m in memory)
