"""Static memory figures: the joint-form peak of a VJP with and without remat policies.

For an 8-layer MLP and a transformer block (`models.mlp_model`,
`models.transformer_model`), each policy in joint and split form, by
`rp.estimate_memory` (program order, no buffer reuse, device
bytes: how memory is judged on CPU, where XLA undoes recomputation inside one
program):

* joint peak: the peak of live bytes of @main;
* split: the peaks of @main_fwd and @main_bwd and the residual bytes @main_fwd
  returns (what is kept between the two calls);
* the "early" row: the same recomputation as the first policy row, moved to the
  start of the backward (what just-in-time placement avoids).

Results: `results/memory.json`.
"""
from __future__ import annotations

import remat_passes as rp
from remat_passes.analysis.function import FunctionAnalysis
from remat_passes.cost.memory import estimate_memory
from remat_passes.ir import contract, graph
from remat_passes.policy.policies import as_policy
from tools.benchmarks import common
from tools.benchmarks.models import mlp_model, transformer_model


def partial_eval_only(module, policy):
    """remat-partial-eval alone: the recompute clones keep their remat.recompute marks."""
    out = module.clone()
    spec = as_policy(policy).spec
    rp.run_pipeline(out.op, rp.parse_pipeline(
        f"builtin.module(remat-partial-eval{{policy={spec}}})"))
    return out


def early_variant(module, policy):
    """(module, clones moved): remat-partial-eval alone, then every recompute clone moved,
    in order, before the first other backward op (recomputation placed early)."""
    out = partial_eval_only(module, policy)
    a = FunctionAnalysis(graph.find_func(out.op, "main"))
    clones = [op for op in a.ops if contract.is_recompute_clone(op)]
    first = next(op for pos, op in enumerate(a.ops)
                 if a.backward[pos] and not contract.is_recompute_clone(op))
    for op in clones:
        op.move_before(first)
    out.verify()
    return out, len(clones)


def figures(module, policies, note) -> dict:
    rows = []
    for label, policy in policies:
        joint = estimate_memory(rp.remat(module, policy))["main"]
        split = estimate_memory(rp.remat(module, policy, mode="split"))
        rows.append({"policy": label, "joint_peak": joint.peak_bytes,
                     "fwd_peak": split["main_fwd"].peak_bytes,
                     "bwd_peak": split["main_bwd"].peak_bytes,
                     "residuals": split.residual_bytes})
    first = policies[1]
    early = estimate_memory(early_variant(module, first[1])[0])["main"].peak_bytes
    return {"note": note, "rows": rows, "early_policy": first[0], "early_peak": early,
            "arguments": estimate_memory(rp.remat(module, None))["main"].argument_bytes}


def measure() -> dict:
    out = {"machine": common.machine(), "models": {}}
    for name, build in (("8-layer MLP", mlp_model), ("Transformer block", transformer_model)):
        module, policies, note = build()
        out["models"][name] = figures(module, policies, note)
    return out


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f}"


def render(data) -> str:
    parts = ["## Static memory figures", "",
             "The static peak estimate (`rp.estimate_memory`, `remat_passes/cost/memory.py`: "
             "program order, "
             "no buffer reuse, device bytes) of a joint VJP without remat and under several "
             "policies, and of the split halves. The last row of each table moves the first "
             "policy's recomputation to the start of the backward pass: what just-in-time "
             "placement avoids. Regenerate with `python -m tools.benchmarks memory`.", ""]
    for name, m in data["models"].items():
        base = m["rows"][0]["joint_peak"]
        parts += [f"**{name}** ({m['note']}); arguments {_mib(m['arguments'])} MiB; "
                  "all figures MiB", "",
                  "| policy | joint peak | vs. no remat | split fwd peak | split bwd peak | "
                  "residuals |", "|---|---:|---:|---:|---:|---:|"]
        for r in m["rows"]:
            jp = r["joint_peak"]
            delta = "" if jp == base else f"{(jp - base) / 2**20:+.2f}"
            parts.append(f"| {r['policy']} | {_mib(jp)} | {delta} | {_mib(r['fwd_peak'])} | "
                         f"{_mib(r['bwd_peak'])} | {_mib(r['residuals'])} |")
        parts += [f"| {m['early_policy']}, recomputation placed early | {_mib(m['early_peak'])} "
                  f"| {(m['early_peak'] - base) / 2**20:+.2f} | | | |", ""]
    return "\n".join(parts) + "\n"
