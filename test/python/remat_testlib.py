"""Shared helpers for the remat-partial-eval correctness tests.

* JAX's live answer for "which residuals does the forward pass save"
  (`jax_residual_types`), rendered the way `print_saved_residuals` does, and
  ours in the same words (`our_residual_types`);
* the reference VJP (`jax.vjp`) and the remat'd module run in joint and split
  form, compared leaf by leaf (`check_joint`, `check_split`);
* a small program-order view of a function body (`body_ops`) for structural
  checks that must not trust the pass's own dataflow helpers;
* `run_process`: a subprocess, run once more if a signal killed it.

Nothing here hard-codes an expected residual list: every expectation is
computed from JAX at test time.
"""
from __future__ import annotations

import hashlib
import subprocess
import sys
import threading
from collections import Counter

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
import numpy as np

import remat_passes as rp
from remat_passes.jax_compat import jax_saved_residuals as _jax_saved_residuals

# f32 gradient comparisons: rtol 1e-5, and an absolute floor of 1e-6 times the
# array's own scale (XLA fuses and reorders reductions differently in the
# exported module and in jax.vjp, so the error of an element that cancels to
# ~0 is set by the magnitude of the values that were summed, not by itself).
F32_RTOL = 1e-5
F32_ATOL = 1e-6


# ---------------------------------------------------------------- residuals --
def run_process(cmd, **kwargs) -> subprocess.CompletedProcess:
    """`subprocess.run(cmd, **kwargs)`, once more if a signal killed the process: on a loaded
    shared machine jaxlib's native code now and then crashes a process at the same
    instruction whatever it runs (conftest.py reruns a crashed test worker the same way).
    One killed twice is returned as it died."""
    proc = subprocess.run(cmd, **kwargs)
    if proc.returncode < 0:
        sys.stderr.write(f"{' '.join(map(str, cmd))[:120]}: killed by signal "
                         f"{-proc.returncode}; running it once more\n")
        proc = subprocess.run(cmd, **kwargs)
    return proc


def compiling_threads(monkeypatch) -> list:
    """The names of the threads that compile each `jax.jit(...).lower(...)` from now on,
    in the order the compiles start (a list that fills)."""
    threads = []
    compile_lowered = jax.stages.Lowered.compile

    def recorded(self, *args, **kwargs):
        threads.append(threading.current_thread().name)
        return compile_lowered(self, *args, **kwargs)
    monkeypatch.setattr(jax.stages.Lowered, "compile", recorded)
    return threads


def jax_saved_residuals(fun, *args):
    """JAX's (aval, description) list, as print_saved_residuals prints it.

    Entries 'from a literal' and 'from a constant' are left out: JAX keeps a Python
    scalar or a constant array that the backward multiplies by as a residual, while
    remat-partial-eval recomputes every constant for free (DESIGN.md section 4), so no
    constant is ever saved.
    """
    return [(a, d) for a, d in _jax_saved_residuals(fun, *args)
            if d not in ("from a literal", "from a constant")]


def with_shardy(f, *args, **kw):
    """`f(*args, **kw)` with Shardy on, the flag restored after: JAX's own `Exported.call` of
    a sharded export needs Shardy on at call time (a JAX limit), so a GSPMD test exports and
    rewrites with Shardy off and calls with it on."""
    before = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", True)
    try:
        return f(*args, **kw)
    finally:
        jax.config.update("jax_use_shardy_partitioner", before)


COLLECTIVE_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                    "collective-permute")


def compiled_collectives(fn, *args) -> list[int]:
    """How many collectives of each of COLLECTIVE_KINDS XLA's partitioner puts in the
    compiled `jax.jit(fn)` at `args` (compiled with Shardy on, see `with_shardy`)."""
    import re
    text = with_shardy(lambda: jax.jit(fn).lower(*args).compile().as_text())
    return [len(re.findall(r"\b" + k + r"(-start)?\(", text)) for k in COLLECTIVE_KINDS]


