"""The planning problem of `auto`: ops that may be recomputed, values that may be kept.

See the package docstring for the model. `build_problem` makes a `Problem` from a
function's analysis (scan loop pairs modelled per iteration, times the trip count; a
scan loop in a scan body too, op by op, rerun or kept whole: `_add_inner_loop`);
`evaluate` gives what a choice of recomputed ops keeps and costs.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from remat_passes.analysis import scan_pairs
from remat_passes.cost import flops
from remat_passes.cost.devices import ROUNDING, DeviceProfile
from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import ir, op_id
from remat_passes.ir.verdicts import Recompute, Saveable
from remat_passes.planner.case_model import add_body_case, add_case
from remat_passes.planner.scope_model import ScopeModel
from remat_passes.regions import case_rewrite, shard_map_rewrite
from remat_passes.regions.scan_rewrite import ScanPairPlanner
from remat_passes.sharding import gspmd
from remat_passes.sharding.sdy import manual_axes, mesh_of, residual_factor, varying_axes


@dataclasses.dataclass
class Problem:
    """The planning problem over integer node ids.

    Op nodes (recompute variables) and value nodes (availability variables) share one
    id space: ops first. `edges`: implication (x, y): x selected => y selected."""
    op_cost: np.ndarray           # seconds per op node (times trip count in loop bodies)
    value_bytes: np.ndarray       # bytes per value node (times trip count in loop bodies)
    value_producer: np.ndarray    # op node of the value, or -1 (an argument: never recomputed)
    recomputable: np.ndarray      # bool per op node
    needed: np.ndarray            # bool per value node: a backward op reads it
    reads: list                   # per op node, the value nodes it reads
    offload_cost: np.ndarray | None   # seconds per value node (inf: cannot move), or None
                                      # (no offload)
    ops: list                     # per op node, the ir.Operation
    values: list                  # per value node, the ir.Value (None: a token,
                                  # `ProblemBuilder.token`, or a slot, `.slot`)
    labels: list                  # per op node: "top", the scan loop it is in, or what
                                  # it stands for (`stands_for`)
    keep_cost: np.ndarray | None = None   # seconds per value node when it is kept (saved or
                                          # offloaded) and a recomputation reads it: the
                                          # reduce_precision insert-reduce-precision puts
                                          # on such a floating-point value the forward
                                          # reads too
    markers: np.ndarray | None = None     # bool per op node: a checkpoint-name marker
    through: np.ndarray | None = None     # bool per op node: a recomputed copy computes
                                          # nothing (a marker, data movement), so
                                          # insert-reduce-precision looks through it
    argument_bytes: np.ndarray | None = None  # bytes per value node of the function's own
                                              # arguments (their value_bytes are 0: a
                                              # budget counts activations, what the
                                              # backward keeps beyond the arguments)
    stands_for: dict = dataclasses.field(default_factory=dict)   # op node -> the ops its
                                          # verdict goes to, where not its own op alone
                                          # (a cond's branches, recomputed together)
    held: dict = dataclasses.field(default_factory=dict)   # op node -> those of the ops it
                                          # stands for that are saved, not left to the op
                                          # they are nested in, where it is not recomputed
                                          # (the body ops of a scan loop in a branch)
    moved_cost: np.ndarray | None = None  # seconds per op node: what an op that moves
                                          # into the backward when recomputed (priced 0:
                                          # `FunctionAnalysis.backward_only`) would cost
                                          # else; 0 for the others. Only the integer
                                          # program reads it, to break ties (solvers)

    @property
    def n_ops(self) -> int:
        return len(self.op_cost)

    def no_remat_bytes(self) -> int:
        """The activations a plan that recomputes nothing keeps."""
        return int(self.value_bytes[self.needed].sum())

    def kept_argument_bytes(self, available: np.ndarray) -> int:
        """The bytes of the function's arguments among the `available` values (kept by the
        caller anyway; not counted against a budget)."""
        if self.argument_bytes is None:
            return 0
        return int(self.argument_bytes[available].sum())

    @property
    def n_values(self) -> int:
        return len(self.value_bytes)

    def __post_init__(self):
        if self.keep_cost is None:
            self.keep_cost = np.zeros(self.n_values)
        if self.markers is None:
            self.markers = np.zeros(self.n_ops, bool)
        if self.through is None:
            self.through = self.markers.copy()
        if self.moved_cost is None:
            self.moved_cost = np.zeros(self.n_ops)
        lengths = np.array([len(r) for r in self.reads], dtype=np.int64)
        self.read_rows = np.repeat(np.arange(self.n_ops), lengths)   # op node per read
        self.read_flat = np.concatenate(self.reads) if self.reads else np.zeros(0, np.int64)
        self.has_producer = self.value_producer >= 0

    def demand(self, recompute: np.ndarray) -> np.ndarray:
        """Per value: how many reasons it has to be available (needed, recomputed readers)."""
        return self.needed.astype(np.int64) + np.bincount(
            self.read_flat[recompute[self.read_rows]], minlength=self.n_values)

    def rounded(self, recompute: np.ndarray, kept: np.ndarray) -> np.ndarray:
        """Per value: kept, and read by a recomputation (directly, or through recomputed
        ops that compute nothing): what insert-reduce-precision rounds."""
        def read_by(ops):
            return np.bincount(self.read_flat[ops[self.read_rows]],
                               minlength=self.n_values) > 0
        reached = read_by(recompute & ~self.through)
        through = recompute & self.through
        while True:
            via = np.zeros(self.n_ops, bool)
            via[self.value_producer[reached & self.has_producer]] = True
            more = reached | read_by(via & through)
            if (more == reached).all():
                return kept & reached
            reached = more

    def round_reads(self) -> tuple:
        """The reads that can make a value rounded: (op node, value node) of the reads of
        recomputable ops that compute something, and (op node, value node, result value
        node) of those of recomputable ops looked through, whose result passes it on."""
        ops, values = self.read_rows, self.read_flat
        on = self.recomputable[ops]
        direct = on & ~self.through[ops]
        via = on & self.through[ops]
        results = [[] for _ in range(self.n_ops)]
        for v in np.nonzero(self.has_producer)[0]:
            results[self.value_producer[v]].append(int(v))
        passed = [(int(o), int(v), w) for o, v in zip(ops[via], values[via])
                  for w in results[o]]
        return (ops[direct], values[direct]), passed

    def recomputed_values(self, recompute: np.ndarray) -> np.ndarray:
        out = np.zeros(self.n_values, bool)
        out[self.has_producer] = recompute[self.value_producer[self.has_producer]]
        return out


@dataclasses.dataclass
class Solution:
    recompute: np.ndarray         # bool per op node
    available: np.ndarray         # bool per value node
    offloaded: np.ndarray         # bool per value node
    device_bytes: int
    cost: float
    method: str
    seconds: float
    budget: int
    lower_bound: float | None = None

    def saved(self, p: Problem) -> np.ndarray:
        prod = p.value_producer
        rec = np.zeros(p.n_values, bool)
        has = prod >= 0
        rec[has] = self.recompute[prod[has]]
        return self.available & ~rec & ~self.offloaded


def evaluate(p: Problem, recompute: np.ndarray, offload_ok=None) -> tuple:
    """(available, offloaded, device bytes, cost) of recomputing exactly `recompute`: what
    must be available follows from it; values available but not recomputed are saved, or
    offloaded where `offload_ok` says moving them is cheaper."""
    available = p.demand(recompute) > 0
    rec_v = p.recomputed_values(recompute)
    kept = available & ~rec_v
    offloaded = kept & offload_ok & np.isfinite(p.offload_cost) if offload_ok is not None \
        else np.zeros(p.n_values, bool)
    device = int(p.value_bytes[kept & ~offloaded].sum())
    cost = float(p.op_cost[recompute].sum())
    cost += float(p.keep_cost[p.rounded(recompute, kept)].sum())
    if p.offload_cost is not None:
        cost += float(p.offload_cost[offloaded].sum())
    return available, offloaded, device, cost


def feasible(p: Problem, recompute: np.ndarray) -> bool:
    """Every read of a recomputed op is available: an argument, saved, or recomputed."""
    return bool(recompute[~p.recomputable].sum() == 0)


class ProblemBuilder:
    """Collects op and value nodes. `round_exact`: insert-reduce-precision rounds f32 and
    f64 values too (its round-exact=)."""

    def __init__(self, profile: DeviceProfile, offload: bool, round_exact: bool = True):
        self.profile = profile
        self.offload = offload
        self.round_exact = round_exact
        self.cost_model = flops.CostModel()
        self.ops, self.values, self.labels = [], [], []
        self.op_cost, self.recomputable, self.reads = [], [], []
        self.value_bytes, self.value_producer, self.needed = [], [], []
        self.keep_cost, self.markers, self.through = [], [], []
        self.argument_bytes: list = []
        self.flops: list = []
        # loop-body ops the model leaves out as free (computed from invariants and re-sliced
        # inputs alone: never stacked); the plan recomputes them, as the model assumes
        self.free_ops: list = []
        self.stands_for: dict = {}     # op node -> the ops it stands for (`group`)
        self.moved: dict = {}          # op node -> its cost, where recomputing moves it
        self.held: dict = {}           # op node -> those saved unless it is recomputed
        self.pinned: set = set()       # value nodes that cannot move to the host
        self.tokens: list = []         # value nodes no plan can keep (`token`)

    def op(self, op, recomputable: bool, scale: int, label: str) -> int:
        node = len(self.ops)
        self.ops.append(op)
        self.labels.append(label)
        f = self.cost_model.op_flops(op) if recomputable else 0.0
        self.flops.append(f * scale)
        self.op_cost.append(self.profile.op_seconds(op, self.cost_model) * scale
                            if recomputable else 0.0)
        self.recomputable.append(recomputable)
        marker = contract.checkpoint_name(op) is not None
        self.markers.append(marker)
        self.through.append(marker or scan_pairs.moves_data(op))
        self.reads.append([])
        return node

    def group(self, op, ops: list, seconds: float, flops_: float, label: str,
              held: list = ()) -> int:
        """An op node that stands for `ops` recomputed together (`op` names it in
        reports), at the cost given; `held`: those of them that are saved where it is not
        recomputed (else they take the verdict of the op they are nested in)."""
        node = self.op(op, False, 1, label)
        self.recomputable[node] = True
        self.op_cost[node], self.flops[node] = seconds, flops_
        self.stands_for[node] = list(ops)
        if held:
            self.held[node] = list(held)
        return node

    def token(self, producer: int) -> int:
        """A value node of `producer` that no plan can keep (its bytes, set by `problem`,
        are more than all the others'): an op that reads it is recomputed only together
        with `producer`."""
        node = len(self.values)
        self.values.append(None)
        self.value_bytes.append(0)
        self.argument_bytes.append(0)
        self.keep_cost.append(0.0)
        self.value_producer.append(producer)
        self.needed.append(False)
        self.tokens.append(node)
        self.pinned.add(node)
        return node

    def slot(self, t, producer: int, scale: int, copies: int = 1) -> int:
        """A value node of type `t` that no value of the module stands for (a residual
        slot a rule will add: `case_model.add_body_case`)."""
        node = len(self.values)
        self.values.append(None)
        self.value_bytes.append(graph.type_bytes(t) * scale * copies)
        self.argument_bytes.append(0)
        self.keep_cost.append(0.0)
        self.value_producer.append(producer)
        self.needed.append(False)
        return node

    def value(self, v, producer: int, scale: int, forward_use: bool = False,
              argument: bool = False, copies: int = 1) -> int:
        """A value node; `forward_use`: the forward reads it too, so that keeping it makes
        insert-reduce-precision round it when a recomputed op reads it; `argument`: one of
        the function's arguments, which a budget does not count; `copies`: its bytes count
        that many times (a GSPMD manual value, one copy per device class)."""
        node = len(self.values)
        self.values.append(v)
        nbytes = graph.type_bytes(v.type) * scale * copies
        self.value_bytes.append(0 if argument else nbytes)
        self.argument_bytes.append(nbytes if argument else 0)
        rounded = (producer >= 0 and forward_use
                   and contract.residual_rounding(v.type, self.round_exact) is not None
                   and v.owner.operation.name != ROUNDING)
        self.keep_cost.append(self.profile.rounding_seconds(
            graph.type_elements(v.type) * scale) if rounded else 0.0)
        self.value_producer.append(producer)
        self.needed.append(False)
        return node

    def _offload_cost(self, vb: np.ndarray) -> np.ndarray:
        """Moving a value to host and back; only what a recomputable op produces can move
        (an argument stays where the caller put it; an op under another policy, or one
        nothing may recompute, keeps its own verdict)."""
        prod = np.array(self.value_producer, dtype=np.int64)
        movable = prod >= 0
        movable[movable] = np.array(self.recomputable, bool)[prod[movable]]
        movable[list(self.pinned)] = False
        return np.where(movable, np.array([self.profile.offload_seconds(b) for b in vb]),
                        np.inf)

    def problem(self) -> Problem:
        vb = np.array(self.value_bytes, dtype=np.float64)
        vb[self.tokens] = vb.sum() + 1.0
        return Problem(
            op_cost=np.array(self.op_cost, dtype=np.float64), value_bytes=vb,
            value_producer=np.array(self.value_producer, dtype=np.int64),
            recomputable=np.array(self.recomputable, dtype=bool),
            needed=np.array(self.needed, dtype=bool),
            reads=[np.array(sorted(set(r)), dtype=np.int64) for r in self.reads],
            offload_cost=self._offload_cost(vb) if self.offload else None,
            ops=self.ops, values=self.values, labels=self.labels,
            keep_cost=np.array(self.keep_cost, dtype=np.float64),
            stands_for=dict(self.stands_for), held=dict(self.held),
            markers=np.array(self.markers, dtype=bool),
            through=np.array(self.through, dtype=bool),
            argument_bytes=np.array(self.argument_bytes, dtype=np.int64),
            moved_cost=np.array([self.moved.get(n, 0.0) for n in range(len(self.ops))]))


def build_problem(a, scope_re, kept_whole, profile: DeviceProfile, offload: bool,
                  governed, round_exact: bool = True) -> tuple[Problem, ProblemBuilder]:
    """The planning problem of function analysis `a` for the ops `governed(pos)` selects
    (those under the auto policy: a `resolve.Governed`); every other forward op keeps the
    verdict its own policy gives it (`ScopeModel`): modelled as saved where the backward
    needs it, except where that policy recomputes it (a checkpoint region's
    `nothing_saveable`, say): then it is no node of its own, and what reads it reads
    what its recomputation reads. `round_exact`: insert-reduce-precision rounds f32 and f64
    residuals (its round-exact=), so keeping one that a recomputation reads costs that."""
    b = ProblemBuilder(profile, offload, round_exact)
    chains = a.scope_chains(scope_re)
    through = {}     # vid of a value its region recomputes -> the nodes that recomputation reads

    def sources(vid) -> tuple:
        """The nodes a read of `vid` needs available."""
        if vid in vid_node:
            return (vid_node[vid],)
        return through.get(vid, ())
    # a value inside a GSPMD manual region counts as it leaves it as a residual: every
    # device's copy side by side (as the residual report counts it)
    tiles = gspmd.tile_counts(a)
    arg_node = {}
    for i, v in enumerate(a.args):
        if i not in a.cotangent_vids:
            arg_node[i] = b.value(v, -1, 1, argument=True)
    vid_node = dict((vid, node) for vid, node in arg_node.items())
    stacked = set()      # results of forward scan loops that stack per-iteration values:
    pairs = [q for q in a.scan_pairs if _modelled(q)]   # their bytes are the loop body's
    loops = set()
    for pair in pairs:
        loops.add(a.position[op_id(pair.fwd.op)])
        base = a.result_base[a.position[op_id(pair.fwd.op)]]
        stacked.update(base + k for k in pair.fwd.stacked)
    scopes = ScopeModel(a, chains, governed, kept_whole | loops, scope_re)
    cases = {a.position[op_id(q.fwd)]: q
             for q in case_rewrite.find_case_pairs(a.block, a.is_backward)}
    case_reads: dict = {}    # vid of a forward case's result -> its pair's position
    case_needs: list = []    # what those pairs keep, as their rule plans them (nodes, vids)
    # Shardy shard_maps whose results the backward reads: their bodies are decided per
    # op, as the shard_map rule applies a policy (`_add_manual`); a result is the body
    # value it returns (a primal output too: the rule's recompute computation makes it
    # again where a recomputed op reads it)
    manual = {a.position[op_id(q.fwd)]: q
              for q in shard_map_rewrite.find_pairs(a.block, a.is_backward)
              if governed(a.position[op_id(q.fwd)])}
    for pos, op in enumerate(a.ops):
        if a.backward[pos] or a.free[pos]:
            continue
        if pos in manual:
            yields = _add_manual(b, manual[pos], vid_node, a)
            for k, vid in enumerate(a.results(pos)):
                if yields[k] is not None:
                    vid_node[vid] = yields[k]
            continue
        if pos in scopes.recomputed:
            read = tuple(dict.fromkeys(n for vid in a.reads(pos) for n in sources(vid)))
            for vid in a.results(pos):
                through[vid] = read
            _scope_inputs_needed(b, a, pos, chains, sources)
            continue
        rec = (not a.side_effect[pos] and pos not in kept_whole and governed(pos)
               and op.name not in ("func.call", graph.MANUAL_COMPUTATION)
               and pos not in scopes.kept_for_scope)
        # (a shard_map's computation itself is not recomputed whole: its body is planned
        # op by op where the backward reads it, `_add_manual`)
        node = b.op(op, rec, 1, "top")
        if rec and a.backward_only(pos):     # (recomputed, it moves: no extra cost)
            b.moved[node] = b.op_cost[node]
            b.op_cost[node] = b.flops[node] = 0.0
        for vid in a.results(pos):
            if vid not in stacked:
                forward_use = any(u < len(a.ops) and not a.backward[u] for u in a.users(vid))
                vid_node[vid] = b.value(a.value(vid), node, 0 if pos in scopes.on_host else 1,
                                        forward_use, copies=tiles.get(vid, 1))
        for vid in a.reads(pos):
            b.reads[node].extend(sources(vid))
        _scope_inputs_needed(b, a, pos, chains, sources)
        if pos in cases:
            kept = add_case(b, a, cases[pos], vid_node, sources, governed, scope_re)
            if kept is not None:
                case_reads.update((vid, pos) for vid in kept.results)
                case_needs.append((kept.nodes, kept.outside))
    for pos in range(len(a.ops)):
        if a.backward[pos]:
            for vid in a.reads(pos):
                if vid in case_reads:
                    continue        # (what its pair's plan keeps is counted below)
                for n in (n for r in scopes.backward_reads(pos, vid) for n in sources(r)):
                    b.needed[n] = True
    for nodes, vids in case_needs:
        for n in (*nodes, *(n for vid in vids for n in sources(vid))):
            b.needed[n] = True
    for pair in pairs:
        loop = a.position[op_id(pair.fwd.op)]
        # a loop in a checkpoint scope is re-run whole by the backward (its carries come
        # from the re-run, which needs the loop's initial ones)
        initial = sources if chains[loop] else None
        _add_pair(b, pair, vid_node, a, tiles.get(a.result_base[loop], 1),
                  scopes.body_verdict, initial)
    return b.problem(), b


def _scope_inputs_needed(b, a, pos, chains, sources) -> None:
    """Checkpoint scope inputs are saved (jax.checkpoint saves its arguments)."""
    if chains[pos]:
        for vid in a.reads(pos):
            if a.producer[vid] < 0 or chains[a.producer[vid]] != chains[pos]:
                for n in sources(vid):
                    b.needed[n] = True


def _modelled(pair) -> bool:
    """Unrolled steps (blocks of sub-steps) are left to the fallback: saved as exported."""
    return not any(scan_pairs.unrolled_parts(pair.fwd.stacked[k].value) is not None
                   for k in pair.links.values())


def _add_pair(b: ProblemBuilder, pair, vid_node, a, copies: int = 1,
              own=lambda op: None, rerun=None) -> None:
    """The forward body of a scan pair, per iteration: ops and values times the trip count;
    the stacked values the backward loop reads are needed. `copies`: the loop is in a GSPMD
    manual region whose stacks leave it as that many devices' copies. `own(op)`: None where
    the plan decides a body op, else the verdict a checkpoint region's own policy gives it:
    a value it recomputes is no node (what reads it reads what its recomputation reads),
    and any other counts as saved where the backward loop reads it. `rerun`: for a loop
    the backward re-runs whole (one in a checkpoint scope), `sources(vid)` of the
    function: its carries are not stacked, and the loop's initial carries are needed."""
    fwd = pair.fwd

    def outer(u) -> list:          # the nodes of a value outside the loop
        vid = a.vid(u)
        return [vid_node[vid]] if vid in vid_node else []

    def carry_in(arg) -> int:      # a carry-in: stacked if needed
        node = b.value(arg, -1, 0 if rerun else fwd.trip_count, copies=copies)
        if rerun:
            for n in rerun(a.vid(fwd.op.operands[arg.arg_number])):
                b.needed[n] = True
        return node
    sources = _add_body(b, pair, fwd.trip_count, outer, carry_in, copies, own,
                        nested=rerun is None)
    for m, k in pair.links.items():    # the stacked values the backward loop reads
        # (one re-derived from the invariants, or recomputed by its own policy, needs what
        # that reads)
        for node in sources(fwd.stacked[k].value):
            b.needed[node] = True


def _add_body(b: ProblemBuilder, pair, n: int, outer, carry_in, copies, own, nested: bool,
              token=None):
    """The ops and values of the body of loop `pair.fwd`, `n` times each (its trip count
    times that of the loops around it). `outer(u)`: the nodes of a value outside the loop;
    `carry_in(arg)`: the value node of a carry-in. `token`: the op nodes of a nested loop
    read it, a value no plan keeps (`_add_inner_loop`). With `nested`, a scan loop in the
    body is modelled op by op too. Returns `sources(u)`: the nodes a read of body value u
    needs available."""
    fwd = pair.fwd
    facts = ScanPairPlanner(pair, lambda v: Saveable)
    label = f"scan loop at {graph.source_position(fwd.op)[0] or 'top'}"
    body_ops = [op.operation for op in fwd.body.operations][:-1]
    node_of: dict = {}
    # the loop's invariant operands, by body argument: a recomputed body op that reads one
    # (directly or through free ops) needs it available
    invariant_nodes = {fwd.body.arguments[k]: outer(fwd.op.operands[k])
                       for k in fwd.invariant}
    invariants_of: dict = {}       # free value -> the invariant nodes it is computed from

    through: dict = {}             # value its own policy recomputes -> the nodes it reads

    def sources(u) -> list:
        if u in node_of:
            return [node_of[u]]
        if u in through:
            return through[u]
        if facts.in_fwd(u) and facts.free_kind(u) is not None:
            return graph.post_order(u, invariants_of, step)
        return [] if facts.in_fwd(u) else outer(u)

    def step(u):                   # (graph.post_order: operands first, no recursion)
        if u in invariant_nodes:
            invariants_of[u] = set(invariant_nodes[u])
        elif not facts.in_fwd(u):
            invariants_of[u] = set(outer(u))
        elif not isinstance(u, ir.OpResult) or facts.free_kind(u) is None:
            invariants_of[u] = set()
        else:
            reads = graph.read_values(u.owner.operation)
            pending = [w for w in reads if w not in invariants_of]
            if pending:
                return pending
            invariants_of[u] = set().union(*(invariants_of[w] for w in reads))
        return None

    for arg in fwd.body.arguments:
        k = arg.arg_number
        if k in fwd.invariant or k == fwd.counter or facts.free_kind(arg) is not None:
            continue
        node_of[arg] = carry_in(arg)
    for op in body_ops:
        results = list(op.results)
        if results and all(facts.free_kind(r) is not None for r in results):
            b.free_ops.append(op)                   # invariant or re-sliced: never stacked
            continue
        if nested and own(op) is None and not graph.is_side_effecting(op):
            inner = _inner_loop(op, pair)
            if inner is not None:
                through.update(_add_inner_loop(b, inner, n, sources, node_of, copies, own,
                                               token))
                continue
        plain = not graph.is_side_effecting(op)
        verdict = own(op)
        if verdict is Recompute and plain and not op.regions:
            read = list(dict.fromkeys(x for u in graph.read_values(op) for x in sources(u)))
            for r in results:
                through[r] = read
            continue
        node = b.op(op, plain and verdict is None, n, label)
        if op.name == graph.CASE and plain and verdict is None and token is None:
            add_body_case(b, op, node, n, copies)
        for r in results:
            node_of[r] = b.value(r, node, n, _used_beyond_stacking(r), copies=copies)
        for u in graph.read_values(op):
            b.reads[node].extend(sources(u))
        if token is not None:
            b.reads[node].append(token)
    return sources


def _inner_loop(op, pair):
    """A scan pair's view of forward scan loop `op` in the body of `pair.fwd` (None: not
    one, or one with unrolled steps, left to the fallback): the backward of `pair` reruns
    it and its own backward loop there takes it per iteration (`scan_rewrite`)."""
    loop = scan_pairs.analyse_forward(op)
    if loop is None or not loop.stacked or any(
            scan_pairs.unrolled_parts(s.value) is not None for s in loop.stacked.values()):
        return None
    return scan_pairs.Pair(loop, pair.bwd, {}, {})


def _add_inner_loop(b: ProblemBuilder, inner, n: int, sources, node_of, copies, own,
                    token) -> dict:
    """Scan loop `inner.fwd` in a loop body that runs `n` times: one op node for the loop
    (rerun in the backward body: its FLOPs, `n` times), which makes its carry-ins and its
    final carries, and its body op by op, `n` times its trip count, each op reading a token
    of the loop node, so recomputed only with it (the backward reruns the loop or keeps
    all its stacks: `scan_rewrite`). Returns {result of the loop: the nodes of what it
    stacks} for the results that stack a body value; its other carries are value nodes
    of the loop node (`node_of`)."""
    fwd = inner.fwd
    op = fwd.op
    label = f"scan loop at {graph.source_position(op)[0] or 'top'}"
    loop = b.op(op, True, n, label)
    for u in graph.read_values(op):
        b.reads[loop].extend(sources(u))
    if token is not None:
        b.reads[loop].append(token)
    mine = b.token(loop)
    carries = {}

    def carry_in(arg) -> int:
        carries[arg] = b.value(arg, loop, n * fwd.trip_count, copies=copies)
        return carries[arg]
    inner_sources = _add_body(b, inner, n * fwd.trip_count, sources, carry_in, copies, own,
                              nested=True, token=mine)
    # a carry-in is the carry-out of the iteration before: the backward body's rerun of
    # the loop makes it, unless the op that yields it is saved (`nested_saves.presave`
    # then stacks that value), so its producer is that op
    yields = graph.terminator(fwd.body).operands
    for arg, node in carries.items():
        made = inner_sources(yields[arg.arg_number])
        if len(made) == 1 and b.value_producer[made[0]] >= 0:
            b.value_producer[node] = b.value_producer[made[0]]
    stacks = {}
    for k, r in enumerate(op.results):
        if k in fwd.stacked:
            stacks[r] = inner_sources(fwd.stacked[k].value)
        elif k in fwd.invariant:
            stacks[r] = sources(op.operands[k])
        elif k != fwd.counter:
            node_of[r] = b.value(r, loop, n, _used_beyond_stacking(r), copies=copies)
    return stacks


def _add_manual(b: ProblemBuilder, pair, vid_node, a) -> list:
    """The body of a Shardy shard_map's forward computation, op by op: a body argument is
    the computation's operand; a body value's bytes are those of the residual it would
    be, every device's copy side by side (sharded on its first dimension over the manual
    axes it varies over, or the layout of the result that returns it). Side-effecting
    body ops are kept (collectives are recomputed: every device runs them in lockstep).
    Returns, per result of the computation, the node of the value it returns (None: one
    the model does not see)."""
    fwd = pair.fwd
    body = fwd.regions[0].blocks[0]
    ret = graph.terminator(body)
    yields = list(ret.operands)
    found = mesh_of(fwd)
    varying = varying_axes(fwd, found[1]) if found is not None else {}
    every = frozenset(manual_axes(fwd))
    returned_as = {}
    for k, y in enumerate(yields):
        returned_as.setdefault(y, fwd.results[k].type)
    label = f"shard_map at {graph.source_position(fwd)[0] or 'top'}"
    node_of: dict = {}
    for arg in body.arguments:
        vid = a.vid(fwd.operands[arg.arg_number])
        if vid in vid_node:
            node_of[arg] = vid_node[vid]

    def copies(v) -> int:     # per-device copies side by side in the residual it would be
        local = graph.type_bytes(v.type)
        if v in returned_as:
            return graph.type_bytes(returned_as[v]) // local if local else 1
        return residual_factor(varying.get(v, every), found[1]) if found is not None else 1
    for op in [o.operation for o in body.operations]:
        if op == ret.operation:
            break
        plain = not shard_map_rewrite.body_side_effect(op)
        node = b.op(op, plain, 1, label)
        if op.name == graph.CASE and plain:      # (its dots a choice of their own)
            add_body_case(b, op, node, 1, residual_factor(every, found[1])
                          if found is not None else 1)
        for r in op.results:
            forward_use = any(u.owner.operation != ret.operation for u in r.uses)
            node_of[r] = b.value(r, node, 1, forward_use, copies=copies(r))
        for u in graph.read_values(op):
            if u in node_of:
                b.reads[node].append(node_of[u])
    return [node_of.get(y) for y in yields]


def _used_beyond_stacking(v) -> bool:
    """Does a loop body read `v` other than to stack it (what makes insert-reduce-precision
    round a stacked value: `round_stacked`)?"""
    for use in v.uses:
        op = use.owner.operation
        if op.name in ("stablehlo.reshape", "stablehlo.broadcast_in_dim") and all(
                u.owner.operation.name == "stablehlo.dynamic_update_slice"
                for u in op.results[0].uses):
            continue
        return True
    return False
