"""The one place that imports the MLIR bindings shipped with jaxlib.

Everything else in remat_passes reaches `ir`, the StableHLO and func dialects
and the pass manager through this module. It also owns the shared MLIR
context, reading and writing every input format (MLIR text, MLIR bytecode,
StableHLO portable artifacts, serialized `jax.export.Exported`), and turning
MLIR diagnostics into `RematError`s that name file:line:col.
"""
from __future__ import annotations

import ctypes
import faulthandler
import io
import os
import re
import signal
import time
import warnings

# jaxlib's bindings: the modules `jax.extend.mlir` re-exports, imported without
# importing jax (see jax_compat.make_ir_context).
from jaxlib.mlir import ir, passmanager  # noqa: F401  (re-exported)
from jaxlib.mlir.dialects import func, stablehlo  # noqa: F401  (re-exported)

from remat_passes import jax_compat

__all__ = ["ir", "passmanager", "func", "stablehlo", "RematError", "context",
           "parse", "to_text", "to_bytecode", "to_portable_artifact",
           "BYTECODE_MAGIC"]

BYTECODE_MAGIC = b"ML\xefR"


class RematError(Exception):
    """A user-facing error: bad input, bad options, a failed verification.

    The CLI prints `str(error)` and exits 1 without a traceback. `location`, when given,
    is the `ir.Location` of the op or function the error is about: the CLI puts its
    `file:line:col` in front, as `mlir-opt` does.
    """

    def __init__(self, message: str, location=None):
        super().__init__(message)
        self.location = location

    def located(self, filename: str | None = None) -> str:
        """The message with `file:line:col: ` in front when it is about a place in the input."""
        msg = str(self)
        if self.location is None or not msg.startswith("error:"):
            return msg
        where = format_location(self.location, filename)
        return msg if where in ("<unknown>", filename) else f"{where}: {msg}"


_CONTEXT = None


def expect_module(module, who: str, *, ir_module: bool = False) -> None:
    """A TypeError that names what `who` (a function of the Python API) takes, where
    `module` is not a remat_passes.Module (or, with `ir_module`, an ir.Module either)."""
    if isinstance(getattr(module, "op", None), ir.Module) or \
            (ir_module and isinstance(module, ir.Module)):
        return
    raise TypeError(f"{who} takes a remat_passes.Module (from rp.export_vjp, rp.export, "
                    f"rp.load or rp.Module.parse){' or an ir.Module' if ir_module else ''}, "
                    f"got {type(module).__name__}")


def context() -> ir.Context:
    """The process-wide MLIR context with JAX's dialects registered.

    A plain `ir.Context()` cannot parse JAX output, so we use JAX's own
    factory. One context is shared so values of different modules can meet
    (cloning ops between the functions of a split module, for example).
    """
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = jax_compat.make_ir_context()
        # Verification failures must come back to us as exceptions that carry
        # diagnostics, not be printed to stderr by the default handler.
        _CONTEXT.emit_error_diagnostics = False
    return _CONTEXT


def format_location(loc, filename: str | None = None) -> str:
    """'file:line:col' for a location, following name/callsite wrappers.

    MLIR text parsed from a string has the file name "-"; `filename`
    replaces it so that errors name the user's file.
    """
    text = str(loc)
    m = re.search(r'"([^"]*)":(\d+):(\d+)', text)
    if not m:
        return filename or "<unknown>"
    name = m.group(1)
    if name == "-" and filename:
        name = filename
    return f"{name}:{m.group(2)}:{m.group(3)}"


def diagnostics_message(err: ir.MLIRError, filename: str | None, headline: str) -> str:
    """Render an MLIRError as 'file:line:col: error: message' lines."""
    lines = []
    for diag in err.error_diagnostics:
        lines.append(f"{format_location(diag.location, filename)}: error: {diag.message}")
        for note in diag.notes:
            lines.append(f"{format_location(note.location, filename)}: note: {note.message}")
    if not lines:
        lines.append(f"{filename or '<input>'}: error: {err.message}")
    lines[0] = lines[0] + ("" if headline is None else f" ({headline})")
    return "\n".join(lines)


def _is_portable_artifact(module: ir.Module) -> bool:
    return any(op.operation.name.startswith("vhlo.") for op in module.body.operations)


