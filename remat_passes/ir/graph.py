"""Questions about single ops, values and functions of StableHLO (no analysis state).

Which values an op reads (operands and values its nested regions capture),
whether it may be duplicated, what JAX calls it and where in the source it came
from, which checkpoint scopes (`remat[N]` frames) its name stack puts it in,
how many bytes a value has, and how to find functions and their parts. The
analysis of a whole function (`analysis.FunctionAnalysis`) is built from these.
"""
from __future__ import annotations

import re

import numpy as np

from remat_passes.ir.mlir import RematError, ir

SCOPE_FRAME_RE = re.compile(r"remat\[\d+\]")

# Ops that must never be duplicated, whatever the policy says.
SIDE_EFFECT_OPS = {
    "stablehlo.infeed", "stablehlo.outfeed", "stablehlo.send", "stablehlo.recv",
    "stablehlo.all_reduce", "stablehlo.all_gather", "stablehlo.all_to_all",
    "stablehlo.reduce_scatter", "stablehlo.collective_permute",
    "stablehlo.collective_broadcast", "stablehlo.cross-replica-sum",
    "stablehlo.after_all", "stablehlo.create_token",
    "stablehlo.rng",  # random: a recomputation would draw different numbers
    "stablehlo.replica_id", "stablehlo.partition_id",
}
# Shardy ops that only annotate a value (its sharding): pure, they follow the policy like
# any op (a clone keeps its `sharding` attribute). GSPMD's annotations are custom_calls
# without side effect (@Sharding, @SPMDFullToShardShape, ...), pure already.
PURE_SDY_OPS = {"sdy.sharding_constraint", "sdy.reshard"}
# shard_map's region op. Inside it every device runs the same program, so its collectives
# can be run again in lockstep (jax.checkpoint recomputes them too): a manual computation
# is side-effecting only if its body has another side effect.
MANUAL_COMPUTATION = "sdy.manual_computation"
CASE = "stablehlo.case"
WHILE = "stablehlo.while"
COLLECTIVE_OPS = {
    "stablehlo.all_reduce", "stablehlo.all_gather", "stablehlo.all_to_all",
    "stablehlo.reduce_scatter", "stablehlo.collective_permute",
    "stablehlo.collective_broadcast"}


# GSPMD's shard_map: its body (a call, inlined) runs on values these custom calls make
# manual (per-device shapes) and turn back into global ones.
SPMD_FULL_TO_SHARD = "SPMDFullToShardShape"
SPMD_SHARD_TO_FULL = "SPMDShardToFullShape"
# Where shape computations start: ops that read no value, or only a value's shape.
SHAPE_SOURCES = ("stablehlo.constant", "stablehlo.get_dimension_size", "stablehlo.iota")


# ------------------------------------------------------------- op questions --
def op_name(op) -> str:
    return op.operation.name


def custom_call_target(op) -> str | None:
    """The call_target_name of a `stablehlo.custom_call`, else None."""
    op = op.operation
    if op.name != "stablehlo.custom_call":
        return None
    return ir.StringAttr(op.attributes["call_target_name"]).value


def _own_side_effect(op) -> bool:
    if op.name in SIDE_EFFECT_OPS:
        return True
    if op.name == "stablehlo.custom_call" and "has_side_effect" in op.attributes:
        return str(op.attributes["has_side_effect"]) == "true"
    if op.name.startswith("func.") or op.name.startswith("sdy."):
        return op.name not in ("func.return",) and op.name not in PURE_SDY_OPS
    return False


def is_side_effecting(op) -> bool:
    """Must this op (or anything nested in its regions) never be duplicated?"""
    op = op.operation
    manual = op.name == MANUAL_COMPUTATION
    if not manual and _own_side_effect(op) and not _rerun_in_lockstep(op):
        return True
    if len(op.regions) == 0:
        return False
    found = []

    def visit(inner):
        # (a shard_map nested in the op is a computation like any other: what its body
        # runs decides; a collective there runs again in lockstep, `_rerun_in_lockstep`)
        if inner.name in (MANUAL_COMPUTATION, "sdy.return") or (
                manual and inner.name in COLLECTIVE_OPS):
            return ir.WalkResult.ADVANCE
        if _own_side_effect(inner) and not _rerun_in_lockstep(inner):
            found.append(inner)
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE
    op.walk(visit)
    return bool(found)


