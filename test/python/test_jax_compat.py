"""The supported JAX range and the one module that touches JAX internals.

* `import remat_passes` refuses a jax/jaxlib outside the supported range with a
  message that names the range (checked with faked installed versions);
* every policy object `jax.checkpoint_policies` makes in the installed JAX
  (dataclass objects in 0.10-0.11, closures in 0.12) is read as our own policy
  with the same spec, and gives the same verdicts as calling it JAX-style;
* the classes 0.11 exports (`SaveOnlyTheseNames`, ...) are accepted directly;
* `make_exported` builds an `Exported` in whatever fields this JAX has;
* `platform_in_use` finds the platform without starting a backend (JAX_PLATFORMS, or
  none asked: cpu where no accelerator plugin is installed), and is the started
  backend's once one is.
"""
from __future__ import annotations

import jax
import pytest

import remat_passes as rp
from remat_passes import jax_compat
from remat_passes.policy.policies import OpInfo, _from_jax_policy, as_policy

JP = jax.checkpoint_policies


@pytest.mark.parametrize("jax_version,ok", [
    ("0.10.2", True), ("0.11.1", True), ("0.12.0.1", True), ("0.12.9", True),
    ("0.10.1", False), ("0.9.2", False), ("0.13.0", False), ("1.0", False)])
def test_version_range(monkeypatch, jax_version, ok):
    monkeypatch.delenv(jax_compat.SKIP_CHECK_ENV, raising=False)
    monkeypatch.setattr(jax_compat, "installed_version", lambda dist: jax_version)
    if ok:
        jax_compat.check_installed_version()
        return
    with pytest.raises(ImportError) as e:
        jax_compat.check_installed_version()
    msg = str(e.value)
    assert jax_version in msg and jax_compat.supported_range() in msg
    assert jax_compat.SKIP_CHECK_ENV in msg


def test_version_check_can_be_skipped(monkeypatch):
    monkeypatch.setattr(jax_compat, "installed_version", lambda dist: "0.14.0")
    monkeypatch.setenv(jax_compat.SKIP_CHECK_ENV, "1")
    jax_compat.check_installed_version()


def test_missing_jax_is_named(monkeypatch):
    monkeypatch.delenv(jax_compat.SKIP_CHECK_ENV, raising=False)

    monkeypatch.setattr(jax_compat, "installed_version", lambda dist: None)
    with pytest.raises(ImportError, match="jax .*is not installed"):
        jax_compat.check_installed_version()


def test_installed_jax_is_supported():
    assert jax_compat.JAX_MIN <= jax_compat.jax_version() < jax_compat.JAX_BELOW
    for dist in ("jax", "jaxlib"):      # read from the packages, as pip's metadata says
        from importlib import metadata
        assert jax_compat.installed_version(dist) == metadata.version(dist)


# ----------------------------------------------------------------- policies --
JAX_POLICIES = {
    "everything_saveable": lambda: JP.everything_saveable,
    "nothing_saveable": lambda: JP.nothing_saveable,
    "dots_saveable": lambda: JP.dots_saveable,
    "checkpoint_dots": lambda: JP.checkpoint_dots,
    "dots_with_no_batch_dims_saveable": lambda: JP.dots_with_no_batch_dims_saveable,
    "offload_dot_with_no_batch_dims": lambda: JP.offload_dot_with_no_batch_dims(
        "device", "pinned_host"),
    "save_only_these_names": lambda: JP.save_only_these_names("a", "b"),
    "save_any_names_but_these": lambda: JP.save_any_names_but_these("a"),
    "save_and_offload_only_these_names": lambda: JP.save_and_offload_only_these_names(
        names_which_can_be_saved=["a"], names_which_can_be_offloaded=["b"],
        offload_src="device", offload_dst="pinned_host"),
    "save_from_both_policies": lambda: JP.save_from_both_policies(
        JP.dots_saveable, JP.save_only_these_names("a")),
}

SAMPLE_OPS = [
    OpInfo("stablehlo.dot_general", ["tensor<4x4xf32>"] * 2, ["tensor<4x4xf32>"], {}, None,
           lhs_contracting_dims=(1,), rhs_contracting_dims=(0,)),
    OpInfo("stablehlo.dot_general", ["tensor<2x4x4xf32>"] * 2, ["tensor<2x4x4xf32>"], {}, None,
           lhs_batching_dims=(0,), rhs_batching_dims=(0,),
           lhs_contracting_dims=(2,), rhs_contracting_dims=(1,)),
    OpInfo("stablehlo.convolution", ["tensor<1x1x4x4xf32>"] * 2, ["tensor<1x1x4x4xf32>"], {},
           None),
    OpInfo("stablehlo.sine", ["tensor<4xf32>"], ["tensor<4xf32>"], {}, None, primitive="sin"),
    OpInfo("stablehlo.custom_call", ["tensor<4xf32>"], ["tensor<4xf32>"], {}, "a"),
    OpInfo("stablehlo.custom_call", ["tensor<4xf32>"], ["tensor<4xf32>"], {}, "b"),
    OpInfo("stablehlo.custom_call", ["tensor<4xf32>"], ["tensor<4xf32>"], {}, "c"),
]


