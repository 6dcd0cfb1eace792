"""What XLA does to buffers, as `estimate_memory`'s model="xla" sees it (cost/memory.py):
which ops it fuses, which work on transposed copies of their operands, and how its buffer
assignment lays a function's buffers out in output allocations and one heap (`lay_out`).

The rules model="xla" adds to the program-order model (calibrated on XLA:CPU with YNNPACK
fusions off, whose buffers XLA does not count, and on XLA:GPU for the rules that say so,
`python -m tools.benchmarks xla`):

* the caller's arguments stay allocated for the whole call, unless donated
  (`jax.buffer_donor` or `tf.aliasing_output`): then until their last use;
* every result slot is an output allocation of its own, there for the whole call (the
  caller receives it; a returned argument or literal is copied into it). A temporary
  that dies before the result is made (or where an elementwise op makes it in place)
  lies inside such an allocation at least as large, when it overlaps none already there:
  no memory of its own. XLA's buffer assignment tries its existing allocations, the
  outputs among them, before the heap, largest buffers first; so does the model (each
  temporary tries at most 16 allocations). The rest share the heap, whose peak, with
  the arguments and the outputs, is the estimate;
* constants are literals of the executable, not memory the program allocates;
* fusion: an elementwise op (or a broadcast, an iota) whose only reader is another such
  op, or a reduce, is computed inside its reader and never stored; its reader reads its
  operands instead. One read by several elementwise ops is computed again inside each
  unless it is expensive (a divide, an exponential, a square root, tanh, ...: XLA:CPU's
  `IsExpensive`) or reads more than 4 buffers through what is fused into it (XLA stops
  where the code would grow again and again, as along a gradient summed over many
  layers; a constant is a literal, no buffer). An identity op (below) is no reader to
  fuse into; on CPU its readers count as the value's readers, since XLA:CPU drops
  optimization barriers before it fuses (jaxlib 0.10: a barrier holds nothing alive, and
  a cheap value stored for a reader that fuses nothing, a convolution or a dot, is
  computed again inside its elementwise readers, through barriers too: they read its
  inputs; from 0.11 its fusions stop at barriers, as XLA:GPU's: there a barrier's readers
  are not the value's, and a cheap value a barrier reads is stored for it and computed
  again inside its elementwise readers, which read its inputs);
* a reshape is a bitcast (an alias of its operand); so is a transpose of a dot_general
  that swaps its two free parts (the dot's only reader): XLA computes dot(b, a) instead;
  and a transpose read by dot_generals alone, which XLA folds into them (TransposeFolding:
  each reads the transpose's operand, copied where that is out of its kernels' order;
  `folded_transpose`); on CPU, so is a placement annotation (XLA:CPU drops it);
* an elementwise op whose operand dies there writes its result into that operand's
  buffer when the two have the same size (unless the function returns the result: it
  goes into its output allocation); so do `dynamic_update_slice` and `scatter`
  into their first operand, and a `while` loop's results into its operands (its carries;
  inside the loop body, an update of a carry costs nothing new), and a carry the body
  returns unchanged is the operand's own buffer;
* a convolution whose operands or result are not in the dimension order XLA's convolution
  kernels take (batch, spatial..., feature; the kernel spatial..., input, output feature),
  as in a convolution's weight gradient, works on a transposed copy of each such one, live
  while it runs; on CPU, an elementwise op whose only reader is such a convolution is
  computed inside the copy (never stored: measured, the conv net's weight gradients under
  `dots_saveable`), and, as XLA:CPU runs ops breadth first, any copy is made as soon as
  what it copies is there (`early_copies`): a copy of what reads only the function's
  arguments (one of them, or such an elementwise chain: a split backward's relu(residual +
  bias)) at entry, held until the convolution; what the copy reads last is not written
  over by the op it follows.
  A `dot_general` whose operands are
  not in the order XLA's matrix kernels take (the left: batch, free, contracting
  dimensions; the right: batch, contracting, free), as for `x @ W.T` or attention's
  heads, works on transposed copies of them too, live while it runs, and made early on
  CPU as a convolution's are (`early_copies`; measured: XLA:CPU 0.12 copies the split
  Equinox backward's saved attention heads at entry and holds them until their products);
* on the CPU backend there is one memory: what is placed in host memory counts.
* on a GPU (read from XLA:GPU's dumps on an H100, `tools.benchmarks.xla_dump`, and checked
  against the xla benchmark's footprints on an H100 and an H200): a
  `dot_general` without batch dimensions whose output is small beside its contraction is
  computed by XLA:GPU as split-K partial products, summed afterwards: the partials
  (`split_k_partials`) are live while it runs, as buffers of their own (not
  counted inside a loop body: there they put the scanned models' forwards 20-30% over).
  Its matrix kernels read operands in any dimension order: no transposed copies. A value
  copied back from host memory is on the device from as early as the copy can start
  (`copy_ready_at`): XLA:GPU starts it early. A convolution whose padding differs on the two sides of a
  spatial dimension works on a padded copy of its input (`conv_padded_input`), made just
  before it: live with the input where it is made, and with the result while the
  convolution runs. Not modelled: cuDNN's workspace, which XLA's autotuner picks per
  convolution (881,327 B for the conv net's first weight gradient on an H200, none for
  most others); nor where XLA sums a product's split-K partials inside each of its
  elementwise readers' fusions instead of its own, which holds them until the last
  reader (Equinox's forward on an H200: two MLP blocks' partials at once, 8 each for a
  contraction of 256 where SPLIT_K_SLICE gives 4, the bulk of its -28%; tried: holding
  them so, with the model's counts, put that figure at -31%).

The order: on CPU, the ops run in the order XLA:CPU's breadth-first scheduler gives them
(`cost/xla_schedule.py`: with jaxlib 0.10 on a graph without the barriers, later on one
that keeps them); elsewhere in program order (XLA:GPU's schedulers are not modelled).
"""
from __future__ import annotations

