"""The policy in force for an op and its verdict, in one place.

`ScopePolicies` answers which policy decides for an op: its outermost checkpoint scope's
(the user docs' checkpoint regions: `remat[N]` frames and name scopes matched by
`region-regex`), else the module's. `VerdictCache` asks a policy about an op once (a
policy may be a user's callable, and an op is asked about many times), through
`policy_verdict`, which reads a planned policy (`auto`'s solution) by op identity and
gives every other policy the op's `OpInfo`.
"""
from __future__ import annotations

import re
import sys

from remat_passes.analysis import scan_pairs
from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import RematError, ir, op_id
from remat_passes.policy.auto import PlannedPolicy
from remat_passes.policy.policies import (OpInfo, Recompute, Saveable, as_policy,
                                          everything_saveable, nothing_saveable, parse_policy)


def op_info(op, with_attributes: bool = True) -> OpInfo:
    """What a policy sees of `op` (types, attributes and JAX's name are printed only if
    the policy looks at them). Built-in policies never read attributes; they get none."""
    op = op.operation
    dims = {}
    if op.name == "stablehlo.dot_general" and contract.lowered_from(op):
        dims = {"lowered_from": contract.lowered_from(op)}
    elif op.name == "stablehlo.dot_general" and "dot_dimension_numbers" in op.attributes:
        text = str(op.attributes["dot_dimension_numbers"])
        for key in ("lhs_batching", "rhs_batching", "lhs_contracting", "rhs_contracting"):
            m = re.search(key + r"_dimensions = \[([^\]]*)\]", text)
            dims[key + "_dims"] = tuple(int(x) for x in m.group(1).split(",")) if m else ()
    elif op.name == "stablehlo.dot":
        dims = {"lhs_contracting_dims": (1,), "rhs_contracting_dims": (0,)}
    elif contract.is_scaled_dot(op):
        lhs = ir.RankedTensorType(op.operands[0].type).shape
        dims = {"scaled_dot_batch": lhs[0] if lhs else 1}
    return OpInfo(name=op.name,
                  operand_types=lambda: [str(v.type) for v in op.operands],
                  operand_shapes=lambda: [graph.shape_and_element(v.type) for v in op.operands],
                  result_types=lambda: [str(r.type) for r in op.results],
                  attributes=(lambda: {name: str(op.attributes[name]) for name in op.attributes})
                  if with_attributes else {},
                  checkpoint_name=contract.checkpoint_name(op),
                  primitive=lambda: graph.jax_primitive(op),
                  **dims)


def policy_verdict(policy, op):
    """The policy's verdict on `op`. A policy that keeps the OpInfo it was given (to log
    decisions, say) gets it with every field computed, as a record and not a view of IR
    that a later rewrite frees."""
    if isinstance(policy, PlannedPolicy):   # a verdict per op, by identity
        v = policy.verdicts.get(op_id(op))
        if v is not None:
            return v
        # an op in the regions of one the plan decided whole (a case in a loop or a
        # shard_map body, one op of the planning problem): that op's verdict, so that
        # what the rules keep of it is what the plan counted
        for parent in graph.ancestors(op):
            v = policy.verdicts.get(op_id(parent))
            if v is not None:
                return v
        if _made_in_a_clone(op):
            return Recompute
        policy = policy.fallback
    info = op_info(op, policy.reads_attributes)
    try:
        verdict = policy.verdict(info)
    except RematError as e:
        if e.location is None:
            e.location = op.location
        raise
    if sys.getrefcount(info) > 2:   # our reference and getrefcount's own
        info.freeze()
    return verdict


def _made_in_a_clone(op) -> bool:
    """Is `op`, which no plan decided, one a rule made inside a recompute clone that only
    moves data (reads a slot of a saved stack back, stacks a value, a constant index)? It
    is recomputed, as the fixed policies do: saved, a loop around it would stack a copy of
    what is saved already (the fallback, everything_saveable, would save it)."""
    if not (scan_pairs.moves_data(op) or op.name in ("stablehlo.constant",
                                                     "stablehlo.dynamic_update_slice")):
        return False
    return any(contract.is_recompute_clone(parent) for parent in graph.ancestors(op))


def recorded_scope_policies(module_op, region_policies: dict) -> dict:
    """The policies of the checkpoint regions `module_op` records (`contract.region_specs`),
    by scope key; `region_policies`: those given as Python objects (a Module's), which a
    spec "<...>" stands for in the module's text."""
    out = {}
    for key, spec in contract.region_specs(module_op).items():
        # "<...>": a Python callable policy, available only from region_policies
        out[key] = spec if spec.startswith("<") else parse_policy(spec)
    out.update({k: as_policy(p) for k, p in region_policies.items()})
    return out


class ScopePolicies:
    """The policy in force in each checkpoint scope (a `remat[N]` frame or a name scope
    matched by `region-regex`: the user docs' checkpoint regions), and outside them."""

    def __init__(self, module_policy, recorded: dict, scope_policy):
        self.module_policy = module_policy    # None: save everything outside scopes
        self.recorded = recorded              # scope key -> Policy (or a placeholder string)
        self.scope_policy = scope_policy      # policy of scopes made by region-regex

    @property
    def outside(self):
        return self.module_policy or everything_saveable

    def of_scope(self, scope_path: str):
        key = graph.scope_key(scope_path)
        pol = self.recorded.get(key)
        if pol is None:
            if graph.SCOPE_FRAME_RE.fullmatch(key):
                return nothing_saveable  # jax.checkpoint's default
            return self.scope_policy
        if isinstance(pol, str):
            raise RematError(
                f"error: region {key} was made with the Python policy {pol}; it is "
                "only available in the process that exported the module (pass the Module "
                "returned by export_vjp, not a reloaded copy)")
        return pol

    def of_chain(self, chain: tuple):
        """The policy in force for an op: its outermost scope's, else the module's."""
        return self.of_scope(chain[0]) if chain else self.outside


class VerdictCache:
    """Each policy's verdict on each op, asked once. `key` is the op's identity in the
    caller's numbering (a position in an analysis, or `op_id`)."""

    def __init__(self):
        self._by_policy: dict = {}    # id(policy) -> {key: verdict}

    def get(self, policy, op, key):
        if policy.constant is not None:
            return policy.constant
        cache = self._by_policy.setdefault(id(policy), {})
        verdict = cache.get(key)
        if verdict is None:
            verdict = cache[key] = policy_verdict(policy, op)
        return verdict


class BodyVerdicts:
    """op -> verdict for the ops of a region op's body (a scan loop's, decided per
    iteration; a case branch's): the policy of the op's own outermost checkpoint scope, else
    the module's, but Saveable for an input of another scope, as at the top level
    (`PolicyDecider.decided_by`): a `jax.checkpoint` saves its arguments, so each step of
    an unrolled iteration keeps its own input."""

    def __init__(self, policies: ScopePolicies, scope_re, verdicts: VerdictCache):
        self.policies = policies
        self.scope_re = scope_re
        self._verdicts = verdicts
        self._outer: dict = {}       # op id -> its outermost scope (None: outside scopes)

    def outermost(self, op):
        key = op_id(op)
        if key not in self._outer:
            chain = graph.scope_chain(op, self.scope_re)
            self._outer[key] = chain[0] if chain else None
        return self._outer[key]

    def __call__(self, op):
        own = self.outermost(op)
        for result in op.results:
            for use in result.uses:
                if self.outermost(use.owner) not in (None, own):
                    return Saveable
        policy = self.policies.of_scope(own) if own else self.policies.outside
        return self._verdicts.get(policy, op, op_id(op))
