"""segment-scans: keep a scan's carry every k iterations and recompute each segment in the backward.

A scan under a VJP keeps one residual slot per iteration (what the body's policy saves), so a
256-step loop keeps 256 of them whatever the policy. With `segments=k` each scan loop pair
of the function (as remat-partial-eval leaves it, joint or split) is rewritten by
`regions.scan_segments`: the forward loop saves its carry state at the start of every k-th
iteration (ceil(n/k) of them); the backward loop, on reaching a segment, reruns that
segment's k forward iterations from the saved carry into k-slot buffers and reads its
residuals from them. Residual memory goes from n slots to ceil(n/k) carries + k slots
(least near k = sqrt(n) when a slot and a carry are alike) for one more run of the forward
body per iteration: the two-level `jax.checkpoint` scheme, as a rewrite.

In split form the pairs span <f>_fwd and <f>_bwd (`scan_segments.find_split_pairs`): the
saved carries, and the loop invariants <f>_bwd lacks, cross as residuals instead of the stacks
(`scan_segments.Crossing`). With `offload=pinned_host` the saved carries wait in host memory:
each goes there as the forward loop writes it and comes back as the backward reads it.
Under `auto` with a budget below the least a per-iteration plan keeps, remat-partial-eval
chooses the segments (`state.planned_segments`) and this pass applies them. Pairs the
rewrite does not recognise (see `scan_segments.check`) are left as they are, with a remark
saying why. Loops nested in a scan body are copied with it, not segmented themselves.
"""
from __future__ import annotations

import dataclasses

from remat_passes.analysis import scan_pairs
from remat_passes.core.residuals import describe_value
from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import ir, op_id
from remat_passes.passes.base import ModulePass, option
from remat_passes.passes.diagnostics import Remark
from remat_passes.regions import manual_crossing, scan_segments
from remat_passes.regions.loop_edit import drop_unused_carries
from remat_passes.sharding import gspmd


def parse_offload(text) -> str | None:
    """`offload=`: where the saved carries wait for the backward (None, or empty: on the
    device)."""
    text = "" if text is None else str(text).strip()
    if text not in ("", *contract.HOST_KINDS):
        raise ValueError(f"expected {' or '.join(contract.HOST_KINDS)} (or nothing), "
                         f"got '{text}'")
    return text or None


def parse_segments(text) -> int | str | list:
    """`segments=`: a count >= 0, sqrt, or counts per level (`16x4`: segments of 16 steps,
    each rerun in sub-segments of 4)."""
    if isinstance(text, (list, tuple)):
        text = "x".join(str(x) for x in text)
    text = str(text).strip()
    if text in ("sqrt", "cbrt"):
        return text
    try:
        levels = [int(x) for x in text.split("x")]
    except ValueError:
        levels = [-1]
    if any(x < 0 for x in levels) or (len(levels) > 1 and 0 in levels):
        raise ValueError(f"expected a count of iterations (0: off), counts per level such as "
                         f"16x4, sqrt or cbrt, got '{text}'")
    return levels[0] if len(levels) == 1 else levels


