"""The shape of what remat-partial-eval emits, checked on the output IR.

* ops with side effects are never duplicated (top level or nested in a region);
* recomputation is placed just in time: after the backward ops that do not
  need it, right before the first backward op that does (but a value smaller
  than the clones it is computed from, made where they are: a ReLU mask);
* constants (and values computed from constants alone) are never residuals;
* `func.call`s are inlined, so called functions are remat'd like the caller;
* the pass does not save more than JAX does for the same program.

Forward/backward is recomputed here from the output IR itself (a value is
backward iff it depends on a cotangent argument), not with the pass's helpers.
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from remat_testlib import (LAYERED_ARGS, assert_same_residual_types, assert_trees_close,
                           func_ops, jax_saved_residuals, layered_loss, leaves, parse_text,
                           reference_vjp, run_joint, run_split)

import remat_passes as rp
from remat_passes.ir.mlir import ir as rp_ir

P = rp.policies
JP = jax.checkpoint_policies

POLICIES = [None, P.everything_saveable, P.nothing_saveable, P.dots_saveable,
            P.save_only_these_names("a"), P.offload_dot_with_no_batch_dims("device", "pinned_host"),
            lambda info: False]
POLICY_IDS = ["none", "everything", "nothing", "dots", "only_a", "offload", "callable"]


# ----------------------------------------------------------------- helpers --
def _reads(op):
    """Operands plus values captured by nested regions (top-level values only)."""
    from remat_passes.ir import mlir
    vals = list(op.operands)
    inner_defs = set()

    def defs(inner):
        for r in inner.results:
            inner_defs.add(r)
        for region in inner.regions:
            for block in region.blocks:
                for a in block.arguments:
                    inner_defs.add(a)
        return mlir.ir.WalkResult.ADVANCE
    op.walk(defs)

    def uses(inner):
        if inner != op:
            vals.extend(v for v in inner.operands if v not in inner_defs)
        return mlir.ir.WalkResult.ADVANCE
    op.walk(uses)
    return vals


def classify(text, func="main", cotangent_args=None):
    """(ops, backward flags) of @func in program order; backward = depends on a cotangent."""
    module = parse_text(text)
    f, ops, term = func_ops(module, func)
    block = f.regions[0].blocks[0]
    if cotangent_args is None:
        attrs = f.operation.attributes
        arg_attrs = list(rp_ir.ArrayAttr(attrs["arg_attrs"])) if "arg_attrs" in attrs else []
        cotangent_args = [i for i, d in enumerate(arg_attrs) if "remat.cotangent" in str(d)]
    bvals = {block.arguments[i] for i in cotangent_args}
    flags = []
    for op in ops:
        is_b = any(v in bvals for v in _reads(op))
        if is_b:
            bvals.update(op.results)
        flags.append(is_b)
    return module, ops, flags, term


def assert_just_in_time(ops, flags, start=None):
    """Every op from `start` on (default: after the first backward op) that is not
    itself backward (a recomputation) is followed, with only recomputations in
    between, by a backward op that needs it (directly or through those
    recomputations). Returns the number of recomputed ops."""
    if start is None:
        start = flags.index(True) + 1
    n = 0
    for i in range(start, len(ops)):
        if flags[i]:
            continue
        n += 1
        needed = set(ops[i].results)
        j = i + 1
        while j < len(ops) and not flags[j]:
            if any(v in needed for v in _reads(ops[j])):
                needed.update(ops[j].results)
            j += 1
        assert j < len(ops), f"recomputed {ops[i].name} is never used by a backward op"
        assert any(v in needed for v in _reads(ops[j])), (
            f"recomputed {ops[i].name} (op {i}) is placed before backward op {ops[j].name} "
            f"(op {j}) that does not need it: not just in time")
    return n


# ------------------------------------------------------------ side effects --
SIDE_EFFECT_TOP = '''
module {
  func.func public @main(%arg0: tensor<4xf32>, %arg1: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %0 = stablehlo.custom_call @foo(%arg0) {has_side_effect = true} : (tensor<4xf32>) -> tensor<4xf32>
    %1 = stablehlo.sine %0 : tensor<4xf32>
    %2 = stablehlo.cosine %0 : tensor<4xf32>
    %3 = stablehlo.multiply %arg1, %2 : tensor<4xf32>
    return %1, %3 : tensor<4xf32>, tensor<4xf32>
  }
}
'''

SIDE_EFFECT_IN_WHILE = '''
module {
  func.func public @main(%arg0: tensor<4xf32>, %arg1: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %c3 = stablehlo.constant dense<3> : tensor<i32>
    %c1 = stablehlo.constant dense<1> : tensor<i32>
    %w:2 = stablehlo.while(%i = %c0, %v = %arg0) : tensor<i32>, tensor<4xf32>
      cond {
        %p = stablehlo.compare LT, %i, %c3 : (tensor<i32>, tensor<i32>) -> tensor<i1>
        stablehlo.return %p : tensor<i1>
      } do {
        %e = stablehlo.custom_call @foo(%v) {has_side_effect = true} : (tensor<4xf32>) -> tensor<4xf32>
        %n = stablehlo.add %i, %c1 : tensor<i32>
        stablehlo.return %n, %e : tensor<i32>, tensor<4xf32>
      }
    %1 = stablehlo.sine %w#1 : tensor<4xf32>
    %2 = stablehlo.cosine %w#1 : tensor<4xf32>
    %3 = stablehlo.multiply %arg1, %2 : tensor<4xf32>
    return %1, %3 : tensor<4xf32>, tensor<4xf32>
  }
}
'''

RNG = '''
module {
  func.func public @main(%arg0: tensor<4xf32>, %arg1: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %a = stablehlo.constant dense<0.0> : tensor<f32>
    %b = stablehlo.constant dense<1.0> : tensor<f32>
    %s = stablehlo.constant dense<4> : tensor<1xi64>
    %r = stablehlo.rng %a, %b, %s, distribution = UNIFORM : (tensor<f32>, tensor<f32>, tensor<1xi64>) -> tensor<4xf32>
    %1 = stablehlo.multiply %arg0, %r : tensor<4xf32>
    %2 = stablehlo.sine %1 : tensor<4xf32>
    %3 = stablehlo.cosine %1 : tensor<4xf32>
    %4 = stablehlo.multiply %arg1, %3 : tensor<4xf32>
    return %2, %4 : tensor<4xf32>, tensor<4xf32>
  }
}
'''


@pytest.mark.parametrize("mode", ["joint", "split"])
@pytest.mark.parametrize("policy", POLICIES, ids=POLICY_IDS)
def test_side_effecting_custom_call_is_never_duplicated(policy, mode):
    out = rp.remat(rp.Module.parse(SIDE_EFFECT_TOP), policy, mode=mode)
    out.verify()
    assert str(out).count("@foo") == 1
    # the backward reads the saved custom_call result (to recompute the cosine)
    # or the saved cosine itself
    descs = [r.description for r in out.residuals]
    assert any("custom_call" in d or "cos" in d for d in descs), descs


@pytest.mark.parametrize("mode", ["joint", "split"])
def test_side_effect_nested_in_a_while_body_is_never_duplicated(mode):
    out = rp.remat(rp.Module.parse(SIDE_EFFECT_IN_WHILE), P.nothing_saveable, mode=mode)
    out.verify()
    assert str(out).count("@foo") == 1, str(out)
    assert str(out).count("stablehlo.while") == 1


@pytest.mark.parametrize("mode", ["joint", "split"])
def test_rng_is_never_duplicated(mode):
    out = rp.remat(rp.Module.parse(RNG), P.nothing_saveable, mode=mode)
    out.verify()
    assert str(out).count("stablehlo.rng ") == 1
    # sin/cos are recomputed from the saved random values, not redrawn
    assert any("rng" in r.description for r in out.residuals)


def test_side_effect_in_backward_is_kept_once():
    text = SIDE_EFFECT_TOP.replace(
        "%3 = stablehlo.multiply %arg1, %2 : tensor<4xf32>",
        "%m = stablehlo.multiply %arg1, %2 : tensor<4xf32>\n"
        "    %3 = stablehlo.custom_call @bar(%m) {has_side_effect = true} : "
        "(tensor<4xf32>) -> tensor<4xf32>")
    out = rp.remat(rp.Module.parse(text), P.nothing_saveable)
    assert str(out).count("@foo") == 1 and str(out).count("@bar") == 1


def test_marked_cotangent_is_required():
    text = SIDE_EFFECT_TOP.replace(" {remat.cotangent}", "")
    with pytest.raises(rp.RematError, match="remat.cotangent"):
        rp.remat(rp.Module.parse(text), P.nothing_saveable)
    out = rp.remat(rp.Module.parse(text), P.nothing_saveable, cotangent_args=[1])
    assert str(out).count("@foo") == 1


# ------------------------------------------------------------ just in time --
def _region_model(x, w):
    h = rp.checkpoint(lambda x: jnp.sin(jnp.sin(x)))(x)
    return jnp.tanh(h * w)


X4 = (jnp.linspace(0.1, 1.0, 4), jnp.linspace(1.0, 2.0, 4))


@pytest.fixture(scope="module")
def region_module():
    return rp.export_vjp(_region_model, *X4)


def test_region_recomputation_is_just_in_time(region_module):
    out = rp.remat(region_module, None, prevent_cse=False)
    module, ops, flags, term = classify(str(out))
    first_bwd = flags.index(True)
    recomputed = [i for i in range(first_bwd, len(ops)) if not flags[i]]
    assert recomputed, "the region's sin must be recomputed in the backward"
    # not at the start of the backward: the tanh backward comes first
    assert recomputed[0] > first_bwd + 1
    assert any(flags[i] for i in range(first_bwd, recomputed[0]))
    names = [ops[i].name for i in recomputed]
    assert "stablehlo.sine" in names
    assert assert_just_in_time(ops, flags) == len(recomputed)
    # the forward is untouched: two sines before the backward, one recomputed after
    assert [o.name for o in ops[:first_bwd]].count("stablehlo.sine") == 2


def test_a_region_without_a_recorded_policy_gets_a_remark(region_module):
    """A remat[N] frame whose policy the module does not record (a module exported by
    plain jax.export, or edited) gets jax.checkpoint's default, and says so; a module
    that records it gets no remark."""
    assert not [r for r in rp.remat(region_module, None).remarks if "no recorded policy" in r]
    text = re.sub(r'remat\.regions = \{[^}]*\}, ?|, ?remat\.regions = \{[^}]*\}', "",
                  region_module.text(debug_info=True))
    assert "remat.regions" not in text
    remarks = rp.remat(rp.Module.parse(text), None).remarks
    (remark,) = [r for r in remarks if "no recorded policy" in r]
    assert re.search(r"checkpoint region\(s\) remat\[\d+\] have no recorded policy", remark)
    assert "nothing_saveable" in remark and "rp.export" in remark


def test_region_recomputation_reads_saved_or_recomputed_values_only(region_module):
    """No backward op may read a forward value that is neither saved nor recomputed:
    the region's inner sin and the cosines must not be read from the forward."""
    out = rp.remat(region_module, None, prevent_cse=False)
    descs = [r.description for r in out.residuals]
    assert not any("cos" in d for d in descs)
    assert sum(1 for d in descs if "output of sin" in d) == 1  # the region output only


