"""remat-opt, the mlir-opt style driver, run as a subprocess.

Success exits 0; user errors exit 1 with a message whose first line names the
problem, no Python traceback, nothing on stdout and no `-o` file written or
truncated. The output equals the Python API's result for the same pipeline.
Verification failures after a pass name the pass.
"""
import os
import subprocess
import sys
import typing

import jax.numpy as jnp
import numpy as np
import pytest

import remat_passes as rp
from remat_passes import cli
from remat_passes.ir import mlir
from remat_passes.passes import manager as pipeline
from remat_passes.passes.base import ModulePass
from remat_passes.passes.registry import registry
from remat_testlib import run_process

PIPELINE = "builtin.module(remat-partial-eval{policy=dots_saveable},strip-checkpoint-names)"

BAD_OP_TEXT = """module {
  func.func @main(%a: tensor<f32>) -> tensor<f32> {
    %0 = stablehlo.bogus %a : tensor<f32>
    return %0 : tensor<f32>
  }
}
"""

OLD_OUTPUT = b"previous output, must survive a failed run\n"


def f(w, x):
    h = rp.checkpoint_name(jnp.sin(x @ w), "h")
    return jnp.sum(jnp.tanh(h) @ w.T)


@pytest.fixture(scope="module")
def vjp_module():
    return rp.export_vjp(f, jnp.ones((3, 4)) * 0.5, jnp.ones((2, 3)))


@pytest.fixture(scope="module")
def files(tmp_path_factory, vjp_module):
    d = tmp_path_factory.mktemp("cli")
    vjp = d / "vjp.mlir"
    vjp_module.save(str(vjp))
    vjp_bc = d / "vjp.mlirbc"
    vjp_module.save(str(vjp_bc), bytecode=True)
    bad = d / "bad.mlir"
    bad.write_text(BAD_OP_TEXT)
    two = d / "two.mlir"
    two.write_text("module {\n}\nmodule {\n  func.func @main() {\n    return\n  }\n}\n")
    escaped = d / "escaped.mlir"     # valid UTF-8 text whose string escapes spell 0xFF
    escaped.write_text('func.func @main(%a: tensor<f32> {"x.\\FF" = 1 : i32}) -> tensor<f32> '
                       '{\n  return %a : tensor<f32>\n}\n')
    recursive = d / "recursive.mlir"
    recursive.write_text(RECURSIVE_TEXT)
    return {"vjp": str(vjp), "vjp_bc": str(vjp_bc), "bad": str(bad), "two": str(two),
            "escaped": str(escaped), "recursive": str(recursive), "dir": d}


