"""Run a Module with XLA: `to_exported` turns any function of it back into a
`jax.export.Exported`, `compile` into a jitted callable, on the default backend.

Takes a Module and never imports its class (`Module.call` and `Module.to_exported`
come here).
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import export as jax_export

from remat_passes import jax_compat
from remat_passes.ir import contract, graph, mlir
from remat_passes.ir.mlir import RematError, func, ir
from remat_passes.sharding import gspmd

jax_compat.check_installed_version(("jax",))   # jaxlib was checked by `import remat_passes`

# the checkpoint-name markers a module may still hold are custom calls JAX must accept, and
# so are the user's own kernels (jax_compat.any_custom_call_check)
EXPORT_CHECKS = (jax_export.DisabledSafetyCheck.custom_call(contract.NAME_TARGET),
                 jax_compat.any_custom_call_check())

# ------------------------------------------------------ compile & call --
def backend(what: str) -> str:
    """The name of JAX's default backend, started if none is; where JAX cannot start one
    (`JAX_PLATFORMS` naming a platform this machine has no plugin or device for), a
    RematError that says `what` needed it."""
    try:
        return jax.default_backend()
    except Exception as e:      # (jax 0.12 asserts where JAX_PLATFORMS names no plugin)
        asked = os.environ.get("JAX_PLATFORMS")
        raise RematError(f"error: {what} compiles with XLA, and JAX could not start a backend"
                         + (f" (JAX_PLATFORMS={asked})" if asked else "")
                         + (f": {e}" if str(e) else "")) from None


# (the narrow types where the installed JAX has them: float4 and e8m0 from jax 0.5, int2 later)
_DTYPES = {elem: getattr(jnp, name) for elem, name in graph.DTYPE_NAMES.items()
           if hasattr(jnp, name)}


def _aval(t):
    rt = ir.RankedTensorType(t)
    elem = str(rt.element_type)
    if elem not in _DTYPES:
        raise RematError(f"error: cannot call a function with element type {elem}")
    return jax.core.ShapedArray(tuple(rt.shape), np.dtype(_DTYPES[elem]))


def _single_function_module(module, function: str):
    """A copy whose public @main runs `function`, markers stripped.

    For another function, a public @main wrapper calls it, so calls between
    private functions keep their symbols.
    """
    from remat_passes.passes.strip_checkpoint_names import strip
    copy = module.clone()
    target = graph.find_func(copy.op, function)  # raises a clear error if absent
    with copy.op.context, ir.Location.unknown():
        strip(copy.op)
        if function == "main":
            return copy
        for op in list(copy.op.body.operations):
            if op.operation.name == "func.func" and graph.func_name(op) == "main":
                op.operation.attributes["sym_name"] = ir.StringAttr.get("main_original")
                op.operation.attributes["sym_visibility"] = ir.StringAttr.get("private")
        target.operation.attributes["sym_visibility"] = ir.StringAttr.get("private")
        ftype = target.type
        wrapper = func.FuncOp("main", ftype, ip=ir.InsertionPoint(copy.op.body))
        block = wrapper.add_entry_block()
        with ir.InsertionPoint(block):
            call = func.CallOp(list(ftype.results), ir.FlatSymbolRefAttr.get(function),
                               list(block.arguments))
            func.ReturnOp(list(call.results))
    return copy


def serialize_exported(module) -> bytes:
    """@main of `module` as a serialized jax.export.Exported (`Module.serialize_exported`).
    Its module is a StableHLO portable artifact for the version `jax.export` targets."""
    if graph.main_signature(module.op) is None:
        raise RematError("error: no @main to write as a jax.export.Exported (mode=split makes "
                         "@main_fwd and @main_bwd: write the joint form, or the halves as MLIR)")
    copy = _single_function_module(module, "main")
    artifact = mlir.to_portable_artifact(copy.op, jax_compat.export_target_version())
    now = graph.main_signature(copy.op)
    origin = module.serialized_origin
    was = module.origin_signature if origin is not None else \
        module.exported_signature if module.exported is not None else None
    if was is not None and now != was:
        raise RematError(
            "error: cannot write a jax.export.Exported with the calling convention of the "
            f"function: @main was {was} and is now {now} (the passes changed its type)")
    if origin is not None:     # byte for byte, but the module: no pytree type needed here
        return jax_compat.replace_exported_module(origin, artifact)
    exp = module.exported if module.exported is not None else to_exported(module)
    try:
        return jax_compat.serialize_exported(
            dataclasses.replace(exp, mlir_module_serialized=artifact))
    except ValueError as e:    # a pytree type not registered for serialization
        raise RematError(f"error: cannot serialize the calling convention: {e}") from None


class DynamicShapes(RematError):
    """A function with dynamic dimensions that JAX cannot call (`to_exported`)."""


def to_exported(module, function: str = "main"):
    """A jax.export.Exported that runs `function` of `module`.

    @main keeps the Exported's calling convention (pytrees, platform index,
    symbolic shapes) as long as its signature is what was imported.
    """
    mlir.expect_module(module, "rp.to_exported")
    copy = _single_function_module(module, function)
    serialized = copy.bytecode()
    exp = module.exported
    if exp is not None and function == "main" and \
            graph.main_signature(copy.op) == module.exported_signature:
        return dataclasses.replace(exp, mlir_module_serialized=serialized)
    main = graph.find_func(copy.op, "main")
    in_avals = tuple(_aval(t) for t in main.type.inputs)
    out_avals = tuple(_aval(t) for t in main.type.results)
    if any(d < 0 for a in in_avals for d in a.shape):
        raise DynamicShapes(
            f"error: @{function} has dynamic dimensions, and only an exported @main keeps the "
            "symbolic shapes JAX needs to call a function with them (the split halves and "
            "written modules do not): export for concrete shapes to run it")
    n_in, n_out = len(in_avals), len(out_avals)
    platforms = exp.platforms if exp is not None else (backend("running the module"),)
    out_tree = jax.tree_util.tree_structure(0 if n_out == 1 else (0,) * n_out)
    return jax_compat.make_exported(
        fun_name=function,
        in_tree=jax.tree_util.tree_structure(((0,) * n_in, {})),
        in_avals=in_avals,
        out_tree=out_tree,
        out_avals=out_avals,
        _in_named_shardings=(None,) * n_in,
        _out_named_shardings=(None,) * n_out,
        in_shardings_hlo=(None,) * n_in,
        out_shardings_hlo=(None,) * n_out,
        nr_devices=exp.nr_devices if exp is not None else gspmd.num_devices(copy.op),
        platforms=tuple(platforms),
        ordered_effects=(),
        unordered_effects=(),
        disabled_safety_checks=EXPORT_CHECKS,
        mlir_module_serialized=serialized,
        calling_convention_version=exp.calling_convention_version if exp is not None else 10,
        module_kept_var_idx=tuple(range(n_in)),
        uses_global_constants=False,
        _get_vjp=None,
    )


def compiled_cost(module, functions) -> tuple[float, str]:
    """XLA's count (flops + transcendentals of `cost_analysis()`) of `functions` of a
    Module, each compiled for the default backend from its argument types alone (what
    `auto(..., score=xla)` compares), and that backend's name."""
    def count():
        total = 0.0
        with compiling() as start:       # (the halves side by side)
            waiting = [start(_lowered_alone(module, name, "score=xla")) for name in functions]
            analyses = [wait().cost_analysis() for wait in waiting]
        for analysis in analyses:
            if isinstance(analysis, (list, tuple)):
                analysis = analysis[0] if analysis else {}
            analysis = analysis or {}
            total += float(analysis.get("flops", 0.0)) + float(
                analysis.get("transcendentals", 0.0))
        return total
    key = _key(module, ("cost", tuple(functions)), "score=xla")
    return (_MEASURED[key] if key in _MEASURED else _store(key, count())), \
        backend("score=xla")


