"""Trial plans: `auto` options that remat-partial-eval resolves by planning the function
again on copies of the module, each followed by the rest of the pipeline as rp.jit runs it,
and measuring what each plan leaves: `objective=peak` (the residual budget whose plan peaks
within the budget: as estimated, or with score=xla as XLA compiles it), `monotone` (a larger
or smaller budget's plan where the budget's own would peak above a larger budget's),
`score=xla` (the candidate XLA compiles to the fewest FLOPs) and a budget below the least a
per-iteration plan keeps in a function with scans (the scans in segments). `TrialPlans` is
the pass's side of it (remat-partial-eval inherits it); the rules that choose among trial
plans are `planner.resolve`'s, the memo of plans made is `planner.trials`.
"""
from __future__ import annotations

from remat_passes.core import residuals as report
from remat_passes.ir import graph, mlir
from remat_passes.ir.mlir import RematError
from remat_passes.passes.base import PassState, Progress
from remat_passes.passes.inline import Inline
from remat_passes.passes.strip_checkpoint_names import StripCheckpointNames
from remat_passes.planner import trials
from remat_passes.planner.model import build_problem
from remat_passes.planner.resolve import (BudgetBelowMinimum, Trial, by_compiled_cost, for_peak,
                                          Governed, fixed_verdicts, monotone_grid,
                                          monotone_peak)
from remat_passes.planner.solvers import minimum_bytes, solve_all
from remat_passes.policy.auto import AutoPolicy
from remat_passes.policy.scopes import ScopePolicies, recorded_scope_policies
from remat_passes.regions.rules import new_rules

LARGEST_WEIGHED = 1500    # ops of the largest function whose equal-cost plans are weighed (each
                          # weighed plan runs the rest of the pipeline in every compiled form:
                          # at 2,500 ops that added 6 to 17 s on 2 cores, at 1,203, the GPT, 3.4 s)


