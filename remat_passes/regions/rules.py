"""Region-op rules: how remat-partial-eval treats ops with regions, keyed by op name.

The analog of JAX's `partial_eval_jaxpr_custom_rules`. Every op with regions
is *atomic* by default: its results are saved or it is recomputed whole (its
body cloned), and a policy cannot see inside. An op name listed in `RULE_TYPES`
gets a rule instead (a `RegionRule`), with the hooks that remat-partial-eval calls:

* `rewrite(block, policy, groups, analysis)`: phase 1, before the function-level
  plan. The rule finds its ops in `block`, decides inside their regions with
  the policy in force there (`policy(value)` gives the per-value verdict) and
  rewrites them (each rule decides, then rewrites, on its own structures).
  `analysis()` gives the function's analysis as phase 1 found it: valid until
  the first rewrite, so a rule reads what it needs from it before rewriting
  (the rules run in the order of `RULE_TYPES`);
* `kept_whole(analysis)`: positions of its ops whose results the
  function-level plan must save rather than recompute, each with a function
  giving a result's offload placement;
* `twins(analysis)`: forward values of its ops that a backward op of its own
  making computes too (`plan.build_plan` reads the twin instead of saving the
  value);
* `tidy(analysis, twins_read)`: after the function-level plan, before it is
  applied: drop what the rule built that the plan turned out not to read
  (twins in `twins_read` are read); returns whether the IR changed, and then
  the function is analysed and planned again;
* `remarks(analysis, surviving, recomputed)`: what to tell the user (an op the policy
  could not see into, which the plan saved or recomputed: `recomputed` holds the positions
  of the forward ops it recomputes).

A rule keeps what it learns in one run (the loops it put in a checkpoint scope, the
pairs it rewrote) on itself: `new_rules()` makes fresh ones for every run of
remat-partial-eval, so runs (the planner's trials among them) never share state.

Adding a rule: write a class with these hooks and register it in `RULE_TYPES` under
the op name. `stablehlo.while` has the scan-pair rule, `stablehlo.case` the
case-pair rule, `sdy.manual_computation` (shard_map) the shard_map-pair rule.
"""
from __future__ import annotations

from typing import Protocol

from remat_passes.analysis import scan_pairs
from remat_passes.analysis.scan_pairs import WHILE
from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import ir, op_id
from remat_passes.regions import (case_crossing, case_rewrite, nested_saves, scan_rewrite,
                                  shard_map_rewrite)
from remat_passes.ir.graph import CASE
from remat_passes.regions.clone_verdicts import Inherited
from remat_passes.sharding.sdy import mesh_of


class RegionRule(Protocol):
    """What remat-partial-eval asks of the rule for one region op (see above)."""

    def rewrite(self, block, policy, groups: "Groups", analysis) -> dict: ...
    def kept_whole(self, analysis) -> dict: ...
    def twins(self, analysis) -> dict: ...
    def tidy(self, analysis, twins_read: set) -> bool: ...
    def remarks(self, analysis, surviving, recomputed) -> list: ...


class Groups:
    """The recompute-group counter shared by the rules and the function-level plan."""

    def __init__(self):
        self.n = 0

    def next(self) -> None:
        self.n += 1


