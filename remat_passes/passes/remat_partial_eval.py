"""remat-partial-eval: decide which forward values are saved and recompute the rest.

The StableHLO analog of JAX's `partial_eval_jaxpr_custom` + `remat_partial_eval`
(`jax/_src/ad_checkpoint.py`). Input: one joint forward+backward function.
Backward ops are those that depend on a cotangent (see `graph.backward_ops`);
everything else is forward. A forward value read by a backward op is a
residual candidate:

* function arguments, side-effecting ops and values whose producer the policy
  in force calls Saveable/Offloadable are saved (kept alive into the backward);
* Recompute values are cloned into the backward, recursively from saved values,
  *just in time*: right before the first backward op that needs them;
* constants, iota, other zero-operand pure ops and values computed from
  constants alone are always cloned (free), never saved.

Regions (`remat[N]` name-stack frames made by `remat_passes.checkpoint`, or
scopes matched by `region-regex`) nest like `jax.checkpoint` calls. The policy
in force for an op is that of its outermost region (the module-level policy
outside regions); values flowing into a region are saved. When a region is
recomputed inside the backward, an inner region's policy decides which of its
values that recomputation keeps for the whole outer region and which are
recomputed again just before the inner region's own backward ops. This is
implemented by `_Rewriter.get(value, ctx)`, where `ctx` is the chain of regions
whose backward is being served.

`mode=split` then cuts the rewritten function in two:
`<f>_fwd(primals) -> (outputs..., residuals...)` and
`<f>_bwd(residuals..., cotangents...) -> (gradients...)`.
"""
from __future__ import annotations

import dataclasses
import gc
import re
import sys

from remat_passes import graph, scan
from remat_passes.mlir import RematError, func, ir, op_id
from remat_passes.passes import ModulePass, Option, PassState, parse_int_list
from remat_passes.passes.inline import inline_calls
from remat_passes.policies import (Offloadable, OpInfo, Recompute, Saveable, as_policy,
                                   everything_saveable, nothing_saveable, parse_policy)

REGIONS_ATTR = "remat.regions"      # module attribute: {"remat[3]" = "<policy spec>"}
RESIDUAL_ATTR = graph.RESIDUAL_ATTR
OFFLOAD_ATTR = graph.OFFLOAD_ATTR


@dataclasses.dataclass
class Residual:
    """One saved residual, described the way JAX's saved_residuals does."""
    type: str            # 'f32[5,4]'
    description: str     # 'from the argument W1' / 'output of sin from f.py:3:4 (g)'
    bytes: int
    offload: Offloadable | None = None

    def __str__(self):
        return f"{self.type} {self.description}"


def _parse_mode(text):
    if text not in ("joint", "split"):
        raise ValueError(f"expected joint or split, got '{text}'")
    return text


def _parse_regex(text):
    try:
        return re.compile(text)
    except re.error as e:
        raise ValueError(f"invalid regex '{text}': {e}") from None


class RematPartialEval(ModulePass):
    name = "remat-partial-eval"
    summary = ("Save or recompute forward values of a joint VJP function per a checkpoint "
               "policy; recomputation placed just in time")
    options = (
        Option("policy", parse_policy, None,
               "policy outside checkpoint regions, e.g. dots_saveable or "
               "save_only_these_names(a,b) (default: save everything, like JAX without "
               "jax.checkpoint)"),
        Option("mode", _parse_mode, "joint",
               "joint: one function; split: <f>_fwd and <f>_bwd with explicit residuals"),
        Option("cotangent-args", parse_int_list, None,
               "indices of the cotangent arguments (default: arguments marked "
               "remat.cotangent, else JAX transpose name stacks)"),
        Option("func", str, "main", "the joint function to rewrite"),
        Option("region-regex", _parse_regex, None,
               "turn name-stack scopes matching this regex into checkpoint regions"),
        Option("region-policy", parse_policy, nothing_saveable,
               "policy of the regions made by region-regex"),
    )

    def run(self, module, options, state: PassState):
        rw = _Rewriter(module, options, state)
        state.residuals[options["func"]] = rw.run()


def _common_prefix(a: tuple, b: tuple) -> tuple:
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return a[:n]


