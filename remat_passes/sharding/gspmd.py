"""GSPMD's shard_map, inlined: which values are manual, and how a manual residual crosses
from `<f>_fwd` to `<f>_bwd`.

Under GSPMD, JAX lowers a shard_map as a call whose operands go through
`@SPMDFullToShardShape` (global -> per-device shape, `{manual}` sharding) and whose
results come back through `@SPMDShardToFullShape`. After `inline` the body's ops sit
in the function among the others; `manual_values` finds them by dataflow.

A residual computed inside the region (a dot `dots_saveable` keeps) has a
per-device value on every device. It leaves `<f>_fwd` as a global value and
enters `<f>_bwd` through the same custom calls JAX uses, with a sharding that
puts each device's value in a tile of the first dimension. Devices that hold
equal values share a tile as replicas, so the global value is as big as JAX's
(`device_classes` tells which devices hold equal values: from the shardings of
the region's inputs, the replica groups of its collectives).
"""
from __future__ import annotations

import re

import numpy as np

from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import ir

SHARDING = "Sharding"
_TILED_RE = re.compile(r"^\{devices=\[([\d,]+)\]([^ }]*)((?: [a-z_]+)*)\}$")
_IOTA_RE = re.compile(r"^<=\[([\d,]+)\](?:T\(([\d,]+)\))?$")
REDUCING = {"stablehlo.all_reduce", "stablehlo.all_gather"}      # equal across the group
SPREADING = {"stablehlo.reduce_scatter", "stablehlo.all_to_all"}  # different per position


def num_devices(module_op) -> int:
    attrs = module_op.operation.attributes
    n = 1
    for name in ("mhlo.num_partitions", "mhlo.num_replicas"):
        if name in attrs:
            n *= ir.IntegerAttr(attrs[name]).value
    return n


def manual_values(analysis) -> bytearray:
    """Per value of the analysed function: is it inside a GSPMD manual region (computed
    from a `@SPMDFullToShardShape` result, not yet through `@SPMDShardToFullShape`)?"""
    a = analysis
    manual = bytearray(a.nvalues)
    starts, flat = a._reads
    base = a.result_base
    seen = False                     # (no region yet: nothing to look up)
    for pos, op in enumerate(a.ops):
        target = graph.custom_call_target(op)
        if target == graph.SPMD_FULL_TO_SHARD:
            inside = seen = True
        elif target == graph.SPMD_SHARD_TO_FULL or not seen:
            inside = False
        else:
            inside = any(manual[flat[k]] for k in range(starts[pos], starts[pos + 1]))
        if inside:
            for vid in range(base[pos], base[pos + 1]):
                manual[vid] = 1
    return manual


def _tile_classes(sharding: str, n: int) -> np.ndarray | None:
    """Per device, the tile it holds under an HLO sharding (replicas share a class)."""
    if sharding == "{replicated}":
        return np.zeros(n, dtype=np.int64)
    m = _TILED_RE.match(sharding)
    if m is None:
        return None
    dims = [int(d) for d in m.group(1).split(",")]
    flags = m.group(3).split()
    if any(f != "last_tile_dim_replicate" for f in flags):
        return None
    devices = m.group(2)
    iota = _IOTA_RE.match(devices)
    if iota is not None:
        shape = [int(d) for d in iota.group(1).split(",")]
        ids = np.arange(int(np.prod(shape))).reshape(shape)
        if iota.group(2):
            ids = ids.transpose([int(p) for p in iota.group(2).split(",")])
        ids = ids.reshape(-1)
    else:
        try:
            ids = np.array([int(d) for d in devices.split(",")])
        except ValueError:
            return None
    if len(ids) != n or int(np.prod(dims)) != n or sorted(ids) != list(range(n)):
        return None
    replicas = dims[-1] if flags else 1
    classes = np.empty(n, dtype=np.int64)
    classes[ids] = np.arange(n) // replicas
    return classes