class ScanPairRule:
    """Forward/backward `stablehlo.while` pairs of `lax.scan`: the policy per iteration;
    in a checkpoint scope, the forward loop re-run whole by the backward.

    Other whiles stay atomic (a remark says so)."""

    def __init__(self):
        self._scoped: set = set()   # forward loops in a checkpoint scope: re-run whole
        self._peeled: set = set()   # loops whose stacks join those of steps left out of them

    def rewrite(self, block, policy, groups: Groups, analysis) -> dict:
        def mark(clone):
            contract.set_recompute_group(clone, groups.n)
        self._peeled = {op_id(op) for op in block.operations
                        if op.name == WHILE and _stacks_peeled_steps(op)}
        stats = scan_rewrite.rewrite_pairs(block, policy, mark, groups.next)
        case_crossing.in_loop_bodies(block, Inherited(policy, stats["inherited"]), mark,
                                     groups.next)
        self._scoped = stats["scoped_loops"]
        return stats

    def kept_whole(self, analysis) -> dict:
        """Forward loops of scan pairs: their results are decided per iteration already."""
        def placement(vid):
            u = analysis.stacked_value(analysis.value(vid))
            return contract.offload_of(u.owner) if isinstance(u, ir.OpResult) else None
        return {pos: placement for pos in analysis.scan_loop_positions}

    def twins(self, analysis) -> dict:
        return {}

    def tidy(self, analysis, twins_read) -> bool:
        return False

    def remarks(self, analysis, surviving, recomputed) -> list[str]:
        # (a loop the plan neither saved nor recomputed, as a random initialisation whose
        # values a library then replaces, was never treated as anything: nothing to say)
        loops = [analysis.ops[pos] for pos in surviving   # erased ops must not be touched
                 if analysis.ops[pos].name == WHILE and not analysis.backward[pos]
                 and pos not in analysis.scan_loop_positions
                 and op_id(analysis.ops[pos]) not in self._scoped
                 and (pos in recomputed or _read_by_backward(analysis, analysis.ops[pos]))]
        out = []
        if loops:
            peeled = sum(1 for op in loops if op_id(op) in self._peeled)
            out.append(f"@{analysis.name}: {len(loops)} forward stablehlo.while loop(s) are "
                       "not scan loops with a matching backward loop; each is treated as one "
                       "atomic op: saved or recomputed whole" + (
                           f" ({peeled} of them a scan whose unroll does not divide its "
                           "length, its stacks concatenated with the steps left out of the "
                           "loop: exported by rp.export_vjp, rp.export or rp.jit, such a scan "
                           "is differentiated as two scans that pair)" if peeled else ""))
        # (a shard_map in a scan body gets the policy inside it, `manual_nested`, unless
        # its body has a side effect or it has no mesh)
        manual = sum(1 for pos in analysis.scan_loop_positions if pos in surviving
                     for op in graph.nested_ops(analysis.ops[pos].regions[1].blocks[0])
                     if op.name == graph.MANUAL_COMPUTATION and (
                         shard_map_rewrite.body_side_effect(op) or mesh_of(op) is None))
        if manual:
            out.append(f"@{analysis.name}: {manual} sdy.manual_computation op(s) (shard_map) "
                       "in scan loop bodies have a side effect inside (or no mesh); each is "
                       "atomic there (the policy does not see inside it, nor the checkpoint "
                       "names in it): recomputed whole with the iteration, or its results "
                       "kept")
        return out


class CasePairRule:
    """Forward/backward `stablehlo.case` pairs of `lax.cond` / `lax.switch`: the policy per
    branch. A forward case the backward reads without a backward case stays atomic (a
    remark says so)."""

    def rewrite(self, block, policy, groups: Groups, analysis) -> dict:
        if not any(op.operation.name == CASE for op in block.operations):
            return {"pairs": 0, "recomputed": 0}

        def mark(clone):
            contract.set_recompute_group(clone, groups.n)
        a = analysis()
        return case_rewrite.rewrite_cases(block, policy, mark, groups.next, a.is_backward)

    @staticmethod
    def _paired(analysis) -> set:
        block = graph.body_block(analysis.func_op)
        found = (analysis.position.get(op_id(p.fwd))
                 for p in case_rewrite.find_case_pairs(block, analysis.is_backward))
        return {pos for pos in found if pos is not None}

    def kept_whole(self, analysis) -> dict:
        """Forward cases of pairs: their results were decided per branch already (an
        offloaded one keeps the placement its branch value was given)."""
        def placement(vid):
            v = analysis.value(vid)
            return region_result_placements(v.owner.operation)[v.result_number]
        return {pos: placement for pos in self._paired(analysis)}

    def twins(self, analysis) -> dict:
        """Results of forward cases that their recompute case computes per branch."""
        return case_rewrite.twins(analysis)

    def tidy(self, analysis, twins_read) -> bool:
        return case_rewrite.tidy(analysis, twins_read)

    def remarks(self, analysis, surviving, recomputed) -> list[str]:
        opaque = sum(1 for pos in surviving    # (a rewritten case has a key)
                     if analysis.ops[pos].name == CASE and not analysis.backward[pos]
                     and contract.case_key(analysis.ops[pos]) is None
                     and (pos in recomputed
                          or _read_by_backward(analysis, analysis.ops[pos], besides=CASE)))
        if not opaque:
            return []
        return [f"@{analysis.name}: {opaque} forward stablehlo.case op(s) (lax.cond/switch) "
                "are read by the backward pass outside a backward case; each is treated as "
                "one atomic op: saved or recomputed whole"]


