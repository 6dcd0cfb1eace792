"""Module I/O: every input format, save/load, the jax.export bridge, errors.

Formats: MLIR text, MLIR bytecode, StableHLO portable artifacts (VHLO) and
serialized `jax.export.Exported` are all detected by `Module.parse` / `load`
and must give the same module. `from_exported` / `to_exported` keep the
original pytree calling convention, so `Module.call` matches the jitted
function.
"""
import os
import re
import stat

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import remat_passes as rp
from remat_passes.ir import mlir
from remat_passes.ir.mlir import ir

# ---------------------------------------------------------------- helpers --


def tree_fn(params, xs):
    """Pytree in (dict, list), pytree out (dict holding a list and a tuple)."""
    h = jnp.tanh(xs[0] @ params["w"] + params["b"])
    return {"h": h, "stats": [jnp.sum(h * xs[1]), (jnp.max(h, axis=0),)]}


def make_inputs():
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32),
              "b": jnp.asarray(rng.normal(size=(4,)), jnp.float32)}
    xs = [jnp.asarray(rng.normal(size=(2, 3)), jnp.float32),
          jnp.asarray(rng.normal(size=(2, 4)), jnp.float32)]
    return params, xs


def assert_trees_close(got, want, rtol=1e-5, atol=1e-6):
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert np.shape(g) == np.shape(w)
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=atol)


@pytest.fixture(scope="module")
def inputs():
    return make_inputs()


@pytest.fixture(scope="module")
def exported(inputs):
    return export.export(jax.jit(tree_fn))(*inputs)


@pytest.fixture(scope="module")
def module(exported):
    return rp.from_exported(exported)


BAD_OP_TEXT = """module {
  func.func @main(%a: tensor<f32>) -> tensor<f32> {
    %0 = stablehlo.bogus %a : tensor<f32>
    return %0 : tensor<f32>
  }
}
"""

# Not UTF-8, no MLIR bytecode magic, not a flatbuffer.
GARBAGE = b"\x00\xff\xfe\x89garbage\x00\x01\x02" * 5

FORMATS = ["text-str", "text-bytes", "text-debuginfo", "bytecode", "portable-artifact",
           "exported-bytearray", "exported-bytes"]


def encode(module, exported, fmt):
    if fmt == "text-str":
        return str(module)
    if fmt == "text-bytes":
        return str(module).encode()
    if fmt == "text-debuginfo":
        return module.text(debug_info=True)
    if fmt == "bytecode":
        return module.bytecode()
    if fmt == "portable-artifact":
        return mlir.to_portable_artifact(module.op)
    if fmt == "exported-bytearray":
        return exported.serialize()
    if fmt == "exported-bytes":
        return bytes(exported.serialize())
    raise AssertionError(fmt)


def arg_attr_names(module, func="main"):
    """{arg index: set of attribute names} of a function, read from the raw IR."""
    for op in module.op.body.operations:
        if op.operation.name == "func.func" and \
                ir.StringAttr(op.operation.attributes["sym_name"]).value == func:
            attrs = op.operation.attributes
            if "arg_attrs" not in attrs:
                return {}
            out = {}
            for i, d in enumerate(ir.ArrayAttr(attrs["arg_attrs"])):
                d = ir.DictAttr(d)
                out[i] = {d[j].name for j in range(len(d))}
            return out
    raise AssertionError(f"no @{func}")


# ---------------------------------------------------------------- formats --


def test_formats_are_really_different(module, exported):
    """Guard for the round-trip tests: each encoding is what it claims to be."""
    text = encode(module, exported, "text-str")
    assert text.startswith("module")
    assert "loc(" not in text
    assert "loc(" in encode(module, exported, "text-debuginfo")
    bc = encode(module, exported, "bytecode")
    assert bc[:4] == mlir.BYTECODE_MAGIC
    art = encode(module, exported, "portable-artifact")
    assert art[:4] == mlir.BYTECODE_MAGIC and art != bc
    # The artifact really is VHLO: parsed without deserialization it holds vhlo ops.
    with mlir.context():
        raw = ir.Module.parse(art)
    assert any(op.operation.name.startswith("vhlo.") for op in raw.body.operations)
    ser = encode(module, exported, "exported-bytes")
    assert ser[:4] != mlir.BYTECODE_MAGIC
    with pytest.raises(UnicodeDecodeError):
        ser.decode("utf-8")