import bisect
import dataclasses
import math
from collections import defaultdict

from remat_passes.cost.flops import conv_dims, dot_dims, i64s
from remat_passes.ir import graph
from remat_passes.ir.mlir import ir, op_id

# How often model="xla" is within 15% of XLA's footprint, per backend and, on CPU, per
# XLA:CPU generation (jaxlib 0.10's deletes barriers before it fuses and schedules; later
# ones keep them until after: jax_compat): (split halves and joint programs within,
# measured, where, note), from `python -m tools.benchmarks xla` on the benchmark models
# under every policy (docs/benchmarks.md; test_memory checks these against the stored
# results: xla.json, xla_cpu_jax0_12.json, xla_gpu.json). On CPU that runs with YNNPACK
# fusions off: XLA does not count the buffers YNNPACK uses inside them (ynn_probe.py).
MEASURED = {"cpu": (162, 162, "2 CPUs, jaxlib 0.10", ", YNNPACK fusions off"),
            "cpu, jaxlib >= 0.11": (162, 162, "2 CPUs, jaxlib 0.12", ", YNNPACK fusions off"),
            "gpu": (109, 162, "an H200", "")}


def measured_key(backend: str) -> str:
    """The MEASURED entry of `backend` with the installed jaxlib."""
    from remat_passes import jax_compat
    if backend == "cpu" and not jax_compat.xla_cpu_fuses_across_barriers():
        return "cpu, jaxlib >= 0.11"
    return backend


def model_line(backend: str) -> str:
    """The line `--print-memory --memory-model=xla` starts with: the backend modelled and how
    close the model came to XLA there (with the installed jaxlib's XLA:CPU on CPU)."""
    if backend not in MEASURED:
        return f"// memory model: xla ({backend} backend; not measured against XLA there)"
    within, total, where, note = MEASURED[measured_key(backend)]
    return (f"// memory model: xla ({backend} backend; within 15% of XLA's footprint on "
            f"{within} of {total} benchmark programs measured on {where}{note})")


ELEMENTWISE = frozenset("stablehlo." + n for n in (
    "abs add and atan2 cbrt ceil clamp compare complex convert cosine divide exponential "
    "exponential_minus_one floor imag is_finite log log_plus_one logistic maximum minimum "
    "multiply negate not or popcnt power real remainder round_nearest_afz round_nearest_even "
    "rsqrt select shift_left shift_right_arithmetic shift_right_logical sign sine sqrt "
    "subtract tan tanh xor reduce_precision").split())
# elementwise ops XLA does not compute twice: a fusion does not duplicate them into several
# readers (XLA:CPU's `CpuInstructionFusion::IsExpensive`; sine and cosine are cheap there)
EXPENSIVE = frozenset("stablehlo." + n for n in (
    "atan2 cbrt divide exponential exponential_minus_one log log_plus_one logistic power "
    "remainder rsqrt sqrt tanh").split())
