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

from array import array

from remat_passes.analysis.function import FunctionAnalysis
from remat_passes.analysis.scan_pairs import inside
from remat_passes.ir import contract, graph
from remat_passes.ir.mlir import func, ir
from remat_passes.sharding import gspmd, sdy


def split_function(plan, edit, residual_vids: list[int], descriptions: list[str],
                   layouts: dict | None = None) -> tuple:
    """Split the function `materialize(plan)` left (its `edit`); returns the new functions
    (`<f>_fwd`, `<f>_bwd`). `layouts`: {vid: gspmd.residual_layout} of residuals inside
    GSPMD manual regions (they cross as global values)."""
    layouts = layouts or {}
    a = plan.analysis
    residuals = [a.value(vid) for vid in residual_vids]
    f = a.func_op
    name = a.name
    term = a.terminator
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
        crossing = [layouts[vid][1] if vid in layouts else v.type
                    for vid, v in zip(residual_vids, residuals)]
        fwd = _empty_func(f"{name}_fwd", [v.type for v in primal_args],
                          [v.type for v in fwd_results] + crossing,
                          [v.location for v in primal_args], ip)
        bwd = _empty_func(f"{name}_bwd", crossing + [v.type for v in cot_args],
                          [v.type for v in bwd_results],
                          [ir.Location.name(f"residual{i}") for i in range(len(residuals))]
                          + [v.location for v in cot_args], ip)
        fwd_block, bwd_block = graph.body_block(fwd), graph.body_block(bwd)
        fwd_ret = func.ReturnOp(fwd_results + residuals, ip=ir.InsertionPoint(fwd_block))
        bwd_ret = func.ReturnOp(bwd_results, ip=ir.InsertionPoint(bwd_block))
        for op, backward in zip(edit.ops, edit.side):
            op.move_before(bwd_ret if backward else fwd_ret)
        # Residuals: their uses in <f>_bwd read the new arguments (a per-device value of
        # a GSPMD shard_map leaves <f>_fwd as a global one and comes back per device).
        for k, (vid, v, arg) in enumerate(zip(residual_vids, residuals, bwd_block.arguments)):
            uses = [u for u in v.uses
                    if u.owner == bwd_ret.operation or inside(u.owner, bwd)]
            if vid in layouts:
                first = next(iter(bwd_block.operations)).operation
                arg = gspmd.enter_region(arg, v.type, layouts[vid], ir.InsertionPoint(first),
                                         ir.Location.unknown())
                fwd_ret.operands[len(fwd_results) + k] = gspmd.leave_region(
                    v, layouts[vid], ir.InsertionPoint(fwd_ret), ir.Location.unknown())
            for use in uses:
                use.owner.operands[use.operand_number] = arg
        for v, arg in zip(cot_args, bwd_block.arguments[len(residuals):]):
            v.replace_all_uses_with(arg)
        for v, arg in zip(primal_args, fwd_block.arguments):
            v.replace_all_uses_with(arg)
        contract.set_all_entries(fwd, "arg_attrs", [
            arg_entries[i] for i in range(len(args)) if i not in a.cotangent_vids])
        shardings = [{"mhlo.sharding": ir.StringAttr.get(layouts[vid][2])} if vid in layouts
                     else _declared_sharding(v, arg_entries)
                     for vid, v in zip(residual_vids, residuals)]
        contract.set_all_entries(fwd, "res_attrs", [
            res_entries[i] for i, b in enumerate(flags) if not b] + [
            dict(contract.residual_entry(d, o), **sh)
            for d, o, sh in zip(descriptions, offloads, shardings)])
        contract.set_all_entries(bwd, "arg_attrs", [
            dict({} if o is None else {contract.OFFLOAD: contract.offload_attr(o)}, **sh)
            for o, sh in zip(offloads, shardings)]
            + [dict(arg_entries[i], **{contract.COTANGENT: ir.UnitAttr.get()})
               for i in range(len(args)) if i in a.cotangent_vids])
        contract.set_all_entries(bwd, "res_attrs", [
            res_entries[i] for i, b in enumerate(flags) if b])
    f.operation.erase()
    return fwd, bwd


