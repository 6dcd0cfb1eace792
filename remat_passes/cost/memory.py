"""A static memory estimate: peak live bytes of a function run in program order.

A remat policy's memory effect needs a compiler that keeps the recomputation
where it is written: XLA:CPU of jaxlib 0.10 deletes `optimization_barrier` before it
schedules and then CSEs the recomputation back into the forward pass, unless
place-optimization-barriers tied it to the cotangent (`tie-to-cotangent`), and XLA:CPU
ignores host offload (DESIGN.md section 5). This module judges a module
statically, on the StableHLO itself, the way a simple buffer assigner without
reordering would see it:

* ops run in program order (top-level ops of the function body);
* a value is live from the op that produces it until the last op that reads
  it; a value read inside the nested regions of an op (a capture) counts as
  read by that op;
* arguments are live from entry until their last use (one never read is
  live at entry only);
* values the function returns are live until the end; a value returned in
  several result slots is counted once per slot at the `return`;
* while an op runs, its operands and its results are both live (no in-place
  reuse), so the bytes at an op are the bytes live before it plus its results;
* identity ops do not allocate: the results of the `@remat.name`
  checkpoint-name marker, of `stablehlo.optimization_barrier` and of a
  `stablehlo.reduce_precision` to the type's own exponent/mantissa bits (what
  insert-reduce-precision adds) alias their operands, which stay live as long
  as an alias is read;
* only device memory counts: a value moved to host memory (the result of
  `@annotate_device_placement` to `pinned_host`/`unpinned_host`, an argument
  with `mhlo.memory_kind` = a host kind) has 0 bytes; the copy back to
  `device` is a new buffer; a value the function returns only in result slots in host
  memory (a scan's stacked residuals, offloaded in split form) is made there: 0 bytes;
* ops with regions (`reduce`, `while`, `sort`, `if`, ...): their results are
  counted when produced; the temporaries of their bodies are approximated by
  the largest internal peak among their regions (values defined inside the
  region, its block arguments excluded, which alias the op's operands and
  results), added while the op runs. A `func.call` is approximated the same
  way by the callee's body (remat-partial-eval inlines calls anyway).

Bytes come from the static tensor types (`graph.type_bytes`; tokens are 0). A
value with symbolic dimensions (`jax.export.symbolic_shape`) counts 0 bytes; each
function's estimate says how many such values it has and the names of their
dimensions (`symbolic.DimNames`), and `memory_report.format_memory` prints them.
Everything is O(number of ops): one pass computes last uses, one sweep
accumulates live bytes.

`model="xla"` models, on top of that, what XLA does to live ranges: which ops it fuses,
which work on transposed copies, how its buffer assignment lays buffers out
(`cost/xla_buffers.py`, whose docstring lists the rules), and on CPU the order its
scheduler runs the ops in (`cost/xla_schedule.py`).

For a split module (`<f>_fwd` / `<f>_bwd` from `remat(..., mode="split")`)
both functions are estimated on their own; `residual_bytes` of `<f>_fwd` is
the total of its results marked `remat.residual`, which is what the caller
keeps alive between the two calls (and what `<f>_bwd` takes as arguments).
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict

from remat_passes import jax_compat
from remat_passes.cost.xla_buffers import (
    COPIES, ELEMENTWISE, EXPENSIVE, FUSES_INPUTS, FUSIBLE, UPDATES_OPERAND_0, Buffer, Fused,
    conv_copied, conv_padded_input, copied, copies_made_early, copy_bytes, copy_ready_at,
    early_copies, few_reads, folded_transpose, lay_out, padded_past_input, reads_through,
    split_k_partials, transposed_dot)
from remat_passes.cost.xla_schedule import bfs_order
from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import RematError, expect_module, ir, op_id

__all__ = ["FunctionMemory", "MemoryEstimate", "estimate_memory"]

_TERMINATORS = ("func.return", "stablehlo.return")
MODELS = ("program-order", "xla")
_DONATED = ("jax.buffer_donor", "tf.aliasing_output")
PEAK_VALUES = 5     # how many of the buffers live at the peak a report names


@dataclasses.dataclass
class FunctionMemory:
    """The static memory estimate of one function."""
    name: str
    peak_bytes: int            # max over program points of the bytes live there
    argument_bytes: int        # total of the argument types (host-placed ones included)
    result_bytes: int          # total of the result types, one per slot (host-placed included)
    peak_op: str               # the op at the peak, e.g. 'stablehlo.tanh at f.py:9:12 (mlp)'
    peak_index: int            # its index among the top-level ops (-1: at entry)
    # bytes live after each top-level op (return excluded), in the order they run (with
    # model="xla" on CPU, XLA:CPU's: cost/xla_schedule.py)
    live_bytes_timeline: list[int]
    # the largest buffers live at the peak, largest first: (bytes, what it is)
    peak_values: list = dataclasses.field(default_factory=list)
    residual_bytes: int | None = None  # <f>_fwd of a split module: results marked remat.residual
    num_ops: int = 0           # top-level ops, return excluded
    # values (arguments included) with symbolic dimensions: counted as 0 bytes above
    symbolic_values: int = 0
    symbols: tuple[str, ...] = ()   # the names of those dimensions ('?' where unknown)


@dataclasses.dataclass
class MemoryEstimate:
    """Per-function estimates, in module order."""
    functions: dict[str, FunctionMemory]

    def __getitem__(self, name: str) -> FunctionMemory:
        return self.functions[name]

    def __iter__(self):
        return iter(self.functions.values())

    def __len__(self) -> int:
        return len(self.functions)

    @property
    def peak_bytes(self) -> int:
        """The largest peak of the functions (they run one after the other)."""
        return max((f.peak_bytes for f in self.functions.values()), default=0)

    @property
    def residual_bytes(self) -> int | None:
        """Total residual bytes of the split forward functions; None if there are none."""
        values = [f.residual_bytes for f in self.functions.values() if f.residual_bytes is not None]
        return sum(values) if values else None


# ---------------------------------------------------------------- helpers --
def _is_alias_op(op) -> bool:
    """Identity ops whose results share their operands' buffers."""
    name = op.name
    if name == "stablehlo.optimization_barrier":
        return True
    if name == "stablehlo.reduce_precision":
        try:
            bits = (ir.IntegerAttr(op.attributes["exponent_bits"]).value,
                    ir.IntegerAttr(op.attributes["mantissa_bits"]).value)
        except (ValueError, TypeError, KeyError):
            return False
        return contract.float_format(op.operands[0].type) == bits
    return (name == "stablehlo.custom_call" and len(op.operands) == 1
            and len(op.results) == 1 and contract.checkpoint_name(op) is not None)