def parse(data: str | bytes, filename: str | None = None) -> tuple[ir.Module, object]:
    """Parse MLIR text, MLIR bytecode, a portable artifact or an Exported blob.

    Returns (module, exported) where `exported` is the `jax.export.Exported`
    the module came from, or None.
    """
    ctx = context()
    exported = None
    if isinstance(data, (bytes, bytearray)) and is_binary(bytes(data)) and \
            not bytes(data[:4]) == BYTECODE_MAGIC:
        exported = _deserialize_exported(bytes(data), filename)
        inner = bytes(exported.module_bytes if isinstance(exported, ModuleOnly)
                      else exported.mlir_module_serialized)
        if _parse_aborts(inner):
            raise RematError(f"{filename or '<input>'}: error: malformed serialized "
                             "jax.export.Exported (the MLIR parser aborted on its module)")
        try:
            data = inner if isinstance(exported, ModuleOnly) else exported.mlir_module()
            if isinstance(exported, ModuleOnly):
                exported = None
        except Exception as e:      # jax re-raises the parser's diagnostics its own way
            raise RematError(f"{filename or '<input>'}: error: malformed serialized "
                             f"jax.export.Exported: {str(e).splitlines()[0] if str(e) else e}"
                             ) from None
    elif isinstance(data, (bytes, bytearray)) and not bytes(data[:4]) == BYTECODE_MAGIC:
        try:        # text; bytes that are not UTF-8 (a Latin-1 comment) go to the parser as is
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            data = bytes(data)
            _check_utf8_outside_comments(data, filename)
    if isinstance(data, str) or not bytes(data[:4]) == BYTECODE_MAGIC:
        raw = data.encode() if isinstance(data, str) else bytes(data)
        _check_not_python(raw, filename)
        _check_nesting(raw, filename)
        _check_string_escapes(raw, filename)
    if isinstance(data, (bytes, bytearray)) and bytes(data[:4]) == BYTECODE_MAGIC and \
            _parse_aborts(bytes(data)):
        raise RematError(f"{filename or '<input>'}: error: malformed MLIR bytecode (the MLIR "
                         "parser aborted on it, or it holds a string that is not UTF-8)")
    return _parse_module(data, filename, ctx), exported


_PYTHON_LINE = re.compile(rb"^(import\s+\w|from\s+[\w.]+\s+import\b|def\s+\w+\s*\(|class\s+\w+"
                          rb"|#!.*python|@\w)")


def _check_not_python(text: bytes, filename: str | None) -> None:
    """Python source given where MLIR is expected: say so (the MLIR parser would complain
    about an unknown op 'import', or an empty operation name)."""
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith(b"//"):
            continue
        if _PYTHON_LINE.match(s) or (filename or "").endswith(".py"):
            raise RematError(
                f"{filename or '<input>'}: error: this is Python source, not MLIR: export "
                "the function first (rp.export_vjp(f, *args) or rp.export(step, *args), then "
                "module.save('model.mlir')) and give remat-opt that file")
        return


def _parse_module(data, filename, ctx) -> ir.Module:
    with ctx:
        try:
            module = ir.Module.parse(data)
        except ir.MLIRError as e:
            raise RematError(diagnostics_message(e, filename, None)) from None
        if isinstance(data, (bytes, bytearray)) and _is_portable_artifact(module):
            try:
                module = jax_compat.portable_artifacts()[1](bytes(data), ctx)
            except Exception as e:  # jaxlib's own error type, varying by version
                first = str(e).splitlines()[0] if str(e) else type(e).__name__
                raise RematError(f"{filename or '<input>'}: error: malformed StableHLO "
                                 f"portable artifact ({first})") from None
            _map_remat_flags(module, to_bool=False)
        _check_one_module(module, filename)
    return module


def _check_one_module(module: ir.Module, filename: str | None) -> None:
    """Text with several top-level modules parses as one implicit module holding them;
    every pass works on the functions of one module, so say so instead of finding none."""
    nested = [op for op in module.body.operations if op.operation.name == "builtin.module"]
    if not nested:
        return
    where = ", ".join(format_location(op.location, filename) for op in nested[:4])
    what = (f"{len(nested)} top-level modules (at {where})" if len(nested) > 1 else
            f"a module nested in the top-level module (at {where})")
    raise RematError(
        f"{format_location(nested[0].location, filename)}: error: the input holds {what}; "
        "remat_passes works on one module per input: put each in a file of its own, or "
        "separate them with '// -----' lines and pass --split-input-file")


MAX_NESTING = 1000


def _code_part(line: bytes) -> bytes:
    """The part of a line of MLIR text before a `//` comment outside a string."""
    in_string, i = False, 0
    while i < len(line) - 1:
        c = line[i:i + 1]
        if in_string and c == b"\\":
            i += 2
            continue
        if c == b'"':
            in_string = not in_string
        elif not in_string and line[i:i + 2] == b"//":
            return line[:i]
        i += 1
    return line


def _check_utf8_outside_comments(text: bytes, filename: str | None) -> None:
    """Bytes that are not UTF-8 may sit in a comment (the parser drops it); anywhere else
    they end up in a name, location or attribute that the MLIR bindings cannot turn into a
    Python string (some versions abort the process on it): refuse them, located."""
    for lineno, line in enumerate(text.split(b"\n"), 1):
        try:
            line.decode("utf-8")
            continue
        except UnicodeDecodeError:
            pass
        try:
            _code_part(line).decode("utf-8")
        except UnicodeDecodeError as e:
            raise RematError(f"{filename or '<input>'}:{lineno}:{e.start + 1}: error: a byte "
                             "that is not UTF-8 outside a comment") from None