def op_info(op, with_attributes: bool = True) -> OpInfo:
    """What a policy sees of `op`. Printing every attribute is slow, so built-in
    policies (which never read them) get an empty dict."""
    op = op.operation
    attrs = {name: str(op.attributes[name]) for name in op.attributes} if with_attributes else {}
    dims = {}
    if op.name == "stablehlo.dot_general" and "dot_dimension_numbers" in op.attributes:
        text = str(op.attributes["dot_dimension_numbers"])
        for key in ("lhs_batching", "rhs_batching", "lhs_contracting", "rhs_contracting"):
            m = re.search(key + r"_dimensions = \[([^\]]*)\]", text)
            dims[key + "_dims"] = tuple(int(x) for x in m.group(1).split(",")) if m else ()
    elif op.name == "stablehlo.dot":
        dims = {"lhs_contracting_dims": (1,), "rhs_contracting_dims": (0,)}
    return OpInfo(name=op.name,
                  operand_types=[str(v.type) for v in op.operands],
                  result_types=[str(r.type) for r in op.results],
                  attributes=attrs,
                  checkpoint_name=graph.marker_name(op),
                  primitive=graph.jax_primitive(op),
                  **dims)


def describe_value(value, func_op) -> str:
    """JAX's words for where a residual comes from."""
    if isinstance(value, ir.BlockArgument):
        return f"from the argument {graph.arg_name(func_op, value.arg_number)}"
    op = value.owner
    pos, fn = graph.source_position(op)
    where = f" from {pos}" if pos else ""
    where += f" ({fn})" if fn else ""
    if op.name == scan.WHILE:
        inner = scan.stacked_value(op, value.result_number)
        if inner is not None:
            what = ("the carry-in" if isinstance(inner, ir.BlockArgument)
                    else describe_value(inner, func_op))
            return f"{what} of each iteration, stacked by the scan loop{where}"
    name = graph.marker_name(op)
    if name is not None:
        return f"named '{name}'{where}"
    return f"output of {graph.jax_primitive(op)}{where}"


