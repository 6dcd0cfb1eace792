"""Pass pipelines: MLIR's textual pipeline syntax, options, verify-each, IR dumps.

`parse_pipeline("builtin.module(inline,remat-partial-eval{policy=dots_saveable mode=split})")`
returns the passes (options parsed and checked); `run_pipeline` runs them on an
`ir.Module`, pipelines like `remat` expanded into their steps, verifying after
each step (as mlir-opt does by default) and printing the IR before/after each
with MLIR's `// -----// IR Dump After ...` headers when asked.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import sys
import tempfile
import time
from typing import TextIO

from remat_passes.ir import mlir, symbolic
from remat_passes.ir.mlir import RematError, ir, passmanager
from remat_passes.passes.base import PassState, PipelinePass
from remat_passes.passes.registry import CORE_PASSES, CorePass, registry, unknown_pass_error


def _split_top(text: str, seps: str) -> list[str]:
    """Split on `seps` outside (), [], {} and quotes."""
    parts, depth, quote, cur = [], 0, None, []
    for ch in text:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = None
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth < 0:
                raise RematError(f"error: unbalanced '{ch}' in pass pipeline '{text}'")
        if ch in seps and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0 or quote:
        raise RematError(f"error: unbalanced brackets or quotes in pass pipeline '{text}'")
    parts.append("".join(cur))
    return parts


def parse_options(text: str) -> dict[str, str]:
    """'policy=save_only_these_names(a,b) mode=split' -> {'policy': ..., 'mode': 'split'}."""
    out = {}
    for item in _split_top(text.strip(), " \t"):
        if not item:
            continue
        if "=" not in item:
            out[item] = "true"  # a bare flag, as MLIR allows for bool options
            continue
        key, value = item.split("=", 1)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def parse_step(text: str):
    """One pass of a pipeline, e.g. 'remat-partial-eval{policy=dots_saveable}'."""
    text = text.strip()
    if "{" in text:
        if not text.endswith("}"):
            raise RematError(f"error: expected '}}' at the end of '{text}' in the pass pipeline")
        name, opts = text.split("{", 1)
        return make_pass(name.strip(), parse_options(opts[:-1]))
    return make_pass(text, {})


def make_pass(name: str, options: dict[str, str]):
    """The pass `name` with its options parsed (a ModulePass or a CorePass); checks them."""
    ours = registry()
    if name in ours:
        return ours[name].from_options(options)
    if name in CORE_PASSES:
        core = CorePass(name, options)
        with mlir.context(), _quiet_stderr() as captured:
            try:
                passmanager.PassManager.parse(f"builtin.module({core.spec()})")
                error = None
            except Exception as e:  # MLIRError / ValueError from the option parser
                error = e
        if error is not None:
            detail = " ".join((captured.text + " " + str(error)).split())
            raise RematError(f"error: bad options for pass '{name}': {detail}")
        return core
    raise unknown_pass_error(name)


def parse_pipeline(text: str) -> list:
    """Read `builtin.module(p1,p2{k=v})` (the anchor may be left out) into passes."""
    body = text.strip()
    for anchor in ("builtin.module(", "module("):
        if body.startswith(anchor):
            if not body.endswith(")"):
                raise RematError(f"error: expected ')' at the end of pass pipeline '{text}'")
            body = body[len(anchor):-1]
            break
    else:
        if "(" in body.split("{", 1)[0]:
            raise RematError(
                f"error: pass pipeline '{text}' must be anchored on builtin.module, e.g. "
                "'builtin.module(inline,canonicalize)'")
    return [parse_step(p) for p in _split_top(body, ",") if p.strip()]


def expand(passes: list) -> list:
    """Pipelines replaced by their steps, recursively."""
    out = []
    for p in passes:
        if isinstance(p, PipelinePass):
            out.extend(expand(p.expand()))
        else:
            out.append(p)
    return out


class _Captured:
    text = ""


@contextlib.contextmanager
def _quiet_stderr():
    """Capture what LLVM's option parser writes straight to file descriptor 2."""
    captured = _Captured()
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield captured
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            captured.text = tmp.read().decode("utf-8", errors="replace")


def _class_name(p) -> str:
    if p.name in CORE_PASSES:
        return CORE_PASSES[p.name][0]
    return type(p).__name__


def _dump(module, when: str, p, out: TextIO):
    out.write(f"// -----// IR Dump {when} {_class_name(p)} ({p.name}) //----- //\n")
    out.write(mlir.to_text(module))
    out.write("\n")


def _on_targets(p, state: PassState) -> list:
    """`p`, or where it names a function (`func`) whose loop bodies outline-loop-backwards
    made functions of, a copy of it for each of those."""
    func = getattr(p, "func", None)
    if not isinstance(func, str) or func not in state.loop_bodies or \
            p.name == "outline-loop-backwards":
        return [p]
    return [dataclasses.replace(p, func=t) for t in state.targets(func)]


def run_pipeline(module, passes: list, state: PassState | None = None, *,
                 verify_each: bool = True, print_before: bool = False,
                 print_after: bool = False, dump_to: TextIO | None = None) -> PassState:
    """Run `passes` (pipelines expanded into their steps) on `module` (an ir.Module) in
    place: verify after each step, dump the IR around it when asked, and keep analyses
    across steps that preserve them. Python's cyclic GC is paused for the run (many
    small long-lived objects; collections would cost more than the passes)."""
    if not isinstance(module, ir.Module):
        raise TypeError("rp.run_pipeline takes an ir.Module (a remat_passes.Module's .op), "
                        f"got {type(module).__name__}")
    state = state or PassState()
    if state.dim_symbols is None:
        with mlir.context():
            state.dim_symbols = symbolic.argument_dims(module)
    dump_to = dump_to or sys.stderr
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for p in expand(passes):
            if print_before:
                _dump(module, "Before", p, dump_to)
            start = time.perf_counter()
            with mlir.context():
                if isinstance(p, CorePass):
                    p.apply(module, state, verify=verify_each)
                else:
                    for q in _on_targets(p, state):
                        q.apply(module, state)
            state.timings.append((p.name, time.perf_counter() - start))
            if not p.preserves_analyses:
                state.drop()
            if verify_each:
                mlir.verify(module.operation, state.filename, after=p.name)
            if print_after:
                _dump(module, "After", p, dump_to)
    finally:
        if gc_was_enabled:
            gc.enable()
    return state
