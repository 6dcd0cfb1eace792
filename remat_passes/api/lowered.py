"""What `rp.jit` built for one input signature: `Lowered`, the rewritten module, its
residuals and remarks, and the compiled executables, which it runs when called (as the
result of `jax.jit(...).lower(...).compile()` does); `Compiled`, what its `compile()` gives
(the same, its `as_text()` XLA's HLO)."""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax

from remat_passes.api import arguments, graph_nodes, static_leaves
from remat_passes.api.remat import Barriers
from remat_passes.jax import run as jax_run
from remat_passes.jax.module import Module


@dataclasses.dataclass
class Lowered:
    """What `rp.jit` built for one input signature."""
    mode: str                    # "joint" or "split": the form that runs
    exported: Module             # the function as exported, before remat
    module: Module               # after the pipeline
    executables: tuple           # the compiled program(s): (joint,) or (fwd, bwd)
    run: Callable = dataclasses.field(repr=False)
    from_cache: bool = False     # the rewrite was read from the disk cache
    barrier_groups: str = "per-use"  # where the optimization barriers went (module docstring)
    tied: bool = False           # the recomputation also waits for the cotangent by data
    rounded: bool = False        # residuals rounded to their own type (`round_read_back`)
    unfenced: bool = False       # built without the fences of fence-chains, which were on
    footprints: dict = dataclasses.field(default_factory=dict)  # per variant built, bytes
    # the program as a JAX function, for a call under a JAX transformation (jax.jit of a
    # function that calls the rp.jit one): joint form only
    traced: Callable | None = dataclasses.field(default=None, repr=False)
    # what it was built for: (dynamic keyword names, pytree of the dynamic arguments, each
    # leaf's shape and dtype), for a call of the Lowered itself
    signature: tuple | None = dataclasses.field(default=None, repr=False)
    # put before the arguments of a call of the Lowered itself: the instance where it was
    # lowered as a method (`arguments.Method`)
    bound: tuple = dataclasses.field(default=(), repr=False)

    @property
    def barriers(self) -> str:
        """The variant that runs, as `footprints` names it ("per-use", "per-use, tied",
        "per-use, rounded", "per-region, tied, chains not fenced")."""
        return (str(Barriers(self.barrier_groups, self.tied))
                + (", rounded" if self.rounded else "")
                + (", chains not fenced" if self.unfenced else ""))

    @property
    def residuals(self) -> list:
        return self.module.residuals

    @property
    def remarks(self) -> list:
        return self.module.remarks

    def memory_analysis(self) -> list:
        """XLA's `memory_analysis()` of each executable (joint, or fwd and bwd)."""
        return [e.memory_analysis() for e in self.executables]

    def cost_analysis(self) -> list:
        """XLA's `cost_analysis()` of each executable (joint, or fwd and bwd), a dict each
        (`flops`, `transcendentals`, `bytes accessed`, ...; a loop body counts once)."""
        out = []
        for e in self.executables:
            ca = e.cost_analysis()
            out.append(ca[0] if isinstance(ca, (list, tuple)) else ca)
        return out

    def as_text(self) -> str:
        """The rewritten program the executables were compiled from, as MLIR text."""
        return str(self.module)

    def compile(self) -> "Compiled":
        """The executables are compiled when the step is lowered: as after `jax.jit`'s
        `lower(...).compile()`, the result is called with the arguments (static ones left
        out), and its `as_text()` is the programs as XLA compiled them."""
        return Compiled(self)

    def __call__(self, *args, **kwargs):
        """Run the step as built, on arguments of the shapes and dtypes it was lowered for
        (static arguments left out, as `jax.jit`'s Compiled takes them)."""
        kw_names, tree, shapes = self.signature
        if set(kwargs) != set(kw_names):
            raise TypeError(f"rp.jit: this step was lowered with dynamic keyword arguments "
                            f"{sorted(kw_names)}, called with {sorted(kwargs)} (static "
                            "arguments are part of what was built: leave them out)")
        dynamic = self.bound + args + tuple(kwargs[k] for k in kw_names)
        if graph_nodes.holds_nodes(dynamic):
            raise TypeError("rp.jit: a lowered step takes arrays; these arguments hold Flax "
                            "NNX objects, which the rp.jit function takes (splitting them "
                            "and updating them after the call): call it instead (it builds "
                            "once per signature)")
        dynamic = static_leaves.wrap_all(dynamic)      # (leaves not arrays: as built)
        leaves, got_tree = jax.tree_util.tree_flatten(dynamic)
        got = tuple(shape_key(x) for x in leaves)
        if got_tree != tree or got != shapes:
            wrong = next((i for i, (a, b) in enumerate(zip(got, shapes)) if a != b), None)
            raise TypeError(
                "rp.jit: this step was lowered for other arguments: "
                + (f"argument structure {tree}, called with {got_tree}" if got_tree != tree
                   else f"leaf {wrong} was {_shape_text(shapes[wrong])}, called with "
                   f"{_shape_text(got[wrong])}")
                + "; lower it again for these (or call the rp.jit function, which builds "
                "once per signature)")
        return static_leaves.unwrap(self.run(*dynamic))

    def footprint(self) -> int | None:
        """What XLA says the program holds while it runs: temp + arguments + outputs -
        aliased, of the larger executable (None where the backend does not say). On
        XLA:CPU the buffers YNNPACK uses inside its fusions are not in it (measured by
        `python -m tools.benchmarks.ynn_probe`)."""
        sizes = [jax_run.footprint(e) for e in self.executables]
        return None if not sizes or None in sizes else max(sizes)


class Compiled:
    """`Lowered.compile()`: the `Lowered` (its fields and methods are this one's), whose
    `as_text()` is the compiled programs' HLO, as XLA optimized them (`jax.jit`'s
    Compiled.as_text: for reading which buffers XLA keeps) instead of the rewritten MLIR."""

    def __init__(self, lowered: Lowered):
        self.lowered = lowered

    def __call__(self, *args, **kwargs):
        return self.lowered(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.lowered, name)

    def as_text(self) -> str:
        """The HLO of each executable: the joint program, or the forward then the backward."""
        return "\n".join(e.as_text() for e in self.lowered.executables)

    def __repr__(self) -> str:
        return f"Compiled({self.lowered!r})"


def shape_key(x) -> tuple:
    """A leaf's (shape, dtype) as a compiled step takes it: a Python scalar as the weakly
    typed array JAX makes of it (what a weak-typed `jax.ShapeDtypeStruct` stands for)."""
    if isinstance(x, (bool, int, float, complex)):
        x = jax.numpy.asarray(x)
    return arguments.leaf_key(x)[:2]


def _shape_text(key: tuple) -> str:
    """A leaf's (shape, dtype) as `float32[16,4]`."""
    shape, dtype = key
    return f"{dtype}[{','.join(map(str, shape))}]"