def _stacks_peeled_steps(loop) -> bool:
    """Does a result of `loop` reach a `concatenate` through reshapes alone: the stacks of
    an unrolled scan's loop, joined with those of the steps JAX's lowering left out of it?"""
    todo = list(loop.results)
    while todo:
        for use in todo.pop().uses:
            owner = use.owner
            if owner.name == "stablehlo.concatenate":
                return True
            if owner.name == "stablehlo.reshape":
                todo.extend(owner.results)
    return False


def _read_by_backward(analysis, op, besides: str | None = None) -> bool:
    """Does a backward op of the rewritten function (or a recomputation) read `op` (which
    the plan then saved), other than from inside an op named `besides` (a case op, where
    the case-pair rule decided per branch)?"""
    func = analysis.func_op.operation
    for r in op.results:
        for use in r.uses:
            top = graph.top_level(use.owner.operation, func)
            if top.name == besides:
                continue
            if contract.is_recompute_clone(top):
                return True
            pos = analysis.position.get(op_id(top))   # (the return: len(ops), not backward)
            if pos is not None and pos < len(analysis.ops) and analysis.backward[pos]:
                return True
    return False


class ManualComputationRule:
    """`sdy.manual_computation` (shard_map): a forward one whose results the backward
    reads gets the policy per body op (`shard_map_rewrite`), as JAX's shard_map
    partial-eval rule applies it; its collectives are recomputed like any op (every
    device runs them again in lockstep). The pairs it rewrote are kept, by op, until
    `kept_whole` of the same function reads them."""

    def __init__(self):
        self._func = None              # op id of the function decided for
        self._rewritten: list = []     # its shard_map_rewrite.Rewritten pairs
        self._atomic = 0               # forward ones the backward reads, left atomic
        self._inner = 0                # while/case ops in the bodies of rewritten ones
        self._indirect = 0             # forward ones the backward reads through other ops

    def rewrite(self, block, policy, groups: Groups, analysis) -> dict:
        self._func, self._rewritten, self._atomic, self._inner = op_id(block.owner), [], 0, 0
        self._indirect = 0
        ops = [op.operation for op in block.operations
               if op.operation.name == graph.MANUAL_COMPUTATION]
        if not ops:
            return {}
        a = analysis()
        self._indirect = shard_map_rewrite.reached_indirectly(block, a.is_backward)
        readable = [op for op in ops if not a.is_backward(op)
                    and not shard_map_rewrite.lays_out_only(op) and any(
            a.is_backward(graph.top_level(use.owner.operation, block.owner))
            for r in op.results for use in r.uses)]
        # (counted before the rewrite, which can move a body's loop into the recompute
        # computation alone; a scan loop gets the policy per iteration, a case per branch
        # unless a collective or a side effect inside keeps it whole)
        inner = sum(1 for op in readable if not shard_map_rewrite.body_side_effect(op)
                    for body_op in op.regions[0].blocks[0].operations
                    if (body_op.operation.name == WHILE
                        and scan_pairs.analyse_forward(body_op) is None)
                    or (body_op.operation.name == CASE
                        and graph.is_side_effecting(body_op)))

        def mark(clone):
            contract.set_recompute_group(clone, groups.n)

        def verdict(v):
            op = v.owner.operation
            if op.name in graph.COLLECTIVE_OPS:    # (value_verdict would call it saved)
                return policy.op_verdict(op)
            return policy(v)
        # (a region op presave rebuilds keeps the plan's verdict: `nested_saves.replaced`)
        verdict.replaced = lambda old, new: nested_saves.replaced(policy, old, new)
        for op in readable:      # region ops in the bodies return what the policy saves
            if not shard_map_rewrite.body_side_effect(op):     # inside them
                with op.location:
                    nested_saves.presave(op.regions[0].blocks[0], verdict)
        self._rewritten, stats = shard_map_rewrite.rewrite_pairs(
            block, verdict, mark, groups.next, a, nested_saves.reuse)
        self._atomic = len(readable) - stats["pairs"]
        self._inner = inner if stats["pairs"] else 0
        return stats

    def _mine(self, analysis) -> list:
        return self._rewritten if self._func == op_id(analysis.func_op) else []

    def kept_whole(self, analysis) -> dict:
        """Forward computations decided per body op: their results are primal outputs and
        residuals the policy saves (an offloaded one keeps the placement its body value
        was given)."""
        def placement(vid):
            v = analysis.value(vid)
            return region_result_placements(v.owner.operation)[v.result_number]
        found = (analysis.position.get(op_id(rw.fwd)) for rw in self._mine(analysis))
        return {pos: placement for pos in found if pos is not None}

    def twins(self, analysis) -> dict:
        """Primal outputs of forward computations that their recompute one computes."""
        return shard_map_rewrite.twins(analysis, self._mine(analysis))

    def tidy(self, analysis, twins_read) -> bool:
        return shard_map_rewrite.tidy(analysis, twins_read, self._mine(analysis))

    def remarks(self, analysis, surviving, recomputed) -> list[str]:
        if self._func != op_id(analysis.func_op):
            return []
        out = []
        if self._atomic:
            out.append(f"@{analysis.name}: {self._atomic} forward sdy.manual_computation "
                       "op(s) (shard_map) have a side effect inside (or no mesh); each is "
                       "treated as one atomic op: saved or recomputed whole")
        if self._indirect:
            out.append(f"@{analysis.name}: {self._indirect} forward sdy.manual_computation "
                       "op(s) (shard_map) reach the backward only through other forward ops "
                       "(the stacks of a fully unrolled scan, a loop); each is treated as one "
                       "atomic op: saved or recomputed whole (the policy does not see inside "
                       "it)")
        if self._inner:
            out.append(f"@{analysis.name}: {self._inner} stablehlo.while op(s) that are not "
                       "scan loops, or stablehlo.case op(s) with a collective or a side "
                       "effect inside, in shard_map bodies are atomic there (the policy does "
                       "not see inside them): saved or recomputed whole")
        return out


