"""Segmenting a scan inside a shard_map body: its loop pair crosses the VJP's two manual
computations (`sdy.manual_computation`s), the forward one returning the stacks of the scan
in its body and the backward one taking them.

`find_manual_pairs` finds such pairs in one function (joint form) and `ManualCrossing`
carries what the backward loop now needs out of the forward body and into the backward
one; in split form the forward computation is in <f>_fwd and the backward one in <f>_bwd
(`find_split_manual_pairs`, `SplitManualCrossing`), so what crosses is a residual too.
Under GSPMD the body is inlined between custom calls instead; in split form
`find_split_gspmd_pairs` pairs its loops across the halves and `GspmdCrossing` takes what
crosses out of the manual region and back in. `scan_segments.segment` does the rewrite with
any of them.
"""
from __future__ import annotations

import numpy as np

from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import ir, op_id
from remat_passes.regions.loop_edit import zeros
from remat_passes.regions.scan_segments import Crossing, new_op, pairs_across
from remat_passes.regions.shard_map_rewrite import new_manual, shrunk, with_residuals
from remat_passes.sharding import gspmd
from remat_passes.sharding.sdy import (manual_axes, mesh_of, residual_layout, shardings,
                                       varying_axes)


def find_manual_pairs(block) -> list[tuple]:
    """(forward manual computation, backward one, their scan pairs): a shard_map under a
    VJP is two `sdy.manual_computation`s, the forward one returning the stacks of the scan
    in its body, the backward one taking them as operands for the scan in its own."""
    mcs = _manual_computations(block)
    return _pairs_between(mcs, mcs, lambda v: v)


def _manual_computations(block) -> list:
    return [op.operation for op in block.operations
            if op.operation.name == graph.MANUAL_COMPUTATION]


def _pairs_between(fwd_mcs, bwd_mcs, source) -> list[tuple]:
    """(forward computation, backward one, their scan pairs) for each backward computation
    with an operand `v` whose `source(v)` is a result of a forward computation."""
    found = []
    for a in fwd_mcs:
        yields = graph.terminator(a.regions[0].blocks[0]).operands
        for b in bwd_mcs:
            body = b.regions[0].blocks[0]
            crossed = {}
            for j, v in enumerate(b.operands):
                r = source(v)
                if isinstance(r, ir.OpResult) and op_id(r.owner) == op_id(a):
                    crossed[body.arguments[j]] = yields[r.result_number]
            pairs = pairs_across(a.regions[0].blocks[0], body, crossed) if crossed else []
            if pairs:
                found.append((a, b, pairs))
    return found