@dataclasses.dataclass
class SegmentScans(ModulePass):
    name = "segment-scans"
    summary = ("Keep each scan's carry every k iterations; the backward recomputes a segment "
               "at a time (two-level checkpointing of loops)")

    # (when it rewrites it drops every analysis itself; when it has nothing to do, the
    # analyses the pipeline built stay valid for the passes after it)
    preserves_analyses = True

    segments: int | str = option(
        0, "iterations per segment; counts per level such as 16x4 (segments of 16, rerun in "
        "sub-segments of 4); or sqrt / cbrt: per loop, the two / three levels that keep the "
        "fewest bytes (about sqrt(n * carry / slot) per segment) (0: leave scans alone)",
        parse_segments)
    func: str = option("main", "the function whose scan loop pairs to segment")
    offload: str | None = option(None, "pinned_host or unpinned_host: keep the saved carries "
                                 "in that memory between the loops (default: on the device)",
                                 parse_offload)

    def apply(self, module_op, state) -> None:
        segments = self.segments or state.planned_segments.get(self.func, 0)
        split = graph.is_split(module_op, self.func)
        names = graph.functions_of(module_op, self.func)
        if not segments and not any(   # (nothing asked, no loop that could ask for itself:
                op.name == scan_pairs.WHILE  # read from the analysis the pipeline keeps)
                for n in names for op in state.analysis(graph.find_func(module_op, n)).ops):
            return
        with module_op.context, ir.Location.unknown():
            if split:
                self._split(module_op, segments, state)
                return
            func = graph.find_func(module_op, self.func)
            done = state.segmented.setdefault(self.func, [])
            # (found afresh, not the kept analysis's: insert-reduce-precision may have
            # rounded a stacked value inside a body since, and the copy must write that)
            pairs = scan_pairs.find_pairs_in_block(graph.body_block(func))
            # a scan in a GSPMD shard_map body, inlined: its stacks leave the manual region
            # and come back in; the segmented loops pass the saved carries directly (both
            # loops are in the region: `{manual}` values on either side)
            paired = {op_id(p.bwd) for p in pairs}
            pairs += [p for p in scan_pairs.find_pairs_in_block(graph.body_block(func),
                                                                gspmd.round_trip_source)
                      if op_id(p.bwd) not in paired]
            manual = manual_crossing.find_manual_pairs(graph.body_block(func))
            found = pairs + [p for _, _, ps in manual for p in ps]
            unpaired = _unpaired_forward_loops(func, found, state.analysis(func)) \
                if segments and len(found) < _while_count(func) else 0
            if unpaired:
                self._unpaired_remark(unpaired, state, func)
            self._segment_pairs(pairs, segments, state, done)
            for fwd_mc, bwd_mc, in_bodies in manual:    # a scan inside a shard_map body
                crossing = manual_crossing.ManualCrossing(fwd_mc, bwd_mc)
                before = len(done)
                self._segment_pairs(in_bodies, segments, state, done, crossing)
                if len(done) > before:
                    crossing.finish()
            if done:                  # the stacks' zero initial values, now unread
                graph.erase_unused_in_block(graph.body_block(func))
                state.drop()

    def _unpaired_remark(self, unpaired, state, func) -> None:
        state.remarks.append(Remark(
            f"@{self.func}: {unpaired} scan loop(s) were not segmented: their stacks "
            "reach the backward loop through other ops than a return or a shard_map "
            "boundary; segment-scans takes the loop pairs at the function's top level "
            "and those of a shard_map's forward and backward "
            "bodies", func.location))

    def _segment_pairs(self, pairs, segments, state, done, crossing=None) -> None:
        """Segment each pair at its own length (`rp.scan(..., segments=)`), else at
        `segments`; say why where a pair cannot be (segmenting one pair leaves the others'
        ops as they are)."""
        for pair in pairs:
            k = _marked_length(pair) or segments
            if not k:
                continue
            why = scan_segments.check(pair, k, split=crossing is not None)
            location = pair.fwd.op.location         # (remarks are about the forward loop)
            if isinstance(why, str):
                state.remarks.append(Remark(f"@{self.func}: a scan loop was not segmented: "
                                            f"{why}", location))
                continue
            offload = self.offload if crossing is None or crossing.keeps_memory_kind else None
            done.append(scan_segments.segment(why, crossing, offload))
            state.remarks.append(Remark(f"@{self.func}: {done[-1].text()}", location))

    def _split(self, module_op, segments, state) -> None:
        """Split form: the loop pairs span <f>_fwd and <f>_bwd; what the backward loop now
        needs from the forward (the saved carries, the loop's invariants) crosses as
        residuals, and the stacks stop crossing."""
        fwd = graph.find_func(module_op, f"{self.func}_fwd")
        bwd = graph.find_func(module_op, f"{self.func}_bwd")
        done = state.segmented.setdefault(self.func, [])
        pairs = scan_segments.find_split_pairs(fwd, bwd)
        manual = manual_crossing.find_split_manual_pairs(fwd, bwd)
        # a scan in a GSPMD shard_map body: its stacks leave <f>_fwd's manual region and
        # come back into <f>_bwd's (the device classes of its values read before rewriting)
        in_gspmd = manual_crossing.find_split_gspmd_pairs(fwd, bwd)
        gspmd_labels = gspmd.value_classes(state.analysis(fwd)) if in_gspmd else {}
        found = pairs + [p for _, _, ps in manual for p in ps] + in_gspmd
        unpaired = _unpaired_forward_loops(fwd, found) \
            if segments and len(found) < _while_count(fwd) else 0
        if unpaired:
            self._unpaired_remark(unpaired, state, fwd)
        crossing = scan_segments.Crossing(fwd, bwd, state.residuals.get(self.func, []))
        before = len(done)
        self._segment_pairs(pairs, segments, state, done, crossing)

        def describe(v, residual=None):
            if isinstance(v, ir.OpResult) and v.owner.name == scan_pairs.WHILE:
                text = ("the carry at the start of every segment of a scan loop, saved by "
                        "segment-scans")
            else:
                text = describe_value(v, fwd)
            return text, graph.type_bytes((v if residual is None else residual).type)
        if len(done) > before:
            state.residuals[self.func] = crossing.finish(describe)
        # a scan inside a shard_map body: its forward computation is in <f>_fwd, its
        # backward one in <f>_bwd (one at a time: each rewrites both signatures)
        for fwd_mc, bwd_mc, in_bodies in manual:
            crossing = manual_crossing.SplitManualCrossing(
                fwd_mc, bwd_mc,
                scan_segments.Crossing(fwd, bwd, state.residuals.get(self.func, [])))
            at = len(done)
            self._segment_pairs(in_bodies, segments, state, done, crossing)
            if len(done) > at:
                state.residuals[self.func] = crossing.finish(describe)
        if in_gspmd:
            crossing = manual_crossing.GspmdCrossing(
                fwd, bwd, state.residuals.get(self.func, []), gspmd_labels,
                gspmd.num_devices(module_op))
            at = len(done)
            self._segment_pairs(in_gspmd, segments, state, done, crossing)
            if len(done) > at:
                state.residuals[self.func] = crossing.finish(describe)
        if len(done) == before:
            return
        for f in (fwd, bwd):
            graph.erase_unused_in_block(graph.body_block(f))
        # the forward loops stop writing the stacks that no longer cross (at the top level
        # or in a shard_map's forward body)
        for op in [o for o in graph.nested_ops(graph.body_block(fwd))
                   if o.name == scan_pairs.WHILE
                   and o.parent.name in ("func.func", graph.MANUAL_COMPUTATION)]:
            drop_unused_carries(op)
        graph.erase_unused_in_block(graph.body_block(fwd))
        state.drop()