@pytest.mark.parametrize("policy", [P.nothing_saveable, P.dots_saveable,
                                    P.save_only_these_names("q", "attn_out")],
                         ids=["nothing", "dots", "only_q_attn"])
def test_just_in_time_on_a_transformer_block(policy):
    from test_remat_numerics import block, block_args
    args = block_args()
    exported = rp.export_vjp(block, *args)
    # prevent_cse=False: with barriers, recomputed ops read the cotangent through the
    # barrier and would classify as backward; placement is the partial-eval's doing.
    out = rp.remat(exported, policy, prevent_cse=False)
    module, ops, flags, _ = classify(str(out))  # keep module alive: ops point into it
    assert assert_just_in_time(ops, flags) > 0
    # main_bwd: every op that does not read a cotangent is a recomputation from
    # residuals, and must sit right before the backward op that needs it too
    split = rp.remat(exported, policy, mode="split", prevent_cse=False)
    bmodule, bops, bflags, _ = classify(str(split), "main_bwd")
    assert assert_just_in_time(bops, bflags, start=0) > 0


@pytest.mark.slow
def test_a_narrowing_clone_is_made_where_its_input_is_made(monkeypatch):
    """The exception to just in time: the benchmark conv net at `auto(747733)` recomputes
    its first layer's pre-activation (512 KiB) for the second layer's weight gradient,
    and its ReLU mask (128 KiB of bool) for the select after the second layer's data
    gradient. Just in time, the pre-activation lived from the first until the select;
    the mask is now made beside the ReLU, in the same group, and read by the select
    through a barrier of its own. XLA's footprint of the split form as rp.jit runs it
    (XLA:CPU, jaxlib 0.12: 3,350,036 -> 2,957,140 B) is lower than with the mask just in
    time where XLA keeps barriers (jaxlib >= 0.11), no higher where it does not (0.10
    fuses the compare into the select whatever the order); gradients are jax.vjp's."""
    from remat_passes import jax_compat
    from remat_passes.core import plan as plan_module
    from tools.benchmarks import common, models, xla_memory
    model = models.make_convnet()
    fun = model.build(models._identity)
    m = rp.export_vjp(fun, *model.args)
    out, ct, grads = reference_vjp(fun, model.args)

    def measured():
        split, halves, _ = xla_memory.our_split(m, P.auto(747733), model.args)
        got, _ = run_split(split, model.args, ct, 1)
        assert_trees_close(got, leaves(out) + leaves(grads))
        return split, common.xla_peak(halves)
    split, early = measured()
    module, ops, _, _ = classify(str(split), "main_bwd")
    masks = [op for op in ops if op.name == "stablehlo.compare" and
             "tensor<8x32x32x16xi1>" in str(op.results[0].type)]
    assert len(masks) == 1
    mask = masks[0]
    fences = [use.owner for use in mask.results[0].uses]
    assert len(fences) == 1 and fences[0].name == "stablehlo.optimization_barrier"
    # made beside the ReLU (which reads the same pre-activation), before the data
    # gradient the select reads
    pre = mask.operands[0]
    relu = [op for op in ops if op.name == "stablehlo.maximum" and pre in list(op.operands)]
    select = fences[0].results[0].uses
    select = next(iter(select)).owner
    where = [i for i, op in enumerate(ops) if op == mask][0]
    assert len(relu) == 1 and [i for i, op in enumerate(ops) if op == relu[0]][0] < where
    gradient = select.operands[1].owner
    assert where < [i for i, op in enumerate(ops) if op == gradient][0]

    monkeypatch.setattr(plan_module, "make_narrowing_clones_early", lambda plan: None)
    _, just_in_time = measured()
    if jax_compat.xla_cpu_fuses_across_barriers():
        assert early <= just_in_time, (early, just_in_time)
    else:
        assert early < just_in_time * 0.95, (early, just_in_time)


