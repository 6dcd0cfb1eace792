"""Shardy (`sdy`) attributes of manual computations (shard_map): meshes, per-value
shardings, manual axes, which values vary per device, and the layout JAX gives a
shard_map residual. Read by the shard_map rule and by the split."""
from __future__ import annotations

import dataclasses
import re

import numpy as np

from remat_passes.ir import graph
from remat_passes.ir.mlir import ir
from remat_passes.sharding import gspmd

MC = graph.MANUAL_COMPUTATION


def _sdy():
    """Shardy's attribute bindings (imported on first use)."""
    from jaxlib.mlir.dialects import sdy
    return sdy


@dataclasses.dataclass
class Mesh:
    axes: list                  # [(name, size)] in mesh order
    device_ids: list            # logical position -> device id ([]: the identity)

    def size(self, name: str) -> int:
        return dict(self.axes).get(name, 1)

    def group_axes(self, groups) -> set | None:
        """The axes along which the devices of each replica group differ (None: a device
        id outside the mesh)."""
        n = int(np.prod([s for _, s in self.axes])) if self.axes else 1
        ids = self.device_ids or list(range(n))
        where = {d: i for i, d in enumerate(ids)}
        sizes = [s for _, s in self.axes]
        out = set()
        for group in groups:
            if any(d not in where for d in group):
                return None
            coords = [np.unravel_index(where[d], sizes) for d in group]
            for a, (name, _) in enumerate(self.axes):
                if len({c[a] for c in coords}) > 1:
                    out.add(name)
        return out


def shardings(op, which: str) -> list:
    """The per-value shardings (`in_shardings` / `out_shardings`) of a manual computation."""
    return per_value_shardings(op.attributes[which])


_PER_VALUE = "#sdy.sharding_per_value<["
_ONE = "#sdy.sharding"


def per_value_shardings(attr) -> list:
    """The shardings (`#sdy.sharding<...>`) of a `#sdy.sharding_per_value<[...]>` attribute,
    one per value. (Read from its text: jaxlib 0.12 does not always bind the per-value
    attribute's class when JAX is not imported.)"""
    text = str(attr)
    assert text.startswith(_PER_VALUE) and text.endswith("]>"), text
    return [ir.Attribute.parse(_ONE + item) for item in _top_level_items(text[len(_PER_VALUE):-2])]


def per_value_attr(items) -> ir.Attribute:
    return ir.Attribute.parse(
        _PER_VALUE + ", ".join(str(i)[len(_ONE):] for i in items) + "]>")


def _top_level_items(text: str) -> list[str]:
    """`text` split at the commas outside brackets and strings."""
    items, depth, start, quoted, escaped = [], 0, 0, False, False
    for i, ch in enumerate(text):
        if quoted:                   # inside a string: only its end matters
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                quoted = False
            continue
        if ch == '"':
            quoted = True
        elif ch in "<[{(":
            depth += 1
        elif ch in ">]})":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i].strip())
            start = i + 1
    if text[start:].strip():
        items.append(text[start:].strip())
    return items


def manual_axes(op) -> list[str]:
    return re.findall(r'"((?:[^"\\]|\\.)*)"', str(op.attributes["manual_axes"]))


def dim_axes(sharding) -> list[list[str]]:
    """Per dimension of a sharding, the names of the axes it is sharded over."""
    sdy = _sdy()
    return [[sdy.AxisRefAttr(ax).name for ax in sdy.DimensionShardingAttr(d).axes]
            for d in sdy.TensorShardingAttr(sharding).dimension_shardings]


def mesh_of(op) -> tuple[str, Mesh] | None:
    """The mesh of a manual computation's shardings: (how a sharding names it, Mesh)."""
    sdy = _sdy()
    items = shardings(op, "in_shardings") + shardings(op, "out_shardings")
    if not items:
        return None
    ref = sdy.TensorShardingAttr(items[0]).mesh_or_ref
    text = str(ref)
    attr = ref
    if text.startswith("@"):
        module = graph.module_of(op)
        attr = None
        for top in module.regions[0].blocks[0].operations:
            top = top.operation
            if top.name == "sdy.mesh" and str(top.attributes["sym_name"]) == f'"{text[1:]}"':
                attr = top.attributes["mesh"]
        if attr is None:
            return None
    mesh = sdy.MeshAttr(attr)
    axes = [(sdy.MeshAxisAttr(x).name, sdy.MeshAxisAttr(x).size) for x in mesh.axes]
    return text, Mesh(axes, [int(d) for d in mesh.device_ids])


def varying_axes(fwd, mesh: Mesh | None) -> dict:
    """Per value of the manual computation `fwd`'s body: the manual axes along which it
    can differ between devices (JAX's varying manual axes), over-approximated where
    unsure (naming an axis a value does not vary over only makes a residual bigger)."""
    manual = manual_axes(fwd)
    everything = frozenset(manual)
    body = fwd.regions[0].blocks[0]
    out: dict = {}
    for arg, sharding in zip(body.arguments, shardings(fwd, "in_shardings")):
        out[arg] = frozenset(a for d in dim_axes(sharding) for a in d if a in everything)
    for op in body.operations:
        op = op.operation
        seen = frozenset().union(*(out.get(v, everything) for v in graph.read_values(op)))
        if op.name in gspmd.REDUCING or op.name in gspmd.SPREADING:
            axes = _collective_axes(op, mesh)
            if axes is None:
                seen = everything
            elif op.name in gspmd.REDUCING:
                seen = seen - axes
            else:
                seen = (seen | axes) & everything
        elif gspmd.varies_per_device(op):
            seen = everything
        for r in op.results:
            out[r] = seen
    return out


def _collective_axes(op, mesh: Mesh | None) -> set | None:
    """The mesh axes a collective communicates over (None: not known)."""
    if "replica_groups" not in op.attributes:
        return None
    attr = op.attributes["replica_groups"]
    text = str(attr)
    if text.startswith("#stablehlo.replica_group_mesh_axes"):   # (newer jax names them)
        return set(re.findall(r'axis_ref<name = "((?:[^"\\]|\\.)*)"', text)) or None
    groups = gspmd.replica_groups(op)
    return None if mesh is None or groups is None else mesh.group_axes(groups)


def residual_factor(axes, mesh: Mesh) -> int:
    """How many per-device copies a new residual varying over manual `axes` stacks on its
    first dimension (`residual_layout`): the product of those axes' sizes."""
    return int(np.prod([mesh.size(name) for name, _ in mesh.axes if name in axes]))


def residual_layout(v, axes, mesh: Mesh, mesh_ref: str):
    """A new residual of the forward computation: (the local type it is returned as,
    its global type, its sharding). Sharded on its first dimension over `axes` in mesh
    order; a scalar that varies is returned as one element."""
    rt = ir.RankedTensorType(v.type)
    names = [name for name, _ in mesh.axes if name in axes]
    shape = list(rt.shape)
    local = rt
    if names and not shape:
        shape = [1]
        local = ir.RankedTensorType.get([1], rt.element_type)
    if names:
        factor = residual_factor(axes, mesh)
        d0 = shape[0]
        shape[0] = d0 if ir.ShapedType.is_dynamic_size(d0) else d0 * factor
    dims = [("{" + ", ".join(f'"{n}"' for n in names) + "}") if (i == 0 and names) else "{}"
            for i in range(len(shape))]
    sharding = ir.Attribute.parse(f"#sdy.sharding<{mesh_ref}, [{', '.join(dims)}]>")
    return local, ir.RankedTensorType.get(shape, rt.element_type), sharding