def _marked_length(pair):
    """The segment length `rp.scan(..., segments=)` gave this loop (a name marker on its
    carry, `remat.segments=<spec>`), else None."""
    for op in pair.fwd.body.operations:
        name = contract.checkpoint_name(op)
        if name is not None and name.startswith(contract.SEGMENTS_NAME):
            return parse_segments(name[len(contract.SEGMENTS_NAME):])
    return None


def _while_count(func) -> int:
    return sum(1 for op in graph.nested_ops(graph.body_block(func)) if op.name == scan_pairs.WHILE)


def _unpaired_forward_loops(func, pairs, analysis=None) -> int:
    """Forward scan loops of `func` that are in no top-level pair (a loop nested in another
    loop's body is not counted: it is copied with that body). `analysis`: of a joint
    function, to leave its backward loops out (None: `func` is a forward half)."""
    paired = {op_id(p.fwd.op) for p in pairs}
    count = 0
    for op in graph.nested_ops(graph.body_block(func)):
        if op.name != scan_pairs.WHILE or op_id(op) in paired:
            continue
        parent, in_loop = op.parent, False
        while parent is not None and parent.name != "func.func":
            in_loop = in_loop or parent.name == scan_pairs.WHILE
            parent = parent.parent
        if in_loop or (analysis is not None
                       and analysis.is_backward(graph.top_level(op, func))):
            continue
        if scan_pairs.analyse_forward(op) is not None:
            count += 1
    return count