def result_placements(op) -> list:
    """Per result of a forward op, the offload placement remat-partial-eval decided (or
    None): the op's own, or for a case or a shard_map's manual computation, those of the
    values its regions return (`region_result_placements`)."""
    own = contract.offload_of(op)
    if own is not None or op.name not in (CASE, graph.MANUAL_COMPUTATION):
        return [own] * len(op.results)
    return region_result_placements(op)


def region_result_placements(op) -> list:
    """Per result of a case or manual computation a rule decided inside: the offload
    placement of the value its regions return there (the first branch that has one; a
    scalar shard_map residual is returned reshaped), else None."""
    out = [None] * len(op.results)
    for region in op.regions:
        for i, y in enumerate(graph.terminator(region.blocks[0]).operands):
            if isinstance(y, ir.OpResult) and y.owner.name == "stablehlo.reshape" and \
                    op.name == graph.MANUAL_COMPUTATION:
                y = y.owner.operands[0]
            if out[i] is None and isinstance(y, ir.OpResult):
                out[i] = contract.offload_of(y.owner)
    return out


# in the order they run (the shard_map rule reports what it inserts to the analysis, so
# the case rule after it still tells forward from backward)
RULE_TYPES: dict[str, type] = {graph.MANUAL_COMPUTATION: ManualComputationRule,
                               CASE: CasePairRule, WHILE: ScanPairRule}


def new_rules() -> dict[str, RegionRule]:
    """One fresh rule per region op name, in the order they run, for one run."""
    return {name: rule_type() for name, rule_type in RULE_TYPES.items()}