def _rerun_in_lockstep(op) -> bool:
    """Is `op` a collective of a manual computation's body (a shard_map's) that a
    recomputation may run again, as every device runs the body again in lockstep: at its
    top level or in a cond's branch there. (One in a loop body keeps the loop whole, as the
    scan rules and segment-scans take such a loop.)"""
    if op.name not in COLLECTIVE_OPS:
        return False
    enclosing = (p.name for p in ancestors(op) if p.name in (MANUAL_COMPUTATION, WHILE))
    return next(enclosing, None) == MANUAL_COMPUTATION


def shape_rule(op) -> bool | None:
    """Is `op` part of a shape computation (values from constants, iotas and dimension
    sizes alone)? True for a source, False for an op that never is (regions, side effects,
    no operands), None when it is exactly if all its operands are."""
    if op.name in SHAPE_SOURCES:
        return True
    if len(op.regions) or not len(op.operands) or is_side_effecting(op):
        return False
    return None


# ----------------------------------------------------------- location facts --
_NAME_LOC_RE = re.compile(r'^loc\("((?:[^"\\]|\\.)*)"\(')
_CALLEE_RE = re.compile(r'"((?:[^"\\]|\\.)*)"\("((?:[^"\\]|\\.)*)":(\d+):(\d+)')
_FILE_RE = re.compile(r'"((?:[^"\\]|\\.)*)":(\d+):(\d+)')


def name_stack(op) -> str:
    """JAX's name stack from the op's NameLoc, e.g. 'jit(f)/jvp(remat[1])/sin'."""
    loc = op.operation.location
    if isinstance(loc, ir.NameLoc):
        return loc.name_str
    m = _NAME_LOC_RE.match(str(loc))
    return m.group(1) if m else ""


def jax_primitive(op) -> str:
    """JAX's word for the op ('sin'); the StableHLO op name ('sine') when unknown."""
    stack = name_stack(op)
    if stack:
        return stack.rsplit("/", 1)[-1]
    return op_name(op).split(".", 1)[-1]


def accumulates(op) -> bool:
    """Is `op` JAX's `add_any`, which sums cotangents? A weight gradient summed over a
    sharded batch is a partial sum until XLA's partitioner reduces it; tying such a value to
    a recomputation (a barrier) makes the partitioner reduce each part on its own."""
    return op.operation.name == "stablehlo.add" and jax_primitive(op) == "add_any"


def _innermost_frame(loc):
    """(FileLineColLoc, function name) of the first callee frame, or (None, '')."""
    fn = ""
    for _ in range(64):  # locations nest a handful of levels deep
        if isinstance(loc, ir.NameLoc):
            if fn == "" and loc.name_str and not loc.name_str.startswith(("jit(", "pjit(")) \
                    and "/" not in loc.name_str:
                fn = loc.name_str
            loc = loc.child_loc
        elif isinstance(loc, ir.CallSiteLoc):
            loc = loc.callee
        elif isinstance(loc, ir.FileLineColLoc):
            return loc, fn
        else:
            return None, fn
    return None, fn


def source_position(op) -> tuple[str, str]:
    """('FILE:LINE:COL', 'function') of the innermost user frame; '' when unknown."""
    loc, fn = _innermost_frame(op.operation.location)
    if loc is None:
        return "", ""
    if loc.filename == "-":   # text parsed from a string or stdin
        return f"line {loc.start_line}", fn
    return f"{loc.filename}:{loc.start_line}:{loc.start_col}", fn


_WRAPPER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\((.*)\)")


def _frames(stack: str) -> list[str]:
    """Name-stack frames with transform wrappers removed.

    'jit(f)/transpose(jvp(remat[1]))/remat[2]/mul' -> ['f', 'remat[1]', 'remat[2]']
    (the last component, the primitive, is dropped).
    """
    parts = stack.split("/")[:-1]
    frames = []
    for part in parts:
        inner = part
        while True:
            m = _WRAPPER_RE.fullmatch(inner)
            if not m:
                break
            inner = m.group(1)
        frames.extend(f for f in inner.split("/") if f)
    return frames


def scope_chain(op, scope_re: re.Pattern | None = None) -> tuple[str, ...]:
    """The checkpoint scopes the op sits in, outermost first (see scope_chain_of_stack)."""
    return scope_chain_of_stack(name_stack(op), scope_re)


def scope_chain_of_stack(stack: str, scope_re: re.Pattern | None = None) -> tuple[str, ...]:
    """The checkpoint scopes of a name stack, outermost first.

    A checkpoint scope (what the user docs call a checkpoint region; "scope"
    here, so it is not taken for an MLIR region) is a `remat[N]` frame (made by
    `remat_passes.checkpoint`) or a frame matching `scope_re` (the
    `region-regex` option, which turns name scopes, e.g. Flax module paths, into
    checkpoint regions). Scopes are identified by their path.
    """
    if scope_re is None and "remat[" not in stack:
        return ()
    chain = []
    path = []
    for frame in _frames(stack):
        path.append(frame)
        if SCOPE_FRAME_RE.fullmatch(frame) or (scope_re is not None and scope_re.search(frame)):
            chain.append("/".join(path))
    return tuple(chain)


