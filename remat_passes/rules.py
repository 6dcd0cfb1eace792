"""Region-op rules: how remat-partial-eval treats ops with regions, keyed by op name.

The analog of JAX's `partial_eval_jaxpr_custom_rules`. Every op with regions
is *atomic* by default: its results are saved or it is recomputed whole (its
body cloned), and a policy cannot see inside. An op name listed in `RULES`
gets a rule instead, with three hooks that remat-partial-eval calls:

* `rewrite(block, policy, groups, analysis)`: phase 1, before the function-level
  plan. The rule finds its ops in `block`, decides inside their regions with
  the policy in force there (`policy(value)` gives the per-value verdict) and
  rewrites them (each rule decides, then rewrites, on its own structures).
  `analysis()` gives the function's analysis as phase 1 found it: valid until
  the first rewrite, so a rule reads what it needs from it before rewriting
  (the rules run in the order of `RULES`);
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
* `remarks(analysis, surviving)`: what to tell the user (an op the policy
  could not see into);
* `finish(func_op)`: after the plan is applied: trim what the rule's own ops
  computed that nothing reads.

Adding a rule: write a class with these hooks and register it here under the
op name. `stablehlo.while` has the scan-pair rule, `stablehlo.case` the
case-pair rule, `sdy.manual_computation` (shard_map) a whole-op rule.
"""
from __future__ import annotations

import re

from remat_passes import case_rewrite, contract, graph, scan_rewrite
from remat_passes.case_rewrite import CASE
from remat_passes.mlir import ir, op_id, stablehlo
from remat_passes.policies import Recompute
from remat_passes.scan_pairs import WHILE


class Groups:
    """The recompute-group counter shared by the rules and the function-level plan."""

    def __init__(self):
        self.n = 0

    def next(self) -> None:
        self.n += 1


class ScanPairRule:
    """Forward/backward `stablehlo.while` pairs of `lax.scan`: the policy per iteration.

    Other whiles stay atomic (a remark says so)."""

    def rewrite(self, block, policy, groups: Groups, analysis) -> dict:
        def mark(clone):
            contract.set_recompute_group(clone, groups.n)
        return scan_rewrite.rewrite_pairs(block, policy, mark, groups.next)

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

    def finish(self, func_op) -> None:
        pass

    def remarks(self, analysis, surviving) -> list[str]:
        loops = sum(1 for pos in surviving   # erased ops must not be touched
                    if analysis.ops[pos].name == WHILE and not analysis.backward[pos]
                    and pos not in analysis.scan_loop_positions)
        if not loops:
            return []
        return [f"@{analysis.name}: {loops} forward stablehlo.while loop(s) are not scan "
                "loops with a matching backward loop; each is treated as one atomic op: "
                "saved or recomputed whole"]


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
            for region in v.owner.operation.regions:
                y = graph.terminator(region.blocks[0]).operands[v.result_number]
                if isinstance(y, ir.OpResult) and contract.offload_of(y.owner) is not None:
                    return contract.offload_of(y.owner)
            return None
        return {pos: placement for pos in self._paired(analysis)}

    def twins(self, analysis) -> dict:
        """Results of forward cases that their recompute case computes per branch."""
        return case_rewrite.twins(analysis)

    def tidy(self, analysis, twins_read) -> bool:
        return case_rewrite.tidy(analysis, twins_read)

    def finish(self, func_op) -> None:
        pass

    def remarks(self, analysis, surviving) -> list[str]:
        opaque = sum(1 for pos in surviving    # (a rewritten case has a key)
                     if analysis.ops[pos].name == CASE and not analysis.backward[pos]
                     and contract.case_key(analysis.ops[pos]) is None
                     and _read_outside_cases(analysis, analysis.ops[pos]))
        if not opaque:
            return []
        return [f"@{analysis.name}: {opaque} forward stablehlo.case op(s) (lax.cond/switch) "
                "are read by the backward pass outside a backward case; each is treated as "
                "one atomic op: saved or recomputed whole"]


def _read_outside_cases(analysis, op) -> bool:
    """Does a backward op of the rewritten function (or a recomputation) read `op`, other
    than from inside a case op (where the case-pair rule decided per branch)?"""
    func = analysis.func_op.operation
    for r in op.results:
        for use in r.uses:
            top = graph.top_level(use.owner.operation, func)
            if top.name == CASE:
                continue
            if contract.is_recompute_clone(top):
                return True
            pos = analysis.position.get(op_id(top))
            if pos is not None and analysis.backward[pos]:
                return True
    return False


