"""Per-iteration remat through `lax.scan` (issue 6), checked live against JAX.

JAX exports `lax.scan` under a VJP as a forward `stablehlo.while` that stacks
per-iteration residuals into loop-carried buffers, and a backward `while` that
reads them in reverse. `remat-partial-eval` applies the policy in force *per
iteration*: the forward loop stops stacking what the policy recomputes, and
the backward loop body recomputes it from what stays stacked.

What is checked, and against what (nothing here hard-codes a residual list):

* residual parity: `rp.remat(export_vjp(scan(layer)), policy)` saves the
  multiset of types (and total bytes) that JAX saves for
  `scan(jax.checkpoint(layer, policy=<same policy>))`; stacked residuals carry
  their stacked type (JAX describes them as 'output of scan'). Both for a
  module-level policy and for `rp.checkpoint(layer, policy)` regions;
* gradients: the rewritten module, in joint and split form, compiled with XLA
  and run, equals `jax.vjp` of the *unscanned* model (a Python loop over the
  layers);
* variants: reverse scans, several carries plus a per-iteration output,
  `unroll=2`, nested scans, and a data-dependent `lax.while_loop`, which must
  stay atomic (with a remark) while the scan next to it does not;
* a structural check that does not trust the pass's own bookkeeping: under
  nothing_saveable the forward while stacks fewer buffers and the backward
  while body contains the recomputed `dot_general`.

Why a module-level policy is compared with `scan(jax.checkpoint(layer))`: the
module policy also applies outside the loop, but the exported functions are
`scan(...)` and nothing else around it (only loop-index constants and the
zero buffers the loops start from, which are free constants, never saved), so
every forward value the policy can decide on lives in the loop body, where it
acts per iteration exactly like a policy on the checkpointed layer. The loop's
per-iteration inputs (the carry entering each iteration) are stacked by both.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.ad_checkpoint import checkpoint_name
from remat_testlib import (assert_same_residual_types, assert_trees_close, jax_saved_residuals,
                           leaves, parse_text, reference_vjp, run_joint_cached, run_split,
                           run_split_cached)

import remat_passes as rp
from remat_passes.cost import flops
from remat_passes.ir import mlir
from remat_passes.ir.mlir import ir
from remat_passes.policy.policies import Offloadable, Recompute, Saveable

P = rp.policies
JP = jax.checkpoint_policies


def rnd(seed, shape, scale=1.0):
    return (scale * jax.random.normal(jax.random.PRNGKey(seed), shape)).astype(jnp.float32)


def _layer_slice(params, i):
    return jax.tree_util.tree_map(lambda a: a[i], params)


# ------------------------------------------------------------------ models --
def mlp_layer(x, p):
    """One dense layer with a residual connection; three named values."""
    W, b = p
    pre = checkpoint_name(x @ W, "pre")
    act = checkpoint_name(jnp.tanh(pre + b), "act")
    out = checkpoint_name(jnp.sin(act) * x, "out")
    return x + out, None


def mlp_args(L=3, d=4, batch=2, seed=0):
    Ws = rnd(seed + 1, (L, d, d), 1 / np.sqrt(d))
    bs = rnd(seed + 2, (L, d), 0.1)
    return rnd(seed + 3, (batch, d)), (Ws, bs)


SEQ, DIM, HEADS, FF = 8, 16, 2, 32


def _causal_bias(T):
    """The causal mask as an additive bias built from iota inside the layer.

    Additive, so the backward needs no mask (with jnp.where(mask, s, -1e9)
    JAX saves the mask per iteration); built from iota rather than captured
    as a numpy array, because JAX saves a captured array that its recompute
    needs ('from a constant') while we recompute constants for free and never
    save them (DESIGN.md section 4), which would make the reference unfair.
    """
    i = lax.broadcasted_iota(jnp.int32, (T, T), 0)
    j = lax.broadcasted_iota(jnp.int32, (T, T), 1)
    return jnp.where(i >= j, 0.0, -1e9).astype(jnp.float32)


def gpt_layer(x, p):
    """Pre-LN GPT block: layer norm, two-head causal attention, tanh MLP."""
    g, wq, wk, wv, wo, w1, w2 = p
    T, D = x.shape
    hd = D // HEADS
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    xn = (x - mu) * lax.rsqrt(var + 1e-5) * g
    # named per head, so the named values are themselves what attention's
    # backward reads (name-based policies then decide on residuals directly)
    q = checkpoint_name((xn @ wq).reshape(T, HEADS, hd), "query_proj")
    k = checkpoint_name((xn @ wk).reshape(T, HEADS, hd), "key_proj")
    v = checkpoint_name((xn @ wv).reshape(T, HEADS, hd), "value_proj")
    s = jnp.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + _causal_bias(T)
    a = jax.nn.softmax(s, axis=-1)
    o = jnp.einsum("hqk,khd->qhd", a, v).reshape(T, D)
    x = x + checkpoint_name(o @ wo, "attn_out")
    h = checkpoint_name(jnp.tanh(x @ w1), "mlp_in")
    return x + checkpoint_name(h @ w2, "mlp_out"), None


def gpt_args(L=2):
    D, F = DIM, FF
    params = (1 + rnd(11, (L, D), 0.1),
              rnd(12, (L, D, D), D ** -0.5), rnd(13, (L, D, D), D ** -0.5),
              rnd(14, (L, D, D), D ** -0.5), rnd(15, (L, D, D), D ** -0.5),
              rnd(16, (L, D, F), D ** -0.5), rnd(17, (L, F, D), F ** -0.5))
    return rnd(10, (SEQ, D)), params


# ------------------------------------------------------ variants of the MLP --
def mlp2_layer(carry, p):
    """Two carries and a per-iteration output."""
    x, aux = carry
    y, _ = mlp_layer(x, p)
    z = checkpoint_name(jnp.cos(y), "z")
    return (y, aux + jnp.sum(z * x, axis=0)), checkpoint_name(jnp.sin(z), "ys")


def nested_layer(x, p):
    """The layer runs an inner scan over its own stacked axis."""
    Ws, b = p     # Ws: [K, d, d]

    def inner(h, W):
        return checkpoint_name(jnp.tanh(checkpoint_name(h @ W, "pre") + b), "act"), None
    return x + lax.scan(inner, x, Ws)[0], None


def nested_args():
    L, K, d = 2, 3, 4
    return rnd(33, (2, d)), (rnd(31, (L, K, d, d), 1 / np.sqrt(d)), rnd(32, (L, d), 0.1))


def _scan_fn(layer, **scan_kw):
    def build(wrap):
        def f(x, p):
            return lax.scan(wrap(layer), x, p, **scan_kw)[0]
        return f
    return build


def _carries_ys(wrap):
    def f(x, p):
        (y, aux), ys = lax.scan(wrap(mlp2_layer), (x, jnp.zeros(x.shape[-1])), p)
        return y, aux, ys
    return f


def _loop(layer, reverse=False):
    """The unscanned model: a Python loop over the layers."""
    def f(x, p):
        n = leaves(p)[0].shape[0]
        for i in (reversed(range(n)) if reverse else range(n)):
            x, _ = layer(x, _layer_slice(p, i))
        return x
    return f


def _loop_carries_ys(x, p):
    carry, ys = (x, jnp.zeros(x.shape[-1])), []
    for i in range(leaves(p)[0].shape[0]):
        carry, y = mlp2_layer(carry, _layer_slice(p, i))
        ys.append(y)
    return carry[0], carry[1], jnp.stack(ys)


def _nested_loop(x, p):
    Ws, bs = p
    for i in range(Ws.shape[0]):
        h = x
        for j in range(Ws.shape[1]):
            h = jnp.tanh(h @ Ws[i, j] + bs[i])
        x = x + h
    return x


# The data-dependent loop: a lax.while_loop whose trip count depends on x (on
# a stop_gradient'ed value, so reverse mode needs only its result), next to a
# scan over layers. The while_loop cannot be a scan: it must stay atomic.
def _count_steps(x):
    def cond(c):
        return c[1] < 3.0

    def body(c):
        return c[0] + 1.0, c[1] + jnp.abs(c[0]) + 0.5
    return lax.while_loop(cond, body, (lax.stop_gradient(jnp.sum(x)), jnp.float32(0.0)))[0]


def _with_while(wrap):
    # Only the layer is wrapped. JAX saves the while_loop's result even under
    # jax.checkpoint(nothing_saveable) (its inputs are stop_gradient'ed, so no
    # tangent flows through it and partial eval never reaches the remat),
    # whereas a module policy recomputes the atomic loop. So residual parity
    # for this model is checked in region form only (rp.checkpoint around the
    # layer, no module policy: the while_loop's result is saved by both).
    def f(x, p):
        return lax.scan(wrap(mlp_layer), x, p)[0] * _count_steps(x)
    return f


def _loop_with_while(x, p):
    return _loop(mlp_layer)(x, p) * _count_steps(x)


# name: (build(wrap) -> f(x, p), unscanned reference, make_args)
MODELS = {
    "mlp": (_scan_fn(mlp_layer), _loop(mlp_layer), mlp_args),
    "gpt": (_scan_fn(gpt_layer), _loop(gpt_layer), gpt_args),
    "reverse": (_scan_fn(mlp_layer, reverse=True), _loop(mlp_layer, reverse=True), mlp_args),
    "carries_ys": (_carries_ys, _loop_carries_ys, mlp_args),
    "unroll2": (_scan_fn(mlp_layer, unroll=2), _loop(mlp_layer), lambda: mlp_args(L=4)),
    "nested": (_scan_fn(nested_layer), _nested_loop, nested_args),
    "while_loop": (_with_while, _loop_with_while, mlp_args),
}
MAIN_MODELS = ["mlp", "gpt"]
VARIANTS = ["reverse", "carries_ys", "unroll2", "nested", "while_loop"]


def _plain(layer):
    return layer


# ---------------------------------------------------------------- policies --
NAMES_SAVE = ("act", "query_proj", "mlp_in", "z")
# save_anything_except_these_names saves the value right before an excluded
# marker instead of the marker's output, so its residual *types* equal those of
# 'none' here (the parity test passes with the loop untouched as well); it is
# kept because a pass that recomputes more than the policy says still fails it.
# ('act' is not excluded: JAX then saves the tanh output twice, see
# test_remat_numerics.PARITY_SKIPS.)
NAMES_EXCLUDE = ("pre", "key_proj", "attn_out")


def custom_policy(info):
    """A user callable (no JAX counterpart: gradients only)."""
    if info.checkpoint_name in ("act", "value_proj"):
        return Saveable
    if info.checkpoint_name is not None:
        return Offloadable("device", "pinned_host")
    if info.name == "stablehlo.tanh":
        return Recompute
    return info.name == "stablehlo.dot_general"


def _policies(ns):
    """The policy set of test_remat_numerics, with this file's names, in `ns`
    (rp.policies or jax.checkpoint_policies: same names, same arguments)."""
    return {
        "everything_saveable": lambda: ns.everything_saveable,
        "nothing_saveable": lambda: ns.nothing_saveable,
        "dots_saveable": lambda: ns.dots_saveable,
        "dots_with_no_batch_dims_saveable": lambda: ns.dots_with_no_batch_dims_saveable,
        "offload_dot_with_no_batch_dims":
            lambda: ns.offload_dot_with_no_batch_dims("device", "pinned_host"),
        "save_anything_except_these_names":
            lambda: ns.save_anything_except_these_names(*NAMES_EXCLUDE),
        "save_any_names_but_these": lambda: ns.save_any_names_but_these(*NAMES_EXCLUDE),
        "save_only_these_names": lambda: ns.save_only_these_names(*NAMES_SAVE),
        "save_from_both_policies":
            lambda: ns.save_from_both_policies(ns.dots_with_no_batch_dims_saveable,
                                               ns.save_only_these_names("act", "mlp_in")),
        "save_and_offload_only_these_names":
            lambda: ns.save_and_offload_only_these_names(
                names_which_can_be_saved=["pre", "query_proj", "z"],
                names_which_can_be_offloaded=["act", "key_proj", "mlp_in"],
                offload_src="device", offload_dst="pinned_host"),
    }


OUR_POLICIES = {"none": lambda: None, **_policies(P), "custom_callable": lambda: custom_policy}
JAX_POLICIES = {"none": lambda: None, **_policies(JP)}
PARITY_POLICIES = list(JAX_POLICIES)
VARIANT_POLICIES = ["none", "nothing_saveable", "dots_saveable", "save_only_these_names"]


def _jax_wrap(policy_name):
    """scan(jax.checkpoint(layer, policy)); 'none': the layer as written.

    A new jax.checkpoint object per call: JAX caches checkpoint traces per
    function object."""
    if policy_name == "none":
        return _plain
    return lambda layer: jax.checkpoint(layer, policy=JAX_POLICIES[policy_name]())


def _region_wrap(policy_name):
    return lambda layer: rp.checkpoint(layer, policy=OUR_POLICIES[policy_name]())


# ------------------------------------------------------ exported once each --
class Case:
    """One model exported once (module policy form, or with its layer in an
    rp.checkpoint region); jax.vjp of its unscanned twin on first use."""

    def __init__(self, name, region_policy=None):
        build, _, make_args = MODELS[name]
        self.name = name
        self.args = make_args()
        wrap = _plain if region_policy is None else _region_wrap(region_policy)
        self.module = rp.export_vjp(build(wrap), *self.args)

    @property
    def ct(self):
        return _reference(self.name)[0]

    @property
    def expected(self):
        return _reference(self.name)[1]

    @property
    def n_out(self):
        return _reference(self.name)[2]


@functools.lru_cache(maxsize=None)
def case(name, region_policy=None) -> Case:
    return Case(name, region_policy)


@functools.lru_cache(maxsize=None)
def _reference(name):
    """(cotangent, outputs + grads, number of outputs) of jax.vjp of the unscanned
    model at a random cotangent; shared by all forms of the model (same args).
    Jitted: the unscanned GPT run op by op would dominate the test time."""
    _, unscanned, make_args = MODELS[name]
    out, ct, grads = reference_vjp(jax.jit(unscanned), make_args())
    return ct, leaves(out) + leaves(grads), len(leaves(out))


def _joint(c: Case, module):
    return run_joint_cached(module, c.args, c.ct)


def _split(c: Case, module):
    return run_split_cached(module, c.args, c.ct, c.n_out)


def _jax_bytes(fun, *args) -> int:
    return sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize
               for a, _ in jax_saved_residuals(fun, *args))


def _assert_parity(ours, name, policy_name, context):
    """Our residual types and total bytes equal JAX's for scan(jax.checkpoint(layer))."""
    c = case(name)
    jax_fun = MODELS[name][0](_jax_wrap(policy_name))
    if name != "unroll2":
        # An unrolled scan stacks [N/k, k, ...] blocks (or one [N/k, ...] buffer per
        # sub-step) where JAX reports [N, ...]: the same bytes in another layout.
        assert_same_residual_types(ours, jax_fun, *c.args, context=context)
    assert sum(r.bytes for r in ours) == _jax_bytes(jax_fun, *c.args), context