def test_last_read_of_a_clone_source_follows_moved_clones():
    """make_narrowing_clones_early asks, per clone and input, for the latest serve that
    reads the input but that clone. Its answer (a lazy max-heap per source, linear in the
    readers over all questions) must be the scan it replaced, also after clones move to
    earlier serves."""
    from array import array
    from remat_passes.core.plan import _LastRead
    rng = np.random.default_rng(0)
    for _ in range(50):
        n_clones, n_serves = int(rng.integers(1, 12)), int(rng.integers(1, 12))
        where = array("q", rng.integers(0, n_serves, n_clones).tolist())
        readers = {}
        for src in range(int(rng.integers(1, 5))):
            rs = [("clone", int(k)) for k in rng.choice(n_clones, int(rng.integers(0, n_clones + 1)),
                                                         replace=False)]
            rs += [("serve", int(i)) for i in rng.integers(0, n_serves, int(rng.integers(0, 4)))]
            readers[src] = rs
        last = _LastRead(readers, where)
        for _ in range(30):
            src, but = int(rng.integers(0, 6)), int(rng.integers(0, n_clones))
            want = max((where[r] if kind == "clone" else r for kind, r in readers.get(src, ())
                        if not (kind == "clone" and r == but)), default=-1)
            assert last.latest(src, but=but) == want
            k = int(rng.integers(0, n_clones))        # clones only ever move earlier
            where[k] = int(rng.integers(0, where[k] + 1))


# ------------------------------------------------------------- constants --
def _residual_roots(split_text):
    """For each residual of main_fwd: does it depend on a function argument?"""
    module = parse_text(split_text)
    f, ops, term = func_ops(module, "main_fwd")
    block = f.regions[0].blocks[0]
    arg_dep = set(block.arguments)
    for op in ops:
        if any(v in arg_dep for v in _reads(op)):
            arg_dep.update(op.results)
    n_out = len(f.type.results) - sum(1 for d in rp_ir.ArrayAttr(
        f.operation.attributes["res_attrs"]) if "remat.residual" in str(d))
    return [(str(v.type), v in arg_dep) for v in list(term.operands)[n_out:]]


def _mean_model(x):
    # mean: a division by a broadcast constant; iota; a constant multiply
    i = jax.lax.iota(jnp.float32, x.shape[-1])
    return jnp.mean(jnp.sin(x * 3.0 + i), axis=-1)


def _norm_model(x):
    s = jnp.sum(x, axis=-1, keepdims=True)
    return jnp.sin(x / s)