RECURSIVE_TEXT = """\
func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> tensor<4xf32> {
  %0 = func.call @a(%x) : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
func.func private @a(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = func.call @b(%x) : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
func.func private @b(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = func.call @a(%x) : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""


def remat_opt(*args, stdin=None, platforms="cpu"):
    env = dict(os.environ, JAX_PLATFORMS=platforms)
    return run_process([sys.executable, "-m", "remat_passes.cli", *map(str, args)],
                       input=stdin, capture_output=True, env=env, timeout=300)


def api_result(path, pipeline_text=PIPELINE):
    m = rp.load(path)
    rp.run_pipeline(m.op, rp.parse_pipeline(pipeline_text))
    return str(m)


def assert_user_error(proc, *needles):
    err = proc.stderr.decode()
    assert proc.returncode == 1, err
    assert "Traceback" not in err
    assert proc.stdout == b""
    first = err.splitlines()[0]
    assert "error" in first, err
    for needle in needles:
        assert needle in first, f"{needle!r} not in first line {first!r}"
    return err


# ---------------------------------------------------------------- success --


def test_pipeline_output_equals_python_api(files):
    proc = remat_opt(files["vjp"], f"--pass-pipeline={PIPELINE}")
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout.decode()
    assert out == api_result(files["vjp"])
    assert "remat.name" not in out
    assert "remat.name" in open(files["vjp"]).read()


def test_pass_flags_equal_pipeline_and_remat_api(files):
    proc = remat_opt(files["vjp"], "--remat-partial-eval=policy=dots_saveable",
                     "--strip-checkpoint-names")
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode() == api_result(files["vjp"])


def test_remat_flag_equals_remat_api(files):
    """--remat runs the default pipeline, exactly what remat_passes.remat() runs."""
    proc = remat_opt(files["vjp"], "--remat=policy=dots_saveable")
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode() == str(rp.remat(rp.load(files["vjp"]), "dots_saveable"))
    assert "stablehlo.optimization_barrier" in proc.stdout.decode()


def test_split_mode_output(files):
    proc = remat_opt(files["vjp"], "--remat-partial-eval=policy=nothing_saveable mode=split")
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout.decode()
    assert out == api_result(
        files["vjp"], "builtin.module(remat-partial-eval{policy=nothing_saveable mode=split})")
    assert rp.Module.parse(out).functions() == ["main_fwd", "main_bwd"]


@pytest.mark.parametrize("which", ["vjp", "vjp_bc"])
def test_stdin_input(files, which):
    data = open(files[which], "rb").read()
    proc = remat_opt(f"--pass-pipeline={PIPELINE}", stdin=data)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode() == api_result(files["vjp"])
    explicit = remat_opt("-", f"--pass-pipeline={PIPELINE}", stdin=data)
    assert explicit.returncode == 0 and explicit.stdout == proc.stdout


def test_output_file(files, tmp_path):
    out = tmp_path / "out.mlir"
    out.write_bytes(OLD_OUTPUT)
    proc = remat_opt(files["vjp"], f"--pass-pipeline={PIPELINE}", "-o", out)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout == b""
    assert out.read_text() == api_result(files["vjp"])


def test_emit_bytecode(files, tmp_path):
    out = tmp_path / "out.mlirbc"
    proc = remat_opt(files["vjp"], f"--pass-pipeline={PIPELINE}", "--emit-bytecode", "-o", out)
    assert proc.returncode == 0, proc.stderr.decode()
    data = out.read_bytes()
    assert data[:4] == mlir.BYTECODE_MAGIC
    assert str(rp.Module.parse(data)) == api_result(files["vjp"])


def test_no_passes_round_trips(files):
    proc = remat_opt(files["vjp"])
    assert proc.returncode == 0
    assert proc.stdout.decode() == str(rp.load(files["vjp"]))


# ----------------------------------------------------------------- errors --


def _error_cases(files):
    return {
        "malformed-mlir": ([files["bad"]], [f"{files['bad']}:3:10", "stablehlo.bogus"]),
        "unknown-pass-in-pipeline": ([files["vjp"], "--pass-pipeline=builtin.module(no-such-pass)"],
                                     ["unknown pass", "no-such-pass"]),
        "unknown-pass-flag": ([files["vjp"], "--no-such-pass"], ["--no-such-pass"]),
        "unknown-option": ([files["vjp"], "--remat-partial-eval=polcy=dots_saveable"],
                           ["unknown option", "polcy", "remat-partial-eval"]),
        "bad-option-value": ([files["vjp"], "--remat-partial-eval=policy=no_such_policy"],
                             ["policy", "no_such_policy"]),
        "bad-core-pass-option": ([files["vjp"], "--cse=bogus=1"], ["cse"]),
        "missing-file": ([files["dir"] / "missing.mlir"], ["missing.mlir", "No such file"]),
        "missing-function": ([files["vjp"], "--remat-partial-eval=func=nope"], ["@nope"]),
        "missing-function-pipeline": (
            [files["vjp"], "--pass-pipeline=builtin.module(remat-partial-eval{func=nope})"],
            ["@nope"]),
        "garbage-input": (None, ["MLIR text", "Exported"]),
        "two-modules": ([files["two"]], [f"{files['two']}:1:1", "2 top-level modules",
                                         f"{files['two']}:3:1", "--split-input-file"]),
        # (reading such an attribute name aborted the process)
        "escaped-non-utf8": ([files["escaped"], "--print-memory"],
                             [f"{files['escaped']}:1:34", "not UTF-8"]),
        # (the call that closes the cycle is named)
        "recursive-calls": ([files["recursive"], "--remat=policy=nothing_saveable"],
                            [f"{files['recursive']}:10:8", "recursive calls",
                             "@a -> @b -> @a"]),
        # (a budget past a float's range was an OverflowError's traceback)
        "budget-beyond-a-float": ([files["vjp"], "--remat=policy=auto(budget=1e400)"],
                                  ["budget '1e400'", "more bytes than a float holds"]),
        # (an unknown memory kind was written into the module as it was)
        "unknown-memory-kind": (
            [files["vjp"], "--remat=policy=offload_dot_with_no_batch_dims(device, nowhere)"],
            ["offload_dst", "device, pinned_host, unpinned_host", "'nowhere'"]),
    }


ERROR_CASES = ["malformed-mlir", "unknown-pass-in-pipeline", "unknown-pass-flag", "unknown-option",
               "bad-option-value", "bad-core-pass-option", "missing-file", "missing-function",
               "missing-function-pipeline", "garbage-input", "two-modules",
               "escaped-non-utf8", "recursive-calls", "budget-beyond-a-float",
               "unknown-memory-kind"]


@pytest.mark.parametrize("case", ERROR_CASES)
def test_user_errors(files, tmp_path, case):
    args, needles = _error_cases(files)[case]
    if args is None:
        junk = tmp_path / "junk.bin"
        junk.write_bytes(b"\x00\xff\xfe\x89garbage\x00" * 8)
        args = [junk]
    out = tmp_path / "out.mlir"
    out.write_bytes(OLD_OUTPUT)
    proc = remat_opt(*args, "-o", out)
    assert_user_error(proc, *needles)
    assert out.read_bytes() == OLD_OUTPUT
    # No temporary file is left next to the output either.
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["out.mlir"] + (["junk.bin"] if case == "garbage-input" else []))


def test_error_on_missing_output_dir(files, tmp_path):
    out = tmp_path / "no" / "dir" / "out.mlir"
    proc = remat_opt(files["vjp"], "-o", out)
    assert_user_error(proc, "cannot write", "out.mlir")
    assert not (tmp_path / "no").exists()


def test_error_without_output_file_writes_nothing_to_stdout(files):
    proc = remat_opt(files["bad"])
    err = assert_user_error(proc, "stablehlo.bogus")
    assert err.startswith(f"{files['bad']}:3:10: error:")


def test_no_cotangents_is_a_user_error(tmp_path):
    plain = tmp_path / "plain.mlir"
    plain.write_text("func.func @main(%a: tensor<f32>) -> tensor<f32> {\n"
                     "  %0 = stablehlo.sine %a : tensor<f32>\n"
                     "  return %0 : tensor<f32>\n}\n")
    proc = remat_opt(plain, "--remat-partial-eval")
    assert_user_error(proc, "remat.cotangent")


def test_no_cotangents_behind_a_call_says_run_inline(tmp_path):
    """What jax.export makes of a jitted value_and_grad with a symbolic dimension: @main
    only calls the function that holds the forward and the backward (issue 28). Alone,
    remat-partial-eval says to inline first; after inline it finds the transposes."""
    wrapped = tmp_path / "wrapped.mlir"
    wrapped.write_text(
        "func.func @main(%a: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {\n"
        "  %0:2 = func.call @step(%a) : (tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>)\n"
        "  return %0#0, %0#1 : tensor<4xf32>, tensor<4xf32>\n}\n"
        "func.func private @step(%a: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {\n"
        "  %0 = stablehlo.sine %a : tensor<4xf32> loc(\"jit(step)/sin\")\n"
        "  %1 = stablehlo.cosine %a : tensor<4xf32> loc(\"jit(step)/jvp(sin)\")\n"
        "  %2 = stablehlo.multiply %1, %1 : tensor<4xf32> loc(\"jit(step)/transpose(jvp(sin))/mul\")\n"
        "  return %0, %2 : tensor<4xf32>, tensor<4xf32>\n}\n")
    proc = remat_opt(wrapped, "--remat-partial-eval=policy=nothing_saveable")
    assert_user_error(proc, "cannot tell forward from backward", "calls 1 function(s)",
                      "run the inline pass first")
    proc = remat_opt(wrapped, "--inline", "--remat-partial-eval=policy=nothing_saveable",
                     "--print-saved-residuals")
    assert proc.returncode == 0, proc.stderr.decode()
    assert "saved residuals of @main" in proc.stdout.decode()


# ------------------------------------------------- verification after a pass --


class BreakDominance(ModulePass):
    """Test-only pass producing invalid IR: moves the op before the return to the
    top of @main, before the producers of its operands."""
    name = "break-dominance"
    summary = "test only: break SSA dominance"

    def apply(self, module, state):
        func = next(op for op in module.body.operations if op.operation.name == "func.func")
        ops = list(func.regions[0].blocks[0].operations)
        ops[-2].move_before(ops[0])


class BreakTypes(ModulePass):
    """Test-only pass producing invalid IR: returns the first argument in place of
    the first result, of another type."""
    name = "break-types"
    summary = "test only: return a value of the wrong type"

    def apply(self, module, state):
        func = next(op for op in module.body.operations if op.operation.name == "func.func")
        block = func.regions[0].blocks[0]
        ret = list(block.operations)[-1]
        ret.operands[0] = block.arguments[0]


@pytest.fixture
def broken_passes(monkeypatch):
    original = registry

    def patched():
        return {**original(), BreakDominance.name: BreakDominance, BreakTypes.name: BreakTypes}
    monkeypatch.setattr(pipeline, "registry", patched)
    return patched


@pytest.mark.parametrize("bad_pass, symptom", [("break-dominance", "does not dominate"),
                                               ("break-types", "type of return operand")])
def test_verification_failure_names_the_pass(broken_passes, files, bad_pass, symptom):
    m = rp.load(files["vjp"])
    steps = pipeline.parse_pipeline(f"builtin.module(cse,{bad_pass},canonicalize)")
    with pytest.raises(rp.RematError) as info:
        pipeline.run_pipeline(m.op, steps)
    msg = str(info.value)
    assert f"verification failed after pass '{bad_pass}'" in msg.splitlines()[0]
    assert symptom in msg
    assert "'cse'" not in msg and "canonicalize" not in msg


def test_verify_each_false_skips_verification(broken_passes, files):
    """The error above comes from verify-each (not from the pass itself)."""
    m = rp.load(files["vjp"])
    pipeline.run_pipeline(m.op, pipeline.parse_pipeline("builtin.module(break-dominance)"),
                          verify_each=False)
    with pytest.raises(rp.RematError, match="verification failed"):
        m.verify()


def test_cli_reports_verification_failure(broken_passes, files, tmp_path, capsys):
    out = tmp_path / "out.mlir"
    out.write_bytes(OLD_OUTPUT)
    code = cli.main([files["vjp"], "--pass-pipeline=builtin.module(break-dominance)",
                     "-o", str(out)])
    captured = capsys.readouterr()
    assert code == 1
    assert "verification failed after pass 'break-dominance'" in captured.err.splitlines()[0]
    assert "Traceback" not in captured.err
    assert out.read_bytes() == OLD_OUTPUT


# ------------------------------------------------------ output and inputs --
def test_output_through_a_symlink_replaces_the_target(files, tmp_path):
    target = tmp_path / "target.mlir"
    target.write_bytes(OLD_OUTPUT)
    link = tmp_path / "link.mlir"
    link.symlink_to(target)
    proc = remat_opt(files["vjp"], "-o", link)
    assert proc.returncode == 0, proc.stderr
    assert link.is_symlink() and b"func.func" in target.read_bytes()


def test_output_to_non_regular_files_is_written_directly(files):
    proc = remat_opt(files["vjp"], "-o", "/dev/stdout")
    assert proc.returncode == 0 and b"func.func" in proc.stdout, proc.stderr
    before = os.stat("/dev/null")
    assert remat_opt(files["vjp"], "-o", "/dev/null").returncode == 0
    after = os.stat("/dev/null")
    assert (before.st_ino, before.st_rdev) == (after.st_ino, after.st_rdev)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_write_error_is_one_line():
    with open("/dev/full", "wb") as full:
        proc = run_process([sys.executable, "-m", "remat_passes.cli", "-"],
                              input=BAD_OP_TEXT.replace("stablehlo.bogus", "stablehlo.sine")
                              .encode(), stdout=full, stderr=subprocess.PIPE,
                              env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300)
    err = proc.stderr.decode()
    assert proc.returncode == 1 and "Traceback" not in err
    assert err.strip().splitlines() == ["remat-opt: error: cannot write the output: No space "
                                        "left on device"], err


def test_text_with_latin1_comment_and_binary_split_input(files, tmp_path):
    text = open(files["vjp"], "rb").read()
    latin = tmp_path / "latin.mlir"
    latin.write_bytes(b"// caf\xe9\n" + text)
    assert remat_opt(latin).returncode == 0
    proc = remat_opt(files["vjp_bc"], "--split-input-file")
    assert proc.returncode == 0 and b"func.func" in proc.stdout, proc.stderr


def test_python_api_rejects_wrong_kinds():
    with pytest.raises(TypeError, match="Module"):
        rp.remat("not a module")
    # every function that takes a module names itself and what it takes, not an
    # AttributeError from inside
    for name, call in [("rp.to_exported", rp.to_exported), ("rp.compile", rp.compile),
                       ("rp.estimate_memory", rp.estimate_memory), ("rp.pareto", rp.pareto),
                       ("rp.bounds", rp.bounds), ("rp.policy_points", rp.policy_points),
                       ("rp.recompute_seconds",
                        lambda m: rp.recompute_seconds(m, "nothing_saveable"))]:
        with pytest.raises(TypeError, match=rf"^{name} takes a remat_passes\.Module"):
            call("not a module")
    with pytest.raises(TypeError, match=r"rp.run_pipeline takes an ir.Module \(a "):
        rp.run_pipeline(rp.Module.parse(BAD_OP_TEXT.replace("stablehlo.bogus",
                                                            "stablehlo.sine")), [])
    with pytest.raises(TypeError, match="rp.jit: expected a function to compile, got int"):
        rp.jit(3)
    with pytest.raises(rp.RematError, match="unknown policy 'bogus'"):
        rp.jit(lambda x: x, policy="bogus")        # when made, not at the first call
    with pytest.raises(TypeError):
        rp.Module.parse(3)
    with pytest.raises(rp.RematError, match="empty input"):
        rp.Module.parse("")
    with pytest.raises(rp.RematError, match="region_regex"):
        rp.remat(rp.Module.parse(BAD_OP_TEXT.replace("stablehlo.bogus", "stablehlo.sine")
                                 .replace("@main", "@main")), region_regex="(")


def test_deep_nesting_is_a_located_error(tmp_path):
    """A type nested 20000 deep made MLIR's parser crash the process (a segfault)."""
    n = 20000
    deep = tmp_path / "deep.mlir"
    deep.write_text("func.func @f(%a: tuple<" + "tuple<" * n + "f32" + ">" * n + ">) {\n"
                    "  return\n}\n")
    proc = remat_opt(deep)
    err = assert_user_error(proc, "nested more than")
    assert err.startswith(f"{deep}:1:"), err