# ---------------------------------------- 2. residual parity: module policy --
@pytest.mark.parametrize("policy", PARITY_POLICIES)
@pytest.mark.parametrize("model", MAIN_MODELS)
def test_module_policy_residuals_match_jax_scan(model, policy):
    ours = rp.remat(case(model).module, OUR_POLICIES[policy]()).residuals
    _assert_parity(ours, model, policy, f"{model}/{policy}")


def test_stacked_residuals_are_reported_with_stacked_types():
    """everything_saveable on the MLP scan: each saved per-iteration value is
    one residual of type f32[L, ...], not L residuals."""
    c = case("mlp")
    L = c.args[1][0].shape[0]
    res = rp.remat(c.module, P.everything_saveable).residuals
    stacked = [r for r in res if not r.description.startswith("from the argument")]
    assert stacked, [str(r) for r in res]
    assert all(r.type.startswith(f"f32[{L},") for r in stacked), [str(r) for r in res]


# --------------------------------------------- 3. residual parity: regions --
@pytest.mark.parametrize("policy", [p for p in PARITY_POLICIES if p != "none"])
@pytest.mark.parametrize("model", MAIN_MODELS)
def test_region_residuals_match_jax_scan(model, policy):
    """scan(rp.checkpoint(layer, policy)) with no module policy."""
    ours = rp.remat(case(model, policy).module, None).residuals
    _assert_parity(ours, model, policy, f"{model}/region {policy}")


