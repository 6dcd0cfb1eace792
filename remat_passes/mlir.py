"""The one place that imports the MLIR bindings shipped with jaxlib.

Everything else in remat_passes reaches `ir`, the StableHLO and func dialects
and the pass manager through this module. It also owns the shared MLIR
context, reading and writing every input format (MLIR text, MLIR bytecode,
StableHLO portable artifacts, serialized `jax.export.Exported`), and turning
MLIR diagnostics into `RematError`s that name file:line:col.
"""
from __future__ import annotations

import ctypes
import io
import re

from jax.extend import mlir as _jax_mlir
from jax.extend.mlir import ir, passmanager  # noqa: F401  (re-exported)
from jax.extend.mlir.dialects import func, stablehlo  # noqa: F401  (re-exported)

from remat_passes import jax_compat

__all__ = ["ir", "passmanager", "func", "stablehlo", "RematError", "context",
           "parse", "to_text", "to_bytecode", "to_portable_artifact",
           "BYTECODE_MAGIC"]

BYTECODE_MAGIC = b"ML\xefR"


class RematError(Exception):
    """A user-facing error: bad input, bad options, a failed verification.

    The CLI prints `str(error)` and exits 1 without a traceback.
    """


_CONTEXT = None


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
    if isinstance(data, (bytes, bytearray)) and not bytes(data[:4]) == BYTECODE_MAGIC:
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            exported = _deserialize_exported(bytes(data), filename)
            data = exported.mlir_module()
    with ctx:
        try:
            module = ir.Module.parse(data)
        except ir.MLIRError as e:
            raise RematError(diagnostics_message(e, filename, None)) from None
        if isinstance(data, (bytes, bytearray)) and _is_portable_artifact(module):
            module = _jax_mlir.deserialize_portable_artifact(bytes(data), ctx)
            _map_remat_flags(module, to_bool=False)
    return module, exported


def _deserialize_exported(data: bytes, filename: str | None):
    from jax import export
    try:
        return export.deserialize(bytearray(data))
    except Exception as e:  # flatbuffers raises assorted errors on garbage
        raise RematError(
            f"{filename or '<input>'}: error: not MLIR text, MLIR bytecode, a StableHLO "
            f"portable artifact or a serialized jax.export.Exported ({type(e).__name__})"
        ) from None


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
        return _jax_mlir.serialize_portable_artifact(text, target)
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
