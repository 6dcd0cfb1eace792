"""export_vjp: the joint VJP module against jax.vjp, its markers, and remat on it.

`export_vjp(f, *primals)` gives `@main(primals..., cotangents...) ->
(outputs..., primal cotangents...)`; calling it must equal `jax.vjp(f,
*primals)` followed by the VJP function on the same cotangents. Both
`remat_passes.checkpoint_name` and `jax.ad_checkpoint.checkpoint_name` become
`@remat.name` markers, only for the duration of the export.
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import checkpoint_name as jax_checkpoint_name

import remat_passes as rp
from remat_passes.ir import graph
from remat_passes.ir.mlir import ir
from remat_passes.jax import bridge as jax_bridge
from remat_passes.jax_compat import current_lowering, name_primitive
from remat_testlib import (LAYERED_ARGS, assert_same_residual_types, assert_trees_close,
                           checkpointed_layer, layered_loss, leaves, run_joint)

RTOL = 1e-5
ATOL = 1e-6

# ---------------------------------------------------------------- functions --
_rng = np.random.default_rng(0)


def _normal(*shape):
    return jnp.asarray(_rng.normal(size=shape), jnp.float32)


def mlp(params, x):
    for w, b in params:
        x = jnp.tanh(x @ w + b)
    return x


def convnet(w1, w2, x):
    dn = ("NCHW", "OIHW", "NCHW")
    y = jax.lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=dn)
    y = jax.nn.relu(y)
    y = jax.lax.conv_general_dilated(y, w2, (2, 2), "VALID", dimension_numbers=dn)
    return jnp.mean(jnp.tanh(y), axis=(2, 3))


def reductions(x):
    return jnp.sum(jnp.sin(x), axis=0) + jnp.max(x * x, axis=1).sum() * jnp.prod(jnp.cos(x[0]))


def sorting(x):
    return jnp.sort(jnp.sin(x) * x, axis=-1)[..., :3] * 2.0


def while_data_dependent(x):
    """A lax.while_loop whose trip count depends on the data (not differentiated
    through: its result scales x)."""
    def cond(c):
        return c[1] < 50.0

    def body(c):
        return c[0] + 1, c[1] * 2.0 + 1.0
    n, s = jax.lax.while_loop(cond, body, (0, jax.lax.stop_gradient(jnp.abs(x).sum())))
    return jnp.sin(x) * s / (n + 1).astype(jnp.float32)


def fori_dynamic(x):
    """fori_loop with a traced (non-static) trip count lowers to a while loop."""
    n = 2 + (jnp.abs(x).sum() > 1.0).astype(jnp.int32)
    scale = jax.lax.fori_loop(0, n, lambda i, c: c * 1.5 + 0.25, jnp.float32(1.0))
    return jnp.cos(x) * scale


def fori_static(x):
    """fori_loop with static bounds: differentiated through (while loops in both
    the forward and the backward)."""
    return jax.lax.fori_loop(0, 3, lambda i, c: jnp.sin(c) * c + 0.1, x)


def pytrees(d, lst, tup):
    return {"a": d["u"] * lst[0],
            "b": [jnp.sin(tup[0]) + lst[1].sum(), (d["v"] ** 2,)],
            "c": (jnp.tanh(tup[1] @ lst[1]),)}


CASES = {
    "mlp": (mlp, lambda: ([(_normal(4, 8), _normal(8)), (_normal(8, 3), _normal(3))],
                          _normal(5, 4))),
    "conv": (convnet, lambda: (_normal(4, 2, 3, 3) * 0.5, _normal(3, 4, 3, 3) * 0.5,
                               _normal(2, 2, 6, 6))),
    "reduce": (reductions, lambda: (_normal(4, 5),)),
    "sort": (sorting, lambda: (_normal(3, 6),)),
    "while": (while_data_dependent, lambda: (_normal(4, 5),)),
    "fori-dynamic": (fori_dynamic, lambda: (_normal(4, 5),)),
    "fori-static": (fori_static, lambda: (_normal(4, 5) * 0.5,)),
    "pytrees": (pytrees, lambda: ({"u": _normal(3), "v": _normal(2)},
                                  [_normal(3), _normal(2, 2)],
                                  (_normal(4), _normal(1, 2)))),
}


def cotangent_like(y):
    """Deterministic, non-uniform cotangents (ones would hide transposition bugs)."""
    return jax.tree_util.tree_map(
        lambda a: jnp.cos(jnp.arange(a.size, dtype=a.dtype).reshape(a.shape) + 0.3), y)


def reference(f, primals, ct):
    y, vjp = jax.vjp(f, *primals)
    return y, vjp(ct)


def flat(tree):
    return [np.asarray(a) for a in jax.tree_util.tree_leaves(tree)]


def assert_flat_close(got, want):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert np.shape(g) == np.shape(w), i
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=f"leaf {i}")


@pytest.fixture(scope="module")
def exported_cases():
    """name -> (f, primals, cotangent, module, reference); each exported once."""
    cache = {}

    def get(name):
        if name not in cache:
            f, make = CASES[name]
            primals = make()
            y = jax.eval_shape(f, *primals)
            ct = cotangent_like(jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), y))
            cache[name] = (f, primals, ct, rp.export_vjp(f, *primals), reference(f, primals, ct))
        return cache[name]
    return get


def func_op(module, name="main"):
    for op in module.op.body.operations:
        if op.operation.name == "func.func" and \
                ir.StringAttr(op.operation.attributes["sym_name"]).value == name:
            return op
    raise AssertionError(f"no @{name}")


def attr_names(module, which, name="main"):
    """[set of attribute names] per argument ('arg_attrs') or result ('res_attrs')."""
    op = func_op(module, name)
    attrs = op.operation.attributes
    fn_type = ir.FunctionType(ir.TypeAttr(attrs["function_type"]).value)
    count = len(fn_type.inputs if which == "arg_attrs" else fn_type.results)
    if which not in attrs:
        return [set() for _ in range(count)]
    out = []
    for d in ir.ArrayAttr(attrs[which]):
        d = ir.DictAttr(d)
        out.append({d[j].name for j in range(len(d))})
    assert len(out) == count
    return out


MARKER_RE = re.compile(
    r'stablehlo\.custom_call @remat\.name\(%[\w#]+\) \{backend_config = "([^"]*)"\}')

# ------------------------------------------------------------------ numerics --


@pytest.mark.parametrize("name", list(CASES))
def test_export_vjp_matches_jax_vjp(exported_cases, name):
    f, primals, ct, m, (y, grads) = exported_cases(name)
    got = m.call(*primals, ct)
    # The calling convention of the module is (outputs, primal cotangents) as trees.
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure((y, grads))
    assert_flat_close(flat(got), flat((y, grads)))


def test_export_vjp_loops_are_while_ops(exported_cases):
    """The loop cases really put stablehlo.while in the module (fwd and bwd for
    the differentiated loop), so the numerics above cover region ops."""
    assert str(exported_cases("while")[3]).count("stablehlo.while") >= 1
    assert str(exported_cases("fori-dynamic")[3]).count("stablehlo.while") >= 1
    assert str(exported_cases("fori-static")[3]).count("stablehlo.while") >= 2
    assert "stablehlo.sort" in str(exported_cases("sort")[3])
    assert "stablehlo.convolution" in str(exported_cases("conv")[3])
    assert "stablehlo.reduce" in str(exported_cases("reduce")[3])


@pytest.mark.parametrize("name", list(CASES))
def test_split_nothing_saveable_matches_jax_vjp(exported_cases, name):
    f, primals, ct, m, (y, grads) = exported_cases(name)
    s = rp.remat(m, "nothing_saveable", mode="split")
    # (private callees JAX emitted, e.g. @relu, may remain; they are inlined)
    assert {"main_fwd", "main_bwd"} <= set(s.functions())
    assert "main" not in s.functions()
    n_out = len(jax.tree_util.tree_leaves(y))
    fwd = s.call(*jax.tree_util.tree_leaves(primals), function="main_fwd")
    fwd = list(fwd) if isinstance(fwd, (tuple, list)) else [fwd]
    outs, residuals = fwd[:n_out], fwd[n_out:]
    assert len(residuals) == len(s.residuals)
    bwd = s.call(*residuals, *jax.tree_util.tree_leaves(ct), function="main_bwd")
    bwd = list(bwd) if isinstance(bwd, (tuple, list)) else [bwd]
    assert_flat_close([np.asarray(a) for a in outs + bwd], flat((y, grads)))


@pytest.mark.parametrize("name", ["mlp", "conv", "while", "fori-static"])
@pytest.mark.parametrize("policy", [None, "nothing_saveable", "dots_saveable"])
def test_remat_joint_matches_jax_vjp(exported_cases, name, policy):
    f, primals, ct, m, (y, grads) = exported_cases(name)
    r = rp.remat(m, policy)
    assert "main" in r.functions()
    assert_flat_close(flat(r.call(*primals, ct)), flat((y, grads)))


# ------------------------------------------------------------ cotangent args --


def test_cotangent_and_gradient_attributes_on_pytrees(exported_cases):
    f, primals, ct, m, (y, grads) = exported_cases("pytrees")
    n_primal = len(jax.tree_util.tree_leaves(primals))
    n_out = len(jax.tree_util.tree_leaves(y))
    args = attr_names(m, "arg_attrs")
    results = attr_names(m, "res_attrs")
    assert len(args) == n_primal + n_out
    assert len(results) == n_out + n_primal
    assert [("remat.cotangent" in a) for a in args] == [False] * n_primal + [True] * n_out
    assert [("remat.gradient" in r) for r in results] == [False] * n_out + [True] * n_primal
    assert not any("remat.gradient" in a for a in args)
    assert not any("remat.cotangent" in r for r in results)
    # Cotangent arguments have the output types, in the same order.
    fn_type = ir.FunctionType(ir.TypeAttr(func_op(m).operation.attributes["function_type"]).value)
    assert [str(t) for t in fn_type.inputs[n_primal:]] == [str(t) for t in fn_type.results[:n_out]]


def test_cotangent_attribute_single_output(exported_cases):
    f, primals, ct, m, _ = exported_cases("mlp")
    n_primal = len(jax.tree_util.tree_leaves(primals))
    args = attr_names(m, "arg_attrs")
    assert [i for i, a in enumerate(args) if "remat.cotangent" in a] == [n_primal]


def test_export_vjp_rejects_a_function_without_a_floating_point_output():
    with pytest.raises(rp.RematError, match="needs a floating-point output, got int32"):
        rp.export_vjp(lambda x: (x * 2).astype(jnp.int32), jnp.ones(3))


def test_an_integer_output_takes_no_cotangent():
    """A loss with an integer output beside (a count, as `has_aux` returns): cotangent
    arguments for the floating-point outputs alone, named as in the outputs' pytree; after
    remat-partial-eval the module's outputs and gradients are jax.vjp's (the count's
    cotangent a float0 zero)."""
    def loss(w, x):
        h = jnp.tanh(x @ w)
        return jnp.sum(h ** 2), {"count": jnp.sum(h > 0), "mean": jnp.mean(h)}
    w, x = jnp.linspace(-1, 1, 6).reshape(3, 2), jnp.ones((4, 3))
    m = rp.export_vjp(loss, w, x)
    args = attr_names(m, "arg_attrs")
    assert [i for i, a in enumerate(args) if "remat.cotangent" in a] == [2, 3]
    main = graph.find_func(m.op, "main")
    assert [graph.arg_name(main, i) for i in (2, 3)] == ["cotangent[0]", "cotangent[1]['mean']"]
    out, vjp_fn = jax.vjp(loss, w, x)
    ct = (jnp.float32(1.0), {"count": np.zeros((), jax.dtypes.float0),
                             "mean": jnp.float32(0.5)})
    rewritten = rp.remat(m, policy="nothing_saveable")
    assert_trees_close(leaves(rewritten.call(w, x, (ct[0], {"count": None,
                                                         "mean": ct[1]["mean"]}))),
                       leaves((out, vjp_fn(ct))))


# ---------------------------------------------------------- checkpoint names --


def named(x):
    a = rp.checkpoint_name(jnp.sin(x), "ours")
    b = jax_checkpoint_name(jnp.cos(a) * x, "theirs")
    return jnp.sum(a * b)


def test_both_checkpoint_names_become_markers():
    x = _normal(2, 3)
    m = rp.export_vjp(named, x)
    text = str(m)
    assert sorted(MARKER_RE.findall(text)) == ["ours", "theirs"]
    # The markers are identities: the module still computes jax.vjp's numbers.
    y, vjp = jax.vjp(named, x)
    assert_flat_close(flat(m.call(x, jnp.float32(0.7))), flat((y, vjp(jnp.float32(0.7)))))


def test_checkpoint_name_marker_on_the_named_value():
    """The marker's operand is the value that was named (here: the sine)."""
    def f(x):
        return jnp.sum(rp.checkpoint_name(jnp.sin(x), "s") * 3.0)
    text = str(rp.export_vjp(f, _normal(4)))
    m = re.search(r"(%\w+) = stablehlo\.sine .*\n(?:.*\n)*?.*custom_call @remat\.name\((%\w+)\)",
                  text)
    assert m and m.group(1) == m.group(2), text