# ---------------------------------------------------- 4. gradients --------
def _check_gradients(c: Case, policy, what):
    joint = rp.remat(c.module, policy)
    joint.verify()
    assert_trees_close(_joint(c, joint), c.expected, what=f"{what} joint")
    split = rp.remat(c.module, policy, mode="split")
    split.verify()
    assert {"main_fwd", "main_bwd"} <= set(split.functions())
    got, residuals = _split(c, split)
    assert_trees_close(got, c.expected, what=f"{what} split")
    # main_fwd returns exactly the residuals partial-eval reports, in order
    assert [(str(np.dtype(r.dtype)), list(r.shape)) for r in residuals] == \
        [_np_type(r.type) for r in split.residuals], what
    assert sum(np.asarray(r).nbytes for r in residuals) == \
        sum(r.bytes for r in split.residuals), what


def _np_type(t: str):
    head, _, rest = t.partition("[")
    dims = [int(d) for d in rest.rstrip("]").split(",") if d]
    return {"f32": "float32", "i32": "int32", "bool": "bool"}.get(head, head), dims


# Compiling the GPT module takes ~1.5 s per form on CPU, so it gets two
# policies (recompute everything; names saved, offloaded, the rest recomputed)
# and one region case below; the MLP covers every policy.
GRADIENT_CASES = [("mlp", p) for p in OUR_POLICIES] + [
    ("gpt", p) for p in ("nothing_saveable", "save_and_offload_only_these_names")]


