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
cuts up to j plus segment j's weight. For 2 to `MAX_SEGMENTS` segments of about equal weight
(each cut moved, within half a segment, to where the fewest bytes cross), the `CANDIDATES`
counts with the smallest largest working set, and at most `GAIN` of the one-level one (the
weight of everything), are planned; the one whose function has the lowest peak estimate
(`estimate_memory`'s xla model, the plan built on a copy of the function) is kept, if that
peak is at most `PEAK_GAIN` of the one-level plan's. Between equal estimates, the one that
recomputes fewer ops: on the conv net at budget 0, 3 and 2 segments are estimated alike, and
XLA allocates 2,661,788 B for the first's split, 2,399,644 B for the second's. The segments
follow program order, except that what is computed from arguments alone (a weight's
broadcast, which JAX often emits long before the layer that reads it) joins the segment of
its first reader.
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
CANDIDATES = 2  # the segment counts with the smallest static working sets, tried by estimate
GAIN = 0.75     # two levels only where the working set falls to at most 3/4 ...
PEAK_GAIN = 0.85  # ... and the estimated peak of the function by 15%
HINT_BYTES = 1 << 20  # (`two_levels_hint`: below a MiB held, no remark)


class TwoLevelDecider:
    """A decider (see `plan.PolicyDecider`) that saves what `base` saves and recomputes the
    rest in the context of the reader's segment: per position, `chains` is (segment,) for a
    forward op inside a segment and for a backward op that reads from one, else (). Values
    computed from constants alone (a broadcast of 0.5) are made again in each reader's
    context (`free_in_reader`) rather than once for the whole backward: shared, one would
    live from the first segment's recomputation to the last one's."""
    free_in_reader = True

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
        # (for the backend in use; in program order: the twin has no barriers yet, and the
        # ones rp.jit places, tied to the cotangent on CPU, keep XLA to that order)
        return estimate_function(twin, model="xla", in_program_order=True)
    finally:
        twin.erase()


def _weights(a, plan):
    """Per recomputed op, in the order the segments follow: its position, its weight and the
    crossing bytes of a cut right before it (see the module docstring). The order is program
    order, except that an op reading only arguments (a weight's broadcast, which JAX often
    emits long before the layer that reads it) comes right before its first recomputed
    reader: it belongs to that reader's segment, not to the one where it was written."""
    recomputed = {c.op for c in plan.clones() if not a.free[c.op]}
    if len(recomputed) < 2:
        return None
    producer, free = a.producer, a.free
    from_arguments: set = set()
    for pos in sorted(recomputed):      # computed from arguments (and constants) alone
        if all(producer[v] < 0 or free[producer[v]] or producer[v] in from_arguments
               for v in a.reads(pos)):
            from_arguments.add(pos)
    key = {}
    for pos in sorted(recomputed, reverse=True):   # (readers first)
        readers = [key[u] for u in a.forward_consumers(pos) if u in key]
        key[pos] = min(readers) - 1e-3 if pos in from_arguments and readers else pos
    recomputed = sorted(recomputed, key=key.__getitem__)
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


def _candidate_cuts(weight, crossing) -> list:
    """(working set, cut indices) for each segment count from 2 to MAX_SEGMENTS, smallest
    working set first (see the module docstring)."""
    n = len(weight)
    prefix = np.concatenate(([0], np.cumsum(weight)))
    total = int(prefix[-1])
    if total == 0:
        return []
    found = {}
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
        found.setdefault(tuple(cuts), worst)
    return sorted(((w, list(c)) for c, w in found.items()), key=lambda t: t[0])


def _cuts(a, decider, plan):
    """(the recomputed positions, the `CANDIDATES` cuts whose static working set is at most
    `GAIN` of the one-level one's, as (working set, cut indices), smallest first, the
    one-level one: the bytes the backward reads of what it recomputes), or None where there
    is nothing to cut: a decider with checkpoint scopes of its own, a function with GSPMD
    shard_map bodies (their per-device values are not tried here), fewer than two recomputed
    ops."""
    if any(decider.chains) or any(a.manual):
        return None
    found = _weights(a, plan)
    if found is None:
        return None
    recomputed, weight, crossing = found
    total = int(weight.sum())
    return recomputed, [(w, c) for w, c in _candidate_cuts(weight, crossing)[:CANDIDATES]
                        if w <= GAIN * total], total


def two_levels(a, decider, plan, build) -> Levels | None:
    """The two-level plan of `plan` (made by `decider`), or None where no candidate lowers the
    static working set to `GAIN` of the one-level one and the peak estimate to `PEAK_GAIN`
    of the one-level plan's (`_cuts` says where none is tried). `build(decider)` plans again
    with the same options."""
    found = _cuts(a, decider, plan)
    if found is None or not found[1]:
        return None
    recomputed, candidates, _ = found
    best = None
    for _, cuts in candidates:
        two = build(TwoLevelDecider(decider, _chains(a, recomputed, cuts)))
        if set(two.saved) != set(plan.saved):   # (never expected: the same verdicts decide)
            continue
        peak = estimated_peak(a, two)
        if best is None or (peak, two.num_clones) < best[:2]:
            best = (peak, two.num_clones, two, len(cuts) + 1)
    one_peak = estimated_peak(a, plan)
    if best is None or best[0] > PEAK_GAIN * one_peak:
        return None
    two_peak, _, two, segments = best
    return Levels(two, segments, one_peak, two_peak, two.num_clones - plan.num_clones)


class Hint(NamedTuple):
    """What two levels would do to a one-level plan, by static working sets alone."""
    one_level: int       # bytes of recomputed forward the backward holds at once
    segments: int
    two_levels: int      # the most the segments' backward would hold at a time


def two_levels_hint(a, decider, plan) -> Hint | None:
    """For a remark on `plan`, one level of a fixed policy (levels=auto keeps one level, as
    jax.checkpoint): where it saves nothing but arguments (under `nothing_saveable`), the
    backward's first op needs the whole forward, recomputed at once and held, as much as the
    program without remat holds. Where that is at least `HINT_BYTES` and segments would hold
    at most `GAIN` of it at a time, the static working sets of one level and of the best
    cut (`_cuts`); else None. No plan is built and nothing estimated here: a fixed policy's
    pass stays as cheap as its plan (levels=2 plans the segments and reports their peak)."""
    if any(a.producer[v] >= 0 for v in plan.saved):
        return None
    found = _cuts(a, decider, plan)
    if found is None or not found[1] or found[2] < HINT_BYTES:
        return None
    held, cuts = found[1][0]
    return Hint(found[2], len(cuts) + 1, held)


def _chains(a, recomputed: list, cuts: list) -> list:
    """The made-up scope chains of `TwoLevelDecider` for segments cut at `cuts` (indices
    into `recomputed`)."""
    segment = {}     # recomputed position -> its segment
    bounds = [0] + list(cuts) + [len(recomputed)]
    for j in range(len(bounds) - 1):
        for pos in recomputed[bounds[j]:bounds[j + 1]]:
            segment[pos] = j
    chains: list = [()] * len(a.ops)
    producer, backward = a.producer, a.backward
    for pos in range(len(a.ops)):
        if not backward[pos]:
            if pos in segment:
                chains[pos] = (segment[pos],)
            continue
        last = max((segment.get(producer[vid], -1) for vid in a.reads(pos)), default=-1)
        if last >= 0:
            chains[pos] = (last,)
    return chains