@pytest.mark.parametrize("fun", [_mean_model, _norm_model], ids=["mean", "norm"])
@pytest.mark.parametrize("policy", POLICIES, ids=POLICY_IDS)
def test_constants_are_never_residuals(fun, policy):
    x = jnp.linspace(0.5, 2.0, 12).reshape(3, 4)
    module = rp.export_vjp(fun, x)
    out = rp.remat(module, policy, mode="split")
    roots = _residual_roots(str(out))
    assert len(roots) == len(out.residuals)
    constant_only = [t for t, dep in roots if not dep]
    assert not constant_only, (
        f"residuals computed from constants alone: {constant_only}; "
        f"{[str(r) for r in out.residuals]}")
    for r in out.residuals:
        assert "constant" not in r.description and "iota" not in r.description


# --------------------------------------------------------- called functions --
def _relu_model(x, w):
    return jnp.sum(jax.nn.relu(x @ w) @ w)


def test_called_functions_are_inlined():
    """DESIGN: `func.call` is inlined first. jax.nn.relu lowers to a call."""
    args = (jnp.ones((2, 3)), jnp.eye(3) * 0.5)
    module = rp.export_vjp(_relu_model, *args)
    assert "call @relu" in str(module)  # guard: the input does have a call
    out = rp.remat(module, P.nothing_saveable)
    assert "call @" not in str(out)


def test_called_function_outputs_follow_the_policy():
    """nothing_saveable saves only arguments, like jax.checkpoint(f) does,
    also when the model calls a jitted function (jax.nn.relu)."""
    args = (jnp.ones((2, 3)), jnp.eye(3) * 0.5)
    module = rp.export_vjp(_relu_model, *args)
    ours = rp.remat(module, P.nothing_saveable).residuals
    assert_same_residual_types(ours, jax.checkpoint(lambda x, w: _relu_model(x, w)), *args)
    assert all(r.description.startswith("from the argument") for r in ours), \
        [str(r) for r in ours]


def test_called_function_numerics_still_match():
    args = (jnp.linspace(-1, 1, 6).reshape(2, 3), jnp.eye(3) * 0.5 + 0.1)
    module = rp.export_vjp(_relu_model, *args)
    out, ct, grads = reference_vjp(_relu_model, args)
    got = run_joint(rp.remat(module, P.nothing_saveable), args, ct)
    assert_trees_close(got, leaves(out) + leaves(grads))


@jax.jit
def _inner(x, w):
    return rp.checkpoint_name(jnp.sin(x @ w), "inner")


@jax.jit
def _middle(x, w):
    return jnp.tanh(_inner(x, w)) + _inner(x * 2.0, w)


def _nested_calls_model(x, w):
    def body(h, _):
        return _middle(h, w), None
    h, _ = jax.lax.scan(body, _inner(x, w), None, length=3)
    return jnp.sum(_middle(h, w))


def test_nested_calls_are_inlined_with_composed_name_stacks():
    """Calls nested three deep (a jitted function calling another, in a scan body and at
    the top level): no call is left, each inlined op's location has every enclosing
    call's frames, the names inside still apply, and gradients match jax.vjp."""
    args = (jnp.linspace(-1, 1, 6).reshape(2, 3), jnp.eye(3) * 0.5 + 0.1)
    module = rp.export_vjp(_nested_calls_model, *args)
    assert "call @" in str(module)   # guard: the input has calls
    policy = P.save_only_these_names("inner")
    out = rp.remat(module, policy)
    assert "call @" not in str(out)
    text = out.text(debug_info=True)
    assert re.search(r"jit\(_middle\)/[^\"]*jit\(_inner\)/[^\"]*sin", text), \
        "an op of @_inner inlined through @_middle lost a frame"
    assert_same_residual_types(out.residuals, jax.checkpoint(_nested_calls_model,
                                                             policy=JP.save_only_these_names(
                                                                 "inner")), *args)
    ref, ct, grads = reference_vjp(_nested_calls_model, args)
    assert_trees_close(run_joint(out, args, ct), leaves(ref) + leaves(grads))


# --------------------------------------------------- never more than JAX --
@pytest.mark.parametrize("fun", [_norm_model, _mean_model], ids=["norm", "mean"])
def test_no_policy_saves_what_jax_saves(fun):
    """policy=None is 'JAX without jax.checkpoint': same residual types, and in
    particular not more bytes (ops JAX put in the backward that read only
    forward values must not be hoisted into the forward and saved)."""
    x = jnp.linspace(0.5, 2.0, 15).reshape(3, 5)
    ours = rp.saved_residuals(fun, x)
    theirs = jax_saved_residuals(lambda x: fun(x), x)
    our_bytes = sum(r.bytes for r in ours)
    jax_bytes = sum(int(np.prod(a.shape)) * a.dtype.itemsize for a, _ in theirs)
    assert our_bytes <= jax_bytes, ([str(r) for r in ours], theirs)
    assert_same_residual_types(ours, lambda x: fun(x), x)


def test_names_are_stripped_from_the_output():
    def f(x):
        return jnp.sum(jnp.sin(rp.checkpoint_name(jnp.sin(x), "a")))
    module = rp.export_vjp(f, jnp.ones(3))
    assert "remat.name" in str(module)
    for mode in ("joint", "split"):
        assert "remat.name" not in str(rp.remat(module, P.save_only_these_names("a"), mode=mode))


def test_split_interface():
    module = rp.export_vjp(_region_model, *X4)
    out = rp.remat(module, P.nothing_saveable, mode="split")
    text = str(out)
    mod = parse_text(text)
    fwd, _, fterm = func_ops(mod, "main_fwd")
    bwd, _, _ = func_ops(mod, "main_bwd")
    n_res = len(out.residuals)
    # fwd: primals -> (outputs, residuals); bwd: (residuals, cotangents) -> grads
    assert len(fwd.type.inputs) == 2 and len(fwd.type.results) == 1 + n_res
    assert len(bwd.type.inputs) == n_res + 1 and len(bwd.type.results) == 2
    descs = [str(d) for d in rp_ir.ArrayAttr(fwd.operation.attributes["res_attrs"])][1:]
    for d, r in zip(descs, out.residuals):
        assert r.type in d
    assert "remat.cotangent" in str(bwd.operation.attributes["arg_attrs"])
    o, ct, g = reference_vjp(_region_model, X4)
    got, _ = run_split(out, X4, ct, 1)
    assert_trees_close(got, leaves(o) + leaves(g))