def ir_element(dtype) -> str:
    """The MLIR element type JAX lowers a dtype to ('f4E2M1FN' for float4_e2m1fn)."""
    from jax.interpreters import mlir as jax_mlir

    from remat_passes.ir import mlir
    with mlir.context():
        return str(jax_mlir.dtype_to_ir_type(np.dtype(dtype)))


def jax_type(aval) -> str:
    return aval.str_short(short_dtypes=True)


def jax_residual_types(fun, *args) -> Counter:
    """The multiset of JAX's residual type strings (e.g. 'f32[5,4]', 'f32<host>[4]')."""
    return Counter(jax_type(a) for a, _ in jax_saved_residuals(fun, *args))


def our_type(r) -> str:
    """Our residual's type in JAX's words.

    JAX prints an offloaded residual with its memory space (`f32<host>[4]`);
    ours carries the offload decision in `Residual.offload`, so render it the
    same way to compare both the shapes and the offload decisions.
    """
    if r.offload is not None and r.offload.dst in ("pinned_host", "unpinned_host"):
        head, _, rest = r.type.partition("[")
        return f"{head}<host>[{rest}"
    return r.type


def our_residual_types(residuals) -> Counter:
    return Counter(our_type(r) for r in residuals)


def assert_same_residual_types(ours, jax_fun, *args, context=""):
    """Compare our residuals (a list of Residual) with JAX's live answer for jax_fun(*args)."""
    expected = jax_residual_types(jax_fun, *args)
    got = our_residual_types(ours)
    if got != expected:
        lines = [f"residual types differ {context}".rstrip(),
                 f"  only ours: {dict(got - expected)}",
                 f"  only JAX : {dict(expected - got)}",
                 "  ours:"] + [f"    {r}" for r in ours] + ["  JAX:"] + \
                [f"    {jax_type(a)} {d}" for a, d in jax_saved_residuals(jax_fun, *args)]
        raise AssertionError("\n".join(lines))


# ---------------------------------------------------------------- numerics --
def leaves(tree):
    return jax.tree_util.tree_leaves(tree)


def _as_np(x):
    if getattr(x, "dtype", None) == jax.dtypes.float0:
        # export_vjp gives integer inputs a boolean zero cotangent
        return np.zeros(x.shape, np.bool_)
    return np.asarray(x)


def reference_vjp(fun, args, ct_seed=1234):
    """(outputs, cotangent, grads) of jax.vjp(fun, *args) at a random cotangent."""
    out, vjp = jax.vjp(fun, *args)
    out_leaves, tree = jax.tree_util.tree_flatten(out)
    keys = jax.random.split(jax.random.PRNGKey(ct_seed), len(out_leaves))
    ct_leaves = [jax.random.normal(k, o.shape, np.float32).astype(o.dtype)
                 for k, o in zip(keys, out_leaves)]
    ct = jax.tree_util.tree_unflatten(tree, ct_leaves)
    grads = vjp(ct)
    return out, ct, grads


def assert_trees_close(got, expected, *, rtol=F32_RTOL, atol=F32_ATOL, what=""):
    got_l = [_as_np(x) for x in leaves(got)]
    exp_l = [_as_np(x) for x in leaves(expected)]
    assert len(got_l) == len(exp_l), f"{what}: {len(got_l)} leaves, expected {len(exp_l)}"
    for i, (g, e) in enumerate(zip(got_l, exp_l)):
        assert g.shape == e.shape, f"{what} leaf {i}: shape {g.shape}, expected {e.shape}"
        if e.dtype == np.bool_:
            assert not g.any(), f"{what} leaf {i}: expected a zero cotangent"
            continue
        wide = np.complex128 if np.iscomplexobj(e) else np.float64   # (both parts of complex)
        g64, e64 = g.astype(wide), e.astype(wide)
        scale = max(1.0, float(np.max(np.abs(e64)))) if e64.size else 1.0
        np.testing.assert_allclose(g64, e64, rtol=rtol, atol=atol * scale,
                                   err_msg=f"{what} leaf {i}")