# a cheap producer read by several is computed inside each only while it reads
# at most this many buffers (through what is fused into it): XLA stops duplicating where
# the code would grow again and again, as along a gradient summed over many layers
DUPLICATED_READS = 4
# computed inside the op that reads them (XLA's loop fusion)
FUSIBLE = ELEMENTWISE | {"stablehlo.broadcast_in_dim", "stablehlo.iota"}
FUSES_INPUTS = FUSIBLE | {"stablehlo.reduce"}
UPDATES_OPERAND_0 = frozenset({"stablehlo.dynamic_update_slice", "stablehlo.scatter"})

# how many output allocations a temporary may try before it goes to the heap:
# keeps the placement O(buffers log buffers)
PLACEMENT_TRIES = 16


def is_literal(value) -> bool:
    """A constant: a literal of the executable, no buffer a fusion reads."""
    return isinstance(value, ir.OpResult) and value.owner.name == "stablehlo.constant"


class Fused:
    """(model="xla") a value computed inside its readers: what it reads, buffers and other
    such values. Expanded only where an op that is stored reads it (`reads_through`), so a chain
    fused end to end (a gradient summed over many layers) is walked once, by its reader."""
    __slots__ = ("parts",)

    def __init__(self, parts):
        self.parts = parts


def reads_through(parts, limit: int | None = None) -> list:
    """The buffers `parts` (buffers and `Fused` values) read, in order, each once; with
    `limit`, it stops once more than `limit` of them are no literal."""
    out, seen, walked, counted = [], set(), set(), 0
    stack = [iter(parts)]
    while stack:
        for p in stack[-1]:
            if isinstance(p, Fused):
                if id(p) not in walked:
                    walked.add(id(p))
                    stack.append(iter(p.parts))
                    break
            elif p not in seen:
                seen.add(p)
                out.append(p)
                counted += limit is not None and not is_literal(p)
                if limit is not None and counted > limit:
                    return out
        else:
            stack.pop()
    return out


def conv_copied(op) -> list:
    """model="xla": the values XLA copies for a convolution, its operands and result whose
    dimensions are not in the order its convolution kernels take (input and output: batch,
    spatial..., feature; kernel: spatial..., input, output feature), as in the weight
    gradient of a convolution: the copies are live while it runs."""
    dims = conv_dims(op)
    if dims is None:
        return []
    lhs, rhs, out = dims
    spatial = [d for d in lhs if d.isdigit()]
    return [value for dims, want, value in ((lhs, ["b"] + spatial + ["f"], op.operands[0]),
                                            (rhs, spatial + ["i", "o"], op.operands[1]),
                                            (out, ["b"] + spatial + ["f"], op.results[0]))
            if dims != want]


def few_reads(op, fused) -> bool:
    """Does `op` read at most DUPLICATED_READS buffers (no literal), through what is `fused`
    into it (value -> its `Fused`)? XLA duplicates a cheap producer into its readers only
    then."""
    return len([b for b in reads_through([fused.get(v, v) for v in op.operands],
                                         DUPLICATED_READS)
                if not is_literal(b)]) <= DUPLICATED_READS


def early_copies(op, root, fused, copies_after) -> dict:
    """model="xla" on CPU: the transposed copies a convolution or dot_general `op` works on
    (`copied`) that XLA:CPU makes before it runs: {operand: the index of the op after which
    its copy is made (-1: at entry)}. A copy of what reads only the function's arguments
    (one of them, or an elementwise chain fused into the copy: a split backward's
    relu(residual + bias)) is made at entry (XLA:CPU schedules it first); in XLA:CPU's
    breadth-first order (`copies_after`, from xla_schedule.bfs_order; not given: program
    order) every copy is made where that order runs it, and the value copied can die
    there. `root`: alias -> its buffer; `fused`: a value computed inside its readers ->
    its `Fused`."""
    out = {}
    for v in copied(op):
        if v is op.results[0]:
            continue
        if copies_after is not None:
            at = copies_after.get((op_id(op), v))
        else:
            reads = [root.get(v, v)] if v not in fused else [
                b for b in reads_through(fused[v].parts) if not is_literal(b)]
            at = -1 if reads and all(isinstance(b, ir.BlockArgument) for b in reads) \
                else None
        if at is not None:
            out[v] = at
    return out