def _lowers_marker(fn, *args):
    return "remat.name" in jax.jit(fn).lower(*args).as_text()


def test_lowering_restored_after_export():
    x = _normal(2, 3)
    before = current_lowering(name_primitive())
    # Positive control: with the marker lowering active, a fresh function lowers to it.
    with jax_bridge.names_as_markers():
        assert _lowers_marker(lambda v: jax_checkpoint_name(jnp.sin(v), "ctl") * 2, x)
    assert current_lowering(name_primitive()) is before

    rp.export_vjp(named, x)
    assert current_lowering(name_primitive()) is before
    # Fresh functions (never lowered before, so no cache can hide a leak).
    assert not _lowers_marker(lambda v: named(v) + 1.0, x)
    assert not _lowers_marker(lambda v: jax.grad(named)(v) * 2.0, x)
    assert not _lowers_marker(lambda v: rp.checkpoint_name(v * 3.0, "plain"), x)


def test_lowering_restored_when_export_raises():
    x = _normal(2, 3)
    before = current_lowering(name_primitive())

    def broken(v):
        jax_checkpoint_name(jnp.sin(v), "n")
        raise ValueError("boom in the model")
    with pytest.raises(ValueError, match="boom in the model"):
        rp.export_vjp(broken, x)
    assert current_lowering(name_primitive()) is before
    assert not _lowers_marker(lambda v: jax_checkpoint_name(jnp.cos(v), "after") * 5.0, x)

    def not_differentiable(v):
        a = jax_checkpoint_name(jnp.sin(v), "n")
        return jax.pure_callback(lambda t: t, jax.ShapeDtypeStruct(v.shape, v.dtype), a).sum()
    with pytest.raises(Exception):
        rp.export_vjp(not_differentiable, x)
    assert current_lowering(name_primitive()) is before
    assert not _lowers_marker(lambda v: jax_checkpoint_name(jnp.tan(v), "after2") * 5.0, x)


