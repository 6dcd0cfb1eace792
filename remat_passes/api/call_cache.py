"""rp.jit's short way for a call like one it has run, as a training loop calls its step.

rp.jit's full way through a call (`Jitted.__call__`) looks for Flax NNX objects, makes the
leaves that are not arrays static, checks for tracers and batching, and keys the program by
each leaf's shape, dtype, weak type and sharding: about 75 us more than `jax.jit`'s C++
dispatch on a step of 44 arrays. Where every dynamic leaf is an array on a device or a
Python number (none of those cases), a call depends only on the static arguments' values,
the pytree structure of the dynamic ones, each array's abstract value (`aval`) and sharding
and each number's type (as jax.jit makes it a weakly typed array). `CallCache` keys the
program the full way ran by those (`add`), so a later call with the same key runs it after
one flatten and one dict lookup (`run`). The full way stays the one place that decides: a key
only says "as the last call like this one", and anything it cannot key (a leaf that is not a
device array, an unhashable static value) takes the full way, which builds or refuses it.
"""
from __future__ import annotations

import operator

import jax

from remat_passes.api import static_leaves

_SCALARS = frozenset((bool, int, float, complex))
_AVAL_SHARDING = operator.attrgetter("aval", "sharding")
MISS = object()       # (`run`: no program recorded for such a call)


class CallCache:
    """The programs calls of one rp.jit function ran, by what of the call they depend on."""

    def __init__(self, jitted):
        self._static = jitted.static_argnums, jitted.static_argnames
        # (the full way puts arrays where in_shardings says, so such calls take it)
        self._on = jitted.in_shardings is None
        self._array_types: set = set()     # (of the device arrays seen: jax.Array's class)
        self._entries: dict = {}  # key -> (the program, dynamic keyword names, unwrap results?)

    def _split(self, args: tuple, kwargs: dict) -> tuple:
        """(the static arguments' values, the dynamic positional ones, the dynamic keyword
        ones)."""
        nums, names = self._static
        if not nums and not names:
            return (), args, kwargs
        static = (tuple(args[i] for i in nums if i < len(args)),
                  tuple(sorted((k, v) for k, v in kwargs.items() if k in names)))
        return (static, tuple(a for i, a in enumerate(args) if i not in nums),
                {k: v for k, v in kwargs.items() if k not in names})

    def _key(self, static, args, kwargs):
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
        types = set(map(type, leaves))
        if types <= self._array_types:            # (the usual call: arrays alone)
            return static, tree, tuple(map(_AVAL_SHARDING, leaves))
        if not types <= self._array_types | _SCALARS:
            return None
        # (a Python number: made a weakly typed array of its type, as jax.jit makes it)
        return static, tree, tuple(type(x) if type(x) in _SCALARS else _AVAL_SHARDING(x)
                                   for x in leaves)

    def run(self, args: tuple, kwargs: dict):
        """The results of running the program a call like this one ran, or MISS."""
        if not self._entries:
            return MISS
        static, dynamic, dynamic_kw = self._split(args, kwargs)
        key = self._key(static, dynamic, dynamic_kw)
        try:
            entry = self._entries.get(key)
        except TypeError:       # (an unhashable static value: the full way says so)
            return MISS
        if entry is None:
            return MISS
        program, kw_names, unwrap = entry
        out = program(*dynamic, *(dynamic_kw[k] for k in kw_names))
        return static_leaves.unwrap(out) if unwrap else out

    def add(self, args: tuple, kwargs: dict, program, kw_names: tuple, unwrap: bool) -> None:
        """Record that the call (args, kwargs), taken as it came (no NNX object split, no
        leaf made static), ran `program` on its dynamic arguments (the positional ones, then
        those named `kw_names`); `unwrap`: its results hold static leaves to give back as
        values. Calls whose dynamic leaves are not all arrays on a device are left out."""
        if not self._on:
            return
        static, dynamic, dynamic_kw = self._split(args, kwargs)
        leaves = jax.tree_util.tree_leaves((dynamic, dynamic_kw))
        arrays = [x for x in leaves if type(x) not in _SCALARS]
        if not all(isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
                   for x in arrays):
            return
        self._array_types.update(type(x) for x in arrays)
        try:
            self._entries[self._key(static, dynamic, dynamic_kw)] = (program, kw_names, unwrap)
        except TypeError:
            pass                # (an unhashable static value)
