"""The analyses remat-partial-eval hands on to the next passes (`materialize.analysis_after`
in joint form, `split.half_analyses` for `<f>_fwd` and `<f>_bwd` in split form, built from
the plan's arrays without reading the IR again) equal a fresh `FunctionAnalysis` of the
rewritten functions: program order, op ids, value ids, the values each op reads, the
backward set, and what the later passes derive from them."""
from __future__ import annotations

from pathlib import Path

import pytest

import remat_passes as rp
from remat_passes.analysis.function import FunctionAnalysis
from remat_passes.ir import graph
from remat_passes.ir.mlir import RematError, op_id
from remat_passes.passes.base import PassState
from tools.benchmarks.families import FAMILIES

LIT = Path(__file__).resolve().parents[1] / "lit"


def _backward(a: FunctionAnalysis):
    try:
        return a.backward
    except RematError as e:    # (a forward half: no cotangents, no transpose frames)
        return str(e)


def _assert_same(kept: FunctionAnalysis, fresh: FunctionAnalysis) -> None:
    assert op_id(kept.terminator) == op_id(fresh.terminator)
    assert [op_id(o) for o in kept.ops] == [op_id(o) for o in fresh.ops]
    assert list(kept.result_base) == list(fresh.result_base)
    assert kept.nvalues == fresh.nvalues
    assert kept.cotangent_indices == fresh.cotangent_indices
    for pos in range(len(fresh.ops)):
        assert list(kept.reads(pos)) == list(fresh.reads(pos)), \
            f"reads of {fresh.ops[pos].name} at {pos}"
    assert _backward(kept) == _backward(fresh)
    if isinstance(_backward(fresh), bytearray):
        assert kept.residuals == fresh.residuals
        assert [(op_id(g.consumer), [op_id(o) for o in g.ops])
                for g in kept.recompute_groups] \
            == [(op_id(g.consumer), [op_id(o) for o in g.ops])
                for g in fresh.recompute_groups]
    assert list(kept.shape_only) == list(fresh.shape_only)
    for vid in range(fresh.nvalues):
        assert list(kept.users(vid)) == list(fresh.users(vid))


def _check(module, policy, mode="joint") -> bool:
    """Run inline + remat-partial-eval; compare the analyses it kept with fresh ones.
    Returns whether every function it made got one."""
    module = module.clone()
    state = PassState(region_policies=module.region_policies)
    rp.run_pipeline(module.op, rp.parse_pipeline(
        f"builtin.module(inline,remat-partial-eval{{policy={policy} mode={mode}}})"), state)
    names = ["main"] if mode == "joint" else ["main_fwd", "main_bwd"]
    with module.op.context:
        for name in names:
            kept = state._analyses.get(name)      # (what the next pass would be given)
            if kept is None:
                return False
            f = graph.find_func(module.op, name)
            assert kept[0] == op_id(f)
            _assert_same(kept[1], FunctionAnalysis(f))
    return True


@pytest.mark.parametrize("policy", ["nothing_saveable", "dots_saveable", "everything_saveable",
                                    "save_only_these_names(layer0,layer2)"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("mode", ["joint", "split"])
def test_kept_analysis_equals_a_fresh_one(family, policy, mode):
    f, args = FAMILIES[family](3)
    assert _check(rp.export_vjp(f, *args), policy, mode)


def _scan_with_a_mask():
    """A scan whose body reads a constant mask: JAX carries it through the loop, and
    sink-loop-constants computes it inside (it changes the loops)."""
    import jax
    import jax.numpy as jnp

    def f(W, x):
        mask = jnp.tril(jnp.ones((4, 4)))

        def body(h, w):
            return jnp.sin((h @ w) * mask[:2]), None
        h, _ = jax.lax.scan(body, x, W)
        return jnp.sum(h)
    return f, (jnp.ones((3, 4, 4)) * 0.1, jnp.ones((2, 4)))


@pytest.mark.parametrize("family", sorted(FAMILIES) + ["scan-with-a-mask"])
@pytest.mark.parametrize("mode", ["joint", "split"])
def test_the_passes_after_remat_partial_eval_rewrite_alike_with_its_analysis(
        family, mode, monkeypatch):
    """Where sink-loop-constants sinks nothing it hands the analyses on (insert-reduce-
    precision before it notes the ops it inserts, which the kept analysis then does not
    list but reads as noted), where it sinks something it drops them: place-optimization-
    barriers and the passes after it rewrite the same text as from a fresh analysis, the
    old way (every analysis dropped there)."""
    from remat_passes.passes import sink_loop_constants
    f, args = _scan_with_a_mask() if family == "scan-with-a-mask" else FAMILIES[family](3)
    module = rp.export_vjp(f, *args)
    options = [dict(), dict(tie_to_cotangent=True, barrier_groups="per-region"),
               dict(tie_to_cotangent=True, fence_chains=True)]
    kept = [str(rp.remat(module, p, mode=mode, **o))
            for p in ("dots_saveable", "nothing_saveable") for o in options]
    apply = sink_loop_constants.SinkLoopConstants.apply

    def dropping(self, module_op, state):
        apply(self, module_op, state)
        state.drop()
    monkeypatch.setattr(sink_loop_constants.SinkLoopConstants, "apply", dropping)
    fresh = [str(rp.remat(module, p, mode=mode, **o))
             for p in ("dots_saveable", "nothing_saveable") for o in options]
    assert kept == fresh


def test_the_remat_pipeline_analyses_a_loop_free_function_once(monkeypatch):
    """One FunctionAnalysis per rp.remat of a function without loops, joint and split: every
    pass after remat-partial-eval reads the one it handed on."""
    from remat_passes.analysis import function
    built = []
    init = function.FunctionAnalysis.__init__

    def counting(self, *a, **k):
        built.append(1)
        init(self, *a, **k)
    monkeypatch.setattr(function.FunctionAnalysis, "__init__", counting)
    f, args = FAMILIES["chain-names"](3)
    module = rp.export_vjp(f, *args)
    for mode in ("joint", "split"):
        built.clear()
        rp.remat(module, "dots_saveable", mode=mode, tie_to_cotangent=True)
        assert len(built) == 1, mode


def _lit_modules():
    for path in sorted(LIT.glob("remat-partial-eval*.mlir")):
        for k, text in enumerate(path.read_text().split("// -----")):
            if "@main" in text and "remat.cotangent" in text:
                yield pytest.param(text, id=f"{path.stem}-{k}")


@pytest.mark.parametrize("text", list(_lit_modules()))
def test_kept_analysis_equals_a_fresh_one_on_the_lit_cases(text):
    """Scans, conds, while loops, shard_maps, regions: whatever the lit cases hold."""
    module = rp.Module.parse(text)
    for policy in ("nothing_saveable", "dots_saveable"):
        for mode in ("joint", "split"):
            try:
                _check(module, policy, mode)
            except RematError:   # (cases made to fail)
                pass