def test_markers_in_inner_jit_survive_earlier_plain_lowering():
    """An inner jitted function lowered before (without markers) still gets
    markers under export_vjp, and vice versa (no lowering-cache leaks)."""
    x = _normal(2, 3)
    inner = jax.jit(lambda v: jax_checkpoint_name(jnp.sin(v), "inner"))

    def f(v):
        return jnp.sum(inner(v) * v)
    assert not _lowers_marker(f, x)
    assert MARKER_RE.findall(str(rp.export_vjp(f, x))) == ["inner"]
    assert not _lowers_marker(lambda v: f(v) * 2.0, x)


@pytest.mark.parametrize("policy", ["save_only_these_names(ours)", "nothing_saveable",
                                    "save_anything_except_these_names(theirs)"])
def test_remat_strips_names_and_matches_grad(policy):
    x = _normal(2, 3)
    m = rp.export_vjp(named, x)
    assert "remat.name" in str(m)
    r = rp.remat(m, policy)
    assert "remat.name" not in str(r)
    assert "custom_call" not in str(r)
    y, g = rp.compile(r, "main")(x, jnp.float32(1.0))
    np.testing.assert_allclose(y, named(x), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(g[0], jax.grad(named)(x), rtol=RTOL, atol=ATOL)
    if policy == "save_only_these_names(ours)":
        assert any("named 'ours'" in str(res) for res in r.residuals)
        assert not any("named 'theirs'" in str(res) for res in r.residuals)


def test_split_of_named_function_matches_vjp():
    x = _normal(2, 3)
    s = rp.remat(rp.export_vjp(named, x), "nothing_saveable", mode="split")
    assert "remat.name" not in str(s)
    y_ref, vjp = jax.vjp(named, x)
    fwd = s.call(x, function="main_fwd")
    y, residuals = fwd[0], fwd[1:]
    (g,) = [s.call(*residuals, jnp.float32(0.5), function="main_bwd")]
    g = g[0] if isinstance(g, (tuple, list)) else g
    np.testing.assert_allclose(y, y_ref, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(g, vjp(jnp.float32(0.5))[0], rtol=RTOL, atol=ATOL)



# ------------------------------------ jax.checkpoint in the model: jax_checkpoint= --
@pytest.mark.parametrize("inner", ["nothing_saveable", "dots_saveable"])
@pytest.mark.parametrize("outer", [None, "nothing_saveable", "everything_saveable",
                                   "dots_saveable"])
def test_jax_checkpoint_calls_become_regions(inner, outer):
    """export_vjp(..., jax_checkpoint="regions"): the model's jax.checkpoint calls are
    regions the passes apply, not JAX's rematerialization baked into the export. Alone
    they keep what JAX keeps for the model; inside rp.checkpoint(loss, outer) they keep
    what JAX keeps for jax.checkpoint(loss, outer) (the outermost policy decides).
    Gradients are jax.vjp's."""
    JP = jax.checkpoint_policies
    fun = layered_loss(jax.checkpoint, getattr(JP, inner))
    theirs = jax.checkpoint(fun, policy=getattr(JP, outer)) if outer else fun
    module = rp.export_vjp(rp.checkpoint(fun, policy=outer) if outer else fun,
                           *LAYERED_ARGS, jax_checkpoint="regions")
    assert "rematted_computation" not in module.text(debug_info=True)
    out = rp.remat(module)
    assert_same_residual_types(out.residuals, theirs, *LAYERED_ARGS)
    ct = jnp.ones(())
    y, vjp_fn = jax.vjp(fun, *LAYERED_ARGS)
    assert_trees_close(run_joint(out, LAYERED_ARGS, ct), (y, vjp_fn(ct)))


def test_jax_checkpoint_in_a_scan_body_becomes_a_region():
    """lax.scan(jax.checkpoint(body, policy)) with jax_checkpoint="regions": per iteration,
    the residuals JAX keeps; gradients jax.vjp's."""
    policy = jax.checkpoint_policies.save_only_these_names("a")

    def loss(Ws, x):
        def body(h, W):
            return jax.checkpoint(checkpointed_layer, policy=policy)(W, h), None
        return jnp.sum(jax.lax.scan(body, x, Ws)[0] ** 2)
    Ws = jnp.stack(LAYERED_ARGS[0])
    out = rp.remat(rp.export_vjp(loss, Ws, LAYERED_ARGS[1], jax_checkpoint="regions"))
    assert_same_residual_types(out.residuals, loss, Ws, LAYERED_ARGS[1])
    y, vjp_fn = jax.vjp(loss, Ws, LAYERED_ARGS[1])
    ct = jnp.ones(())
    assert_trees_close(run_joint(out, (Ws, LAYERED_ARGS[1]), ct), (y, vjp_fn(ct)))


@pytest.mark.parametrize("form", ["joint", "split"])
def test_an_offloading_jax_checkpoint_exported_as_jax_runs_it(form):
    """A model whose jax.checkpoint offloads (save_and_offload_only_these_names, as MaxText's
    offload presets and haliax's `remat="offload"`), exported with JAX's rematerialization
    baked in (the default): jax.export gives every result of such a function a memory kind,
    and the module runs (jax.jit's out_shardings in the shape its call returns, not one per
    result); gradients jax.vjp's."""
    policy = jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=["h"],
        offload_src="device", offload_dst="pinned_host")

    def loss(p):
        def layer(x):
            return jnp.tanh(jax_checkpoint_name(jnp.sin(x @ p["w"]), "h")) @ p["w"]
        return jnp.sum(jax.checkpoint(layer, policy=policy)(p["x"]) ** 2)
    p = {"w": _normal(8, 8) * 0.3, "x": _normal(4, 8)}
    module = rp.export_vjp(loss, p)
    assert 'mhlo.memory_kind = "device"' in module.text()
    out = rp.remat(module, mode=form)
    ct = jnp.ones(())
    y, vjp_fn = jax.vjp(loss, p)
    if form == "joint":
        got = out.call(p, ct)
    else:
        fwd = jax.tree.leaves(out.call(*jax.tree.leaves(p), function="main_fwd"))
        got = (fwd[0], out.call(*fwd[1:], ct, function="main_bwd"))
    assert_trees_close(jax.tree.leaves(got), jax.tree.leaves((y, vjp_fn(ct))))


def test_jax_checkpoint_option_is_checked_and_jax_rule_restored():
    from jax._src import ad_checkpoint
    from jax._src.interpreters import ad
    rule = ad.primitive_jvps[ad_checkpoint.remat_p]
    with pytest.raises(rp.RematError, match="jax_checkpoint must be one of"):
        rp.export_vjp(layered_loss(jax.checkpoint, None), *LAYERED_ARGS,
                      jax_checkpoint="mine")
    rp.export_vjp(layered_loss(jax.checkpoint, None), *LAYERED_ARGS, jax_checkpoint="regions")
    assert ad.primitive_jvps[ad_checkpoint.remat_p] is rule
