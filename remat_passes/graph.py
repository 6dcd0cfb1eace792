"""Dataflow view of one function body, shared by every pass.

It answers the questions the passes ask about a `func.func` whose body is one
block of StableHLO: which ops are backward (depend on a cotangent), which
region chain (`remat[N]` frames) an op sits in, where in the source it came
from, what JAX calls it, which values an op reads (operands and values its
nested regions capture), how many bytes a value has, and whether an op may be
duplicated.
"""
from __future__ import annotations

import re

from remat_passes.mlir import RematError, ir, op_id

COTANGENT_ATTR = "remat.cotangent"
GRADIENT_RESULT_ATTR = "remat.gradient"
RECOMPUTE_ATTR = "remat.recompute"
REGION_FRAME_RE = re.compile(r"remat\[\d+\]")

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


# ------------------------------------------------------------- op questions --
def op_name(op) -> str:
    return op.operation.name


def _own_side_effect(op) -> bool:
    if op.name in SIDE_EFFECT_OPS:
        return True
    if op.name == "stablehlo.custom_call" and "has_side_effect" in op.attributes:
        return str(op.attributes["has_side_effect"]) == "true"
    if op.name.startswith("func.") or op.name.startswith("sdy."):
        return op.name not in ("func.return",)
    return False


def is_side_effecting(op) -> bool:
    """Must this op (or anything nested in its regions) never be duplicated?"""
    op = op.operation
    if _own_side_effect(op):
        return True
    if len(op.regions) == 0:
        return False
    found = []

    def visit(inner):
        if _own_side_effect(inner):
            found.append(inner)
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE
    op.walk(visit)
    return bool(found)


def marker_name(op) -> str | None:
    """The checkpoint name if `op` is the `@remat.name` marker."""
    op = op.operation
    if op.name != "stablehlo.custom_call":
        return None
    if str(op.attributes["call_target_name"]) != '"remat.name"':
        return None
    if "backend_config" not in op.attributes:
        return ""
    try:
        return ir.StringAttr(op.attributes["backend_config"]).value
    except ValueError:
        return str(op.attributes["backend_config"])


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


def region_chain(op, scope_re: re.Pattern | None = None) -> tuple[str, ...]:
    """The checkpoint regions the op sits in, outermost first.

    A region is a `remat[N]` frame (made by `remat_passes.checkpoint`) or a
    frame matching `scope_re` (a user option that turns name scopes, e.g.
    Flax module paths, into regions). Regions are identified by their path.
    """
    stack = name_stack(op)
    if scope_re is None and "remat[" not in stack:
        return ()
    chain = []
    path = []
    for frame in _frames(stack):
        path.append(frame)
        if REGION_FRAME_RE.fullmatch(frame) or (scope_re is not None and scope_re.search(frame)):
            chain.append("/".join(path))
    return tuple(chain)


def region_key(region_path: str) -> str:
    """The last frame of a region path: how its policy is recorded."""
    return region_path.rsplit("/", 1)[-1]


# ------------------------------------------------------------------ values --
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


def replace_reads(op, old, new) -> None:
    """Replace every read of `old` by `op` (operands and nested captures)."""
    op = op.operation

    def visit(inner):
        inner.replace_uses_of_with(old, new)
        return ir.WalkResult.ADVANCE
    op.walk(visit)


_ELEM_BITS = {"i1": 8, "pred": 8}


def element_bits(elem: str) -> int:
    if elem in _ELEM_BITS:
        return _ELEM_BITS[elem]
    m = re.fullmatch(r"complex<(.*)>", elem)
    if m:
        return 2 * element_bits(m.group(1))
    m = re.search(r"(\d+)", elem)
    if m:
        bits = int(m.group(1))
        return max(bits, 8) if elem.startswith(("f", "bf", "i", "ui", "si")) else bits
    return 32


def type_bytes(t) -> int:
    """Bytes of a ranked tensor type; 0 for tokens and other non-tensors."""
    try:
        rt = ir.RankedTensorType(t)
    except (ValueError, TypeError):
        return 0
    n = 1
    for d in rt.shape:
        n *= max(d, 0)
    return n * element_bits(str(rt.element_type)) // 8


_JAX_DTYPE = {"i1": "bool", "complex<f32>": "c64", "complex<f64>": "c128"}


def jax_type_str(t) -> str:
    """JAX's short form of a tensor type: tensor<5x4xf32> -> f32[5,4]."""
    try:
        rt = ir.RankedTensorType(t)
    except (ValueError, TypeError):
        return str(t)
    elem = str(rt.element_type)
    elem = _JAX_DTYPE.get(elem, elem)
    if elem.startswith("ui"):
        elem = "u" + elem[2:]
    return f"{elem}[{','.join(str(d) for d in rt.shape)}]"


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
                         "to rewrite")
    return funcs[name]


def func_name(func_op) -> str:
    return ir.StringAttr(func_op.operation.attributes["sym_name"]).value


def body_block(func_op):
    return func_op.regions[0].blocks[0]


def _attr_dict(func_op, which: str, index: int):
    """Entry `index` of the function's "arg_attrs" / "res_attrs", or None."""
    attrs = func_op.operation.attributes
    if which not in attrs:
        return None
    arr = ir.ArrayAttr(attrs[which])
    return ir.DictAttr(arr[index]) if index < len(arr) else None


def arg_attr_names(func_op, index: int) -> set[str]:
    d = _attr_dict(func_op, "arg_attrs", index)
    return set() if d is None else {d[i].name for i in range(len(d))}


def result_attr_names(func_op, index: int) -> set[str]:
    d = _attr_dict(func_op, "res_attrs", index)
    return set() if d is None else {d[i].name for i in range(len(d))}


