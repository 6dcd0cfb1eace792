"""`remat_passes.Module`: one MLIR module, its origin, and ways in and out.

A Module wraps an `ir.Module` and remembers the `jax.export.Exported` it came
from (so it can be called with the original pytree calling convention) and
the Python policies of checkpoint regions made with callables.
"""
from __future__ import annotations

import os
import stat
import tempfile

from remat_passes.ir import graph, mlir, symbolic
from remat_passes.ir.mlir import RematError


class Module:
    def __init__(self, op, exported=None, region_policies=None, filename=None,
                 dim_symbols=None):
        self.op = op                      # the ir.Module
        self.region_policies = dict(region_policies or {})
        self.filename = filename
        self.exported = exported          # jax.export.Exported or None
        self.residuals = None             # set by remat(): what partial-eval saved
        self.remarks = []                 # set by remat(): what partial-eval wants said
        # parsed from a serialized Exported: its bytes and @main's type then (the calling
        # convention `serialize_exported` keeps, also where its pytrees cannot be rebuilt)
        self.serialized_origin: bytes | None = None
        self.origin_signature: str | None = None
        # names of symbolic argument dimensions (symbolic.argument_dims), read while the
        # module still has them: `inline` erases them, and reports name `f32[b,4]` by them
        self.dim_symbols = dim_symbols if dim_symbols is not None else \
            symbolic.argument_dims(op) if op is not None else {}

    @property
    def exported(self):
        """The jax.export.Exported this module came from, or None.

        Setting it also records the type of @main at that moment: while @main
        keeps that type, calls use the Exported's own calling convention
        (pytrees, platform index, symbolic shapes).
        """
        return self._exported

    @exported.setter
    def exported(self, value):
        self._exported = value
        self.exported_signature = graph.main_signature(self.op) if value is not None else None

    # ---------------------------------------------------------------- in --
    @classmethod
    def parse(cls, data: str | bytes, filename: str | None = None,
              allow_empty: bool = False) -> "Module":
        """MLIR text or bytecode, a StableHLO portable artifact, or a serialized Exported.
        Empty input is an error unless `allow_empty` (remat-opt, as mlir-opt, reads it as
        an empty module)."""
        if not isinstance(data, (str, bytes, bytearray, memoryview)):
            raise TypeError(f"Module.parse takes str or bytes, got {type(data).__name__}")
        raw = data.encode() if isinstance(data, str) else bytes(data)
        if not allow_empty and not raw.strip():
            raise RematError(f"{filename or '<input>'}: error: empty input: no module to parse")
        op, exported = mlir.parse(data, filename)
        module = cls(op, exported=exported, filename=filename)
        if mlir.is_binary(raw) and raw[:4] != mlir.BYTECODE_MAGIC:   # a serialized Exported
            module.serialized_origin = raw
            module.origin_signature = graph.main_signature(op)
        return module

    def clone(self) -> "Module":
        copy = Module(mlir.clone(self.op), self.exported, self.region_policies, self.filename,
                      self.dim_symbols)
        copy.exported_signature = self.exported_signature
        copy.serialized_origin, copy.origin_signature = \
            self.serialized_origin, self.origin_signature
        return copy

    # --------------------------------------------------------------- out --
    def __str__(self) -> str:
        return mlir.to_text(self.op)

    def text(self, debug_info: bool = False) -> str:
        return mlir.to_text(self.op, debug_info=debug_info)

    def bytecode(self) -> bytes:
        return mlir.to_bytecode(self.op)

    def save(self, path: str, bytecode: bool = False, debug_info: bool = True) -> None:
        """Write text (with locations, so reports keep source positions) or bytecode.

        The file is written next to `path` and renamed into place, so a failure
        never leaves a half-written file.
        """
        data = self.bytecode() if bytecode else self.text(debug_info=debug_info).encode()
        write_atomically(path, data)

    def functions(self) -> list[str]:
        from remat_passes.ir import graph
        return [graph.func_name(op) for op in self.op.body.operations
                if op.operation.name == "func.func"]

    def verify(self) -> None:
        mlir.verify(self.op.operation, self.filename)

    # ----------------------------------------------------------- compile --
    def serialize_exported(self) -> bytes:
        """@main as a serialized `jax.export.Exported` (`jax.export.deserialize` reads it).
        A module parsed from one keeps its calling convention (its pytrees), as long as the
        passes kept @main's type; others get a flat one."""
        from remat_passes.jax import run
        return run.serialize_exported(self)

    def to_exported(self, function: str = "main"):
        from remat_passes.jax import run
        return run.to_exported(self, function)

    def call(self, *args, function: str = "main"):
        """Run `function` compiled with XLA. @main keeps the calling convention of the
        export it came from (pytrees, typed PRNG keys); the other functions (the split
        halves) take flat arrays, a typed key as its raw key data, as the module holds it."""
        from remat_passes.jax import run
        if function != "main" or self.exported is None:
            args = tuple(_raw_key_data(a) for a in args)
        return run.compile(self, function)(*args)


def _raw_key_data(x):
    """A typed PRNG key array as its uint32 key data (what the exported module holds)."""
    import jax
    dtype = getattr(x, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return jax.random.key_data(x)
    return x


def write_atomically(path: str, data: bytes) -> None:
    """Write `data` to `path`. A regular file (or a new one) is replaced atomically (a
    temporary file renamed over it, keeping its mode), so a failed run leaves it whole; a
    symlink is followed to its target; anything else (a device, a FIFO, /dev/stdout) is
    opened and written directly."""
    shown = path
    try:
        st = os.stat(path)          # (follows symlinks)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise RematError(f"error: cannot write '{shown}': {e.strerror}") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        try:
            with open(path, "wb") as f:
                f.write(data)
        except OSError as e:
            raise RematError(f"error: cannot write '{shown}': {e.strerror}") from None
        return
    path = os.path.realpath(path)   # a symlink: replace its target, keep the link
    directory = os.path.dirname(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=".remat-", dir=directory)
    except OSError as e:
        raise RematError(f"error: cannot write '{shown}': {e.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        # mkstemp creates 0600; give the file the mode a plain open() would
        # (or keep the mode of the file it replaces).
        try:
            mode = os.stat(path).st_mode & 0o777
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as e:
        os.unlink(tmp)
        raise RematError(f"error: cannot write '{shown}': {e.strerror}") from None


def load(path: str) -> Module:
    """Read a module from a file in any supported format."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise RematError(f"error: cannot read '{path}': {e.strerror}") from None
    return Module.parse(data, filename=path)


def compiled_cost(module_op, functions) -> tuple[float, str]:
    """XLA's FLOP count of `functions` of an ir.Module and the backend's name
    (`run.compiled_cost`): what rp.remat and remat-opt give the passes as
    `PassState.compiled_cost`, for `auto(score=xla)`."""
    from remat_passes.jax import run
    return run.compiled_cost(Module(module_op), functions)


def compiled_memory(programs) -> tuple[list, str]:
    """XLA's footprint of each (ir.Module, function name) of `programs` (an iterable, taken
    as the compiles go) and the backend's name (`run.compiled_memory`: side by side):
    `PassState.compiled_memory`, for `auto(objective=peak, score=xla)`."""
    from remat_passes.jax import run
    return run.compiled_memory((Module(op), function) for op, function in programs)