def _relabel(columns) -> np.ndarray:
    """Devices equal in every column get one label."""
    stacked = np.stack([np.asarray(c, dtype=np.int64) for c in columns], axis=1)
    _, labels = np.unique(stacked, axis=0, return_inverse=True)
    return labels.reshape(-1)


def device_classes(analysis, manual: bytearray, n: int) -> dict:
    """{vid of a manual value: per device, a label; devices with equal labels hold equal
    values}. Over-approximated where unsure (distinct labels only make a residual
    bigger)."""
    a = analysis
    distinct = np.arange(n)
    same = np.zeros(n, dtype=np.int64)
    out: dict = {}
    starts, flat = a._reads
    base = a.result_base
    for pos, op in enumerate(a.ops):
        if base[pos + 1] == base[pos] or not manual[base[pos]]:
            continue
        reads = [flat[k] for k in range(starts[pos], starts[pos + 1])]
        if graph.custom_call_target(op) == graph.SPMD_FULL_TO_SHARD:
            src = op.operands[0]
            sharding = None
            if isinstance(src, ir.OpResult) and graph.custom_call_target(src.owner) == SHARDING:
                sharding = _sharding_of(src.owner)
            labels = _tile_classes(sharding, n) if sharding else None
            labels = distinct if labels is None else labels
        else:
            inputs = [out.get(v, same if not manual[v] else distinct) for v in reads]
            labels = _relabel(inputs) if inputs else same
            if op.name in graph.COLLECTIVE_OPS:
                labels = _collective(op, labels, n)
            elif varies_per_device(op):
                labels = distinct
        for vid in range(base[pos], base[pos + 1]):
            out[vid] = labels
    return out


def _sharding_of(op) -> str | None:
    attrs = op.operation.attributes
    return ir.StringAttr(attrs["mhlo.sharding"]).value if "mhlo.sharding" in attrs else None


def _collective(op, labels, n: int) -> np.ndarray:
    """The labels after a collective: equal on the devices of a group (all_gather,
    all_reduce), or per position in it (reduce_scatter, all_to_all); devices of two
    groups are equal where the groups' inputs are, in the same order."""
    groups = replica_groups(op)
    if groups is None:
        return np.arange(n)
    member = {}
    for g in groups:
        key = tuple(int(labels[d]) for d in g)
        for i, d in enumerate(g):
            member[d] = (key, i)
    if sorted(member) != list(range(n)):
        return np.arange(n)
    keys = {k: i for i, k in enumerate(sorted({k for k, _ in member.values()}))}
    columns = [[keys[member[d][0]] for d in range(n)]]
    if op.name in SPREADING:
        columns.append([member[d][1] for d in range(n)])
    elif op.name not in REDUCING:
        return np.arange(n)
    return _relabel(columns)


def replica_groups(op) -> list | None:
    """A collective's replica groups as lists of global device ids (None: not given that
    way, e.g. jax 0.12's mesh-axes form, or without `use_global_device_ids`)."""
    if "replica_groups" not in op.attributes or "use_global_device_ids" not in op.attributes:
        return None
    try:
        groups = np.array(ir.DenseIntElementsAttr(op.attributes["replica_groups"]))
    except ValueError:
        return None
    if groups.ndim != 2:
        return None
    return [[int(d) for d in g if d >= 0] for g in groups]


def varies_per_device(op) -> bool:
    """Can `op` (not a collective: those are followed) or an op nested in it give different
    values on different devices from equal operands? (A nested collective counts.)"""
    found = []

    def visit(inner):
        if inner.name in graph.SIDE_EFFECT_OPS:
            found.append(inner)
        elif inner.name == "stablehlo.custom_call" and contract.checkpoint_name(inner) is None \
                and graph.custom_call_target(inner) not in (SHARDING, graph.SPMD_FULL_TO_SHARD):
            found.append(inner)
        return ir.WalkResult.INTERRUPT if found else ir.WalkResult.ADVANCE
    op.operation.walk(visit)
    return bool(found)


