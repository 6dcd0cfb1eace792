"""Policy objects: names and signatures of jax.checkpoint_policies, specs, errors, callables."""
from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import pytest
from jax.ad_checkpoint import checkpoint_name

import remat_passes as rp
from remat_passes.policy.policies import Offloadable, OpInfo, Recompute, Saveable, parse_policy

P = rp.policies
JP = jax.checkpoint_policies

JAX_NAMES = sorted(n for n in dir(JP) if not n.startswith("_"))
FACTORIES = ["offload_dot_with_no_batch_dims", "save_anything_except_these_names",
             "save_any_names_but_these", "save_only_these_names", "save_from_both_policies",
             "save_and_offload_only_these_names"]
# Exported by jax 0.11 only (0.10.2 has them privately, 0.12 has none).
CLASSES = ["SaveOnlyTheseNames", "SaveAnyNamesButThese", "SaveAndOffloadOnlyTheseNames"]


def op(name="stablehlo.sine", cname=None, lhs_b=(), rhs_b=(), n_in=1):
    return OpInfo(name=name, operand_types=["tensor<4xf32>"] * n_in,
                  result_types=["tensor<4xf32>"], attributes={}, checkpoint_name=cname,
                  lhs_batching_dims=lhs_b, rhs_batching_dims=rhs_b)


DOT = op("stablehlo.dot_general", n_in=2)
BATCHED_DOT = op("stablehlo.dot_general", lhs_b=(0,), rhs_b=(0,), n_in=2)
CONV = op("stablehlo.convolution", n_in=2)
SIN = op()
MARK_A = op("stablehlo.custom_call", cname="a")
MARK_B = op("stablehlo.custom_call", cname="b")


# --------------------------------------------------------------- the names --
def test_jax_has_the_names_we_expect():
    # guard: if JAX adds a policy, this suite must learn about it
    assert set(JAX_NAMES) == {
        "checkpoint_dots", "checkpoint_dots_with_no_batch_dims", "dots_saveable",
        "dots_with_no_batch_dims_saveable", "everything_saveable", "nothing_saveable",
        *FACTORIES, *(c for c in CLASSES if c in JAX_NAMES)}


@pytest.mark.parametrize("name", CLASSES)
def test_class_spellings_take_jaxs_fields(name):
    """Ours accept the dataclass fields of JAX's classes (whichever JAX version has them)."""
    import dataclasses
    theirs = getattr(JP, name, None)
    if theirs is None:
        pytest.skip(f"jax {jax.__version__} does not export checkpoint_policies.{name}")
    fields = [f.name for f in dataclasses.fields(theirs)]
    assert list(inspect.signature(getattr(P, name)).parameters) == fields


@pytest.mark.parametrize("name", JAX_NAMES)
def test_every_jax_policy_name_exists(name):
    assert hasattr(P, name), name
    assert callable(getattr(P, name))


@pytest.mark.parametrize("name", FACTORIES)
def test_factories_have_jaxs_signature(name):
    ours = inspect.signature(getattr(P, name))
    theirs = inspect.signature(getattr(JP, name))
    assert [(p.name, p.kind, p.default) for p in ours.parameters.values()] == \
        [(p.name, p.kind, p.default) for p in theirs.parameters.values()]


@pytest.mark.parametrize("name", sorted(set(JAX_NAMES) - set(FACTORIES) - set(CLASSES)))
def test_plain_policies_are_policies_not_factories(name):
    pol = getattr(P, name)
    assert isinstance(pol, P.Policy)
    assert pol.verdict(SIN) in (Saveable, Recompute)


def test_aliases():
    assert P.checkpoint_dots is P.dots_saveable
    assert P.checkpoint_dots_with_no_batch_dims is P.dots_with_no_batch_dims_saveable


