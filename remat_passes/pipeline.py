"""Pass pipelines: MLIR's textual pipeline syntax, options, verify-each, IR dumps.

`parse_pipeline("builtin.module(inline,remat-partial-eval{policy=dots_saveable mode=split})")`
returns the steps; `run_pipeline` runs them on an `ir.Module`, verifying after
each pass (as mlir-opt does by default) and printing the IR before/after each
pass with MLIR's `// -----// IR Dump After ...` headers when asked.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import tempfile
from typing import TextIO

from remat_passes import mlir
from remat_passes.mlir import RematError, passmanager
from remat_passes.passes import CORE_PASSES, PassState, registry, unknown_pass_error


@dataclasses.dataclass
class Step:
    name: str
    options: dict[str, str]
    parsed: dict | None = None   # our passes: parsed option values

    def spec(self) -> str:
        if not self.options:
            return self.name
        return self.name + "{" + " ".join(f"{k}={v}" for k, v in self.options.items()) + "}"


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


def parse_step(text: str) -> Step:
    text = text.strip()
    if "{" in text:
        if not text.endswith("}"):
            raise RematError(f"error: expected '}}' at the end of '{text}' in the pass pipeline")
        name, opts = text.split("{", 1)
        return Step(name.strip(), parse_options(opts[:-1]))
    return Step(text, {})


def parse_pipeline(text: str) -> list[Step]:
    """Read `builtin.module(p1,p2{k=v})` (the anchor may be left out)."""
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
    steps = [parse_step(p) for p in _split_top(body, ",") if p.strip()]
    check_steps(steps)
    return steps


def check_steps(steps: list[Step]) -> None:
    """Resolve every pass and parse every option before anything runs."""
    ours = registry()
    for step in steps:
        if step.name in ours:
            step.parsed = ours[step.name].parse_options(step.options)
        elif step.name in CORE_PASSES:
            with mlir.context(), _quiet_stderr() as captured:
                try:
                    passmanager.PassManager.parse(f"builtin.module({step.spec()})")
                    error = None
                except Exception as e:  # MLIRError / ValueError from the option parser
                    error = e
            if error is not None:
                detail = " ".join((captured.text + " " + str(error)).split())
                raise RematError(f"error: bad options for pass '{step.name}': {detail}")
        else:
            raise unknown_pass_error(step.name)


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


def _class_name(step: Step) -> str:
    if step.name in CORE_PASSES:
        return CORE_PASSES[step.name][0]
    return "".join(w.capitalize() for w in step.name.split("-"))


def _dump(module, when: str, step: Step, out: TextIO):
    out.write(f"// -----// IR Dump {when} {_class_name(step)} ({step.name}) //----- //\n")
    out.write(mlir.to_text(module))
    out.write("\n")


def run_pipeline(module, steps: list[Step], state: PassState | None = None, *,
                 verify_each: bool = True, print_before: bool = False,
                 print_after: bool = False, dump_to: TextIO | None = None) -> PassState:
    """Run `steps` on `module` (an ir.Module) in place."""
    state = state or PassState()
    dump_to = dump_to or sys.stderr
    ours = registry()
    for step in steps:
        if step.parsed is None and step.name in ours:
            step.parsed = ours[step.name].parse_options(step.options)
        if print_before:
            _dump(module, "Before", step, dump_to)
        with mlir.context():
            if step.name in ours:
                ours[step.name].run(module, step.parsed, state)
            else:
                pm = passmanager.PassManager.parse(f"builtin.module({step.spec()})")
                pm.enable_verifier(verify_each)
                try:
                    pm.run(module.operation)
                except mlir.ir.MLIRError as e:
                    raise RematError(mlir.diagnostics_message(
                        e, state.filename, f"in pass '{step.name}'")) from None
        if verify_each:
            mlir.verify(module.operation, state.filename, after=step.name)
        if print_after:
            _dump(module, "After", step, dump_to)
    return state


def remat(module, policy=None, *, mode: str = "joint", prevent_cse: bool = True,
          prevent_cse_in_loops: bool = False,
          func: str = "main", cotangent_args=None, region_regex=None, region_policy=None,
          verify: bool = True):
    """Run the default remat pipeline on a copy of `module`; return the new Module.

    remat-partial-eval (policy, mode) -> insert-reduce-precision ->
    place-optimization-barriers (if prevent_cse) -> annotate-host-offload ->
    strip-checkpoint-names. The residuals partial-eval chose are on the result
    as `.residuals`, and what it wants the user to know (e.g. a while loop it
    treated as one atomic op) as `.remarks`.
    """
    from remat_passes.passes.remat import Remat
    out = module.clone()
    options = Remat().parse_options({})
    options.update({"policy": policy, "mode": mode, "func": func, "prevent-cse": prevent_cse,
                    "prevent-cse-in-loops": prevent_cse_in_loops,
                    "cotangent-args": cotangent_args})
    if mode not in ("joint", "split"):
        raise RematError(f"error: mode must be 'joint' or 'split', got {mode!r}")
    if region_regex is not None:
        options["region-regex"] = re.compile(region_regex)
    if region_policy is not None:
        from remat_passes.policies import as_policy
        options["region-policy"] = as_policy(region_policy)
    state = PassState(region_policies=dict(out.region_policies), filename=module.filename)
    run_pipeline(out.op, [Step(Remat.name, {}, options)], state, verify_each=verify)
    out.residuals = state.residuals.get(func, [])
    out.remarks = list(state.remarks)
    return out
