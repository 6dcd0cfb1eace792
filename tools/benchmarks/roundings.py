"""What insert-reduce-precision's roundings of exact types cost in XLA:CPU's compiled count.

Rounding an f32 or f64 residual to its own type changes no value (XLA computes these types
in their own precision), yet where the value is an elementwise result the forward also reads,
XLA:CPU computes it once in the fusion that rounds it for the residual and again inside
each fusion that reads it. This probe takes the budgets page's stored results
(`results/budgets.json`) and, at each budget where `auto`'s plan compiled to more FLOPs than
the fixed policy with the fewest within that budget, compiles both plans' split forms
twice: as the pipeline makes them, and with the roundings of exact types taken out
(`without_exact_roundings`), and prints XLA's counts side by side.

    python -m tools.benchmarks.roundings [--models decoder,gpt,...]

A probe for deciding what to change, not a page: it prints a table and writes nothing.
It compiles with XLA's flags as they are, as the budgets page does.
"""
from __future__ import annotations

import argparse


def without_exact_roundings(split) -> int:
    """Take the reduce_precision ops of f32 and f64 values out of both halves of `split`
    (their uses read the unrounded value: the same values); returns how many."""
    from jaxlib.mlir import ir

    from remat_passes.ir import contract, graph
    found = []

    def visit(op):
        if op.name == "stablehlo.reduce_precision" and \
                contract.rounding_is_identity(op.results[0].type):
            found.append(op)
        return ir.WalkResult.ADVANCE
    with split.op.context:
        for name in ("main_fwd", "main_bwd"):
            graph.find_func(split.op, name).operation.walk(visit)
        for op in found:
            op.results[0].replace_all_uses_with(op.operands[0])
            op.erase()
    return len(found)


def probe(keys, log=print) -> list[dict]:
    import remat_passes as rp
    from remat_passes.policy.auto import auto
    from tools.benchmarks import common
    from tools.benchmarks.budgets import DEVICE, LEVELS, PAGE_MODELS
    from tools.benchmarks.cases import cases_for
    from tools.benchmarks.measure import run_split_form
    from tools.benchmarks.models import _identity
    import jax
    stored = common.read_json("budgets")
    rows = []
    for key in keys:
        data = stored["models"].get(key)
        if data is None:
            log(f"{key}: not in results/budgets.json")
            continue
        fixed = {f["short"]: f for f in data["fixed"]}
        above = [r for r in data["at_fixed"] if not r["offload"] and "error" not in r["auto"]
                 and r["auto"]["cost"] > fixed[r["cheapest_compiled"]]["cost"]]
        if not above:
            continue
        model = PAGE_MODELS[key]()
        module = rp.export_vjp(model.build(_identity), *model.args)
        ref = jax.jit(jax.grad(model.build(_identity), argnums=(0, 1), allow_int=True))(
            *model.args)

        def compiled_cost(split) -> float:
            """XLA's compiled count of both halves (`run_split_form`), the gradients
            checked: taking the roundings out must change none."""
            cost, err = run_split_form(model, split, ref)
            if err > 1e-4:
                raise AssertionError(f"{key}: gradient error {err:.1e}")
            return cost
        policies = {c.short: c.our_policy for c in cases_for(model)}
        for r in above:
            row = {"model": key, "budget": r["short"], "fixed_policy": r["cheapest_compiled"]}
            for who, policy in (("auto", auto(r["budget"], device=DEVICE)),
                                ("fixed", policies[r["cheapest_compiled"]])):
                split = rp.remat(module, policy, mode="split", levels=LEVELS)
                row[who] = compiled_cost(split)
                row[f"{who}_roundings"] = without_exact_roundings(split)
                row[f"{who}_without"] = compiled_cost(split)
            log(f"{key} at {r['short']}: auto {row['auto']:,.0f} / {row['auto_without']:,.0f}, "
                f"{row['fixed_policy']} {row['fixed']:,.0f} / {row['fixed_without']:,.0f}")
            rows.append(row)
    return rows


def table(rows) -> str:
    lines = ["| model | at the budget of | auto: with roundings / without (roundings) | "
             "fewest fixed: with / without (roundings) |", "|---|---|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['budget']} | {r['auto']:,.0f} / {r['auto_without']:,.0f} "
            f"({r['auto_roundings']}) | {r['fixed_policy']} {r['fixed']:,.0f} / "
            f"{r['fixed_without']:,.0f} ({r['fixed_roundings']}) |")
    return "\n".join(lines)


def main(argv=None) -> None:
    from tools.benchmarks.budgets import PAGE_MODELS
    ap = argparse.ArgumentParser(prog="python -m tools.benchmarks.roundings")
    ap.add_argument("--models", default=",".join(PAGE_MODELS),
                    help=f"comma-separated subset of {','.join(PAGE_MODELS)}")
    args = ap.parse_args(argv)
    keys = [k.strip() for k in args.models.split(",") if k.strip()]
    unknown = [k for k in keys if k not in PAGE_MODELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {', '.join(PAGE_MODELS)}")
    print(table(probe(keys)))


if __name__ == "__main__":
    main()