def run_joint(module, args, ct):
    """Outputs and grads of a joint module, as one flat list."""
    return leaves(module.call(*args, ct))


def run_split(module, args, ct, n_out):
    """Outputs (from main_fwd) and grads (from main_bwd) of a split module, flat."""
    fwd = leaves(module.call(*leaves(args), function="main_fwd"))
    outs, residuals = fwd[:n_out], fwd[n_out:]
    grads = leaves(module.call(*residuals, *leaves(ct), function="main_bwd"))
    return outs + grads, residuals


# --------------------------------------------------------------- structure --


_RUNS: dict = {}


def _inputs_key(*trees) -> str:
    """A digest of the inputs' values (dtype, shape, bytes of every leaf). The caches used
    `id(args)`, which a later tuple can take once the first is freed: a run of the same
    program on other inputs (two policies giving the same program, the other branch's
    arguments) answered with the first run's results."""
    digest = hashlib.sha256()
    for leaf in leaves(trees):
        a = np.asarray(leaf)
        digest.update(f"{a.dtype}{a.shape}".encode())
        digest.update(a.tobytes())
    return digest.hexdigest()


def run_joint_cached(module, args, ct):
    """run_joint, compiled once per program text and inputs (tests rewrite the same module
    often)."""
    key = ("joint", str(module), _inputs_key(args, ct))
    if key not in _RUNS:
        _RUNS[key] = run_joint(module, args, ct)
    return _RUNS[key]


def run_split_cached(module, args, ct, n_out):
    """run_split, compiled once per program text and inputs."""
    key = ("split", str(module), _inputs_key(args, ct), n_out)
    if key not in _RUNS:
        _RUNS[key] = run_split(module, args, ct, n_out)
    return _RUNS[key]

def parse_text(text: str):
    """An ir.Module from MLIR text, in the context remat_passes uses."""
    from remat_passes.ir import mlir
    with mlir.context():
        return mlir.ir.Module.parse(text)


def func_ops(ir_module, name="main"):
    """The top-level ops of @name, in program order (without the terminator)."""
    from remat_passes.ir import mlir
    for op in ir_module.body.operations:
        if op.operation.name == "func.func" and \
                mlir.ir.StringAttr(op.operation.attributes["sym_name"]).value == name:
            ops = [o.operation for o in op.regions[0].blocks[0].operations]
            return op, ops[:-1], ops[-1]
    raise KeyError(name)


# ------------------------------------- a model whose layers checkpoint themselves --
def checkpointed_layer(W, h):
    """A layer with a named value, for models whose layers are checkpoint regions."""
    a = checkpoint_name(jnp.sin(h @ W), "a")
    return jnp.tanh(a) @ W.T + h


def layered_loss(checkpoint, inner):
    """A loss over three layers, each `checkpoint(checkpointed_layer, policy=inner)`
    (`jax.checkpoint` or `rp.checkpoint`); its arguments are LAYERED_ARGS."""
    def loss(Ws, x):
        h = x
        for W in Ws:
            h = checkpoint(checkpointed_layer, policy=inner)(W, h)
        return jnp.sum(h ** 2)
    return loss


LAYERED_ARGS = ([jnp.ones((8, 8)) * 0.1 * (i + 1) for i in range(3)], jnp.ones((4, 8)))


def split_temp_bytes(split, args) -> list:
    """XLA's temp bytes of the compiled `main_fwd` and `main_bwd` of split-form `split`,
    the backward fed the forward's residuals and a cotangent of ones."""
    fwd = rp.compile(split, "main_fwd").lower(*args).compile()
    res = fwd(*args)
    bwd = rp.compile(split, "main_bwd").lower(*res[1:], jnp.ones_like(res[0])).compile()
    return [int(c.memory_analysis().temp_size_in_bytes) for c in (fwd, bwd)]
