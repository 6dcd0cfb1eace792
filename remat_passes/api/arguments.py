"""How `rp.jit` takes a call's arguments apart (static, dynamic, by keyword: `split`;
donated: `donated_positions`; the instance of a method: `Method`), what of them a compiled
program depends on (its signature), where it puts them (`in_shardings`; on the devices of a
function that runs on several where they come on none: `for_devices`), and a typed PRNG
key as the data a split half takes (`key_data`), and calls on the arguments' leaves for
JAX's custom rules (`LeafCalls`)."""
from __future__ import annotations

import dataclasses
import inspect

import jax
import numpy as np

from remat_passes import jax_compat


def leaf_key(x) -> tuple:
    """What of an argument leaf a compiled program depends on."""
    if isinstance(x, jax.core.Tracer):  # (under jax.jit: its abstract value)
        return (x.shape, x.dtype, getattr(x.aval, "weak_type", False), None)
    if isinstance(x, jax.Array):      # (a typed PRNG key array has no weak_type)
        return (x.shape, x.dtype, getattr(x, "weak_type", False), x.sharding)
    if isinstance(x, jax.ShapeDtypeStruct):  # (lower(): a shape to build for, no data)
        # without a sharding: where an array made without one lives, so that a call with
        # such arrays runs what `lower` built
        sharding = x.sharding if x.sharding is not None else \
            jax.sharding.SingleDeviceSharding(jax.devices()[0])
        return (x.shape, x.dtype, x.weak_type, sharding)
    if isinstance(x, (bool, int, float, complex)):       # Python scalars: weakly typed
        return (type(x),)
    a = np.asarray(x)   # (a float64 one without x64 runs as float32, as under jax.jit)
    return (a.shape, jax.dtypes.canonicalize_dtype(a.dtype), False, None)


class LeafCalls:
    """Functions of the dynamic arguments' pytrees (structure `tree`) called on their leaves
    and giving their results' leaves, as JAX's custom rules (custom_vjp, custom_vmap) take
    and give arrays: `calls(run, leaves)`; `unflatten(outs)` puts results back in the
    pytree of the last run."""

    def __init__(self, tree):
        self.tree, self.results = tree, None

    def __call__(self, run, leaves) -> list:
        out, self.results = jax.tree_util.tree_flatten(
            run(*jax.tree_util.tree_unflatten(self.tree, leaves)))
        return out

    def unflatten(self, outs):
        return jax.tree_util.tree_unflatten(self.results, outs)


def key_data(x):
    """A typed PRNG key array as the data a split half takes (the halves are programs of
    their own, typed by their MLIR: a key is its `uint32` words there); anything else as
    it is."""
    if isinstance(x, jax.Array) and jax_compat.key_impl(x.dtype) is not None:
        return jax.random.key_data(x)
    if isinstance(x, jax.ShapeDtypeStruct) and jax_compat.key_impl(x.dtype) is not None:
        data = jax.eval_shape(jax.random.key_data, x)     # (a spec: its words' shape)
        return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=x.sharding)
    return x


def hashable(value, position: int | str):
    try:
        hash(value)
    except TypeError:
        raise TypeError(f"rp.jit: static argument {position!r} must be hashable, got "
                        f"{type(value).__name__}") from None
    return value


def signature(fun):
    try:
        return inspect.signature(fun)
    except (TypeError, ValueError):
        return None


def as_names(value, what: str) -> tuple:
    names = (value,) if isinstance(value, str) else tuple(value)
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise TypeError(f"rp.jit: {what} takes parameter names (str), got {bad[0]!r}")
    return names


@dataclasses.dataclass(frozen=True)
class Call:
    """How one call's arguments were taken apart: the static ones (by position and by
    keyword, with their values) and the names of the keyword arguments that are dynamic
    (passed, in this order, after the positional dynamic ones)."""
    static: tuple = ()           # (position, value) of the static positional arguments
    static_kw: tuple = ()        # (name, value) of the static keyword arguments, sorted
    kw_names: tuple = ()         # the dynamic keyword arguments' names, sorted