def test_a_backend_jax_cannot_start_is_a_user_error(files, tmp_path):
    """score=xla compiles each candidate: where JAX_PLATFORMS names a platform JAX cannot
    start here, the error says so (JAX itself asserts or raises), and no output is written;
    a plain auto needs no backend and runs."""
    out = tmp_path / "out.mlir"
    proc = remat_opt(files["vjp"], "--remat-partial-eval=policy=auto(50%,score=xla)",
                     "-o", out, platforms="bogus")
    assert_user_error(proc, "score=xla compiles with XLA", "could not start a backend",
                      "JAX_PLATFORMS=bogus")
    assert not out.exists()
    proc = remat_opt(files["vjp"], "--remat-partial-eval=policy=auto(50%)", "-o", out,
                     platforms="bogus")
    assert proc.returncode == 0, proc.stderr.decode()
    assert out.exists()


def test_short_runs_do_not_import_jax(files, tmp_path):
    """--version, --help, --list-passes and pipelines on MLIR input, auto and --print-pareto
    among them, run on jaxlib's bindings alone: `import jax` is most of the start-up time
    (see the start-up benchmark, `python -m tools.benchmarks startup`). A serialized
    Exported or a portable artifact imports it, as jax.export reads them."""
    runs = [["--version"], ["--help"], ["--list-passes"],
            [files["vjp"], "--pass-pipeline", PIPELINE],
            [files["vjp"], "--remat-partial-eval=policy=nothing_saveable mode=split",
             "--print-memory", "-o", tmp_path / "out.mlir"],
            [files["vjp"], "--print-saved-residuals", "--emit-bytecode",
             "-o", tmp_path / "out.mlirbc"],
            [files["vjp"], "--print-memory", "--memory-model=xla", "--memory-backend=gpu",
             "-o", tmp_path / "out2.mlir"],
            # auto prices ops by the platform JAX runs on, and the xla model models it:
            # found without starting a backend (jax_compat.platform_in_use)
            [files["vjp"], "--remat-partial-eval=policy=auto(50%)", "--print-memory",
             "--memory-model=xla", "-o", tmp_path / "out3.mlir"],
            [files["vjp"], "--print-pareto", "--pareto-points=2", "-o", tmp_path / "out4.mlir"]]
    script = ("import sys\n"
              "from remat_passes import cli\n"
              f"for argv in {[[str(a) for a in r] for r in runs]!r}:\n"
              "    try:\n"
              "        rc = cli.main(argv)\n"
              "    except SystemExit as e:\n"
              "        rc = e.code\n"
              "    assert rc == 0, (argv, rc)\n"
              "print('imported:', sorted(m for m in sys.modules if m.split('.')[0] == 'jax'))\n")
    proc = run_process([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "imported: []", proc.stdout[-2000:]


def test_pareto_round_exact_false_sweeps_as_rp_jit_builds_on_cpu(tmp_path, capsys):
    """--pareto-round-exact=false: the sweep as rp.jit builds on XLA:CPU (no f32 residual
    rounded), so no budget's extra FLOPs exceed the default sweep's, and some are lower
    (a kept product a recomputed tanh reads is not rounded); a bad value is an error that
    names the flag, with no output file."""
    def mlp(Ws, x):
        for w in Ws:
            x = jnp.tanh(x @ w)
        return jnp.sum(x)
    src = tmp_path / "mlp.mlir"
    rp.export_vjp(mlp, tuple(jnp.ones((16, 16)) * 0.1 for _ in range(3)),
                  jnp.ones((8, 16))).save(str(src))

    def extra(flag):
        out = tmp_path / f"p{len(flag)}.mlir"
        assert cli.main([str(src), "--print-pareto", "--pareto-points=4", *flag,
                         "-o", str(out)]) == 0
        text = capsys.readouterr().out
        rows = text.split("---|---|---|---|---|---\n", 1)[1].split("\n\n", 1)[0]
        return [float(r.split(" | ")[3].split("(")[1].split("%")[0])
                for r in rows.splitlines() if " | " in r]
    exact, not_exact = extra([]), extra(["--pareto-round-exact=false"])
    assert len(exact) == len(not_exact) >= 3, (exact, not_exact)
    assert all(b <= a for a, b in zip(exact, not_exact)), (exact, not_exact)
    assert any(b < a for a, b in zip(exact, not_exact)), (exact, not_exact)
    bad = tmp_path / "bad.mlir"
    with pytest.raises(SystemExit) as e:
        cli.main([str(src), "--print-pareto", "--pareto-round-exact=no", "-o", str(bad)])
    assert e.value.code != 0 and "--pareto-round-exact" in capsys.readouterr().err
    assert not bad.exists()


def test_memory_backend_chooses_the_backend_the_xla_model_models(files, tmp_path, capsys):
    """--memory-backend=gpu estimates a GPU's memory wherever remat-opt runs: the report's
    first line names that backend and the model's measured error there."""
    from remat_passes.cost.xla_buffers import model_line
    reports = {}
    for backend in ("gpu", "cpu"):
        assert cli.main([str(files["vjp"]), "--print-memory", "--memory-model=xla",
                         f"--memory-backend={backend}", "-o", str(tmp_path / "o.mlir")]) == 0
        reports[backend] = capsys.readouterr().out
        assert reports[backend].splitlines()[0] == model_line(backend)
    assert "gpu backend" in reports["gpu"] and reports["gpu"] != reports["cpu"]
    # alone it would choose nothing: an error that says what it needs, no output file
    out = tmp_path / "none.mlir"
    assert cli.main([str(files["vjp"]), "--print-memory", "--memory-backend=gpu",
                     "-o", str(out)]) == 1
    assert "--memory-backend chooses what --print-memory --memory-model=xla models" in \
        capsys.readouterr().err and not out.exists()


# ------------------------------------------------------- talking like a tool --


def test_help_lists_the_policies_and_the_auto_syntax():
    out = remat_opt("--help").stdout.decode()
    for name in ("nothing_saveable", "save_only_these_names", "save_from_both_policies",
                 "auto(BUDGET", "512MiB", "50%"):
        assert name in out, name


def test_python_source_as_input_gets_a_sentence(tmp_path):
    src = tmp_path / "model.py"
    src.write_text("import jax\n\ndef f(x):\n    return x\n")
    proc = remat_opt(src, "--remat")
    err = assert_user_error(proc, "this is Python source, not MLIR")
    assert "rp.export" in err


def test_auto_remarks_are_cut_to_a_summary_unless_asked(tmp_path):
    mlp = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "mlp.mlir")
    short = remat_opt(mlp, "--remat=policy=auto(0)")
    full = remat_opt(mlp, "--remat=policy=auto(0)", "--all-remarks")
    assert short.returncode == 0 and full.returncode == 0, short.stderr.decode()
    per_value = [ln for ln in full.stderr.decode().splitlines() if "auto recomputes " in ln]
    cut = [ln for ln in short.stderr.decode().splitlines() if "auto recomputes " in ln]
    assert len(per_value) > 5, per_value
    assert len(cut) == 6 and cut[-1].endswith(
        f"... and {len(per_value) - 5} more values auto recomputes (--all-remarks lists them)")
    assert cut[:5] == per_value[:5]


class _StepState(typing.NamedTuple):     # a pytree type only this process knows
    momentum: object
    count: object


def test_reads_an_exported_whose_pytrees_it_cannot_rebuild(tmp_path):
    """A serialized Exported of a training step whose state is a NamedTuple registered for
    serialization in the exporting process only: remat-opt (another process) reads the
    module inside and rewrites it."""
    import jax
    from jax import export

    try:
        export.register_namedtuple_serialization(_StepState,
                                                 serialized_name="remat_test._StepState")
    except ValueError:
        pass     # registered already (pytest-xdist reruns, say)

    def step(w, state, x):
        g = jax.grad(lambda w: jnp.sum(jnp.sin(x @ w)))(w)
        m = 0.9 * state.momentum + g
        return w - 0.1 * m, _StepState(m, state.count + 1)
    w, x = jnp.ones((3, 3)), jnp.ones((2, 3))
    exp = export.export(jax.jit(step))(w, _StepState(jnp.zeros((3, 3)), jnp.int32(0)), x)
    path = tmp_path / "step.exported"
    path.write_bytes(exp.serialize())
    proc = remat_opt(path, "--remat=policy=nothing_saveable", "--print-saved-residuals")
    assert proc.returncode == 0, proc.stderr.decode()
    assert "f32[3,3] from the argument state.momentum" in proc.stdout.decode()
    proc = remat_opt(path, "--remat=policy=nothing_saveable")
    assert proc.returncode == 0 and "func.func public @main" in proc.stdout.decode()
    # --emit-exported writes it back with its calling convention: loaded back here, it
    # takes and returns the step's NamedTuple, and computes what jax.jit(step) does
    out = tmp_path / "step.remat.exported"
    proc = remat_opt(path, "--remat=policy=nothing_saveable", "--emit-exported", "-o", out)
    assert proc.returncode == 0, proc.stderr.decode()
    back = export.deserialize(bytearray(out.read_bytes()))
    state = _StepState(jnp.ones((3, 3)), jnp.int32(4))
    got, want = back.call(w, state, x), jax.jit(step)(w, state, x)
    assert isinstance(got[1], _StepState)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    assert "optimization_barrier" in str(rp.Module.parse(out.read_bytes()))   # rewritten


def test_emit_exported_round_trips_an_optax_train_step(tmp_path):
    """The issue's case: a jax.export of an optax AdamW train step, its NamedTuples
    registered as JAX asks (in this process only); remat-opt rewrites it and writes an
    Exported whose call returns the train step's pytree, equal to jax.jit's."""
    import jax
    import optax
    from jax import export

    for t in (optax.ScaleByAdamState, optax.EmptyState):
        try:
            export.register_namedtuple_serialization(t, serialized_name=f"optax.{t.__name__}")
        except ValueError:
            pass
    opt = optax.adamw(1e-2)

    def step(params, opt_state, x):
        value, grads = jax.value_and_grad(
            lambda p: jnp.sum(jnp.tanh(jnp.sin(x @ p["w"]) @ p["v"])))(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, {"loss": value}
    params = {"w": jnp.full((4, 4), 0.1), "v": jnp.full((4, 4), 0.2)}
    state, x = opt.init(params), jnp.ones((2, 4))
    path = tmp_path / "train_step.exported"
    path.write_bytes(export.export(jax.jit(step))(params, state, x).serialize())
    out = tmp_path / "train_step.remat.exported"
    proc = remat_opt(path, "--remat=policy=nothing_saveable", "--emit-exported", "-o", out)
    assert proc.returncode == 0, proc.stderr.decode()
    got = export.deserialize(bytearray(out.read_bytes())).call(params, state, x)
    want = jax.jit(step)(params, state, x)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    # the split form has no @main with that convention: a clear error, no output file
    bad = tmp_path / "split.exported"
    proc = remat_opt(path, "--remat=policy=nothing_saveable mode=split", "--emit-exported",
                     "-o", bad)
    assert proc.returncode == 1 and not bad.exists()
    assert proc.stderr.decode().strip() == (
        "remat-opt: error: no @main to write as a jax.export.Exported (mode=split makes "
        "@main_fwd and @main_bwd: write the joint form, or the halves as MLIR)")
    proc = remat_opt(path, "--emit-exported", "--emit-bytecode")
    assert proc.returncode == 1 and "not both" in proc.stderr.decode()


def test_verify_diagnostics_fails_on_a_wrong_or_missing_expectation(tmp_path):
    """--verify-diagnostics passes only when every expected diagnostic is produced where
    the input says and nothing else is (exit 0), else names each mismatch (exit 1)."""
    body = ("func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> "
            "(tensor<4xf32>, tensor<4xf32>) {\n"
            "  %s = stablehlo.sine %x : tensor<4xf32>\n"
            "  %g = stablehlo.multiply %ct, %s : tensor<4xf32>\n"
            "  return %s, %g : tensor<4xf32>, tensor<4xf32>\n}\n")
    policy = "--remat-partial-eval=policy=save_only_these_names(h)"
    right = tmp_path / "right.mlir"
    right.write_text("// expected-remark @+1 {{'h' matches nothing}}\n" + body)
    assert remat_opt(right, "--verify-diagnostics", policy).returncode == 0
    wrong = tmp_path / "wrong.mlir"
    wrong.write_text("// expected-remark @+1 {{'g' matches nothing}}\n" + body)
    proc = remat_opt(wrong, "--verify-diagnostics", policy)
    err = proc.stderr.decode()
    assert proc.returncode == 1 and "Traceback" not in err
    assert f"{wrong}:1: error: expected remark \"'g' matches nothing\" was not produced" in err
    assert f"{wrong}:2: error: unexpected remark: @main: save_only_these_names('h')" in err
    missing = tmp_path / "missing.mlir"       # a remark nobody expected fails the run too
    missing.write_text(body)
    assert remat_opt(missing, "--verify-diagnostics", policy).returncode == 1
    bad = tmp_path / "bad.mlir"               # an expected error is a success
    bad.write_text("func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
                   "  // expected-error @+1 {{use of undeclared SSA value name}}\n"
                   "  return %y : tensor<4xf32>\n}\n")
    assert remat_opt(bad, "--verify-diagnostics", "--inline").returncode == 0
    assert remat_opt(bad, "--inline").returncode == 1


def test_a_serialized_export_vjp_keeps_its_cotangent_marks(tmp_path):
    """`rp.export_vjp(...).exported.serialize()` read by remat-opt: the cotangent is an
    argument of the backward, not a saved residual (the Exported carries the module with
    the marks export_vjp adds), so the CLI lists what the Python API lists."""
    import jax

    def f(W, x):
        return jnp.sum(jnp.sin(jnp.tanh(x @ W) @ W))
    m = rp.export_vjp(f, jnp.full((4, 4), 0.1), jnp.ones((2, 4)))
    api = [str(r) for r in rp.remat(m, "dots_saveable").residuals]
    path = tmp_path / "vjp.exported"
    path.write_bytes(m.exported.serialize())
    proc = remat_opt(path, "--print-saved-residuals", "--remat=policy=dots_saveable")
    assert proc.returncode == 0, proc.stderr.decode()
    lines = proc.stdout.decode().splitlines()
    assert lines[0] == f"// saved residuals of @main: {len(api)} values, " \
                       f"{sum(r.bytes for r in rp.remat(m, 'dots_saveable').residuals)} bytes"
    assert lines[1:1 + len(api)] == api
    assert not any("from the argument cotangent" in ln for ln in lines), lines
    # and the Exported still runs as the joint VJP
    out = jax.export.deserialize(bytearray(path.read_bytes())).call(
        jnp.full((4, 4), 0.1), jnp.ones((2, 4)), jnp.float32(1.0))
    want = jax.grad(f, argnums=(0, 1))(jnp.full((4, 4), 0.1), jnp.ones((2, 4)))
    for a, b in zip(jax.tree.leaves(out[1]), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-6)