# ------------------------------------------------------------ the meaning --
@pytest.mark.parametrize("pol, cases", [
    (P.everything_saveable, [(SIN, Saveable), (DOT, Saveable), (MARK_A, Saveable)]),
    (P.nothing_saveable, [(SIN, Recompute), (DOT, Recompute), (MARK_A, Recompute)]),
    (P.dots_saveable, [(DOT, Saveable), (BATCHED_DOT, Saveable), (CONV, Saveable),
                       (SIN, Recompute), (MARK_A, Recompute)]),
    (P.dots_with_no_batch_dims_saveable, [(DOT, Saveable), (BATCHED_DOT, Recompute),
                                          (CONV, Recompute), (SIN, Recompute)]),
    (P.save_anything_except_these_names("a"), [(MARK_A, Recompute), (MARK_B, Saveable),
                                               (SIN, Saveable), (DOT, Saveable)]),
    (P.save_any_names_but_these("a"), [(MARK_A, Recompute), (MARK_B, Saveable),
                                       (SIN, Recompute), (DOT, Recompute)]),
    (P.save_only_these_names("a"), [(MARK_A, Saveable), (MARK_B, Recompute),
                                    (SIN, Recompute), (DOT, Recompute)]),
    (P.save_from_both_policies(P.dots_saveable, P.save_only_these_names("b")),
     [(DOT, Saveable), (MARK_B, Saveable), (MARK_A, Recompute), (SIN, Recompute)]),
])
def test_policy_verdicts(pol, cases):
    for info, expected in cases:
        assert pol.verdict(info) is expected, (pol.spec, info.name, info.checkpoint_name)


def test_offload_dot_with_no_batch_dims_verdicts():
    pol = P.offload_dot_with_no_batch_dims("device", "pinned_host")
    assert pol.verdict(DOT) == Offloadable("device", "pinned_host")
    assert pol.verdict(BATCHED_DOT) is Recompute
    assert pol.verdict(SIN) is Recompute


def test_an_offload_to_an_unknown_memory_kind_is_refused_when_the_policy_is_made():
    """JAX's lowering refuses a memory kind its devices do not address; ours wrote it into
    the module (`_xla_buffer_placement = "nowhere"`). Now the policy is refused when it is
    made, naming the kinds, and so is a Python policy's verdict."""
    with pytest.raises(rp.RematError, match="offload_dst must be a memory kind.*'nowhere'"):
        P.offload_dot_with_no_batch_dims("device", "nowhere")
    with pytest.raises(rp.RematError, match="offload_src must be a memory kind.*'hbm'"):
        P.save_and_offload_only_these_names(
            names_which_can_be_saved=[], names_which_can_be_offloaded=["b"],
            offload_src="hbm", offload_dst="pinned_host")
    with pytest.raises(rp.RematError, match="offload_dst"):
        Offloadable("device", "disk")
    assert Offloadable("device", "unpinned_host").dst == "unpinned_host"


def test_save_and_offload_only_these_names_verdicts():
    pol = P.save_and_offload_only_these_names(
        names_which_can_be_saved=["a"], names_which_can_be_offloaded=["b"],
        offload_src="device", offload_dst="pinned_host")
    assert pol.verdict(MARK_A) is Saveable
    assert pol.verdict(MARK_B) == Offloadable("device", "pinned_host")
    assert pol.verdict(SIN) is Recompute
    assert pol.verdict(DOT) is Recompute


def test_save_and_offload_rejects_overlapping_names_like_jax():
    kwargs = dict(names_which_can_be_saved=["y", "z"], names_which_can_be_offloaded=["z", "w"],
                  offload_src="device", offload_dst="pinned_host")
    with pytest.raises(ValueError) as theirs:
        JP.save_and_offload_only_these_names(**kwargs)
    with pytest.raises(ValueError) as ours:
        P.save_and_offload_only_these_names(**kwargs)
    assert "intersection" in str(ours.value) and "'z'" in str(ours.value)
    assert type(ours.value) is type(theirs.value)


def test_save_and_offload_overlap_in_a_spec_is_a_remat_error():
    with pytest.raises(rp.RematError, match="intersect"):
        P.parse_policy("save_and_offload_only_these_names(names_which_can_be_saved=[a], "
                       "names_which_can_be_offloaded=[a], offload_src=device, "
                       "offload_dst=pinned_host)")


