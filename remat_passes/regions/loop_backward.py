"""A backward pass inside a loop body, a cond branch or a shard_map body: the remat pipeline
per body.

A training step that accumulates gradients over microbatches runs `jax.grad` inside a
`lax.scan` (or `fori_loop`): the function's own top level has no backward pass, each
iteration of the loop body has one, a forward and its backward. The memory remat saves is
that of one microbatch's activations, inside the body. A data-parallel step written with
`jax.shard_map` around `jax.grad` (the gradients averaged with `lax.pmean` in the body) is
the same under Shardy: the backward runs inside the body of the `sdy.manual_computation`,
on each device's shard. (Under GSPMD the body is a function that `inline` puts at the top
level, between the custom calls that enter and leave the manual region: nothing to do.) A
step that runs `jax.grad` inside a branch of `lax.cond` or `lax.switch` (a model of two
updated in turn, a step skipped on a condition) has its backward in that branch of the
`stablehlo.case`.

`outline(module_op, func_op, bodies)` moves each such body into a private function of its
own (`@<func>_loop<k>`, `@<func>_cond<k>` or `@<func>_shard_map<k>`, its arguments the
body's block arguments (a branch has none) and then the values it reads from outside; the
constants it reads are copied in), and
leaves a `func.call` of it in the body. The `outline-loop-backwards` pass does that; the
passes after it run on each of those functions as on a function with its own backward, and
the `inline` pass puts the bodies back.

A body counts when one of its own ops has a JAX `transpose(` name-stack frame (what
remat-partial-eval reads the backward from, see `analysis.function`). The search starts
at the function's top level and goes into the bodies that have none (a loop over epochs
around one over microbatches, a loop inside a shard_map body), not into a body it outlines.
"""
from __future__ import annotations

from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import ir

WHILE = "stablehlo.while"
CASE = "stablehlo.case"               # (lax.cond, lax.switch)
MANUAL = "sdy.manual_computation"     # (a shard_map under Shardy)
KINDS = {WHILE: "loop", CASE: "cond", MANUAL: "shard_map"}


def _transposed(block) -> bool:
    return any("transpose(" in graph.name_stack(op.operation) for op in block.operations)


def has_own_backward(func_op) -> bool:
    """Does the function's own top level run a backward pass (or take cotangents)?"""
    return bool(contract.cotangent_args(func_op)) or _transposed(graph.body_block(func_op))


def kind(body) -> str:
    """What holds `body`: "loop", "cond" or "shard_map"."""
    return KINDS[body.owner.name]


def _bodies(op) -> list:
    """The blocks of `op` a backward pass can run in: a loop's body (not its condition), a
    shard_map's body, each branch of a case."""
    if op.name == WHILE:
        return [op.regions[1].blocks[0]]
    if op.name in KINDS:
        return [region.blocks[0] for region in op.regions]
    return []


def loop_bodies(func_op) -> list:
    """The body blocks of the loops, cond branches and shard_maps whose own ops run a
    backward pass (see the module docstring), in program order; none where the function's
    top level has one."""
    if has_own_backward(func_op):
        return []
    found, pending = [], [graph.body_block(func_op)]
    while pending:
        block = pending.pop(0)
        for op in block.operations:
            for body in _bodies(op.operation):
                (found if _transposed(body) else pending).append(body)
    return found


def outline(module_op, func_op, bodies: list) -> list[tuple]:
    """Move each of `bodies` (`loop_bodies(func_op)`) into a private function of its own,
    called from the body (module docstring). Returns (the new function's name, what held
    the body (`kind`), its location) for each."""
    func = graph.func_name(func_op)
    taken = set(graph.function_names(module_op))
    out = []
    for body in bodies:
        what = kind(body)
        name = next(n for k in range(len(taken) + 1)
                    if (n := f"{func}_{what}{k}") not in taken)
        taken.add(name)
        location = body.owner.location       # (the while's, the case's, the manual one's)
        _outline_body(module_op, func_op, body, name)
        out.append((name, what, location))
    return out


def _argument_name(func_op, v) -> str | None:
    """The function's own name for `v` where it is one of its arguments ("params[0]")."""
    if isinstance(v, ir.BlockArgument) and v.owner == graph.body_block(func_op):
        return graph.arg_name(func_op, v.arg_number)
    return None


def _outline_body(module_op, func_op, body, name: str) -> None:
    ops = [op.operation for op in body.operations]
    ret = ops.pop()                         # the body's stablehlo.return
    inside = set(body.arguments) | {r for op in ops for r in op.results}
    captured, constants = [], []
    for op in ops:
        for v in graph.read_values(op):
            if v in inside or v in captured or v in constants:
                continue
            owner = v.owner.operation if isinstance(v, ir.OpResult) else None
            (constants if owner is not None and owner.name == "stablehlo.constant"
             else captured).append(v)
    arg_types = [a.type for a in body.arguments] + [v.type for v in captured]
    result_types = [v.type for v in ret.operands]
    loc = ir.Location.unknown()     # (not a name: inlining adds no name-stack frame)
    with loc:
        fn = ir.Operation.create(
            "func.func", regions=1, attributes={
                "sym_name": ir.StringAttr.get(name),
                "sym_visibility": ir.StringAttr.get("private"),
                "function_type": ir.TypeAttr.get(ir.FunctionType.get(arg_types, result_types))},
            ip=ir.InsertionPoint(module_op.body))
        # (what residual descriptions call them: the function's argument a carry starts
        # from, a shard of, or a value the body reads is, where it is one)
        inits = list(body.owner.operands)
        if kind(body) == "loop":
            names = [f"{a} (loop carry {k})" if (a := _argument_name(func_op, inits[k]))
                     else f"loop carry {k}" for k in range(len(body.arguments))]
        elif kind(body) == "cond":
            names = []                          # (a branch takes no block arguments)
        else:
            names = [f"{a} (its shard)" if (a := _argument_name(func_op, inits[k]))
                     else f"shard_map argument {k}" for k in range(len(body.arguments))]
        names += [_argument_name(func_op, v) or f"value {k} from outside the {kind(body)}"
                  for k, v in enumerate(captured)]
        block = fn.regions[0].blocks.append(
            *arg_types, arg_locs=[ir.Location.name(n) for n in names])
        ip = ir.InsertionPoint(block)
        # (cloned: the bindings cannot hand over a complex literal's attribute)
        mapping = {c: c.owner.operation.clone(ip=ip).results[0] for c in constants}
        mapping.update(zip(list(body.arguments) + captured, block.arguments))
        new_ret = ir.Operation.create("func.return", operands=list(ret.operands), ip=ip)
        for op in ops:
            op.move_before(new_ret)
        graph.replace_reads_all(ops + [new_ret], mapping)
        call = ir.Operation.create(
            "func.call", results=result_types,
            operands=list(body.arguments) + captured,
            attributes={"callee": ir.FlatSymbolRefAttr.get(name)},
            ip=ir.InsertionPoint(ret))
        ir.Operation.create(ret.name, operands=list(call.results),
                            loc=ret.location, ip=ir.InsertionPoint(ret))
        ret.erase()