class _Rewriter:
    def __init__(self, module, options, state: PassState):
        self.module = module
        self.func_name = options["func"]
        self.mode = options["mode"]
        self.policy = as_policy(options["policy"]) if options["policy"] is not None else None
        self.scope_re = options["region-regex"]
        self.region_policy = options["region-policy"]
        self.cotangent_indices = options["cotangent-args"]
        self.state = state
        self.region_policies = self._recorded_region_policies()
        self.region_policies.update({k: as_policy(p) for k, p in state.region_policies.items()})

    # ------------------------------------------------------------ set-up --
    def _recorded_region_policies(self) -> dict:
        attrs = self.module.operation.attributes
        if REGIONS_ATTR not in attrs:
            return {}
        d = ir.DictAttr(attrs[REGIONS_ATTR])
        out = {}
        for i in range(len(d)):
            named = d[i]
            spec = ir.StringAttr(named.attr).value
            if spec.startswith("<"):  # a Python callable policy
                out[named.name] = spec  # must come from state.region_policies
            else:
                out[named.name] = parse_policy(spec)
        return out

    def _policy_of_region(self, region_path: str):
        key = graph.region_key(region_path)
        pol = self.region_policies.get(key)
        if pol is None:
            if graph.REGION_FRAME_RE.fullmatch(key):
                return nothing_saveable  # jax.checkpoint's default
            return self.region_policy
        if isinstance(pol, str):
            raise RematError(
                f"error: region {key} was made with the Python policy {pol}; it is "
                "only available in the process that exported the module (pass the Module "
                "returned by export_vjp, not a reloaded copy)")
        return pol

    # --------------------------------------------------------------- run --
    def run(self) -> list[Residual]:
        graph.find_func(self.module, self.func_name)  # a clear error before any rewrite
        inline_calls(self.module)                     # func.call is inlined first
        self.func_op = graph.find_func(self.module, self.func_name)
        block = self.block = graph.body_block(self.func_op)
        self.verdict_cache: dict = {}
        self.group = 0
        self.loop_stats = scan.rewrite_pairs(block, self._loop_verdict, self._mark_loop_clone,
                                             self._next_group)
        self.scan_loops = {op_id(p.fwd.op) for p in scan.find_pairs(block)}
        self.backward, _ = graph.backward_ops(self.func_op, self.cotangent_indices)
        if self.cotangent_indices is None:
            self.cotangent_indices = [
                i for i in range(len(block.arguments))
                if graph.COTANGENT_ATTR in graph.arg_attr_names(self.func_op, i)]
        self.cotangent_args = {block.arguments[i] for i in self.cotangent_indices}
        with self.module.context:  # later passes find the cotangents the same way
            for i in self.cotangent_indices:
                graph.set_attr_entry(self.func_op, "arg_attrs", i, graph.COTANGENT_ATTR,
                                     ir.UnitAttr.get())
        ops = [op.operation for op in block.operations]
        self.terminator = ops[-1]
        # Ops are keyed by op_id (their hash changes when an operand is replaced);
        # Values hash by pointer and are used as keys directly.
        ids = [op_id(op) for op in ops]
        self.chain = {i: graph.region_chain(op, self.scope_re) for i, op in zip(ids, ops)}
        self.fwd_consumers: dict = {i: [] for i in ids}
        for i, op in zip(ids[:-1], ops[:-1]):
            if i in self.backward:
                continue
            for v in graph.read_values(op):
                if isinstance(v, ir.OpResult):
                    self.fwd_consumers[op_id(v.owner)].append(i)
        # Values computed from constants alone are recomputed for free, like constants.
        self.free: set = set()
        for i, op in zip(ids[:-1], ops[:-1]):
            if i not in self.backward and self._reshapes_arg_for_loops(op):
                self.free.add(i)   # an unrolled scan's view of an argument: never a copy
                continue
            if i not in self.backward and not graph.is_side_effecting(op) and all(
                    isinstance(v, ir.OpResult) and op_id(v.owner) in self.free
                    for v in graph.read_values(op)):
                self.free.add(i)
        self.clones: dict = {}
        self.saved: dict = {}     # Value -> Offloadable or None (an ordered set)
        self.recomputed: set = set()
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 10 * len(ops) + 1000))
        gc_was_enabled = gc.isenabled()
        gc.disable()  # many small long-lived objects: full collections cost more than the pass
        try:
            for i, op in zip(ids, ops):
                if i in self.backward:
                    self.group += 1
                    self._serve(op, self.chain[i])
            bwd_flags = self._serve_split_results() if self.mode == "split" else None
        finally:
            sys.setrecursionlimit(limit)
            if gc_was_enabled:
                gc.enable()
        self._dce()
        residuals = self._residual_list()
        loops = sum(1 for op in self.block.operations if op.operation.name == "stablehlo.while"
                    and not self._is_backward(op.operation)
                    and op_id(op) not in self.scan_loops)
        if loops:
            self.state.remarks.append(
                f"@{self.func_name}: {loops} forward stablehlo.while loop(s) are not scan "
                "loops with a matching backward loop; each is treated as one atomic op: "
                "saved or recomputed whole")
        if self.mode == "split":
            self._split(bwd_flags)
        return residuals

    @staticmethod
    def _reshapes_arg_for_loops(op) -> bool:
        """A reshape of a function argument that only while loops read (how an unrolled
        scan views its scanned-over arrays as [N/k, k, ...] blocks)."""
        return (op.name == "stablehlo.reshape" and isinstance(op.operands[0], ir.BlockArgument)
                and all(u.owner.operation.name == scan.WHILE for u in op.results[0].uses))

    def _is_backward(self, op) -> bool:
        return op_id(op) in self.backward or op_id(op) in self.recomputed

    def _serve(self, consumer, ctx):
        """Make every forward value `consumer` reads available right before it."""
        self.insert_before = consumer
        for v in graph.read_values(consumer):
            new = self._get_for(v, ctx)
            if new != v:
                graph.replace_reads(consumer, v, new)

    def _get_for(self, v, consumer_ctx):
        """The value to use for forward value `v` in the backward of regions `consumer_ctx`."""
        if isinstance(v, ir.BlockArgument):
            if v not in self.cotangent_args and v.owner == self.block:
                self.saved.setdefault(v, None)
            return v
        owner = v.owner.operation
        if self._is_backward(owner):
            return v
        return self._get(v, _common_prefix(consumer_ctx, self.chain.get(op_id(owner), ())))

    # ------------------------------------------------- per-iteration remat --
    def _policy_of(self, op):
        """The policy in force for `op`: its outermost region's, else the module's."""
        chain = graph.region_chain(op, self.scope_re)
        if chain:
            return self._policy_of_region(chain[0])
        return self.policy or everything_saveable

    def _loop_verdict(self, value):
        return scan.value_verdict(value, lambda op: self._verdict(self._policy_of(op), op))

    def _next_group(self):
        self.group += 1

    def _mark_loop_clone(self, clone):
        with self.module.context:
            clone.attributes[graph.RECOMPUTE_ATTR] = ir.IntegerAttr.get(
                ir.IntegerType.get_signless(64), self.group)

    # ------------------------------------------------------ the decision --
    def _verdict(self, policy, op):
        key = (id(policy), op_id(op))
        if key not in self.verdict_cache:
            self.verdict_cache[key] = policy.verdict(op_info(op, policy.reads_attributes))
        return self.verdict_cache[key]

    def _saved_top(self, op):
        """The verdict of the forward pass itself for `op`: is its result a residual?"""
        oid = op_id(op)
        chain = self.chain[oid]
        module_policy = self.policy or everything_saveable
        consumers = self.fwd_consumers[oid]
        if not chain:
            if any(self.chain[c] for c in consumers):
                return Saveable  # a region input: jax.checkpoint saves its arguments
            return self._verdict(module_policy, op)
        outer = chain[0]
        if any(self.chain[c] and self.chain[c][0] != outer for c in consumers):
            return Saveable  # the output of one region is the input of another
        if any(not self.chain[c] for c in consumers):
            return self._verdict(module_policy, op)  # a region output, seen from outside
        return self._verdict(self._policy_of_region(outer), op)

    def _saved_for_region(self, op, region):
        """Forward verdict for `op` when the backward of `region` (its outermost) asks.

        The forward pass decides with the region's policy. A value the forward
        keeps anyway (the input of another region, or a region output an outer
        backward already took) is reused rather than recomputed.
        """
        if any(self.chain[c] and self.chain[c][0] != region
               for c in self.fwd_consumers[op_id(op)]):
            return Saveable
        if op.results[0] in self.saved:
            return Saveable
        return self._verdict(self._policy_of_region(region), op)

    def _kept_at(self, op, ctx, depth):
        """In the backward of region ctx[depth-1], which re-runs the forward of region
        ctx[depth], does that re-run keep `op`'s value (inside ctx[depth])?"""
        region_path = ctx[:depth + 1]
        if any(self.chain[c][:depth + 1] != region_path for c in self.fwd_consumers[op_id(op)]):
            return True  # an output of region ctx[depth]: kept by the enclosing re-run
        return self._verdict(self._policy_of_region(ctx[depth]), op) is not Recompute

    def _home(self, op, ctx):
        """Where the value of `op` comes from for a request in the backward of `ctx`:
        (verdict, depth) with depth 0 and a non-Recompute verdict for a residual of
        the forward pass, else the depth of the region backward that recomputes it.

        Levels are searched outermost first: what the forward saves (under the
        outermost region's policy) serves every inner region; what an inner
        region's re-run keeps serves the regions inside it.
        """
        verdict = self._saved_top(op) if not ctx else self._saved_for_region(op, ctx[0])
        if verdict is not Recompute:
            return verdict, 0
        for depth in range(1, len(ctx)):
            if self._kept_at(op, ctx, depth):
                return Recompute, depth
        return Recompute, len(ctx)

    def _get(self, v, ctx):
        op = v.owner.operation
        if graph.is_side_effecting(op):
            self.saved.setdefault(v, None)   # never duplicated
            return v
        oid = op_id(op)
        if oid in self.scan_loops:   # decided per iteration; offload marks are inside
            placement = scan.offloaded(op, v.result_number)
            self.saved[v] = Offloadable(*placement.split(":")) if placement else None
            return v
        if oid not in self.free:
            verdict, depth = self._home(op, ctx)
            if verdict is not Recompute:
                if isinstance(verdict, Offloadable):
                    self.saved[v] = verdict
                else:   # "already saved" must not undo an earlier offload decision
                    self.saved.setdefault(v, None)
                return v
            ctx = ctx[:depth]
        key = (oid, ctx)
        if key not in self.clones:
            self.clones[key] = self._clone(op, ctx)
        return self.clones[key].results[v.result_number]

    def _clone(self, op, ctx):
        reads = graph.read_values(op)
        new_values = [self._get_for(u, ctx) for u in reads]
        clone = op.clone(ip=ir.InsertionPoint(self.insert_before))
        for old, new in zip(reads, new_values):
            if new != old:
                graph.replace_reads(clone, old, new)
        with self.module.context:
            clone.attributes[graph.RECOMPUTE_ATTR] = ir.IntegerAttr.get(
                ir.IntegerType.get_signless(64), self.group)
        self.recomputed.add(op_id(clone))
        return clone

    # ----------------------------------------------------------- results --
    def _residual_list(self) -> list[Residual]:
        values = [a for a in self.block.arguments if a in self.saved]
        for op in self.block.operations:
            values.extend(r for r in op.results if r in self.saved)
        self.residual_values = values
        out = []
        for v in values:
            offload = self.saved[v]
            if offload is not None and not (isinstance(v, ir.OpResult)
                                            and op_id(v.owner) in self.scan_loops):
                with self.module.context:
                    v.owner.attributes[OFFLOAD_ATTR] = ir.StringAttr.get(
                        f"{offload.src}:{offload.dst}")
            out.append(Residual(graph.jax_type_str(v.type), describe_value(v, self.func_op),
                                graph.type_bytes(v.type), offload))
        return out

    def _dce(self):
        """Erase forward ops left without uses (e.g. a cosine only the backward needed)."""
        # One reverse sweep: a dead op's operands are visited after it is gone.
        for op in reversed([o.operation for o in self.block.operations]):
            if any(next(iter(r.uses), None) is not None for r in op.results):
                continue
            if op.name == "func.return" or graph.is_side_effecting(op):
                continue
            op.erase()

    # ------------------------------------------------------------- split --
    def _is_bwd_value(self, v):
        if isinstance(v, ir.BlockArgument):
            return v in self.cotangent_args
        return self._is_backward(v.owner.operation)

    def _serve_split_results(self):
        """Which results belong to <f>_bwd; forward values they need become residuals."""
        term = self.terminator
        flags = [graph.GRADIENT_RESULT_ATTR in graph.result_attr_names(self.func_op, i)
                 or self._is_bwd_value(v) for i, v in enumerate(term.operands)]
        self.group += 1
        self.insert_before = term
        for i, v in enumerate(term.operands):
            if flags[i] and not self._is_bwd_value(v):
                term.operands[i] = self._get_for(v, ())
        return flags

    def _split(self, bwd_flags):
        """Move forward ops into <f>_fwd and backward ops into <f>_bwd, then rewire."""
        f = self.func_op
        name = self.func_name
        term = self.terminator
        ops = [op.operation for op in self.block.operations][:-1]
        primal_args = [a for a in self.block.arguments if a not in self.cotangent_args]
        cot_args = [a for a in self.block.arguments if a in self.cotangent_args]
        results = list(term.operands)
        fwd_results = [v for v, b in zip(results, bwd_flags) if not b]
        bwd_results = [v for v, b in zip(results, bwd_flags) if b]
        residuals = self.residual_values
        descs = [f"{graph.jax_type_str(v.type)} {describe_value(v, f)}" for v in residuals]

        with self.module.context, ir.Location.unknown():
            ip = ir.InsertionPoint(f)
            fwd = self._empty_func(f"{name}_fwd", primal_args, fwd_results + residuals,
                                   [a.location for a in primal_args], ip)
            bwd = self._empty_func(f"{name}_bwd", residuals + cot_args, bwd_results,
                                   [ir.Location.name(f"residual{i}") for i in range(len(residuals))]
                                   + [a.location for a in cot_args], ip)
            fwd_block, bwd_block = graph.body_block(fwd), graph.body_block(bwd)
            fwd_ret = func.ReturnOp(fwd_results + residuals, ip=ir.InsertionPoint(fwd_block))
            bwd_ret = func.ReturnOp(bwd_results, ip=ir.InsertionPoint(bwd_block))
            for op in ops:
                op.move_before(bwd_ret if self._is_backward(op) else fwd_ret)
            # Residuals: their uses in <f>_bwd read the new arguments.
            for v, arg in zip(residuals, bwd_block.arguments):
                for use in list(v.uses):
                    owner = use.owner
                    if owner == bwd_ret.operation or self._inside(owner, bwd):
                        owner.operands[use.operand_number] = arg
            for v, arg in zip(cot_args, bwd_block.arguments[len(residuals):]):
                v.replace_all_uses_with(arg)
            for v, arg in zip(primal_args, fwd_block.arguments):
                v.replace_all_uses_with(arg)
            offloads = [self.saved[v] for v in residuals]

            def offload_attr(o):
                return {} if o is None else {OFFLOAD_ATTR: ir.StringAttr.get(f"{o.src}:{o.dst}")}
            fwd.attributes["res_attrs"] = ir.ArrayAttr.get(
                [ir.DictAttr.get({}) for _ in fwd_results]
                + [ir.DictAttr.get({RESIDUAL_ATTR: ir.StringAttr.get(d), **offload_attr(o)})
                   for d, o in zip(descs, offloads)])
            bwd.attributes["arg_attrs"] = ir.ArrayAttr.get(
                [ir.DictAttr.get(offload_attr(o)) for o in offloads]
                + [ir.DictAttr.get({graph.COTANGENT_ATTR: ir.UnitAttr.get()}) for _ in cot_args])
        f.operation.erase()

    @staticmethod
    def _inside(op, func_op) -> bool:
        """Is `op` (possibly nested in regions) inside `func_op`?"""
        target = op_id(func_op)
        while op is not None:
            if op_id(op) == target:
                return True
            op = op.parent
        return False

    @staticmethod
    def _empty_func(name, args, results, locs, ip):
        ftype = ir.FunctionType.get([a.type for a in args], [r.type for r in results])
        new = func.FuncOp(name, ftype, ip=ip)
        new.add_entry_block(arg_locs=locs)
        return new