def scope_key(scope_path: str) -> str:
    """The last frame of a scope path: how its policy is recorded."""
    return scope_path.rsplit("/", 1)[-1]


# ------------------------------------------------------------------ values --
def post_order(root, memo: dict, step):
    """Evaluate `root` over the values it depends on, operands first, with a worklist (no
    recursion: chains are 100k ops long). `step(v)` either stores `memo[v]` and returns
    nothing, or returns the values (not yet in `memo`) it needs first; it is called again
    for `v` once they are in. Returns `memo[root]`."""
    stack = [root]
    while stack:
        v = stack[-1]
        if v in memo:
            stack.pop()
            continue
        pending = step(v)
        if pending:
            stack.extend(pending)
        else:
            stack.pop()
    return memo[root]


def ancestors(op):
    """The ops `op` is nested in, innermost first (its function and module last)."""
    parent = op.parent
    while parent is not None:
        yield parent
        parent = parent.parent


def nested_ops(block):
    """Every op of `block` and of the blocks nested in it, each op before the ops of its
    regions, blocks in order (a worklist: no recursion)."""
    stack = [iter(block.operations)]
    while stack:
        op = next(stack[-1], None)
        if op is None:
            stack.pop()
            continue
        op = op.operation
        yield op
        blocks = [b for region in op.regions for b in region.blocks]
        stack.extend(iter(b.operations) for b in reversed(blocks))


def module_of(op):
    """The outermost op holding `op` (its module)."""
    op = op.operation
    while op.parent is not None:
        op = op.parent.operation
    return op


def top_level(op, container):
    """The op directly inside `container` (an op, e.g. a func) that is or contains `op`."""
    while op.parent is not None and op.parent != container:
        op = op.parent
    return op


def backward_starts(ops, is_backward) -> list:
    """i -> the first op after ops[i] that `is_backward` says is one of the backward's (not
    the return), or None: for every op of a block in one sweep."""
    out = [None] * len(ops)
    for i in range(len(ops) - 1, 0, -1):
        op = ops[i]
        out[i - 1] = op if op.name != "func.return" and is_backward(op) else out[i]
    return out


def read_values(op) -> list:
    """Operands of `op` plus the outer values its nested regions capture (no duplicates)."""
    op = op.operation
    values = list(dict.fromkeys(op.operands))
    if len(op.regions) == 0:
        return values
    inner_defs = set()
    captured = []

    def visit(inner):
        if inner is not op:
            for r in inner.results:
                inner_defs.add(r)
        for region in inner.regions:
            for block in region.blocks:
                for a in block.arguments:
                    inner_defs.add(a)
        return ir.WalkResult.ADVANCE
    op.walk(visit, ir.WalkOrder.PRE_ORDER)

    def collect(inner):
        if inner is not op:
            for v in inner.operands:
                if v not in inner_defs:
                    captured.append(v)
        return ir.WalkResult.ADVANCE
    op.walk(collect)
    return list(dict.fromkeys(values + captured))


def replace_reads_all(ops, mapping: dict) -> None:
    """In every op of `ops`, read mapping[v] instead of v (operands and nested captures),
    in time linear in the operands (one dict lookup each)."""
    for op in ops:
        op = op.operation
        if len(op.regions):
            for old in read_values(op):
                if old in mapping:
                    replace_reads(op, old, mapping[old])
            continue
        operands = op.operands
        for k, v in enumerate(operands):
            new = mapping.get(v)
            if new is not None:
                operands[k] = new


def clone_ops(ops, ip, mapping: dict) -> dict:
    """Copies of `ops` (in program order) at insertion point `ip`, each reading the copies
    of the ops before it and `mapping[v]` for any other value v mapped; returns `mapping`
    with each old result mapped to its copy."""
    for op in ops:
        clone = op.clone(ip=ip)
        replace_reads_all([clone], mapping)
        for old, new in zip(op.results, clone.results):
            mapping[old] = new
    return mapping


def ops_named(op, name: str) -> list:
    """The ops called `name` inside `op` (and `op` itself if it is one), in walk order."""
    found = []

    def visit(inner):
        if inner.name == name:
            found.append(inner)
        return ir.WalkResult.ADVANCE
    op.operation.walk(visit)
    return found


