"""Flax NNX objects among `rp.jit`'s arguments, updated in place as `nnx.jit` updates them.

An NNX training step takes the model and the optimizer as objects and changes them in place
(`optimizer.update(model, grads)`, BatchNorm's running statistics, an `nnx.Rngs`' counts).
`jax.jit` takes a Module as a pytree of arrays: what the step writes into it stays inside
the trace, and the gradients, which reach no output, are removed with it (rp.jit would then
find no backward pass). So rp.jit takes an argument that holds NNX graph nodes as `nnx.jit`
does:

* `split`: the arguments that hold graph nodes are split together (`nnx.split` of them
  all, as nnx.jit splits its arguments), so that objects and Variables two of them share
  (an `nnx.ModelAndOptimizer` passed beside its model) are one in the traced function.
  Each becomes a `NodeArgument`: its part of the state (the arrays of the Variables first
  reached through it, the dynamic part) and, static, the graph definition of them all
  (part of the signature, as a pytree's structure is);
* `functional`: the traced function merges them back (`nnx.merge`), calls the user's
  function, and returns, beside the results, the values of the Variables the call set
  (`Changed`): every Variable's of a donated argument, as its buffers are gone after the
  call;
* `Nodes.update`: after the call, they are set in the caller's Variables (the state
  `nnx.split` gives holds the object's own Variables; `nnx.update` where the call changed
  the state's structure).

Flax is not a dependency: where `flax.nnx` was never imported no argument can be a graph
node, and nothing here runs.
"""
from __future__ import annotations

import dataclasses
import functools
import sys

import jax


def _nnx():
    """The `flax.nnx` module where it was imported (then NNX objects can exist), else None."""
    return sys.modules.get("flax.nnx")


class _Unnamed:
    """The key of a `NodeArgument`'s state in its pytree: nothing, so that a leaf is named
    as in the state itself (\"from the argument model['l1']['kernel'].value\")."""

    def __str__(self):
        return ""

    def __eq__(self, other):
        return isinstance(other, _Unnamed)

    def __hash__(self):
        return 0


@jax.tree_util.register_pytree_with_keys_class
class NodeArgument:
    """An argument holding NNX graph nodes, as the traced function takes it: its part of the
    state of the call's graph nodes (the pytree's children) and, static, the graph
    definition of them all, where each argument that holds them is among the call's
    arguments (`group`: a position or a keyword each, in the order they were split), where
    this one is (`at`) and whether it is donated."""

    def __init__(self, graphdef, state, donated: bool, at: int | str, group: tuple):
        self.graphdef, self.state, self.donated, self.at, self.group = \
            graphdef, state, donated, at, group

    def _static(self):
        return self.graphdef, self.donated, self.at, self.group

    def tree_flatten(self):
        return (self.state,), self._static()

    def tree_flatten_with_keys(self):
        return ((_Unnamed(), self.state),), self._static()

    @classmethod
    def tree_unflatten(cls, aux, children):
        graphdef, donated, at, group = aux
        return cls(graphdef, children[0], donated, at, group)


@jax.tree_util.register_pytree_node_class
class Changed:
    """What the call changed in the `NodeArgument` at `at`: the new values of its state's
    Variables at `indices` (static), or, where the call changed the state's structure
    (`indices` None), the whole new state."""

    def __init__(self, at: int | str, indices: tuple | None, values):
        self.at, self.indices, self.values = at, indices, values

    def tree_flatten(self):
        return (self.values,), (self.at, self.indices)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(aux[0], aux[1], children[0])


def holds_nodes(value) -> bool:
    """Does the pytree `value` hold NNX graph nodes?"""
    nnx = _nnx()
    return nnx is not None and _holds_nodes(nnx, value)


def _holds_nodes(nnx, value) -> bool:
    return any(nnx.graph.is_graph_node(leaf)
               for leaf in jax.tree_util.tree_leaves(value, is_leaf=nnx.graph.is_graph_node))


def _variables(nnx, state) -> list:
    """The Variables of a state (`nnx.split`'s: the object's own Variables), in order."""
    return jax.tree_util.tree_leaves(state, is_leaf=lambda x: isinstance(x, nnx.Variable))