@pytest.mark.parametrize("model,policy", GRADIENT_CASES)
def test_gradients_match_unscanned_vjp(model, policy):
    _check_gradients(case(model), OUR_POLICIES[policy](), f"{model}/{policy}")


@pytest.mark.parametrize("model,policy", [
    ("mlp", "nothing_saveable"), ("mlp", "dots_saveable"),
    ("mlp", "save_and_offload_only_these_names"), ("gpt", "save_only_these_names")])
def test_region_gradients_match_unscanned_vjp(model, policy):
    _check_gradients(case(model, policy), None, f"{model}/region {policy}")


# ------------------------------------------------------ 5. variants -------
def _variant_params(region=False):
    models = VARIANTS if region else [m for m in VARIANTS if m != "while_loop"]
    policies = [p for p in VARIANT_POLICIES if p != "none"] if region else VARIANT_POLICIES
    return [(m, p) for m in models for p in policies]



@pytest.mark.parametrize("model,policy", _variant_params())
def test_variant_residuals_match_jax_scan(model, policy):
    ours = rp.remat(case(model).module, OUR_POLICIES[policy]()).residuals
    _assert_parity(ours, model, policy, f"{model}/{policy}")


@pytest.mark.parametrize("model,policy", [(m, "nothing_saveable") for m in VARIANTS] + [
    ("carries_ys", "save_only_these_names"), ("nested", "save_only_these_names")])
def test_variant_gradients_match_unscanned_vjp(model, policy):
    _check_gradients(case(model), OUR_POLICIES[policy](), f"{model}/{policy}")


@pytest.mark.parametrize("model,policy", _variant_params(region=True))
def test_variant_region_residuals_match_jax_scan(model, policy):
    ours = rp.remat(case(model, policy).module, None).residuals
    _assert_parity(ours, model, policy, f"{model}/region {policy}")


@pytest.mark.parametrize("model", ["nested", "carries_ys", "while_loop"])
def test_variant_region_gradients_match_unscanned_vjp(model):
    _check_gradients(case(model, "dots_saveable"), None, f"{model}/region dots_saveable")


def _remarks(module, policy: str) -> list[str]:
    """The remarks remat-partial-eval leaves for the user (remat-opt
    --print-saved-residuals prints them too)."""
    return rp.remat(module, policy).remarks


def _is_atomic_remark(text: str) -> bool:
    return "while" in text.lower() and "atomic" in text.lower()


def test_while_loop_is_atomic_with_a_remark():
    """A data-dependent while_loop is not a scan: it stays one op (saved or
    recomputed whole) and the user is told so."""
    remarks = _remarks(case("while_loop").module, "nothing_saveable")
    assert any(_is_atomic_remark(r) for r in remarks), remarks


def test_an_atomic_scan_that_leaves_steps_out_says_how_to_export_it():
    """A module exported by plain `jax.export` keeps JAX's lowering of a scan whose unroll
    does not divide its length (stacks concatenated with the peeled steps'): its loop stays
    atomic, and the remark says what it is and that rp's exports pair it; the
    data-dependent while_loop's remark does not."""
    def joint(Ws, x):
        def loss(Ws, x):
            return jnp.sum(lax.scan(lambda h, W: (jnp.tanh(h @ W), None), x, Ws,
                                    unroll=2)[0] ** 2)
        y, vjp_fn = jax.vjp(loss, Ws, x)
        return y, vjp_fn(jnp.ones(()))
    Ws, x = jnp.ones((5, 16, 16)) * 0.1, jnp.ones((4, 16))
    with rp.names_as_markers():
        module = rp.from_exported(jax.export.export(jax.jit(joint))(Ws, x))
    remarks = rp.remat(module, "nothing_saveable").remarks
    assert any(_is_atomic_remark(r) and "unroll does not divide" in r for r in remarks), remarks
    while_remarks = _remarks(case("while_loop").module, "nothing_saveable")
    assert not any("unroll" in r for r in while_remarks), while_remarks


@pytest.mark.parametrize("model", ["mlp", "gpt", "nested"])
def test_scans_get_no_atomic_loop_remark(model):
    """A scan is remat per iteration, so no remark may say it is kept atomic."""
    remarks = _remarks(case(model).module, "nothing_saveable")
    assert not any(_is_atomic_remark(r) for r in remarks), remarks


def test_while_loop_is_recomputed_whole():
    """nothing_saveable next to a while_loop: its result (a scalar the backward
    multiplies by) is not saved; the atomic loop gets the Recompute verdict and
    is cloned into the backward whole, from the saved argument (DESIGN.md 4)."""
    c = case("while_loop")
    res = rp.remat(c.module, P.nothing_saveable).residuals
    assert not any(r.type == "f32[]" for r in res), [str(r) for r in res]


# --------------------------------------- 6. structure, not trusting the pass --
def _functions(ir_module) -> dict:
    return {mlir.ir.StringAttr(op.operation.attributes["sym_name"]).value: op.operation
            for op in ir_module.body.operations if op.operation.name == "func.func"}


def _count_ops(op, name, funcs, _seen=()) -> int:
    """Ops called `name` nested anywhere under `op`, following func.call."""
    n = 0
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                inner = inner.operation
                if inner.name == name:
                    n += 1
                if inner.name == "func.call":
                    callee = mlir.ir.FlatSymbolRefAttr(inner.attributes["callee"]).value
                    if callee not in _seen:
                        n += _count_ops(funcs[callee], name, funcs, _seen + (callee,))
                n += _count_ops(inner, name, funcs, _seen)
    return n