@pytest.mark.parametrize("name", list(JAX_POLICIES))
def test_jax_policy_objects_become_our_policies(name):
    """Whatever the installed JAX makes (class instance or closure) is read as our policy
    of the same name, and decides like JAX's object called JAX-style on every sample op."""
    theirs = JAX_POLICIES[name]()
    ours = as_policy(theirs)
    assert not ours.spec.startswith("<"), ours.spec
    expected_head = {"checkpoint_dots": "dots_saveable"}.get(name, name)
    assert ours.spec.startswith(expected_head), ours.spec
    adapted = _from_jax_policy(theirs)
    for op in SAMPLE_OPS:
        assert ours.verdict(op) == adapted.verdict(op), (name, op)


@pytest.mark.parametrize("cls,args", [
    ("SaveOnlyTheseNames", (frozenset({"a"}),)),
    ("SaveAnyNamesButThese", (frozenset({"a"}),)),
    ("SaveAndOffloadOnlyTheseNames", (frozenset({"a"}), frozenset({"b"}), "device",
                                      "pinned_host")),
])
def test_policy_classes_of_jax_0_11(cls, args):
    if not hasattr(JP, cls):
        pytest.skip(f"jax {jax.__version__} does not export checkpoint_policies.{cls}")
    theirs = getattr(JP, cls)(*args)
    ours = as_policy(theirs)
    assert not ours.spec.startswith("<"), ours.spec
    adapted = _from_jax_policy(theirs)
    for op in SAMPLE_OPS:
        assert ours.verdict(op) == adapted.verdict(op)


def test_jax_policy_object_drives_remat_like_ours():
    def f(W, x):
        return jax.numpy.sum(jax.numpy.sin(rp.checkpoint_name(W @ x, "a")))
    m = rp.export_vjp(f, jax.numpy.ones((3, 3)), jax.numpy.ones(3))
    a = rp.remat(m, JP.save_only_these_names("a")).residuals
    b = rp.remat(m, "save_only_these_names(a)").residuals
    assert [str(r) for r in a] == [str(r) for r in b]


def test_user_policy_in_jax_style_still_adapted():
    def my_policy(prim, *_, **params):
        return prim.name == "sin"
    assert as_policy(my_policy).spec.startswith("<jax policy")


def test_make_exported_fills_version_specific_fields():
    import jax.numpy as jnp
    m = rp.export_vjp(lambda x: jnp.sum(jnp.sin(x)), jnp.ones(3))
    split = rp.remat(m, "nothing_saveable", mode="split")
    exp = split.to_exported("main_fwd")
    assert exp.fun_name == "main_fwd"
    out = split.call(jnp.ones(3), function="main_fwd")
    assert len(jax.tree_util.tree_leaves(out)) >= 1


@pytest.mark.parametrize("asked,platform,profile", [
    ("cpu", "cpu", "cpu"), ("cuda", "gpu", "h100"), ("rocm,cpu", "gpu", "h100"),
    ("tpu", "tpu", "tpu-v5e"), ("", None, None)])
def test_platform_in_use_starts_no_backend(asked, platform, profile):
    """Without JAX imported (remat-opt on a text module) the platform comes from
    JAX_PLATFORMS, else from the plugins installed; JAX is not imported to find it, so no
    backend (CUDA, and XLA's reservation of most of a GPU's memory) is started for it."""
    import os
    import subprocess
    import sys
    script = ("import sys\n"
              "from remat_passes import jax_compat\n"
              "from remat_passes.cost.devices import default_device\n"
              "print(jax_compat.platform_in_use(), default_device(),\n"
              "      jax_compat._installed_accelerator(), 'jax' in sys.modules)\n")
    env = dict(os.environ, JAX_PLATFORMS=asked)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    installed = None if out[2] == "None" else out[2]
    if platform is None:           # nothing asked: what is installed, else cpu
        platform = installed or "cpu"
        profile = {"gpu": "h100", "tpu": "tpu-v5e"}.get(platform, "cpu")
    assert out == [platform, profile, str(installed), "False"]


def test_platform_in_use_is_the_started_backends():
    jax.numpy.zeros(1).block_until_ready()        # a backend is started
    assert jax_compat.platform_in_use() == jax.default_backend()


def _mixed(W, V, x):
    h = jax.numpy.tanh(x @ W)                                     # [16, 8] x [8, 8]
    g = rp.checkpoint_name(jax.numpy.sin(h[:4] @ W), "small")     # [4, 8]
    big = rp.checkpoint_name(jax.numpy.cos(h), "big")             # [16, 8]
    low = (big.astype(jax.numpy.bfloat16) @ V).astype(jax.numpy.float32)
    return jax.numpy.sum(g ** 2) + jax.numpy.sum(jax.numpy.tanh(low))