def split(jitted, args: tuple, kwargs: dict) -> tuple:
    """A call of the rp.jit `jitted` taken apart: (a `Call`, the dynamic arguments: the
    positional ones that are not static, then the dynamic keyword arguments by name)."""
    n = len(args)
    for i in jitted.static_argnums + jitted.donate_argnums:
        p = jitted._params[i] if i < len(jitted._params) else None
        if i >= n and (p is None or (p.name not in kwargs
                                     and p.default is inspect.Parameter.empty)):
            raise TypeError(f"rp.jit: argument {i} is static or donated, but "
                            f"{getattr(jitted.fun, '__name__', 'the function')} was "
                            f"called with {n} arguments")
    static = tuple((i, hashable(args[i], i)) for i in jitted.static_argnums if i < n)
    static_kw = tuple(sorted((k, hashable(v, k)) for k, v in kwargs.items()
                             if k in jitted.static_argnames))
    kw_names = tuple(sorted(k for k in kwargs if k not in jitted.static_argnames))
    dynamic = tuple(a for i, a in enumerate(args) if i not in jitted.static_argnums)
    if jitted.in_shardings is not None:
        if kw_names:
            raise ValueError(f"rp.jit: with in_shardings, pass the dynamic arguments by "
                             f"position (as jax.jit): got {', '.join(kw_names)} by keyword")
        dynamic = place(dynamic, jitted.in_shardings)
    return Call(static, static_kw, kw_names), dynamic + tuple(kwargs[k] for k in kw_names)


def donated_positions(jitted, call: Call, n_pos: int) -> tuple:
    """The rp.jit `jitted`'s donated arguments as positions among a call's dynamic ones
    (`n_pos` positional ones, then the keyword ones)."""
    statics = {i for i, _ in call.static}
    out, k = [], 0
    for i in range(n_pos + len(statics)):
        if i in statics:
            continue
        if i in jitted.donate_argnums:
            out.append(k)
        k += 1
    out += [n_pos + j for j, name in enumerate(call.kw_names) if name in jitted.donate_argnames]
    return tuple(out)


class Method:
    """An rp.jit function read as an attribute of an instance: calls (and `lower`) take the
    instance as the first argument; anything else is the rp.jit function's."""

    def __init__(self, jitted, instance):
        self._jitted, self._instance = jitted, instance

    def __call__(self, *args, **kwargs):
        return self._jitted(self._instance, *args, **kwargs)

    def lower(self, *args, **kwargs):
        lowered = self._jitted.lower(self._instance, *args, **kwargs)
        return dataclasses.replace(lowered, bound=(self._instance,))

    def __getattr__(self, name):
        return getattr(self._jitted, name)


def keep_parameter_names(wrapper, fun, call: Call, n_dynamic: int) -> None:
    """Give `wrapper` (which takes the dynamic arguments, positional ones first, then the
    keyword ones) `fun`'s parameter names, so that residuals are described by them ("from
    the argument params['w1']")."""
    sig = signature(fun)
    if sig is None:
        return
    params = list(sig.parameters.values())
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    statics = {i for i, _ in call.static}
    n_pos = n_dynamic - len(call.kw_names) + len(statics)
    if n_pos > len(params) or any(p.kind not in positional for p in params[:n_pos]):
        return       # (more positional arguments than named parameters: *args)
    kept = [p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD,
                      default=inspect.Parameter.empty)
            for i, p in enumerate(params[:n_pos]) if i not in statics]
    kept += [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
             for n in call.kw_names]
    try:
        wrapper.__signature__ = sig.replace(parameters=kept)
    except ValueError:      # (a name twice: leave the wrapper's own)
        return


class _Part(tuple):
    """The shardings of one part of a tree (a leaf of `shardings_of`'s prefix)."""


def shardings_of(shardings, what: str, tree) -> list:
    """`shardings` (as jax.jit's `in_shardings` / `out_shardings`: a Sharding, None, or a
    pytree prefix of `tree` of them) as one per leaf of `tree` (None: unspecified)."""
    is_leaf = lambda s: s is None or isinstance(s, jax.sharding.Sharding)  # noqa: E731
    try:
        per_part = jax.tree_util.tree_map(
            lambda s, part: _Part([s] * len(jax.tree_util.tree_leaves(part))), shardings,
            tree, is_leaf=is_leaf)
    except (ValueError, TypeError) as e:
        raise ValueError(f"rp.jit: {what} must be a Sharding, None, or a pytree prefix of "
                         f"the {'arguments' if what == 'in_shardings' else 'results'} "
                         f"(as jax.jit's): {e}") from None
    flat = [s for part in jax.tree_util.tree_leaves(
        per_part, is_leaf=lambda x: isinstance(x, _Part)) for s in part]
    bad = [s for s in flat if not is_leaf(s)]
    if bad:
        got = ("a PartitionSpec: give it its mesh, NamedSharding(mesh, spec)"
               if isinstance(bad[0], jax.sharding.PartitionSpec) else type(bad[0]).__name__)
        raise TypeError(f"rp.jit: {what} takes jax.sharding.Sharding objects (or None), "
                        f"got {got}")
    return flat