def tile_counts(analysis) -> dict:
    """{vid: how many devices' copies} of every value inside a GSPMD manual region: what its
    bytes are multiplied by when it leaves the region as a residual (`residual_layout`'s
    first-dimension tiles). Empty when the function has no manual region."""
    a = analysis
    manual = a.manual
    if not any(manual):
        return {}
    n = num_devices(graph.module_of(a.func_op))
    return {vid: len(_tile_counts(labels, n)[1])
            for vid, labels in device_classes(a, manual, n).items()}


def _tile_counts(labels, n: int):
    """(labels, devices per tile): one tile per class of devices holding equal values; one
    per device where the classes are unequal."""
    labels = np.asarray(labels)
    counts = np.bincount(labels)
    if len(set(counts.tolist())) != 1:
        return np.arange(n), np.ones(n, dtype=np.int64)
    return labels, counts


def residual_layouts(analysis, vids) -> dict:
    """{vid: residual_layout} for the residuals `vids` inside GSPMD manual regions."""
    a = analysis
    inside = [v for v in vids if a.manual[v]]
    if not inside:
        return {}
    n = num_devices(graph.module_of(a.func_op))
    labels = device_classes(a, a.manual, n)
    with ir.Location.unknown():
        return {v: residual_layout(a.value(v), labels.get(v, np.arange(n)), n)
                for v in inside}


def residual_layout(value, labels, n: int):
    """How manual residual `value` crosses the split: (its local type, returned as: a
    scalar is reshaped to one element; its global type; the HLO sharding that tiles its
    first dimension, one tile per class of devices holding equal values)."""
    rt = ir.RankedTensorType(value.type)
    shape = list(rt.shape) or [1]
    local = ir.RankedTensorType.get(shape, rt.element_type)
    labels, counts = _tile_counts(labels, n)
    tiles, replicas = len(counts), int(counts[0])
    order = np.argsort(labels, kind="stable")       # tile-major, its replicas after it
    dims = [tiles] + [1] * (len(shape) - 1) + ([replicas] if replicas > 1 else [])
    sharding = "{devices=[" + ",".join(map(str, dims)) + "]" + \
        ",".join(str(int(d)) for d in order) + \
        (" last_tile_dim_replicate}" if replicas > 1 else "}")
    d0 = shape[0]
    shape[0] = d0 if ir.ShapedType.is_dynamic_size(d0) else d0 * tiles
    return local, ir.RankedTensorType.get(shape, rt.element_type), sharding


def leave_region(v, layout, ip, loc) -> ir.Value:
    """`<f>_fwd`: per-device residual `v` as the global value `layout` describes."""
    local, global_type, sharding = layout
    if local != v.type:
        v = ir.Operation.create("stablehlo.reshape", results=[local], operands=[v], ip=ip,
                                loc=loc).results[0]
    v = _custom_call(SHARDING, v, local, "{manual}", ip, loc)
    return _custom_call(graph.SPMD_SHARD_TO_FULL, v, global_type, sharding, ip, loc)


def enter_region(arg, value_type, layout, ip, loc) -> ir.Value:
    """`<f>_bwd`: the global residual argument `arg` back as a per-device value."""
    local, _, sharding = layout
    v = _custom_call(SHARDING, arg, arg.type, sharding, ip, loc)
    v = _custom_call(graph.SPMD_FULL_TO_SHARD, v, local, "{manual}", ip, loc)
    if local != value_type:
        v = ir.Operation.create("stablehlo.reshape", results=[value_type], operands=[v],
                                ip=ip, loc=loc).results[0]
    return v


def _back(v, targets):
    """The operand `v` was made from through custom calls `targets` (the last op first), or
    None where the chain differs."""
    x = v
    for target in targets:
        if not isinstance(x, ir.OpResult) or graph.custom_call_target(x.owner) != target:
            return None
        x = x.owner.operands[0]
    return x


def _onward(v, target) -> list:
    """The results of the `target` custom calls `v` reaches through an `@Sharding` one."""
    out = []
    for use in v.uses:
        s = use.owner.operation
        if graph.custom_call_target(s) == SHARDING:
            out += [u.owner.operation.results[0] for u in s.results[0].uses
                    if graph.custom_call_target(u.owner.operation) == target]
    return out


