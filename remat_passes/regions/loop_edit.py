"""Editing `stablehlo.while` loops: add and drop carries, stack and read per-iteration values.

A while op's carries are its operands, its results, and the arguments of both
of its blocks; they cannot change in place. `LoopEdit` collects the changes
(new carries, returned values, carries to drop) on the loop's blocks and then
`rebuild`s the while op once with the new carry list, moving the blocks over.

The small builders stack a body value into a new buffer (`stack_value`) and
read one slot back (`read_slot`, `slice_part`), in the shapes JAX's own scan
lowering uses.
"""
from __future__ import annotations

from remat_passes.analysis import scan_pairs
from remat_passes.analysis.scan_pairs import WHILE, ForwardLoop, shape
from remat_passes.ir import graph
from remat_passes.ir.mlir import ir


class LoopEdit:
    """Carries to add to / drop from one while; applied by rebuilding the op."""

    def __init__(self, w):
        self.op = w
        self.cond = w.regions[0].blocks[0]
        self.body = w.regions[1].blocks[0]
        self.inits = list(w.operands)
        self.returned = list(graph.terminator(self.body).operands)
        self._ret_dirty = False

    def add(self, init, loc, returned=None) -> ir.Value:
        """A new carry with initial value `init`; the body returns `returned` (default:
        the carry itself, a pass-through). Returns the body's block argument."""
        self.cond.add_argument(init.type, loc)
        arg = self.body.add_argument(init.type, loc)
        self.inits.append(init)
        self.returned.append(returned if returned is not None else arg)
        self._ret_dirty = True
        return arg

    def set_returned(self, k, value) -> None:
        self.returned[k] = value
        self._ret_dirty = True

    def flush_return(self) -> None:
        """Write the returned values into the body's terminator (before DCE, say)."""
        if not self._ret_dirty:
            return
        old = graph.terminator(self.body)
        ir.Operation.create("stablehlo.return", operands=self.returned, loc=old.location,
                            ip=ir.InsertionPoint(old))
        old.erase()
        self._ret_dirty = False

    def drop(self, keep) -> None:
        """Remove every carry k not in `keep` (their block args must be unused once the
        terminator stops returning them)."""
        drop = [k for k in range(len(self.inits)) if k not in keep]
        self.returned = [v for k, v in enumerate(self.returned) if k in keep]
        self._ret_dirty = True
        self.flush_return()
        for k in reversed(drop):
            self.cond.erase_argument(k)
            self.body.erase_argument(k)
        self.inits = [v for k, v in enumerate(self.inits) if k in keep]

    def rebuild(self, result_map) -> object:
        """Create the new while; `result_map[k]` is the new index of old result k (or None)."""
        self.flush_return()
        old = self.op
        new = ir.Operation.create(WHILE, results=[v.type for v in self.inits],
                                  operands=self.inits, regions=2, loc=old.location,
                                  ip=ir.InsertionPoint(old),
                                  attributes=graph.attributes(old))  # (frontend, remat.*)
        self.cond.append_to(new.regions[0])
        self.body.append_to(new.regions[1])
        for k, r in enumerate(old.results):
            j = result_map.get(k)
            if j is not None:
                r.replace_all_uses_with(new.results[j])
        old.erase()
        self.op = new
        return new


