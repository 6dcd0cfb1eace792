"""Device profiles: published peak figures, for a roofline cost of recomputing an op.

`auto(budget=..., device=...)` prices each op it may recompute with
`DeviceProfile.op_seconds`; `default_device()` picks the profile of the backend
JAX runs on, without starting one.
"""
from __future__ import annotations

import dataclasses
import math

from remat_passes import jax_compat
from remat_passes.cost import flops
from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import op_id

ROUNDING = "stablehlo.reduce_precision"   # what insert-reduce-precision inserts

_DOT_OPS = ("stablehlo.dot_general", "stablehlo.dot", "stablehlo.convolution")


_FUSIBLE = {"stablehlo." + n for n in flops.ELEMENTWISE} | {
    "stablehlo.reshape", "stablehlo.broadcast_in_dim", "stablehlo.transpose",
    "stablehlo.convert", "stablehlo.slice", "stablehlo.concatenate", "stablehlo.iota",
    "stablehlo.constant", "stablehlo.custom_call", "stablehlo.optimization_barrier",
    "stablehlo.bitcast_convert", "stablehlo.pad", "stablehlo.reverse", "stablehlo.reduce",
    "stablehlo.select", "stablehlo.clamp", "stablehlo.dynamic_slice",
    "stablehlo.dynamic_update_slice"}


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """Published peak figures of a device, for a roofline cost of recomputation."""
    name: str
    matrix_flops: float      # FLOP/s of dots and convolutions (f32 unless bf16/f16 given)
    vector_flops: float      # FLOP/s of elementwise arithmetic
    memory_bandwidth: float  # bytes/s of device memory
    host_bandwidth: float    # bytes/s of the link to host memory (one way)
    low_precision_speedup: float = 1.0   # matrix FLOP/s of bf16/f16 over f32
    source: str = ""

    def op_seconds(self, op, cost_model) -> float:
        """Time to recompute `op`: dots, convolutions and other ops that materialize their
        result are max(FLOPs / peak, bytes / bandwidth); elementwise arithmetic, reductions
        and data movement, which XLA fuses with their producers and consumers, cost their
        FLOPs only."""
        name = op.name
        f = cost_model.op_flops(op)
        if name in _DOT_OPS:
            peak = self.matrix_flops
            try:
                elem = str(op.results[0].type.element_type)
            except AttributeError:
                elem = ""
            if elem in ("bf16", "f16"):
                peak *= self.low_precision_speedup
            return max(f / peak, flops.op_bytes(op) / self.memory_bandwidth)
        if name in _FUSIBLE:
            return f / self.vector_flops
        return max(f / self.vector_flops, flops.op_bytes(op) / self.memory_bandwidth)

    def rounding_seconds(self, elements: int) -> float:
        """A reduce_precision over `elements` (fused: one FLOP each, as XLA counts it)."""
        return elements / self.vector_flops

    def offload_seconds(self, nbytes: int) -> float:
        """To host after the forward and back before the backward."""
        return 2.0 * nbytes / self.host_bandwidth


PROFILES = {
    "cpu": DeviceProfile(
        "cpu", matrix_flops=1.0e12, vector_flops=1.0e12, memory_bandwidth=1.0e11,
        host_bandwidth=1.0e11,
        source="a server CPU: ~1 TFLOP/s f32 with AVX-512 FMA on all cores, ~100 GB/s DRAM; "
               "host memory is the same DRAM"),
    "h100": DeviceProfile(
        "h100", matrix_flops=494.7e12, vector_flops=66.9e12, memory_bandwidth=3.35e12,
        host_bandwidth=64e9, low_precision_speedup=2.0,
        source="NVIDIA H100 SXM5 datasheet: 494.7 TFLOP/s TF32 / 989.4 BF16 tensor (dense), "
               "66.9 TFLOP/s FP32, 3.35 TB/s HBM3; PCIe Gen5 x16 64 GB/s to host"),
    "tpu-v5e": DeviceProfile(
        "tpu-v5e", matrix_flops=197e12, vector_flops=197e12 / 16, memory_bandwidth=819e9,
        host_bandwidth=32e9,
        source="Google Cloud TPU v5e: 197 TFLOP/s BF16, 819 GB/s HBM2e; host link taken as "
               "PCIe Gen4 x16, 32 GB/s (not published per chip)"),
    # No device: the cost is the FLOP count itself, as XLA's cost analysis counts it (one
    # 'second' per FLOP, memory traffic free); an offloaded byte costs one FLOP each way.
    "flops": DeviceProfile(
        "flops", matrix_flops=1.0, vector_flops=1.0, memory_bandwidth=math.inf,
        host_bandwidth=1.0,
        source="no device: recomputation costs its FLOP count (XLA's counting rules), "
               "memory traffic is free, offloading costs one FLOP per byte each way"),
}


def default_device() -> str:
    """The profile of the platform JAX runs on in this process (cpu, gpu -> h100, tpu ->
    tpu-v5e), found without starting a backend (`jax_compat.platform_in_use`)."""
    try:
        platform = jax_compat.platform_in_use()
    except Exception:   # JAX's backends failed to start: the CPU figures
        return "cpu"
    return {"gpu": "h100", "tpu": "tpu-v5e"}.get(platform, "cpu")


def _walk(op, visit, scale=1) -> None:
    """visit(op, times) for each op nested in `op`; a loop body's times its trip count."""
    for region in op.regions:
        for block in region.blocks:
            n = scale * ((flops.trip_count(op) or 1) if op.name == "stablehlo.while" else 1)
            for o in block.operations:
                visit(o.operation, n)


def roundings_in(funcs) -> set:
    """The reduce_precision ops of `funcs` (by identity), nested ones included: those a
    program had before insert-reduce-precision ran, for `recomputation_seconds`."""
    found = set()

    def note(o, n):
        if o.name == ROUNDING:
            found.add(op_id(o))
        elif len(o.regions):
            _walk(o, note, n)
    for f in funcs:
        _walk(f, note)
    return found


def recomputation_seconds(funcs, profile: DeviceProfile, cost_model,
                          old_roundings=frozenset()) -> float:
    """What the recomputation in rewritten functions costs in `profile`'s model: each
    recompute clone remat-partial-eval made (but one that moved: its forward op only
    the backward read, now gone, `contract.is_moved`), and each reduce_precision op not in
    `old_roundings` (the ones insert-reduce-precision added on what is kept), loop bodies
    times their trip count: what `auto` minimises."""
    total = 0.0

    def add(o, n):
        nonlocal total
        if contract.is_recompute_clone(o):
            if not contract.is_moved(o):
                total += profile.op_seconds(o, cost_model) * n
        elif o.name == ROUNDING and op_id(o) not in old_roundings:
            total += profile.rounding_seconds(graph.type_elements(o.results[0].type)) * n
        elif len(o.regions):
            _walk(o, add, n)
    for f in funcs:
        _walk(f, add)
    return total
