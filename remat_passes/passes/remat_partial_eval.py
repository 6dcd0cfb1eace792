"""remat-partial-eval: decide which forward values are saved and recompute the rest.

The StableHLO analog of JAX's `partial_eval_jaxpr_custom` + `remat_partial_eval`
(`jax/_src/ad_checkpoint.py`). Input: one joint forward+backward function;
its backward ops are found as `contract` states (cotangent arguments, else JAX
transpose name stacks). A forward value a backward op reads is a residual
candidate: saved if the policy in force says Saveable/Offloadable (and always
for arguments and side-effecting ops), recomputed just in time otherwise, free
(cloned) when computed from constants alone. Checkpoint regions (`remat[N]`
frames of `remat_passes.checkpoint`, or scopes matched by `region-regex`) nest
like `jax.checkpoint` calls (see `plan.PolicyDecider`).

In two phases, each deciding before it rewrites:

1. rules for ops with regions (`rules.RULE_TYPES`): scan loop pairs get the policy per
   iteration (`scan_rewrite`);
2. the function: `plan.build_plan` decides every residual (under `auto`, or with
   `levels=2`, planned again in two levels where that lowers the peak: `core/levels.py`; a
   fixed policy that saves only arguments keeps one level, as jax.checkpoint, and a remark
   says what two would save where `levels.two_levels_hint`), then
   `materialize` clones the recomputation just in time and `split` (in
   `mode=split`) cuts the function into `<f>_fwd(primals) -> (outputs...,
   residuals...)` and `<f>_bwd(residuals..., cotangents...) -> (gradients...)`.

`func.call` ops are atomic here (saved, never looked into); the `inline` pass
(the first step of the `remat` pipeline) removes them first.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import re

from remat_passes.analysis import scan_pairs
from remat_passes.core import residuals as report
from remat_passes.core.levels import two_levels, two_levels_hint
from remat_passes.core.materialize import analysis_after, materialize
from remat_passes.core.plan import PolicyDecider, build_plan
from remat_passes.core.split import half_analyses, split_function
from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import RematError, ir, op_id
from remat_passes.ir.symbolic import DimNames
from remat_passes.ir.verdicts import Recompute
from remat_passes.passes.diagnostics import Remark
from remat_passes.passes.base import (ModulePass, PassState, option, parse_bool, parse_int_list,
                                     parse_regex)
from remat_passes.passes.trial_plans import TrialPlans
from remat_passes.planner.resolve import BudgetBelowMinimum, has_auto, resolve
from remat_passes.policy.auto import PlannedPolicy
from remat_passes.policy.scopes import (BodyVerdicts, ScopePolicies, VerdictCache,
                                        recorded_scope_policies)
from remat_passes.policy.policies import Policy, as_policy, nothing_saveable, parse_policy
from remat_passes.regions import loop_edit, manual_crossing
from remat_passes.regions.rules import Groups, new_rules
from remat_passes.sharding import gspmd

Residual = report.Residual


def parse_mode(text: str) -> str:
    if text not in ("joint", "split"):
        raise ValueError(f"expected joint or split, got '{text}'")
    return text


LEVELS = ("1", "2", "auto")


def parse_levels(text: str) -> str:
    if text not in LEVELS:
        raise ValueError(f"expected 1, 2 or auto, got '{text}'")
    return text


def parse_optional_policy(text: str) -> Policy | None:
    return None if text.strip() in ("", "none", "None") else parse_policy(text)


@dataclasses.dataclass
class PartialEvalOptions:
    """The options of remat-partial-eval (the `remat` pipeline takes them too)."""
    policy: Policy | None = option(
        None, "policy outside checkpoint regions, e.g. dots_saveable or "
        "save_only_these_names(a,b) (default: save everything, like JAX without "
        "jax.checkpoint)", parse_optional_policy)
    mode: str = option(
        "joint", "joint: one function; split: <f>_fwd and <f>_bwd with explicit residuals",
        parse_mode)
    cotangent_args: list | None = option(
        None, "indices of the cotangent arguments; they replace the arguments marked "
        "remat.cotangent (default: the marked ones, else JAX transpose name stacks)",
        parse_int_list)
    func: str = option("main", "the joint function to rewrite")
    region_regex: re.Pattern | None = option(
        None, "turn name-stack scopes matching this regex into checkpoint regions", parse_regex)
    region_policy: Policy = option(
        nothing_saveable, "policy of the regions made by region-regex", parse_policy)
    levels: str = option(
        "auto", "recomputation levels outside scans: 1 recomputes each value once, as "
        "jax.checkpoint does; 2 keeps only segment boundaries of the recomputed forward and "
        "recomputes each segment again before its backward, where that lowers the peak "
        "estimate by 15%; auto: 2 under an auto policy, else 1",
        parse_levels)
    round_exact: bool = option(
        True, "the pipeline rounds the f32 and f64 residuals a recomputation reads "
        "(insert-reduce-precision round-exact=): auto prices those roundings; false: they "
        "are not made, and not priced", parse_bool)

    def __post_init__(self):
        """Policies given as specs, JAX policies or callables: normalised here, once."""
        if self.policy is not None:
            self.policy = as_policy(self.policy)
        self.region_policy = as_policy(self.region_policy)

    def partial_eval_options(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(PartialEvalOptions)}


@dataclasses.dataclass
class RematPartialEval(PartialEvalOptions, TrialPlans, ModulePass):
    name = "remat-partial-eval"
    summary = ("Save or recompute forward values of a joint VJP function per a checkpoint "
               "policy; recomputation placed just in time")
    # (it drops every analysis itself, then hands on the one of the function it rewrote)
    preserves_analyses = True

    def apply(self, module_op, state: PassState) -> None:
        f = graph.find_func(module_op, self.func)   # a clear error before any rewrite
        first_remark = len(state.remarks)
        location = f.location        # (what this run's remarks are about: the function)
        with module_op.context:
            self._mark_cotangents(f, state)
            if loop_edit.read_stacks_directly(graph.body_block(f)):
                state.drop(self.func)     # (scan pairs that an unrolled scan's stacking hid)
            unnamed = _without_name_stacks(module_op, f, self.func)
            policy = self._trial_budgets(self.policy, module_op, state)
            rules = new_rules()   # (each run its own: rules keep what they learn)
            policies = ScopePolicies(
                policy,
                recorded_scope_policies(module_op, state.region_policies), self.region_policy)
            block = graph.body_block(f)
            reports = []
            planned = has_auto(policies)
            if planned:   # auto(budget=...): solved for the whole function
                a0 = state.analysis(f)
                kept0 = {}
                for rule in rules.values():
                    kept0.update(rule.kept_whole(a0))
                below = None
                try:
                    reports = resolve(policies, a0, self.region_regex, set(kept0),
                                      round_exact=self.round_exact)
                except BudgetBelowMinimum as e:   # scans in segments may still meet it
                    if e.policy is not policies.module_policy or not (
                            scan_pairs.find_pairs_in_block(block, gspmd.round_trip_source)
                            or manual_crossing.find_manual_pairs(block)):
                        raise
                    below = e
                if below:   # (out of the handler: an error raised here is not caused by it)
                    policies.module_policy = self._segments_below_the_minimum(below, module_op,
                                                                              state)
                    reports = resolve(policies, a0, self.region_regex, set(kept0),
                                      round_exact=self.round_exact)
                state.drop(self.func)
            groups = Groups()
            iteration_policy = _IterationPolicy(
                policies, self.region_regex,
                gspmd_regions=gspmd.num_devices(module_op) > 1 and any(
                    graph.custom_call_target(op) == graph.SPMD_FULL_TO_SHARD
                    for op in graph.nested_ops(block)))
            for rule in rules.values():     # phase 1: ops with regions, decided inside
                # (the analysis of the function as it was: for telling backward from
                # forward ops before any rule rewrites)
                rule.rewrite(block, iteration_policy, groups, lambda: state.analysis(f))
            for attempt in range(4):       # phase 2: the function (planned again if
                state.drop(self.func)      # a rule tidies what the plan did not read)
                a = state.analysis(f)
                kept, twins = {}, {}
                for rule in rules.values():
                    kept.update(rule.kept_whole(a))
                    twins.update(rule.twins(a))
                decider = PolicyDecider(a, policies, self.region_regex)
                build = functools.partial(build_plan, a, split=self.mode == "split",
                                          kept_whole=kept, first_group=groups.n, twins=twins)
                plan = build(decider)
                levels_remark = None
                if self.levels == "2" or (self.levels == "auto" and planned):
                    two = two_levels(a, decider, plan, build)
                    if two is not None:
                        plan = two.plan
                        levels_remark = (
                            f"@{self.func}: recomputed in two levels: the backward keeps "
                            f"{two.segments - 1} segment boundaries of the recomputed forward "
                            f"and recomputes each of the {two.segments} segments again before "
                            f"its backward ({two.extra_clones} more recomputed ops); its "
                            f"peak, by estimate_memory's xla model, {two.one_level} B -> "
                            f"{two.two_levels} B")
                if attempt == 3 or not any(
                        [rule.tidy(a, plan.twins_read) for rule in rules.values()]):
                    break
            hint = (two_levels_hint(a, decider, plan)
                    if self.levels == "auto" and not planned else None)
            if hint is not None:      # (said, not taken: core/levels' module doc)
                state.remarks.append(
                    f"@{self.func}: the plan saves only arguments, so the backward "
                    "recomputes the forward at once and holds what its ops read of it: "
                    f"{hint.one_level} B; in two levels (levels=2: rp.jit / rp.remat "
                    f"levels=\"2\") it would keep {hint.segments - 1} segment boundaries and "
                    "recompute each segment again before its backward, holding at most "
                    f"{hint.two_levels} B of it at a time (static working sets; levels=2 "
                    "says the peak estimates)")
            vids = plan.residuals()
            dims = DimNames(f, (state.dim_symbols or {}).get(self.func))
            layouts = gspmd.residual_layouts(a, vids)    # per-device values of GSPMD shard_maps
            residuals = [report.residual(a.value(v), f, plan.saved[v], a, dims,
                                         layouts[v][1] if v in layouts else None)
                         for v in vids]
            for r in reports:
                _explain(r, a, vids, residuals, state)
            unrecorded = _unrecorded_regions(a, self.func, policies)   # (before ops go)
            baked = _baked_recomputation(a, self.func, policies)
            edit = materialize(plan)
            erased = edit.erased
            keep = [i for i, v in enumerate(vids) if a.producer[v] not in erased]
            vids = [vids[i] for i in keep]
            residuals = [residuals[i] for i in keep]
            surviving = set(range(len(a.ops))) - erased
            recomputed = {clone.op for clone in plan.clones()}
            for rule in rules.values():
                state.remarks.extend(rule.remarks(a, surviving, recomputed))
            if iteration_policy.overridden:
                state.remarks.append(
                    f"@{self.func}: {len(iteration_policy.overridden)} value(s) inside GSPMD "
                    "shard_maps in scan loop bodies are recomputed, not kept per iteration as "
                    "the policy says (XLA's partitioner aborts on a loop carrying a "
                    "per-device value; under Shardy they are kept)")
            state.remarks.extend(_missing_names(f, self.func, policies))
            state.remarks.extend(unnamed)
            state.remarks.extend(unrecorded)
            state.remarks.extend(baked)
            calls = sum(1 for pos in surviving if a.ops[pos].name == "func.call")
            if calls:
                state.remarks.append(
                    f"@{self.func}: {calls} func.call op(s) are kept as atomic calls (saved, "
                    "the policy cannot see inside); run the inline pass first (the remat "
                    "pipeline does)")
            state.drop()
            if self.mode == "split":
                if state.dim_symbols is not None:   # the halves' arguments keep their names
                    state.dim_symbols.update(dims.split_arguments(a, [a.value(v) for v in vids]))
                halves = split_function(plan, edit, vids, [str(r) for r in residuals], layouts)
                if not layouts:   # (a GSPMD residual crosses through ops split inserts)
                    for g, analysis in zip(halves, half_analyses(a, edit, vids, *halves)):
                        if analysis is not None:
                            state.keep(g, analysis)
            else:                 # the next passes read the function as it is now
                state.keep(f, analysis_after(plan, edit))
            if levels_remark:
                contract.set_recompute_levels(halves[1] if self.mode == "split" else f, 2)
                state.remarks.append(levels_remark)
        state.residuals[self.func] = residuals
        state.plan_reports[self.func] = reports
        state.remarks[first_remark:] = [Remark(r, location)
                                        for r in state.remarks[first_remark:]]

    def _mark_cotangents(self, f, state: PassState) -> None:
        """`cotangent-args` is authoritative: it replaces the marks (remarked if they differ);
        later passes find the cotangents by the marks."""
        if self.cotangent_args is None:
            return
        nargs = len(graph.body_block(f).arguments)
        for i in self.cotangent_args:
            if not 0 <= i < nargs:
                raise RematError(f"error: cotangent argument index {i} is out of range "
                                 f"(@{self.func} has {nargs} arguments)", f.location)
        marked = contract.cotangent_args(f)
        if marked and sorted(marked) != sorted(set(self.cotangent_args)):
            state.remarks.append(
                f"@{self.func}: cotangent-args={','.join(map(str, self.cotangent_args))} "
                f"replaces the arguments marked {contract.COTANGENT} "
                f"({','.join(map(str, marked))})")
        contract.mark_cotangent_args(f, self.cotangent_args)
        state.drop(self.func)


def _without_name_stacks(module_op, f, func: str) -> list[str]:
    """A remark where a module JAX exported (its `mhlo.*` / `jax.*` module attributes say
    so) comes without the locations that carry JAX's name stacks (`Module.text()` leaves
    them out): the backward is then found by the cotangent marks alone, and JAX's transpose
    work that reads no cotangent (broadcasts, a mean's 1/N, a kernel reversal) counts as
    forward, so its results can be saved where JAX recomputes nothing of them."""
    attrs = module_op.operation.attributes
    names = [attrs[k].name for k in range(len(attrs))]
    if not any(n.startswith(("mhlo.", "jax.")) for n in names) or \
            not contract.cotangent_args(f):
        return []
    for op in graph.body_block(f).operations:
        if graph.name_stack(op):
            return []
    return [f"@{func}: no op carries JAX's name stack (the module was written without "
            "locations: Module.text() leaves them out, Module.save and "
            "text(debug_info=True) keep them): the backward is found by the cotangent "
            "marks alone, so transpose work that reads no cotangent counts as forward and "
            "its results may be saved"]


def _missing_names(f, func: str, policies: ScopePolicies) -> list[str]:
    """Remarks for checkpoint names a policy looks for that no value of @func has: a typo,
    or names lost in export (`jax.export` lowers checkpoint_name to nothing)."""
    candidates = [policies.module_policy, policies.scope_policy, *policies.recorded.values()]
    wanted: dict = {}
    any_of: set = set()         # specs content with any one of their names
    for pol in candidates:
        names = getattr(pol, "names", None)
        if names:
            wanted.setdefault(pol.spec, set()).update(names)
            if getattr(pol, "names_any", False):
                any_of.add(pol.spec)
    if not wanted:
        return []
    present: set = set()

    def visit(op):
        name = contract.checkpoint_name(op)
        if name is not None:
            present.add(name)
        return ir.WalkResult.ADVANCE
    f.operation.walk(visit)
    out = []
    for spec, names in wanted.items():
        missing = sorted(names - present)
        if not missing or (spec in any_of and names & present):
            continue
        which = ", ".join(repr(n) for n in missing)
        if present:
            out.append(f"@{func}: {spec}: no value of @{func} is named {which}; the names it "
                       f"has: {', '.join(repr(n) for n in sorted(present))}")
        else:
            verb = "matches" if len(missing) == 1 else "match"
            out.append(f"@{func}: {spec}: @{func} has no checkpoint names at all, so {which} "
                       f"{verb} nothing (jax.export drops checkpoint_name: export with "
                       "rp.export or rp.export_vjp, or inside `with rp.names_as_markers():`, to "
                       "keep them)")
    return out


def _unrecorded_regions(a, func: str, policies: ScopePolicies) -> list[str]:
    """A remark for `remat[N]` frames (rp.checkpoint regions) whose policy the module
    does not record: `jax.checkpoint`'s default applies to them."""
    keys = {graph.scope_key(path) for chain in set(a.scope_chains(None)) for path in chain}
    missing = sorted((k for k in keys if k not in policies.recorded),
                     key=lambda k: int(k[6:-1]))
    if not missing:
        return []
    return [f"@{func}: checkpoint region(s) {', '.join(missing)} have no recorded policy "
            f"(no {contract.REGIONS} entry: export with rp.export or rp.export_vjp to "
            "record it); nothing_saveable, jax.checkpoint's default, applies"]


JAX_RECOMPUTATION_FRAME = "rematted_computation"    # jax.checkpoint's own, in a backward


def _baked_recomputation(a, func: str, policies: ScopePolicies) -> list[str]:
    """A remark when the module already recomputes: JAX applied the `jax.checkpoint`
    regions of the model code when it exported the function (their backward recomputes
    under a `rematted_computation` frame), so a module policy does not reach inside them."""
    if policies.module_policy is None:
        return []
    n = sum(1 for pos, op in enumerate(a.ops) if a.backward[pos]
            and f"/{JAX_RECOMPUTATION_FRAME}/" in graph.name_stack(op))
    if not n:
        return []
    return [f"@{func}: {n} backward op(s) are JAX's own recomputation of jax.checkpoint "
            "regions in the model code (name stacks with 'rematted_computation'): JAX applied "
            "those regions' policies when the function was exported, so the module policy "
            "decides only outside them; jax.checkpoint(f, policy) around the same model lets "
            "policy decide inside them too (the outermost wins). Export with "
            "jax_checkpoint=\"regions\" (rp.export, rp.export_vjp, rp.jit) to make them "
            "regions the passes apply, each with its own policy, and wrap the model in "
            "rp.checkpoint(f, policy=...) for that policy to decide inside them too"]


class _IterationPolicy:
    """value -> verdict for its producer, a body op of a loop (scan loops decide per
    iteration): `BodyVerdicts`, its outermost checkpoint scope's policy, else the module's,
    Saveable for the input of another scope.

    A value inside a GSPMD shard_map (inlined into a scanned layer) is recomputed, never
    kept per iteration: a loop carrying a per-device value makes XLA's partitioner abort
    (jaxlib 0.10.2 to 0.12); `overridden` counts those the policy would have kept (the
    remark). One in a cond branch outside loops is kept (a conditional's results may be
    per-device values). Under Shardy the shard_map is a region op the policy sees into
    instead (`manual_nested`)."""

    def __init__(self, policies: ScopePolicies, scope_re, gspmd_regions: bool = False):
        self.policies = policies
        self.scope_re = scope_re
        self.op_verdict = BodyVerdicts(policies, scope_re, VerdictCache())
        self._manual = gspmd.InManualRegion() if gspmd_regions else None
        self.overridden: set = set()

    def __call__(self, value):
        verdict = scan_pairs.value_verdict(value, self.op_verdict)
        if verdict is Recompute or self._manual is None or not isinstance(value, ir.OpResult):
            return verdict
        op = value.owner.operation
        if any(p.name == graph.WHILE for p in graph.ancestors(op)) and self._manual(value) \
                and op.name not in graph.SIDE_EFFECT_OPS - graph.COLLECTIVE_OPS:
            self.overridden.add(value)
            return Recompute
        return verdict

    def replaced(self, old: int, new) -> None:
        """Op `new` replaces the op whose id was `old` (`nested_saves.replaced`): the plans
        in force give it that op's verdict."""
        p = self.policies
        for policy in (p.module_policy, p.scope_policy, *p.recorded.values()):
            if isinstance(policy, PlannedPolicy):
                policy.replaced(old, new)

    def in_scope(self, op) -> bool:
        """Is `op` inside a checkpoint scope? (A scan loop there is re-run whole by the
        backward, as `jax.checkpoint` around a function with a scan does.)"""
        return bool(graph.scope_chain(op, self.scope_re))


def _explain(plan_report, a, vids, residuals, state) -> None:
    """auto: say what recomputing each saved value would have cost, and what is recomputed."""
    for vid, r in zip(vids, residuals):
        pos = a.producer[vid]
        if pos >= 0:
            op = a.ops[pos]
            cost = plan_report.recompute_cost.get(op_id(op))
            if cost is not None and cost[0] == op.name and cost[1] > 0:
                r.note = f"recomputing it: {plan_report.with_flops(cost[1], cost[2])}"
    state.remarks.append(plan_report.summary())
    free = 0
    for what, f, seconds, label in plan_report.recomputed:
        if f <= 0:
            free += 1
            continue
        where = ("" if label == "top" else f" in the body of the {label}"
                 if label.startswith("shard_map") else f" per iteration of the {label}")
        state.remarks.append(f"auto recomputes {what}{where}: "
                             f"{plan_report.with_flops(f, seconds)}")
    unpriced = collections.Counter(plan_report.unpriced)
    free -= len(plan_report.unpriced)          # (costing no FLOPs as counted, too)
    if free:
        state.remarks.append(f"auto recomputes {free} op(s) that cost no FLOPs (data "
                             "movement, checkpoint names)")
    if unpriced:
        targets = ", ".join(f"@{t}" + (f" x{n}" if n > 1 else "")
                            for t, n in sorted(unpriced.items()))
        state.remarks.append(
            f"auto recomputes {sum(unpriced.values())} custom call(s) whose cost it cannot "
            f"know ({targets}): it counts them as 0 FLOPs"
            + ("" if plan_report.device == "flops" else ", their memory traffic only")
            + "; if recomputing them is expensive, give auto a larger budget or call them "
            "in an rp.checkpoint region whose own policy saves their outputs (auto leaves "
            "such regions to their policies)")