def _lhs_rows_over_8(prim, *avals, **params):
    return prim is jax.lax.dot_general_p and avals[0].shape[0] > 8


def _named_of_64_or_more(prim, *avals, **params):
    return prim.name == "name" and avals[0].size >= 64


def _bf16_dots(prim, *avals, **params):
    return prim is jax.lax.dot_general_p and avals[0].dtype == jax.numpy.bfloat16


@pytest.mark.parametrize("policy", [_lhs_rows_over_8, _named_of_64_or_more, _bf16_dots])
def test_jax_style_policy_reads_operand_avals_as_in_jax(policy):
    """JAX calls a policy with the primitive's input avals (`policy(prim, *avals,
    **params)`); a user policy that reads their shapes, sizes or dtypes sees the op's
    operands as `jax.core.ShapedArray`s here too (it got none before: IndexError), and
    saves what jax.checkpoint saves with it."""
    import jax.numpy as jnp
    from remat_testlib import jax_saved_residuals
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    args = (jax.random.normal(k[0], (8, 8)), jax.random.normal(k[1], (8, 8), jnp.bfloat16),
            jax.random.normal(k[2], (16, 8)))
    ours = rp.saved_residuals(rp.export_vjp(_mixed, *args), policy=policy)
    theirs = jax_saved_residuals(jax.checkpoint(_mixed, policy=policy), *args)
    assert sorted(r.type for r in ours) == sorted(a.str_short(short_dtypes=True) for a, _ in theirs), \
        ([str(r) for r in ours], theirs)
    assert len(ours) > 3                           # (more than the arguments)


def _convs(w, v, x):
    y = jax.lax.conv_general_dilated(x, w, (1, 2), ((1, 2), (0, 1)), rhs_dilation=(2, 1),
                                     dimension_numbers=("NCHW", "OIHW", "NHWC"))
    y = jax.numpy.tanh(y)
    z = jax.lax.conv_general_dilated(y, v, (1, 1), "SAME", feature_group_count=2,
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                     precision=jax.lax.Precision.HIGHEST)
    h = jax.numpy.einsum("bhwc,cd->bhwd", jax.numpy.sin(z), w[:, :, 0, 0],
                         precision="highest")
    return jax.numpy.sum(jax.numpy.tanh(h) @ w[0, :, :, 0])


def test_jax_style_policy_sees_jax_params_of_dots_and_convolutions():
    """The avals and params a JAX-style policy gets for dot_general and conv_general_dilated
    are JAX's own for the same program (window, padding, dilations, dimension numbers, group
    counts, precision): recorded by one policy under jax.checkpoint and under the passes."""
    import jax.numpy as jnp
    from remat_testlib import jax_saved_residuals
    seen = {"jax": set(), "ours": set()}
    who = ["jax"]

    def recorder(prim, *avals, **params):
        if prim.name in ("dot_general", "conv_general_dilated"):
            kept = tuple(sorted((k, str(v)) for k, v in params.items()
                                if k != "preferred_element_type"))
            seen[who[0]].add((prim.name, tuple(a.str_short(short_dtypes=True)
                                               for a in avals), kept))
        return prim.name == "conv_general_dilated" and params["feature_group_count"] == 2
    k = jax.random.split(jax.random.PRNGKey(3), 3)
    args = (jax.random.normal(k[0], (4, 3, 3, 2)), jax.random.normal(k[1], (3, 3, 2, 4)),
            jax.random.normal(k[2], (2, 3, 8, 8)))
    theirs = jax_saved_residuals(jax.checkpoint(_convs, policy=recorder), *args)
    who[0] = "ours"
    ours = rp.saved_residuals(rp.export_vjp(_convs, *args), policy=recorder)
    # (JAX asks about every forward equation, the passes about the ops the backward reads)
    assert seen["ours"] <= seen["jax"] and len(seen["ours"]) == 3, seen
    assert sorted(r.type for r in ours) == sorted(a.str_short(short_dtypes=True)
                                                  for a, _ in theirs)
    assert any(r.type == "f32[2,7,4,4]" for r in ours)       # (the grouped conv's output)


def test_a_jax_style_policy_that_fails_is_an_error_naming_the_op():
    """A user's policy that raises (here a KeyError on a param JAX does not give) is a
    PolicyError that names the policy and the op, not a bare KeyError."""
    def reads_a_missing_param(prim, *avals, **params):
        return params["no_such_param"]
    m = rp.export_vjp(lambda x: jax.numpy.sum(jax.numpy.sin(x)), jax.numpy.ones(3))
    with pytest.raises(rp.policies.PolicyError, match=r"reads_a_missing_param.*failed on "
                       r"stablehlo\.\w+: KeyError: 'no_such_param'"):
        rp.remat(m, reads_a_missing_param)