def left_region(v):
    """`x` when `v` is per-device value `x` leaving a manual region (`@Sharding` {manual}
    then `@SPMDShardToFullShape`, as `leave_region` makes it; a reshape before them seen
    through); else None."""
    x = _back(v, (graph.SPMD_SHARD_TO_FULL, SHARDING))
    if isinstance(x, ir.OpResult) and x.owner.name == "stablehlo.reshape":
        x = x.owner.operands[0]
    return x


def entered_from_argument(v):
    """(argument, its sharding) when per-device `v` is a function argument entering a manual
    region (`@Sharding`, `@SPMDFullToShardShape`); else None."""
    s = _back(v, (graph.SPMD_FULL_TO_SHARD,))
    arg = _back(v, (graph.SPMD_FULL_TO_SHARD, SHARDING))
    if not isinstance(arg, ir.BlockArgument):
        return None
    sharding = _sharding_of(s.owner)
    return (arg, sharding) if sharding else None


def entered_region(arg) -> list:
    """The per-device values global `arg` enters manual regions as (`@Sharding`, then
    `@SPMDFullToShardShape`)."""
    return _onward(arg, graph.SPMD_FULL_TO_SHARD)


def round_trip_source(v):
    """`x` when `v` is per-device value `x` taken out of a manual region and back in, once or
    more (`@Sharding` {manual}, `@SPMDShardToFullShape`, `@Sharding`,
    `@SPMDFullToShardShape`: how a stack of a scan in a GSPMD shard_map body reaches the
    backward loop), with `x`'s type; else `v`."""
    trip = (graph.SPMD_FULL_TO_SHARD, SHARDING, graph.SPMD_SHARD_TO_FULL, SHARDING)
    while True:
        x = _back(v, trip)
        if x is None or x.type != v.type:
            return v
        v = x


def global_bytes(v) -> int:
    """The bytes of `v` as it leaves a manual region (`@Sharding` {manual} then
    `@SPMDShardToFullShape`: its global type), else its own."""
    full = _onward(v, graph.SPMD_SHARD_TO_FULL)
    return graph.type_bytes((full[0] if full else v).type)


def value_classes(analysis) -> dict:
    """`device_classes` of the analysed function keyed by value instead of by vid (for a
    rewrite that outlives the analysis)."""
    a = analysis
    return {a.value(vid): labels for vid, labels in
            device_classes(a, a.manual, num_devices(graph.module_of(a.func_op))).items()}


def _custom_call(target, v, result_type, sharding, ip, loc) -> ir.Value:
    op = ir.Operation.create(
        "stablehlo.custom_call", results=[result_type], operands=[v],
        attributes={"call_target_name": ir.StringAttr.get(target),
                    "mhlo.sharding": ir.StringAttr.get(sharding)}, ip=ip, loc=loc)
    return op.results[0]


class InManualRegion:
    """value -> is it inside a GSPMD manual region (computed from an
    `@SPMDFullToShardShape` result, not yet through `@SPMDShardToFullShape`)? By dataflow
    back from the value, memoized: for the values of loop bodies, where `manual_values`
    (a function's top level) does not look."""

    def __init__(self):
        self._memo: dict = {}

    def __call__(self, v) -> bool:
        memo, stack = self._memo, [v]
        while stack:
            u = stack[-1]
            if u in memo:
                stack.pop()
                continue
            if not isinstance(u, ir.OpResult):    # (a block argument: a carry, an input)
                memo[u] = False
                stack.pop()
                continue
            op = u.owner.operation
            target = graph.custom_call_target(op)
            if target in (graph.SPMD_FULL_TO_SHARD, graph.SPMD_SHARD_TO_FULL):
                memo[u] = target == graph.SPMD_FULL_TO_SHARD
                stack.pop()
                continue
            pending = [w for w in op.operands if w not in memo]
            if pending:
                stack.extend(pending)
                continue
            memo[u] = any(memo[w] for w in op.operands)
            stack.pop()
        return memo[v]
