"""What XLA:CPU's `memory_analysis()` misses inside YNNPACK fusions.

Recent XLA:CPU hands subgraphs of convolutions, dots, elementwise ops and reductions to
YNNPACK as one custom fusion (`__ynn_fusion`). The buffers YNNPACK needs inside such a
fusion are its own: XLA's buffer assignment does not see them, so `memory_analysis()`
reports less scratch than the process allocates. The `xla` benchmark therefore measures
XLA:CPU with YNNPACK fusions off (`YNN_OFF`), where what XLA reports is what runs.

`probe()` shows it on a chain of four 3x3 convolutions with ReLU (batch 8, 128x128, 64
channels: 32 MiB per activation), compiled and run in a fresh process per setting (XLA
reads `XLA_FLAGS` once, when its CPU client starts): the temp bytes XLA reports beside the
growth of the process's high-water mark of resident memory (`VmHWM`, reset first through
`/proc/self/clear_refs`) while the executable runs.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

# the XLA:CPU flag that lists the YNNPACK fusion kinds to form; empty: none
YNN_OFF = "--xla_cpu_experimental_ynn_fusion_type="

_CHILD = r"""
import json, jax, jax.numpy as jnp
from jax import lax

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    return 0

B, H, C = 8, 128, 64
x = jnp.ones((B, H, H, C), jnp.float32)
Ws = [jnp.full((3, 3, C, C), 0.01, jnp.float32) for _ in range(4)]

def chain(x, Ws):
    h = x
    for W in Ws:
        h = jax.nn.relu(lax.conv_general_dilated(h, W, (1, 1), "SAME",
                                                 dimension_numbers=("NHWC", "HWIO", "NHWC")))
    return jnp.mean(h, axis=(1, 2))

compiled = jax.jit(chain).lower(x, Ws).compile()
m = compiled.memory_analysis()
jax.block_until_ready((x, Ws))
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")            # resets VmHWM to the current resident size
    reset = True
except OSError:
    reset = False
before = max(status("VmHWM:"), status("VmRSS:")) if not reset else status("VmHWM:")
jax.block_until_ready(compiled(x, Ws))
text = compiled.as_text()
print(json.dumps({"activation": B * H * H * C * 4, "temp": int(m.temp_size_in_bytes),
                  "hwm_growth": status("VmHWM:") - before, "hwm_reset": reset,
                  "ynn_fusions": text.count("__ynn_fusion")}))
"""


def _run(flags: str) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=(os.environ.get("XLA_FLAGS", "").replace(YNN_OFF, "") + " "
                          + flags).strip())
    proc = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                          env=env, timeout=600)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def supported() -> bool:
    """Does this jaxlib's XLA:CPU know the flag (an unknown flag aborts XLA)?"""
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=YNN_OFF)
    proc = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"],
                          capture_output=True, text=True, env=env, timeout=300)
    return proc.returncode == 0


def turn_off() -> bool:
    """Measure without YNNPACK fusions from here on, where this jaxlib knows the flag: add
    YNN_OFF to XLA_FLAGS (before XLA's CPU client starts). Returns whether it did."""
    if not supported():
        return False
    flags = os.environ.get("XLA_FLAGS", "")
    if YNN_OFF not in flags.split():      # (set already: said once on the page)
        os.environ["XLA_FLAGS"] = (flags + " " + YNN_OFF).strip()
    return True


def probe() -> dict:
    """The conv chain with YNNPACK fusions as XLA:CPU forms them by default, and off."""
    return {"default": _run(""), "ynn_off": _run(YNN_OFF)}


def render(data: dict) -> str:
    """A paragraph for the XLA page: why the CPU figures are taken with YNNPACK off."""
    on, off = data.get("default", {}), data.get("ynn_off", {})
    if "temp" not in on or "temp" not in off:
        return ""
    mib = 1 << 20
    return (
        "XLA:CPU hands subgraphs of convolutions, dots and elementwise ops to YNNPACK as "
        "one fusion, and the buffers YNNPACK uses inside it are not in XLA's buffer "
        "assignment: `memory_analysis()` does not count them. On a chain of four 3x3 "
        f"convolutions with ReLU ({on['activation'] / mib:.0f} MiB per activation, "
        f"`python -m tools.benchmarks.ynn_probe`), XLA reports {on['temp'] / mib:.0f} MiB of "
        f"temp with its default fusions ({on['ynn_fusions']} YNNPACK "
        f"fusion{'s' if on['ynn_fusions'] != 1 else ''}) while the process's resident "
        f"high-water mark grows by {on['hwm_growth'] / mib:.0f} MiB as it runs; with "
        f"YNNPACK fusions off (`XLA_FLAGS={YNN_OFF}`) it reports {off['temp'] / mib:.0f} MiB "
        f"and grows by {off['hwm_growth'] / mib:.0f} MiB. So the figures below are taken "
        "with YNNPACK fusions off, ours and JAX's alike: there, what XLA reports is what "
        "runs.")


if __name__ == "__main__":
    result = probe()
    print(json.dumps(result, indent=1))
    print(render(result))