def half_analyses(a, edit, residual_vids: list[int], fwd, bwd) -> tuple:
    """The analyses of `<f>_fwd` and `<f>_bwd` from the `materialize.Edit` of the joint
    function `a` described (ops keep their ids when they move): each half's ops in the
    joint order, their reads renumbered (`<f>_fwd`'s arguments are the primal ones;
    `<f>_bwd`'s the residuals, then the cotangents). The backward flags are found by
    the rule, as for a fresh analysis. (None, None) where a read has no place in its half
    (not expected: the split would not verify)."""
    nres = len(residual_vids)
    nvalues = a.nargs + sum(edit.counts)    # (the joint function's, clones included)
    maps = (array("q", [-1]) * nvalues, array("q", [-1]) * nvalues)
    primal = [i for i in range(a.nargs) if i not in a.cotangent_vids]
    cotangent = [i for i in range(a.nargs) if i in a.cotangent_vids]
    for k, i in enumerate(primal):
        maps[0][i] = k
    for k, vid in enumerate(residual_vids):
        maps[1][edit.new_vid[vid]] = k
    for k, i in enumerate(cotangent):
        maps[1][i] = nres + k
    parts = [([], array("q"), array("q"), array("q", [0]), array("q")) for _ in range(2)]
    counts = [len(primal), nres + len(cotangent)]
    starts, flat = edit.reads
    vid = a.nargs
    for pos, op in enumerate(edit.ops):
        half = edit.side[pos]
        new = maps[half]
        ops, ids, sizes, half_starts, half_flat = parts[half]
        half_flat.extend(map(new.__getitem__, flat[starts[pos]:starts[pos + 1]]))
        half_starts.append(len(half_flat))
        ops.append(op)
        ids.append(edit.ids[pos])
        k = edit.counts[pos]
        sizes.append(k)
        new[vid:vid + k] = array("q", range(counts[half], counts[half] + k))
        counts[half] += k
        vid += k
    if any(len(p[4]) and min(p[4]) < 0 for p in parts):
        return None, None
    return tuple(
        FunctionAnalysis.from_parts(g, ops, graph.terminator(graph.body_block(g)),
                                    ids, sizes, (half_starts, half_flat))
        for g, (ops, ids, sizes, half_starts, half_flat) in zip((fwd, bwd), parts))


def drop_passthrough(module_op, n_out: int) -> dict:
    """Residuals that `main_fwd` of the split module `module_op` returns as it got them
    (arguments the backward reads): take them out of its results, so that XLA does not copy
    them into new buffers, and the caller gives the backward its own arrays instead (rp.jit
    does). Returns {residual index: argument index}."""
    with module_op.context, ir.Location.unknown():
        fwd = graph.find_func(module_op, "main_fwd")
        block = graph.body_block(fwd)
        ret = graph.terminator(block)
        values = list(ret.operands)
        passthrough, keep = {}, []
        for i, v in enumerate(values):
            if i >= n_out and isinstance(v, ir.BlockArgument) and v.owner == block:
                passthrough[i - n_out] = v.arg_number
            else:
                keep.append(i)
        if not passthrough:
            return {}
        entries = contract.all_entries(fwd, "res_attrs")
        func.ReturnOp([values[i] for i in keep], ip=ir.InsertionPoint(ret))
        ret.erase()
        graph.retype(fwd)
        contract.set_all_entries(fwd, "res_attrs", [entries[i] for i in keep])
    return passthrough


def _declared_sharding(v, arg_entries) -> dict:
    """The sharding a residual's producer declares, as a result/argument attribute entry:
    an argument's own, a manual computation's `out_shardings`, a Shardy op's `sdy.sharding`
    (a sharding constraint's `sharding`), or a GSPMD `@Sharding` custom call's; {} if none."""
    if isinstance(v, ir.BlockArgument):
        entry = arg_entries[v.arg_number]
        return {k: entry[k] for k in ("sdy.sharding", "mhlo.sharding") if k in entry}
    op = v.owner.operation
    attrs = op.attributes
    if op.name == graph.MANUAL_COMPUTATION:
        return {"sdy.sharding": sdy.shardings(op, "out_shardings")[
            v.result_number]}
    if op.name == "sdy.sharding_constraint" and "sharding" in attrs:
        return {"sdy.sharding": attrs["sharding"]}
    if "sdy.sharding" in attrs:
        per_value = sdy.per_value_shardings(attrs["sdy.sharding"])
        return {"sdy.sharding": per_value[v.result_number]}
    if graph.custom_call_target(op) == gspmd.SHARDING and "mhlo.sharding" in attrs:
        return {"mhlo.sharding": attrs["mhlo.sharding"]}
    return {}


def _empty_func(name, arg_types, result_types, locs, ip):
    ftype = ir.FunctionType.get(arg_types, result_types)
    new = func.FuncOp(name, ftype, ip=ip)
    new.add_entry_block(arg_locs=locs)
    return new
