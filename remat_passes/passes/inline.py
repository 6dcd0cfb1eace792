"""inline: replace every `func.call` with the body of the function it calls.

MLIR's core `inline` pass needs the func dialect's inliner interface, which
the MLIR context of jaxlib does not register: there it leaves every call in
place. This pass does the job for the `func` dialect in Python, and is what
the pipeline name `inline` runs.

JAX lowers nested `jax.jit`s to private functions whose op locations are
relative to the callee ("max" instead of "jit(f)/jvp(remat[7])/jit(relu)/max").
Inlined ops get the call's name stack in front of their own, so that the
region and transpose frames partial-eval reads from name stacks stay right.
Private functions left without callers are erased, except those another op still
names: the `decomposition` of a `stablehlo.composite` (MaxText's `chlo.erf`), the
`called_computations` of a `custom_call`, and what those functions name in turn.
"""
from __future__ import annotations

import dataclasses

from remat_passes.ir import graph
from remat_passes.ir.mlir import RematError, format_location, ir
from remat_passes.passes.base import ModulePass


def _callee_name(call) -> str:
    return ir.FlatSymbolRefAttr(call.attributes["callee"]).value


def _inlined_location(inner_loc, call_stack: str, call_loc):
    """The call's name stack, then the inlined op's own."""
    if not call_stack:
        return inner_loc
    if isinstance(inner_loc, ir.NameLoc):
        return ir.Location.name(f"{call_stack}/{inner_loc.name_str}", childLoc=inner_loc.child_loc)
    return call_loc


# Ops other than func.call that name functions in their attributes.
_SYMBOL_USERS = ("stablehlo.composite", "stablehlo.custom_call")


def _symbol_names(attr) -> list[str]:
    if isinstance(attr, ir.FlatSymbolRefAttr):
        return [attr.value]
    if isinstance(attr, ir.ArrayAttr):
        return [n for a in attr for n in _symbol_names(a)]
    return []


def _functions_named_in(op) -> set[str]:
    """The functions the composites and custom calls inside `op` name."""
    found: set = set()

    def visit(inner):
        if inner.name in _SYMBOL_USERS:
            attrs = inner.attributes
            for key in attrs:
                found.update(_symbol_names(attrs[key]))
        return ir.WalkResult.ADVANCE
    op.operation.walk(visit)
    return found


def _still_named(funcs: dict) -> set[str]:
    """Functions kept: the public ones and, transitively, the functions they name."""
    todo = [name for name, f in funcs.items() if not _is_private(f)]
    kept = set(todo)
    while todo:
        for name in _functions_named_in(funcs[todo.pop()]):
            if name in funcs and name not in kept:
                kept.add(name)
                todo.append(name)
    return kept


def _is_private(f) -> bool:
    attrs = f.operation.attributes
    return "sym_visibility" in attrs and \
        ir.StringAttr(attrs["sym_visibility"]).value == "private"


def _calls_in(op) -> list:
    return graph.ops_named(op, "func.call")


def _at(call, filename) -> str:
    return f"{format_location(call.location, filename)}: error:"


def _bottom_up(calls: dict, filename=None) -> list[str]:
    """The functions with calls, each after every function it calls (an iterative
    depth-first search; a call cycle is an error: recursion cannot be inlined)."""
    callees = {name: list(dict.fromkeys(_callee_name(c) for c in found))
               for name, found in calls.items()}
    order, state = [], {}          # state: 1 = on the current path, 2 = done
    for root, first in callees.items():
        if state.get(root):
            continue
        path, stack = [root], [iter(first)]
        state[root] = 1
        while stack:
            name = next(stack[-1], None)
            if name is None:
                stack.pop()
                done = path.pop()
                state[done] = 2
                order.append(done)
                continue
            if state.get(name) == 1:
                cycle = path[path.index(name):] + [name]
                closing = next(c for c in calls[path[-1]] if _callee_name(c) == name)
                raise RematError(f"{_at(closing, filename)} cannot inline recursive calls: "
                                 + " -> ".join(f"@{n}" for n in cycle))
            if state.get(name) or name not in callees:
                continue
            state[name] = 1
            path.append(name)
            stack.append(iter(callees[name]))
    return order


def inline_calls(module, filename: str | None = None) -> int:
    """Inline every func.call in `module`; returns how many calls were inlined.

    Callees are inlined before their callers, so each function is cloned with no calls
    left in it, and the locations of one callee's ops under one call name stack are made
    once."""
    funcs = {graph.func_name(op): op for op in module.body.operations
             if op.operation.name == "func.func"}
    inlined = 0
    with module.context:
        calls = {name: found for name, f in funcs.items() if len(f.regions[0].blocks)
                 for found in [_calls_in(f)] if found}
        locations: dict = {}
        for name in _bottom_up(calls, filename):
            for call in calls[name]:
                _inline_one(call, funcs, locations, filename)
                inlined += 1
        if inlined:
            kept = _still_named(funcs)       # (no calls are left)
            for name, f in funcs.items():
                if name not in kept:
                    f.operation.erase()
    return inlined


def _inline_one(call, funcs, locations: dict, filename=None):
    """Move a detached clone of the callee's body before the call. `locations` caches the
    inlined ops' locations per (callee, call name stack); None stands for the call's own."""
    name = _callee_name(call)
    callee = funcs.get(name)
    if callee is None or len(callee.regions[0].blocks) == 0:
        raise RematError(f"{_at(call, filename)} cannot inline the call of @{name}: "
                         + ("no such function" if callee is None else "it has no body"))
    if len(callee.regions[0].blocks) != 1:
        raise RematError(f"{_at(call, filename)} cannot inline @{name}: its body has "
                         "several blocks")
    call_stack = graph.name_stack(call)
    copy = callee.operation.clone(ip=False)
    body = copy.regions[0].blocks[0]
    for arg, value in zip(body.arguments, call.operands):
        arg.replace_all_uses_with(value)
    ops = [op.operation for op in body.operations]
    locs = None
    if call_stack:
        locs = locations.get((name, call_stack))
        if locs is None:
            locs = locations[(name, call_stack)] = [
                _inlined_location(op.location, call_stack, None) for op in ops[:-1]]
    for i, op in enumerate(ops[:-1]):
        op.move_before(call)
        if locs is not None:
            op.location = locs[i] if locs[i] is not None else call.location
    for result, value in zip(call.results, ops[-1].operands):
        result.replace_all_uses_with(value)
    call.erase()
    copy.erase()


@dataclasses.dataclass
class Inline(ModulePass):
    name = "inline"
    summary = ("Inline func.call (in Python: jaxlib's MLIR context lacks the func inliner "
               "interface that core MLIR's inline needs)")

    def apply(self, module_op, state) -> None:
        inline_calls(module_op, state.filename)