def attr_value(func_op, which: str, index: int, name: str):
    """Attribute `name` of argument/result `index` ("arg_attrs"/"res_attrs"), or None."""
    d = _attr_dict(func_op, which, index)
    return d[name] if d is not None and name in d else None


def arg_name(func_op, index: int) -> str:
    """The argument's name from its location (JAX writes loc("W1")), else argN."""
    arg = body_block(func_op).arguments[index]
    m = re.match(r'^loc\("((?:[^"\\]|\\.)*)"\)$', str(arg.location))
    return m.group(1) if m else f"arg{index}"


def backward_ops(func_op, cotangent_indices=None) -> tuple[set, str]:
    """The ids (`op_id`) of the backward (cotangent-dependent) top-level ops, and how
    they were found.

    In order: arguments with `remat.cotangent` (or `cotangent_indices`), then
    JAX name stacks (`transpose(` frames), else an error saying how to mark them.
    """
    block = body_block(func_op)
    nargs = len(block.arguments)
    if cotangent_indices is None:
        cotangent_indices = [i for i in range(nargs) if COTANGENT_ATTR in arg_attr_names(func_op, i)]
        how = "remat.cotangent arguments"
    else:
        how = "cotangent indices option"
    for i in cotangent_indices:
        if not 0 <= i < nargs:
            raise RematError(f"error: cotangent argument index {i} is out of range "
                             f"(@{func_name(func_op)} has {nargs} arguments)")
    ops = [op for op in block.operations]
    seeds_values = {block.arguments[i] for i in cotangent_indices}
    by_name = not seeds_values
    if by_name:
        how = "JAX name stacks (transpose frames)"
        if not any("transpose(" in name_stack(op) for op in ops):
            raise RematError(
                f"error: cannot tell forward from backward in @{func_name(func_op)}: no argument "
                f"carries the '{COTANGENT_ATTR}' attribute and no op location has a JAX "
                "'transpose(' name-stack frame. Mark the cotangent arguments with "
                f"{{{COTANGENT_ATTR}}} (remat_passes.export_vjp does this), or pass "
                "cotangent-args=<i,j,...> to remat-partial-eval.")
    # Forward sweep: everything that depends on a cotangent is backward.
    backward = set()
    bvalues = set(seeds_values)
    body = [op.operation for op in ops if op.operation.name != "func.return"]
    for op in body:
        if (by_name and "transpose(" in name_stack(op)) or RECOMPUTE_ATTR in op.attributes \
                or any(v in bvalues for v in read_values(op)):
            backward.add(op_id(op))
            bvalues.update(op.results)
    # Reverse sweep: JAX also puts work that needs no cotangent under transpose
    # frames (the reversed kernel of a conv transpose, the 1/N of a mean's
    # gradient, zero gradients). It belongs to the backward too, as long as no
    # forward op reads it; then it reads residuals instead of becoming one.
    for op in reversed(body):
        oid = op_id(op)
        if oid in backward or "transpose(" not in name_stack(op):
            continue
        users = [use.owner.operation for r in op.results for use in r.uses]
        if all(u.name == "func.return" or top_level_id(u, block) in backward for u in users):
            backward.add(oid)
    return backward, how


def top_level_op(op, block):
    """The op of `block` that contains `op` (itself if at top level)."""
    op = op.operation
    while op.parent is not None and op.block != block:
        op = op.parent.operation
    return op


def top_level_id(op, block) -> int:
    return op_id(top_level_op(op, block))


# -------------------------------------------------- after remat-partial-eval --
RESIDUAL_ATTR = "remat.residual"    # result attribute of <f>_fwd: the residual's description
OFFLOAD_ATTR = "remat.offload"      # "src:dst" on the producer / <f>_fwd result / <f>_bwd argument


def function_names(module) -> list[str]:
    return [func_name(op) for op in module.body.operations if op.operation.name == "func.func"]


def is_split(module, name: str) -> bool:
    """Has remat-partial-eval{mode=split} turned @name into @name_fwd / @name_bwd?"""
    names = function_names(module)
    return f"{name}_fwd" in names and f"{name}_bwd" in names


def split_residuals(fwd_op) -> list[tuple[int, object]]:
    """(result index, value) of every residual that @<f>_fwd returns."""
    block = body_block(fwd_op)
    ret = list(block.operations)[-1].operation
    return [(i, v) for i, v in enumerate(ret.operands) if RESIDUAL_ATTR in result_attr_names(fwd_op, i)]


def joint_residuals(func_op) -> list:
    """Forward values (arguments first, then in program order) read by backward ops."""
    backward, _ = backward_ops(func_op)
    block = body_block(func_op)
    cotangents = {block.arguments[i] for i in range(len(block.arguments))
                  if COTANGENT_ATTR in arg_attr_names(func_op, i)}
    read = set()
    for op in block.operations:
        if op_id(op) in backward:
            read.update(read_values(op))
    values = [a for a in block.arguments if a in read and a not in cotangents]
    for op in block.operations:
        if op_id(op) not in backward:
            values.extend(r for r in op.operation.results if r in read)
    return values


def set_attr_entry(func_op, which: str, index: int, name: str, value) -> None:
    """Set attribute `name` on argument/result `index` ("arg_attrs"/"res_attrs")."""
    attrs = func_op.operation.attributes
    count = len(func_op.type.inputs if which == "arg_attrs" else func_op.type.results)
    old = list(ir.ArrayAttr(attrs[which])) if which in attrs else []
    old += [ir.DictAttr.get({})] * (count - len(old))
    d = ir.DictAttr(old[index])
    entries = {d[j].name: d[j].attr for j in range(len(d))}
    entries[name] = value
    old[index] = ir.DictAttr.get(entries)
    attrs[which] = ir.ArrayAttr.get(old)