@pytest.mark.parametrize("other", [
    P.offload_dot_with_no_batch_dims("device", "pinned_host"),
    P.save_and_offload_only_these_names(names_which_can_be_saved=["a"],
                                        names_which_can_be_offloaded=["b"],
                                        offload_src="device", offload_dst="pinned_host"),
    lambda info: Saveable,
])
def test_save_from_both_policies_rejects_non_bool_policies(other):
    pol = P.save_from_both_policies(P.dots_saveable, other)
    with pytest.raises(ValueError, match="boolean"):
        pol.verdict(MARK_A)
    # and the same policy composed the JAX way fails the same way in JAX
    jax_pol = JP.save_from_both_policies(JP.dots_saveable,
                                         JP.offload_dot_with_no_batch_dims("device", "pinned_host"))
    with pytest.raises(ValueError, match="boolean"):
        jax_pol(jax.lax.sin_p)


def test_save_from_both_policies_rejects_non_bool_inside_remat():
    def f(x):
        return jnp.sum(jnp.sin(checkpoint_name(jnp.sin(x), "a")))
    module = rp.export_vjp(f, jnp.ones(3))
    pol = P.save_from_both_policies(P.nothing_saveable,
                                    P.offload_dot_with_no_batch_dims("device", "pinned_host"))
    with pytest.raises((ValueError, rp.RematError), match="boolean"):
        rp.remat(module, pol)


# ------------------------------------------------------------------ specs --
ALL_POLICIES = [
    P.everything_saveable, P.nothing_saveable, P.dots_saveable,
    P.dots_with_no_batch_dims_saveable,
    P.offload_dot_with_no_batch_dims("device", "pinned_host"),
    P.save_anything_except_these_names("a", "b.c"),
    P.save_any_names_but_these("layer1_output"),
    P.save_only_these_names(),
    P.save_only_these_names("a", "with space", "quote'd"),
    P.save_from_both_policies(P.dots_saveable, P.save_only_these_names("a")),
    P.save_from_both_policies(P.save_any_names_but_these("x"),
                              P.save_from_both_policies(P.nothing_saveable,
                                                        P.save_only_these_names("y"))),
    P.save_and_offload_only_these_names(names_which_can_be_saved=["a", "q"],
                                        names_which_can_be_offloaded=["b"],
                                        offload_src="device", offload_dst="pinned_host"),
]
PROBES = [SIN, DOT, BATCHED_DOT, CONV, MARK_A, MARK_B, op("stablehlo.custom_call", cname="q"),
          op("stablehlo.custom_call", cname="with space"),
          op("stablehlo.custom_call", cname="quote'd"),
          op("stablehlo.custom_call", cname="b.c"), op("stablehlo.custom_call", cname="y")]


@pytest.mark.parametrize("pol", ALL_POLICIES, ids=lambda p: p.spec)
def test_spec_round_trips(pol):
    again = P.parse_policy(pol.spec)
    assert again.spec == pol.spec
    for probe in PROBES:
        assert again.verdict(probe) == pol.verdict(probe), (pol.spec, probe)


def test_specs_accept_bare_names_and_whitespace():
    pol = P.parse_policy("  save_only_these_names(a, 'b.c')  ")
    assert pol.verdict(MARK_A) is Saveable
    assert pol.verdict(op("stablehlo.custom_call", cname="b.c")) is Saveable
    assert pol.verdict(MARK_B) is Recompute


@pytest.mark.parametrize("spec, fragment", [
    ("dots_savable", "dots_saveable"),                      # typo: suggestion
    ("save_only_these_name(a)", "save_only_these_names"),   # typo in a factory
    ("checkpoint_dot", "checkpoint_dots"),
])
def test_unknown_policy_error_suggests(spec, fragment):
    with pytest.raises(rp.RematError) as err:
        P.parse_policy(spec)
    msg = str(err.value)
    assert "did you mean" in msg and fragment in msg