class ManualCrossing:
    """`Crossing` between two manual computations (a shard_map's forward and backward
    bodies): `bring` gives a stand-in in the backward body for a value of the forward body;
    `finish` makes each a new result of the forward computation and a new operand of the
    backward one, laid out as JAX lays out shard_map residuals (its first dimension sharded
    over the manual axes it varies over, `residual_layout`), and drops the stacks nothing
    reads any more. A value that is an argument of the forward body (a weight the loop
    reads, say) is not copied out: the backward computation takes the forward one's
    operand for it as well; a constant is made again in the backward body. The memory kind
    of an offloaded value is not carried across (the saved carries stay on the device
    there)."""

    keeps_memory_kind = False   # so segment-scans keeps the saved carries on the device

    def __init__(self, fwd_mc, bwd_mc):
        self.fwd, self.bwd = fwd_mc, bwd_mc
        self.wanted = []        # (stand-in in the backward body, its slot in the return)
        self.passed = []        # (stand-in in the backward body, forward body argument no.)
        self._layout = None

    def residual_bytes(self, value) -> int:
        """The bytes of the computation's result that carries `value` of the forward body
        out now (its global type, as residuals are counted); as a new residual if none."""
        ret = graph.terminator(self.fwd.regions[0].blocks[0])
        for r, v in zip(self.fwd.results, ret.operands):
            if v == value:
                return graph.type_bytes(r.type)
        return graph.type_bytes(value.type) * self.scale(value)

    def new_bytes(self, values) -> int:
        """The bytes of `values` of the forward body as new results of the computation: what
        the activations gain when they cross (joint form; in split form the records count).
        An argument of the forward body is passed, not copied, and a constant made again:
        nothing."""
        return sum(graph.type_bytes(v.type) * self.scale(v) for v in values
                   if not self._argument(v) and not (isinstance(v, ir.OpResult)
                                                     and v.owner.name == "stablehlo.constant"))

    def _argument(self, value) -> bool:
        return isinstance(value, ir.BlockArgument) and \
            value.owner == self.fwd.regions[0].blocks[0]

    def scale(self, value) -> int:
        """A value of the forward body's bytes as a new residual of the computation (its
        global type in the layout `finish` gives it: the devices' copies side by side, as
        residuals are counted) over its bytes in the body (one device's)."""
        if self._layout is None:
            mesh_ref, mesh = mesh_of(self.fwd)
            self._layout = (mesh_ref, mesh, varying_axes(self.fwd, mesh),
                            frozenset(manual_axes(self.fwd)))
        mesh_ref, mesh, varying, every = self._layout
        local, whole, _ = residual_layout(value, varying.get(value, every), mesh, mesh_ref)
        return graph.type_bytes(whole) // max(graph.type_bytes(local), 1)

    def bring(self, value, ip, memory_kind: str | None = None, like=None):
        """A stand-in in the backward body; the forward body returns `value` at once, past
        the computation's results (so that later rewrites keep it current) until
        `finish`."""
        if isinstance(value, ir.OpResult) and value.owner.name == "stablehlo.constant":
            return value.owner.clone(ip=ip).results[0]     # (a literal: made again there)
        stand_in = zeros(value.type, ip)
        if self._argument(value):     # (the forward computation's operand goes across)
            self.passed.append((stand_in, value.arg_number))
            return stand_in
        ret = graph.terminator(self.fwd.regions[0].blocks[0])
        self.wanted.append((stand_in, len(ret.operands)))
        ir.Operation.create("sdy.return", operands=list(ret.operands) + [value],
                            loc=ret.location, ip=ir.InsertionPoint(ret))
        ret.erase()
        return stand_in

    def drop_stacks(self, values) -> None:
        """(The stacks go in `finish`, with every result nothing reads.)"""

    def finish(self) -> None:
        new_a, layouts, n_old = self.finish_forward()
        self.finish_backward(list(new_a.results)[n_old:], layouts, n_old,
                             [new_a.operands[k] for _, k in self.passed])
        shrink_results(new_a)

    def finish_forward(self):
        """The forward computation rebuilt with the brought values as new results, in
        JAX's shard_map residual layout. Returns (it, the layouts, its old result count)."""
        a = self.fwd
        n_old = len(a.results)
        values = list(graph.terminator(a.regions[0].blocks[0]).operands)[n_old:]
        self.inner = values     # (the values of the forward body, in the new results' order)
        self.fwd, layouts = with_residuals(a, values)
        return self.fwd, layouts, n_old

    def finish_backward(self, operands, layouts, n_old, passed):
        """The backward computation rebuilt with `operands` (the new results of the forward
        one, or what stands for them) and `passed` (the forward one's operands for the
        forward body's arguments it reads, or what stands for them) as new operands, its
        body reading them in place of the stand-ins, and without the stacks it no longer
        reads."""
        b = self.bwd
        body_b = b.regions[0].blocks[0]
        args = [body_b.add_argument(local, b.location) for local, _, _ in layouts]
        top = ir.InsertionPoint.at_block_begin(body_b)
        for stand_in, at in self.wanted:
            arg = args[at - n_old]
            stand_in.replace_all_uses_with(
                arg if arg.type == stand_in.type else
                new_op("stablehlo.reshape", [arg], stand_in.type, top))
            stand_in.owner.erase()
        fwd_in = shardings(self.fwd, "in_shardings")
        for stand_in, _ in self.passed:
            stand_in.replace_all_uses_with(body_b.add_argument(stand_in.type, b.location))
            stand_in.owner.erase()
        new_b = new_manual(b, list(b.operands) + list(operands) + list(passed),
                           [r.type for r in b.results],
                           shardings(b, "in_shardings") + [s for _, _, s in layouts]
                           + [fwd_in[k] for _, k in self.passed],
                           shardings(b, "out_shardings"), ir.InsertionPoint(b), b.location)
        body_b.append_to(new_b.regions[0])
        for k, r in enumerate(b.results):
            r.replace_all_uses_with(new_b.results[k])
        b.erase()
        # the stacks the backward body no longer reads
        shrunk(new_b, list(range(len(new_b.results))), drop_unused_args=True)
        self.bwd = new_b


