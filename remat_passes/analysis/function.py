"""The analysis of a joint function: computed once, read by every pass.

`FunctionAnalysis` reads a `func.func` whose body is one block of StableHLO
into compact Python structures, once, and answers every dataflow question the
passes ask (most lazily, on first use):

* program order (`ops`, `position`); every value gets an integer id (*vid*):
  the arguments first, then each op's results in program order (`vid`,
  `value`, `producer`); the values each op reads, operands and values its
  nested regions capture (`reads(pos)`), and who reads each value
  (`users(vid)`), as flat integer arrays;
* the cotangent arguments and the backward set (`backward`; the rule is
  stated in `contract`), and how it was found (`how`);
* forward consumers of each op, the first backward user of each value;
* checkpoint-scope chains (`scope_chains(scope_re)`), side effects, values computed
  from constants alone (`free`);
* scan loop pairs (`scan_pairs`, `forward_loop`, `stacked_value`);
* after remat-partial-eval: the residuals the backward reads (`residuals`) and
  the recompute groups with their incoming backward value
  (`recompute_groups`).

Passes get it from the pipeline's `PassState.analysis(func_op)` (MLIR's
AnalysisManager model): the runner drops every analysis after a pass that does
not declare it preserves them; a pass that only inserts a few ops keeps it
valid by reporting them (`note_inserted`).
"""
from __future__ import annotations

import bisect
import functools
import re
from array import array

from remat_passes.analysis import scan_pairs
from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import RematError, ir, op_id
from remat_passes.sharding import gspmd

# views of an argument the backward makes again for nothing (see `FunctionAnalysis.free`)
_ARGUMENT_VIEWS = ("stablehlo.slice", "stablehlo.reshape")


def _csr(rows):
    """Rows of ints as (starts, flat): row i is flat[starts[i]:starts[i + 1]]."""
    starts, flat = array("q", [0]), array("q")
    for row in rows:
        flat.extend(row)
        starts.append(len(flat))
    return starts, flat


def _csr_from_pairs(nrows: int, pairs) -> tuple:
    """(row, item) pairs, generated twice (count, then fill), as CSR rows in pair order."""
    counts = array("q", bytes(8 * (nrows + 1)))
    for row, _ in pairs():
        counts[row + 1] += 1
    for i in range(nrows):
        counts[i + 1] += counts[i]
    fill = array("q", counts)
    flat = array("q", bytes(8 * counts[nrows]))
    for row, item in pairs():
        flat[fill[row]] = item
        fill[row] += 1
    return counts, flat


class OpIndex:
    """op_id -> position, as two sorted integer arrays (16 bytes an op; a dict of Python
    ints takes about 100): a binary search in C per lookup."""

    def __init__(self, ids):
        order = sorted(range(len(ids)), key=ids.__getitem__)
        self._ids = array("q", (ids[i] for i in order))
        self._pos = array("q", order)

    def get(self, oid, default=None):
        i = bisect.bisect_left(self._ids, oid)
        if i < len(self._ids) and self._ids[i] == oid:
            return self._pos[i]
        return default

    def __getitem__(self, oid):
        pos = self.get(oid)
        if pos is None:
            raise KeyError(oid)
        return pos

    def __contains__(self, oid) -> bool:
        return self.get(oid) is not None

    def by_position(self) -> array:
        """The ids in position order."""
        out = array("q", bytes(8 * len(self._ids)))
        for oid, pos in zip(self._ids, self._pos):
            out[pos] = oid
        return out