@pytest.mark.parametrize("spec, fragment", [
    ("save_only_these_names(a", "cannot parse"),
    ("everything_saveable()", "takes no arguments"),
    ("save_only_these_names", "needs arguments"),
    ("save_only_these_names(1)", "names or strings"),
    ("offload_dot_with_no_batch_dims(device)", "bad arguments"),
    ("zzzzqqq", "known policies"),
    ("dots_saveable + nothing_saveable", "expected NAME"),
])
def test_parse_errors_are_remat_errors(spec, fragment):
    with pytest.raises(rp.RematError, match=fragment):
        P.parse_policy(spec)


def test_parse_errors_mention_the_spec():
    with pytest.raises(rp.RematError, match="dots_savable"):
        P.parse_policy("dots_savable")


def test_remat_accepts_spec_strings():
    def f(W, x):
        return jnp.sum(jnp.sin(jnp.dot(W, x)))
    args = (jnp.ones((3, 4)), jnp.ones(4))
    module = rp.export_vjp(f, *args)
    by_obj = rp.remat(module, P.dots_saveable).residuals
    by_spec = rp.remat(module, "dots_saveable").residuals
    assert [str(r) for r in by_obj] == [str(r) for r in by_spec]
    assert any("dot_general" in r.description for r in by_spec)


# ------------------------------------------------------- custom callables --
def _named_model(x, W):
    h = checkpoint_name(jnp.sin(x @ W), "h")
    return jnp.sum(jnp.tanh(h) @ W)


ARGS = (jnp.ones((2, 3)) * 0.5, jnp.ones((3, 3)) * 0.25)


@pytest.fixture(scope="module")
def named_module():
    return rp.export_vjp(_named_model, *ARGS)


def test_custom_policy_receives_opinfo(named_module):
    seen = []

    def pol(info):
        # read every field during the call
        seen.append((info, info.name, list(info.operand_types), list(info.result_types),
                     dict(info.attributes), info.checkpoint_name))
        return False
    rp.remat(named_module, pol)
    assert seen and all(isinstance(s[0], OpInfo) for s in seen)
    by_name = {}
    for s in seen:
        by_name.setdefault(s[1], []).append(s)
    assert "stablehlo.dot_general" in by_name
    _, _, operands, results, attrs, cname = by_name["stablehlo.dot_general"][0]
    assert operands == ["tensor<2x3xf32>", "tensor<3x3xf32>"]
    assert results == ["tensor<2x3xf32>"]
    assert "dot_dimension_numbers" in attrs and isinstance(attrs["dot_dimension_numbers"], str)
    assert cname is None
    markers = [s for s in seen if s[5] is not None]
    assert [m[5] for m in markers] == ["h"]
    assert markers[0][1] == "stablehlo.custom_call"
    assert markers[0][4].get("call_target_name") == '"remat.name"'
    assert all(isinstance(t, str) for s in seen for t in s[2] + s[3])


_OPINFO_AFTER_PASS = """
import os
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import gc
import jax.numpy as jnp
import remat_passes as rp
kept = []
def pol(info):
    kept.append(info)
    return False
def f(x, W):
    return jnp.sum(jnp.tanh(jnp.sin(x @ W) @ W))
m = rp.export_vjp(f, jnp.ones((2, 3)), jnp.ones((3, 3)))
rp.remat(m, pol)
for _ in range(5):  # reuse whatever memory the pass freed
    rp.remat(m, None, mode="split")
gc.collect()
attrs = [dict(i.attributes) for i in kept]
assert any("dot_dimension_numbers" in a for a in attrs), attrs
print("ok", len(kept))
"""


def test_opinfo_is_usable_after_the_pass():
    """A policy may keep the OpInfo it was given (to log decisions, say) and read
    it after remat() returns: it is a record, not a view of freed IR. Run in a
    subprocess: a dangling view crashes the interpreter."""
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-c", _OPINFO_AFTER_PASS], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "ok" in proc.stdout, \
        f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr[-2000:]}"


