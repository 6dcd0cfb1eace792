"""rp.jit's short way for a call like one it has run, as a training loop calls its step.

rp.jit's full way through a call (`Jitted.__call__`) looks for Flax NNX objects, makes the
leaves that are not arrays static (`static_leaves`: an Equinox Module's activation
function), checks for tracers and batching, and keys the program by each leaf's shape,
dtype, weak type and sharding: on a step of 44 arrays about 75 us more than `jax.jit`'s C++
dispatch, on an Equinox MLP of 11 layers about 110 us more than `eqx.filter_jit`. A call
with no NNX object whose dynamic leaves are device arrays, NumPy arrays, Python numbers and
leaves made static depends only on the static arguments' values, the pytree structure of the
dynamic ones, which of their leaves are static and their values, each device array's
abstract value (`aval`) and sharding, each NumPy array's shape and dtype, and each dynamic
number's type (as jax.jit makes it a weakly typed array). `CallCache` keys the program the
full way ran by those (`add`), so a later call with the same key runs it after one flatten
and one dict lookup (`run`), its static leaves put back in place from what was recorded.

The full way stays the one place that decides: a key only says "as the last call like this
one", and anything it cannot key (a leaf of another kind where the recorded call had an
array, an unhashable static value, a tracer) takes the full way, which builds, refuses or
records it.
"""
from __future__ import annotations

import dataclasses
import operator

import jax
import numpy as np

from remat_passes.api import static_leaves

_SCALARS = frozenset((bool, int, float, complex))
_AVAL_SHARDING = operator.attrgetter("aval", "sharding")
MISS = object()       # (`run`: no program recorded for such a call)


@dataclasses.dataclass(frozen=True)
class _Entry:
    """A program a call ran, and how to call it from the call's own leaves."""
    program: object          # (the Lowered's `run`)
    kw_names: tuple          # the dynamic keyword arguments, in the order the program takes
    arg_tree: object = None  # where some leaves are static: the program's arguments' pytree
    results: object = None   # where its results hold static leaves: `_Results` (or unwrap)


@dataclasses.dataclass(frozen=True)
class _Results:
    """Results with static leaves, given back as values: the pytree with the values in
    place (`tree`) and, per leaf of it, the static value or `_ARRAY` for the program's next
    result leaf."""
    tree: object
    items: tuple

    def __call__(self, out):
        arrays = iter(jax.tree_util.tree_leaves(out))
        return jax.tree_util.tree_unflatten(
            self.tree, [next(arrays) if x is _ARRAY else x for x in self.items])


_ARRAY = object()