class FunctionAnalysis:
    def __init__(self, func_op, cotangent_indices=None):
        ops = [o.operation for o in graph.body_block(func_op).operations]
        self._setup(func_op, ops[:-1], ops[-1], [op_id(op) for op in ops[:-1]],
                    [len(op.results) for op in ops[:-1]], cotangent_indices)

    @classmethod
    def from_parts(cls, func_op, ops: list, terminator, ids, counts, reads,
                   backward: bytearray | None = None,
                   cotangent_indices=None) -> FunctionAnalysis:
        """The analysis of `func_op` from what an edit knows it made (materialize, split),
        without reading the IR again: the top-level ops in program order, the terminator,
        the ops' ids and result counts, the CSR rows of the values each reads (`_reads`,
        in this function's vids) and the backward flags (None: found by the rule, as for
        a fresh analysis). The cotangents are found as a fresh analysis finds them
        (`cotangent_indices`, else the marks). Everything else is derived lazily."""
        self = cls.__new__(cls)
        self._setup(func_op, ops, terminator, ids, counts, cotangent_indices)
        self.__dict__["_reads"] = reads
        if backward is not None:
            self.__dict__["backward"] = backward
        return self

    def _setup(self, func_op, ops, terminator, ids, counts, cotangent_indices) -> None:
        """Program order and value ids from the ops, their ids and result counts."""
        self.func_op = func_op
        self.name = graph.func_name(func_op)
        self.block = graph.body_block(func_op)
        self.terminator = terminator
        self.ops = ops
        self.nargs = len(self.block.arguments)
        self.position = OpIndex(list(ids) + [op_id(terminator)])   # the return: len(ops)
        base = array("q", bytes(8 * (len(ops) + 1)))
        count = self.nargs
        for i, k in enumerate(counts):
            base[i] = count
            count += k
        base[len(ops)] = count
        self.result_base = base          # vid of the first result of the op at each position
        self.nvalues = count
        self._inserted_backward: dict[int, bool] = {}
        self._inserted_key: dict[int, float] = {}
        self._chains: dict = {}
        self._loops: dict = {}
        self._set_cotangents(cotangent_indices)

    # ------------------------------------------------------------- values --
    @property
    def args(self) -> list:
        return list(self.block.arguments)

    def vid(self, v) -> int:
        """The id of a value of the function body (an argument or a top-level result)."""
        if isinstance(v, ir.BlockArgument):
            return v.arg_number
        return self.result_base[self.position[op_id(v.owner)]] + v.result_number

    def value(self, vid: int):
        """The ir.Value of an id."""
        if vid < self.nargs:
            return self.block.arguments[vid]
        pos = self.producer[vid]
        return self.ops[pos].results[vid - self.result_base[pos]]

    @functools.cached_property
    def producer(self) -> array:
        """vid -> position of the op that defines it (-1 for arguments)."""
        out = array("q", [-1]) * self.nvalues
        base = self.result_base
        for pos in range(len(self.ops)):
            for vid in range(base[pos], base[pos + 1]):
                out[vid] = pos
        return out

    def results(self, pos) -> range:
        """The vids of the op's results."""
        return range(self.result_base[pos], self.result_base[pos + 1])

    @functools.cached_property
    def _reads(self):
        # One sweep in program order: every value an op reads is an argument or a result of
        # an earlier op (SSA in one block), so a Value -> vid map filled as we go resolves
        # them all (it lives only while the rows are built).
        vid_of = {v: i for i, v in enumerate(self.block.arguments)}

        def rows():
            vid = self.nargs
            for op in self.ops:
                values = op.operands if len(op.regions) == 0 else graph.read_values(op)
                yield dict.fromkeys(vid_of[v] if v in vid_of else self.vid(v) for v in values)
                for r in op.results:
                    vid_of[r] = vid
                    vid += 1
        return _csr(rows())

    def reads(self, pos):
        """The vids the op reads (operands, then values its regions capture), deduplicated."""
        starts, flat = self._reads
        return flat[starts[pos]:starts[pos + 1]]

    @functools.cached_property
    def _returned(self) -> list[int]:
        return list(dict.fromkeys(self.vid(v) for v in self.terminator.operands))

    @functools.cached_property
    def _users(self):
        """vid -> positions of the top-level ops that read it (the return: len(ops))."""
        starts, flat = self._reads
        end = len(self.ops)

        def pairs():
            for pos in range(end):
                for k in range(starts[pos], starts[pos + 1]):
                    yield flat[k], pos
            for vid in self._returned:
                yield vid, end
        return _csr_from_pairs(self.nvalues, pairs)

    def users(self, vid):
        starts, flat = self._users
        return flat[starts[vid]:starts[vid + 1]]

    @functools.cached_property
    def side_effect(self) -> bytearray:
        """Per op: must it never be duplicated? A collective of a GSPMD shard_map (its
        body inlined: between `@SPMDFullToShardShape` and `@SPMDShardToFullShape` custom
        calls) may be: every device runs the manual region in lockstep, as in
        `sdy.manual_computation`."""
        out = bytearray(graph.is_side_effecting(op) for op in self.ops)
        collectives = [pos for pos, op in enumerate(self.ops)
                       if out[pos] and op.name in graph.COLLECTIVE_OPS]
        if collectives:
            manual = self.manual
            starts, flat = self._reads
            for pos in collectives:
                if any(manual[flat[k]] for k in range(starts[pos], starts[pos + 1])):
                    out[pos] = 0
        return out

    @functools.cached_property
    def manual(self) -> bytearray:
        """Per value: is it inside a GSPMD manual region (see `gspmd`)?"""
        return gspmd.manual_values(self)

    # ----------------------------------------------------------- backward --
    def _set_cotangents(self, indices) -> None:
        if indices is None:
            indices = contract.cotangent_args(self.func_op)
            self.how = "remat.cotangent arguments"
        else:
            self.how = "cotangent indices option"
        for i in indices:
            if not 0 <= i < self.nargs:
                raise RematError(f"error: cotangent argument index {i} is out of range "
                                 f"(@{self.name} has {self.nargs} arguments)",
                                 self.func_op.location)
        self.cotangent_indices = list(indices)
        self.cotangent_vids = frozenset(indices)
        if not indices:
            self.how = "JAX name stacks (transpose frames)"

    @property
    def cotangents(self) -> set:
        return {self.block.arguments[i] for i in self.cotangent_indices}

    @functools.cached_property
    def name_stacks(self) -> list[str]:
        """Per op: its JAX name stack (`graph.name_stack`), read once for every question."""
        return [graph.name_stack(op) for op in self.ops]

    @functools.cached_property
    def _transposed(self) -> bytearray:
        """Per op: does its JAX name stack have a `transpose(` frame?"""
        return bytearray("transpose(" in stack for stack in self.name_stacks)

    @functools.cached_property
    def _outside(self) -> bytearray:
        """Per op: is it outside every differentiated function (no `jvp(` nor `transpose(`
        frame in its JAX name stack), reading the arguments, the results of such ops and
        constants only, an argument or such a result among them? (Work on constants alone
        stays what it is, free; ops with regions and side effects stay where they are.)
        Where no name stack says `jvp(` (a module written by hand), none is: the stacks do
        not tell differentiated work there."""
        n = len(self.ops)
        outside = bytearray(n)
        stacks = self.name_stacks
        if not any("jvp(" in stack for stack in stacks):
            return outside
        kind = bytearray(self.nvalues)         # 2: an argument or outside; 1: constants only
        kind[:self.nargs] = b"\x02" * self.nargs
        starts, flat = self._reads
        base = self.result_base
        side_effect = self.side_effect
        for pos, op in enumerate(self.ops):
            reads = [kind[flat[k]] for k in range(starts[pos], starts[pos + 1])]
            if 0 in reads or side_effect[pos] or len(op.regions):
                continue
            if 2 not in reads:                 # (a constant, or work on constants alone)
                kind[base[pos]:base[pos + 1]] = b"\x01" * (base[pos + 1] - base[pos])
                continue
            if "jvp(" in stacks[pos] or "transpose(" in stacks[pos]:
                continue
            outside[pos] = 1
            kind[base[pos]:base[pos + 1]] = b"\x02" * (base[pos + 1] - base[pos])
        return outside

    @functools.cached_property
    def backward(self) -> bytearray:
        """Per op: is it backward? (the rule is stated in `contract`)."""
        transposed = self._transposed
        by_name = not self.cotangent_vids
        if by_name and not any(transposed):
            calls = sum(1 for op in graph.nested_ops(self.block) if op.name == "func.call")
            hint = (f" @{self.name} calls {calls} function(s) (jax.export wraps the program "
                    "in a call when it has symbolic dimensions): run the inline pass first "
                    "(--inline, or the remat pipeline, which does), then look again; or "
                    if calls else " ")
            if any("transpose(" in graph.name_stack(op)
                   for op in graph.nested_ops(self.block)):
                hint = (" Its backward runs inside a loop body (gradient accumulation: "
                        "jax.grad inside lax.scan or fori_loop), a cond branch or a shard_map "
                        "body: run outline-loop-backwards "
                        "first (the remat pipeline does, after inline), then the passes apply "
                        "to each iteration; or ")
            raise RematError(
                f"error: cannot tell forward from backward in @{self.name}: no argument "
                f"carries the '{contract.COTANGENT}' attribute and no op location has a JAX "
                f"'transpose(' name-stack frame.{hint}"
                f"{'M' if hint == ' ' else 'm'}ark the cotangent arguments with "
                f"{{{contract.COTANGENT}}} (remat_passes.export_vjp does this), or pass "
                "cotangent-args=<i,j,...> to remat-partial-eval.", self.func_op.location)
        n = len(self.ops)
        backward = bytearray(n)
        bvalues = bytearray(self.nvalues)
        for vid in self.cotangent_vids:
            bvalues[vid] = 1
        starts, flat = self._reads
        base = self.result_base
        for pos, op in enumerate(self.ops):
            if (by_name and transposed[pos]) or contract.is_recompute_clone(op) \
                    or any(bvalues[flat[k]] for k in range(starts[pos], starts[pos + 1])):
                backward[pos] = 1
                for vid in range(base[pos], base[pos + 1]):
                    bvalues[vid] = 1
        # JAX also puts work that needs no cotangent under transpose frames (the
        # reversed kernel of a conv transpose, the 1/N of a mean's gradient, zero
        # gradients). It is backward too when every user is backward: then it
        # reads residuals instead of becoming one. The return counts as a backward
        # user only for a gradient result: a primal output computed under transpose
        # frames (the output of a second-order module, jax.grad inside) is forward.
        # When the name stacks tell, so is work outside any differentiated function (no
        # `jvp(` frame either) that reads only the arguments, constants and work like it
        # (`_outside`), when every user is backward: a step's optimizer terms of its own
        # state (AdamW's b1 * mu, its weight decay's wd * params) are computed where the
        # update needs them, as under jax.jit, not saved (in split form, handed across) as
        # residuals.
        outside = self._outside if by_name else bytearray(n)
        gradient_vids = None
        for pos in range(n - 1, -1, -1):   # (users are built only if such an op exists)
            if backward[pos] or not (transposed[pos] or outside[pos]):
                continue
            if gradient_vids is None:
                operands = list(self.terminator.operands)
                gradient_vids = {self.vid(operands[i])
                                 for i in contract.gradient_results(self.func_op)
                                 if i < len(operands)}
            if all((vid in gradient_vids) if u == n else backward[u]
                   for vid in self.results(pos) for u in self.users(vid)):
                backward[pos] = 1
        return backward

    def is_backward(self, op) -> bool:
        """For a top-level op of the function (one the analysis saw, or one a pass reported)."""
        oid = op_id(op)
        pos = self.position.get(oid)
        if pos is not None:
            return pos < len(self.ops) and bool(self.backward[pos])
        return self._inserted_backward.get(oid, False)

    def backward_survives(self, erased) -> bool:
        """Does the backward set stay as it is when the ops at positions `erased` (dead
        forward ops) are removed and clones are added? Not when it comes from name
        stacks, nor when an erased op was a forward user of a forward op under transpose
        frames: that op may now have backward users only, which makes it backward."""
        if not self.cotangent_vids:
            return False
        transposed, backward, producer = self._transposed, self.backward, self.producer
        return not any(p >= 0 and transposed[p] and not backward[p]
                       for pos in erased for p in (producer[vid] for vid in self.reads(pos)))

    def is_backward_vid(self, vid: int) -> bool:
        if vid < self.nargs:
            return vid in self.cotangent_vids
        return bool(self.backward[self.producer[vid]])

    @functools.cached_property
    def _forward_consumers(self):
        starts, flat = self._reads
        producer, backward = self.producer, self.backward

        def pairs():
            for pos in range(len(self.ops)):
                if backward[pos]:
                    continue
                for k in range(starts[pos], starts[pos + 1]):
                    p = producer[flat[k]]
                    if p >= 0:
                        yield p, pos
        return _csr_from_pairs(len(self.ops), pairs)

    def forward_consumers(self, pos):
        """The forward ops that read one of the op's results."""
        starts, flat = self._forward_consumers
        return flat[starts[pos]:starts[pos + 1]]

    def backward_only(self, pos) -> bool:
        """Whether only backward ops read the results of forward op `pos` (no forward op,
        not the return): the forward computes it only for the backward to keep, as a
        cosine for a sine's derivative. Recomputed, it moves into the backward: its
        forward copy is left unread and erased, so it costs no more than without remat
        (the planner's cost and `recomputation_seconds` count it free)."""
        n = len(self.ops)
        users = [u for vid in self.results(pos) for u in self.users(vid)]
        return bool(users) and all(u < n and self.backward[u] for u in users)

    # ---------------------------------------------------- ordering, edits --
    def position_key(self, op) -> float:
        """A sort key in program order, also for ops a pass reported with `note_inserted`."""
        oid = op_id(op)
        pos = self.position.get(oid)
        return float(pos) if pos is not None else self._inserted_key[oid]

    def top_level(self, op):
        """The top-level op of the function body that contains `op` (itself if top-level)."""
        op = op.operation
        while op_id(op) not in self.position and op_id(op) not in self._inserted_key:
            parent = op.parent
            if parent is None:
                break
            op = parent.operation
        return op

    def note_inserted(self, op, *, backward: bool, before=None, after=None) -> None:
        """Keep the analysis valid after a pass inserted `op` right before/after a known op."""
        anchor = before if before is not None else after
        key = self.position_key(anchor) + (-0.5 if before is not None else 0.5)
        oid = op_id(op)
        self._inserted_backward[oid] = backward
        self._inserted_key[oid] = key

    # ----------------------------------------------------- checkpoint scopes --
    def scope_chains(self, scope_re: re.Pattern | None = None) -> list[tuple]:
        """Per op, the checkpoint scopes it sits in, outermost first (see graph.scope_chain)."""
        key = None if scope_re is None else scope_re.pattern
        if key not in self._chains:
            interned: dict = {}
            self._chains[key] = [
                interned.setdefault(c, c)
                for c in (graph.scope_chain_of_stack(stack, scope_re)
                          for stack in self.name_stacks)]
        return self._chains[key]

    # --------------------------------------------------------- free values --
    @functools.cached_property
    def free(self) -> bytearray:
        """Forward ops recomputed for nothing: pure ops computed from constants alone, and
        slices and reshapes of a primal argument, views of it (an unrolled scan's blocks of
        a scanned-over argument that the loops read, a step's slice of it: the backward
        makes them again, as JAX's scan forwards `xs`, rather than keeping a copy from the
        forward); what is computed from a view is not free."""
        free = bytearray(len(self.ops))
        view = bytearray(len(self.ops))       # a view of a primal argument
        producer, starts, flat = self.producer, *self._reads
        for pos, op in enumerate(self.ops):
            if self.backward[pos]:
                continue
            lo, hi = starts[pos], starts[pos + 1]
            if op.name in _ARGUMENT_VIEWS and hi - lo == 1 and (
                    (flat[lo] < self.nargs and flat[lo] not in self.cotangent_vids)
                    or (producer[flat[lo]] >= 0 and view[producer[flat[lo]]])):
                free[pos] = view[pos] = 1      # (what is computed from it is not free)
                continue
            if not self.side_effect[pos] and all(
                    producer[flat[k]] >= 0 and free[producer[flat[k]]]
                    and not view[producer[flat[k]]] for k in range(lo, hi)):
                free[pos] = 1
        return free

    @functools.cached_property
    def shape_only(self) -> bytearray:
        """Per op: are its results computed from constants, iotas and dimension sizes
        alone (`graph.shape_rule`)? A shape computation of a symbolic-shape module, or a
        constant."""
        out = bytearray(len(self.ops))
        producer, (starts, flat) = self.producer, self._reads
        for pos, op in enumerate(self.ops):
            lo, hi = starts[pos], starts[pos + 1]
            if op.name in graph.SHAPE_SOURCES or (lo < hi and all(
                    producer[flat[k]] >= 0 and out[producer[flat[k]]] for k in range(lo, hi))):
                out[pos] = graph.shape_rule(op) is not False
        return out

    # ---------------------------------------------------------- scan pairs --
    @functools.cached_property
    def scan_pairs(self) -> list:
        """The forward/backward `stablehlo.while` pairs of scans (`scan_pairs.Pair`)."""
        return scan_pairs.find_pairs([op for op in self.ops if op.name == scan_pairs.WHILE])

    @functools.cached_property
    def scan_loop_positions(self) -> set[int]:
        """Positions of forward loops of scan pairs."""
        return {self.position[op_id(p.fwd.op)] for p in self.scan_pairs}

    def forward_loop(self, op):
        """`scan_pairs.analyse_forward` of a top-level while, computed once per op."""
        key = op_id(op)
        if key not in self._loops:
            self._loops[key] = scan_pairs.analyse_forward(op)
        return self._loops[key]

    def stacked_value(self, v):
        """For a result of a top-level forward scan loop: the per-iteration value it stacks."""
        loop = self.forward_loop(v.owner)
        if loop is None or v.result_number not in loop.stacked:
            return None
        return loop.stacked[v.result_number].value

    def loops_changed(self) -> None:
        """A pass edited loop bodies: forget the scan-pair facts (they are found again)."""
        self.__dict__.pop("scan_pairs", None)
        self.__dict__.pop("scan_loop_positions", None)
        self._loops.clear()

    # ---------------------------------------- facts of a rewritten function --
    @functools.cached_property
    def residuals(self) -> list:
        """Forward values read by backward ops: arguments first, then in program order."""
        read = bytearray(self.nvalues)
        starts, flat = self._reads
        for pos in range(len(self.ops)):
            if self.backward[pos]:
                for k in range(starts[pos], starts[pos + 1]):
                    read[flat[k]] = 1
        return [self.value(vid) for vid in range(self.nvalues)
                if read[vid] and not self.is_backward_vid(vid)]

    @functools.cached_property
    def recompute_groups(self) -> list[RecomputeGroup]:
        """The clones remat-partial-eval placed before each backward consumer, in program
        order, with the backward value available right before them (the incoming
        cotangent; see place-optimization-barriers)."""
        backward = self.backward
        return recompute_groups(self.ops + [self.terminator],
                                lambda i, op: i < len(backward) and backward[i])