def shrink_results(mc) -> None:
    """Drop the results of manual computation `mc` nothing reads (the stacks that crossed)."""
    shrunk(mc, [k for k, r in enumerate(mc.results) if next(iter(r.uses), None) is not None],
           drop_unused_args=False)


# ------------------------------- inside shard_map bodies, split form --
def find_split_manual_pairs(fwd_func, bwd_func) -> list[tuple]:
    """(forward manual computation of <f>_fwd, backward one of <f>_bwd, their scan pairs):
    in split form the stacks of a scan in a shard_map body leave the forward computation
    as its results, <f>_fwd returns them as residuals, and the backward computation takes
    <f>_bwd's arguments for them."""
    ret = graph.terminator(graph.body_block(fwd_func))
    bargs = list(graph.body_block(bwd_func).arguments)
    returned = {bargs[k]: ret.operands[i]
                for k, i in enumerate(contract.residual_results(fwd_func))}
    return _pairs_between(
        _manual_computations(graph.body_block(fwd_func)),
        _manual_computations(graph.body_block(bwd_func)),
        lambda v: returned.get(v) if isinstance(v, ir.BlockArgument) else None)


class SplitManualCrossing(ManualCrossing):
    """`ManualCrossing` in split form: the forward computation is in <f>_fwd and the
    backward one in <f>_bwd, so its new results also cross as residuals (`Crossing`), and
    the residuals that carried the stacks go."""

    def __init__(self, fwd_mc, bwd_mc, crossing: Crossing):
        super().__init__(fwd_mc, bwd_mc)
        self.crossing = crossing

    def new_bytes(self, values) -> int:
        """(Split form: the residual records `finish` returns count what crosses.)"""
        return 0

    def finish(self, describe) -> list:
        """`describe(value of the forward body, the residual that carries it)` ->
        (description, bytes). Returns the residual records in their new order."""
        bargs = list(graph.body_block(self.crossing.bwd).arguments)
        unused = {k for k, arg in enumerate(bargs) if next(iter(arg.uses), None) is None}
        new_a, layouts, n_old = self.finish_forward()
        results = list(new_a.results)[n_old:]
        before = ir.InsertionPoint(self.bwd)
        self.finish_backward([self.crossing.bring(r, before) for r in results], layouts, n_old,
                             [self.crossing.bring(new_a.operands[k], before)
                              for _, k in self.passed])
        # the residuals that carried the stacks: their arguments are read no more
        ret = graph.terminator(graph.body_block(self.crossing.fwd))
        self.crossing.drop_stacks([ret.operands[i] for k, i in enumerate(self.crossing.res_idx)
                                   if k not in unused and next(iter(bargs[k].uses), None) is None])
        inner = list(zip(results, self.inner))

        def described(value):
            return describe(next((v for r, v in inner if r == value), value), value)
        records = self.crossing.finish(described)
        shrink_results(new_a)
        return records


# ------------------------------- inside GSPMD shard_map bodies, split form --
def find_split_gspmd_pairs(fwd_func, bwd_func) -> list:
    """Scan pairs across the halves in a GSPMD shard_map body (inlined into both): a stack
    leaves <f>_fwd's manual region through `@Sharding` {manual} and `@SPMDShardToFullShape`
    as a residual, and comes back into <f>_bwd's through `@Sharding` and
    `@SPMDFullToShardShape` (then, maybe, out and in again) to its backward loop."""
    ret = graph.terminator(graph.body_block(fwd_func))
    bargs = list(graph.body_block(bwd_func).arguments)
    crossed = {}
    for k, i in enumerate(contract.residual_results(fwd_func)):
        left = gspmd.left_region(ret.operands[i])
        if left is None:
            continue
        left = gspmd.round_trip_source(left)
        for v in gspmd.entered_region(bargs[k]):
            if v.type == left.type:
                crossed[v] = left
    if not crossed:
        return []
    return pairs_across(graph.body_block(fwd_func), graph.body_block(bwd_func), crossed,
                        source=gspmd.round_trip_source)