@pytest.mark.parametrize("save", [True, Saveable, jax.ad_checkpoint.Saveable],
                         ids=["bool", "rp.Saveable", "jax.Saveable"])
def test_custom_policy_saveable_verdicts(named_module, save):
    def pol(info):
        return save if info.checkpoint_name == "h" else \
            (False if save is True else (Recompute if save is Saveable
                                         else jax.ad_checkpoint.Recompute))
    res = rp.remat(named_module, pol).residuals
    descs = [r.description for r in res]
    assert any(d.startswith("named 'h'") for d in descs), descs
    # nothing else but arguments is saved
    assert all(d.startswith(("named 'h'", "from the argument")) for d in descs), descs


@pytest.mark.parametrize("recompute", [False, None, Recompute, jax.ad_checkpoint.Recompute],
                         ids=["False", "None", "rp.Recompute", "jax.Recompute"])
def test_custom_policy_recompute_verdicts(named_module, recompute):
    res = rp.remat(named_module, lambda info: recompute).residuals
    assert all(r.description.startswith("from the argument") for r in res), \
        [str(r) for r in res]


@pytest.mark.parametrize("offloadable", [Offloadable("device", "pinned_host"),
                                         jax.ad_checkpoint.Offloadable(src="device",
                                                                       dst="pinned_host")],
                         ids=["rp.Offloadable", "jax.Offloadable"])
def test_custom_policy_offloadable(named_module, offloadable):
    def pol(info):
        return offloadable if info.checkpoint_name == "h" else False
    res = rp.remat(named_module, pol).residuals
    (named,) = [r for r in res if r.description.startswith("named 'h'")]
    assert named.offload == Offloadable("device", "pinned_host")
    assert all(r.offload is None for r in res if r is not named)


def test_custom_policy_bad_return_is_a_remat_error(named_module):
    with pytest.raises(rp.RematError, match="must return"):
        rp.remat(named_module, lambda info: "yes")


def test_custom_policy_result_is_used_per_op(named_module):
    """A policy that saves only dots saves exactly what dots_saveable saves."""
    ours = rp.remat(named_module, lambda info: info.name == "stablehlo.dot_general").residuals
    builtin = rp.remat(named_module, P.dots_saveable).residuals
    assert [str(r) for r in ours] == [str(r) for r in builtin]
    assert any("dot_general" in r.description for r in ours)


def test_non_policy_is_rejected():
    with pytest.raises(rp.RematError):
        P.as_policy(42)


@pytest.mark.parametrize("spec,expected", [
    ("auto(12MiB)", "auto(budget=12582912)"),
    ("auto(50%)", "auto(budget=50%)"),
    ("auto( 2GiB , offload=pinned_host)", "auto(budget=2147483648, offload=pinned_host)"),
    ("auto(budget=1000)", "auto(budget=1000)"),
])
def test_auto_takes_its_budget_without_the_keyword(spec, expected):
    assert parse_policy(spec).spec == expected


# ------------------------------------------------------ MaxText's remat presets --
def _maxtext_block(params, x):
    """A llama-style layer with MaxText's checkpoint names (no kv_proj/qkv_proj/mlpwi)."""
    wq, wk, wv, wo, w0, w1, w2 = params
    q = checkpoint_name(x @ wq, "query_proj")
    k = checkpoint_name(x @ wk, "key_proj")
    v = checkpoint_name(x @ wv, "value_proj")
    a = jax.nn.softmax(q @ k.T / 4.0, axis=-1)
    ctx = checkpoint_name(a @ v, "context")
    h = x + checkpoint_name(ctx @ wo, "out_proj")
    g = checkpoint_name(jax.nn.silu(h @ w0), "mlpwi_0") * checkpoint_name(h @ w1, "mlpwi_1")
    return jnp.sum(jnp.tanh(h + checkpoint_name(g @ w2, "mlpwo")))