class TrialPlans:
    """remat-partial-eval's trial plans (its options: `partial_eval_options`, `func`,
    `mode`, `region_regex`): each method takes an `auto` policy and returns the policy to
    plan with, leaving a remark where it chose another."""

    def _trial_budgets(self, policy, module_op, state):
        """The policy to plan with: `policy`, or where it is an auto policy that plans trial
        budgets first (objective=peak, score=xla, monotone), the candidate they choose. A
        progress bar counts the trial plans on a terminal where they take over a second."""
        if not isinstance(policy, AutoPolicy):
            return policy
        if _weighs_ties(policy) and not policy.monotone:
            return self._equal_cost_peak(policy, module_op, state)
        if not (policy.objective == "peak" or policy.score == "xla" or policy.monotone):
            return policy
        with Progress(None, f"@{self.func}: {policy.spec}: trial plans") as state.progress:
            try:
                if policy.objective == "peak":
                    policy = self._residual_budget_for_peak(policy, module_op, state)
                if isinstance(policy, AutoPolicy) and policy.score == "xla":
                    policy = self._by_compiled_cost(policy, module_op, state)
                elif isinstance(policy, AutoPolicy) and policy.monotone and \
                        policy.objective == "residuals":
                    policy = self._monotone_peak(policy, module_op, state)
            finally:
                state.progress = None
        return policy

    def _trial(self, candidate, module_op, state, after, mode="joint"):
        """A trial plan of `candidate` (a policy) on a copy of the module: inline,
        remat-partial-eval in form `mode`, then the passes `after`. Returns (the copy, its
        PassState)."""
        if state.progress is not None:
            state.progress.advance()
        copy = mlir.clone(module_op)
        st = PassState(region_policies=state.region_policies, filename=state.filename)
        st.dim_symbols = dict(state.dim_symbols or {})
        options = {**self.partial_eval_options(), "policy": candidate, "mode": mode}
        # (a loop body outline-loop-backwards made is called from its loop: inlining would
        # put it back)
        inline = [] if _is_loop_body(state, self.func) else [Inline()]
        for step in inline + [type(self)(**options)] + list(after):
            step.apply(copy, st)
            st.drop()
        return copy, st

    def _solve_ahead(self, problem, state, budgets, solver) -> None:
        """The planning problem (`planning_problem`, as the trial plans' pass builds it)
        solved at the trial residual budgets `budgets` side by side (`solvers.solve_all`):
        the trial plans, made one by one next, find their solutions in the solvers' memo."""
        if not _is_loop_body(state, self.func):     # (a loop body is planned uninlined)
            solve_all(problem, budgets, solver)

    def _rest_of_pipeline(self, groups: str = "per-use", rounded: bool = False,
                          tie: bool = True) -> list:
        """The default pipeline's passes after this one, as rp.jit runs them: where XLA
        deletes barriers (CPU), the recomputation tied to the cotangent if `tie` (and, where
        it keeps them through fusion, duplicated chains fenced); barriers `groups`,
        residuals `rounded` (round_read_back; none with round-exact=false, which leaves f32
        and f64 unrounded). For trial plans measured as they will run."""
        from remat_passes.cost.xla_schedule import deletes_barriers, fences_chains
        from remat_passes.passes.annotate_host_offload import AnnotateHostOffload
        from remat_passes.passes.fold_dot_transposes import FoldDotTransposes
        from remat_passes.passes.insert_reduce_precision import InsertReducePrecision
        from remat_passes.passes.place_optimization_barriers import PlaceOptimizationBarriers
        from remat_passes.passes.segment_scans import SegmentScans
        from remat_passes.passes.sink_loop_constants import SinkLoopConstants
        return [InsertReducePrecision(func=self.func, region_regex=self.region_regex,
                                      round_read_back=rounded and self.round_exact,
                                      round_exact=self.round_exact),
                SegmentScans(func=self.func), SinkLoopConstants(func=self.func),
                PlaceOptimizationBarriers(func=self.func,
                                          tie_to_cotangent=deletes_barriers() and tie,
                                          groups=groups, function_region=True,
                                          fence_chains=fences_chains()),
                AnnotateHostOffload(func=self.func), StripCheckpointNames(),
                FoldDotTransposes(func=self.func)]

    def _residual_budget_for_peak(self, policy, module_op, state):
        """auto(objective=peak): plan trial residual budgets on copies of the module and
        measure each plan's joint peak as XLA would allocate it (`estimate_memory`'s "xla"
        model, for the JAX backend in use; with score=xla, XLA's footprint of the program
        compiled, `state.compiled_memory`, side by side); `for_peak` chooses among them.
        With the estimate, where the pipeline has a compiler (rp.remat, rp.jit,
        remat-opt), the choice is checked against XLA's footprint of it compiled
        (`for_peak`'s `check`)."""
        from remat_passes.cost.memory import estimate_memory
        from remat_passes.cost.xla_schedule import peak_forms
        compiled = policy.score == "xla"
        if compiled:
            self._can_compile(policy, state, state.compiled_memory)
        problem = planning_problem(module_op, self.func, policy, self.region_regex,
                                   state.region_policies, self.region_policy,
                                   round_exact=self.round_exact)
        memo = trials.key(module_op, self.partial_eval_options(), state.region_policies,
                          _is_loop_body(state, self.func), policy)

        def measured(candidates, compile_it):
            # each plan's (peak, cost) in the default pipeline, joint form (barriers split
            # fusions), its lowest peak of the forms rp.jit builds (`peak_forms`). Compiled,
            # each plan is made while those before it compile (side by side:
            # state.compiled_memory)
            by_budget = {c.budget.resolve(0): c for c in candidates}

            def made_all(rbs):
                costs, owners = {}, []
                self._solve_ahead(problem, state, rbs, policy.solver)

                def plans():
                    for rb in rbs:     # (planned once, the rest of the pipeline per form)
                        planned, st = self._trial(by_budget[rb], module_op, state, [])
                        costs[rb] = st.plan_reports[self.func][0].solution.cost
                        wanted = peak_forms(bool(costs[rb]))
                        copies = [(mlir.clone(planned), st.fork()) for _ in wanted[1:]]
                        for form, (copy, s) in zip(wanted, [(planned, st)] + copies):
                            for step in self._rest_of_pipeline(**form):
                                step.apply(copy, s)
                                s.drop()
                            owners.append(rb)
                            yield copy, s
                if compile_it:
                    peaks = state.compiled_memory((copy, self.func) for copy, _ in plans())[0]
                else:
                    peaks = [estimate_memory(copy, dim_symbols=st.dim_symbols, model="xla")[
                        self.func].peak_bytes for copy, st in plans()]
                lowest: dict = {}
                for rb, peak in zip(owners, peaks):
                    lowest[rb] = min(lowest.get(rb, peak), peak)
                return [(lowest[rb], costs[rb]) for rb in rbs]
            return trials.remembered_all(memo, "compiled peak" if compile_it else "peak",
                                         [c.budget.resolve(0) for c in candidates], made_all)

        failed = []

        def check(candidate):
            try:
                return measured([candidate], True)[0][0]
            except Exception as e:   # (an optional check: the estimate's plan stands)
                failed.append(str(e).splitlines()[0] if str(e) else type(e).__name__)
                return None
        checks = not compiled and policy.check and state.compiled_memory is not None and \
            policy.offload is None and not _is_loop_body(state, self.func)
        choice = for_peak(policy, minimum_bytes(problem), problem.no_remat_bytes(),
                          lambda candidates: measured(candidates, compiled),
                          check if checks else None)
        self._remark_peak_check(policy, choice, failed, state)
        return choice.policy

    def _remark_peak_check(self, policy, choice, failed, state) -> None:
        """The remark where objective=peak's check against XLA changed or could not confirm
        the estimate's choice."""
        def plan(candidate):
            return f"residual budget {candidate.budget.resolve(0)} B"
        where = f"@{self.func}: {policy.spec}"
        if failed:
            state.remarks.append(f"{where}: the plan's joint peak is as estimated, not checked "
                                 f"against XLA, which could not compile it alone ({failed[0]})")
            return
        if choice.compiled is None:
            return
        fits = choice.compiled <= choice.budget
        none_fit = "" if fits else \
            f", the least of the {choice.compiles} plans compiled, none within the budget"
        if choice.replaced is not None:
            first, estimated, footprint = choice.replaced
            state.remarks.append(
                f"{where}: the estimate's plan ({plan(first)}, a joint peak of {estimated} B "
                f"as estimated) allocates {footprint} B as XLA compiles it, above the budget; "
                f"planned at {plan(choice.policy)} instead: {choice.compiled} B as XLA "
                f"compiles it{none_fit} ({choice.estimated} B as estimated; "
                f"{choice.compiles} plans compiled)")
        elif not fits:
            state.remarks.append(
                f"{where}: its plan ({plan(choice.policy)}) allocates {choice.compiled} B as "
                f"XLA compiles it, above the budget, and none of the {choice.compiles} plans "
                "compiled allocates less: kept (score=xla weighs every trial plan as XLA "
                "compiles it)")
        elif choice.estimated > choice.budget:
            state.remarks.append(
                f"{where}: no plan's joint peak as estimated fits the budget; planned at "
                f"{plan(choice.policy)}, which XLA allocates {choice.compiled} B for "
                f"({choice.estimated} B as estimated; {choice.compiles} plans compiled)")

    def _can_compile(self, policy, state, compiler) -> None:
        """Raise unless `policy` (score=xla) can compile this pass's trial plans."""
        if _is_loop_body(state, self.func):
            raise RematError(f"error: {policy.spec} compiles each trial plan, and @{self.func} "
                             "is a loop body with its own backward (gradient accumulation), "
                             "which is not a program of its own: use score=model")
        if compiler is None:
            raise RematError(f"error: {policy.spec} compiles its trial plans with XLA, and this "
                             "pipeline was given no compiler: run it through rp.remat, rp.jit "
                             "or remat-opt")

    def _within_range(self, policy, candidate, module_op, state):
        """(the planning problem of `candidate` as the trial plans' pass builds it, the least
        a plan keeps, what no remat keeps, `policy`'s budget in bytes); None where the
        budget is below the least (an error, or scans in segments) or at no remat (nothing
        recomputed, nothing to weigh)."""
        problem = planning_problem(module_op, self.func, candidate, self.region_regex,
                                   state.region_policies, self.region_policy,
                                   round_exact=self.round_exact)
        lo, hi = minimum_bytes(problem), problem.no_remat_bytes()
        budget = policy.budget.resolve(hi)
        return (problem, lo, hi, budget) if lo <= budget < hi else None

    def _equal_cost_peak(self, policy, module_op, state):
        """auto(ties=peak), the default: where other plans within the budget cost what the
        cheapest costs (`working_set.equal_cost_plan`: those recomputing ops toward the end
        of the forward pass and toward its start), weigh each distinct one (`_weigh`: on a
        copy of the module, with the rest of the pipeline) and plan with the one whose
        estimated peak is lowest (the integer program's first on a tie). Nothing is built
        where there is no other plan."""
        from remat_passes.planner.solvers import solve
        from remat_passes.planner.working_set import TOWARD, equal_cost_plan
        from remat_passes.policy.auto import auto

        def candidate(ties):
            return auto(policy.budget, offload=policy.offload, device=policy.device,
                        solver=policy.solver, ties=ties)
        if _is_loop_body(state, self.func):     # (planned uninlined)
            return policy
        with module_op.context:       # (a large function is solved by the Lagrangian)
            block = graph.body_block(graph.find_func(module_op, self.func))
            if sum(1 for _ in graph.nested_ops(block)) > LARGEST_WEIGHED:
                return policy
        planned = self._within_range(policy, candidate("none"), module_op, state)
        if planned is None:
            return policy
        problem, _, _, budget = planned
        first = solve(problem, budget, policy.solver)[0]
        others, seen = [], [first.recompute]
        for toward in TOWARD:
            other = equal_cost_plan(problem, budget, first, toward, policy.solver)
            if other is not None and not any((other.recompute == s).all() for s in seen):
                others.append(toward)
                seen.append(other.recompute)
        if not others:
            return policy
        weighed = [("none", self._weigh(candidate("none"), budget, module_op, state))] + [
            (toward, self._weigh(candidate(toward), budget, module_op, state))
            for toward in others]
        ties, best = min(weighed, key=lambda w: w[1].peak)      # (the first of equals)
        if ties == "none":
            return policy
        peaks = ", ".join(f"{'the integer program' if t == 'none' else t}'s {w.peak} B"
                          for t, w in weighed)
        state.remarks.append(
            f"@{self.func}: {policy.spec}: {len(weighed)} plans cost the same "
            f"({format_cost(policy.profile, best.cost)}) and would peak at {peaks} "
            f"(estimate_memory's xla model): kept {ties}'s")
        chosen = candidate(ties)
        chosen.spec = policy.spec
        return chosen

    def _monotone_peak(self, policy, module_op, state):
        """auto(monotone=larger|smaller): plan trial residual budgets on copies of the
        module, in this pass's form with the rest of the pipeline as rp.jit runs it, and
        measure each plan's peak (`estimate_memory`'s xla model; of the split form, its
        larger half; the lowest of `compiled_forms`, as rp.jit runs the smallest) and its
        recompute cost (clones and roundings, as `rp.recompute_seconds` counts them);
        where the plan for the budget
        peaks above a larger budget's, `monotone_peak` names the plan kept instead (of a
        larger budget or of a smaller one, as the rule says)."""
        from remat_passes.policy.auto import auto
        def candidate(rb, ties="none"):
            return auto(rb, offload=policy.offload, device=policy.device,
                        solver=policy.solver, monotone=False, ties=ties)

        planned = self._within_range(policy, candidate(0), module_op, state)
        if planned is None:
            return policy
        problem, lo, hi, budget = planned
        # (the budgets below this one are planned only where rule 'smaller' needs them)
        self._solve_ahead(problem, state, [budget] + [
            g for g in monotone_grid(lo, hi) if g > budget], policy.solver)

        memo = trials.key(module_op, self.partial_eval_options(), state.region_policies,
                          _is_loop_body(state, self.func), policy)

        # the plan for the budget itself as ties=peak would choose it
        own = "none"
        if _weighs_ties(policy):
            plain = candidate(budget, "peak")
            own = getattr(self._equal_cost_peak(plain, module_op, state), "ties", "none")
            own = "none" if own == "peak" else own

        def trial(rb):
            ties = own if rb == budget else "none"
            return trials.remembered(memo, f"monotone, ties={ties}", rb, lambda: self._weigh(
                candidate(rb, ties), rb, module_op, state))
        m = monotone_peak(budget, lo, hi, trial, policy.monotone)
        if not m.rises:
            if own == "none":
                return policy
            chosen = candidate(budget, own)
            chosen.spec = policy.spec
            return chosen
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
        over = f" ({m.chosen.kept - budget} B over the budget)" \
            if m.chosen.kept > budget else ""
        state.remarks.append(
            f"@{self.func}: {policy.spec}: {above}; planned at residual budget "
            f"{m.chosen.budget} B instead: {m.chosen.kept} B kept{over}, a peak of "
            f"{m.chosen.peak} B, recomputation {format_cost(profile, m.own.cost)} -> "
            f"{format_cost(profile, m.chosen.cost)} "
            f"on {profile.name} (of {m.trials} plans tried)")
        return chosen

    def _weigh(self, candidate, rb: int, module_op, state) -> Trial:
        """The trial plan of `candidate` (planned at residual budget `rb`) on a copy of the
        module, in this pass's form with the rest of the pipeline as rp.jit runs it: its
        peak (`estimate_memory`'s xla model; of the split form, its larger half; the lowest
        of `compiled_forms`, as rp.jit runs the smallest) and its recompute cost (clones and
        roundings, as `rp.recompute_seconds` counts them)."""
        from remat_passes.cost import flops
        from remat_passes.cost.devices import recomputation_seconds, roundings_in
        from remat_passes.cost.memory import estimate_memory
        from remat_passes.cost.xla_schedule import compiled_forms
        names = [self.func] if self.mode == "joint" else \
            [f"{self.func}_fwd", f"{self.func}_bwd"]
        forms = compiled_forms(self.mode)

        def made_with(copy, st, tie, groups, fwd=None):
            # (`fwd`: the forward half's peak, one for all forms: they differ in the
            # backward's barriers only)
            with copy.context:
                def funcs():
                    return [graph.find_func(copy, name).operation for name in names]
                before = roundings_in(funcs())
                cost = None
                for step in self._rest_of_pipeline(groups=groups, tie=tie):
                    if isinstance(step, StripCheckpointNames):
                        # (priced before it drops the clones' marks, which the price reads)
                        cost = recomputation_seconds(funcs(), candidate.profile,
                                                     flops.CostModel(copy), before)
                    step.apply(copy, st)
                    st.drop()
            measured = names[1:] if fwd is not None and len(names) > 1 else names
            estimate = estimate_memory(copy, measured, dim_symbols=st.dim_symbols,
                                       model="xla")
            peaks = {names[0]: fwd, **{n: estimate[n].peak_bytes for n in measured}}
            return Trial(rb, report.activation_bytes(st.residuals[self.func]),
                         max(peaks.values()), cost), peaks[names[0]]

        copy, st = self._trial(candidate, module_op, state, [], mode=self.mode)
        copies = [(copy, st)] + [(mlir.clone(copy), st.fork()) for _ in forms[1:]]
        tried, fwd = [], None
        for (c, s), form in zip(copies, forms):
            trial, fwd = made_with(c, s, *form, fwd=fwd)
            tried.append(trial)
        return min(tried, key=lambda t: t.peak)

    def _by_compiled_cost(self, policy, module_op, state):
        """auto(score=xla): plan each candidate (`by_compiled_cost` names them) on a copy of
        the module in split form with the rest of the default pipeline, compile its two
        halves with XLA and keep the one with the fewest FLOPs in XLA's count. In a function
        with loops, the count is `remat_passes.flops` of the same programs instead: XLA's
        cost analysis counts a loop body once whatever its trip count."""
        from remat_passes.cost import flops
        from remat_passes.passes.annotate_host_offload import AnnotateHostOffload
        from remat_passes.passes.fold_dot_transposes import FoldDotTransposes
        from remat_passes.passes.insert_reduce_precision import InsertReducePrecision
        from remat_passes.passes.place_optimization_barriers import PlaceOptimizationBarriers
        from remat_passes.passes.segment_scans import SegmentScans
        from remat_passes.planner.report import format_flop
        self._can_compile(policy, state, state.compiled_cost)
        halves = (f"{self.func}_fwd", f"{self.func}_bwd")
        backend = []
        with module_op.context:
            loops = any(op.operation.name == "stablehlo.while" for op in graph.nested_ops(
                graph.body_block(graph.find_func(module_op, self.func))))

        compiled: dict = {}      # the program's text -> its count (candidates may coincide)

        def trial(candidate):
            copy, st = self._trial(candidate, module_op, state, [
                InsertReducePrecision(func=self.func, region_regex=self.region_regex,
                                      round_exact=self.round_exact),
                SegmentScans(func=self.func), PlaceOptimizationBarriers(func=self.func),
                AnnotateHostOffload(func=self.func), StripCheckpointNames(),
                FoldDotTransposes(func=self.func)], mode="split")
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
                             solver=policy.solver, monotone=False, ties="none")
            _, st = self._trial(candidate, module_op, state,
                                [SegmentScans(segments=levels, func=self.func)])
            kept = report.activation_bytes(st.residuals[self.func],
                                           st.segmented.get(self.func, []))
            return kept, st.plan_reports[self.func][0].solution.cost, rb, candidate
        least = {}                          # levels -> the least its trials keep
        for levels in ("sqrt", "cbrt"):
            tried = [trial(int(lo + (hi - lo) * k / 12), levels) for k in range(13)]
            least[levels] = min(t[0] for t in tried)
            fitting = [t for t in tried if t[0] <= budget]
            if fitting:
                break
            if min(least.values()) >= lo:   # segments do not help this function (a short loop)
                raise BudgetBelowMinimum(
                    f"error: {policy.spec}: the budget, {budget} B of activations, is below the "
                    f"minimum this function can keep, {lo} B (its scan loops keep their carry for "
                    "every iteration, beside outputs of side-effecting ops and values nothing "
                    "may recompute; the function's arguments are not counted), and its scans in "
                    f"segments keep no less ({least[levels]} B with "
                    f"{'two' if levels == 'sqrt' else 'three'} levels); without remat it keeps "
                    f"{hi} B", policy, budget, lo, hi)
        else:       # (the least of either: three levels can keep more than two for a short loop)
            best = min(least, key=least.get)
            raise RematError(
                f"error: {policy.spec}: the budget, {budget} B of activations, is below the "
                f"least this function can keep with its scans in segments "
                f"({'two' if best == 'sqrt' else 'three'} levels), {least[best]} B "
                f"(per iteration: {lo} B; without remat {hi} B)")
        kept, _, rb, candidate = min(fitting, key=lambda t: (t[1], t[0]))
        candidate.spec = f"{policy.spec} (residual budget {rb} B, scans in segments)"
        state.planned_segments[self.func] = levels
        state.remarks.append(
            f"@{self.func}: {policy.spec}: the budget is below the least a per-iteration plan "
            f"keeps ({lo} B), so the scans run in segments "
            f"({'two' if levels == 'sqrt' else 'three'} levels): {kept} B of activations "
            "after segmenting")
        return candidate