def replace_reads(op, old, new) -> None:
    """Replace every read of `old` by `op` (operands and nested captures)."""
    op = op.operation
    if len(op.regions) == 0:
        op.replace_uses_of_with(old, new)
        return

    def visit(inner):
        inner.replace_uses_of_with(old, new)
        return ir.WalkResult.ADVANCE
    op.walk(visit)


_ELEM_BITS = {"i1": 8, "pred": 8}
# The JAX (NumPy, ml_dtypes) name of each element type JAX has a dtype for.
DTYPE_NAMES = {
    "f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64", "i1": "bool_",
    "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64", "ui8": "uint8",
    "ui16": "uint16", "ui32": "uint32", "ui64": "uint64", "complex<f32>": "complex64",
    "complex<f64>": "complex128", "f8E4M3FN": "float8_e4m3fn", "f8E5M2": "float8_e5m2",
    "f8E4M3": "float8_e4m3", "f8E3M4": "float8_e3m4", "f8E4M3FNUZ": "float8_e4m3fnuz",
    "f8E5M2FNUZ": "float8_e5m2fnuz", "f8E4M3B11FNUZ": "float8_e4m3b11fnuz",
    "f8E8M0FNU": "float8_e8m0fnu", "f4E2M1FN": "float4_e2m1fn", "i4": "int4", "ui4": "uint4",
    "i2": "int2", "ui2": "uint2"}
# Element widths XLA packs several to a byte (int4, uint4, int2, uint2, float4_e2m1fn:
# 1024 of them take 512 or 256 bytes in memory_analysis(), jaxlib 0.10.2 and 0.12, XLA:CPU).
PACKED_BITS = (4, 2)


def element_bits(elem: str) -> int:
    if elem in _ELEM_BITS:
        return _ELEM_BITS[elem]
    m = re.fullmatch(r"complex<(.*)>", elem)
    if m:
        return 2 * element_bits(m.group(1))
    m = re.search(r"(\d+)", elem)
    if m:
        bits = int(m.group(1))
        if bits in PACKED_BITS:
            return bits
        return max(bits, 8) if elem.startswith(("f", "bf", "i", "ui", "si")) else bits
    return 32


def shape_and_element(t):
    """(shape, element type) of a ranked tensor type, a dynamic dimension None; None for
    another type (a token)."""
    try:
        rt = ir.RankedTensorType(t)
    except (ValueError, TypeError):
        return None
    return (tuple(None if rt.is_dynamic_dim(i) else d for i, d in enumerate(rt.shape)),
            str(rt.element_type))


def type_elements(t) -> int:
    """Elements of a ranked tensor type (dynamic dimensions count 0); 0 for non-tensors."""
    try:
        rt = ir.RankedTensorType(t)
    except (ValueError, TypeError):
        return 0
    n = 1
    for d in rt.shape:
        n *= max(d, 0)
    return n


def type_bytes(t) -> int:
    """Bytes of a ranked tensor type; 0 for tokens and other non-tensors."""
    n = type_elements(t)
    return (n * element_bits(str(ir.RankedTensorType(t).element_type)) + 7) // 8 if n else 0


def zeros_attr(t) -> ir.Attribute:
    """The dense splat of zeros of tensor type `t`, whatever its element type (integer,
    float, complex: the bindings have no attribute for one complex element, nor parse a
    complex splat, so it is made from one NumPy zero)."""
    t = ir.RankedTensorType(t)
    elem = str(t.element_type)
    if elem.startswith("complex<"):
        dtype = np.complex128 if elem == "complex<f64>" else np.complex64
        return ir.DenseElementsAttr.get(np.zeros((1,), dtype), type=t)
    if elem.startswith(("i", "ui", "si")):
        return ir.DenseElementsAttr.get_splat(t, ir.IntegerAttr.get(t.element_type, 0))
    return ir.DenseElementsAttr.get_splat(t, ir.FloatAttr.get(t.element_type, 0.0))


def is_static_float(v) -> bool:
    """Is value `v` a floating-point tensor of static shape?"""
    try:
        t = ir.RankedTensorType(v.type)
    except (ValueError, TypeError):
        return False
    return t.has_static_shape and str(t.element_type).startswith(("f", "bf"))


_JAX_DTYPE = {"i1": "bool", "complex<f32>": "c64", "complex<f64>": "c128"}