def copies_made_early(copies, i, buffers) -> int:
    """The early copies (`early_copies`) of the op at index `i`, each a buffer in
    `buffers` from the op it is made after until op `i`. Returns their bytes."""
    early = 0
    for v, at in copies.items():
        b = graph.type_bytes(v.type)
        buffers[(v, i)] = Buffer(at, i, b, f"{v.type}, a transposed copy made "
                                 + ("at entry" if at < 0 else "early"))
        early += b
    return early


def conv_padded_input(op) -> int:
    """model="xla" on a GPU: the bytes of the padded copy XLA:GPU makes of a convolution's
    input where the padding of a spatial dimension differs on its two sides (a stride-2
    'SAME' convolution's 0 and 1): cuDNN pads symmetrically only, so XLA moves all of the
    padding into a `pad` of the input, an op of its own just before the convolution (read
    from XLA:GPU's dumps of the conv net on an H200: `loop_pad_fusion` f32[8,33,33,16] of
    an f32[8,32,32,16] input). A convolution with lhs dilation (the gradient of a strided
    one with respect to its input) is cuDNN's backward-input convolution: no pad."""
    dims = conv_dims(op)
    if dims is None:
        return 0
    lhs = dims[0]
    spatial = [d for d in lhs if d.isdigit()]
    n = len(spatial)
    pad = i64s(op, "padding", [0] * (2 * n))
    if any(d != 1 for d in i64s(op, "lhs_dilation", [1] * n)) or all(
            pad[2 * j] == pad[2 * j + 1] for j in range(n)):
        return 0
    t = ir.RankedTensorType(op.operands[0].type)
    shape = list(t.shape)
    if any(d < 0 for d in shape):
        return 0                     # symbolic dimensions: no bytes (as everywhere here)
    for j, d in enumerate(spatial):
        shape[lhs.index(d)] += max(pad[2 * j], 0) + max(pad[2 * j + 1], 0)
    return math.prod(shape) * graph.type_bytes(t) // max(math.prod(t.shape), 1)


def padded_past_input(op, i, root, fused, last, size) -> int:
    """The padded copy of convolution `op` (op `i` of a sweep; conv_padded_input) is made
    in an op of its own, just before it: an input that dies there is freed before the
    result is made, so the copy is live with the input or with the result, never with
    both. Returns the bytes a sweep's input + copy + result counts over that (`root`,
    `fused`, `last`, `size`: the sweep's aliases, fused values, last uses and sizes)."""
    lhs = op.operands[0]
    f = fused.get(lhs)
    reads = [root.get(lhs, lhs)] if f is None else reads_through(f.parts)
    dying = sum(size.get(r, 0) for r in reads
                if last.get(r) == i and not isinstance(r, ir.BlockArgument))
    return min(conv_padded_input(op), dying, graph.type_bytes(op.results[0].type))


def copy_ready_at(value, position) -> int:
    """On a GPU, the first op at which a copy of `value` from host memory may be in flight:
    XLA:GPU starts it as early as it can, at the start for an argument, else right after
    the op that makes it (an optimization barrier holding the host value, as JAX places
    one and annotate-host-offload too). `position`: op -> its index."""
    if isinstance(value, ir.BlockArgument):
        return 0
    return position.get(op_id(value.owner), -1) + 1


def dot_copied(op) -> list:
    """model="xla": the operands XLA copies for a dot_general, those whose dimensions are
    not in the order its matrix kernels take (the left: batch, free, contracting; the
    right: batch, contracting, free; dimensions of size 1 aside), as for attention's heads
    or a batch of vectors times `W.T`: the copies are live while it runs. A matrix (two
    dimensions, no batch) is read transposed where it is (measured: the MLP's gradients
    `x.T @ g` and `g @ W.T` copy nothing). An operand transposed for dots alone
    (`folded_transpose`) is read in its operand's order."""
    out = []
    for side in ("lhs", "rhs"):
        value = op.operands[0 if side == "lhs" else 1]
        shape = ir.RankedTensorType(value.type).shape
        batch = dot_dims(op, side + "_batching_dimensions")
        contract = dot_dims(op, side + "_contracting_dimensions")
        if isinstance(value, ir.OpResult) and folded_transpose(value.owner):
            perm = list(ir.DenseI64ArrayAttr(value.owner.attributes["permutation"]))
            shape = ir.RankedTensorType(value.owner.operands[0].type).shape
            batch, contract = [perm[d] for d in batch], [perm[d] for d in contract]
        if not batch and len(shape) <= 2:
            continue        # a matrix: its kernels read it transposed as it is
        free = [d for d in range(len(shape)) if d not in batch and d not in contract]
        want = batch + (free + contract if side == "lhs" else contract + free)
        if [d for d in want if shape[d] != 1] != [d for d in range(len(shape)) if shape[d] != 1]:
            out.append(value)
    return out