_STRING_RE = re.compile(rb'"((?:[^"\\]|\\.)*)"')
_HEX_PAIR_RE = re.compile(rb"[0-9a-fA-F]{2}")
_ESCAPES = {b"n": b"\n", b"t": b"\t"}


def _unescape(raw: bytes) -> bytes:
    """The bytes an MLIR string literal spells (`\\XX` hex, `\\n`, `\\t`, `\\"`, `\\\\`)."""
    out, i = bytearray(), 0
    while i < len(raw):
        if raw[i:i + 1] == b"\\" and i + 1 < len(raw):
            if _HEX_PAIR_RE.fullmatch(raw[i + 1:i + 3]):
                out.append(int(raw[i + 1:i + 3], 16))
                i += 3
            else:
                out += _ESCAPES.get(raw[i + 1:i + 2], raw[i + 1:i + 2])
                i += 2
            continue
        out += raw[i:i + 1]
        i += 1
    return bytes(out)


def _check_string_escapes(text: bytes, filename: str | None) -> None:
    """A string literal can spell bytes that are not UTF-8 with hex escapes (`"x.\\FF"`),
    and those abort the process as raw bytes do once Python reads the string: refuse
    them, located. Only lines with a backslash are looked at."""
    if b"\\" not in text:
        return
    for lineno, line in enumerate(text.split(b"\n"), 1):
        if b"\\" not in line:
            continue
        for m in _STRING_RE.finditer(_code_part(line)):
            try:
                _unescape(m.group(1)).decode("utf-8")
            except UnicodeDecodeError:
                raise RematError(f"{filename or '<input>'}:{lineno}:{m.start() + 1}: error: "
                                 "a string whose escapes spell bytes that are not UTF-8"
                                 ) from None


def _check_nesting(text: bytes, filename: str | None) -> None:
    """MLIR's parser and printer recurse on nested types, attributes and regions: a type
    nested some 20000 deep crashes the process. Refuse text whose brackets nest more than
    MAX_NESTING deep, with the place it happens (counted in 1 MiB chunks: no copy of a
    large module's size in memory)."""
    import numpy as np
    text = text.replace(b"->", b"  ")       # (arrows are not brackets)
    table = np.zeros(256, np.int8)
    for c in b"<([{":
        table[c] = 1
    for c in b">)]}":
        table[c] = -1
    depth = 0
    chunk = 1 << 20
    for start in range(0, len(text), chunk):
        steps = table[np.frombuffer(text, np.uint8, min(chunk, len(text) - start), start)]
        running = np.cumsum(steps, dtype=np.int64) + depth
        if running.size and running.max() > MAX_NESTING:
            i = start + int(np.argmax(running > MAX_NESTING))
            line = text.count(b"\n", 0, i) + 1
            col = i - (text.rfind(b"\n", 0, i) + 1) + 1
            raise RematError(f"{filename or '<input>'}:{line}:{col}: error: brackets nested more "
                             f"than {MAX_NESTING} deep (MLIR's parser and printer recurse on "
                             "nesting and would crash)")
        if running.size:
            depth = int(running[-1])


_PARSE_GUARD_SECONDS = 30.0     # a legitimate parse of user bytecode takes far less


def _parse_aborts(data: bytes) -> bool:
    """Does parsing this bytecode kill the process? Corrupt bytecode can make the MLIR
    bindings abort (a diagnostic that is not UTF-8 cannot become a Python string, and
    that happens where no exception may pass), so user bytecode is parsed first in a
    forked child. POSIX only; elsewhere the parse is not guarded."""
    if not hasattr(os, "fork"):
        return False
    with warnings.catch_warnings():     # (fork of a process with threads: the child only
        warnings.simplefilter("ignore")  # parses, single-threaded, and exits)
        pid = os.fork()
    if pid == 0:                        # the child: parse, then exit without cleanup
        code = 0
        try:
            faulthandler.disable()      # (its report of the abort would go to stderr)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            ctx = context()
            ctx.enable_multithreading(False)
            module = _parse_module(data, None, ctx)
        except BaseException:           # an error the parent reports the normal way
            os._exit(0)
        try:     # every string of the module (names, locations, attributes) as Python text:
            asm = module.operation.get_asm(enable_debug_info=True)   # one that is not
            _check_string_escapes(asm.encode(), None)   # UTF-8 aborts a later access (the
        except BaseException:                           # printer escapes it in a string)
            code = 3
        os._exit(code)
    deadline = time.monotonic() + _PARSE_GUARD_SECONDS
    delay = 0.001
    while True:                         # (a parse that never ends counts as aborting)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return True
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def is_binary(data: bytes) -> bool:
    """MLIR bytecode (its magic) or another binary format (a serialized Exported is a
    flatbuffer, full of NUL bytes; MLIR text never has one)."""
    return data[:4] == BYTECODE_MAGIC or b"\x00" in data


