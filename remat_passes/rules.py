"""Region-op rules: how remat-partial-eval treats ops with regions, keyed by op name.

The analog of JAX's `partial_eval_jaxpr_custom_rules`. Every op with regions
is *atomic* by default: its results are saved or it is recomputed whole (its
body cloned), and a policy cannot see inside. An op name listed in `RULES`
gets a rule instead, with three hooks that remat-partial-eval calls:

* `rewrite(block, policy, groups)`: phase 1, before the function-level plan.
  The rule finds its ops in `block`, decides inside their regions with the
  policy in force there (`policy(value)` gives the per-value verdict) and
  rewrites them (each rule decides, then rewrites, on its own structures);
* `kept_whole(analysis)`: positions of its ops whose results the
  function-level plan must save rather than recompute, each with a function
  giving a result's offload placement;
* `remarks(analysis, surviving)`: what to tell the user (an op the policy
  could not see into).

Adding a rule: write a class with these hooks and register it here under the
op name. `stablehlo.while` has the scan-pair rule today.
"""
from __future__ import annotations

from remat_passes import contract, scan_rewrite
from remat_passes.mlir import ir
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

    def rewrite(self, block, policy, groups: Groups) -> dict:
        def mark(clone):
            contract.set_recompute_group(clone, groups.n)
        return scan_rewrite.rewrite_pairs(block, policy, mark, groups.next)

    def kept_whole(self, analysis) -> dict:
        """Forward loops of scan pairs: their results are decided per iteration already."""
        def placement(vid):
            u = analysis.stacked_value(analysis.value(vid))
            return contract.offload_of(u.owner) if isinstance(u, ir.OpResult) else None
        return {pos: placement for pos in analysis.scan_loop_positions}

    def remarks(self, analysis, surviving) -> list[str]:
        loops = sum(1 for pos in surviving   # erased ops must not be touched
                    if analysis.ops[pos].name == WHILE and not analysis.backward[pos]
                    and pos not in analysis.scan_loop_positions)
        if not loops:
            return []
        return [f"@{analysis.name}: {loops} forward stablehlo.while loop(s) are not scan "
                "loops with a matching backward loop; each is treated as one atomic op: "
                "saved or recomputed whole"]


RULES = {WHILE: ScanPairRule()}