def recompute_groups(ops, is_backward) -> list[RecomputeGroup]:
    """Runs of consecutive clones with one recompute group among `ops` (a block's ops, its
    terminator last), each with the op after it (its consumer) and the result of the latest
    backward op before it that is neither a clone nor an accumulation (`is_backward(index,
    op)`; see `graph.accumulates`)."""
    groups = []
    current, current_id = [], None
    latest = latest_at_start = None
    for i, op in enumerate(ops):
        gid = contract.recompute_group(op)
        if gid is not None and gid == current_id:
            current.append(op)
            continue
        if current:
            groups.append(RecomputeGroup(current, op, latest_at_start))
        if gid is not None:
            current, current_id, latest_at_start = [op], gid, latest
        else:
            current, current_id = [], None
            if is_backward(i, op) and len(op.results) and not graph.accumulates(op):
                latest = op.results[0]
    return groups


class RecomputeGroup:
    """The clones of one backward consumer, and what a barrier can tie them to."""

    def __init__(self, ops, consumer, latest_backward):
        self.ops = ops
        self.consumer = consumer
        self.latest_backward = latest_backward   # a backward value defined before the group

    def inputs(self) -> list:
        """Values the group reads from outside itself, in first-read order."""
        inside = {r for op in self.ops for r in op.results}
        out = []
        for op in self.ops:
            out.extend(v for v in graph.read_values(op) if v not in inside)
        return list(dict.fromkeys(out))
