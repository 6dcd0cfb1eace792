"""outline-loop-backwards: a function whose backward runs inside loop bodies (gradient
accumulation), cond branches or a shard_map body gets each such body as a function of its
own, for the passes after it.

A training step that accumulates gradients over microbatches runs `jax.grad` inside a
`lax.scan` or `fori_loop`: its own top level has no backward pass, each loop iteration
has one; a step can run `jax.grad` inside a branch of `lax.cond`; a data-parallel step runs
`jax.grad` inside `jax.shard_map`, and under Shardy the body of its manual computation has
one (see `regions/loop_backward.py`, which finds the bodies and moves each into a private
function `@<func>_loop<k>`, `@<func>_cond<k>` or `@<func>_shard_map<k>` called from the
body). The pass records the new functions in the pipeline state
(`PassState.loop_bodies[func]`), and the pipeline runner then runs every later pass that
names `func` (its `func` option) once on each of them instead; the `inline` pass at the
end of the `remat` pipeline puts the bodies back. A function with a backward of its own
is left as it is. The split form has no place for a backward inside a body: with
`mode=split` the pass stops with an error.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

from remat_passes.ir import graph
from remat_passes.ir.mlir import RematError
from remat_passes.passes.base import ModulePass, option
from remat_passes.passes.diagnostics import Remark
from remat_passes.passes.remat_partial_eval import parse_mode
from remat_passes.regions import loop_backward


class Holder(NamedTuple):
    """What holds a backward (`loop_backward.kind`), as the messages say it."""
    brief: str       # what it is, in a remark
    full: str        # the same with the JAX code that makes it, in an error
    where: str       # where joint form rematerializes
    applies: str     # what the policy applies to
    one_step: str    # what to export for a function's own backward


HOLDERS = {
    "loop": Holder("a loop body (gradient accumulation)",
                   "a loop body (gradient accumulation: jax.grad inside lax.scan or "
                   "fori_loop)", "inside each iteration",
                   "to each iteration's forward and backward", "the step of one microbatch"),
    "cond": Holder("a cond branch", "a cond branch (jax.grad inside lax.cond or lax.switch)",
                   "inside the branch", "to the branch's forward and backward",
                   "the branch's step"),
    "shard_map": Holder("a shard_map body (data parallelism)",
                        "a shard_map body (data parallelism: jax.grad inside jax.shard_map)",
                        "inside the body, on each device",
                        "to the body's forward and backward, on each device's shard",
                        "the step of one device's shard")}


@dataclasses.dataclass
class OutlineLoopBackwards(ModulePass):
    name = "outline-loop-backwards"
    summary = ("Move each loop body, cond branch or shard_map body that runs its own "
               "backward pass (gradient accumulation, a conditional step, data parallelism) "
               "into a function, for the later passes to run on")

    func: str = option("main", "the function whose loop and shard_map bodies to outline")
    mode: str = option("joint", "the form remat-partial-eval makes (split: an error where "
                       "a backward runs inside a body)", parse_mode)

    def apply(self, module_op, state) -> None:
        with module_op.context:
            f = graph.find_func(module_op, self.func)
            found = loop_backward.loop_bodies(f)
            if not found:
                return
            if self.mode == "split":
                body = found[0]
                holder = HOLDERS[loop_backward.kind(body)]
                raise RematError(
                    f"error: @{self.func} runs its backward pass inside {holder.full}: it "
                    "cannot be split into a forward and a backward program; use "
                    f"mode='joint', which rematerializes {holder.where}",
                    body.owner.location)
            bodies = loop_backward.outline(module_op, f, found)
        state.loop_bodies[self.func] = [name for name, _, _ in bodies]
        for name, what, location in bodies:
            holder = HOLDERS[what]
            state.remarks.append(Remark(
                f"@{self.func} runs its backward pass inside {holder.brief}: the policy "
                f"applies {holder.applies} (the body is @{name} while the passes run)",
                location))