_MT_NAMES = ("query_proj", "value_proj", "key_proj", "kv_proj", "qkv_proj")
_MT_MINIMAL = _MT_NAMES + ("out_proj", "mlpwi_0", "mlpwi_1", "mlpwi", "mlpwo")
_CP = jax.checkpoint_policies
# MaxText 0.2.5's own definitions (maxtext/layers/nnx_decoders.py, get_remat_policy),
# written with jax.checkpoint_policies: what JAX saves for each preset.
MAXTEXT_JAX = {
    "minimal": _CP.save_only_these_names(*_MT_MINIMAL),
    "minimal_with_context": _CP.save_only_these_names(*_MT_MINIMAL, "context"),
    "save_dot_with_context_except_mlp":
        _CP.save_only_these_names(*_MT_NAMES, "context", "out_proj"),
    "save_dot_except_mlpwi": _CP.save_only_these_names(*_MT_NAMES, "out_proj", "mlpwo"),
    "save_dot_except_mlp": _CP.save_only_these_names(*_MT_NAMES, "out_proj"),
    "save_qkv_proj": _CP.save_only_these_names(*_MT_NAMES),
    "qkv_proj_offloaded": _CP.save_and_offload_only_these_names(
        names_which_can_be_saved=[],
        names_which_can_be_offloaded=["query_proj", "value_proj", "key_proj", "kv_proj"],
        offload_src="device", offload_dst="pinned_host"),
    "minimal_offloaded": _CP.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=list(_MT_MINIMAL),
        offload_src="device", offload_dst="pinned_host"),
    "save_out_proj": _CP.save_only_these_names("out_proj"),
    "full": None,
}


@pytest.mark.parametrize("preset", sorted(MAXTEXT_JAX))
def test_maxtext_presets_keep_what_maxtext_keeps(preset):
    """`maxtext(<preset>)` (a spec the CLI reads too) keeps what jax.checkpoint keeps for
    MaxText's own policy of that preset, offloaded residuals included."""
    from remat_testlib import assert_same_residual_types
    key = jax.random.key(0)
    params = [jax.random.normal(jax.random.fold_in(key, i), s) * 0.2 for i, s in enumerate(
        [(8, 8)] * 4 + [(8, 16), (8, 16), (16, 8)])]
    x = jax.random.normal(jax.random.key(1), (4, 8))
    module = rp.export_vjp(_maxtext_block, params, x)
    out = rp.remat(module, parse_policy(f"maxtext({preset})"))
    assert_same_residual_types(out.residuals,
                               jax.checkpoint(_maxtext_block, policy=MAXTEXT_JAX[preset]),
                               params, x)
    assert not [r for r in out.remarks if "no value of" in r]   # some names exist: no remark


def test_maxtext_preset_errors_and_remarks():
    with pytest.raises(rp.RematError, match="did you mean minimal"):
        parse_policy("maxtext(minimall)")
    assert parse_policy("maxtext('save_qkv_proj')").spec == "maxtext('save_qkv_proj')"
    module = rp.export_vjp(lambda w, x: jnp.sum(jnp.sin(x @ w)), jnp.ones((4, 4)),
                           jnp.ones((2, 4)))
    remarks = rp.remat(module, "maxtext(save_qkv_proj)").remarks
    assert any("no checkpoint names" in r for r in remarks), remarks


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("policy", ["dots_saveable", "dots_with_no_batch_dims_saveable",
                                    "nothing_saveable",
                                    "offload_dot_with_no_batch_dims('device', 'pinned_host')"])