def place(args: tuple, in_shardings) -> tuple:
    """The positional dynamic `args` put where `in_shardings` says, as jax.jit puts them:
    an array not yet committed to a device (a NumPy array, a Python scalar, a jax.Array
    made without a device) goes there; one committed elsewhere is an error (jax.jit does
    not move it either); a tracer (under jax.jit) stays as it is, the sharding being
    the exported program's; a `jax.ShapeDtypeStruct` (`lower`) gets the sharding."""
    leaves, tree = jax.tree_util.tree_flatten(args)
    placed = []
    for i, (x, s) in enumerate(zip(leaves, shardings_of(in_shardings, "in_shardings", args))):
        if s is None or isinstance(x, jax.core.Tracer):
            placed.append(x)
            continue
        if isinstance(x, jax.ShapeDtypeStruct):     # (lower(): the spec, so placed)
            if x.sharding is not None and not x.sharding.is_equivalent_to(s, len(x.shape)):
                raise ValueError(f"rp.jit: argument leaf {i} is a spec on {x.sharding}, and "
                                 f"in_shardings says {s}")
            placed.append(jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=x.weak_type,
                                               sharding=s))
            continue
        if isinstance(x, jax.Array) and x.committed and not x.sharding.is_equivalent_to(
                s, x.ndim):
            raise ValueError(f"rp.jit: argument leaf {i} is on {x.sharding}, and in_shardings "
                             f"says {s}: put it there with jax.device_put (as jax.jit, rp.jit "
                             "does not move a committed array)")
        placed.append(jax.device_put(x, s))
    return jax.tree_util.tree_unflatten(tree, placed)


def for_devices(dynamic: tuple, n: int, fun=None) -> tuple:
    """The dynamic arguments as the program of a function that runs on `n` devices (a
    shard_map or a sharding inside it) is built for, where they come on none of them: each
    leaf that is not on a device of its own choosing (a NumPy array, a Python scalar, a
    jax.Array made without a device) a `jax.ShapeDtypeStruct` replicated over the mesh in
    force (`jax.set_mesh`) where it has `n` devices, else over the one mesh of `n` devices
    that `fun` names (a shard_map's, a sharding's: `named_mesh`), else over the first `n`
    devices.
    jax.jit puts such arguments on the devices of the function's mesh; an exported program
    takes the devices of its arguments, so without this a program for several devices
    would be built for one. The executable then takes such arrays as jax.jit takes them
    (it moves them). Arguments already on several devices, or committed to one (jax.jit
    refuses those, and so does the call), are left as they are."""
    leaves, tree = jax.tree_util.tree_flatten(dynamic)
    if n <= 1 or any(_committed(x) or isinstance(x, jax.core.Tracer) for x in leaves):
        return dynamic
    mesh = jax.sharding.get_mesh()
    if getattr(mesh, "size", 0) != n or not hasattr(mesh, "devices"):
        mesh = named_mesh(fun, dynamic, n) if fun is not None else None
    if mesh is None:
        mesh = jax.sharding.Mesh(np.array(jax.devices()[:n]), ("devices",))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    specs = []
    for x in leaves:
        if not isinstance(x, (jax.Array, jax.ShapeDtypeStruct)):
            x = jax.numpy.asarray(x)
        specs.append(jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated,
                                          weak_type=getattr(x, "weak_type", False)))
    return jax.tree_util.tree_unflatten(tree, specs)


def named_mesh(fun, dynamic: tuple, n: int):
    """The mesh of `n` devices that `fun` on `dynamic` names, from a trace: a shard_map's,
    a sharding constraint's, nested functions' too; None where it names none or meshes on
    different devices. (An exported program takes the devices of its arguments; jax.jit
    takes those of the function's mesh: a mesh on devices 4 to 7 runs there.)"""
    found: dict = {}

    def visit(value):
        if isinstance(value, jax.sharding.Mesh):
            if value.axis_names:   # (not the empty mesh a nested jit's `ctx_mesh` holds)
                found.setdefault(tuple(d.id for d in value.devices.flat), value)
        elif isinstance(value, jax.sharding.NamedSharding):
            visit(value.mesh)
        elif isinstance(value, (tuple, list)):
            for v in value:
                visit(v)
        elif hasattr(value, "eqns") or hasattr(getattr(value, "jaxpr", None), "eqns"):
            for eqn in getattr(value, "jaxpr", value).eqns:     # (a Jaxpr or ClosedJaxpr)
                for v in eqn.params.values():
                    visit(v)
    visit(jax.make_jaxpr(fun)(*dynamic))
    meshes = [m for m in found.values() if m.size == n]
    return meshes[0] if len(meshes) == 1 else None


def _committed(x) -> bool:
    """Is `x` on devices of its own choosing: committed, or a spec with a sharding?"""
    if isinstance(x, jax.Array):
        return x.committed
    return isinstance(x, jax.ShapeDtypeStruct) and x.sharding is not None