def compiled_memory(programs) -> tuple[list, str]:
    """What each (Module, function name) of `programs` holds on the device as XLA compiles
    it for the default backend from its argument types alone: its arguments, outputs (less
    those aliased to donated arguments) and scratch buffer, from `memory_analysis()` (what
    `auto(..., objective=peak, score=xla)` bounds), and that backend's name. The compiles
    run side by side (`compiling`): `programs`, an iterable, is taken as they go, with at
    most `compile_threads()` compiles under way, so that the caller makes each program (a
    trial plan) while those before it compile, and no more of them are held at once."""
    what = "objective=peak with score=xla"
    threads = compile_threads()
    keys: list = []
    found: dict = {}                                    # key -> footprint, this call's
    pending: collections.deque = collections.deque()    # (key, wait): compiling
    with compiling() as start:
        def finish_oldest():
            key, wait = pending.popleft()
            found[key] = _store(key, footprint(wait()))
        for module, function in programs:
            key = _key(module, ("memory", function), what)
            keys.append(key)
            if key in found or any(k == key for k, _ in pending):
                continue        # (two trial plans that made the same program)
            if key in _MEASURED:
                found[key] = _MEASURED[key]
                continue
            pending.append((key, start(_lowered_alone(module, function, what))))
            if len(pending) >= threads:
                finish_oldest()
        while pending:
            finish_oldest()
    if any(found[key] is None for key in keys):
        raise RematError(f"error: {what} weighs each plan by XLA's memory_analysis(), which "
                         f"the {backend(what)} backend does not give: use score=model")
    return [found[key] for key in keys], backend(what)


