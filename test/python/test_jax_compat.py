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
