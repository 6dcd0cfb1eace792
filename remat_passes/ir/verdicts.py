"""What a checkpoint policy answers per op: `Saveable`, `Recompute` or `Offloadable(src, dst)`.

The vocabulary the policies (`remat_passes.policy`) speak and the IR contract writes
into a module (`remat.offload = "src:dst"`, a case's saves), so it sits with the IR.
"""
from __future__ import annotations

import dataclasses

from remat_passes.ir.mlir import RematError


class _Verdict:
    def __init__(self, name):
        self._name = name

    def __repr__(self):
        return self._name


Saveable = _Verdict("Saveable")
Recompute = _Verdict("Recompute")


MEMORY_KINDS = ("device", "pinned_host", "unpinned_host")    # (what JAX's devices address)


@dataclasses.dataclass(frozen=True)
class Offloadable:
    """Move the value from memory `src` to `dst` between the passes (JAX's
    `pe.Offloadable`); each one of `MEMORY_KINDS`, as JAX checks them when it lowers."""
    src: str
    dst: str

    def __post_init__(self):
        for what, kind in (("offload_src", self.src), ("offload_dst", self.dst)):
            if kind not in MEMORY_KINDS:
                raise RematError(f"error: {what} must be a memory kind, one of "
                                 f"{', '.join(MEMORY_KINDS)}; got {kind!r}")


def normalize_verdict(value, policy=None):
    """Map a policy's return value to Saveable / Recompute / Offloadable."""
    if value is True or value is Saveable:
        return Saveable
    if value is False or value is Recompute or value is None:
        return Recompute
    if isinstance(value, Offloadable):
        return value
    # Accept JAX's own pe.Saveable / pe.Recompute / pe.Offloadable too.
    tname = type(value).__name__
    if tname == "Offloadable" and hasattr(value, "src") and hasattr(value, "dst"):
        return Offloadable(str(value.src), str(value.dst))
    if tname in ("SaveableType", "Saveable") or repr(value) == "Saveable":
        return Saveable
    if tname in ("RecomputeType", "Recompute") or repr(value) == "Recompute":
        return Recompute
    raise RematError(
        f"error: policy {getattr(policy, 'spec', policy)!r} returned {value!r}; a policy must "
        "return a bool, Saveable, Recompute or Offloadable(src, dst)")