# what compiled_cost and compiled_memory measured, by the program's text: trial plans at
# different budgets often make the same program, and objective=peak's check compiles the
# plan its trials made (bounded: the oldest half is dropped when it fills)
_MEASURED: dict = {}
_MEASURED_MAX = 512


def _key(module, what: tuple, option: str) -> tuple:
    """The key of the measurement `what` of `module` in `_MEASURED`: the module's text, the
    backend and XLA_FLAGS; `option` names what compiles, for the error where JAX starts no
    backend."""
    text = hashlib.sha256(str(module).encode()).hexdigest()
    return (what, text, backend(option), os.environ.get("XLA_FLAGS", ""))


def _store(key, value):
    """`value`, kept in `_MEASURED` under `key`."""
    if len(_MEASURED) >= _MEASURED_MAX:
        for old in list(_MEASURED)[:_MEASURED_MAX // 2]:
            del _MEASURED[old]
    _MEASURED[key] = value
    return value


def footprint(executable) -> int | None:
    """What a compiled executable holds while it runs, as XLA's `memory_analysis()` says:
    temp + arguments + outputs - aliased (None where the backend does not say)."""
    try:
        m = executable.memory_analysis()
    except Exception:             # (a backend without memory analysis)
        return None
    if m is None:
        return None
    return int(m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes
               - m.alias_size_in_bytes)


COMPILE_THREADS_ENV = "REMAT_PASSES_COMPILE_THREADS"


def compile_threads() -> int:
    """How many XLA compiles may run side by side: $REMAT_PASSES_COMPILE_THREADS, else on
    the CPU backend the CPUs this process may use, and 1 on the others: XLA:GPU measures
    kernels on the device as it compiles (autotuning), and compiles side by side there are
    not measured yet. A RematError for a value that is not a whole number >= 1."""
    text = os.environ.get(COMPILE_THREADS_ENV, "").strip()
    if text:
        if text.isdigit() and int(text) >= 1:
            return int(text)
        raise RematError(f"error: {COMPILE_THREADS_ENV}={text!r}: give a whole number of "
                         "threads, 1 or more (1 compiles one program after another)")
    if jax.default_backend() != "cpu":
        return 1
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:          # (not on Linux)
        return os.cpu_count() or 1


@contextlib.contextmanager
def compiling():
    """A function `start(lowering)` that starts XLA's compilation of a `jax.jit(...).lower(
    ...)` and gives back a function that waits for its executable. Several started compile
    side by side in threads (up to `compile_threads()` of them): XLA compiles without
    holding Python's lock, and the lowering before, MLIR work under that lock, stays in the
    calling thread. One after another where one thread is asked for, and where this thread
    has changed a JAX setting for itself (a configuration context manager: another thread
    would compile with the global value)."""
    threads = compile_threads()
    if threads == 1 or jax_compat.settings_of_this_thread() != []:
        def start_now(lowering):
            executable = lowering.compile()
            return lambda: executable
        yield start_now
        return
    with concurrent.futures.ThreadPoolExecutor(threads, "remat-passes-compile") as pool:
        yield lambda lowering: pool.submit(lowering.compile).result


def _lowered_alone(module, name: str, what: str):
    """`name` of a Module lowered for the default backend from its argument types alone, to
    compile, for `what` (an option that compiles plans: one device, static shapes)."""
    backend(what)
    try:
        exported = to_exported(module, name)
    except DynamicShapes:
        exported = None
    if exported is None or any(d < 0 for a in exported.in_avals for d in a.shape):
        raise RematError(f"error: {what} compiles each plan and needs static shapes; "
                         f"@{name} has dynamic dimensions (export it for one shape)")
    if exported.nr_devices != 1:
        raise RematError(f"error: {what} compiles each plan for one device; @{name} "
                         f"runs on {exported.nr_devices}")
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in exported.in_avals]
    return jax.jit(_named(exported.call, name)).lower(*avals)


def memory_kinds(module, function: str, which: str) -> list:
    """`mhlo.memory_kind` of each result (`which="res_attrs"`) or argument ("arg_attrs")
    of `function` (annotate-host-offload sets it on offloaded residuals); None: default."""
    with module.op.context:
        f = graph.find_func(module.op, function)
        n = len(f.type.results if which == "res_attrs" else f.type.inputs)
        return [contract.memory_kind(f, which, i) for i in range(n)]