def drop_unused_carries(w):
    """Rebuild while `w` without the carries nothing needs: a stacked buffer (see
    `scan_pairs.analyse_forward`) whose result is unused stops being written, and a
    carry whose result is unused and that the loop only passes on is dropped.
    Returns the while op (`w` itself if nothing changed)."""
    w = w.operation
    edit = LoopEdit(w)
    args = list(edit.body.arguments)
    loop = scan_pairs.analyse_forward(w)
    unused = [k for k, r in enumerate(w.results) if next(iter(r.uses), None) is None]
    for k in unused:
        if loop is not None and k in loop.stacked:
            edit.set_returned(k, args[k])
    edit.flush_return()
    graph.erase_unused_in_block(edit.body)
    ret = graph.terminator(edit.body)
    cargs = list(edit.cond.arguments)

    def passed_on_only(k):
        body_uses = [u for u in args[k].uses if u.owner.operation != ret]
        return (not body_uses and not list(cargs[k].uses)
                and ret.operands[k] == args[k])
    drop = {k for k in unused if passed_on_only(k)}
    if not drop:
        return w
    inits = [edit.inits[k] for k in drop]
    keep = [k for k in range(len(w.results)) if k not in drop]
    edit.drop(set(keep))
    new = edit.rebuild({k: i for i, k in enumerate(keep)})
    for v in inits:     # buffers' zero constants left without readers
        op = scan_pairs.owner(v)
        if op is not None and op.name == "stablehlo.constant" and \
                next(iter(v.uses), None) is None:
            op.erase()
    return new


def read_stacks_directly(block) -> int:
    """Let every while loop in `block` (and the blocks nested in it) that reads a scan
    loop's result through ops that move it whole (`scan_pairs.same_data`: the stacking of
    a scan unrolled whole and its transpose's slices, not a reshape chain alone, which the
    pairs see through) read that result itself, so that the two loops pair; the chains
    nothing reads any more are erased. Returns how many operands it changed."""
    changed = 0
    for w in [op for op in graph.nested_ops(block) if op.name == WHILE]:
        for m, v in enumerate(list(w.operands)):
            src = scan_pairs.same_data(v)
            if src == v or src == scan_pairs.through_reshapes(v) or \
                    scan_pairs.owner(src) is None or scan_pairs.owner(src).name != WHILE:
                continue
            w.operands[m] = src
            erase_unread(v)
            changed += 1
    return changed


def erase_unread(v) -> None:
    """Erase the op making `v` where nothing reads `v` and it only moves data (a reshape,
    broadcast, slice or concatenate), and so on back through its operands: the chain
    between two loops once the second no longer reads it."""
    op = scan_pairs.owner(v)
    if op is None or next(iter(v.uses), None) is not None or op.name not in (
            "stablehlo.reshape", "stablehlo.broadcast_in_dim", "stablehlo.slice",
            "stablehlo.concatenate"):
        return
    operands = list(op.operands)
    op.erase()
    for x in operands:
        erase_unread(x)


def zeros(t, ip, loc=None) -> ir.Value:
    """A constant of zeros of tensor type `t` (any element type), made at `ip`."""
    return ir.Operation.create("stablehlo.constant", results=[t],
                               attributes={"value": graph.zeros_attr(t)}, ip=ip,
                               loc=loc).results[0]


def int_const(t, value, ip) -> ir.Value:
    attr = ir.DenseElementsAttr.get_splat(ir.RankedTensorType(t),
                                          ir.IntegerAttr.get(ir.RankedTensorType(t).element_type,
                                                             value))
    return ir.Operation.create("stablehlo.constant", results=[t], attributes={"value": attr},
                               ip=ip).results[0]


def read_slot(arg, index, before, value_type) -> ir.Value:
    """dynamic_slice one `[1, ...]` slot of stacked `arg` at `index`, reshaped to
    `value_type`, right before op `before`."""
    t = ir.RankedTensorType(arg.type)
    slot = list(t.shape)[1:]
    ip = ir.InsertionPoint(before)
    zeros = [int_const(index.type, 0, ip) for _ in slot]
    one_type = ir.RankedTensorType.get([1] + slot, t.element_type)
    ds = ir.Operation.create(
        "stablehlo.dynamic_slice", results=[one_type], operands=[arg, index] + zeros,
        attributes={"slice_sizes": ir.DenseI64ArrayAttr.get([1] + slot)}, ip=ip)
    return ir.Operation.create("stablehlo.reshape", results=[value_type],
                               operands=[ds.results[0]], ip=ip).results[0]


