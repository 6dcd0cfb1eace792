"""remat: the default pipeline in one pass, with the options users set.

remat-partial-eval -> insert-reduce-precision -> place-optimization-barriers
(when prevent-cse) -> annotate-host-offload -> strip-checkpoint-names. Each
step is also a pass of its own for `--pass-pipeline`; `remat_passes.remat()`
and `remat-opt --remat='policy=... mode=split prevent-cse=false'` run this.

insert-reduce-precision is skipped when partial-eval recomputed nothing (no
policy, no regions): without recomputation forward and backward read the same
value, and JAX without `jax.checkpoint` rounds nothing either.
"""
from __future__ import annotations

from remat_passes import graph
from remat_passes.mlir import ir
from remat_passes.passes import ModulePass, Option, parse_bool
from remat_passes.passes.annotate_host_offload import AnnotateHostOffload
from remat_passes.passes.insert_reduce_precision import InsertReducePrecision
from remat_passes.passes.place_optimization_barriers import PlaceOptimizationBarriers
from remat_passes.passes.remat_partial_eval import RematPartialEval
from remat_passes.passes.strip_checkpoint_names import StripCheckpointNames


def steps(options: dict) -> list[tuple[ModulePass, dict]]:
    """The passes of the default pipeline with their parsed options."""
    pe = RematPartialEval()
    pe_options = pe.parse_options({})
    pe_options.update({k: v for k, v in options.items() if k in pe_options})
    func = {"func": options["func"]}
    out = [(pe, pe_options), (InsertReducePrecision(), func)]
    if options["prevent-cse"]:
        out.append((PlaceOptimizationBarriers(),
                    {**func, "in-loops": options["prevent-cse-in-loops"]}))
    out += [(AnnotateHostOffload(), func), (StripCheckpointNames(), {})]
    return out


class Remat(ModulePass):
    name = "remat"
    summary = ("The default pipeline: remat-partial-eval, insert-reduce-precision, "
               "place-optimization-barriers (prevent-cse), annotate-host-offload, "
               "strip-checkpoint-names")
    options = tuple(o for o in RematPartialEval.options) + (
        Option("prevent-cse", parse_bool, True,
               "place optimization barriers around recomputation (outside loops)"),
        Option("prevent-cse-in-loops", parse_bool, False,
               "also inside scan loop bodies (JAX recommends prevent_cse=False there)"),)

    def run(self, module, options, state):
        for pass_, pass_options in steps(options):
            if isinstance(pass_, InsertReducePrecision) and not _recomputes(module, options["func"]):
                continue
            pass_.run(module, pass_options, state)


def _recomputes(module, name: str) -> bool:
    """Did remat-partial-eval recompute anything in @name (or @name_bwd) from saved
    values? Clones of constants (and of ops on cloned constants only) don't count."""
    target = f"{name}_bwd" if graph.is_split(module, name) else name
    found = []

    def visit(op):   # loop bodies included: per-iteration recomputation counts
        if graph.RECOMPUTE_ATTR in op.attributes and any(
                isinstance(v, ir.BlockArgument)
                or graph.RECOMPUTE_ATTR not in v.owner.operation.attributes
                for v in op.operands):
            found.append(op)
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE
    graph.find_func(module, target).operation.walk(visit)
    return bool(found)
