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
   `levels=2`, planned again in two levels where that lowers the peak: `core/levels.py`), then
   `materialize` clones the recomputation just in time and `split` (in
   `mode=split`) cuts the function into `<f>_fwd(primals) -> (outputs...,
   residuals...)` and `<f>_bwd(residuals..., cotangents...) -> (gradients...)`.

`func.call` ops are atomic here (saved, never looked into); the `inline` pass
(the first step of the `remat` pipeline) removes them first.
"""
from __future__ import annotations

import dataclasses
import functools
import re

from remat_passes import jax_compat
from remat_passes.analysis import scan_pairs
from remat_passes.core import residuals as report
from remat_passes.core.levels import two_levels
from remat_passes.core.materialize import analysis_after, materialize
from remat_passes.core.plan import PolicyDecider, build_plan
from remat_passes.core.split import half_analyses, split_function
from remat_passes.ir import contract, graph, mlir
from remat_passes.ir.mlir import RematError, ir, op_id
from remat_passes.ir.symbolic import DimNames
from remat_passes.passes.diagnostics import Remark
from remat_passes.passes.base import ModulePass, PassState, option, parse_int_list, parse_regex
from remat_passes.passes.inline import Inline
from remat_passes.passes.strip_checkpoint_names import StripCheckpointNames
from remat_passes.planner.model import build_problem
from remat_passes.planner.resolve import (BudgetBelowMinimum, Trial, by_compiled_cost,
                                          for_peak, has_auto, monotone_peak, resolve)
from remat_passes.planner import trials
from remat_passes.planner.solvers import minimum_bytes
from remat_passes.policy.auto import AutoPolicy
from remat_passes.policy.scopes import ScopePolicies, VerdictCache
from remat_passes.policy.policies import Policy, as_policy, nothing_saveable, parse_policy
from remat_passes.regions import manual_crossing
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

    def __post_init__(self):
        """Policies given as specs, JAX policies or callables: normalised here, once."""
        if self.policy is not None:
            self.policy = as_policy(self.policy)
        self.region_policy = as_policy(self.region_policy)

    def partial_eval_options(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(PartialEvalOptions)}


@dataclasses.dataclass
class RematPartialEval(PartialEvalOptions, ModulePass):
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
            unnamed = _without_name_stacks(module_op, f, self.func)
            policy = self.policy
            if isinstance(policy, AutoPolicy) and policy.objective == "peak":
                policy = self._residual_budget_for_peak(policy, module_op, state)
            if isinstance(policy, AutoPolicy) and policy.score == "xla":
                policy = self._by_compiled_cost(policy, module_op, state)
            elif isinstance(policy, AutoPolicy) and policy.monotone and \
                    policy.objective == "residuals":
                policy = self._monotone_peak(policy, module_op, state)
            rules = new_rules()   # (each run its own: rules keep what they learn)
            policies = ScopePolicies(
                policy,
                _recorded_scope_policies(module_op, state), self.region_policy)
            block = graph.body_block(f)
            reports = []
            planned = has_auto(policies)
            if planned:   # auto(budget=...): solved for the whole function
                a0 = state.analysis(f)
                kept0 = {}
                for rule in rules.values():
                    kept0.update(rule.kept_whole(a0))
                try:
                    reports = resolve(policies, a0, self.region_regex, set(kept0))
                except BudgetBelowMinimum as e:   # scans in segments may still meet it
                    if e.policy is not policies.module_policy or not (
                            scan_pairs.find_pairs_in_block(block, gspmd.round_trip_source)
                            or manual_crossing.find_manual_pairs(block)):
                        raise
                    policies.module_policy = self._segments_below_the_minimum(e, module_op,
                                                                              state)
                    reports = resolve(policies, a0, self.region_regex, set(kept0))
                state.drop(self.func)
            groups = Groups()
            iteration_policy = _IterationPolicy(policies, self.region_regex)
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
            for rule in rules.values():
                state.remarks.extend(rule.remarks(a, surviving))
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

    def _trial(self, candidate, module_op, state, after, mode="joint"):
        """A trial plan of `candidate` (a policy) on a copy of the module: inline,
        remat-partial-eval in form `mode`, then the passes `after`. Returns (the copy, its
        PassState)."""
        copy = mlir.clone(module_op)
        st = PassState(region_policies=state.region_policies, filename=state.filename)
        st.dim_symbols = dict(state.dim_symbols or {})
        options = {**self.partial_eval_options(), "policy": candidate, "mode": mode}
        # (a loop body outline-loop-backwards made is called from its loop: inlining would
        # put it back)
        inline = [] if _is_loop_body(state, self.func) else [Inline()]
        for step in inline + [RematPartialEval(**options)] + list(after):
            step.apply(copy, st)
            st.drop()
        return copy, st

    def _rest_of_pipeline(self, groups: str = "per-use", rounded: bool = False,
                          tie: bool = True) -> list:
        """The default pipeline's passes after this one, as rp.jit runs them: where XLA
        deletes barriers (CPU), the recomputation tied to the cotangent if `tie` (and, where
        it keeps them through fusion, duplicated chains fenced); barriers `groups`,
        residuals `rounded` (round_read_back). For trial plans measured as they will run."""
        from remat_passes.cost.xla_schedule import deletes_barriers, fences_chains
        from remat_passes.passes.annotate_host_offload import AnnotateHostOffload
        from remat_passes.passes.insert_reduce_precision import InsertReducePrecision
        from remat_passes.passes.place_optimization_barriers import PlaceOptimizationBarriers
        from remat_passes.passes.segment_scans import SegmentScans
        from remat_passes.passes.sink_loop_constants import SinkLoopConstants
        return [InsertReducePrecision(func=self.func, region_regex=self.region_regex,
                                      round_read_back=rounded),
                SegmentScans(func=self.func), SinkLoopConstants(func=self.func),
                PlaceOptimizationBarriers(func=self.func,
                                          tie_to_cotangent=deletes_barriers() and tie,
                                          groups=groups, function_region=True,
                                          fence_chains=fences_chains()),
                AnnotateHostOffload(func=self.func), StripCheckpointNames()]

    def _residual_budget_for_peak(self, policy, module_op, state):
        """auto(objective=peak): plan trial residual budgets on copies of the module and
        measure each plan's joint peak as XLA would allocate it (`estimate_memory`'s "xla"
        model, for the JAX backend in use; `for_peak` chooses among them)."""
        from remat_passes.cost.memory import estimate_memory
        problem = planning_problem(module_op, self.func, policy)
        memo = trials.key(module_op, self.partial_eval_options(), state.region_policies,
                          _is_loop_body(state, self.func), policy)

        def trial(candidate):   # the default pipeline, joint form (barriers split fusions)
            def peak(rest):
                copy, st = self._trial(candidate, module_op, state, rest)
                return (estimate_memory(copy, dim_symbols=st.dim_symbols, model="xla")[
                    self.func].peak_bytes, st.plan_reports[self.func][0].solution.cost)

            def made():
                own, cost = peak(self._rest_of_pipeline())
                if cost:
                    return own, cost
                # recomputing nothing, rp.jit also builds the plan with JAX's one barrier
                # where barriers decide, else with its residuals rounded, and runs the
                # smaller (api/variants)
                return min(own, peak(self._rest_of_pipeline(
                    "per-use" if one_grouping else "per-region", one_grouping))[0]), cost
            return trials.remembered(memo, "peak", candidate.budget.resolve(0), made)
        from remat_passes.cost.xla_schedule import deletes_barriers
        one_grouping = deletes_barriers() and jax_compat.xla_cpu_fuses_across_barriers()
        return for_peak(policy, minimum_bytes(problem), problem.no_remat_bytes(), trial)

    def _monotone_peak(self, policy, module_op, state):
        """auto(monotone=larger|smaller): plan trial residual budgets on copies of the
        module, in this pass's form with the rest of the pipeline as rp.jit runs it, and
        measure each plan's peak (`estimate_memory`'s xla model; of the split form, its
        larger half; the lowest of `compiled_forms`, as rp.jit runs the smallest) and its
        recompute cost (clones and roundings, as `rp.recompute_seconds` counts them);
        where the plan for the budget
        peaks above a larger budget's, `monotone_peak` names the plan kept instead (of a
        larger budget or of a smaller one, as the rule says)."""
        from remat_passes.cost import flops
        from remat_passes.cost.devices import recomputation_seconds, roundings_in
        from remat_passes.cost.memory import estimate_memory
        from remat_passes.cost.xla_schedule import compiled_forms
        from remat_passes.planner.report import format_flop, format_seconds
        from remat_passes.policy.auto import auto
        problem = planning_problem(module_op, self.func, policy)
        lo, hi = minimum_bytes(problem), problem.no_remat_bytes()
        budget = policy.budget.resolve(hi)
        if not lo <= budget < hi:      # below the minimum: an error or scans in segments;
            return policy              # at no remat: nothing recomputed, nothing to weigh

        def candidate(rb):
            return auto(rb, offload=policy.offload, device=policy.device,
                        solver=policy.solver, monotone=False)

        memo = trials.key(module_op, self.partial_eval_options(), state.region_policies,
                          _is_loop_body(state, self.func), policy)

        names = [self.func] if self.mode == "joint" else \
            [f"{self.func}_fwd", f"{self.func}_bwd"]
        forms = compiled_forms(self.mode)

        def made_with(rb, copy, st, tie, groups, fwd=None):
            # (`fwd`: the forward half's peak, one for all forms: they differ in the
            # backward's barriers only)
            with copy.context:
                def funcs():
                    return [graph.find_func(copy, name).operation for name in names]
                before = roundings_in(funcs())
                *rest, strip = self._rest_of_pipeline(groups=groups, tie=tie)
                for step in rest:
                    step.apply(copy, st)
                    st.drop()
                cost = recomputation_seconds(funcs(), policy.profile, flops.CostModel(copy),
                                             before)   # (before the clones' marks go)
                strip.apply(copy, st)
            measured = names[1:] if fwd is not None and len(names) > 1 else names
            estimate = estimate_memory(copy, measured, dim_symbols=st.dim_symbols,
                                       model="xla")
            peaks = {names[0]: fwd, **{n: estimate[n].peak_bytes for n in measured}}
            return Trial(rb, report.activation_bytes(st.residuals[self.func]),
                         max(peaks.values()), cost), peaks[names[0]]

        def made(rb):
            copy, st = self._trial(candidate(rb), module_op, state, [], mode=self.mode)
            copies = [(copy, st)] + [(mlir.clone(copy), st.fork()) for _ in forms[1:]]
            tried, fwd = [], None
            for (c, s), form in zip(copies, forms):
                trial, fwd = made_with(rb, c, s, *form, fwd=fwd)
                tried.append(trial)
            return min(tried, key=lambda t: t.peak)
        m = monotone_peak(budget, lo, hi,
                          lambda rb: trials.remembered(memo, "monotone", rb, lambda: made(rb)),
                          policy.monotone)
        if not m.rises:
            return policy
        planned = "" if m.lower.budget == m.lower_for else \
            f" (that of residual budget {m.lower.budget} B)"
        above = (f"its plan would peak at {m.own.peak} B (estimate_memory's xla model), above "
                 f"the {m.lower.peak} B of the plan for residual budget {m.lower_for} B"
                 f"{planned}")
        if m.chosen is None:
            state.remarks.append(
                f"@{self.func}: {policy.spec}: {above}, and no plan within the budget of the "
                f"{m.trials} tried peaks lower: kept (objective=peak bounds the peak)")
            return policy
        chosen = candidate(m.chosen.budget)
        chosen.spec = f"{policy.spec} (residual budget {m.chosen.budget} B, monotone)"
        profile = policy.profile
        price = format_flop if profile.name == "flops" else format_seconds
        over = f" ({m.chosen.kept - budget} B over the budget)" \
            if m.chosen.kept > budget else ""
        state.remarks.append(
            f"@{self.func}: {policy.spec}: {above}; planned at residual budget "
            f"{m.chosen.budget} B instead: {m.chosen.kept} B kept{over}, a peak of "
            f"{m.chosen.peak} B, recomputation {price(m.own.cost)} -> {price(m.chosen.cost)} "
            f"on {profile.name} (of {m.trials} plans tried)")
        return chosen

    def _by_compiled_cost(self, policy, module_op, state):
        """auto(score=xla): plan each candidate (`by_compiled_cost` names them) on a copy of
        the module in split form with the rest of the default pipeline, compile its two
        halves with XLA and keep the one with the fewest FLOPs in XLA's count. In a function
        with loops, the count is `remat_passes.flops` of the same programs instead: XLA's
        cost analysis counts a loop body once whatever its trip count."""
        from remat_passes.cost import flops
        from remat_passes.passes.annotate_host_offload import AnnotateHostOffload
        from remat_passes.passes.insert_reduce_precision import InsertReducePrecision
        from remat_passes.passes.place_optimization_barriers import PlaceOptimizationBarriers
        from remat_passes.passes.segment_scans import SegmentScans
        from remat_passes.planner.report import format_flop
        if _is_loop_body(state, self.func):
            raise RematError(f"error: {policy.spec} compiles the split form of each candidate "
                             f"plan, and @{self.func} is a loop body with its own backward "
                             "(gradient accumulation), which has none: use score=model")
        if state.compiled_cost is None:
            raise RematError(f"error: {policy.spec} compiles its candidate plans with XLA, and "
                             "this pipeline was given no compiler: run it through rp.remat, "
                             "rp.jit or remat-opt")
        halves = (f"{self.func}_fwd", f"{self.func}_bwd")
        backend = []
        with module_op.context:
            loops = any(op.operation.name == "stablehlo.while" for op in graph.nested_ops(
                graph.body_block(graph.find_func(module_op, self.func))))

        compiled: dict = {}      # the program's text -> its count (candidates may coincide)

        def trial(candidate):
            copy, st = self._trial(candidate, module_op, state, [
                InsertReducePrecision(func=self.func, region_regex=self.region_regex),
                SegmentScans(func=self.func), PlaceOptimizationBarriers(func=self.func),
                AnnotateHostOffload(func=self.func), StripCheckpointNames()], mode="split")
            # (in split form the residual records already are what crosses, saved carries
            # included; a segmented loop's slots are added as the joint form counts them)
            segmented = st.segmented.get(self.func, [])
            kept = report.activation_bytes(st.residuals[self.func]) + sum(
                s.segment_bytes for s in segmented)
            if loops:
                cost = sum(flops.function_flops(copy, h) for h in halves)
            else:
                text = str(copy)
                if text not in compiled:
                    compiled[text] = state.compiled_cost(copy, halves)
                cost, name = compiled[text]
                backend[:] = [name]
            plans = st.plan_reports.get(self.func)
            return kept, cost, plans[0].budget if plans else None
        chosen, scored, budget = by_compiled_cost(policy, trial)
        first = scored[0].cost
        count = "remat_passes.flops (loops: XLA counts a loop body once)" if loops else \
            f"XLA's compiled count ({backend[0] if backend else 'default backend'})"
        rows = "; ".join(f"{s.label}: {s.kept} B, {format_flop(s.cost)}"
                         + (f" ({(s.cost - first) / first:+.2%})" if first else "")
                         for s in scored)
        kept = next(s for s in scored if s.policy is chosen)
        state.remarks.append(
            f"@{self.func}: {policy.spec}: {len(scored)} plans within the budget ({budget} B) "
            f"scored by FLOPs in {count}: {rows}. Kept {kept.label}")
        return chosen

    def _segments_below_the_minimum(self, below, module_op, state):
        """auto with a budget below the least a per-iteration plan keeps (`below`), in a
        function with scan loops: segment the scans too (segment-scans with the two levels
        that keep the fewest bytes, `sqrt`; three, `cbrt`, only when two cannot meet the
        budget). Plans 13 trial residual budgets from that least to no remat on copies of
        the module (joint form), each followed by the segmentation, and takes the cheapest
        plan whose activations after segmentation fit; its policy is returned, and
        segment-scans (next in the remat pipeline) reads the decision from
        `state.planned_segments`."""
        from remat_passes.passes.segment_scans import SegmentScans
        from remat_passes.policy.auto import auto
        policy, budget = below.policy, below.budget
        lo, hi = below.minimum, below.no_remat

        def trial(rb, levels):
            candidate = auto(rb, offload=policy.offload, device=policy.device,
                             solver=policy.solver, monotone=False)
            _, st = self._trial(candidate, module_op, state,
                                [SegmentScans(segments=levels, func=self.func)])
            kept = report.activation_bytes(st.residuals[self.func],
                                           st.segmented.get(self.func, []))
            return kept, st.plan_reports[self.func][0].solution.cost, rb, candidate
        least = None
        for levels in ("sqrt", "cbrt"):
            tried = [trial(int(lo + (hi - lo) * k / 12), levels) for k in range(13)]
            least = min(t[0] for t in tried)
            fitting = [t for t in tried if t[0] <= budget]
            if fitting:
                break
            if least >= lo:                 # segments do not help this function
                raise below
        else:
            raise RematError(
                f"error: {policy.spec}: the budget, {budget} B of activations, is below the "
                f"least this function can keep with its scans in segments (three levels), "
                f"{least} B (per iteration: {lo} B; without remat {hi} B)")
        kept, _, rb, candidate = min(fitting, key=lambda t: (t[1], t[0]))
        candidate.spec = f"{policy.spec} (residual budget {rb} B, scans in segments)"
        state.planned_segments[self.func] = levels
        state.remarks.append(
            f"@{self.func}: {policy.spec}: the budget is below the least a per-iteration plan "
            f"keeps ({lo} B), so the scans run in segments "
            f"({'two' if levels == 'sqrt' else 'three'} levels): {kept} B of activations "
            "after segmenting")
        return candidate

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
    """value -> verdict of the policy in force for its producer (a body op of a loop):
    its outermost checkpoint scope's policy, else the module's (scan loops decide per
    iteration)."""

    def __init__(self, policies: ScopePolicies, scope_re):
        self.policies = policies
        self.scope_re = scope_re
        self._verdicts = VerdictCache()

    def op_verdict(self, op):
        policy = self.policies.of_chain(graph.scope_chain(op, self.scope_re))
        return self._verdicts.get(policy, op, op_id(op))

    def __call__(self, value):
        return scan_pairs.value_verdict(value, self.op_verdict)

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
    if free:
        state.remarks.append(f"auto recomputes {free} op(s) that cost no FLOPs (data "
                             "movement, checkpoint names)")


def _recorded_scope_policies(module_op, state: PassState) -> dict:
    out = {}
    for key, spec in contract.region_specs(module_op).items():
        # "<...>": a Python callable policy, available only from state.region_policies
        out[key] = spec if spec.startswith("<") else parse_policy(spec)
    out.update({k: as_policy(p) for k, p in state.region_policies.items()})
    return out


def planning_problem(module, func: str = "main", policy=None):
    """The planning problem `auto` solves for `func` of a copy of `module` (an ir.Module or
    a Module; inlined; no checkpoint regions of their own: every forward op is governed),
    for the solvers, `bounds` and benchmarks to work on directly."""
    policy = policy or AutoPolicy(0)
    copy = mlir.clone(getattr(module, "op", module))
    state = PassState()
    with copy.context:
        Inline().apply(copy, state)
        state.drop()
        a = state.analysis(graph.find_func(copy, func))
        kept = {}
        for rule in new_rules().values():
            kept.update(rule.kept_whole(a))
        p, _ = build_problem(a, None, set(kept), policy.profile, policy.offload is not None,
                             lambda pos: True)
    p.module = copy      # the ops and values it names live in this copy (an ir.Module)
    return p


def _is_loop_body(state, func: str) -> bool:
    """Is `func` a loop body outline-loop-backwards made a function of?"""
    return any(func in bodies for bodies in state.loop_bodies.values())
