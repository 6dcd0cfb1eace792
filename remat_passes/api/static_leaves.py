"""Leaves of `rp.jit`'s arguments and results that are not arrays, taken as static.

An Equinox Module is a pytree whose leaves are its arrays and also what is not data: the
activation function of an `eqx.nn.MLP`, a Dropout's rate and `inference` flag. `jax.jit`
refuses a function leaf ("not a valid JAX type") and makes a Python number an array, which
Equinox code then treats as a parameter (`eqx.filter(model, eqx.is_array)` takes it, an
optimizer state made outside does not have it; `if inference:` fails on a traced bool).
Equinox's own `eqx.filter_jit` makes every leaf that is not an array static, and so does
rp.jit, where jax.jit's own rule does not serve:

* `wrap`: each leaf of a dynamic argument that `jax.jit` cannot take (not an array, a
  NumPy or a Python number), and inside an Equinox Module each leaf that is not an array
  (`eqx.is_array`'s rule: its Python numbers and bools too), becomes a `Static`, a pytree
  node with no children whose auxiliary data is the value: part of the signature (compared
  with `==`, so it must be hashable), not an argument of the compiled program. A Python
  number elsewhere (a learning rate) stays an array, as under `jax.jit`: a new value does
  not build again;
* `functional`: the traced function gets the values back, and wraps the same leaves of its
  results, which come back from the results' pytree structure (`unwrap`): an updated Module
  is returned with its activation function and its Dropout's rate.

Equinox is not a dependency: where `equinox` was never imported no argument is a Module.
"""
from __future__ import annotations

import functools
import inspect
import sys

import jax
import numpy as np

from remat_passes.ir.mlir import RematError

_ARRAYS = (jax.Array, jax.core.Tracer, np.ndarray, np.generic, jax.ShapeDtypeStruct)
_DATA = _ARRAYS + (bool, int, float, complex)


def is_data(x) -> bool:
    """Is `x` a leaf `jax.jit` takes as an array?"""
    return isinstance(x, _DATA) or hasattr(x, "__jax_array__")


@jax.tree_util.register_pytree_node_class
class Static:
    """A leaf that is not an array, as a pytree node with no children: the value is its
    auxiliary data."""

    def __init__(self, value):
        self.value = value

    def tree_flatten(self):
        return (), self.value

    @classmethod
    def tree_unflatten(cls, value, children):
        return cls(value)


def is_static(x) -> bool:
    return isinstance(x, Static)


def _is_module(x) -> bool:
    """Is `x` an Equinox Module? (False where Equinox was never imported.)"""
    module = getattr(sys.modules.get("equinox"), "Module", None)
    return module is not None and isinstance(x, module)


def _marked(tree):
    """`tree` with the leaves the module docstring makes static as `Static`s."""
    def leaf(x):
        return x if is_data(x) else Static(x)

    def in_module(x):
        return x if isinstance(x, _ARRAYS) else Static(x)
    return jax.tree_util.tree_map(
        lambda x: jax.tree_util.tree_map(in_module, x) if _is_module(x) else leaf(x),
        tree, is_leaf=_is_module)


def _needs_marks(tree) -> bool:
    """Does `tree` hold a leaf `_marked` makes static (or an Equinox Module, not data
    either)?"""
    return not all(map(is_data, jax.tree_util.tree_leaves(tree, is_leaf=_is_module)))


def wrap(jitted, args: tuple, kwargs: dict) -> tuple:
    """(args, kwargs) with the leaves of the dynamic arguments (not static to the rp.jit
    `jitted`) that the module docstring makes static made `Static`s; the same objects where
    there is none."""
    if not _needs_marks((args, kwargs)):
        return args, kwargs
    params = [p.name for p in jitted._params if p.kind in (
        inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    args = tuple(a if i in jitted.static_argnums else
                 _wrapped(a, params[i] if i < len(params) else f"args[{i}]")
                 for i, a in enumerate(args))
    kwargs = {k: v if k in jitted.static_argnames else _wrapped(v, k)
              for k, v in kwargs.items()}
    return args, kwargs


def wrap_all(arguments: tuple) -> tuple:
    """`wrap` of arguments that are all dynamic (a lowered step's)."""
    if not _needs_marks(arguments):
        return arguments
    return tuple(_wrapped(a, f"args[{i}]") for i, a in enumerate(arguments))


def _wrapped(argument, name: str):
    marked = _marked(argument)
    for path, x in jax.tree_util.tree_flatten_with_path(marked, is_leaf=is_static)[0]:
        if isinstance(x, Static):
            try:
                hash(x.value)
            except TypeError:
                raise RematError(
                    f"error: rp.jit: the argument leaf {name}{jax.tree_util.keystr(path)} "
                    f"is a {type(x.value).__name__}, not an array, so it is static (as "
                    "eqx.filter_jit takes it), and a static value must be hashable: make "
                    "it an array, hashable, or a static argument (static_argnums)") from None
    return marked


def unwrap(tree):
    """`tree` with each `Static` replaced by its value (`tree` itself where it has none)."""
    if not any(map(is_static, jax.tree_util.tree_leaves(tree, is_leaf=is_static))):
        return tree
    return jax.tree_util.tree_map(lambda x: x.value if is_static(x) else x, tree,
                                  is_leaf=is_static)


def functional(fun):
    """`fun` taking `Static`s where `wrap` made them and wrapping the same leaves of its
    results (under a trace: the tracers are its arrays)."""

    @functools.wraps(fun)
    def call(*args, **kwargs):
        return _marked(fun(*unwrap(args), **unwrap(kwargs)))
    return call