def _invariant_carries(while_op) -> list[int]:
    """The carries a while loop's body returns unchanged: XLA's loop simplifier takes them
    out of the loop, so the result is the operand's buffer."""
    body = while_op.regions[1].blocks[0]
    ret = graph.terminator(body)
    return [k for k, v in enumerate(ret.operands)
            if isinstance(v, ir.BlockArgument) and v.owner == body and v.arg_number == k]


def describe_op(op) -> str:
    """'stablehlo.tanh at f.py:9:12 (mlp)' or 'stablehlo.add at line 5'."""
    op = op.operation
    pos, fn = graph.source_position(op)
    text = op.name
    name = contract.checkpoint_name(op)
    if name is not None:
        text += f" @remat.name '{name}'"
    if pos:
        text += f" at {pos}"
    if fn:
        text += f" ({fn})"
    return text


@dataclasses.dataclass
class _Sweep:
    peak: int
    peak_index: int
    peak_op: object          # the op, or None at entry
    timeline: list[int]
    num_ops: int
    at_peak: list = dataclasses.field(default_factory=list)   # [(bytes, value or text)]


def _describe_value(v) -> str:
    """'tensor<8x256xf32> from stablehlo.dot_general at f.py:9:12' or 'argument #3'."""
    if isinstance(v, str):
        return v
    if isinstance(v, ir.BlockArgument):
        return f"{v.type} argument #{v.arg_number}"
    return f"{v.type} from {describe_op(v.owner)}"