@pytest.mark.parametrize("fmt", FORMATS)
def test_parse_detects_format(module, exported, fmt):
    data = encode(module, exported, fmt)
    parsed = rp.Module.parse(data)
    assert str(parsed) == str(module)
    assert parsed.functions() == ["main"]
    # Only a serialized Exported carries the calling convention along.
    if fmt.startswith("exported"):
        assert parsed.exported is not None
        assert parsed.exported.in_tree == exported.in_tree
        assert parsed.exported.out_tree == exported.out_tree
    else:
        assert parsed.exported is None


@pytest.mark.parametrize("fmt", FORMATS)
def test_load_detects_format(module, exported, fmt, tmp_path):
    data = encode(module, exported, fmt)
    path = tmp_path / "in.bin"
    path.write_bytes(data.encode() if isinstance(data, str) else bytes(data))
    loaded = rp.load(str(path))
    assert str(loaded) == str(module)
    assert loaded.filename == str(path)
    assert (loaded.exported is not None) == fmt.startswith("exported")


def test_loaded_serialized_exported_calls_with_pytrees(exported, inputs, tmp_path):
    path = tmp_path / "model.exported"
    path.write_bytes(exported.serialize())
    loaded = rp.load(str(path))
    assert_trees_close(loaded.call(*inputs), jax.jit(tree_fn)(*inputs))


def test_export_vjp_module_round_trips_through_every_format(tmp_path):
    """The markers export_vjp adds (remat.cotangent / remat.gradient, @remat.name)
    must survive every format a user may store the module in, portable
    artifacts included (they are the stable format for StableHLO)."""
    def f(w, x):
        return jnp.sum(rp.checkpoint_name(jnp.sin(x @ w), "h") ** 2)
    w, x = jnp.ones((3, 4)), jnp.ones((2, 3))
    m = rp.export_vjp(f, w, x)
    assert arg_attr_names(m)[2] == {"remat.cotangent"}
    datas = {"text": str(m), "bytecode": m.bytecode()}
    error = None
    try:
        datas["portable-artifact"] = mlir.to_portable_artifact(m.op)
    except Exception as e:  # noqa: BLE001 - reported as the failure below
        error = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    if error:
        pytest.fail(f"cannot write an export_vjp module as a portable artifact: {error}")
    for fmt, data in datas.items():
        back = rp.Module.parse(data)
        assert str(back) == str(m), fmt
        assert arg_attr_names(back)[2] == {"remat.cotangent"}, fmt


# ----------------------------------------------------------- save & load --


@pytest.mark.parametrize("bytecode", [False, True])
def test_save_then_load(module, tmp_path, bytecode):
    path = tmp_path / "out.mlir"
    module.save(str(path), bytecode=bytecode)
    data = path.read_bytes()
    assert (data[:4] == mlir.BYTECODE_MAGIC) == bytecode
    loaded = rp.load(str(path))
    assert str(loaded) == str(module)
    # Locations are kept by default (reports use them for source positions).
    assert loaded.text(debug_info=True) == module.text(debug_info=True)
    assert "tree_fn" in loaded.text(debug_info=True)


def test_save_without_debug_info(module, tmp_path):
    path = tmp_path / "out.mlir"
    module.save(str(path), debug_info=False)
    text = path.read_text()
    assert "loc(" not in text
    assert text == str(module)


def test_save_overwrites(module, tmp_path):
    path = tmp_path / "out.mlir"
    path.write_text("old content that is longer than nothing" * 100)
    module.save(str(path))
    assert str(rp.load(str(path))) == str(module)


def test_save_missing_directory_raises_and_writes_nothing(module, tmp_path):
    path = tmp_path / "no" / "such" / "dir" / "out.mlir"
    with pytest.raises(rp.RematError, match=r"cannot write .*out\.mlir"):
        module.save(str(path))
    assert not path.exists()
    assert not (tmp_path / "no").exists()
    assert list(tmp_path.iterdir()) == []