# ------------------------------------------- arguments and zero gradients --
def _with_unused(x, unused):
    return jnp.sin(x)


def test_unused_primal_argument_keeps_the_cotangent_marked():
    """JAX drops unused arguments when lowering (module_kept_var_idx); the
    cotangent must still be the marked argument, and never a residual."""
    args = (jnp.linspace(0.0, 1.0, 3), jnp.ones(2))
    module = rp.export_vjp(_with_unused, *args)
    res = rp.remat(module, None).residuals
    assert not any("cotangent" in r.description for r in res), [str(r) for r in res]
    assert_same_residual_types(res, lambda x, unused: _with_unused(x, unused), *args)
    main = func_ops(parse_text(str(module)))[0]
    arg_attrs = [str(d) for d in rp_ir.ArrayAttr(main.operation.attributes["arg_attrs"])]
    assert "remat.cotangent" in arg_attrs[-1], arg_attrs


def test_unused_primal_argument_split_functions_take_all_primals():
    """The split API: m.call(*primals, function='main_fwd'), then
    m.call(*residuals, ct, function='main_bwd') gives jax.vjp's gradients."""
    args = (jnp.linspace(0.0, 1.0, 3), jnp.ones(2))
    module = rp.export_vjp(_with_unused, *args)
    split = rp.remat(module, None, mode="split")
    out, ct, grads = reference_vjp(_with_unused, args)
    got, _ = run_split(split, args, ct, 1)
    assert_trees_close(got, leaves(out) + leaves(grads))


@pytest.mark.parametrize("policy", [None, P.everything_saveable, P.nothing_saveable],
                         ids=["none", "everything", "nothing"])
def test_zero_gradient_is_not_a_residual_in_split_mode(policy):
    """A gradient that is identically zero (stop_gradient) is a broadcast of a
    constant: main_bwd recomputes it for free; it must not be saved, and split
    mode must save exactly what joint mode saves."""
    def f(x, y):
        return jnp.sin(x) + jax.lax.stop_gradient(y)
    args = (jnp.linspace(0.0, 1.0, 3), jnp.ones(3))
    module = rp.export_vjp(f, *args)
    joint = rp.remat(module, policy)
    split = rp.remat(module, policy, mode="split")
    assert [str(r) for r in split.residuals] == [str(r) for r in joint.residuals]
    assert all(dep for _, dep in _residual_roots(str(split)))
    out, ct, grads = reference_vjp(f, args)
    got, _ = run_split(split, args, ct, 1)
    assert_trees_close(got, leaves(out) + leaves(grads))


def _dict_outputs(x, y):
    s = jnp.sin(x)
    return {"id": x, "s": s, "p": s * y, "c": 2.0 * jnp.ones(3)}


@pytest.mark.parametrize("mode", ["joint", "split"])
def test_pytree_outputs_identity_and_constant_outputs(mode):
    """Outputs that are an argument, a residual, and a constant (whose cotangent
    the program never reads): main_bwd still takes every cotangent."""
    args = (jnp.linspace(0.0, 1.0, 3), jnp.linspace(1.0, 2.0, 3))
    module = rp.export_vjp(_dict_outputs, *args)
    out, ct, grads = reference_vjp(_dict_outputs, args)
    for policy in (None, P.nothing_saveable):
        rewritten = rp.remat(module, policy, mode=mode)
        if mode == "joint":
            got = run_joint(rewritten, args, ct)
        else:
            got, _ = run_split(rewritten, args, ct, len(leaves(out)))
        assert_trees_close(got, leaves(out) + leaves(grads))


def test_models_using_jax_checkpoint_keep_jaxs_residuals():
    """Exported code that already uses jax.checkpoint: JAX's own recomputation
    is backward (its barrier carries the cotangent) and is not saved again."""
    def g(W, x):
        return jnp.sin(jnp.sin(W @ x))

    def f(W, x):
        return jnp.sum(jax.checkpoint(g)(W, jax.checkpoint(g)(W, x)))
    args = (jnp.ones((4, 4)) * 0.3, jnp.linspace(0.0, 1.0, 4))
    ours = rp.saved_residuals(f, *args)
    assert_same_residual_types(ours, lambda W, x: f(W, x), *args)
    module = rp.export_vjp(f, *args)
    out, ct, grads = reference_vjp(f, args)
    assert_trees_close(run_joint(rp.remat(module, None), args, ct), leaves(out) + leaves(grads))


def _barriers(text: str) -> int:
    return text.count("stablehlo.optimization_barrier")


def test_region_prevent_cse_false_places_no_barrier_as_jax():
    """rp.checkpoint(f, prevent_cse=False) recomputes without barriers, as JAX's lowering of
    jax.checkpoint(f, prevent_cse=False) has none; a region with the default keeps them, and
    the gradients are the same either way."""
    def layer(W, x):
        return jnp.sin(jnp.sin(x @ W) @ W)

    W = jnp.asarray(np.random.default_rng(0).normal(size=(4, 4)) * 0.5, jnp.float32)
    x = jnp.asarray(np.random.default_rng(1).normal(size=(3, 4)), jnp.float32)

    def jax_text(prevent_cse):
        f = jax.checkpoint(lambda W, x: jnp.sum(layer(W, x)), prevent_cse=prevent_cse)
        return jax.jit(lambda W, x: jax.vjp(f, W, x)[1](jnp.float32(1.0))).lower(W, x).as_text()

    def ours(first, second):
        def f(W, x):
            h = rp.checkpoint(layer, prevent_cse=first)(W, x)
            return jnp.sum(rp.checkpoint(layer, prevent_cse=second)(W, h))
        m = rp.export_vjp(f, W, x)
        return m, f, rp.remat(m, None)

    assert _barriers(jax_text(False)) == 0 < _barriers(jax_text(True))
    _, _, off = ours(False, False)
    assert _barriers(str(off)) == 0
    _, _, on = ours(True, True)
    _, f, mixed = ours(False, True)
    assert 0 < _barriers(str(mixed)) < _barriers(str(on))
    for out in (off, on, mixed):
        ref_out, grads = jax.value_and_grad(f, argnums=(0, 1))(W, x)
        got = out.call(W, x, jnp.float32(1.0))
        np.testing.assert_allclose(np.asarray(got[0]), np.asarray(ref_out), rtol=1e-5)
        for g, r in zip(got[1], grads):
            np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("mode", ["joint", "split"])