def usable_donations(inputs: list, outputs: list, in_kinds: list, out_kinds: list) -> tuple:
    """Positions of the inputs whose buffers an output of the same shape and type in the
    same memory can take (donating others only makes JAX warn; a residual in host memory
    taken by a gradient in device memory aborts the process in PjRt). `in_kinds`,
    `out_kinds`: each value's memory kind (None: the device's)."""
    def key(aval, kind):
        return tuple(aval.shape), aval.dtype, kind or "device"
    free: dict = {}
    for o, kind in zip(outputs, out_kinds, strict=True):
        free[key(o, kind)] = free.get(key(o, kind), 0) + 1
    out = []
    for i, (a, kind) in enumerate(zip(inputs, in_kinds, strict=True)):
        k = key(a, kind)
        if free.get(k):
            free[k] -= 1
            out.append(i)
    return tuple(out)


def placed_shardings(kinds: list, device) -> list | None:
    """Single-device shardings that put each value in its memory kind (None: default), or
    None when no value has one or the program is not on one `device`. XLA must see an
    offloaded residual leave or enter an executable in host memory: a value moved to host
    that is returned in device memory fails to compile on GPU."""
    if not any(kinds) or device is None:
        return None
    return [None if k is None else jax.sharding.SingleDeviceSharding(device, memory_kind=k)
            for k in kinds]


def memory_kind_shardings(module, function: str, device, out_tree=None) -> dict:
    """`jax.jit` keyword arguments for `function` of `module`: out_shardings that return
    its results with a memory kind in that memory (see `placed_shardings`), in the shape
    its call returns them: `out_tree` where it keeps an Exported's calling convention (a
    function jax.export gave memory kinds, as under an offloading `jax.checkpoint`), else
    as `to_exported` gives them (one result bare, several a tuple); {} for none."""
    placed = placed_shardings(memory_kinds(module, function, "res_attrs"), device)
    if placed is None:
        return {}
    if out_tree is not None:
        return {"out_shardings": jax.tree_util.tree_unflatten(out_tree, placed)}
    return {"out_shardings": placed[0] if len(placed) == 1 else tuple(placed)}


def compile(module, function: str = "main", donate_argnums=()):
    """Compile `function` of `module` with XLA (default backend); returns a callable,
    which compiles once per input signature, as `jax.jit` does (and the same callable is
    returned while the module is unchanged, so `Module.call` compiles once too).

    A function that kept an Exported's calling convention takes the original
    pytrees; any other (the split <f>_fwd/<f>_bwd, hand-written modules) takes
    flat arrays, and pytrees of arrays are flattened for it. `donate_argnums` donates
    arguments as `jax.jit` does.
    """
    mlir.expect_module(module, "rp.compile")
    donate = (donate_argnums,) if isinstance(donate_argnums, int) else tuple(donate_argnums)
    key = (function, donate, hashlib.sha256(module.bytecode()).digest())
    cache = module.__dict__.setdefault("_compiled", {})
    if key not in cache:
        exported = to_exported(module, function)
        donate = _in_same_memory(module, function, exported, donate)
        # (an offloaded residual leaves <f>_fwd in host memory, whichever convention it has)
        pytrees = module.exported is not None and exported.in_tree == module.exported.in_tree
        placed = {} if exported.nr_devices != 1 else memory_kind_shardings(
            module, function, jax.devices()[0], exported.out_tree if pytrees else None)
        if pytrees:
            exported, jit_kw = jax_compat.exported_for_call(exported)
            cache[key] = jax.jit(_named(exported.call, function), donate_argnums=donate,
                                 **(jit_kw or placed))
        else:
            cache[key] = jax.jit(
                _named(lambda *args: exported.call(*jax.tree_util.tree_leaves(args)), function),
                donate_argnums=donate, **placed)
    return cache[key]


def _in_same_memory(module, function: str, exported, donate: tuple) -> tuple:
    """`donate` less the arguments no result of the same shape, type and memory can take
    (`usable_donations`), for a function that takes flat arrays, some of them in host
    memory (an offloaded residual); else `donate` as given."""
    in_kinds = memory_kinds(module, function, "arg_attrs")
    n = len(exported.in_avals)
    flat = jax.tree_util.tree_structure((tuple(range(n)), {}))
    if not any(in_kinds) or exported.in_tree != flat or not all(0 <= i < n for i in donate):
        return donate
    return tuple(donate[k] for k in usable_donations(
        [exported.in_avals[i] for i in donate], exported.out_avals,
        [in_kinds[i] for i in donate], memory_kinds(module, function, "res_attrs")))


def _named(call, function: str):
    """`call` under the function's name, so that XLA's dumps and profiles name the program
    `jit_<function>` (`jit_main_bwd`), not `jit__lambda`."""
    def named(*args, **kwargs):
        return call(*args, **kwargs)
    named.__name__ = named.__qualname__ = function
    return named