def test_a_block_scaled_matmul_on_gpu_is_a_dot(policy, batch):
    """`jax.nn.scaled_dot_general` (MX formats) exports for GPU as a custom call, which
    JAX's dot policies count as a dot (dots_with_no_batch_dims_saveable where its batch is
    1; JAX's offload_dot_with_no_batch_dims takes dot_general alone). The export itself used
    to fail: jax.export refuses a custom call it does not guarantee to stay compatible,
    unless told. Both spellings of the policy keep what jax.checkpoint keeps."""
    from jax.nn import get_scaled_dot_general_config, scaled_dot_general
    from remat_testlib import assert_same_residual_types
    cfg = get_scaled_dot_general_config("mxfp8")
    a = jax.random.normal(jax.random.key(0), (batch, 64, 64))
    b = jax.random.normal(jax.random.key(1), (batch, 32, 64))

    def loss(a, b):
        y = scaled_dot_general(a, b, (((2,), (2,)), ((0,), (0,))), configs=[cfg] * 3)
        return jnp.sum(jnp.sin(y))
    module = rp.export(jax.value_and_grad(loss, argnums=(0, 1)), a, b, platforms=("cuda",))
    assert "@__op$block_scaled_dot" in str(module)
    theirs = eval(policy, vars(jax.checkpoint_policies))
    for spelling in (policy, theirs):
        assert_same_residual_types(rp.remat(module, spelling).residuals,
                                   jax.checkpoint(loss, policy=theirs), a, b)


@pytest.mark.parametrize("policy", ["dots_saveable", "dots_with_no_batch_dims_saveable",
                                    "nothing_saveable",
                                    "offload_dot_with_no_batch_dims('device', 'pinned_host')"])
def test_a_ragged_dot_on_cpu_is_not_a_dot(policy):
    """`jax.lax.ragged_dot` (a mixture of experts' grouped matmul) lowers for CPU to a
    masked dot_general, with nothing in its location that says so; JAX's dot policies decide
    on its primitive, `ragged_dot_general`, and do not count it as a dot. rp.export marks
    those dot_generals (`remat.primitive`), so both spellings of each policy keep what
    jax.checkpoint keeps; the mark is gone from the result."""
    from remat_testlib import assert_same_residual_types
    sizes = jnp.array([5, 11, 0, 16], jnp.int32)
    params = (jax.random.normal(jax.random.key(0), (4, 16, 24)) * 0.3,
              jax.random.normal(jax.random.key(1), (4, 24, 16)) * 0.3)
    x = jax.random.normal(jax.random.key(2), (32, 16))

    def loss(params, x):
        w, w2 = params
        h = jax.nn.gelu(jax.lax.ragged_dot(x, w, sizes))
        return jnp.mean((jax.lax.ragged_dot(h, w2, sizes) @ jnp.ones((16, 16))) ** 2)
    module = rp.export(jax.value_and_grad(loss), params, x)
    assert "remat.primitive" in str(module)
    theirs = eval(policy, vars(jax.checkpoint_policies))
    for spelling in (policy, theirs):
        out = rp.remat(module, spelling)
        assert "remat.primitive" not in str(out)
        assert_same_residual_types(out.residuals, jax.checkpoint(loss, policy=theirs), params, x)


def test_opinfo_operand_shapes_from_printed_types():
    """An OpInfo built from printed types (a user's, in a test of their policy) reads its
    operand shapes from them: dynamic dimensions None, complex elements whole, a token
    None; one built by the passes gets them from the IR, the same."""
    info = OpInfo("stablehlo.add", ["tensor<4x?xf32>", "tensor<3xcomplex<f64>>", "tensor<bf16>",
                                    "!stablehlo.token"], [], {}, None)
    assert info.operand_shapes == [((4, None), "f32"), ((3,), "complex<f64>"), ((), "bf16"),
                                   None]
    m = rp.export_vjp(lambda x, z: jnp.sum(jnp.abs(jnp.sin(x) * z) ** 2), jnp.ones((2, 3)),
                      jnp.ones((2, 3), jnp.complex64))
    seen = []

    def record(op):
        if op.name == "stablehlo.multiply" and "complex" in " ".join(op.operand_types):
            parsed = OpInfo(op.name, op.operand_types, [], {}, None).operand_shapes
            seen.append((op.operand_shapes, parsed))
        return False
    rp.remat(m, record)
    assert seen and all(ir == parsed for ir, parsed in seen), seen