def test_per_region_barriers_one_per_checkpoint_region(mode):
    """barrier_groups="per-region" places one barrier per checkpoint region, as
    jax.checkpoint's lowering has one per remat call: a module policy is one region (one
    barrier where per-use places one per recomputation), three rp.checkpoint layers are
    three. The gradients are jax.vjp's either way."""
    def layer(W, x):
        return jnp.sin(jnp.tanh(x @ W) @ W)

    def plain(Ws, x):
        h = x
        for W in Ws:
            h = layer(W, h)
        return jnp.sum(h)

    def layered(Ws, x):
        h = x
        for W in Ws:
            h = rp.checkpoint(layer)(W, h)
        return jnp.sum(h)
    args = LAYERED_ARGS
    for fun, policy, regions in ((plain, P.nothing_saveable, 1), (layered, None, 3)):
        module = rp.export_vjp(fun, *args)
        out, ct, grads = reference_vjp(fun, args)
        per_use = rp.remat(module, policy, mode=mode)
        per_region = rp.remat(module, policy, mode=mode, barrier_groups="per-region")
        assert _barriers(str(per_region)) == regions < _barriers(str(per_use))
        for m in (per_use, per_region):
            got = run_joint(m, args, ct) if mode == "joint" else \
                run_split(m, args, ct, len(leaves(out)))[0]
            assert_trees_close(got, leaves(out) + leaves(grads))
    with pytest.raises(rp.RematError, match="barrier_groups: expected one of per-use"):
        rp.remat(rp.export_vjp(plain, *args), barrier_groups="per-layer")


def _barrier_operands(text: str) -> list[str]:
    return [m.group(1) for m in re.finditer(
        r"stablehlo\.optimization_barrier(?: \{[^}]*\})? ([^:]*) :", text)]


def test_per_region_under_module_policy_routes_every_residual_like_jax():
    """Under a module policy, per-region's barrier takes everything the backward reads from
    the forward (what the policy saves, the arguments it reads) with the cotangent, as JAX's
    `jit(grad(checkpoint(f, policy)))` has it, also when nothing is recomputed
    (everything_saveable: JAX still places that barrier; our per-use has none). No policy:
    no region, no barrier. Gradients: jax.vjp's."""
    def f(W, x):
        h = jax.nn.relu(x @ W)
        return jnp.sum(jnp.sin(h @ W))
    W = jnp.linspace(-1.0, 1.0, 16).reshape(4, 4)
    x = jnp.linspace(-2.0, 2.0, 8).reshape(2, 4)
    module = rp.export_vjp(f, W, x)
    out, ct, grads = reference_vjp(f, (W, x))
    jax_text = jax.jit(jax.grad(jax.checkpoint(
        f, policy=jax.checkpoint_policies.everything_saveable))).lower(
        W, x).as_text()
    assert _barriers(jax_text) == 1
    for policy in (P.everything_saveable, P.dots_saveable):
        ours = rp.remat(module, policy, barrier_groups="per-region")
        [operands] = _barrier_operands(str(ours))
        names = [o.strip() for o in operands.split(",")]
        # the arguments the backward reads, at least one saved value, the cotangent last
        assert {"%arg0", "%arg1"} <= set(names) and names[-1] == "%arg2"
        assert any(not n.startswith("%arg") for n in names)
        assert_trees_close(run_joint(ours, (W, x), ct), leaves(out) + leaves(grads))
    assert _barriers(str(rp.remat(module, P.everything_saveable))) == 0       # per-use
    assert _barriers(str(rp.remat(module, None, barrier_groups="per-region"))) == 0
    split = rp.remat(module, P.everything_saveable, mode="split", barrier_groups="per-region")
    assert _barriers(str(split)) == 0     # split: the halves already keep the forward apart


def test_per_region_barrier_of_a_gradient_step_that_recomputes_nothing_needs_no_tie():
    """A gradient step (`value_and_grad` inside the function: its cotangent is a constant,
    no argument) tied to the cotangent (XLA:CPU) still gets per-region's barrier over what
    the backward reads, arguments included as in JAX's, where no recomputation needs a tie
    (everything_saveable). Without it XLA:CPU of jaxlib >= 0.11 fused forward ops into the
    backward: the benchmark conv net's step, jax 0.12, 3,086,348 B against
    jax.checkpoint's 2,373,324 B; with it 2,373,324 B. Values: jax.value_and_grad's."""
    def loss(W, x):
        h = jax.nn.relu(x @ W)
        return jnp.sum(jnp.sin(h @ W))
    step = jax.value_and_grad(loss)
    W = jnp.linspace(-1.0, 1.0, 16).reshape(4, 4)
    x = jnp.linspace(-2.0, 2.0, 8).reshape(2, 4)
    fn = rp.jit(step, policy=P.everything_saveable, mode="joint", tie_to_cotangent=True,
                barrier_groups="per-region")
    lowered = fn.lower(W, x)
    assert _barriers(lowered.as_text()) == 1
    [operands] = _barrier_operands(lowered.as_text())
    assert {"%arg0", "%arg1"} <= {o.strip() for o in operands.split(",")}
    assert_trees_close(leaves(fn(W, x)), leaves(step(W, x)))