def folded_transpose(op) -> bool:
    """model="xla": is `op` a transpose read by dot_generals alone? XLA folds it into their
    dimension numbers (TransposeFolding, and its simplifier where a permutation also
    reorders the free or the contracting dimensions: measured, the same footprint either
    way): each reads its operand, copied where that is out of its kernels' order
    (`dot_copied`), and the transpose is a view."""
    return op.name == "stablehlo.transpose" and all(
        u.owner.name == "stablehlo.dot_general" for u in op.results[0].uses)


def transposed_dot(op) -> bool:
    """model="xla": is `op` a transpose that XLA folds into the dot_general it reads (the
    dot's only reader; batch dimensions kept in front, the two free parts swapped)? XLA
    computes dot(b, a) in place of transpose(dot(a, b)): the transpose is a view."""
    if op.name != "stablehlo.transpose":
        return False
    src = op.operands[0]
    if isinstance(src, ir.BlockArgument):
        return False
    dot = src.owner
    if dot.name != "stablehlo.dot_general" or len(list(src.uses)) != 1:
        return False
    batch = len(dot_dims(dot, "lhs_batching_dimensions"))
    lhs_rank = len(ir.RankedTensorType(dot.operands[0].type).shape)
    lhs_free = lhs_rank - batch - len(dot_dims(dot, "lhs_contracting_dimensions"))
    rank = len(ir.RankedTensorType(src.type).shape)
    want = (list(range(batch)) + list(range(batch + lhs_free, rank))
            + list(range(batch, batch + lhs_free)))
    return list(ir.DenseI64ArrayAttr(op.attributes["permutation"])) == want


# ops that work on transposed copies of values out of their kernels' order: what each copies
COPIES = {"stablehlo.convolution": conv_copied, "stablehlo.dot_general": dot_copied}


def copied(op) -> list:
    """The values XLA copies into its kernels' order for `op` (`COPIES`; none for others)."""
    return COPIES[op.name](op) if op.name in COPIES else []


def copy_bytes(op) -> int:
    """The bytes of `op`'s transposed copies (`copied`), live while it runs."""
    return sum(graph.type_bytes(v.type) for v in copied(op))


# XLA:GPU's split-K matrix products (read from XLA:GPU's dumps on an H100, jax 0.11.2: the
# `gemm_fusion_dot` partial products in `python -m tools.benchmarks.xla_dump`): a product
# whose output is small beside its contraction is computed as SPLIT_K partial products
# over slices of the contraction, summed afterwards. The partials are scratch memory.
SPLIT_K_MAX_OUTPUT = 65536    # output elements at most
SPLIT_K_MIN_CONTRACTION = 128
SPLIT_K_SLICE = 64            # contraction elements per slice: K // 64 partials ...
SPLIT_K_RANGE = (4, 16)       # ... but at least 4 and at most 16