class _Estimator:
    def __init__(self, module_op, dim_symbols=None, model: str = "program-order",
                 backend: str | None = None):
        self.module_op = module_op
        self.xla = model == "xla"
        # (model="xla") XLA:CPU has one memory; XLA:GPU's matrix products differ (below)
        self.host_kinds = frozenset() if backend == "cpu" else contract.HOST_KINDS
        self.gpu = self.xla and backend == "gpu"
        self.cpu = self.xla and backend == "cpu"
        # (on CPU) as XLA:CPU runs the ops, breadth first (xla_schedule), with the barriers
        # deleted before it fuses and schedules where it does so (jaxlib 0.10)
        self.breadth_first = self.cpu
        self.fuse_across = self.cpu and jax_compat.xla_cpu_fuses_across_barriers()
        self.dim_symbols = dim_symbols or {}
        self._funcs = None
        self._callee_peaks: dict[str, int] = {}
        self._in_progress: set[str] = set()

    def functions(self) -> dict:
        if self._funcs is None:
            self._funcs = {graph.func_name(op): op for op in self.module_op.body.operations
                           if op.operation.name == "func.func"}
        return self._funcs

    # -------------------------------------------------------- extra bytes --
    def _callee_peak(self, op) -> int:
        """Internal peak of a func.call's callee body (its arguments excluded)."""
        if "callee" not in op.attributes:
            return 0
        name = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
        if name in self._callee_peaks:
            return self._callee_peaks[name]
        callee = self.functions().get(name)
        if callee is None or name in self._in_progress or len(callee.regions[0].blocks) == 0:
            return 0
        self._in_progress.add(name)
        try:
            peak = self.sweep(graph.body_block(callee), count_args=False).peak
        finally:
            self._in_progress.discard(name)
        self._callee_peaks[name] = peak
        return peak

    def _internal_bytes(self, op, top: bool = True) -> int:
        """Temporaries an op needs while it runs besides its results (`top`: an op of the
        function's own body, not of a loop's or a callee's)."""
        if op.name == "func.call":
            return self._callee_peak(op)
        if self.gpu and op.name == "stablehlo.dot_general":
            # its kernels read operands in any order. Inside a loop body the partials are
            # not counted: measured, they put the scanned models' forwards 20-30% over
            return split_k_partials(op) if top else 0
        if self.gpu and op.name == "stablehlo.convolution":
            return conv_padded_input(op)     # cuDNN reads its operands in any layout
        if self.xla and op.name in COPIES:
            return copy_bytes(op)
        best = 0
        for region in op.regions:
            for block in region.blocks:
                best = max(best, self.sweep(block, count_args=False).peak)
        return best

    # ---------------------------------------------------------- the sweep --
    def _fused(self, op, fused) -> bool:
        """model="xla": is `op` computed inside its readers (never stored)? Into its only
        reader; into each of several elementwise readers when it is cheap to compute again
        (XLA duplicates such a producer into every loop fusion that reads it) and reads at
        most DUPLICATED_READS buffers, through what is `fused` into it."""
        if op.name not in FUSIBLE or len(op.results) != 1:
            return False
        users = self._readers(op.results[0])
        if any(self._aliases(u) for u in users):
            return False      # an identity op is no reader to fuse into: it is a view
        if len(users) == 1:    # (or into the transposed copy a convolution works on)
            return users[0].name in FUSES_INPUTS or (
                self.cpu and users[0].name == "stablehlo.convolution" and op.name in ELEMENTWISE
                and op.results[0] in conv_copied(users[0]))
        parent = op.parent
        return bool(users) and op.name not in EXPENSIVE and all(
            u.name in FUSIBLE and u.parent == parent for u in users) and \
            few_reads(op, fused)

    def _duplicated(self, op, fused) -> bool:
        """model="xla" on CPU: is cheap elementwise `op`, stored for a reader that fuses
        nothing (a barrier where barriers stop fusion, jaxlib 0.11 on; else a convolution, a
        dot), also computed again inside the fusions of its elementwise readers (a ReLU in
        a convolution's copy, a GELU)? XLA:CPU duplicates it there: they read its inputs."""
        if not self.cpu or op.name not in ELEMENTWISE or \
                op.name in EXPENSIVE or len(op.results) != 1:
            return False
        if self.fuse_across:        # (barriers deleted first: its readers through them)
            users = self._readers(op.results[0])
            stored = [u for u in users if u.name not in FUSES_INPUTS]
        else:
            users = [u.owner.operation for u in op.results[0].uses]
            stored = [u for u in users if u.name == "stablehlo.optimization_barrier"]
        return bool(stored) and any(u.name in ELEMENTWISE for u in users) and \
            few_reads(op, fused)

    def _readers(self, value) -> list:
        """The ops that read `value`: through the views that read it (`_aliases`: a view's
        readers are its operand's; a placement annotation is one only where there is one
        memory, CPU), and through barriers where XLA:CPU drops them before it fuses (jaxlib
        0.10). A `reduce_precision` to the value's own type is such a view: XLA fuses it as
        an elementwise op and deletes it only after fusion (XLA:GPU: the same scratch for
        GPT's joint form with its residuals rounded and without)."""
        out = []
        for use in value.uses:
            op = use.owner.operation
            through = self.fuse_across or op.name != "stablehlo.optimization_barrier"
            if through and self._aliases(op) and len(
                    op.results) == len(op.operands):
                out += self._readers(op.results[use.operand_number])
            else:
                out.append(op)
        return out

    def _aliases(self, op) -> bool:
        """Is `op` a view of its operands? (model="xla": a reshape, a transpose folded into
        its dot, and, where there is one memory (CPU), a placement annotation: XLA:CPU
        drops it.)"""
        return _is_alias_op(op) or (self.xla and (
            op.name == "stablehlo.reshape" or transposed_dot(op) or folded_transpose(op)
            or (not self.host_kinds and contract.placement(op) is not None)))

    def _last_uses(self, ops, has_term, copies_after=None) -> tuple:
        """Pass 1 of the sweep: the last use of every buffer (aliases resolved to their
        root; a fused value is read where its reader runs, as the buffers it reads), and
        (model="xla", CPU) where a convolution's transposed copies are made early: op
        index -> {value copied: where (-1: at entry)} (`xla_buffers.early_copies`), and the
        buffers a copy made after op k reads last: k (no op k writes its result there)."""
        root: dict = {}
        last: dict = {}
        fused: dict = {}     # (model="xla") fused value -> what it reads (a Fused)
        again: dict = {}     # (model="xla") a value `_duplicated`: -> what it reads (a Fused)
        buffers_read = []    # per op: the buffers it reads (through fused values)
        copies_at: dict = {}
        held: dict = {}      # a buffer whose last reader is a copy made after op k -> k
        for i, op in enumerate(ops):
            values = graph.read_values(op)
            if self.xla and not (has_term and op == ops[-1]) and self._fused(op, fused):
                # read where its readers run (they come later): nothing to note here
                # (a value duplicated into it: what that reads; through a deleted barrier too)
                fused[op.results[0]] = Fused([
                    fused.get(v) or again.get(root.get(v, v) if self.fuse_across else v)
                    or root.get(v, v) for v in values])
                buffers_read.append(())
                continue
            if self.xla and op.results and self._duplicated(op, fused):
                again[op.results[0]] = Fused([fused.get(v) or root.get(v, v) for v in values])
            early = early_copies(op, root, fused, copies_after) \
                if self.cpu and op.name in COPIES else {}
            if early:
                copies_at[i] = early
            reads, copied, direct = [], {}, set()   # copied: read by an early copy, where
            for v in values:
                f = fused.get(v)
                got = [root.get(v, v)] if f is None else reads_through(f.parts)
                reads += got
                if v in early:
                    copied.update((r, early[v]) for r in got)
                else:
                    direct.update(got)
            buffers_read.append(reads)
            if self.fuse_across and op.name == "stablehlo.optimization_barrier":
                reads = ()     # XLA:CPU deletes it first: only its results' readers read
            for r in reads:
                if r in copied and r not in direct:
                    if copied[r] >= last.get(r, -1):
                        held[r] = copied[r]
                    last[r] = max(last.get(r, -1), copied[r])
                else:
                    last[r] = i
                    held.pop(r, None)
            if self._aliases(op):
                for r, o in zip(op.results, op.operands):
                    if o in fused:       # (model="xla") a view of a value never stored
                        fused[r] = fused[o]
                    else:
                        root[r] = root.get(o, o)
            elif self.xla and op.name == "stablehlo.while":
                for k in _invariant_carries(op):
                    o = op.operands[k]
                    root[op.results[k]] = root.get(o, o)
        return root, last, fused, buffers_read, copies_at, held

    def sweep(self, block, count_args: bool, host_args=frozenset(),
              kept_args=frozenset(), host_results=frozenset()) -> _Sweep:
        """`kept_args` (model="xla"): arguments the caller keeps for the whole call;
        `host_results`: result slots in host memory (a value returned only there, as a scan's
        stacked residuals offloaded, is made in host memory)."""
        ops = [op.operation for op in block.operations]
        n = len(ops)
        has_term = n > 0 and ops[-1].name in _TERMINATORS
        root, last, fused, buffers_read, copies_at, held = self._last_uses(ops, has_term)
        if self.breadth_first and has_term:   # (model="xla") as XLA:CPU schedules them
            after: dict = {}
            ops = bfs_order(ops, lambda op: bool(op.results) and op.results[0] in fused or (
                (self.fuse_across and op.name == "stablehlo.optimization_barrier")
                or contract.placement(op) or folded_transpose(op)),
                list(block.arguments), copied, after)
            root, last, fused, buffers_read, copies_at, held = self._last_uses(
                ops, has_term, after)
        if self.xla:
            for a in block.arguments:
                if a.arg_number in kept_args:
                    last[a] = n
        # Pass 2: the sweep.
        free_at: dict = defaultdict(int)
        size: dict = {}   # buffer (root value) -> the bytes counted for it
        start: dict = {}  # buffer -> the op that makes it (-1: at entry)
        # model="xla", a function's own sweep: its peak is XLA's layout of its buffers
        # (xla_buffers.lay_out), from `buffers` (value -> its Buffer; values written in
        # place share one) and `scratch` (op index -> (bytes it needs while it runs, what
        # they are: None for a region's or a call's temporaries)); `returned`: the values
        # it returns
        laid_out = self.xla and count_args and has_term and ops[-1].name == "func.return"
        buffers: dict = {}
        scratch: dict = {}
        position = None   # (model="xla" on a GPU, where needed) op -> its index
        live = 0
        returned = {root.get(v, v) for v in ops[-1].operands} if laid_out else set()
        in_host = set()
        if has_term and host_results:
            ret = ops[-1]
            in_host = {v for k, v in enumerate(ret.operands) if k in host_results and all(
                op_id(u.owner) == op_id(ret) and u.operand_number in host_results
                for u in v.uses)}
        if count_args:
            for a in block.arguments:
                b = size[a] = 0 if a.arg_number in host_args else graph.type_bytes(a.type)
                start[a] = -1
                live += b
                free_at[last.get(a, -1)] += b
                if b:
                    buffers[a] = Buffer(-1, last.get(a, -1), b, a)
        peak, peak_index, peak_op = live, -1, None
        live -= free_at.pop(-1, 0)
        timeline = []
        for i, op in enumerate(ops):
            if has_term and i == n - 1:
                # At the return every result is live; a value returned in k
                # slots counts k times (the caller gets k buffers).
                seen, dup = set(), 0
                for v in op.operands:
                    r = root.get(v, v)
                    if r in seen:
                        dup += size.get(r, 0)
                    seen.add(r)
                if live + dup > peak:
                    peak, peak_index, peak_op = live + dup, i, op
                break
            produced = 0
            if self.xla and (op.results and op.results[0] in fused
                             or op.name == "stablehlo.constant"):
                pass     # computed inside its reader / a literal of the executable
            elif not self._aliases(op) and contract.placement(op) not in self.host_kinds:
                for r in op.results:
                    if r in root or r in in_host:   # (model="xla") a loop carry passed
                        continue                    # through unchanged; made in host memory
                    b = size[r] = graph.type_bytes(r.type)
                    start[r] = i
                    produced += b
                    free_at[last.get(r, i)] += b
                    if b:
                        buffers[r] = Buffer(i, last.get(r, i), b, r)
                        if self.gpu and contract.placement(op) == "device":
                            # prefetched: XLA:GPU starts the copy in as early as it can
                            if position is None:
                                position = {op_id(o): k for k, o in enumerate(ops)}
                            buffers[r].start = copy_ready_at(op.operands[0], position)
                if self.xla:
                    produced -= self._reused(op, buffers_read[i], root, last, size, free_at, i,
                                             buffers, returned, held)
            during = live + produced
            if len(op.regions) or op.name == "func.call" or (self.xla and op.name in COPIES):
                inside = self._internal_bytes(op, top=count_args)
                if self.gpu and op.name == "stablehlo.convolution" and inside:
                    inside -= padded_past_input(op, i, root, fused, last, size)
                during += inside
                if laid_out and inside:
                    if not self.gpu:
                        inside -= copies_made_early(copies_at.get(i, {}), i, buffers)
                    scratch[i] = (inside, _scratch_kind(op, self.gpu))
            if during > peak:
                peak, peak_index, peak_op = during, i, op
            live += produced - free_at.pop(i, 0)
            timeline.append(live)
        if laid_out:
            peak, peak_index, timeline, at_peak = lay_out(ops, root, buffers, scratch, n,
                                                          _describe_value, host_results)
            return _Sweep(peak, peak_index, ops[peak_index] if peak_index >= 0 else None,
                          timeline, len(timeline), at_peak[:PEAK_VALUES])
        at_peak = []
        if count_args:     # (a function's own sweep: what a report names)
            at_peak = [(size[r], r) for r in size if size[r] and start[r] <= peak_index
                       and last.get(r, start[r]) >= peak_index]
            if peak_op is not None and peak_index < n - 1 and (
                    len(peak_op.regions) or peak_op.name == "func.call"
                    or (self.xla and peak_op.name in COPIES)):
                inside = self._internal_bytes(peak_op, top=count_args)
                if inside:
                    at_peak.append((inside, "temporaries inside the op at the peak"))
            at_peak = sorted(at_peak, key=lambda t: -t[0])[:PEAK_VALUES]
        return _Sweep(peak, peak_index, peak_op, timeline, len(timeline), at_peak)

    @staticmethod
    def _in_place(op, buffers, root) -> list:
        """(result, candidate buffers) of op: the buffers whose place the result may take
        when they die at the op (XLA's in-place updates and loop carries)."""
        name = op.name
        if name in ELEMENTWISE and len(op.results) == 1:
            return [(op.results[0], list(dict.fromkeys(buffers)))]
        if name in UPDATES_OPERAND_0:
            v = op.operands[0]
            return [(op.results[0], [root.get(v, v)])]
        if name == "stablehlo.while":
            return [(r, [root.get(v, v)]) for r, v in zip(op.results, op.operands)]
        return []

    def _reused(self, op, reads, root, last, size, free_at, i, buffers, returned,
                held) -> int:
        """Bytes of results that take the place of a buffer dying at op i (same size): not
        allocated again. A buffer the sweep does not track (a region's block argument: the
        op's operand outside) is taken whole. `buffers`: the result's _Buffer becomes the
        one it takes, lasting until the result dies (not one a copy made after op i still
        reads: `held`). An elementwise result the function returns (`returned`) is written
        into its output allocation instead."""
        saved, taken = 0, set()
        for result, candidates in self._in_place(op, reads, root):
            want = 0 if result in returned and op.name in ELEMENTWISE else size.get(result, 0)
            for r in candidates:
                if r in taken or last.get(r) != i or held.get(r) == i or not want:
                    continue
                if r in size and size[r] == want:
                    free_at[i] -= want       # the buffer is not freed: it goes on
                    if r in buffers:
                        buffers[r].end = max(buffers[r].end, buffers[result].end)
                        buffers[result] = buffers[r]
                elif r not in size and isinstance(r, ir.BlockArgument) and r.type == result.type:
                    free_at[last.get(result, i)] -= want   # never allocated here
                    size[result] = 0
                    buffers.pop(result, None)
                else:
                    continue
                taken.add(r)
                saved += want
                break
        return saved

    # ------------------------------------------------------- one function --
    def function(self, func_op) -> FunctionMemory:
        name = graph.func_name(func_op)
        block = graph.body_block(func_op)
        ftype = func_op.type
        host_args = frozenset(i for i in range(len(ftype.inputs)) if contract.memory_kind(
            func_op, "arg_attrs", i) in self.host_kinds)
        kept = frozenset()
        if self.xla:
            entries = contract.all_entries(func_op, "arg_attrs")
            kept = frozenset(i for i, e in enumerate(entries)
                             if not any(k in e for k in _DONATED))
        host_results = frozenset(i for i in range(len(ftype.results)) if contract.memory_kind(
            func_op, "res_attrs", i) in self.host_kinds)
        s = self.sweep(block, count_args=True, host_args=host_args, kept_args=kept,
                       host_results=host_results)
        arg_bytes = sum(graph.type_bytes(t) for t in ftype.inputs)
        res_bytes = sum(graph.type_bytes(t) for t in ftype.results)
        residual = None
        residual_slots = contract.residual_results(func_op)
        is_split_fwd = name.endswith("_fwd") and name[:-4] + "_bwd" in self.functions()
        if residual_slots or is_split_fwd:
            results = ftype.results      # (a new list at each access)
            residual = sum(graph.type_bytes(results[i]) for i in residual_slots)
        peak_op = "entry (arguments)" if s.peak_op is None else describe_op(s.peak_op)
        peak_index = s.peak_index if s.peak_op is None or not self.breadth_first else next(
            i for i, op in enumerate(block.operations) if op.operation == s.peak_op)
        n_symbolic, symbols = self._symbolic(func_op)
        return FunctionMemory(name=name, peak_bytes=s.peak, argument_bytes=arg_bytes,
                              result_bytes=res_bytes, peak_op=peak_op, peak_index=peak_index,
                              live_bytes_timeline=s.timeline, residual_bytes=residual,
                              peak_values=[(b, _describe_value(v)) for b, v in s.at_peak],
                              num_ops=s.num_ops, symbolic_values=n_symbolic, symbols=symbols)

    def _symbolic(self, func_op) -> tuple[int, tuple[str, ...]]:
        """How many values have symbolic (`?`) dimensions, and their names."""
        from remat_passes.ir.symbolic import UNKNOWN, DimNames
        names = DimNames(func_op, self.dim_symbols.get(graph.func_name(func_op)))
        count, symbols = 0, set()

        def visit(values):
            nonlocal count
            for v in values:
                if graph.dynamic_unit_bytes(v.type) is None:
                    continue
                count += 1
                rt = ir.RankedTensorType(v.type)
                labels = names.labels(v)
                symbols.update(labels[i] for i in range(rt.rank) if rt.is_dynamic_dim(i))
        visit(graph.body_block(func_op).arguments)
        for op in graph.nested_ops(graph.body_block(func_op)):
            visit(op.results)
            for region in op.regions:
                for b in region.blocks:
                    visit(b.arguments)
        return count, tuple(sorted(symbols - {UNKNOWN}) + ([UNKNOWN] if UNKNOWN in symbols
                                                           else []))