def test_a_group_of_name_markers_alone_leaves_per_regions_barrier_in_place():
    """Under save_anything_except_these_names("h") the backward "recomputes" only h's name
    marker, an identity on the saved relu output: no clone to keep apart from the forward.
    So per-region's barrier over the residuals is placed as under everything_saveable (the
    arguments in it, the only barrier; with the marker's group counted it was not placed
    and XLA:CPU fused the forward into the backward: the benchmark conv net's step under
    save_anything_except_these_names(conv0), jax 0.12, 3,217,100 B, jax.checkpoint's
    2,373,324 B, now 2,373,324 B). Per use the marker keeps its own barrier (measured
    smaller there). Values: jax.value_and_grad's."""
    from jax.ad_checkpoint import checkpoint_name

    def loss(W, x):
        h = checkpoint_name(jax.nn.relu(x @ W), "h")
        return jnp.sum(jnp.sin(h @ W))
    step = jax.value_and_grad(loss)
    W = jnp.linspace(-1.0, 1.0, 16).reshape(4, 4)
    x = jnp.linspace(-2.0, 2.0, 8).reshape(2, 4)
    policy = P.save_anything_except_these_names("h")
    for groups in ("per-region", "per-use"):
        fn = rp.jit(step, policy=policy, mode="joint", tie_to_cotangent=True,
                    barrier_groups=groups)
        [operands] = _barrier_operands(fn.lower(W, x).as_text())
        held = {o.strip() for o in operands.split(",")}
        if groups == "per-region":
            assert {"%arg0", "%arg1"} <= held
        else:
            assert not held & {"%arg0", "%arg1"}   # the saved relu, the cotangent
        assert_trees_close(leaves(fn(W, x)), leaves(step(W, x)))


@pytest.mark.parametrize("mode", ["joint", "split"])
def test_remat_variants_plan_once_and_give_what_remat_gives(mode):
    """rp.jit's build of several barrier variants: the same modules as separate rp.remat
    calls, with the steps up to place-optimization-barriers (the auto plan among them) run
    once: every result carries the very same timings for those steps."""
    from remat_passes.api.remat import Barriers, remat_variants
    def loss(Ws, x):
        for W in Ws:
            x = jnp.sin(jnp.tanh(x @ W) @ W)
        return jnp.sum(x)
    module = rp.export_vjp(loss, *LAYERED_ARGS)
    policy = P.auto("50%")
    per_use, per_region, tied = remat_variants(
        module, (Barriers("per-use"), Barriers("per-region"), Barriers("per-use", tie=True)),
        policy, mode=mode)
    assert str(per_use) == str(rp.remat(module, policy, mode=mode))
    assert str(per_region) == str(rp.remat(module, policy, mode=mode,
                                           barrier_groups="per-region"))
    assert str(tied) == str(rp.remat(module, policy, mode=mode, tie_to_cotangent=True))
    assert "stablehlo.is_finite" in str(tied) and "stablehlo.is_finite" not in str(per_use)
    names = [name for name, _ in per_use.timings]
    cut = names.index("place-optimization-barriers")
    assert names.count("remat-partial-eval") == 1
    assert per_use.timings[:cut] == per_region.timings[:cut] == tied.timings[:cut]
    assert [str(r) for r in per_use.residuals] == [str(r) for r in per_region.residuals]
    with pytest.raises(rp.RematError, match="barrier_groups: expected one of"):
        remat_variants(module, (Barriers("per-use"), Barriers("everywhere")))


def test_typed_prng_key_in_split_calls():
    """A typed key (jax.random.key) is an argument of the joint module and of main_fwd:
    the split halves take it as they take any array, and the gradients equal jax.vjp's."""
    def f(W, key):
        x = jax.random.normal(key, (4,))
        return jnp.sum(jnp.sin(W @ x))
    W = jnp.asarray(np.random.default_rng(0).normal(size=(3, 4)), jnp.float32)
    key = jax.random.key(0)
    m = rp.export_vjp(f, W, key)
    value, vjp = jax.vjp(f, W, key)
    dW = vjp(jnp.float32(1.0))[0]
    joint = rp.remat(m, "nothing_saveable")
    got = joint.call(W, key, jnp.float32(1.0))
    np.testing.assert_allclose(np.asarray(got[1][0]), np.asarray(dW), rtol=1e-5)
    split = rp.remat(m, "nothing_saveable", mode="split")
    fwd = split.call(W, key, function="main_fwd")
    np.testing.assert_allclose(np.asarray(fwd[0]), np.asarray(value), rtol=1e-5)
    bwd = split.call(*fwd[1:], jnp.float32(1.0), function="main_bwd")
    np.testing.assert_allclose(np.asarray(bwd[0]), np.asarray(dW), rtol=1e-5)


def test_split_halves_keep_result_labels_and_argument_attributes():
    """jax.result_info labels and argument attributes go with the results and arguments
    to the half that takes them: outputs to main_fwd, gradients to main_bwd."""
    def f(W, x):
        return jnp.sum(jnp.sin(x @ W)), jnp.cos(x)
    W = jnp.ones((4, 4)) * 0.5
    x = jnp.ones((2, 4))
    m = rp.export_vjp(f, W, x)
    split = rp.remat(m, "nothing_saveable", mode="split")
    from remat_passes.ir import contract, graph
    with m.op.context:
        main = graph.find_func(m.op, "main")
        labels = [e.get("jax.result_info") for e in contract.all_entries(main, "res_attrs")]
    with split.op.context:
        fwd = graph.find_func(split.op, "main_fwd")
        bwd = graph.find_func(split.op, "main_bwd")
        fwd_labels = [e.get("jax.result_info") for e in contract.all_entries(fwd, "res_attrs")]
        bwd_entries = contract.all_entries(bwd, "res_attrs")
    assert all(label is not None for label in labels)
    assert [str(v) for v in fwd_labels[:2]] == [str(v) for v in labels[:2]]   # the outputs
    assert [str(e.get("jax.result_info")) for e in bwd_entries] == \
        [str(v) for v in labels[2:]]                                        # the gradients
    assert all(contract.GRADIENT in e for e in bwd_entries)


