"""How the ops `auto` does not plan enter its problem: those whose verdicts another policy
fixes (a checkpoint region's own, or the module's where `auto` is a region's policy).

`build_problem` models every forward op it does not decide as saved where the backward
reads it. That over-counts where the op's own policy recomputes it: remat-partial-eval
then recomputes it from what its policy saves (`core.plan.PolicyDecider.home`), and a
plan never keeps it. `ScopeModel` says, from a `PolicyDecider` over the fixed policies:

- `recomputed`: the ops whose forward verdict is Recompute (where the model can follow
  the recomputation: plain ops read by plain ops). They get no node: a read of one of
  their values reads what their recomputation reads.
- `backward_reads(q, vid)`: what a read by backward op `q` needs. From the backward of
  a checkpoint scope, the scope's own policy decides for the values made in it (a
  region's output that the module's plan saves for the reads outside the region is
  recomputed for the region's own backward where the region's policy says so), and
  what it saves there is saved whatever the plan says (`kept_for_scope`).
- `on_host`: the ops their own scope's policy offloads to host memory: their values
  cost no device bytes.
- `body_verdict(op)`: the same for the ops of a scan loop's body.
"""
from __future__ import annotations

from remat_passes.ir import contract, graph
from remat_passes.ir.verdicts import Offloadable, Recompute


class ScopeModel:
    """What the fixed policies do to the values of one function's analysis (see above)."""

    def __init__(self, a, chains, governed, kept_whole, scope_re):
        """`governed`: which ops the plan decides (a `resolve.Governed`; its `fixed`, a
        PolicyDecider over the policies in force with `auto` ones counted as saving, gives
        the others' verdicts); `kept_whole`: positions saved whole (ops with regions a
        rule decides, scan loops the model takes per iteration)."""
        self.a, self.chains, self.governed = a, chains, governed
        self.fixed = governed.fixed
        self.kept_whole, self.scope_re = kept_whole, scope_re
        self._recomputes_in: dict = {}    # position -> does its scope's backward recompute it
        self._leaves: dict = {}           # vid -> the values that recomputation reads
        self.kept_for_scope: set = set()
        for q in range(len(a.ops)):
            if a.backward[q] and chains[q]:
                for vid in a.reads(q):
                    for r in self._scope_leaves(vid, chains[q][0]):
                        p = a.producer[r]
                        if p >= 0 and self._own_scope_decides(p, chains[q][0]):
                            self.kept_for_scope.add(p)
        self.recomputed = self._recomputed_elsewhere()
        self.on_host = self._offloaded_by_own_policy()

    def backward_reads(self, q, vid) -> tuple:
        """The values backward op `q` needs available to read `vid`."""
        if not self.chains[q]:
            return (vid,)
        return self._scope_leaves(vid, self.chains[q][0])

    def _own_scope_decides(self, p, scope) -> bool:
        """Is forward op `p` made in `scope` (its outermost), with a verdict its policy fixes
        for the reads from that scope's backward? (Not where the plan is that policy: an
        auto region's own ops.)"""
        a, chains = self.a, self.chains
        return (not a.backward[p] and not a.free[p] and not a.side_effect[p]
                and p not in self.kept_whole and bool(chains[p]) and chains[p][0] == scope
                and not (self.governed(p) and self.fixed.decided_by(p) == scope))

    def _recomputes(self, vid, scope) -> bool:
        """Does the backward of `scope` recompute `vid` (rather than read it saved)?"""
        p = self.a.producer[vid]
        if p < 0 or not self._own_scope_decides(p, scope):
            return False
        if p not in self._recomputes_in:
            self._recomputes_in[p] = (_plain(self.a.ops[p]) and
                                      self.fixed.scope_backward_verdict(p, scope) is Recompute)
        return self._recomputes_in[p]

    def _scope_leaves(self, vid, scope) -> tuple:
        """The values a read of `vid` from the backward of `scope` needs: itself, or what
        its recomputation reads, through the values that backward recomputes too."""
        if not self._recomputes(vid, scope):
            return (vid,)
        a, memo = self.a, self._leaves

        def step(v):
            reads = a.reads(a.producer[v])
            pending = [r for r in reads if r not in memo and self._recomputes(r, scope)]
            if not pending:
                memo[v] = tuple(dict.fromkeys(
                    x for r in reads for x in (memo[r] if self._recomputes(r, scope) else (r,))))
            return pending
        return graph.post_order(vid, memo, step)

    def _recomputed_elsewhere(self) -> set:
        """Positions of the forward ops the plan does not decide whose own policy
        recomputes them (`fixed.forward_verdict`), where the model can follow that
        recomputation: plain ops (no regions, no side effects) whose forward readers are
        plain ops too; not those a scope's backward reads saved."""
        a, fixed = self.a, self.fixed
        out = set()
        for pos, op in enumerate(a.ops):
            if (a.backward[pos] or a.free[pos] or self.governed(pos) or a.side_effect[pos]
                    or pos in self.kept_whole or pos in self.kept_for_scope or not _plain(op)):
                continue
            readers = (u for vid in a.results(pos) for u in a.users(vid))
            if all(u < len(a.ops) and (a.backward[u] or _plain(a.ops[u])) for u in readers) \
                    and fixed.forward_verdict(pos) is Recompute:
                out.add(pos)
        return out

    def _offloaded_by_own_policy(self) -> set:
        """Positions of the forward ops the plan does not decide whose own scope's policy
        moves their values to host memory (an offload policy of a region)."""
        a, fixed = self.a, self.fixed
        out = set()
        for pos in range(len(a.ops)):
            if (a.backward[pos] or a.free[pos] or self.governed(pos)
                    or not self.chains[pos] or fixed.decided_by(pos) != self.chains[pos][0]):
                continue
            verdict = fixed.forward_verdict(pos)
            if isinstance(verdict, Offloadable) and verdict.dst in contract.HOST_KINDS:
                out.add(pos)
        return out

    def body_verdict(self, op):
        """For an op of a scan loop's body: None where the plan decides it, else the
        verdict its own policy gives it (the loop's rule asks it per iteration)."""
        if self.governed.body_op(op, self.scope_re):
            return None
        return self.fixed.body_verdict(op)


def _plain(op) -> bool:
    op = op.operation
    return not op.regions and op.name not in ("func.call", graph.MANUAL_COMPUTATION)