class GspmdCrossing(Crossing):
    """`Crossing` for a scan in a GSPMD shard_map body in split form: what crosses is a
    per-device value of the manual region, so it leaves <f>_fwd's region as a global value
    (`gspmd.leave_region`) and comes back into <f>_bwd's (`gspmd.enter_region`), its first
    dimension tiled over the groups of devices that hold different values (as the
    residuals remat-partial-eval makes there; a saved carry as its carry). The stacks it
    replaces go as residuals once nothing in <f>_bwd reads them."""

    keeps_memory_kind = False

    def __init__(self, fwd_func, bwd_func, residuals: list, labels: dict, n: int):
        super().__init__(fwd_func, bwd_func, residuals)
        self.labels, self.n = labels, n      # (manual values of <f>_fwd: device classes)
        self.layouts = {}                    # global value returned -> (layout, local)

    @staticmethod
    def residual_bytes(value) -> int:
        return gspmd.global_bytes(value)

    def _layout(self, value, like=None):
        labels = self.labels.get(value if like is None else like)
        return gspmd.residual_layout(value, np.arange(self.n) if labels is None else labels,
                                     self.n)

    def scale(self, value) -> int:
        local, whole, _ = self._layout(value)
        return graph.type_bytes(whole) // max(graph.type_bytes(local), 1)

    def bring(self, value, ip, memory_kind: str | None = None, like=None):
        """`like`: a value of <f>_fwd that varies across devices as `value` does (a saved
        carry: its carry's initial value). A constant is made again in <f>_bwd, and an
        argument of <f>_fwd entering the region (a weight, the inputs) is not copied out:
        the argument crosses as it is and enters <f>_bwd's region the same way."""
        loc = ir.Location.unknown()
        if isinstance(value, ir.OpResult) and value.owner.name == "stablehlo.constant":
            return value.owner.clone(ip=ip).results[0]
        entered = gspmd.entered_from_argument(value)
        if entered is not None:
            arg, sharding = entered
            return gspmd.enter_region(super().bring(arg, ip), value.type,
                                      (value.type, None, sharding), ip, loc)
        layout = self._layout(value, like)
        ret = graph.terminator(graph.body_block(self.fwd))
        leaving = gspmd.leave_region(value, layout, ir.InsertionPoint(ret), loc)
        self.layouts[leaving] = (layout, value)
        stand_in = super().bring(leaving, ip)
        return gspmd.enter_region(stand_in, value.type, layout, ip, loc)

    def entry(self, value) -> dict:
        """A new residual's sharding: its layout's, or an argument's own."""
        if isinstance(value, ir.BlockArgument):
            own = contract.all_entries(self.fwd, "arg_attrs")[value.arg_number]
            return {k: own[k] for k in ("mhlo.sharding",) if k in own}
        layout = self.layouts.get(value)
        return {} if layout is None else {
            "mhlo.sharding": ir.StringAttr.get(layout[0][2])}

    def finish(self, describe) -> list:
        """`describe(value, residual)` -> (description, bytes): the value in the region
        and the global residual that carries it."""
        fblock, bblock = graph.body_block(self.fwd), graph.body_block(self.bwd)
        graph.erase_unused_in_block(bblock)     # (what read the stacks the loop no more)
        ret = graph.terminator(fblock)
        bargs = list(bblock.arguments)
        self.dropped |= {k for k, i in enumerate(self.res_idx)
                         if gspmd.left_region(ret.operands[i]) is not None
                         and next(iter(bargs[k].uses), None) is None}
        return super().finish(lambda v: describe(self.layouts.get(v, (None, v))[1], v))