@pytest.mark.parametrize("policy", ["nothing_saveable", "dots_saveable"])
def test_second_order_split_keeps_the_output_forward(policy):
    """export_vjp(jax.grad(f)): the output (a gradient of f, computed under JAX's transpose
    frames) is main_fwd's; main_bwd returns the second-order gradient. Both equal jax.vjp,
    and the residuals are what jax.checkpoint saves."""
    W = jnp.asarray(np.random.default_rng(0).normal(size=(4, 4)) * 0.5, jnp.float32)

    def f(W, x):
        return jnp.sum(jnp.sin(W @ x) ** 2)
    g = jax.grad(f, argnums=1)
    x = jnp.asarray(np.random.default_rng(1).normal(size=(4,)), jnp.float32)
    m = rp.export_vjp(g, W, x)
    split = rp.remat(m, policy, mode="split")
    out, vjp = jax.vjp(g, W, x)
    ct = jnp.asarray(np.random.default_rng(2).normal(size=(4,)), jnp.float32)
    fwd = split.call(W, x, function="main_fwd")
    np.testing.assert_allclose(np.asarray(fwd[0]), np.asarray(out), rtol=1e-5, atol=1e-6)
    bwd = split.call(*fwd[1:], ct, function="main_bwd")
    for got, want in zip(bwd, vjp(ct)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)
    assert_same_residual_types(split.residuals,
                               jax.checkpoint(g, policy=getattr(jax.checkpoint_policies, policy)),
                               W, x, context=f"second order / {policy}")


# ------------------------------------------- a policy over checkpointed layers --
@pytest.mark.parametrize("inner", ["nothing_saveable", "dots_saveable"])
@pytest.mark.parametrize("outer", ["nothing_saveable", "everything_saveable", "dots_saveable"])
def test_an_outer_region_over_checkpointed_layers_keeps_what_jax_keeps(inner, outer):
    """jax.checkpoint(loss, outer) over layers that are jax.checkpoint(layer, inner):
    the outermost policy decides what the forward keeps, inside the layers too. The
    same model with rp.checkpoint regions, wrapped in rp.checkpoint(loss, outer), keeps
    the same residuals."""
    theirs = jax.checkpoint(layered_loss(jax.checkpoint, getattr(JP, inner)),
                            policy=getattr(JP, outer))
    ours = rp.remat(rp.export_vjp(rp.checkpoint(layered_loss(rp.checkpoint, inner),
                                                policy=outer), *LAYERED_ARGS))
    assert_same_residual_types(ours.residuals, theirs, *LAYERED_ARGS)


def test_a_module_policy_says_it_does_not_reach_into_jax_checkpoint_regions():
    """A model whose layers call jax.checkpoint is exported with JAX's recomputation of
    them in its backward: a module policy decides outside them only, and says so."""
    module = rp.export_vjp(layered_loss(jax.checkpoint, JP.nothing_saveable), *LAYERED_ARGS)
    remark = [r for r in rp.remat(module, P.everything_saveable).remarks
              if "rematted_computation" in r]
    assert remark and 'jax_checkpoint="regions"' in remark[0], remark
    assert "rp.checkpoint(f, policy=...)" in remark[0]      # what reproduces JAX's nesting
    assert not [r for r in rp.remat(module).remarks if "rematted_computation" in r]


NO_ACTIVATION = """
module @no_activation {
  func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %s = stablehlo.sine %x : tensor<4xf32>
    %s2 = stablehlo.sine %x {remat.recompute = 1 : i64} : tensor<4xf32>
    %c2 = stablehlo.cosine %s2 {remat.recompute = 1 : i64} : tensor<4xf32>
    %g0 = stablehlo.multiply %ct, %c2 : tensor<4xf32>
    %t = stablehlo.tanh %s2 {remat.recompute = 2 : i64} : tensor<4xf32>
    %g1 = stablehlo.multiply %g0, %t : tensor<4xf32>
    return %s, %g1 : tensor<4xf32>, tensor<4xf32>
  }
}
"""


@pytest.mark.parametrize("groups", ["per-use", "per-region function-region=true"])
def test_a_forward_that_keeps_no_activation_gets_barriers_only_where_xla_cannot_merge(groups):
    """Tied (XLA:CPU), joint, the backward reading nothing of the forward but arguments (the
    lit test's @no_activation): per use no barrier where the installed jaxlib's XLA:CPU keeps
    barriers through its CSE (>= 0.11), so that it merges the clones with the forward ops
    they copy (RecurrentGemma under nothing_saveable, jaxlib 0.12: 1,708,840 B with barriers,
    1,585,960 B without; jax.checkpoint's 1,569,688 B); with 0.10, which deletes them before
    CSE, the barriers change nothing and stay. Per region the barrier stays, as
    jax.checkpoint places it. Never a tie."""
    from remat_passes import jax_compat
    m = rp.Module.parse(NO_ACTIVATION)
    rp.run_pipeline(m.op, rp.parse_pipeline(
        f"builtin.module(place-optimization-barriers{{tie-to-cotangent=true groups={groups}}})"))
    text = str(m)
    barriers = text.count("stablehlo.optimization_barrier")
    if groups.startswith("per-region"):
        assert barriers == 1
    else:
        assert barriers == (2 if jax_compat.xla_cpu_fuses_across_barriers() else 0)
    assert "is_finite" not in text


def test_per_region_barrier_is_the_same_from_run_to_run():
    """The per-region barrier over the residuals lists its operands in one order on every
    run (they were gathered through sets of values, whose order follows their addresses:
    two rewrites of one module in one process differed)."""
    def f(W, x):
        for _ in range(12):
            x = jnp.sin(jnp.tanh(x @ W))
        return jnp.sum(x)
    W = jnp.linspace(-1.0, 1.0, 16).reshape(4, 4)
    x = jnp.linspace(-2.0, 2.0, 8).reshape(2, 4)
    module = rp.export_vjp(f, W, x)
    texts = {str(rp.remat(module, P.dots_saveable, tie_to_cotangent=True,
                          barrier_groups="per-region")) for _ in range(4)}
    assert len(texts) == 1
