"""Cut a rewritten joint function in two: `<f>_fwd(primals) -> (outputs, residuals)` and
`<f>_bwd(residuals, cotangents) -> gradients`.

Forward ops move into `<f>_fwd`, backward ops and recompute clones into
`<f>_bwd`; each residual (a saved value of the plan) becomes a result of the
first and an argument of the second, described (`remat.residual`) and, when
offloaded, marked with its placement (`remat.offload`). Results the plan
flagged as backward (gradients, and values computed from cotangents) are
`<f>_bwd`'s, the rest `<f>_fwd`'s. The joint function is erased.
"""
from __future__ import annotations

from remat_passes import contract, graph
from remat_passes.mlir import func, ir
from remat_passes.scan_pairs import inside


def split_function(plan, residual_vids: list[int], descriptions: list[str]) -> None:
    a = plan.analysis
    residuals = [a.value(vid) for vid in residual_vids]
    f = a.func_op
    name = a.name
    term = a.terminator
    ops = [op.operation for op in a.block.operations][:-1]
    args = a.args
    primal_args = [v for i, v in enumerate(args) if i not in a.cotangent_vids]
    cot_args = [v for i, v in enumerate(args) if i in a.cotangent_vids]
    results = list(term.operands)
    flags = plan.split_flags
    fwd_results = [v for v, b in zip(results, flags) if not b]
    bwd_results = [v for v, b in zip(results, flags) if b]
    offloads = [plan.saved[vid] for vid in residual_vids]
    # the joint function's argument and result attributes (jax.result_info labels, marks)
    # go with the arguments and results to whichever half takes them
    arg_entries = contract.all_entries(f, "arg_attrs")
    res_entries = contract.all_entries(f, "res_attrs")
    with f.context, ir.Location.unknown():
        ip = ir.InsertionPoint(f)
        fwd = _empty_func(f"{name}_fwd", primal_args, fwd_results + residuals,
                          [v.location for v in primal_args], ip)
        bwd = _empty_func(f"{name}_bwd", residuals + cot_args, bwd_results,
                          [ir.Location.name(f"residual{i}") for i in range(len(residuals))]
                          + [v.location for v in cot_args], ip)
        fwd_block, bwd_block = graph.body_block(fwd), graph.body_block(bwd)
        fwd_ret = func.ReturnOp(fwd_results + residuals, ip=ir.InsertionPoint(fwd_block))
        bwd_ret = func.ReturnOp(bwd_results, ip=ir.InsertionPoint(bwd_block))
        for op in ops:
            backward = contract.is_recompute_clone(op) or a.is_backward(op)
            op.move_before(bwd_ret if backward else fwd_ret)
        # Residuals: their uses in <f>_bwd read the new arguments.
        for v, arg in zip(residuals, bwd_block.arguments):
            for use in list(v.uses):
                owner = use.owner
                if owner == bwd_ret.operation or inside(owner, bwd):
                    owner.operands[use.operand_number] = arg
        for v, arg in zip(cot_args, bwd_block.arguments[len(residuals):]):
            v.replace_all_uses_with(arg)
        for v, arg in zip(primal_args, fwd_block.arguments):
            v.replace_all_uses_with(arg)
        contract.set_all_entries(fwd, "arg_attrs", [
            arg_entries[i] for i in range(len(args)) if i not in a.cotangent_vids])
        contract.set_all_entries(fwd, "res_attrs", [
            res_entries[i] for i, b in enumerate(flags) if not b] + [
            contract.residual_entry(d, o) for d, o in zip(descriptions, offloads)])
        contract.set_all_entries(bwd, "arg_attrs", [
            {} if o is None else {contract.OFFLOAD: contract.offload_attr(o)} for o in offloads]
            + [dict(arg_entries[i], **{contract.COTANGENT: ir.UnitAttr.get()})
               for i in range(len(args)) if i in a.cotangent_vids])
        contract.set_all_entries(bwd, "res_attrs", [
            res_entries[i] for i, b in enumerate(flags) if b])
    f.operation.erase()


def _empty_func(name, args, results, locs, ip):
    ftype = ir.FunctionType.get([a.type for a in args], [r.type for r in results])
    new = func.FuncOp(name, ftype, ip=ip)
    new.add_entry_block(arg_locs=locs)
    return new