class ModuleOnly:
    """A serialized Exported whose calling convention could not be rebuilt here (a custom
    pytree type not registered in this process): its module, and why."""

    def __init__(self, module_bytes: bytes, why: str):
        self.module_bytes = module_bytes
        self.why = why

    def mlir_module(self) -> bytes:
        return self.module_bytes


def _deserialize_exported(data: bytes, filename: str | None):
    """A `jax.export.Exported`; one whose pytrees cannot be rebuilt in this process gives
    its module alone (`ModuleOnly`: the passes need nothing else)."""
    from jax import export
    try:
        return export.deserialize(bytearray(data))
    except Exception as e:  # flatbuffers raises assorted errors on garbage
        why = type(e).__name__
        if "PyTreeDef" in str(e):       # a pytree type not registered here: say which
            why = f"{why}: {str(e).splitlines()[0]}"
            try:
                return ModuleOnly(jax_compat.exported_module_bytes(data), why)
            except Exception:
                pass
        raise RematError(
            f"{filename or '<input>'}: error: not MLIR text, MLIR bytecode, a StableHLO "
            f"portable artifact or a serialized jax.export.Exported ({why})") from None


def to_text(module: ir.Module, debug_info: bool = False) -> str:
    return module.operation.get_asm(enable_debug_info=debug_info)


def to_bytecode(module: ir.Module) -> bytes:
    buf = io.BytesIO()
    module.operation.write_bytecode(buf)
    return buf.getvalue()


def _map_remat_flags(module: ir.Module, to_bool: bool) -> None:
    """Rewrite unit-valued `remat.*` argument/result attributes to `true` or back."""
    for op in module.body.operations:
        for which in ("arg_attrs", "res_attrs"):
            if which not in op.operation.attributes:
                continue
            dicts = []
            for d in ir.ArrayAttr(op.operation.attributes[which]):
                d = ir.DictAttr(d)
                entries = {}
                for i in range(len(d)):
                    name, value = d[i].name, d[i].attr
                    if name.startswith("remat."):
                        if to_bool and isinstance(value, ir.UnitAttr):
                            value = ir.BoolAttr.get(True)
                        elif not to_bool and str(value) == "true":
                            value = ir.UnitAttr.get()
                    entries[name] = value
                dicts.append(ir.DictAttr.get(entries))
            op.operation.attributes[which] = ir.ArrayAttr.get(dicts)


def clone(module: ir.Module) -> ir.Module:
    """A copy of `module` (through bytecode, in our context)."""
    with context():
        return ir.Module.parse(to_bytecode(module))


def to_portable_artifact(module: ir.Module, target: str | None = None) -> bytes:
    """A StableHLO portable artifact (VHLO bytecode) for `target` version.

    VHLO has no unit attribute, so our unit flags (`{remat.cotangent}`) travel
    as `true` and are turned back into unit attributes by `parse`.
    """
    target = target or stablehlo.get_current_version()
    with context():
        copy = ir.Module.parse(to_bytecode(module))
        _map_remat_flags(copy, to_bool=True)
        text = to_text(copy, debug_info=True)
    try:
        return jax_compat.portable_artifacts()[0](text, target)
    except Exception as e:  # jaxlib raises its runtime error type
        raise RematError(f"error: cannot write a StableHLO portable artifact: {e}") from None


def verify(module_op, filename: str | None = None, after: str | None = None) -> None:
    """Run the MLIR verifier; raise RematError naming the op and location."""
    with context():
        try:
            module_op.verify()
        except ir.MLIRError as e:
            headline = f"verification failed after pass '{after}'" if after else "verification failed"
            raise RematError(diagnostics_message(e, filename, headline)) from None


# Operation.__hash__ in these bindings hashes the op's *contents*, so it changes
# when an operand is replaced. Passes key their maps by the C pointer instead.
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]


_OP_CAPSULE = b"jaxlib.mlir.ir.Operation._CAPIPtr"


def op_id(op) -> int:
    """A stable identity for an operation while it lives (its C pointer)."""
    global _OP_CAPSULE
    cap = op.operation._CAPIPtr
    try:
        return _capsule_pointer(cap, _OP_CAPSULE)
    except ValueError:  # another capsule name in this jaxlib build: learn it once
        _OP_CAPSULE = _capsule_name(cap)
        return _capsule_pointer(cap, _OP_CAPSULE)
