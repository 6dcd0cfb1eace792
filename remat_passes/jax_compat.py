"""Every use of JAX internals, in one place, with what differs between versions.

remat_passes supports jax/jaxlib from `JAX_MIN` up to (not including)
`JAX_BELOW`. It reaches into JAX's private modules for a handful of things
that have no public API; each is wrapped here so that a JAX release that
moves one breaks one function, not the package:

==========================  ===========================================  =========
what                        where (private)                               used by
==========================  ===========================================  =========
the MLIR bindings, and a    `jaxlib.mlir` (what `jax.extend.mlir`         mlir.py
context with the dialects   re-exports) and the dialect registry of
JAX emits                   `jaxlib.mlir._mlir_libs._jax_mlir_ext`, as
                            `jax.interpreters.mlir.make_ir_context`
                            builds it; parsing needs no `import jax`
the `checkpoint_name`       `jax._src.ad_checkpoint.name_p`              jax_bridge,
primitive                                                                policies
its lowering rule           `jax._src.interpreters.mlir._lowerings`      jax_bridge
                            (+ `register_lowering`)
source positions that       `jax._src.source_info_util.register_exclusion`
skip our frames                                                          jax_bridge
`Exported` built by hand    `jax.export.Exported(...)` private fields    jax_bridge
primitives a JAX-style      `jax._src.lax.lax.dot_general_p`,            policies
policy is asked about       `...convolution.conv_general_dilated_p`,
                            `jax.extend.core.Primitive`
JAX's own saved_residuals   `jax._src.ad_checkpoint.saved_residuals`     tests, tools
whether a backend is        `jax._src.xla_bridge`'s                       devices,
started (without starting   `backends_are_initialized`                    memory, cli
one)
calling an Exported under   `Exported._in_named_shardings`,               run, rp.jit
GSPMD (JAX's own call       `_out_named_shardings` (`_has_named_shardings`
fails there)                to 0.11.0)
whether jax.vmap batches    `jax._src.core.trace_ctx.trace`, a            rp.jit
a call, and its axis name   `...interpreters.batching.BatchTrace`; a
                            tracer's `_trace`; the trace's `axis_data`
the axes a value varies     an aval's `manual_axis_type.varying`          rp.jit
over in a shard_map
the PRNG implementation of  a key dtype's `_impl`                         rp.jit
a key type (to wrap a key
returned by a split half)
the settings a thread has   `jax._src.config.config_states`, a state's   run
changed for itself (to      `value` and `get_global()`                    (compiling)
compile in another or not)
==========================  ===========================================  =========

What differs by version (the single list; tests ask the installed JAX for its
answers instead of encoding any of these):

* 0.10.2: `Exported` has the private field `_has_named_shardings`; the
  policies of `jax.checkpoint_policies` are frozen dataclass objects
  (`DotsSaveable`, `SaveOnlyTheseNames`, ...). Python >= 3.11.
  XLA:CPU schedules breadth first (its concurrency-optimized scheduler): an op runs
  as soon as what it reads is ready; it deletes optimization barriers before it fuses
  and schedules, so they hold nothing back (`xla_cpu_fuses_across_barriers`).
* 0.11.0: those classes are also exported from `jax.checkpoint_policies`
  (`SaveOnlyTheseNames`, `SaveAnyNamesButThese`,
  `SaveAndOffloadOnlyTheseNames`). Python >= 3.12 from here on.
* 0.11.1: `Exported._has_named_shardings` is gone.
* 0.11.2 (measured; perhaps earlier): XLA:CPU keeps optimization barriers until after it
  schedules: they split its fusions, as on GPU, and its breadth-first order waits for
  them (a barrier is an instruction, after a tuple of its operands), so a recomputation
  behind one runs where the program has it (`xla_cpu_fuses_across_barriers`).
* 0.11.2: `tanh` is differentiated through `one_minus_square(tanh(x))`, so
  `jax.checkpoint` saves other residuals for tanh layers.
* 0.12.0: the built-in policies are plain closures again (no classes);
  `jax.ad_checkpoint.name_p` is public; `save_from_both_policies` folds
  `everything_saveable`/`nothing_saveable` operands away.

Nothing here imports JAX at module import time except where a function needs
it: `import remat_passes` checks jaxlib's version (the bindings every pass uses),
and jax's is checked when `jax_bridge` first imports jax.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import re

JAX_MIN = (0, 10, 2)
JAX_BELOW = (0, 13)          # the next minor: we use semi-private APIs
SKIP_CHECK_ENV = "REMAT_PASSES_SKIP_JAX_VERSION_CHECK"


def _parse_version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("."):
        m = re.match(r"\d+", piece)
        if not m:
            break
        parts.append(int(m.group()))
    return tuple(parts)


def supported_range() -> str:
    return (f">={'.'.join(map(str, JAX_MIN))},<{'.'.join(map(str, JAX_BELOW))}")


def installed_version(dist: str) -> str | None:
    """The installed version of `jax` or `jaxlib`, None if it is not installed.

    Read from the packages themselves, not from package metadata (`importlib.metadata`
    costs the CLI's start-up about 40 ms): jaxlib's small `jaxlib.version` module
    (jaxlib is imported anyway for the MLIR bindings), and jax's `__version__`, which
    is only asked once jax is imported.
    """
    try:
        if dist == "jaxlib":
            from jaxlib import version
            return version.__version__
        import jax
        return jax.__version__
    except ImportError:
        return None


def check_installed_version(dists=("jax", "jaxlib")) -> None:
    """Raise ImportError naming the problem if jax/jaxlib are outside the supported range.

    `import remat_passes` checks jaxlib (jax pins jaxlib to its own release, so this
    covers what pip installs) and `jax_bridge` checks jax as it imports it. Set
    REMAT_PASSES_SKIP_JAX_VERSION_CHECK=1 to try an untested JAX anyway.
    """
    if os.environ.get(SKIP_CHECK_ENV):
        return
    for dist in dists:
        text = installed_version(dist)
        if text is None:
            raise ImportError(
                f"remat_passes needs {dist} {supported_range()}, and {dist} is not installed "
                f"(pip install 'remat_passes' installs a supported one)")
        version = _parse_version(text)
        if not (JAX_MIN <= version < JAX_BELOW):
            raise ImportError(
                f"remat_passes supports {dist} {supported_range()}; {dist} {text} is installed. "
                f"Install a supported {dist}, or set {SKIP_CHECK_ENV}=1 to try this one "
                "anyway (it uses JAX internals that may have moved).")


def xla_cpu_fuses_across_barriers() -> bool:
    """Does the installed jaxlib's XLA:CPU delete optimization barriers before it fuses and
    schedules, so that where they go changes neither its fusions nor its breadth-first
    order (cost/xla_schedule.py)? Measured on the benchmarks' GPT under `nothing_saveable`
    (joint form, XLA's footprint): 0.10.2 does (18,456,196 B with a barrier per
    recomputation or per checkpoint region); 0.11.2 and 0.12 do not (20,553,348 B per
    recomputation, 18,456,196 B per region; `jax.checkpoint`'s: 18,456,180 B). And on a
    program whose breadth-first order holds one more buffer without the barrier
    (test_memory): 1,572,864 B on 0.10.2, 1,310,720 B (the program order's) on 0.11.2 and
    0.12, which keep each barrier until after scheduling: a tuple of its operands, the
    barrier and a get-tuple-element per result, steps of the order like any instruction
    (read from XLA:CPU 0.12's scheduled HLO, which is exactly that order of its fused
    graph: xla_schedule's docstring)."""
    return _jaxlib_below((0, 11))


def aot_takes_sub_byte_results() -> bool:
    """Does an executable compiled ahead of time (`jax.jit(f).lower(...).compile()`) take
    a 4-bit or 2-bit array that another such executable returned? jaxlib 0.10 reports the
    returned array's layout as unpacked (sub_byte_element_size_in_bits=0) where the
    executable asks for the packed one, and refuses the call ("compiled for input layouts
    that disagree with the layouts of arguments"); 0.11.2 and 0.12 take it. (An array the
    user made passes on 0.10 too; so does any array through a plain `jax.jit` call.)"""
    return not _jaxlib_below((0, 11))


def settings_of_this_thread() -> list[str] | None:
    """The JAX settings this thread has changed for itself (`with jax.numpy_rank_promotion(
    "raise"):` and the other configuration context managers are per thread), by name; None
    where this JAX does not let us tell (its private `config_states`, the same from 0.10.2
    to 0.12). Work handed to another thread runs with the global settings only."""
    try:
        from jax._src import config
        states = list(config.config_states.items())
    except (ImportError, AttributeError):
        return None
    changed = []
    for name, state in states:
        try:
            local, shared = state.value, state.get_global()
            if local is not shared and local != shared:
                changed.append(name)
        except Exception:     # (a value without a usable ==: count it as changed)
            changed.append(name)
    return changed


def _jaxlib_below(version: tuple[int, ...]) -> bool:
    return _parse_version(installed_version("jaxlib") or "0") < version


def jax_version() -> tuple[int, ...]:
    import jax
    return _parse_version(jax.__version__)


# -------------------------------------------------------------- MLIR context --
_THREAD_POOL = None


def make_ir_context():
    """A fresh MLIR context with every dialect JAX emits registered.

    Built the way `jax.interpreters.mlir.make_ir_context` builds one, from
    jaxlib alone: importing `jax` costs the CLI most of its start-up time,
    and the passes need only the bindings. (On jax >= 0.12 JAX's factory also
    hands out a thread-local context that its own lowering reuses; ours is
    owned by remat_passes.)
    """
    from jaxlib.mlir import ir

    # the native registration functions: the Python op classes of chlo, mhlo and sdy
    # (jaxlib.mlir.dialects.*) cost start-up time and no pass builds their ops
    from jaxlib.mlir._mlir_libs import _chlo as chlo
    from jaxlib.mlir._mlir_libs import _jax_mlir_ext
    from jaxlib.mlir._mlir_libs import _mlirHlo as mhlo
    from jaxlib.mlir._mlir_libs import _sdy as sdy
    from jaxlib.mlir._mlir_libs import _stablehlo as stablehlo
    registry = ir.DialectRegistry()
    _jax_mlir_ext.register_dialects(registry)
    ctx = ir.Context()
    ctx.append_dialect_registry(registry)
    ctx.load_all_available_dialects()
    # An external thread pool, as JAX's contexts have: a context that owns its pool
    # joins those threads when multithreading is turned off, which hangs in a forked
    # child (mlir.parse's guard), where the threads do not exist.
    global _THREAD_POOL
    if _THREAD_POOL is None:
        _THREAD_POOL = ir.ThreadPool()
    ctx.set_thread_pool(_THREAD_POOL)
    sdy.register_dialect(ctx)
    mhlo.register_mhlo_dialect(ctx)
    chlo.register_dialect(ctx)
    stablehlo.register_dialect(ctx)
    return ctx


def portable_artifacts():
    """(serialize, deserialize) of StableHLO portable artifacts (`jax.extend.mlir`)."""
    from jax.extend import mlir as jax_extend_mlir
    return (jax_extend_mlir.serialize_portable_artifact,
            jax_extend_mlir.deserialize_portable_artifact)


def any_custom_call_check():
    """The `jax.export.DisabledSafetyCheck` that lets an export hold a custom call of any
    target. jax.export refuses the targets it does not guarantee to stay compatible across
    versions: on GPU, Pallas' Triton kernels, cuDNN attention
    (`dot_product_attention(implementation="cudnn")`), cuDNN block-scaled dots
    (`jax.nn.scaled_matmul`). The passes' exports are rewritten and compiled by the JAX that
    made them (the disk cache is keyed by its version), so that guarantee is not needed.
    ("ALL" is what `_check_module` reads as every target, jax 0.10.2 to 0.12.)"""
    from jax import export as jax_export
    return jax_export.DisabledSafetyCheck.custom_call("ALL")


# ---------------------------------------------------------- checkpoint names --
def name_primitive():
    """The primitive `jax.ad_checkpoint.checkpoint_name` binds."""
    from jax._src import ad_checkpoint
    return ad_checkpoint.name_p


@contextlib.contextmanager
def lowering_overridden(prim, rule):
    """Lower `prim` with `rule` (all platforms) for the duration; restore JAX's rule after."""
    from jax._src.interpreters import mlir as jax_lowering
    saved = jax_lowering._lowerings.get(prim)
    jax_lowering.register_lowering(prim, rule)
    try:
        yield
    finally:
        if saved is None:
            jax_lowering._lowerings.pop(prim, None)
        else:
            jax_lowering._lowerings[prim] = saved


@contextlib.contextmanager
def lowering_wrapped(prim, wrap):
    """Lower `prim` with `wrap(rule)` where JAX would use its default (platform-independent)
    rule `rule`, for the duration; platform-specific rules stay as they are."""
    from jax._src.interpreters import mlir as jax_lowering
    saved = jax_lowering._lowerings.get(prim)
    if saved is None:
        yield
        return
    with lowering_overridden(prim, wrap(getattr(saved, "rule", saved))):  # (an entry, 0.12)
        yield


def ragged_dot_primitive():
    """The primitive `jax.lax.ragged_dot` binds (`ragged_dot_general`)."""
    from jax._src.lax import lax as lax_internal
    return lax_internal.ragged_dot_general_p


@contextlib.contextmanager
def checkpoints_differentiated_as(make_region):
    """Within it, differentiating a `jax.checkpoint` call (JAX's `remat_p`) differentiates
    `make_region(fun, policy, prevent_cse)` of its body instead: JAX's own
    rematerialization of the call never happens, and the region `make_region` returns
    (an `rp.checkpoint` region) is what the exported program shows. JAX's JVP rule is
    restored on exit."""
    import jax
    from jax._src import ad_checkpoint
    from jax._src.interpreters import ad
    prim = ad_checkpoint.remat_p
    saved = ad.primitive_jvps[prim]

    def jvp(primals, tangents, *, jaxpr, prevent_cse, differentiated, policy):
        body = jaxpr_function(jaxpr)
        region = make_region(lambda *args: body(*args), policy, prevent_cse)
        out, out_dot = jax.jvp(region, tuple(primals),
                               tuple(instantiate_zeros(t) for t in tangents))
        return list(out), list(out_dot)
    ad.primitive_jvps[prim] = jvp
    try:
        yield
    finally:
        ad.primitive_jvps[prim] = saved


@contextlib.contextmanager
def scans_differentiated_by(wants, jvp):
    """Within it, a scan (`scan_p`) whose params `wants(params)` is differentiated by the JVP
    rule `jvp(primals, tangents, **params)` (linearized from it, for `jax.vjp`); others by
    JAX's own rules."""
    from jax._src.interpreters import ad
    from jax._src.lax.control_flow import loops
    prim = loops.scan_p
    saved_jvp, saved_lin = ad.primitive_jvps[prim], ad.primitive_linearizations.get(prim)

    def our_jvp(primals, tangents, **params):
        rule = jvp if wants(params) else saved_jvp
        return rule(primals, tangents, **params)

    def our_linearization(is_vjp, nonzeros, *primals, **params):
        if saved_lin is None or wants(params):
            return ad.fallback_linearize_rule(prim, is_vjp, nonzeros, *primals, **params)
        return saved_lin(is_vjp, nonzeros, *primals, **params)
    ad.primitive_jvps[prim], ad.primitive_linearizations[prim] = our_jvp, our_linearization
    try:
        yield
    finally:
        ad.primitive_jvps[prim] = saved_jvp
        if saved_lin is None:
            ad.primitive_linearizations.pop(prim, None)
        else:
            ad.primitive_linearizations[prim] = saved_lin


def jaxpr_function(jaxpr):
    """A function evaluating a primitive's `jaxpr` param (a ClosedJaxpr up to jax 0.10)."""
    from jax._src import core
    from jax._src.interpreters import partial_eval as pe
    return core.jaxpr_as_fun(jaxpr if hasattr(jaxpr, "consts") else pe.close_jaxpr(jaxpr))


def scan_layout(params: dict) -> tuple[int, int]:
    """How many of a `scan_p`'s operands are invariants, then carries (the rest are scanned):
    `num_consts`, `num_carry` up to jax 0.10; the operands' flat tree `ft_in` since 0.11."""
    if "num_consts" in params:
        return params["num_consts"], params["num_carry"]
    consts, carry, _ = params["ft_in"].update(list(range(len(params["ft_in"])))).unpack()
    return len(consts), len(carry)


def sub_jaxprs(eqn) -> list:
    """The jaxprs an equation holds in its params (a scan's body, a cond's branches)."""
    from jax._src import core
    return list(core.jaxprs_in_params(eqn.params))


def instantiate_zeros(tangent):
    """A tangent as an array (JAX's symbolic zero made a zeros array)."""
    from jax._src.interpreters import ad
    return ad.instantiate_zeros(tangent)


def is_checkpoint(eqn) -> bool:
    """Is the equation a `jax.checkpoint` call (JAX's `remat_p`)?"""
    from jax._src import ad_checkpoint
    return eqn.primitive is ad_checkpoint.remat_p


def current_lowering(prim):
    """The default lowering rule registered for `prim`, or None (for tests)."""
    from jax._src.interpreters import mlir as jax_lowering
    return jax_lowering._lowerings.get(prim)


def exclude_from_source_info(path: str) -> None:
    """Make JAX's source positions skip frames in files under `path` (as it skips its own)."""
    from jax._src import source_info_util
    source_info_util.register_exclusion(path)


# ----------------------------------------------------------------- Exported --
def make_exported(**fields):
    """A `jax.export.Exported` from the fields every supported version has.

    The private fields that differ between versions are filled in here:
    `_has_named_shardings` (<= 0.11.0) is False when no shardings are given.
    """
    from jax import export as jax_export
    names = {f.name for f in dataclasses.fields(jax_export.Exported)}
    if "_has_named_shardings" in names and "_has_named_shardings" not in fields:
        fields["_has_named_shardings"] = any(
            s is not None for s in fields.get("_in_named_shardings", ()) +
            fields.get("_out_named_shardings", ()))
    unknown = set(fields) - names
    for key in unknown:
        fields.pop(key)
    return jax_export.Exported(**fields)


def platform_in_use() -> str:
    """The platform XLA runs on in this process (`cpu`, `gpu`, `tpu`), found without
    starting a backend where none is started (public `jax.default_backend()` starts every
    one it finds: on a GPU host that initialises CUDA and XLA reserves most of the GPU's
    memory, seconds spent to rewrite text): the started backend's; else the first platform
    `JAX_PLATFORMS` (or `jax.config.jax_platforms`) names; else `gpu` or `tpu` where a JAX
    plugin for one is installed, as JAX would start it; else `cpu`."""
    import sys
    if "jax" in sys.modules:
        from jax._src import xla_bridge
        import jax
        if xla_bridge.backends_are_initialized():
            return jax.default_backend()
        asked = jax.config.jax_platforms or ""
    else:
        asked = os.environ.get("JAX_PLATFORMS", "")
    first = asked.split(",")[0].strip().lower()
    if first:
        return {"cuda": "gpu", "rocm": "gpu"}.get(first, first)
    return _installed_accelerator() or "cpu"


def _installed_accelerator() -> str | None:
    """`gpu` or `tpu` where a PJRT plugin for one is installed (JAX's `jax_plugins`
    namespace modules and entry points, or libtpu), else None; nothing is imported."""
    import importlib.metadata
    import importlib.util
    names = [e.name for e in importlib.metadata.entry_points(group="jax_plugins")]
    spec = importlib.util.find_spec("jax_plugins")
    if spec is not None and spec.submodule_search_locations:
        import pkgutil
        names += [m.name for m in pkgutil.iter_modules(spec.submodule_search_locations)]
    if any("cuda" in n or "rocm" in n for n in names):
        return "gpu"
    if any("tpu" in n for n in names) or importlib.util.find_spec("libtpu") is not None:
        return "tpu"
    return None


def exported_for_call(exp):
    """(`exp` as `jax.jit(exp.call)` can lower it under the partitioner in use, the
    keyword arguments that jax.jit then needs: {} or {"out_shardings": ...}).

    JAX's call_exported wraps each argument and result in a Shardy sharding op whatever the
    partitioner (`use_shardy=True`, jax 0.10.2 to 0.12), which the MLIR verifier refuses
    under GSPMD (`jax_use_shardy_partitioner=False`: "'stablehlo.custom_call' op should have
    a sharding attribute of type TensorShardingPerValueAttr"), so JAX cannot call its own
    Exported of a sharded function there. Under GSPMD the named shardings are taken out of
    the Exported, and those of its results handed to jax.jit instead (jax.jit takes no
    argument sharding over an abstract mesh: arguments keep the shardings they come with,
    and the module's own argument shardings place those that come without)."""
    import jax
    named = tuple(exp._in_named_shardings) + tuple(exp._out_named_shardings)
    if jax.config.jax_use_shardy_partitioner or all(s is None for s in named):
        return exp, {}
    fields = dict(_in_named_shardings=(None,) * len(exp._in_named_shardings),
                  _out_named_shardings=(None,) * len(exp._out_named_shardings))
    if hasattr(exp, "_has_named_shardings"):        # jax <= 0.11.0
        fields["_has_named_shardings"] = False
    return dataclasses.replace(exp, **fields), {"out_shardings": jax.tree_util.tree_unflatten(
        exp.out_tree, list(exp._out_named_shardings))}


def vmap_batches(leaves) -> bool:
    """Does jax.vmap batch a call with these arguments: is it the innermost transformation
    here (what a call made now is traced by), and are some of them batched by it? (Public
    JAX does not say: `jax._src.core.trace_ctx.trace`, a
    `jax._src.interpreters.batching.BatchTrace`, and a tracer's `_trace`.)"""
    try:
        from jax._src import core
        from jax._src.interpreters import batching
        trace = core.trace_ctx.trace
    except (ImportError, AttributeError):   # (a JAX that moved them: no batched call, and
        return False                        # jax.vmap's call fails as JAX's own does)
    return isinstance(trace, batching.BatchTrace) and any(
        getattr(x, "_trace", None) is trace for x in leaves)


def autodiff_mode(leaves) -> str | None:
    """How JAX's autodiff traces these arguments, where it is the innermost transformation
    of some: "forward" (jax.jvp, jax.jacfwd: `JVPTracer`), "reverse" (jax.grad, jax.vjp,
    jax.jacrev, jax.linearize: `LinearizeTracer`, jax 0.10 to 0.12), else None. (Public
    JAX does not say: the tracer types of `jax._src.interpreters.ad`.)"""
    try:
        from jax._src.interpreters import ad
    except ImportError:
        return None
    for mode, name in (("forward", "JVPTracer"), ("reverse", "LinearizeTracer")):
        kind = getattr(ad, name, None)
        if kind is not None and any(isinstance(x, kind) for x in leaves):
            return mode
    return None


def vmap_axis() -> dict:
    """The axis of the jax.vmap that is the innermost transformation here, as `jax.vmap`
    takes it: {'axis_name': ..., 'spmd_axis_name': ...}, those it was given. (Public JAX
    does not say: the `BatchTrace`'s `axis_data`.)"""
    from jax._src import core
    data = core.trace_ctx.trace.axis_data
    out = {}
    if data.name is not core.no_axis_name:
        out["axis_name"] = data.name
    if data.spmd_name is not None:
        out["spmd_axis_name"] = data.spmd_name
    return out


def varying_axes(x) -> frozenset:
    """The manual mesh axes (of a shard_map) a value varies over, as JAX types it inside
    the shard_map: empty for a value replicated over them, or outside one. (An aval's
    `manual_axis_type.varying` in jax 0.10 to 0.12; `vma` before.)"""
    import jax
    aval = jax.typeof(x)
    kind = getattr(aval, "manual_axis_type", None)
    return frozenset(kind.varying if kind is not None else getattr(aval, "vma", ()))


def key_impl(dtype):
    """The PRNG implementation of a typed key dtype (`key<fry>`), as
    `jax.random.wrap_key_data(..., impl=)` takes it; None for any other dtype. (Public
    JAX gives it for a key array, `jax.random.key_impl`, not for a dtype.)"""
    import jax
    if not jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return None
    return dtype._impl


def serialize_exported(exp) -> bytes:
    """`exp.serialize()`. jax <= 0.11.0 refuses an Exported made without named shardings
    (`_has_named_shardings` False); ours has none to give (each is None: unspecified,
    which its serialization writes as such)."""
    if not getattr(exp, "_has_named_shardings", True):
        exp = dataclasses.replace(exp, _has_named_shardings=True)
    return exp.serialize()


def exported_module_bytes(data: bytes) -> bytes:
    """The serialized StableHLO module inside a serialized `jax.export.Exported`, read from
    its flatbuffer without rebuilding the rest (`jax.export.deserialize` also rebuilds the
    calling convention's pytrees, which needs every custom pytree type registered in this
    process: an optax state's NamedTuples, say). JAX's own generated flatbuffer reader."""
    from jax._src.export import serialization as ser
    root = ser.ser_flatbuf.Exported.GetRootAsExported(bytearray(data))
    return root.MlirModuleSerializedAsNumpy().tobytes()


def replace_exported_module(data: bytes, module_bytes: bytes) -> bytes:
    """A serialized `jax.export.Exported` with its module replaced, everything else (the
    calling convention's pytrees, avals, shardings, platforms, effects) byte for byte as it
    was, so that no pytree type needs to be registered here. The new module is appended as
    a flatbuffer vector and the root table's field is pointed at it (a flatbuffer offset
    points forward, so an appended vector can always be reached); the old one stays behind
    as dead bytes."""
    import inspect
    import struct

    from jax._src.export import serialization as ser
    buf = bytearray(data)
    root = ser.ser_flatbuf.Exported.GetRootAsExported(buf, 0)
    # the vtable slot of the module field, from JAX's own generated reader
    slot = int(re.search(r"Offset\((\d+)\)", inspect.getsource(
        type(root).MlirModuleSerializedLength)).group(1))
    o = root._tab.Offset(slot)
    if o == 0:
        raise ValueError("the serialized Exported has no module")
    field = root._tab.Pos + o
    buf += bytes(-len(buf) % 4)                 # a vector's length is 4-byte aligned
    vector = len(buf)
    buf += struct.pack("<I", len(module_bytes)) + bytes(module_bytes)
    struct.pack_into("<I", buf, field, vector - field)
    return bytes(buf)


def export_target_version() -> str:
    """The StableHLO version `jax.export` serializes for (what a JAX four weeks older reads)."""
    from jax.extend.mlir.dialects import stablehlo
    try:
        return stablehlo.get_version_from_compatibility_requirement(
            stablehlo.StablehloCompatibilityRequirement.WEEK_4)
    except AttributeError:   # pragma: no cover - older jaxlib
        return stablehlo.get_current_version()


# ---------------------------------------------------------------- policies --
def policy_primitives():
    """(dot_general_p, conv_general_dilated_p, name_p, Primitive class)."""
    from jax._src.lax import convolution, lax
    try:
        from jax.extend.core import Primitive
    except ImportError:  # pragma: no cover - older layouts
        from jax._src.core import Primitive
    return lax.dot_general_p, convolution.conv_general_dilated_p, name_primitive(), Primitive


def native_policy_spec(policy) -> str | None:
    """The spec of our own policy equal to a policy object from `jax.checkpoint_policies`.

    Recognises JAX's built-ins in every supported version: the functions
    (`dots_saveable`, ...), the dataclass objects of 0.10-0.11
    (`SaveOnlyTheseNames(saveable_names=...)`, ...) and the closures of 0.12
    (`save_only_these_names.<locals>.policy` and its captured names). Returns
    None for anything else (it is then called as a JAX-style policy).
    """
    module = getattr(policy, "__module__", "") or ""
    if not (module == "jax" or module.startswith("jax.")):
        return None
    tname = type(policy).__name__
    q = _quote_names
    if tname == "SaveOnlyTheseNames":
        return f"save_only_these_names({q(policy.saveable_names)})"
    if tname == "SaveAnyNamesButThese":
        return f"save_any_names_but_these({q(policy.names)})"
    if tname == "SaveAndOffloadOnlyTheseNames":
        return _save_and_offload_spec(policy.names_which_can_be_saved,
                                      policy.names_which_can_be_offloaded,
                                      policy.offload_src, policy.offload_dst)
    if tname == "OffloadDotWithNoBatchDims":
        return f"offload_dot_with_no_batch_dims({policy.offload_src!r}, {policy.offload_dst!r})"
    if tname == "DotsSaveable":
        return ("dots_with_no_batch_dims_saveable" if policy.only_if_no_batch_dims
                else "dots_saveable")
    qualname = getattr(policy, "__qualname__", "")
    if qualname in ("everything_saveable", "nothing_saveable", "dots_saveable",
                    "dots_with_no_batch_dims_saveable"):
        return qualname
    captured = _closure_vars(policy)
    if captured is None:
        return None
    outer = qualname.split(".<locals>.", 1)[0]
    try:
        if outer == "save_only_these_names":
            return f"save_only_these_names({q(captured['names_which_can_be_saved'])})"
        if outer in ("save_any_names_but_these", "save_anything_except_these_names"):
            return f"{outer}({q(captured['names_not_to_save'])})"
        if outer == "save_and_offload_only_these_names":
            return _save_and_offload_spec(captured["names_which_can_be_saved"],
                                          captured["names_which_can_be_offloaded"],
                                          captured["offload_src"], captured["offload_dst"])
        if outer == "offload_dot_with_no_batch_dims":
            return (f"offload_dot_with_no_batch_dims({captured['offload_src']!r}, "
                    f"{captured['offload_dst']!r})")
        if outer == "save_from_both_policies":
            one = native_policy_spec(captured["policy_1"])
            two = native_policy_spec(captured["policy_2"])
            if one is not None and two is not None:
                return f"save_from_both_policies({one}, {two})"
    except KeyError:
        return None
    return None


def _quote_names(names) -> str:
    return ", ".join(repr(n) for n in sorted(names))


def _save_and_offload_spec(saved, offloaded, src, dst) -> str:
    return ("save_and_offload_only_these_names("
            f"names_which_can_be_saved=[{_quote_names(saved)}], "
            f"names_which_can_be_offloaded=[{_quote_names(offloaded)}], "
            f"offload_src={src!r}, offload_dst={dst!r})")


def _closure_vars(fn) -> dict | None:
    code = getattr(fn, "__code__", None)
    cells = getattr(fn, "__closure__", None)
    if code is None or not cells:
        return None
    try:
        return {name: cell.cell_contents for name, cell in zip(code.co_freevars, cells)}
    except ValueError:   # an empty cell
        return None


# ------------------------------------------------------------ JAX's answers --
def jax_saved_residuals(fun, *args, **kwargs):
    """JAX's own `saved_residuals(fun, *args)`: [(aval, description)]."""
    try:
        from jax.ad_checkpoint import saved_residuals  # type: ignore[attr-defined]
    except ImportError:
        from jax._src.ad_checkpoint import saved_residuals
    return saved_residuals(fun, *args, **kwargs)