def split_k_partials(op) -> int:
    """model="xla" on a GPU: the bytes of the partial products XLA:GPU's split-K matrix
    kernels write for a `dot_general` without batch dimensions whose output has at most
    SPLIT_K_MAX_OUTPUT elements and whose contraction has at least SPLIT_K_MIN_CONTRACTION
    (in f32 or wider), live while it runs. The number of partials is what XLA's autotuner
    chose on the measured products (K // 64, within 4..16: exact for 7 of 10 shapes, half
    of it for the other 3); the autotuner measures, so this is an approximation."""
    if dot_dims(op, "lhs_batching_dimensions"):
        return 0
    out = ir.RankedTensorType(op.results[0].type)
    lhs = ir.RankedTensorType(op.operands[0].type).shape
    if any(d < 0 for d in list(out.shape) + list(lhs)):
        return 0                     # symbolic dimensions: no bytes (as everywhere here)
    k = math.prod(lhs[d] for d in dot_dims(op, "lhs_contracting_dimensions"))
    elements = math.prod(out.shape)
    if not 0 < elements <= SPLIT_K_MAX_OUTPUT or k < SPLIT_K_MIN_CONTRACTION:
        return 0
    lo, hi = SPLIT_K_RANGE
    return max(lo, min(hi, k // SPLIT_K_SLICE)) * elements * max(
        4, graph.type_bytes(out) // elements)


@dataclasses.dataclass(eq=False)
class Buffer:
    """One buffer as XLA allocates it: live from op `start` (-1: at entry)
    through op `end`; `value` is the first value it holds (later ones written in place)."""
    start: int
    end: int
    bytes: int
    value: object
    output: bool = False     # holds a result of the function: an output allocation
    placed: bool = False     # a temporary placed inside an output allocation


def lay_out(ops, root, buffers, scratch, n, describe, host_results=frozenset()) -> tuple:
    """A function's peak as XLA's buffer assignment lays its buffers out: (peak, index of
    the op there (-1: entry), bytes after each op, [(bytes, what)] at the peak).

    Each result slot is an output allocation of its own, there for the whole call (the
    caller receives it). A temporary goes into an output allocation that is at least as
    large when it dies before the result held there is made (and does not overlap the
    temporaries already there), largest temporaries first, as XLA tries its existing
    allocations before the heap; the others share the heap, which peaks where the most
    of them are live. The arguments are held as the sweep found (kept or donated). A result
    slot in host memory (`host_results`) takes no device memory."""
    outputs, copies, seen = [], [], set()
    for k, v in enumerate(ops[-1].operands):
        if k in host_results:
            continue
        r = root.get(v, v)
        buf = buffers.get(r)
        if r in seen or isinstance(r, ir.BlockArgument) or buf is None:
            # a further slot of a value, a returned argument or a literal: copied
            b = buf.bytes if buf is not None else (
                graph.type_bytes(r.type) if isinstance(r, ir.BlockArgument)
                or r.owner.name == "stablehlo.constant" else 0)
            what = (f"{r.type} argument #{r.arg_number}, copied to a result"
                    if isinstance(r, ir.BlockArgument) else
                    f"{describe(r)}, copied to a further result")
            if b:
                copies.append((b, what))
        elif not buf.output:
            buf.output = True
            outputs.append(buf)
        seen.add(r)
    unique = list({id(b): b for b in buffers.values()}.values())
    temps = [b for b in unique if not b.output and not isinstance(b.value, ir.BlockArgument)]
    temps += [Buffer(i, i, b, kind) for i, (b, kind) in scratch.items() if kind]
    allocations = sorted(outputs, key=lambda b: -b.bytes)
    held = defaultdict(lambda: ([], []))   # allocation -> (starts, ends) placed, in order
    for t in sorted(temps, key=lambda b: (-b.bytes, b.start)):
        for k, o in enumerate(allocations):
            if o.bytes < t.bytes or k == PLACEMENT_TRIES:
                break
            before = t.end < o.start or (    # or read last where the result is made,
                t.end == o.start and t.bytes == o.bytes    # in place, elementwise
                and o.start >= 0 and ops[o.start].name in ELEMENTWISE)
            starts, ends = held[id(o)]
            j = bisect.bisect_left(starts, t.start)
            if before and (j == 0 or ends[j - 1] < t.start) and (
                    j == len(starts) or t.end < starts[j]):
                starts.insert(j, t.start)
                ends.insert(j, t.end)
                t.placed = True
                break
    heap = [b for b in unique if not b.output and isinstance(b.value, ir.BlockArgument)]
    heap += [t for t in temps if not t.placed]
    heap += [Buffer(i, i, b, "temporaries inside the op") for i, (b, kind)
             in scratch.items() if not kind]   # a loop's, a call's: a heap of its own
    base = sum(o.bytes for o in outputs) + sum(b for b, _ in copies)
    during = [0] * (n + 2)    # (index + 1): bytes live while op index runs, -1: entry
    ending = [0] * (n + 1)    # bytes of heap buffers whose last op is index
    for b in heap:
        end = min(b.end, n - 1)
        during[b.start + 1] += b.bytes
        during[end + 2] -= b.bytes
        if b.end < n:           # (not an argument the caller keeps)
            ending[end + 1] += b.bytes
    peak, peak_index, timeline, now = -1, -1, [], 0
    for k in range(n + 1):     # k = index + 1
        now += during[k]
        if base + now > peak:
            peak, peak_index = base + now, k - 1
        if 1 <= k < n:
            timeline.append(base + now - ending[k])
    at_peak = [(o.bytes, f"{describe(o.value)}, in an output buffer") for o in outputs]
    at_peak += copies
    at_peak += [(b.bytes, b.value) for b in heap if b.start <= peak_index <= b.end]
    return peak, peak_index, timeline, sorted(at_peak, key=lambda t: -t[0])