def test_save_onto_directory_raises_and_leaves_no_temp_file(module, tmp_path):
    target = tmp_path / "a_directory"
    target.mkdir()
    with pytest.raises(rp.RematError, match="cannot write"):
        module.save(str(target))
    assert target.is_dir() and list(target.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_directory"]


def test_save_failure_keeps_old_file(module, tmp_path, monkeypatch):
    """A failure while replacing the file leaves the old content and no temp file."""
    path = tmp_path / "out.mlir"
    path.write_text("precious")

    def failing_replace(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(rp.RematError, match="No space left on device"):
        module.save(str(path))
    monkeypatch.undo()
    assert path.read_text() == "precious"
    assert [p.name for p in tmp_path.iterdir()] == ["out.mlir"]


def test_save_respects_umask(module, tmp_path):
    """A saved file gets the usual permissions (0666 & ~umask), not mkstemp's 0600,
    and overwriting a file does not narrow its permissions."""
    old = os.umask(0o022)
    try:
        path = tmp_path / "new.mlir"
        module.save(str(path))
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
        existing = tmp_path / "existing.mlir"
        existing.write_text("x")
        os.chmod(existing, 0o644)
        module.save(str(existing), bytecode=True)
        assert stat.S_IMODE(existing.stat().st_mode) == 0o644
    finally:
        os.umask(old)


def test_clone_is_independent(module, inputs):
    copy = module.clone()
    assert str(copy) == str(module)
    assert copy.exported is module.exported
    before = str(module)
    with mlir.context():
        for op in list(copy.op.body.operations):
            op.operation.erase()
    assert copy.functions() == []
    assert str(module) == before
    assert module.functions() == ["main"]


# --------------------------------------------- jax.export calling convention --


def test_from_exported_call_matches_jit(module, exported, inputs):
    assert module.exported is exported
    want = jax.jit(tree_fn)(*inputs)
    got = module.call(*inputs)
    assert isinstance(got, dict) and isinstance(got["stats"], list)
    assert_trees_close(got, want)


def test_to_exported_keeps_trees(module, exported, inputs):
    for exp in (module.to_exported(), rp.to_exported(module, "main")):
        assert exp.in_tree == exported.in_tree
        assert exp.out_tree == exported.out_tree
        assert tuple(exp.in_avals) == tuple(exported.in_avals)
        assert_trees_close(exp.call(*inputs), jax.jit(tree_fn)(*inputs))
    assert_trees_close(rp.compile(module, "main")(*inputs), jax.jit(tree_fn)(*inputs))


def test_to_exported_runs_the_module_not_the_original(module, inputs):
    """The Exported must carry the (transformed) module, not the original one."""
    changed = module.clone()
    # Replace tanh by sine in the body: the results must change accordingly.
    text = str(changed).replace("stablehlo.tanh", "stablehlo.sine")
    assert text != str(changed)
    changed = rp.Module.parse(text)
    changed.exported = module.exported
    params, xs = inputs
    got = changed.call(*inputs)
    np.testing.assert_allclose(got["h"], jnp.sin(xs[0] @ params["w"] + params["b"]),
                               rtol=1e-5, atol=1e-6)


def test_transformed_module_keeps_calling_convention(module, inputs):
    m = module.clone()
    rp.run_pipeline(m.op, rp.parse_pipeline("builtin.module(cse,canonicalize)"))
    assert_trees_close(m.call(*inputs), jax.jit(tree_fn)(*inputs))


def test_value_and_grad_export_remat_keeps_pytrees():
    """A whole jitted value_and_grad (no export_vjp): remat finds the backward from
    JAX's transpose name stacks, and the result still takes/returns pytrees."""
    def loss(params, batch):
        h = jnp.tanh(batch["x"] @ params["w1"])
        return jnp.mean((h @ params["w2"] - batch["y"]) ** 2)
    rng = np.random.default_rng(1)
    params = {"w1": jnp.asarray(rng.normal(size=(4, 8)), jnp.float32),
              "w2": jnp.asarray(rng.normal(size=(8, 2)), jnp.float32)}
    batch = {"x": jnp.asarray(rng.normal(size=(5, 4)), jnp.float32),
             "y": jnp.asarray(rng.normal(size=(5, 2)), jnp.float32)}
    vg = jax.jit(jax.value_and_grad(loss))
    m = rp.from_exported(export.export(vg)(params, batch))
    r = rp.remat(m, "nothing_saveable")
    got = r.call(params, batch)
    assert isinstance(got[1], dict)
    assert_trees_close(got, vg(params, batch))


def test_multi_platform_exported_keeps_calling_convention(inputs):
    """An Exported lowered for several platforms has a platform-index argument in
    its module; calling through the Module must still use the pytree convention."""
    exp = export.export(jax.jit(tree_fn), platforms=["cpu", "cuda"])(*inputs)
    m = rp.from_exported(exp)
    assert_trees_close(m.call(*inputs), exp.call(*inputs))


def test_shape_polymorphic_exported_keeps_calling_convention(inputs):
    params, xs = inputs
    (b,) = export.symbolic_shape("b")
    specs = [jax.ShapeDtypeStruct((b, 3), jnp.float32), jax.ShapeDtypeStruct((b, 4), jnp.float32)]
    exp = export.export(jax.jit(tree_fn))(params, specs)
    m = rp.from_exported(exp)
    assert_trees_close(m.call(params, xs), jax.jit(tree_fn)(params, xs))


MULTI_FUNC = """module {
  func.func public @main(%a: tensor<3xf32>) -> tensor<3xf32> {
    %0 = func.call @outer(%a) : (tensor<3xf32>) -> tensor<3xf32>
    return %0 : tensor<3xf32>
  }
  func.func private @outer(%a: tensor<3xf32>) -> tensor<3xf32> {
    %0 = func.call @inner(%a) : (tensor<3xf32>) -> tensor<3xf32>
    %1 = stablehlo.add %0, %a : tensor<3xf32>
    return %1 : tensor<3xf32>
  }
  func.func private @inner(%a: tensor<3xf32>) -> tensor<3xf32> {
    %0 = stablehlo.sine %a : tensor<3xf32>
    return %0 : tensor<3xf32>
  }
  func.func public @pair(%a: tensor<3xf32>, %b: tensor<2xf32>) -> (tensor<2xf32>, tensor<3xf32>) {
    %0 = func.call @inner(%a) : (tensor<3xf32>) -> tensor<3xf32>
    return %b, %0 : tensor<2xf32>, tensor<3xf32>
  }
}
"""


def test_functions_and_call_by_name():
    m = rp.Module.parse(MULTI_FUNC)
    assert m.exported is None
    assert m.functions() == ["main", "outer", "inner", "pair"]
    x = jnp.arange(3.0, dtype=jnp.float32)
    y = jnp.asarray([5.0, 6.0], jnp.float32)
    np.testing.assert_allclose(m.call(x), jnp.sin(x) + x, rtol=1e-6)
    np.testing.assert_allclose(m.call(x, function="outer"), jnp.sin(x) + x, rtol=1e-6)
    b, s = m.call(x, y, function="pair")
    np.testing.assert_array_equal(b, y)
    np.testing.assert_allclose(s, jnp.sin(x), rtol=1e-6)
    exp = m.to_exported("pair")
    assert [a.shape for a in exp.in_avals] == [(3,), (2,)]
    assert [a.shape for a in exp.out_avals] == [(2,), (3,)]
    # The module itself is untouched by to_exported.
    assert m.functions() == ["main", "outer", "inner", "pair"]


def test_call_private_callee_used_by_another_private_function():
    """@inner is also called from @outer; exporting @inner alone must still work."""
    m = rp.Module.parse(MULTI_FUNC)
    x = jnp.arange(3.0, dtype=jnp.float32)
    np.testing.assert_allclose(m.call(x, function="inner"), jnp.sin(x), rtol=1e-6)


def test_call_missing_function_raises(module):
    with pytest.raises(rp.RematError, match=r"no function @nope.*@main"):
        module.call(function="nope")
    with pytest.raises(rp.RematError, match="@nope"):
        rp.to_exported(module, "nope")


# ----------------------------------------------------------------- errors --


def test_parse_error_names_file_line_col():
    with pytest.raises(rp.RematError) as info:
        rp.Module.parse(BAD_OP_TEXT, filename="model.mlir")
    msg = str(info.value)
    assert msg.startswith("model.mlir:3:10: error:")
    assert "stablehlo.bogus" in msg


def test_parse_error_without_filename_still_has_line_col():
    with pytest.raises(rp.RematError) as info:
        rp.Module.parse(BAD_OP_TEXT)
    assert re.match(r"^\S+:3:10: error:", str(info.value))


def test_load_error_names_path_line_col(tmp_path):
    path = tmp_path / "broken.mlir"
    path.write_text(BAD_OP_TEXT)
    with pytest.raises(rp.RematError) as info:
        rp.load(str(path))
    assert str(info.value).startswith(f"{path}:3:10: error:")


def test_verifier_error_is_a_remat_error_with_location():
    text = ("func.func @main(%a: tensor<f32>) -> tensor<2xf32> {\n"
            "  return %a : tensor<f32>\n}\n")
    with pytest.raises(rp.RematError, match=r"^f\.mlir:2:3: error: type of return operand"):
        rp.Module.parse(text, filename="f.mlir")


@pytest.mark.parametrize("how", ["parse", "load"])
def test_garbage_bytes_name_the_formats(tmp_path, how):
    if how == "parse":
        with pytest.raises(rp.RematError) as info:
            rp.Module.parse(GARBAGE, filename="junk.bin")
        where = "junk.bin"
    else:
        path = tmp_path / "junk.bin"
        path.write_bytes(GARBAGE)
        with pytest.raises(rp.RematError) as info:
            rp.load(str(path))
        where = str(path)
    msg = str(info.value)
    assert msg.startswith(f"{where}: error:")
    for fmt in ("MLIR text", "MLIR bytecode", "portable artifact", "jax.export.Exported"):
        assert fmt in msg


@pytest.mark.parametrize("fmt", ["bytecode", "portable-artifact", "exported-bytes"])
def test_truncated_input_is_a_remat_error(module, exported, fmt):
    data = bytes(encode(module, exported, fmt))
    with pytest.raises(rp.RematError, match="error"):
        rp.Module.parse(data[: len(data) // 2], filename="cut.bin")


def test_load_missing_file(tmp_path):
    path = tmp_path / "missing.mlir"
    with pytest.raises(rp.RematError, match=r"cannot read .*missing\.mlir.*No such file"):
        rp.load(str(path))


def test_remat_error_is_not_an_mlir_error():
    assert issubclass(rp.RematError, Exception)
    assert not issubclass(rp.RematError, ir.MLIRError)


def test_call_compiles_once_per_module_and_compile_donates():
    """Module.call reuses one compiled callable while the module is unchanged (a training
    loop calling it does not recompile every step); a changed module gets a new one;
    rp.compile takes donate_argnums."""
    def f(w, x):
        return jnp.sum(jnp.sin(x @ w))
    w, x = jnp.ones((4, 4)), jnp.ones((2, 4))
    m = rp.remat(rp.export_vjp(f, w, x), "nothing_saveable")
    first = rp.compile(m)
    assert rp.compile(m) is first
    out = m.call(w, x, jnp.float32(1.0))
    assert rp.compile(m) is first
    with m.op.context:      # any edit of the module: a new compiled callable
        m.op.operation.attributes["test.edited"] = mlir.ir.UnitAttr.get()
    changed = rp.compile(m)
    assert changed is not first
    np.testing.assert_allclose(jax.tree_util.tree_leaves(changed(w, x, jnp.float32(1.0)))[1],
                               jax.tree_util.tree_leaves(out)[1])
    donated = jnp.ones((4, 4))
    rp.compile(m, donate_argnums=0)(donated, x, jnp.float32(1.0))
    assert donated.is_deleted()


def test_a_jax_module_written_without_locations_is_remarked(tmp_path):
    """Module.text() leaves out the locations, and with them JAX's name stacks: the passes
    then find the backward by the cotangent marks alone, and JAX's transpose work that reads
    no cotangent counts as forward (here its results are saved: more bytes kept). A remark
    says so where a JAX module comes without them; with them (Module.save's default) there
    is none."""
    from remat_passes.core.residuals import activation_bytes

    def f(w, x):
        h = x @ w
        m = (h - h.mean(-1, keepdims=True)) * jax.lax.rsqrt(h.var(-1, keepdims=True) + 1e-5)
        return jnp.sum(jax.nn.gelu(m) * jax.nn.softmax(h, axis=-1))
    args = (jnp.ones((8, 8), jnp.float32), jnp.ones((4, 8), jnp.float32))
    m = rp.export_vjp(f, *args)
    kept, said = {}, {}
    for debug_info in (False, True):
        path = tmp_path / f"m{debug_info}.mlir"
        path.write_text(m.text(debug_info=debug_info))
        out = rp.remat(rp.load(str(path)), None)
        kept[debug_info] = activation_bytes(out.residuals)
        said[debug_info] = [str(r) for r in out.remarks if "name stack" in str(r)]
    assert said[True] == []
    assert len(said[False]) == 1 and "Module.text() leaves them out" in said[False][0]
    assert kept[False] > kept[True], kept