def planning_problem(module, func: str = "main", policy=None, scope_re=None,
                     region_policies=None, region_policy=None, round_exact: bool = True):
    """The planning problem `auto` as the module policy solves for `func` of a copy of
    `module` (an ir.Module or a Module; inlined), for the solvers, `bounds` and benchmarks
    to work on directly. As in remat-partial-eval, the ops inside checkpoint regions (and
    scopes `scope_re` makes, under `region_policy`) keep their region's own verdicts:
    saved where the backward needs them, or recomputed from what their region saves;
    they are not the plan's to recompute. `region_policies`: the Python policies of
    regions (a Module's own, where `module` is one). `round_exact` as remat-partial-eval's:
    False prices no rounding of an f32/f64 residual (rp.jit's choice on XLA:CPU)."""
    policy = policy or AutoPolicy(0)
    if region_policies is None:
        region_policies = getattr(module, "region_policies", {})
    copy = mlir.clone(getattr(module, "op", module))
    state = PassState()
    with copy.context:
        Inline().apply(copy, state)
        state.drop()
        a = state.analysis(graph.find_func(copy, func))
        kept = {}
        for rule in new_rules().values():
            kept.update(rule.kept_whole(a))
        policies = ScopePolicies(policy, recorded_scope_policies(copy, region_policies),
                                 region_policy)
        fixed = fixed_verdicts(a, policies, scope_re)
        p, _ = build_problem(a, scope_re, set(kept), policy.profile, policy.offload is not None,
                             Governed(fixed), round_exact=round_exact)
    p.module = copy      # the ops and values it names live in this copy (an ir.Module)
    return p


def _is_loop_body(state, func: str) -> bool:
    """Is `func` a loop body outline-loop-backwards made a function of?"""
    return any(func in bodies for bodies in state.loop_bodies.values())


def _weighs_ties(policy) -> bool:
    """Does `policy` weigh equal-cost plans by their peaks (`_equal_cost_peak`)? auto's
    default (ties=peak) with objective=residuals and score=model, no offload (its cost is
    the host link's) and a solver of ours that proves its plan. With monotone, the plan
    for the budget itself is the one weighed (`_monotone_peak`)."""
    return (policy.ties == "peak" and policy.objective == "residuals"
            and policy.score == "model" and policy.offload is None
            and not callable(policy.solver) and policy.solver != "lagrangian")


def format_cost(profile, seconds: float) -> str:
    """A plan's recompute cost as its remarks give it: FLOPs on the `flops` profile."""
    from remat_passes.planner.report import format_flop, format_seconds
    return (format_flop if profile.name == "flops" else format_seconds)(seconds)