def _scratch_kind(op, gpu: bool) -> str | None:
    """What an op's own scratch is (model="xla"): buffers of their own, which XLA may place
    in an output allocation, or None for the temporaries of a region or a callee."""
    if op.name == "stablehlo.dot_general" and gpu:
        return "split-K partial products"
    if op.name == "stablehlo.convolution" and gpu:
        return "a padded copy of the input"
    if op.name in COPIES:
        return "transposed copies of the op's operands"
    return None


def _has_body(func_op) -> bool:
    return len(func_op.regions[0].blocks) > 0


def _select(est: _Estimator, function) -> list[str]:
    funcs = est.functions()
    if function is None:
        names = [n for n, f in funcs.items() if graph.is_public(f) and _has_body(f)]
        if not names and "main" in funcs:
            names = ["main"]
        if not names:
            raise RematError("error: no public function with a body to estimate (functions: "
                             + (", ".join(f"@{n}" for n in funcs) or "none") + ")")
        return names
    wanted = [function] if isinstance(function, str) else list(function)
    names = []
    for name in wanted:
        if name not in funcs and f"{name}_fwd" in funcs and f"{name}_bwd" in funcs:
            names += [f"{name}_fwd", f"{name}_bwd"]   # a split module
        else:
            graph.find_func(est.module_op, name)      # a clear error if absent
            names.append(name)
    return names


