"""Two levels of recomputation for straight-line code: the backward keeps only segment
boundaries of what it recomputes, and recomputes each segment again just before its own
backward ops.

A one-level plan recomputes every value the forward does not keep once, just in time: before
the first backward op that needs it. When the forward keeps little (a small `auto` budget,
`nothing_saveable`), that first backward op is the last layer's, whose inputs need the whole
forward: the backward then recomputes the whole forward at once and holds every value its
later ops read, as much as the program without remat keeps. That is why, along a sweep of
budgets, the tightest budgets can need more memory than larger ones.

`two_levels(analysis, decider, plan, build)` cuts the forward ops the plan recomputes into
segments, in program order, where few bytes cross (a transformer's residual stream between
layers), and plans again with a decider (`TwoLevelDecider`) that gives each segment a
checkpoint-scope context of its own: what a segment's backward ops read from their own
segment is recomputed by a clone in that context, right before them (the second level); what
crosses a cut is recomputed once for everyone, in the top-level context, and kept until the
last segment that reads it is done (the first level, the chain). The same mechanism serves
nested `rp.checkpoint` regions (`plan.PolicyDecider`); here the scopes are made up. The
residuals do not change (the decider asks the one-level decider what is saved); the backward's
working set falls from everything its ops read to the cut values plus one segment's, for about
one more forward of the recomputed ops.

Which cuts: a segment's *weight* is the bytes of its recomputed values that backward ops read;
the *crossing* bytes of a cut are those of recomputed values produced before it and read by
recomputed ops after it. The backward's working set while segment j is served is about the
cuts up to j plus segment j's weight; for 2 to `MAX_SEGMENTS` segments of about equal weight
(each cut moved, within half a segment, to where the fewest bytes cross), the count with the
smallest largest working set is taken. Two levels are used only where that working set is at
most `GAIN` of the one-level one (the weight of everything).
"""
from __future__ import annotations

import copy
from typing import NamedTuple

import numpy as np

from remat_passes.analysis.function import FunctionAnalysis
from remat_passes.core.materialize import materialize
from remat_passes.cost.memory import estimate_function
from remat_passes.ir import graph
from remat_passes.ir.mlir import ir
from remat_passes.policy.policies import Recompute

MAX_SEGMENTS = 16
GAIN = 0.75     # two levels only where the working set falls to at most 3/4 ...
PEAK_GAIN = 0.85  # ... and the estimated peak of the function by 15%


class TwoLevelDecider:
    """A decider (see `plan.PolicyDecider`) that saves what `base` saves and recomputes the
    rest in the context of the reader's segment: per position, `chains` is (segment,) for a
    forward op inside a segment and for a backward op that reads from one, else ()."""

    def __init__(self, base, chains: list):
        self.base = base
        self.chains = chains

    def home(self, pos, ctx, saved):
        verdict, _ = self.base.home(pos, (), saved)
        if verdict is not Recompute:
            return verdict, 0
        return Recompute, len(ctx)   # () for the chain, (segment,) inside the segment


class Levels(NamedTuple):
    """What `two_levels` chose: the plan, its segment count, and the function's peak as
    estimated (`estimate_memory`'s xla model), with one level and with two (bytes)."""
    plan: object
    segments: int
    one_level: int
    two_levels: int
    extra_clones: int     # clones beyond the one-level plan's


def estimated_peak(a, plan) -> int:
    """The peak of the function `plan` would leave (estimate_memory's xla model), built on a
    copy of the function that is erased again."""
    func = a.func_op.operation
    twin = func.clone(ip=ir.InsertionPoint(func))
    try:
        b = FunctionAnalysis(twin, a.cotangent_indices)
        for known in ("backward", "side_effect", "producer", "_reads", "_transposed"):
            b.__dict__[known] = getattr(a, known)   # (the copy's ops are the function's,
                                                    # position by position)
        trial = copy.copy(plan)
        trial.analysis = b
        materialize(trial)
        return estimate_function(twin, model="xla")
    finally:
        twin.erase()


