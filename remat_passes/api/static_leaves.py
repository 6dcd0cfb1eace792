"""Leaves of `rp.jit`'s arguments and results that are not arrays, taken as static.

An Equinox Module is a pytree whose leaves are its arrays and also what is not data: the
activation function of an `eqx.nn.MLP`, a flag, a name. `jax.jit` refuses such a leaf ("not
a valid JAX type"); Equinox's own `eqx.filter_jit` makes it static, and so does rp.jit:

* `wrap`: each leaf of a dynamic argument that is not an array (nor a Python or NumPy
  scalar, which `jax.jit` takes as an array) becomes a `Static`, a pytree node with no
  children whose auxiliary data is the value: part of the signature (compared with `==`,
  so it must be hashable), not an argument of the compiled program;
* `functional`: the traced function gets the values back, and wraps the same kind of
  leaves of its results, which come back from the results' pytree structure (`unwrap`):
  an updated Module is returned with its activation function.
"""
from __future__ import annotations

import functools
import inspect

import jax
import numpy as np

from remat_passes.ir.mlir import RematError

_DATA = (jax.Array, jax.core.Tracer, np.ndarray, np.generic, bool, int, float, complex,
         jax.ShapeDtypeStruct)


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


def _is_static(x) -> bool:
    return isinstance(x, Static)


def wrap(jitted, args: tuple, kwargs: dict) -> tuple:
    """(args, kwargs) with every leaf of a dynamic argument (not static to the rp.jit
    `jitted`) that is not an array made a `Static`; the same objects where there is none."""
    leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
    if all(is_data(x) for x in leaves):
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
    return tuple(_wrapped(a, f"args[{i}]") for i, a in enumerate(arguments))


def _wrapped(argument, name: str):
    paths, tree = jax.tree_util.tree_flatten_with_path(argument)
    leaves = []
    for path, x in paths:
        if not is_data(x):
            try:
                hash(x)
            except TypeError:
                raise RematError(
                    f"error: rp.jit: the argument leaf {name}{jax.tree_util.keystr(path)} "
                    f"is a {type(x).__name__}, not an array, "
                    "so it is static (as eqx.filter_jit takes it), and a static value must "
                    "be hashable: make it an array, hashable, or a static argument "
                    "(static_argnums)") from None
            x = Static(x)
        leaves.append(x)
    return jax.tree_util.tree_unflatten(tree, leaves)


def unwrap(tree):
    """`tree` with each `Static` replaced by its value (`tree` itself where it has none)."""
    if not any(map(_is_static, jax.tree_util.tree_leaves(tree, is_leaf=_is_static))):
        return tree
    return jax.tree_util.tree_map(lambda x: x.value if _is_static(x) else x, tree,
                                  is_leaf=_is_static)


def functional(fun):
    """`fun` taking `Static`s where `wrap` made them and wrapping its results' leaves that
    are not arrays (under a trace: the tracers are its arrays) the same way."""

    @functools.wraps(fun)
    def call(*args, **kwargs):
        out = fun(*unwrap(args), **unwrap(kwargs))
        return jax.tree_util.tree_map(lambda x: x if is_data(x) else Static(x), out)
    return call