def estimate_memory(module, function=None, dim_symbols=None,
                    model: str = "program-order", backend: str | None = None) -> MemoryEstimate:
    """Static peak-memory estimate of the functions of `module`.

    `module` is a `remat_passes.Module` (or an `ir.Module`). `function` is a
    name or a list of names; by default every public function with a body
    (else `main`). Naming `f` in a split module gives `f_fwd` and `f_bwd`.
    See the module docstring for the model (program order, no reuse, regions
    approximated by their largest internal peak). `dim_symbols` names symbolic
    argument dimensions (`symbolic.argument_dims`; by default the Module's, or read
    from the module). `model="xla"` adds what XLA's buffer assignment does to live
    ranges (arguments held by the caller, fusion, in-place elementwise ops, copies of
    returned arguments): see the module docstring. `backend` ("cpu", "gpu", "tpu"; by
    default JAX's) matters to that model only: XLA:CPU has one memory, so what is placed
    in host memory counts as device memory there.
    """
    expect_module(module, "rp.estimate_memory", ir_module=True)
    if model not in MODELS:
        raise RematError(f"error: unknown memory model {model!r}; known: {', '.join(MODELS)}")
    from remat_passes.ir.symbolic import argument_dims
    module_op = getattr(module, "op", module)
    with module_op.context:
        dim_symbols = getattr(module, "dim_symbols", None) if dim_symbols is None \
            else dim_symbols
        est = _Estimator(module_op, argument_dims(module_op) if dim_symbols is None
                         else dim_symbols, model, _backend(model, backend))
        names = _select(est, function)
        funcs = est.functions()
        return MemoryEstimate({n: est.function(funcs[n]) for n in names})


def estimate_function(func_op, model: str = "program-order", backend=None,
                      in_program_order: bool = False) -> int:
    """The peak bytes of one function (`estimate_memory`'s model, for `backend` as there;
    device memory only), for a pass comparing versions of a function it holds.
    `in_program_order`: never in XLA:CPU's breadth-first order (a version without the
    barriers and ties that keep XLA to the program's order where it will run)."""
    op = func_op.operation
    while op.name != "builtin.module":
        op = op.parent
    est = _Estimator(op.opview, model=model, backend=_backend(model, backend))
    est.breadth_first = est.breadth_first and not in_program_order
    return est.function(func_op).peak_bytes


BACKENDS = ("cpu", "gpu", "tpu")     # (what `backend` may name; remat-opt's --memory-backend)


def _backend(model: str, backend: str | None) -> str | None:
    """The backend the xla model models: `backend`, else the platform JAX runs on
    (`jax_compat.platform_in_use`: none is started to find out)."""
    if model != "xla":
        return None
    if backend is None:
        backend = jax_compat.platform_in_use()
    elif backend not in BACKENDS:
        raise RematError(f"error: unknown backend {backend!r} for the xla memory model; "
                         f"known: {', '.join(BACKENDS)}")
    return backend
