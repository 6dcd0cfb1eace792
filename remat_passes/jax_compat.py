"""Every use of JAX internals, in one place, with what differs between versions.

remat_passes supports jax/jaxlib from `JAX_MIN` up to (not including)
`JAX_BELOW`. It reaches into JAX's private modules for a handful of things
that have no public API; each is wrapped here so that a JAX release that
moves one breaks one function, not the package:

==========================  ===========================================  =========
what                        where (private)                               used by
==========================  ===========================================  =========
MLIR context with JAX's     `jax.interpreters.mlir.make_ir_context`      mlir.py
dialects
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
==========================  ===========================================  =========

What differs by version (the single list; tests ask the installed JAX for its
answers instead of encoding any of these):

* 0.10.2: `Exported` has the private field `_has_named_shardings`; the
  policies of `jax.checkpoint_policies` are frozen dataclass objects
  (`DotsSaveable`, `SaveOnlyTheseNames`, ...). Python >= 3.11.
* 0.11.0: those classes are also exported from `jax.checkpoint_policies`
  (`SaveOnlyTheseNames`, `SaveAnyNamesButThese`,
  `SaveAndOffloadOnlyTheseNames`). Python >= 3.12 from here on.
* 0.11.1: `Exported._has_named_shardings` is gone.
* 0.11.2: `tanh` is differentiated through `one_minus_square(tanh(x))`, so
  `jax.checkpoint` saves other residuals for tanh layers.
* 0.12.0: the built-in policies are plain closures again (no classes);
  `jax.ad_checkpoint.name_p` is public; `save_from_both_policies` folds
  `everything_saveable`/`nothing_saveable` operands away.

Nothing here imports JAX at module import time except where a function needs
it, so `import remat_passes` only checks the installed version's metadata.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from importlib import metadata

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


def check_installed_version() -> None:
    """Raise ImportError naming the problem if jax/jaxlib are outside the supported range.

    Reads package metadata only (no `import jax`). Set
    REMAT_PASSES_SKIP_JAX_VERSION_CHECK=1 to try an untested JAX anyway.
    """
    if os.environ.get(SKIP_CHECK_ENV):
        return
    for dist in ("jax", "jaxlib"):
        try:
            text = metadata.version(dist)
        except metadata.PackageNotFoundError:
            raise ImportError(
                f"remat_passes needs {dist} {supported_range()}, and {dist} is not installed "
                f"(pip install 'remat_passes' installs a supported one)") from None
        version = _parse_version(text)
        if not (JAX_MIN <= version < JAX_BELOW):
            raise ImportError(
                f"remat_passes supports {dist} {supported_range()}; {dist} {text} is installed. "
                f"Install a supported {dist}, or set {SKIP_CHECK_ENV}=1 to try this one "
                "anyway (it uses JAX internals that may have moved).")


def jax_version() -> tuple[int, ...]:
    import jax
    return _parse_version(jax.__version__)


# -------------------------------------------------------------- MLIR context --
def make_ir_context():
    """A fresh MLIR context with every dialect JAX emits registered."""
    from jax.interpreters import mlir as jax_interp_mlir
    return jax_interp_mlir.make_ir_context()


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