def _weights(a, plan):
    """Per recomputed op (in program order): its position, its weight and the crossing bytes
    of a cut right before it (see the module docstring)."""
    recomputed = sorted({c.op for c in plan.clones() if not a.free[c.op]})
    if len(recomputed) < 2:
        return None
    index = {pos: i for i, pos in enumerate(recomputed)}
    n = len(recomputed)
    weight = np.zeros(n, dtype=np.int64)
    delta = np.zeros(n + 1, dtype=np.int64)
    backward = a.backward
    for i, pos in enumerate(recomputed):
        for vid in a.results(pos):
            read_back, last = False, -1
            for u in a.users(vid):
                if u < len(a.ops) and backward[u]:
                    read_back = True
                else:
                    last = max(last, index.get(u, -1))
            if not read_back and last <= i:
                continue
            size = graph.type_bytes(a.value(vid).type)
            if read_back:
                weight[i] += size
            if last > i:
                delta[i + 1] += size        # crosses the cuts before ops i+1 .. last
                delta[last + 1] -= size
    crossing = np.cumsum(delta)[:n]
    return recomputed, weight, crossing


def _best_cuts(weight, crossing):
    """(working set, cut indices) of the best segment count, or None."""
    n = len(weight)
    prefix = np.concatenate(([0], np.cumsum(weight)))
    total = int(prefix[-1])
    if total == 0:
        return None
    best = None
    for m in range(2, min(MAX_SEGMENTS, n) + 1):
        cuts = []
        for k in range(1, m):
            lo = np.searchsorted(prefix, total * (k - 0.5) / m, side="left")
            hi = np.searchsorted(prefix, total * (k + 0.5) / m, side="right")
            lo = max(lo, (cuts[-1] + 1) if cuts else 1)
            hi = min(hi, n)
            if lo >= hi:
                continue
            cuts.append(lo + int(np.argmin(crossing[lo:hi])))
        if not cuts:
            continue
        bounds = [0] + cuts + [n]
        held, worst = 0, 0
        for j in range(len(bounds) - 1):
            if j:
                held += int(crossing[bounds[j]])
            worst = max(worst, held + int(prefix[bounds[j + 1]] - prefix[bounds[j]]))
        if best is None or worst < best[0]:
            best = (worst, cuts)
    return best if best is None else (best[0], best[1], total)


def two_levels(a, decider, plan, build) -> Levels | None:
    """The two-level plan of `plan` (made by `decider`), or None where it does not lower the
    backward's working set to `GAIN` of the one-level one. `build(decider)` plans again with
    the same options. Only for deciders without checkpoint scopes of their own, in functions
    without GSPMD shard_map bodies."""
    if any(decider.chains) or any(a.manual):   # (not inside GSPMD shard_map bodies: their
        return None                            # per-device values are not tried here)
    found = _weights(a, plan)
    if found is None:
        return None
    recomputed, weight, crossing = found
    best = _best_cuts(weight, crossing)
    if best is None:
        return None
    worst, cuts, total = best
    if worst > GAIN * total:
        return None
    starts = [recomputed[c] for c in cuts]     # the first position of segments 1..m-1
    segment = np.searchsorted(np.asarray(starts), np.arange(len(a.ops)), side="right")
    chains: list = [()] * len(a.ops)
    producer, backward, free = a.producer, a.backward, a.free
    inside = set(recomputed)
    for pos in range(len(a.ops)):
        if not backward[pos]:
            if pos in inside:
                chains[pos] = (int(segment[pos]),)
            continue
        last = -1
        for vid in a.reads(pos):
            p = producer[vid]
            if p >= 0 and p in inside and not free[p]:
                last = max(last, int(segment[p]))
        if last >= 0:
            chains[pos] = (last,)
    two = build(TwoLevelDecider(decider, chains))
    if set(two.saved) != set(plan.saved):   # (never expected: the same verdicts decide)
        return None
    one_peak, two_peak = estimated_peak(a, plan), estimated_peak(a, two)
    if two_peak > PEAK_GAIN * one_peak:
        return None
    return Levels(two, len(cuts) + 1, one_peak, two_peak, two.num_clones - plan.num_clones)