def _top_level_whiles(ir_module):
    main = _functions(ir_module)["main"]
    return [op.operation for op in main.regions[0].blocks[0].operations
            if op.operation.name == "stablehlo.while"]


def _stacked_buffers(while_op, L) -> int:
    """Loop-carried values of shape [L, ...] that the body writes (a stacked
    per-iteration buffer), as opposed to ones passed through unchanged."""
    body = while_op.regions[1].blocks[0]
    yielded = list(body.operations)[-1].operation.operands
    n = 0
    for arg, new in zip(body.arguments, yielded):
        shape = arg.type.shape if hasattr(arg.type, "shape") else []
        if len(shape) >= 2 and shape[0] == L and new != arg:
            n += 1
    return n


def _loop_structure(module, L):
    ir_module = parse_text(str(module))
    funcs = _functions(ir_module)
    whiles = _top_level_whiles(ir_module)
    fwd, bwd = whiles[0], whiles[-1]
    return (len(whiles), _stacked_buffers(fwd, L),
            _count_ops(bwd, "stablehlo.dot_general", funcs),
            _count_ops(fwd, "stablehlo.dot_general", funcs))


def test_nothing_saveable_stacks_less_and_recomputes_in_the_backward_loop():
    c = case("mlp")
    L = c.args[1][0].shape[0]
    n_in, stacked_in, bwd_dots_in, fwd_dots_in = _loop_structure(c.module, L)
    assert n_in == 2 and stacked_in >= 2, "unexpected export of lax.scan"
    out = rp.remat(c.module, P.nothing_saveable, prevent_cse=False)
    n_out, stacked_out, bwd_dots_out, fwd_dots_out = _loop_structure(out, L)
    assert n_out == n_in, f"{n_out} top-level while loops (a whole-loop clone?), expected {n_in}"
    assert stacked_out < stacked_in, \
        f"forward loop stacks {stacked_out} buffers, the input's stacked {stacked_in}"
    assert fwd_dots_out == fwd_dots_in
    # x @ W is recomputed inside the backward loop body
    assert bwd_dots_out > bwd_dots_in, \
        f"backward loop body has {bwd_dots_out} dot_general, the input's had {bwd_dots_in}"


# ------------------------------------------------ barriers inside loops ---
def _barriers_in_while_bodies(ir_module) -> int:
    count = [0]

    def visit(op):
        if op.name == "stablehlo.optimization_barrier" and op.parent is not None \
                and op.parent.name == "stablehlo.while":
            count[0] += 1
        return ir.WalkResult.ADVANCE
    ir_module.operation.walk(visit)
    return count[0]


@pytest.mark.parametrize("mode", ["joint", "split"])
def test_barriers_inside_loops_only_on_request(mode):
    """prevent_cse defaults to JAX's advice inside scans (no barriers in loop bodies);
    prevent_cse_in_loops=True places them, and the gradients stay the same."""
    c = case("mlp")
    default = rp.remat(c.module, OUR_POLICIES["nothing_saveable"](), mode=mode)
    barred = rp.remat(c.module, OUR_POLICIES["nothing_saveable"](), mode=mode,
                      prevent_cse_in_loops=True)
    barred.verify()
    assert _barriers_in_while_bodies(default.op) == 0
    assert _barriers_in_while_bodies(barred.op) > 0
    got = _joint(c, barred) if mode == "joint" else _split(c, barred)[0]
    assert_trees_close(got, c.expected, what=f"mlp/barriers in loops {mode}")


# --------------------------------------------------- constants of the loops ---
def _masked_scan(ws, x):
    """Layers that each mask a [batch, T, T] product causally (the mask built in the body,
    as a decoder builds it), scanned."""
    T = x.shape[1]

    def layer(h, w):
        s = jnp.einsum("btd,bsd->bts", h @ w, h)
        s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -1e9)
        return h + jax.nn.softmax(s, axis=-1) @ h, None
    return jnp.sum(lax.scan(layer, x, ws)[0] ** 2)


def _temps(split, args) -> list[int]:
    fwd = rp.compile(split, "main_fwd").lower(*args).compile()
    res = fwd(*args)
    bwd = rp.compile(split, "main_bwd").lower(*res[1:], jnp.ones_like(res[0])).compile()
    return [int(c.memory_analysis().temp_size_in_bytes) for c in (fwd, bwd)]


def test_constants_the_loops_carry_are_built_inside_them():
    """sink-loop-constants: JAX's partial eval builds the causal mask once, before the
    loops, and our split (which saves no constant) built it again before the backward loop,
    holding a [batch, T, T] buffer through it. With the pass each loop builds its own:
    XLA:CPU's temp of each half is smaller than without it and at most JAX's split's + 2%
    (JAX saves the mask), and the gradients are jax.vjp's."""
    from remat_passes.passes.remat import Remat
    from tools.benchmarks.xla_memory import jax_halves
    kw, kx = jax.random.split(jax.random.PRNGKey(0))
    args = (jax.random.normal(kw, (3, 32, 32)) / 8, jax.random.normal(kx, (8, 64, 32)))
    module = rp.export_vjp(_masked_scan, *args)
    split = rp.remat(module, None, mode="split")
    _, ct, grads = reference_vjp(_masked_scan, args)
    got, _ = run_split(split, args, ct, 1)
    assert_trees_close(got[1:], leaves(grads), what="gradients")
    without = module.clone()
    rp.run_pipeline(without.op, [p for p in Remat(mode="split").expand()
                                 if p.name != "sink-loop-constants"])
    ours, before = _temps(split, args), _temps(without, args)
    jax_temps = [h["temp"] for h in jax_halves(_masked_scan, args)]
    # the broadcast pred[8, 64, 64] is gone; XLA hoists the pred[64, 64] it is made of
    assert before[1] - ours[1] >= 8 * 64 * 64 - 64 * 64, (ours, before)
    assert ours[0] < before[0], (ours, before)
    # (JAX's backward reads the saved mask; ours holds the hoisted pred[64, 64], 0.6% more)
    assert all(o <= j * 1.02 for o, j in zip(ours, jax_temps)), (ours, jax_temps)


