"""Fuzzing remat-opt's entry point in-process: mutated inputs (truncations, byte flips and
insertions of MLIR text, bytecode, a StableHLO portable artifact and a serialized
jax.export.Exported) and random pipelines and options. Whatever comes in: exit 0 or 1,
never a Python traceback, a message on stderr when it fails, and the `-o` file untouched
by a failed run."""
from __future__ import annotations

import contextlib
import io
import random

import jax
import jax.numpy as jnp
import pytest
from jax import export as jax_export

import remat_passes as rp
from remat_passes import cli
from remat_passes.ir import mlir

OLD = b"previous output, must survive a failed run\n"

FLAGS = [
    [], ["--remat"], ["--remat=policy=nothing_saveable"], ["--remat=policy=dots_saveable mode=split"],
    ["--remat=policy=bogus_policy"], ["--remat=mode=sideways"], ["--inline"],
    ["--remat-partial-eval=policy=save_only_these_names(h)"], ["--print-saved-residuals"],
    ["--print-memory"], ["--remat-partial-eval=cotangent-args=7"], ["--split-input-file"],
    ["--remat-partial-eval=func=nope"], ["--strip-checkpoint-names"], ["--verify-each=false"],
    ["--pass-pipeline=builtin.module(inline,remat-partial-eval{policy=dots_saveable})"],
    ["--pass-pipeline=builtin.module(nonexistent)"], ["--pass-pipeline=garbage((("],
    ["--remat=policy=auto(budget=50%)"], ["--emit-bytecode"], ["--print-pareto"],
    ["--remat-partial-eval=region-regex=("], ["--place-optimization-barriers"],
]


def f(w, x):
    h = rp.checkpoint_name(jnp.sin(x @ w), "h")
    return jnp.sum(jnp.tanh(h) @ w.T)


@pytest.fixture(scope="module")
def seeds():
    w, x = jnp.ones((3, 4)) * 0.5, jnp.ones((2, 3))
    m = rp.export_vjp(f, w, x)
    text = m.text(debug_info=True).encode()
    exported = jax_export.export(jax.jit(lambda a: jnp.sin(a) * 2))(jnp.ones(3))
    with m.op.context:
        portable = bytes(jax_export.export(jax.jit(lambda a: jnp.cos(a)))(
            jnp.ones(2)).mlir_module_serialized)
    return [text, m.bytecode(), portable, bytes(exported.serialize())]


def mutate(rng: random.Random, data: bytes) -> bytes:
    kind = rng.randrange(4)
    if kind == 0 and len(data) > 1:                       # truncate
        return data[:rng.randrange(len(data))]
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(b))
        if kind == 1:                                     # flip a byte
            b[i] = rng.randrange(256)
        elif kind == 2:                                   # insert bytes
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 3)))
        else:                                             # a printable character
            b[i] = rng.choice(b"{}()<>%@:=,x0123456789abc \n\"#-")
    return bytes(b)


def run_cli(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as e:        # argparse: usage errors exit 2 by convention
            code = e.code
    return code, err.getvalue()


@pytest.mark.slow
def test_fuzzed_inputs_and_pipelines(seeds, tmp_path, monkeypatch):
    # some corrupt bytecode makes MLIR's parser loop forever: the guard gives up sooner here
    monkeypatch.setattr(mlir, "_PARSE_GUARD_SECONDS", 3.0)
    rng = random.Random(20261122)
    inp, outp = tmp_path / "in.mlir", tmp_path / "out.mlir"
    failures = []
    runs = 0
    for n in range(520):
        seed = seeds[n % len(seeds)]
        data = mutate(rng, seed) if n % 13 else seed      # a few valid inputs too
        flags = rng.choice(FLAGS) + (rng.choice(FLAGS) if rng.random() < 0.2 else [])
        inp.write_bytes(data)
        outp.write_bytes(OLD)
        try:
            code, err = run_cli([str(inp), *flags, "-o", str(outp)])
        except Exception as e:         # a traceback a user would see
            failures.append((n, flags, f"{type(e).__name__}: {e}"[:300]))
            continue
        runs += 1
        if code not in (0, 1, 2) or "Traceback" in err:
            failures.append((n, flags, f"exit {code}: {err[:300]}"))
        elif code != 0:
            if not err.strip() or "error" not in err.splitlines()[0]:
                failures.append((n, flags, f"exit {code} without an error line: {err[:300]}"))
            if outp.read_bytes() != OLD:
                failures.append((n, flags, "a failed run changed the -o file"))
    assert not failures, "\n".join(map(str, failures[:15])) + f"\n({len(failures)} in all)"
    assert runs >= 500
