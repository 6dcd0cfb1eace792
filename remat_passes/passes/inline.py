"""inline: replace every `func.call` with the body of the function it calls.

MLIR's core `inline` pass needs the func dialect's inliner interface, which
the MLIR context of jaxlib does not register: there it leaves every call in
place. This pass does the job for the `func` dialect in Python, and is what
the pipeline name `inline` runs.

JAX lowers nested `jax.jit`s to private functions whose op locations are
relative to the callee ("max" instead of "jit(f)/jvp(remat[7])/jit(relu)/max").
Inlined ops get the call's name stack in front of their own, so that the
region and transpose frames partial-eval reads from name stacks stay right.
Private functions left without callers are erased.
"""
from __future__ import annotations

import dataclasses

from remat_passes import graph
from remat_passes.mlir import RematError, ir
from remat_passes.passes import ModulePass

MAX_DEPTH = 64


def _callee_name(call) -> str:
    return ir.FlatSymbolRefAttr(call.attributes["callee"]).value


def _inlined_location(inner_loc, call_stack: str, call_loc):
    """The call's name stack, then the inlined op's own."""
    if not call_stack:
        return inner_loc
    if isinstance(inner_loc, ir.NameLoc):
        return ir.Location.name(f"{call_stack}/{inner_loc.name_str}", childLoc=inner_loc.child_loc)
    return call_loc


def _calls_in(op) -> list:
    found = []

    def visit(inner):
        if inner.name == "func.call":
            found.append(inner)
        return ir.WalkResult.ADVANCE
    op.operation.walk(visit)
    return found


def inline_calls(module) -> int:
    """Inline every func.call in `module`; returns how many calls were inlined."""
    funcs = {graph.func_name(op): op for op in module.body.operations
             if op.operation.name == "func.func"}
    inlined = 0
    with module.context:
        for depth in range(MAX_DEPTH + 1):
            calls = [c for f in funcs.values() if len(f.regions[0].blocks)
                     for c in _calls_in(f)]
            if not calls:
                break
            if depth == MAX_DEPTH:
                raise RematError(f"error: calls nest deeper than {MAX_DEPTH} levels "
                                 f"(recursion through @{_callee_name(calls[0])}?)")
            for call in calls:
                _inline_one(call, funcs)
                inlined += 1
        if inlined:
            called = {_callee_name(c) for f in funcs.values() if len(f.regions[0].blocks)
                      for c in _calls_in(f)}
            for name, f in funcs.items():
                attrs = f.operation.attributes
                private = "sym_visibility" in attrs and \
                    ir.StringAttr(attrs["sym_visibility"]).value == "private"
                if private and name not in called:
                    f.operation.erase()
    return inlined


def _inline_one(call, funcs):
    name = _callee_name(call)
    callee = funcs.get(name)
    if callee is None or len(callee.regions[0].blocks) == 0:
        raise RematError(f"error: cannot inline the call of @{name}: "
                         + ("no such function" if callee is None else "it has no body"))
    if len(callee.regions[0].blocks) != 1:
        raise RematError(f"error: cannot inline @{name}: its body has several blocks")
    body = callee.regions[0].blocks[0]
    call_stack = graph.name_stack(call)
    mapping = dict(zip(body.arguments, call.operands))
    ip = ir.InsertionPoint(call)
    ops = [op.operation for op in body.operations]
    for op in ops[:-1]:
        clone = op.clone(ip=ip)
        graph.replace_reads_all([clone], mapping)
        clone.location = _inlined_location(op.location, call_stack, call.location)
        for old, new in zip(op.results, clone.results):
            mapping[old] = new
    returned = [mapping.get(v, v) for v in ops[-1].operands]
    for result, value in zip(call.results, returned):
        result.replace_all_uses_with(value)
    call.erase()


@dataclasses.dataclass
class Inline(ModulePass):
    name = "inline"
    summary = ("Inline func.call (in Python: jaxlib's MLIR context lacks the func inliner "
               "interface that core MLIR's inline needs)")

    def apply(self, module_op, state) -> None:
        inline_calls(module_op)