def test_a_large_literal_stays_outside_the_loop():
    """sink-loop-constants copies a dense constant into the loop only where it is a splat or
    at most MAX_LITERAL_BYTES: the module does not grow by copies of large literals."""
    from remat_passes.passes.sink_loop_constants import MAX_LITERAL_BYTES

    def program(n):
        values = ", ".join(f"{k}.5" for k in range(n))
        return f"""
    func.func @main(%arg0: tensor<{n}xf32>) -> tensor<{n}xf32> {{
      %0 = stablehlo.constant dense<[{values}]> : tensor<{n}xf32>
      %c = stablehlo.constant dense<0> : tensor<i32>
      %r:3 = stablehlo.while(%i = %c, %h = %arg0, %v = %0) : tensor<i32>, tensor<{n}xf32>, tensor<{n}xf32>
      cond {{
        %k = stablehlo.constant dense<3> : tensor<i32>
        %p = stablehlo.compare LT, %i, %k : (tensor<i32>, tensor<i32>) -> tensor<i1>
        stablehlo.return %p : tensor<i1>
      }} do {{
        %s = stablehlo.multiply %h, %v : tensor<{n}xf32>
        %one = stablehlo.constant dense<1> : tensor<i32>
        %j = stablehlo.add %i, %one : tensor<i32>
        stablehlo.return %j, %s, %v : tensor<i32>, tensor<{n}xf32>, tensor<{n}xf32>
      }}
      return %r#1 : tensor<{n}xf32>
    }}"""
    small, large = MAX_LITERAL_BYTES // 4, MAX_LITERAL_BYTES // 4 + 1
    for n, copied in ((small, True), (large, False)):
        module = rp.Module.parse(program(n))
        rp.run_pipeline(module.op, rp.parse_pipeline("sink-loop-constants"))
        literals = [line for line in str(module).splitlines()
                    if "stablehlo.constant" in line and f"tensor<{n}xf32>" in line]
        assert len(literals) == (2 if copied else 1), n
        np.testing.assert_allclose(np.asarray(module.call(np.ones(n, np.float32))),
                                   (np.arange(n) + 0.5) ** 3, rtol=1e-6)


# --------------------------------------------------------------- complex values --
def _complex_step(where):
    """A loss over complex64 weights whose scan carries, cond branches or scan segments
    hold complex values: the rewrites then make zero constants of a complex type (a
    stacked buffer's start, a cond slot another branch fills, a segment's carries)."""
    w = (rnd(0, (4, 4), 0.4) + 1j * rnd(1, (4, 4), 0.4)).astype(jnp.complex64)
    x = (rnd(2, (2, 4)) + 1j * rnd(3, (2, 4))).astype(jnp.complex64)

    def loss(w):
        def layer(c, _):
            return jnp.sin(c @ w) * 0.5 + c, None
        if where == "cond":
            h = lax.cond(jnp.real(x[0, 0]) > 0, lambda h: jnp.sin(h @ w), jnp.cos, x)
        else:
            h, _ = lax.scan(layer, x, None, length=4)
        return jnp.mean(jnp.abs(h) ** 2)
    return (lambda w: jax.value_and_grad(loss)(w)), w


@pytest.mark.parametrize("where,options", [
    ("scan", {}), ("scan", {"scan_segments": 2}), ("cond", {})])
@pytest.mark.parametrize("mode", ["joint", "split"])
def test_complex_values_in_regions(where, options, mode):
    step, w = _complex_step(where)
    want = jax.jit(step)(w)
    for policy in ("dots_saveable", "nothing_saveable"):
        got = rp.jit(step, policy=policy, mode=mode, **options)(w)
        assert_trees_close(got, want, what=f"{where} {options} {policy} {mode}")


@pytest.mark.parametrize("mode", ["joint", "split"])
@pytest.mark.parametrize("policy", ["nothing_saveable", "everything_saveable"])
def test_a_complex_constant_the_loop_reads(policy, mode):
    """A loop that reads a complex literal (a rotary embedding's `exp(1j * f)`, as
    MaxText's DeepSeek YaRN computes it): the MLIR bindings have no class for a complex
    literal's elements and raised "Can't cast unknown element type" where sink-loop-constants
    read it; the gradients are jax.grad's."""
    def loss(w, x):
        rot = jnp.exp(1j * jnp.arange(4.0, dtype=jnp.float32))
        def body(h, _):
            h = jnp.tanh(h @ w)
            hc = h.astype(jnp.complex64) * rot
            return jnp.real(hc * jnp.conj(hc)) + h, None
        h, _ = lax.scan(body, x, None, length=3)
        return jnp.sum(h)
    w, x = jnp.ones((4, 4)) * 0.1, jnp.ones((2, 4))
    module = rp.export_vjp(loss, w, x)
    assert "complex<f32>" in module.text()
    out = rp.remat(module, policy, mode=mode)
    if mode == "joint":
        got = out.call(w, x, jnp.ones(()))[1:]
    else:
        fwd = out.call(w, x, function="main_fwd")
        got = out.call(*fwd[1:], jnp.ones(()), function="main_bwd")
    assert_trees_close(list(got), list(jax.grad(loss, argnums=(0, 1))(w, x)), rtol=1e-6)