class ManualComputationRule:
    """`sdy.manual_computation` (shard_map): recomputed whole where the policy recomputes
    every op inside it, collectives included (run again in lockstep, as jax.checkpoint
    does: this is how a non-saving policy avoids keeping FSDP's gathered weights); else
    saved whole, with a remark (the policy cannot yet keep single values of its body).

    The decision is made in `rewrite` (the policy in force is known there) and kept by
    op identity until `kept_whole` of the same function reads it."""

    def __init__(self):
        self._func = None              # op id of the function `_saved` was decided for
        self._saved: set = set()       # op ids of forward manual computations saved whole
        self._any = False              # does that function have a manual computation?

    def rewrite(self, block, policy, groups: Groups, analysis) -> dict:
        self._func, self._saved = op_id(block.owner), set()
        ops = [op.operation for op in block.operations
               if op.operation.name == graph.MANUAL_COMPUTATION]
        self._any = bool(ops)
        if not ops:
            return {}
        a = analysis()
        for op in ops:
            pos = a.position.get(op_id(op))
            if pos is None or a.backward[pos] or graph.is_side_effecting(op):
                continue
            if any(policy.op_verdict(inner) is not Recompute for inner in _body_ops(op)):
                self._saved.add(op_id(op))
        return {}

    def kept_whole(self, analysis) -> dict:
        if self._func != op_id(analysis.func_op):   # (asked before `rewrite` decided)
            return {}
        found = (analysis.position.get(oid) for oid in self._saved)
        return {pos: (lambda vid: None) for pos in found if pos is not None}

    def twins(self, analysis) -> dict:
        return {}

    def tidy(self, analysis, twins_read) -> bool:
        return False

    def finish(self, func_op) -> None:
        """A recompute clone computes every output of the manual computation; the
        backward reads some. The others are returned as zeros instead, and the body ops
        only they needed (collectives too: the psum of a loss) are erased."""
        if not self._any or self._func != op_id(func_op):
            return
        for op in graph.body_block(func_op).operations:
            op = op.operation
            if op.name == graph.MANUAL_COMPUTATION and contract.is_recompute_clone(op):
                _trim_unread_results(op)

    def remarks(self, analysis, surviving) -> list[str]:
        if self._func != op_id(analysis.func_op):
            return []
        saved = sum(1 for pos in surviving if op_id(analysis.ops[pos]) in self._saved)
        if not saved:
            return []
        return [f"@{analysis.name}: {saved} sdy.manual_computation op(s) (shard_map) hold "
                "values the policy saves; each is saved whole (its outputs are residuals): "
                "the policy cannot yet keep single values of a shard_map body"]


def _trim_unread_results(op) -> None:
    body = op.regions[0].blocks[0]
    ret = graph.terminator(body)
    for i, r in enumerate(op.results):
        if any(True for _ in r.uses):
            continue
        t = ret.operands[i].type
        with ir.InsertionPoint(ret), ret.location:
            fill = _zero_of(ir.RankedTensorType(t).element_type)
            if fill is None:           # (complex, say: left as computed)
                continue
            zero = stablehlo.ConstantOp(ir.DenseElementsAttr.get_splat(t, fill)).result
        ret.operands[i] = zero
    changed = True
    while changed:                     # erase body ops nothing reads, until none is left
        changed = False
        for inner in reversed(list(body.operations)):
            inner = inner.operation
            if inner == ret or any(True for r in inner.results for _ in r.uses):
                continue
            if graph.is_side_effecting(inner) and inner.name not in graph.COLLECTIVE_OPS:
                continue
            inner.erase()
            changed = True


def _zero_of(elem):
    if re.fullmatch(r"[su]?i\d+", str(elem)):
        return ir.IntegerAttr.get(elem, 0)
    try:
        return ir.FloatAttr.get(elem, 0.0)
    except (ValueError, TypeError):    # not a float type (complex, say)
        return None


def _body_ops(op):
    """The ops with results nested in `op`'s regions (terminators have none)."""
    return [inner for region in op.regions for b in region.blocks
            for inner in graph.nested_ops(b) if len(inner.results)]


RULES = {CASE: CasePairRule(), WHILE: ScanPairRule(),
         graph.MANUAL_COMPUTATION: ManualComputationRule()}   # in the order they run