def slice_part(block_value, j, before, value_type) -> ir.Value:
    """Sub-step j of an unrolled scan step's stacked block `[k, ...]`, as `value_type`."""
    t = ir.RankedTensorType(block_value.type)
    dims = list(t.shape)
    ip = ir.InsertionPoint(before)
    sliced = ir.Operation.create(
        "stablehlo.slice", results=[ir.RankedTensorType.get([1] + dims[1:], t.element_type)],
        operands=[block_value],
        attributes={"start_indices": ir.DenseI64ArrayAttr.get([j] + [0] * (len(dims) - 1)),
                    "limit_indices": ir.DenseI64ArrayAttr.get([j + 1] + dims[1:]),
                    "strides": ir.DenseI64ArrayAttr.get([1] * len(dims))}, ip=ip)
    return ir.Operation.create("stablehlo.reshape", results=[value_type],
                               operands=[sliced.results[0]], ip=ip).results[0]


def stack_value(loop: ForwardLoop, edit: LoopEdit, v) -> ir.Value:
    """Add a buffer to forward loop `loop` (through `edit`) that stacks body value `v` at
    the loop's slot index; returns the buffer's initial value (zeros, before the loop)."""
    ftype = ir.RankedTensorType(v.type)
    stacked_type = ir.RankedTensorType.get([loop.trip_count] + list(ftype.shape),
                                           ftype.element_type)
    zero = zeros(stacked_type, ir.InsertionPoint(loop.op))
    ref = next(iter(loop.stacked.values()))
    arg = edit.add(zero, loop.op.location)
    ip = ir.InsertionPoint(graph.terminator(edit.body))
    one_type = ir.RankedTensorType.get([1] + list(ftype.shape), ftype.element_type)
    upd = ir.Operation.create("stablehlo.reshape", results=[one_type], operands=[v],
                              ip=ip).results[0]
    offsets = [int_const(ref.index.type, 0, ip) for _ in ftype.shape]
    dus = ir.Operation.create("stablehlo.dynamic_update_slice", results=[stacked_type],
                              operands=[arg, upd, ref.index] + offsets, ip=ip)
    edit.set_returned(len(edit.inits) - 1, dus.results[0])
    return zero


__all__ = ["LoopEdit", "drop_unused_carries", "erase_unread", "read_stacks_directly",
           "read_slot", "slice_part", "stack_value", "int_const", "zeros", "shape"]


def reuse_saved_stacks(clone, outer: dict, reuse_inner):
    """A clone of a forward scan loop made to recompute it (in an outer backward body, in a
    shard_map's recompute computation, in a cond's branch): its stacked values that the
    policy saves come from the stacks saved (`outer`: result k -> the saved stack); the
    clone reads them back per iteration instead of computing them again. A stacked value
    that a region op of the body returns (a case its branch value, a nested loop its
    stack) goes to `reuse_inner(op, {result: value read})` too, so that its regions read
    it instead of computing it. Returns the rebuilt clone."""
    new_loop = scan_pairs.analyse_forward(clone)
    edit = LoopEdit(clone)
    inner: dict = {}                        # region op -> {its result number: value read}
    for k in outer:
        st = new_loop.stacked[k]
        arg = edit.add(outer[k], clone.location)
        u = st.value
        read = read_slot(arg, st.index, u.owner.operation, u.type)
        for use in list(u.uses):
            if use.owner.operation != read.owner.operation:
                use.owner.operands[use.operand_number] = read
        for j, r in enumerate(edit.returned):   # a carry-out the policy saves
            if r == u:
                edit.set_returned(j, read)
        edit.set_returned(k, new_loop.body.arguments[k])   # no need to stack it again
        if len(u.owner.operation.regions):
            inner.setdefault(u.owner.operation, {})[u.result_number] = read
    edit.flush_return()     # (first: the inner ops rebuilt then replace what it returns)
    for op, values in inner.items():
        reuse_inner(op, values)
    graph.erase_unused_in_block(new_loop.body)
    return edit.rebuild({k: k for k in range(len(clone.results))})