# ---------------------------------- a scan unrolled whole around checkpointed scans --
def _nested_remat_loss(outer_remat: bool):
    """haliax's nested remat (`ScanCheckpointPolicy(nested=True)`, `multilevel_scan`): the
    layers in blocks, an outer `lax.scan(..., unroll=True)` over the blocks whose body is
    (with `outer_remat`, `jax.remat` of) an inner scan of `jax.checkpoint(layer,
    save_only_these_names('carry'))`."""
    policy = jax.checkpoint_policies.save_only_these_names("carry")

    def layer(h, W):
        h = checkpoint_name(h, "carry")
        return jnp.tanh(jnp.sin(h @ W) @ W) + h, None

    def loss(Ws, x):
        inner = functools.partial(lax.scan, jax.checkpoint(layer, policy=policy))
        body = jax.remat(inner) if outer_remat else inner
        h, _ = lax.scan(body, x, Ws.reshape(2, 2, 16, 16), unroll=True)
        return jnp.sum(h ** 2)
    return loss


@pytest.mark.parametrize("mode", ["joint", "split"])
@pytest.mark.parametrize("outer_remat", [False, True], ids=["scan", "remat"])
def test_inner_scans_of_a_scan_unrolled_whole_pair(outer_remat, mode):
    """Under `jax_checkpoint="regions"` the inner scans' regions apply per iteration: an
    unrolled outer scan stacks its steps' inner stacks with concatenates that its transpose
    slices apart, and the backward loops now read the forward loops' stacks through them
    (before: 12,800 B kept, every inner value). The bytes kept are those JAX keeps for the
    model with its checkpoints applied (the backward loops read the blocks of weights the
    forward loops read, not a second copy). With the outer remat, each step of the unrolled
    scan is a region of its own (`unrolled_scans`), so the second block's input carry is
    kept, as JAX keeps it (before: recomputed from the first block, 7,168 B kept against
    JAX's 5,632 B); gradients jax.vjp's, both forms."""
    loss = _nested_remat_loss(outer_remat)
    Ws = jnp.asarray(np.random.default_rng(0).normal(size=(4, 16, 16)) * 0.3, jnp.float32)
    x = jnp.ones((8, 16))
    module = rp.export_vjp(loss, Ws, x, jax_checkpoint="regions")
    out = rp.remat(module, mode=mode)
    assert sum(r.bytes for r in out.residuals) == sum(
        int(np.prod(a.shape)) * a.dtype.itemsize for a, _ in jax_saved_residuals(loss, Ws, x))
    ct = jnp.ones(())
    y, vjp_fn = jax.vjp(loss, Ws, x)
    got = (run_joint_cached(out, (Ws, x), ct) if mode == "joint"
           else run_split(out, (Ws, x), ct, 1)[0])
    assert_trees_close(got, leaves((y, vjp_fn(ct))))


# ------------------------------------------ checkpoints in the steps of an unrolled scan --
def _unrolled_loss(unroll, reverse: bool, spelling: str, policy):
    """`lax.scan` of a checkpointed layer with `unroll` steps to an iteration (True: the
    scan unrolled whole), the checkpoint spelled `jax.checkpoint` (exported as regions) or
    `rp.checkpoint`, or none (a module policy decides)."""
    def layer(h, W):
        h = checkpoint_name(h, "carry")
        return jnp.tanh(jnp.sin(h @ W) @ W) + h, jnp.sum(h)
    checkpoint = {"jax": jax.checkpoint, "rp": rp.checkpoint,
                  "none": lambda f, policy: f}[spelling]

    def loss(Ws, x):
        h, ys = lax.scan(checkpoint(layer, policy=policy), x, Ws, unroll=unroll,
                         reverse=reverse)
        return jnp.sum(h ** 2) + jnp.sum(ys)
    return loss