def jax_type_str(t) -> str:
    """JAX's short form of a tensor type: tensor<5x4xf32> -> f32[5,4] (a dynamic dimension,
    as a symbolic-shape export has, prints as `?`)."""
    try:
        rt = ir.RankedTensorType(t)
    except (ValueError, TypeError):
        return str(t)
    elem = str(rt.element_type)
    elem = _JAX_DTYPE.get(elem, elem)
    if elem.startswith("ui"):
        elem = "u" + elem[2:]
    dims = ["?" if rt.is_dynamic_dim(i) else str(d) for i, d in enumerate(rt.shape)]
    return f"{elem}[{','.join(dims)}]"


def dynamic_unit_bytes(t) -> int | None:
    """For a tensor type with dynamic dimensions: its bytes per unit of their product (the
    static dimensions times the element size); None for a static type."""
    try:
        rt = ir.RankedTensorType(t)
    except (ValueError, TypeError):
        return None
    if rt.has_static_shape:
        return None
    n = 1
    for i, d in enumerate(rt.shape):
        if not rt.is_dynamic_dim(i):
            n *= d
    return (n * element_bits(str(rt.element_type)) + 7) // 8


# -------------------------------------------------------------- functions --
def find_func(module: ir.Module, name: str):
    funcs = {}
    for op in module.body.operations:
        if op.operation.name == "func.func":
            funcs[ir.StringAttr(op.operation.attributes["sym_name"]).value] = op
    if name not in funcs:
        listing = ", ".join(f"@{n}" for n in funcs) or "none"
        raise RematError(f"error: no function @{name} in the module (functions: {listing})")
    if len(funcs[name].regions[0].blocks) == 0:
        raise RematError(f"error: @{name} is a declaration without a body; there is nothing "
                         "to rewrite", funcs[name].location)
    return funcs[name]


def func_name(func_op) -> str:
    return ir.StringAttr(func_op.operation.attributes["sym_name"]).value


def function_names(module) -> list[str]:
    return [func_name(op) for op in module.body.operations if op.operation.name == "func.func"]


def is_public(func_op) -> bool:
    attrs = func_op.operation.attributes
    if "sym_visibility" not in attrs:
        return True
    return ir.StringAttr(attrs["sym_visibility"]).value == "public"


def body_block(func_op):
    return func_op.regions[0].blocks[0]


def terminator(block):
    """The last op of a block (`func.return`, a loop body's `stablehlo.return`), in O(1)."""
    return ir.InsertionPoint.at_block_terminator(block).ref_operation.operation


def arg_name(func_op, index: int) -> str:
    """The argument's name from its location (JAX writes loc("W1")), else argN."""
    arg = body_block(func_op).arguments[index]
    m = re.match(r'^loc\("((?:[^"\\]|\\.)*)"\)$', str(arg.location))
    return m.group(1) if m else f"arg{index}"


def is_split(module, name: str) -> bool:
    """Has remat-partial-eval{mode=split} turned @name into @name_fwd / @name_bwd?"""
    names = function_names(module)
    return f"{name}_fwd" in names and f"{name}_bwd" in names


def retype(func_op) -> None:
    """Set `func_op`'s type to what its body now takes and returns (its block's arguments,
    its return's operands), after a rewrite changed them."""
    block = body_block(func_op)
    func_op.operation.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(
        [a.type for a in block.arguments], [v.type for v in terminator(block).operands]))


def attributes(op) -> dict:
    """`op`'s attributes by name, to give a new op made in its place."""
    return {name: op.attributes[name] for name in list(op.attributes)}


def functions_of(module, name: str) -> list[str]:
    """The functions @name stands for: @name_fwd and @name_bwd where it is split, else it."""
    return [f"{name}_fwd", f"{name}_bwd"] if is_split(module, name) else [name]


def main_signature(module_op) -> str | None:
    """The printed type of @main, to tell whether a rewrite changed the calling convention."""
    for op in module_op.body.operations:
        if op.operation.name == "func.func" and func_name(op) == "main":
            return str(op.type)
    return None


def erase_unused(ops, keep) -> list[int]:
    """Erase the ops of `ops` (in program order) whose results nothing uses, unless
    `keep(i)` for op i, in one reverse sweep: a dead op's operands are visited after it
    is gone. Returns the indices of the erased ops (which must not be touched again)."""
    erased = []
    for i in range(len(ops) - 1, -1, -1):
        op = ops[i].operation
        if any(next(iter(r.uses), None) is not None for r in op.results) or keep(i):
            continue
        op.erase()
        erased.append(i)
    return erased


def erase_unused_in_block(block, keep=is_side_effecting) -> None:
    """Erase the ops of `block` whose results nothing uses, unless `keep(op)` (by default:
    side-effecting ones); its terminator stays."""
    ops = list(block.operations)[:-1]
    erase_unused(ops, lambda i: keep(ops[i].operation))