class CallCache:
    """The programs calls of one rp.jit function ran, by what of the call they depend on."""

    def __init__(self, jitted):
        self._static = jitted.static_argnums, jitted.static_argnames
        # (the full way puts arrays where in_shardings says, so such calls take it)
        self._on = jitted.in_shardings is None
        self._array_types: set = set()     # (of the device arrays seen: jax.Array's class)
        # (static values, pytree) -> which leaves are static (None: none), as last recorded
        self._layouts: dict = {}
        self._entries: dict = {}           # key -> _Entry

    def _split(self, args: tuple, kwargs: dict) -> tuple:
        """(the static arguments' values, the dynamic positional ones, the dynamic keyword
        ones): `arguments.split`'s parts, without its checks and placement (a call it would
        refuse or place was never recorded, so it misses here and the full way runs it)."""
        nums, names = self._static
        if not nums and not names:
            return (), args, kwargs
        static = (tuple(args[i] for i in nums if i < len(args)),
                  tuple(sorted((k, v) for k, v in kwargs.items() if k in names)))
        return (static, tuple(a for i, a in enumerate(args) if i not in nums),
                {k: v for k, v in kwargs.items() if k not in names})

    def _leaf_keys(self, leaves: list, static_at) -> tuple | None:
        """What of each leaf a program depends on (None where a leaf cannot be keyed)."""
        arrays = self._array_types
        if static_at is None and set(map(type, leaves)) <= arrays:   # (the usual call)
            return tuple(map(_AVAL_SHARDING, leaves))
        keys = []
        for i, x in enumerate(leaves):
            if static_at is not None and static_at[i]:
                keys.append(x)                # (compared by value, as the full way does)
            elif type(x) in arrays:
                keys.append(_AVAL_SHARDING(x))
            elif type(x) in _SCALARS:         # (a weakly typed array of its type)
                keys.append(type(x))
            elif _on_host(x):                 # (put where the program takes it, at the call)
                keys.append((np.ndarray, x.shape, jax.dtypes.canonicalize_dtype(x.dtype)))
            else:
                return None
        return tuple(keys)

    def run(self, args: tuple, kwargs: dict):
        """The results of running the program a call like this one ran, or MISS."""
        if not self._entries:
            return MISS
        static, dynamic, dynamic_kw = self._split(args, kwargs)
        leaves, tree = jax.tree_util.tree_flatten((dynamic, dynamic_kw))
        try:
            static_at = self._layouts.get((static, tree), MISS)
            if static_at is MISS:
                return MISS
            keys = self._leaf_keys(leaves, static_at)
            entry = None if keys is None else self._entries.get((static, tree, static_at, keys))
        except TypeError:     # (an unhashable value: the full way says so)
            return MISS
        if entry is None:
            return MISS
        if entry.arg_tree is not None:       # (the static leaves back in place, as values)
            dynamic, dynamic_kw = jax.tree_util.tree_unflatten(
                entry.arg_tree, [x for x, s in zip(leaves, static_at) if not s])
        out = entry.program(*dynamic, *(dynamic_kw[k] for k in entry.kw_names))
        return out if entry.results is None else entry.results(out)

    def add(self, call: tuple, taken: tuple, program, kw_names: tuple, out) -> None:
        """Record that the call `call` (args, kwargs), with no NNX object and with the
        leaves `static_leaves.wrap` made static as in `taken` (args, kwargs), ran `program`
        (a Lowered's `run`) on its dynamic arguments (the positional ones, then those named
        `kw_names`) and gave `out` (None: results given back as they are). Calls whose
        dynamic leaves are not all device arrays, Python numbers or static are left out."""
        if not self._on:
            return
        static, dynamic, dynamic_kw = self._split(*call)
        _, taken_args, taken_kwargs = self._split(*taken)
        leaves, tree = jax.tree_util.tree_flatten((dynamic, dynamic_kw))
        items = jax.tree_util.tree_leaves((taken_args, taken_kwargs),
                                          is_leaf=static_leaves.is_static)
        if len(items) != len(leaves):
            return
        marks = tuple(static_leaves.is_static(x) for x in items)
        arrays = [x for x, s in zip(leaves, marks)
                  if not s and type(x) not in _SCALARS and not _on_host(x)]
        if not all(isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
                   for x in arrays):
            return
        self._array_types.update(type(x) for x in arrays)
        static_at = marks if any(marks) else None
        arg_tree = None
        if static_at is not None:
            arg_tree = jax.tree_util.tree_structure((taken_args, taken_kwargs))
        try:
            keys = self._leaf_keys(leaves, static_at)
            self._layouts[static, tree] = static_at
            self._entries[static, tree, static_at, keys] = _Entry(
                program, kw_names, arg_tree, _results(out))
        except TypeError:
            pass                # (an unhashable static value)


def _on_host(x) -> bool:
    """Is `x` a NumPy array or scalar (keyed by shape and dtype, as the full way keys it)?"""
    return type(x) is np.ndarray or isinstance(x, np.generic)


def _results(out):
    """How to give back the results `out` of a program with their static leaves as values:
    None where they hold none (or `out` is None: as they are)."""
    items = jax.tree_util.tree_leaves(out, is_leaf=static_leaves.is_static)
    if not any(map(static_leaves.is_static, items)):
        return None
    tree = jax.tree_util.tree_structure(static_leaves.unwrap(out))
    if tree.num_leaves != len(items):     # (a static value that is a pytree of its own)
        return static_leaves.unwrap
    return _Results(tree, tuple(x.value if static_leaves.is_static(x) else _ARRAY
                                for x in items))