@dataclasses.dataclass
class Nodes:
    """A call's arguments with those holding NNX graph nodes made `NodeArgument`s, and the
    caller's objects with their Variables, to update after the call."""
    args: tuple
    kwargs: dict
    originals: dict        # where -> (the caller's argument, its Variables)

    def update(self, result):
        """The function's results, after writing what the call changed into the caller's
        objects."""
        out, changes = result
        for changed in changes:
            original, variables = self.originals[changed.at]
            if changed.indices is None:
                _nnx().update(original, changed.values)
            else:
                for i, value in zip(changed.indices, changed.values):
                    variables[i].set_value(value)
        return out


def split(jitted, args: tuple, kwargs: dict) -> Nodes | None:
    """The call's arguments with each dynamic one (not static to the rp.jit `jitted`) that
    holds NNX graph nodes made a `NodeArgument`, all of them split together; None where none
    does (or Flax NNX was never imported)."""
    nnx = _nnx()
    if nnx is None:
        return None
    where = [(i, a) for i, a in enumerate(args) if i not in jitted.static_argnums] + \
            [(k, v) for k, v in kwargs.items() if k not in jitted.static_argnames]
    held = [(at, value) for at, value in where if _holds_nodes(nnx, value)]
    if not held:
        return None
    group = tuple(at for at, _ in held)
    graphdef, state = nnx.split(tuple(value for _, value in held))
    args, kwargs, originals = list(args), dict(kwargs), {}
    for i, (at, value) in enumerate(held):
        # (an argument all of whose Variables an earlier one holds has no part of the state)
        part = state[i] if i in state else nnx.State({})
        donated = at in (jitted.donate_argnums if isinstance(at, int)
                         else jitted.donate_argnames)
        node = NodeArgument(graphdef, part, donated, at, group)
        if isinstance(at, int):
            args[at] = node
        else:
            kwargs[at] = node
        originals[at] = (value, _variables(nnx, part))
    return Nodes(tuple(args), kwargs, originals)


def out_shardings(shardings, dynamic: tuple):
    """rp.jit's `out_shardings` (a prefix of the function's results) for the traced
    function of `dynamic` arguments: with `NodeArgument`s among them, the prefix of its
    results and, unspecified, what it changed in them."""
    if shardings is not None and any(isinstance(a, NodeArgument) for a in dynamic):
        return shardings, None
    return shardings


def functional(fun):
    """`fun` taking `NodeArgument`s where `split` made them: it merges them back, calls
    `fun`, and returns (its results, a `Changed` per `NodeArgument`). With no
    `NodeArgument` it is `fun`'s call."""

    @functools.wraps(fun)
    def call(*args, **kwargs):
        nodes = {a.at: a for a in (*args, *kwargs.values()) if isinstance(a, NodeArgument)}
        if not nodes:
            return fun(*args, **kwargs)
        nnx = _nnx()
        first = next(iter(nodes.values()))
        # (the values before the call: the merged objects share the state's Variables)
        before = {at: [v.get_value() for v in _variables(nnx, a.state)]
                  for at, a in nodes.items()}
        objects = dict(zip(first.group, nnx.merge(first.graphdef, nnx.State(
            {i: nodes[at].state for i, at in enumerate(first.group) if nodes[at].state}))))
        out = fun(*(objects[a.at] if isinstance(a, NodeArgument) else a for a in args),
                  **{k: objects[v.at] if isinstance(v, NodeArgument) else v
                     for k, v in kwargs.items()})
        after = nnx.state(tuple(objects[at] for at in first.group))
        return out, tuple(_changed(nnx, a, before[at], after[i] if i in after
                                   else nnx.State({}))
                          for i, (at, a) in enumerate((at, nodes[at]) for at in first.group))
    return call


def _changed(nnx, argument: NodeArgument, before: list, state) -> Changed:
    """The values of the Variables in `argument`'s part of the state after the call
    (`state`) that the call set (all of them where `argument` is donated), by their place
    among that part's Variables; that whole part where the call changed its structure."""
    if jax.tree_util.tree_structure(state) != jax.tree_util.tree_structure(argument.state):
        return Changed(argument.at, None, state)
    after = [v.get_value() for v in _variables(nnx, state)]
    indices = tuple(i for i, (a, b) in enumerate(zip(before, after))
                    if argument.donated or a is not b)
    return Changed(argument.at, indices, [after[i] for i in indices])
