"""The analysis remat-partial-eval hands on to the next passes (`materialize.analysis_after`,
built from the plan's arrays without reading the IR again) equals a fresh
`FunctionAnalysis` of the rewritten function: program order, op ids, value ids, the values
each op reads, the backward set, and what the later passes derive from them."""
from __future__ import annotations

from pathlib import Path

import pytest

import remat_passes as rp
from remat_passes import graph
from remat_passes.analysis import FunctionAnalysis
from remat_passes.mlir import RematError, op_id
from remat_passes.passes import PassState
from tools.benchmarks.families import FAMILIES

LIT = Path(__file__).resolve().parents[1] / "lit"


def _assert_same(kept: FunctionAnalysis, fresh: FunctionAnalysis) -> None:
    assert [op_id(o) for o in kept.ops] == [op_id(o) for o in fresh.ops]
    assert list(kept.result_base) == list(fresh.result_base)
    assert kept.nvalues == fresh.nvalues
    for pos in range(len(fresh.ops)):
        assert list(kept.reads(pos)) == list(fresh.reads(pos)), \
            f"reads of {fresh.ops[pos].name} at {pos}"
    assert kept.backward == fresh.backward
    assert kept.residuals == fresh.residuals
    assert [(op_id(g.consumer), [op_id(o) for o in g.ops]) for g in kept.recompute_groups] \
        == [(op_id(g.consumer), [op_id(o) for o in g.ops]) for g in fresh.recompute_groups]
    for vid in range(fresh.nvalues):
        assert list(kept.users(vid)) == list(fresh.users(vid))


def _check(module, policy) -> bool:
    """Run inline + remat-partial-eval; compare the analysis it kept with a fresh one.
    Returns whether an analysis was kept."""
    module = module.clone()
    state = PassState(region_policies=module.region_policies)
    rp.run_pipeline(module.op, rp.parse_pipeline(
        f"builtin.module(inline,remat-partial-eval{{policy={policy}}})"), state)
    f = graph.find_func(module.op, "main")
    with module.op.context:
        kept = state._analyses.get("main")      # (what the next pass would be given)
        if kept is None:
            return False
        _assert_same(kept[1], FunctionAnalysis(f))
    return True


@pytest.mark.parametrize("policy", ["nothing_saveable", "dots_saveable", "everything_saveable",
                                    "save_only_these_names(layer0,layer2)"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_kept_analysis_equals_a_fresh_one(family, policy):
    f, args = FAMILIES[family](3)
    assert _check(rp.export_vjp(f, *args), policy)


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
        try:
            _check(module, policy)
        except RematError:   # (cases made to fail)
            pass