@pytest.mark.parametrize("spelling", ["jax", "rp"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("unroll", [2, 3, True], ids=["unroll2", "unroll3", "whole"])
def test_checkpoints_in_the_steps_of_an_unrolled_scan(unroll, reverse, spelling):
    """Each step of an unrolled scan keeps what its own `jax.checkpoint` keeps, as JAX does:
    the steps are differentiated written out (`unrolled_scans`), each step's region its own
    scope, and a value one step's region hands the next is an input of a region, kept.
    Before, the steps shared one region (JAX traces the body once): unrolled whole, or
    with 3 steps to an iteration of 4 (the last step peeled), every step's values were kept
    (12,800 B against JAX's 6,656 under nothing_saveable); with 2 to an iteration, the
    second step's input was recomputed from the first's (5,632 B). Four 16-wide layers,
    three policies, both forms; gradients jax.vjp's, the scanned-over weights sliced again
    in the backward and not kept."""
    names = jax.checkpoint_policies
    Ws = jnp.asarray(np.random.default_rng(0).normal(size=(4, 16, 16)) * 0.3, jnp.float32)
    x = jnp.ones((8, 16))
    ct = jnp.ones(())
    for policy in (None, names.save_only_these_names("carry"), names.dots_saveable):
        loss = _unrolled_loss(unroll, reverse, spelling, policy)
        jax_loss = _unrolled_loss(unroll, reverse, "jax", policy)
        theirs = jax_saved_residuals(jax_loss, Ws, x)
        want_bytes = sum(int(np.prod(a.shape)) * a.dtype.itemsize for a, _ in theirs)
        want_activations = sum(int(np.prod(a.shape)) * a.dtype.itemsize
                               for a, source in theirs if "from the argument" not in source)
        module = rp.export_vjp(loss, Ws, x, jax_checkpoint="regions")
        y, vjp_fn = jax.vjp(jax_loss, Ws, x)
        want = leaves((y, vjp_fn(ct)))
        for mode in ("joint", "split"):
            out = rp.remat(module, mode=mode)
            what = f"{policy} {mode}"
            assert sum(r.bytes for r in out.residuals) == want_bytes, what
            # the weights' slices are not kept (an unrolled scan's first carry-in is the
            # argument itself here, where JAX stacks a copy of it with the others)
            assert sum(r.bytes for r in out.residuals if not r.argument) <= \
                want_activations, what
            got = (run_joint_cached(out, (Ws, x), ct) if mode == "joint"
                   else run_split(out, (Ws, x), ct, 1)[0])
            assert_trees_close(got, want, rtol=1e-5, what=what)


def test_an_unrolled_scan_with_no_checkpoint_keeps_jax_rule():
    """Only a scan with a region in its body is written out: one without keeps JAX's own
    differentiation (its loop and no `step[i]` frames), and a scan with one step to an
    iteration does too."""
    def loss(Ws, x, unroll, checkpoint):
        layer = lambda h, W: (jnp.tanh(h @ W), None)    # noqa: E731
        return jnp.sum(lax.scan(checkpoint(layer), x, Ws, unroll=unroll)[0])
    Ws, x = jnp.ones((4, 8, 8)) * 0.1, jnp.ones((2, 8))
    cases = {(2, "none"): False, (1, "rp"): False, (2, "rp"): True}
    for (unroll, spelling), written_out in cases.items():
        checkpoint = rp.checkpoint if spelling == "rp" else (lambda f: f)
        text = rp.export_vjp(functools.partial(loss, unroll=unroll, checkpoint=checkpoint),
                             Ws, x).text(debug_info=True)
        assert ("step[1]" in text) == written_out, (unroll, spelling)


def _jax_program_flops(loss, *args) -> float:
    """The FLOPs of JAX's own program of `loss` and its VJP (`jax.export`, not rp's)."""
    def joint(*a):
        out, vjp_fn = jax.vjp(loss, *a)
        return out, vjp_fn(jnp.ones_like(out))
    return flops.function_flops(rp.from_exported(jax.export.export(jax.jit(joint))(*args)),
                                "main")


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("unroll", [2, 3], ids=["unroll2", "unroll3"])
def test_an_unrolled_scan_that_leaves_steps_out_of_its_loop_pairs(unroll, reverse):
    """`unroll` not dividing the length (5 layers), no region in the body: a module policy
    decides per iteration, as `lax.scan(jax.checkpoint(layer, policy), unroll=k)` does.
    JAX's lowering peels the remaining steps and passes the stacks through concatenates
    and slices, which left the loop atomic and recomputed whole (dots_saveable: +26% of
    JAX's FLOPs); `unrolled_scans` differentiates the two scans it runs (unroll 2), or one
    scan of a step to an iteration where the loop would run once (unroll 3). No atomic remark,
    bytes at most JAX's (equal for the names policy, which keeps each step's carry-in),
    FLOPs within 0.5% of JAX's program, gradients jax.vjp's, both forms."""
    names = jax.checkpoint_policies
    Ws = jnp.asarray(np.random.default_rng(1).normal(size=(5, 16, 16)) * 0.3, jnp.float32)
    x = jnp.ones((8, 16))
    ct = jnp.ones(())
    module = rp.export_vjp(_unrolled_loss(unroll, reverse, "none", None), Ws, x)
    y, vjp_fn = jax.vjp(_unrolled_loss(unroll, reverse, "none", None), Ws, x)
    want = leaves((y, vjp_fn(ct)))
    for spec, policy in (("nothing_saveable", names.nothing_saveable),
                         ("save_only_these_names(carry)", names.save_only_these_names("carry")),
                         ("dots_saveable", names.dots_saveable)):
        jax_loss = _unrolled_loss(unroll, reverse, "jax", policy)
        jax_bytes = _jax_bytes(jax_loss, Ws, x)
        jax_flops = _jax_program_flops(jax_loss, Ws, x)
        for mode in ("joint", "split"):
            out = rp.remat(module, spec, mode=mode)
            what = f"{spec} {mode}"
            assert not any(_is_atomic_remark(r) for r in out.remarks), (what, out.remarks)
            ours = sum(r.bytes for r in out.residuals)
            assert ours <= jax_bytes and (ours == jax_bytes or "names" not in spec), \
                (what, ours, jax_bytes)
            count = (flops.function_flops(out, "main") if mode == "joint" else
                     flops.function_flops(out, "main_fwd") + flops.function_flops(out, "main_bwd"))
            assert count <= jax_flops * 1.005, (what, count, jax_flops)
            got = (run_joint_cached(out, (Ws, x), ct) if mode == "joint"
                   else run_split(out, (Ws, x), ct, 1)[0])
            assert_trees_close(got, want, rtol=1e-5, what=what)



@pytest.mark.parametrize("unroll", [2, 3], ids=["unroll2", "unroll3"])
def test_jax_checkpoints_in_a_scan_that_leaves_steps_out_keep_jax_residuals(unroll):
    """`jax.checkpoint` applied by JAX at export (`jax_checkpoint="jax"`) in the body of a
    scan whose unroll does not divide its length: the export differentiates the scan as two
    scans (or one, unroll 3 of 5), and JAX's rule inside each step still decides: with no
    policy of ours, the split form keeps what `jax.checkpoint` saves, to the byte, and the
    gradients are jax.vjp's."""
    names = jax.checkpoint_policies
    Ws = jnp.asarray(np.random.default_rng(2).normal(size=(5, 16, 16)) * 0.3, jnp.float32)
    x = jnp.ones((8, 16))
    ct = jnp.ones(())
    for policy in (names.nothing_saveable, names.save_only_these_names("carry"),
                   names.dots_saveable):
        loss = _unrolled_loss(unroll, False, "jax", policy)
        out = rp.remat(rp.export_vjp(loss, Ws, x), None, mode="split")
        assert sum(r.bytes for r in out.residuals) == _jax_bytes(loss, Ws, x), policy
        y, vjp_fn = jax.vjp(loss, Ws, x)
        assert_trees_close(run_split(out, (Ws, x), ct, 1)[0], leaves((y, vjp_fn(ct))),
                           rtol=1e-5, what=str(policy))
