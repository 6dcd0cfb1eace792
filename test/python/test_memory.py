"""The static memory estimate (remat_passes.memory): exact bytes on tiny modules,
and the proof that remat lowers the peak of a joint VJP function.

Model (see remat_passes/memory.py): ops run in program order; a value is live
from its producer to its last reader (captures in nested regions read at the
op that holds them); arguments from entry to their last use; returned values
to the end; at an op, the live bytes before it plus its results (plus, for an
op with regions, the largest internal peak of a region).

Units in the hand-written cases: K = 1024 bytes = one tensor<256xf32>.
"""
from __future__ import annotations

import os
import pathlib
import re
import types

import jax
import jax.numpy as jnp
import pytest
from jax.ad_checkpoint import checkpoint_name

import remat_passes as rp
from remat_passes import jax_compat
from remat_passes.cost.memory import MemoryEstimate, estimate_memory
from remat_passes.cost.memory_report import format_bytes, format_memory
from remat_passes.ir.mlir import RematError
from remat_testlib import run_process

P = rp.policies
K = 1024


def est(text, function=None):
    return estimate_memory(rp.Module.parse(text), function)


def only(estimate: MemoryEstimate):
    (f,) = list(estimate)
    return f


# ------------------------------------------------------- hand-written cases --
def test_chain():
    f = only(est("""
    func.func @main(%x: tensor<256xf32>) -> tensor<256xf32> {
      %0 = stablehlo.sine %x : tensor<256xf32>
      %1 = stablehlo.cosine %0 : tensor<256xf32>
      %2 = stablehlo.exponential %1 : tensor<256xf32>
      return %2 : tensor<256xf32>
    }"""))
    # entry: x = 1K. Each op: its input and its result are live (2K), then the
    # input is dead (1K). Peak 2K, first reached at the sine (op 0).
    assert f.peak_bytes == 2 * K
    assert f.peak_index == 0 and f.peak_op.startswith("stablehlo.sine")
    assert f.live_bytes_timeline == [K, K, K]
    assert (f.argument_bytes, f.result_bytes, f.num_ops) == (K, K, 3)


def test_diamond():
    f = only(est("""
    func.func @main(%x: tensor<256xf32>) -> tensor<256xf32> {
      %a = stablehlo.sine %x : tensor<256xf32>
      %b = stablehlo.cosine %x : tensor<256xf32>
      %c = stablehlo.add %a, %b : tensor<256xf32>
      return %c : tensor<256xf32>
    }"""))
    # sine:   x + a          = 2K, after 2K (x read again by the cosine)
    # cosine: x + a + b      = 3K, after a + b = 2K
    # add:    a + b + c      = 3K, after c = 1K
    assert f.peak_bytes == 3 * K
    assert f.peak_index == 1 and f.peak_op.startswith("stablehlo.cosine")
    assert f.live_bytes_timeline == [2 * K, 2 * K, K]


LATE_USE = """
func.func @main(%x: tensor<256xf32>, %y: tensor<256xf32>) -> tensor<256xf32> {
  %a = stablehlo.sine %x : tensor<256xf32>
  %b = stablehlo.cosine %a : tensor<256xf32>
  %c = stablehlo.exponential %b : tensor<256xf32>
  %d = stablehlo.add %c, {LATE} : tensor<256xf32>
  %e = stablehlo.multiply %d, %y : tensor<256xf32>
  return %e : tensor<256xf32>
}"""


def test_value_used_late():
    f = only(est(LATE_USE.replace("{LATE}", "%a")))
    # y lives to the multiply; a is read again by the add:
    # sine x,y,a = 3K -> y,a | cosine y,a,b = 3K -> y,a,b | exp y,a,b,c = 4K -> y,a,c
    # add y,a,c,d = 4K -> y,d | multiply y,d,e = 3K -> e
    assert f.peak_bytes == 4 * K
    assert f.peak_index == 2
    assert f.live_bytes_timeline == [2 * K, 3 * K, 3 * K, 2 * K, K]
    # The same program reading c instead of a: a dies at the cosine, 1K lower.
    g = only(est(LATE_USE.replace("{LATE}", "%c")))
    assert g.peak_bytes == 3 * K
    assert g.live_bytes_timeline == [2 * K, 2 * K, 2 * K, 2 * K, K]


def test_reduce_with_region():
    f = only(est("""
    func.func @main(%x: tensor<64x256xf32>) -> tensor<256xf32> {
      %init = stablehlo.constant dense<0.000000e+00> : tensor<f32>
      %r = stablehlo.reduce(%x init: %init) across dimensions = [0] : (tensor<64x256xf32>, tensor<f32>) -> tensor<256xf32>
        reducer(%a: tensor<f32>, %b: tensor<f32>) {
          %s = stablehlo.add %a, %b : tensor<f32>
          stablehlo.return %s : tensor<f32>
        }
      return %r : tensor<256xf32>
    }"""))
    x, init, r, body = 64 * K, 4, K, 4
    # constant: x + init; reduce: x + init + r + the body's own peak (%s, 4 B;
    # its block arguments alias the operands), then only r is left.
    assert f.peak_bytes == x + init + r + body == 66568
    assert f.peak_index == 1 and f.peak_op.startswith("stablehlo.reduce")
    assert f.live_bytes_timeline == [x + init, r]


def test_values_captured_by_a_region_live_until_the_op():
    f = only(est("""
    func.func @main(%p: tensor<i1>, %x: tensor<256xf32>) -> tensor<256xf32> {
      %a = stablehlo.sine %x : tensor<256xf32>
      %b = stablehlo.cosine %a : tensor<256xf32>
      %r = "stablehlo.if"(%p) ({
        stablehlo.return %a : tensor<256xf32>
      }, {
        %n = stablehlo.negate %b : tensor<256xf32>
        stablehlo.return %n : tensor<256xf32>
      }) : (tensor<i1>) -> tensor<256xf32>
      return %r : tensor<256xf32>
    }"""))
    # p = 1 B (i1 is stored in a byte). a and b are read only inside the
    # branches, so they live until the `if`:
    # sine p,x,a = 1+2K -> p,a | cosine p,a,b = 1+2K -> p,a,b (a still captured)
    # if: p,a,b + r + the larger branch peak (%n, 1K) = 1+4K -> r
    assert f.peak_bytes == 1 + 4 * K
    assert f.peak_index == 2 and f.peak_op.startswith("stablehlo.if")
    assert f.live_bytes_timeline == [1 + K, 1 + 2 * K, K]


def test_function_returning_arguments():
    f = only(est("""
    func.func @main(%x: tensor<256xf32>, %y: tensor<512xf32>) -> (tensor<256xf32>, tensor<256xf32>, tensor<256xf32>, tensor<512xf32>) {
      %a = stablehlo.sine %x : tensor<256xf32>
      return %x, %a, %x, %y : tensor<256xf32>, tensor<256xf32>, tensor<256xf32>, tensor<512xf32>
    }"""))
    # Arguments x (1K) and y (2K) are returned, so they live to the end.
    # sine: x,y,a = 4K; at the return x is handed back twice: 4K + 1K.
    assert (f.argument_bytes, f.result_bytes) == (3 * K, 5 * K)
    assert f.live_bytes_timeline == [4 * K]
    assert f.peak_bytes == 5 * K and f.peak_op.startswith("func.return")


def test_unused_argument_is_live_at_entry_only():
    f = only(est("""
    func.func @main(%x: tensor<256xf32>, %unused: tensor<1024xf32>) -> tensor<256xf32> {
      %a = stablehlo.sine %x : tensor<256xf32>
      %b = stablehlo.cosine %a : tensor<256xf32>
      return %b : tensor<256xf32>
    }"""))
    # entry: x + unused = 5K (the peak); then unused is dead: sine x,a = 2K.
    assert f.peak_bytes == 5 * K
    assert (f.peak_index, f.peak_op) == (-1, "entry (arguments)")
    assert f.live_bytes_timeline == [K, K]
    assert f.argument_bytes == 5 * K and f.result_bytes == K


def test_dead_result_is_freed_at_once():
    f = only(est("""
    func.func @main(%x: tensor<256xf32>) -> tensor<256xf32> {
      %dead = stablehlo.broadcast_in_dim %x, dims = [1] : (tensor<256xf32>) -> tensor<8x256xf32>
      %a = stablehlo.sine %x : tensor<256xf32>
      return %a : tensor<256xf32>
    }"""))
    # broadcast: x + dead(8K) = 9K, then dead is gone -> x | sine: x,a = 2K -> a
    assert f.peak_bytes == 9 * K
    assert f.live_bytes_timeline == [K, K]


def test_checkpoint_name_marker_aliases_its_operand():
    f = only(est("""
    func.func @main(%x: tensor<256xf32>) -> tensor<256xf32> {
      %a = stablehlo.sine %x : tensor<256xf32>
      %n = stablehlo.custom_call @remat.name(%a) {backend_config = "a"} : (tensor<256xf32>) -> tensor<256xf32>
      %b = stablehlo.cosine %n : tensor<256xf32>
      %c = stablehlo.add %b, %a : tensor<256xf32>
      return %c : tensor<256xf32>
    }"""))
    # The marker is an identity (strip-checkpoint-names removes it): n is a.
    # sine x,a = 2K -> a | marker 1K | cosine a,b = 2K -> a,b | add a,b,c = 3K -> c
    # (Counting n as its own buffer would give 4K at the add.)
    assert f.peak_bytes == 3 * K
    assert f.peak_op.startswith("stablehlo.add")
    assert f.live_bytes_timeline == [K, K, 2 * K, K]


def test_identity_rounding_aliases_and_narrowing_allocates():
    text = """
    func.func @main(%x: tensor<256xf32>) -> tensor<256xf32> {
      %a = stablehlo.sine %x : tensor<256xf32>
      %r = stablehlo.reduce_precision %a, format = FORMAT : tensor<256xf32>
      %b = stablehlo.add %r, %a : tensor<256xf32>
      return %b : tensor<256xf32>
    }"""
    # e8m23 is f32's own format (what insert-reduce-precision adds): r is a.
    # sine x,a = 2K -> a | rounding 1K | add a,b = 2K
    same = only(est(text.replace("FORMAT", "e8m23")))
    assert same.peak_bytes == 2 * K and same.live_bytes_timeline == [K, K, K]
    # e8m7 (to bf16 precision) changes values: a new buffer.
    # sine 2K -> a | rounding a,r = 2K | add a,r,b = 3K
    narrow = only(est(text.replace("FORMAT", "e8m7")))
    assert narrow.peak_bytes == 3 * K and narrow.live_bytes_timeline == [K, 2 * K, K]


def test_host_memory_does_not_count():
    f = only(est("""
    func.func @main(%x: tensor<256xf32>, %h: tensor<1024xf32> {mhlo.memory_kind = "pinned_host"}) -> (tensor<256xf32>, tensor<1024xf32>) {
      %o = stablehlo.custom_call @annotate_device_placement(%x) {has_side_effect = true, mhlo.frontend_attributes = {_xla_buffer_placement = "pinned_host"}} : (tensor<256xf32>) -> tensor<256xf32>
      %d = stablehlo.custom_call @annotate_device_placement(%h) {has_side_effect = true, mhlo.frontend_attributes = {_xla_buffer_placement = "device"}} : (tensor<1024xf32>) -> tensor<1024xf32>
      return %o, %d : tensor<256xf32>, tensor<1024xf32>
    }"""))
    # Device bytes only: entry x = 1K (h is on the host) | to host: x, o(0) -> 0
    # | to device: d = 4K. The signature totals count every type.
    assert f.peak_bytes == 4 * K
    assert f.live_bytes_timeline == [0, 4 * K]
    assert (f.argument_bytes, f.result_bytes) == (5 * K, 5 * K)


SPLIT_BY_HAND = """
func.func @main_fwd(%x: tensor<256xf32>) -> (tensor<256xf32>, tensor<256xf32> {remat.residual = "f32[256] from the argument x"}, tensor<512xf32> {remat.residual = "f32[512] output of concatenate"}) {
  %a = stablehlo.sine %x : tensor<256xf32>
  %c = stablehlo.concatenate %x, %a, dim = 0 : (tensor<256xf32>, tensor<256xf32>) -> tensor<512xf32>
  return %a, %x, %c : tensor<256xf32>, tensor<256xf32>, tensor<512xf32>
}
func.func @main_bwd(%x: tensor<256xf32>, %c: tensor<512xf32>, %ct: tensor<256xf32> {remat.cotangent}) -> tensor<256xf32> {
  %s = stablehlo.slice %c [256:512] : (tensor<512xf32>) -> tensor<256xf32>
  %g = stablehlo.multiply %ct, %s : tensor<256xf32>
  return %g : tensor<256xf32>
}
"""


def test_split_functions_and_residual_bytes():
    e = est(SPLIT_BY_HAND)
    assert list(e.functions) == ["main_fwd", "main_bwd"]
    fwd, bwd = e["main_fwd"], e["main_bwd"]
    # Residuals: x (1K) and the concatenation (2K); a is an output, not one.
    assert fwd.residual_bytes == 3 * K and bwd.residual_bytes is None
    assert e.residual_bytes == 3 * K
    # fwd: sine x,a = 2K | concatenate x,a,c = 4K (all returned)
    assert fwd.peak_bytes == 4 * K and fwd.live_bytes_timeline == [2 * K, 4 * K]
    # bwd: entry x,c,ct = 4K, x is unused -> 3K | slice c,ct,s = 4K -> ct,s
    # | multiply ct,s,g = 3K -> g
    assert bwd.peak_bytes == 4 * K and bwd.live_bytes_timeline == [2 * K, K]
    assert e.peak_bytes == 4 * K
    # Naming the original function gives both halves; one half alone also works.
    assert list(est(SPLIT_BY_HAND, "main").functions) == ["main_fwd", "main_bwd"]
    assert list(est(SPLIT_BY_HAND, "main_bwd").functions) == ["main_bwd"]


def test_default_functions_and_errors():
    text = """
    func.func private @helper(%x: tensor<256xf32>) -> tensor<256xf32> {
      %0 = stablehlo.sine %x : tensor<256xf32>
      return %0 : tensor<256xf32>
    }
    func.func @main(%x: tensor<256xf32>) -> tensor<256xf32> {
      %0 = func.call @helper(%x) : (tensor<256xf32>) -> tensor<256xf32>
      return %0 : tensor<256xf32>
    }"""
    e = est(text)
    assert list(e.functions) == ["main"]   # private functions are not estimated
    # The call: x + its result + the callee's own peak (its sine, 1K).
    assert e["main"].peak_bytes == 3 * K and e["main"].peak_op.startswith("func.call")
    assert list(est(text, ["helper", "main"]).functions) == ["helper", "main"]
    with pytest.raises(RematError, match="no function @nope"):
        est(text, "nope")


def test_format_memory():
    text = format_memory(est(SPLIT_BY_HAND))
    lines = text.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("@main_fwd: peak 4.00 KiB (4096 B) at stablehlo.concatenate")
    assert "arguments 1.00 KiB" in lines[0] and "results 4.00 KiB" in lines[0]
    assert lines[0].endswith("residuals 3.00 KiB")
    assert lines[1].startswith("@main_bwd: peak 4.00 KiB (4096 B)")
    assert "residuals" not in lines[1]
    assert [format_bytes(n) for n in (12, 1536, 3 * 2**20 + 2**19, 50 * 2**20)] == \
        ["12 B", "1.50 KiB", "3.50 MiB", "50.0 MiB"]


def test_early_recomputation_has_a_higher_peak_by_hand():
    # The same backward: p and q are saved, u and v recomputed from them
    # (broadcasts: 1K -> 4K), ct is the 4K cotangent.
    jit = only(est("""
    func.func @main(%p: tensor<256xf32>, %q: tensor<256xf32>, %ct: tensor<4x256xf32>) -> tensor<4x256xf32> {
      %u = stablehlo.broadcast_in_dim %p, dims = [1] : (tensor<256xf32>) -> tensor<4x256xf32>
      %g1 = stablehlo.multiply %ct, %u : tensor<4x256xf32>
      %v = stablehlo.broadcast_in_dim %q, dims = [1] : (tensor<256xf32>) -> tensor<4x256xf32>
      %g2 = stablehlo.multiply %g1, %v : tensor<4x256xf32>
      return %g2 : tensor<4x256xf32>
    }"""))
    early = only(est("""
    func.func @main(%p: tensor<256xf32>, %q: tensor<256xf32>, %ct: tensor<4x256xf32>) -> tensor<4x256xf32> {
      %u = stablehlo.broadcast_in_dim %p, dims = [1] : (tensor<256xf32>) -> tensor<4x256xf32>
      %v = stablehlo.broadcast_in_dim %q, dims = [1] : (tensor<256xf32>) -> tensor<4x256xf32>
      %g1 = stablehlo.multiply %ct, %u : tensor<4x256xf32>
      %g2 = stablehlo.multiply %g1, %v : tensor<4x256xf32>
      return %g2 : tensor<4x256xf32>
    }"""))
    # Just in time: u: p,q,ct,u = 10K -> q,ct,u | g1: q,ct,u,g1 = 13K -> q,g1
    #               v: q,g1,v = 9K -> g1,v | g2: 12K
    assert jit.peak_bytes == 13 * K
    # Early: u: 10K -> q,ct,u | v: q,ct,u,v = 13K -> ct,u,v | g1: ct,u,v,g1 = 16K
    # v (4K) is live during g1 where q (1K) was: 3K more.
    assert early.peak_bytes == 16 * K


# ------------------------------------------------------- real models: MLP --
MLP_LAYERS, MLP_WIDTH, MLP_BATCH = 8, 256, 64
ACT = MLP_BATCH * MLP_WIDTH * 4          # one f32[64,256] activation: 64 KiB


def mlp(params, x):
    h = x
    for i, (w, b) in enumerate(params):
        h = checkpoint_name(jnp.tanh(h @ w + b), f"layer{i}")
    return jnp.sum(h)


@pytest.fixture(scope="module")
def mlp_module():
    k = jax.random.split(jax.random.PRNGKey(0), 2 * MLP_LAYERS + 1)
    params = [(jax.random.normal(k[2 * i], (MLP_WIDTH, MLP_WIDTH), jnp.float32) * 0.05,
               jax.random.normal(k[2 * i + 1], (MLP_WIDTH,), jnp.float32) * 0.05)
              for i in range(MLP_LAYERS)]
    x = jax.random.normal(k[-1], (MLP_BATCH, MLP_WIDTH), jnp.float32)
    return rp.export_vjp(mlp, params, x)


EVEN_LAYERS = P.save_only_these_names(*(f"layer{i}" for i in range(0, MLP_LAYERS, 2)))


def test_mlp_remat_lowers_the_joint_peak(mlp_module):
    base = estimate_memory(rp.remat(mlp_module, None))["main"]
    even = estimate_memory(rp.remat(mlp_module, EVEN_LAYERS))["main"]
    # Without remat the forward keeps, per layer, tanh(h) and its derivative
    # term 1 - tanh(h): 2L activations live into the backward, on top of the
    # arguments (weights, biases, x, the cotangent).
    assert base.peak_bytes >= base.argument_bytes + 2 * MLP_LAYERS * ACT
    # Saving every other layer output keeps L/2 activations instead of 2L. The
    # just-in-time recomputation of one layer needs at most 4 activation-sized
    # buffers at once (dot, bias broadcast, add, tanh), so the peak drops by at
    # least (2L - L/2 - 4) activations ...
    dropped = 2 * MLP_LAYERS - MLP_LAYERS // 2
    assert base.peak_bytes - even.peak_bytes >= (dropped - 4) * ACT
    # ... and by no more than what is no longer kept.
    assert base.peak_bytes - even.peak_bytes <= dropped * ACT
    # Arguments and results do not change with the policy.
    assert (even.argument_bytes, even.result_bytes) == (base.argument_bytes, base.result_bytes)


@pytest.mark.parametrize("policy", [None, EVEN_LAYERS, P.nothing_saveable, P.dots_saveable,
                                    P.offload_dot_with_no_batch_dims("device", "pinned_host")],
                         ids=["none", "even_layers", "nothing", "dots", "offload"])
def test_split_residual_bytes_match_the_pass(mlp_module, policy):
    split = rp.remat(mlp_module, policy, mode="split")
    e = estimate_memory(split)
    assert list(e.functions) == ["main_fwd", "main_bwd"]
    assert e["main_fwd"].residual_bytes == sum(r.bytes for r in split.residuals)
    assert e.residual_bytes == e["main_fwd"].residual_bytes
    # <f>_bwd takes the residuals and the cotangent as arguments.
    cot = 4  # f32[] cotangent of the scalar loss
    assert e["main_bwd"].argument_bytes == e["main_fwd"].residual_bytes + cot


def test_split_peaks_follow_residuals(mlp_module):
    base = estimate_memory(rp.remat(mlp_module, None, mode="split"))
    even = estimate_memory(rp.remat(mlp_module, EVEN_LAYERS, mode="split"))
    # The forward returns its residuals, so its peak is at least their size,
    # and fewer residuals give a lower forward peak.
    for e in (base, even):
        assert e["main_fwd"].peak_bytes >= e["main_fwd"].result_bytes
    assert even["main_fwd"].peak_bytes < base["main_fwd"].peak_bytes
    assert even["main_bwd"].peak_bytes < base["main_bwd"].peak_bytes


def test_mlp_early_recomputation_has_a_higher_peak(mlp_module):
    spec = "save_only_these_names(" + ",".join(f"layer{i}" for i in range(0, MLP_LAYERS, 2)) + ")"
    figures = _memory_figures()
    jit = figures.partial_eval_only(mlp_module, spec)
    early, moved = figures.early_variant(mlp_module, spec)
    assert moved > 0
    jit_peak = estimate_memory(jit).peak_bytes
    early_peak = estimate_memory(early).peak_bytes
    # The pass's form is what the full pipeline emits, memory-wise.
    assert jit_peak == estimate_memory(rp.remat(mlp_module, EVEN_LAYERS)).peak_bytes
    # Early, the L/2 recomputed layers' tanh and 1 - tanh all live from the
    # start of the backward; just in time, one layer's at a time: at least
    # (L/2 - 1) * 2 activations more.
    assert early_peak - jit_peak >= (MLP_LAYERS // 2 - 1) * 2 * ACT


# ---------------------------------------------- real models: transformer --
TB, TT, TD, TH, TF = 4, 128, 256, 4, 1024     # batch, tokens, width, heads, MLP width
T_ACT = TB * TT * TD * 4                      # f32[4,128,256]: 512 KiB
T_SCORES = TB * TH * TT * TT * 4              # f32[4,4,128,128]: 1 MiB


def _memory_figures():
    """tools/benchmarks: the figures and these tests measure the same models."""
    from tools.benchmarks import memory_figures, models
    return types.SimpleNamespace(
        transformer_model=models.transformer_model, transformer_block=models.transformer_block,
        partial_eval_only=memory_figures.partial_eval_only,
        early_variant=memory_figures.early_variant)


@pytest.fixture(scope="module")
def transformer_module():
    module, _, _ = _memory_figures().transformer_model(
        batch=TB, tokens=TT, width=TD, heads=TH, hidden=TF)
    return module


@pytest.mark.parametrize("names", [("attn_out",), ("q", "k", "v", "attn_out")],
                         ids=["attn_out", "qkv_attn_out"])
def test_transformer_remat_lowers_the_joint_peak(transformer_module, names):
    """Saving only some names lowers the joint peak below no-remat, and to at most the
    peak of JAX's own program for the same block under jax.checkpoint with the same
    policy (JAX's answer from the installed version, estimated the same way)."""
    base = estimate_memory(rp.remat(transformer_module, None))["main"]
    ours = estimate_memory(rp.remat(transformer_module, P.save_only_these_names(*names)))["main"]
    block, params, x = _memory_figures().transformer_block(
        batch=TB, tokens=TT, width=TD, heads=TH, hidden=TF)
    jax_joint = rp.export_vjp(
        jax.checkpoint(block, policy=jax.checkpoint_policies.save_only_these_names(*names)),
        params, x)
    theirs = estimate_memory(jax_joint)["main"]
    assert ours.peak_bytes < base.peak_bytes
    assert ours.peak_bytes <= theirs.peak_bytes


def test_transformer_attention_residuals_leave_the_peak(transformer_module):
    """Without remat the two score-sized attention buffers (exp(scores) and the
    probabilities) are residuals; saving only the attention output keeps neither."""
    base = rp.remat(transformer_module, None).residuals
    attn = rp.remat(transformer_module, P.save_only_these_names("attn_out")).residuals
    scores = f"f32[{TB},{TH},{TT},{TT}]"
    assert sum(r.type == scores for r in base) >= 2
    assert not any(r.type == scores for r in attn)


def test_transformer_split_residuals(transformer_module):
    base = rp.remat(transformer_module, None, mode="split")
    qkv = rp.remat(transformer_module, P.save_only_these_names("q", "k", "v"), mode="split")
    eb, eq = estimate_memory(base), estimate_memory(qkv)
    assert eb.residual_bytes == sum(r.bytes for r in base.residuals)
    assert eq.residual_bytes == sum(r.bytes for r in qkv.residuals)
    # save_only_these_names('q', 'k', 'v') keeps the arguments (weights and x)
    # and exactly q, k and v.
    assert eq.residual_bytes == eq["main_fwd"].argument_bytes + 3 * T_ACT
    # Without remat the residuals include the two score-sized buffers too.
    assert eb.residual_bytes >= eq.residual_bytes + 2 * T_SCORES
    assert eq["main_fwd"].peak_bytes < eb["main_fwd"].peak_bytes


# ------------------------------------------------------------ model="xla" --
def xla_est(text, backend="cpu"):
    return only(estimate_memory(rp.Module.parse(text), model="xla", backend=backend))


def _chain(op: str, rounding: str | None = None) -> str:
    """x -> %e = OP(x) (rounded to `rounding` where given) read by a sine and a cosine, whose
    product is summed: whether %e is stored or computed inside both readers."""
    rounded = "" if rounding is None else f"""
      %r = stablehlo.reduce_precision %e, format = {rounding} : tensor<256xf32>"""
    read = "%e" if rounding is None else "%r"
    return f"""
    func.func @main(%x: tensor<256xf32>) -> tensor<f32> {{
      %e = stablehlo.{op} %x : tensor<256xf32>{rounded}
      %a = stablehlo.sine {read} : tensor<256xf32>
      %b = stablehlo.cosine {read} : tensor<256xf32>
      %p = stablehlo.multiply %a, %b : tensor<256xf32>
      %c = stablehlo.constant dense<0.0> : tensor<f32>
      %s = stablehlo.reduce(%p init: %c) applies stablehlo.add across dimensions = [0] : (tensor<256xf32>, tensor<f32>) -> tensor<f32>
      return %s : tensor<f32>
    }}"""


def test_xla_model_fuses_elementwise_chains_and_keeps_arguments():
    f = xla_est("""
    func.func @main(%x: tensor<256xf32>) -> tensor<256xf32> {
      %0 = stablehlo.sine %x : tensor<256xf32>
      %1 = stablehlo.cosine %0 : tensor<256xf32>
      %2 = stablehlo.exponential %1 : tensor<256xf32>
      %3 = stablehlo.dot_general %2, %2, contracting_dims = [] x [] : (tensor<256xf32>, tensor<256xf32>) -> tensor<256x256xf32>
      %c = stablehlo.constant dense<0.0> : tensor<f32>
      %4 = stablehlo.reduce(%3 init: %c) applies stablehlo.add across dimensions = [0] : (tensor<256x256xf32>, tensor<f32>) -> tensor<256xf32>
      return %4 : tensor<256xf32>
    }""")
    # sine and cosine are computed inside the exponential (fused): never stored; the
    # constant is a literal. The caller keeps x (1K) throughout, and the result's output
    # buffer (1K) is there from the start. exp: 1K, dead before the reduce makes the
    # result, so it lies in that output buffer (no memory of its own); dot: + 256K (the
    # peak); reduce: into the output buffer (its region's add updates the accumulator in
    # place), then the dot is dead. (XLA:CPU runs ops breadth first: the constant, which
    # waits for nothing, comes first.)
    assert f.live_bytes_timeline == [2 * K] * 4 + [2 * K + 256 * K, 2 * K]
    assert f.peak_bytes == 2 * K + 256 * K and f.peak_op.startswith("stablehlo.dot_general")
    program_order = only(est("""
    func.func @main(%x: tensor<256xf32>) -> tensor<256xf32> {
      %0 = stablehlo.sine %x : tensor<256xf32>
      %1 = stablehlo.cosine %0 : tensor<256xf32>
      return %1 : tensor<256xf32>
    }"""))
    assert program_order.live_bytes_timeline == [K, K]   # the default model: unchanged


def test_xla_model_in_place_update_and_donation():
    body = """
    func.func @main(%x: tensor<256xf32>{attrs}) -> tensor<256xf32> {{
      %0 = stablehlo.dot_general %x, %x, contracting_dims = [] x [] : (tensor<256xf32>, tensor<256xf32>) -> tensor<256x256xf32>
      %1 = stablehlo.reduce(%0 init: %c) applies stablehlo.add across dimensions = [0] : (tensor<256x256xf32>, tensor<f32>) -> tensor<256xf32>
      %2 = stablehlo.sine %1 : tensor<256xf32>
      %3 = stablehlo.dot_general %2, %2, contracting_dims = [0] x [0] : (tensor<256xf32>, tensor<256xf32>) -> tensor<f32>
      %4 = stablehlo.broadcast_in_dim %3, dims = [] : (tensor<f32>) -> tensor<256xf32>
      %5 = stablehlo.add %4, %2 : tensor<256xf32>
      return %5 : tensor<256xf32>
    }}"""
    # the reduce's init %c: a constant (a literal, no memory)
    kept = xla_est(body.format(attrs="").replace(
        "%0 =", "%c = stablehlo.constant dense<0.0> : tensor<f32>\n      %0 =", 1))
    donated = xla_est(body.format(attrs=" {jax.buffer_donor = true}").replace(
        "%0 =", "%c = stablehlo.constant dense<0.0> : tensor<f32>\n      %0 =", 1))
    # kept: x stays for the whole call; the result's output buffer (1K) is there from
    # the start. The sine writes into the reduce's buffer (it dies there, same size), and
    # that buffer, dead where the add makes the result (elementwise, same size), lies in
    # the result's output buffer: no memory of its own. The broadcast is fused into the add.
    assert kept.live_bytes_timeline == [2 * K, 2 * K + 256 * K, 2 * K, 2 * K, 2 * K + 4,
                                        2 * K + 4, 2 * K]
    # donated: x is dead after the first dot (its last reader)
    assert donated.live_bytes_timeline == [2 * K, K + 256 * K, K, K, K + 4, K + 4, K]
    # (both peak while the first dot runs: x is read there)
    assert kept.peak_bytes == donated.peak_bytes == 2 * K + 256 * K


def test_xla_model_on_cpu_runs_the_ops_in_xla_cpus_breadth_first_order():
    """XLA:CPU of jaxlib 0.10 schedules breadth first and deletes optimization barriers:
    the dot that reads only the argument x (through a barrier with the chain's end: a
    recomputation from a residual in a backward) runs at entry, beside the chain's first
    dot, and its result is held along the chain. Later jaxlibs' XLA:CPU keeps the barrier
    until after it schedules, so its breadth-first order runs the dot after the chain, as
    the program has it, and so does the estimate for them. Either way the estimate is
    XLA's own figure."""
    d = ("contracting_dims = [1] x [0] : (tensor<256x256xf32>, tensor<256x256xf32>) -> "
         "tensor<256x256xf32>")
    text = f"""
    func.func public @main(%x: tensor<256x256xf32>, %g: tensor<256x256xf32>) -> tensor<256x256xf32> {{
      %a = stablehlo.dot_general %g, %g, {d}
      %b = stablehlo.dot_general %a, %a, {d}
      %c = stablehlo.dot_general %b, %b, {d}
      %t:2 = stablehlo.optimization_barrier %x, %c : tensor<256x256xf32>, tensor<256x256xf32>
      %r = stablehlo.dot_general %t#0, %t#0, {d}
      %o = stablehlo.dot_general %r, %t#1, {d}
      return %o : tensor<256x256xf32>
    }}"""
    cpu = xla_est(text)
    in_order = xla_est(text, backend="tpu")      # (modelled in program order)
    assert in_order.peak_bytes == 1280 * K       # x, g, the output, then two of a, b, c, r
    if jax_compat.xla_cpu_fuses_across_barriers():
        # r made first; r, b and c live at c: 512K + 256K + 3 x 256K
        assert cpu.peak_bytes == 1536 * K and cpu.peak_index == 2
        assert cpu.peak_op.startswith("stablehlo.dot_general at line 5")
    else:
        assert cpu.peak_bytes == in_order.peak_bytes
    module = rp.Module.parse(text)
    m = rp.compile(module, "main").lower(jnp.ones((256, 256)), jnp.ones((256, 256))) \
        .compile().memory_analysis()
    if jax.default_backend() == "cpu":        # XLA's own figure
        assert m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes \
            == cpu.peak_bytes


def test_xla_model_output_allocations_hold_dead_temporaries():
    """A temporary that dies before a result is made lies in that result's output
    allocation (as large or larger); one still live there takes memory of its own."""
    text = """
    func.func @main(%x: tensor<256x256xf32>) -> (tensor<256x256xf32>, tensor<256xf32>) {{
      %a = stablehlo.dot_general %x, %x, contracting_dims = [1] x [0] : (tensor<256x256xf32>, tensor<256x256xf32>) -> tensor<256x256xf32>
      %c = stablehlo.constant dense<0.0> : tensor<f32>
      %r = stablehlo.reduce(%a init: %c) applies stablehlo.add across dimensions = [0] : (tensor<256x256xf32>, tensor<f32>) -> tensor<256xf32>
      %b = stablehlo.dot_general %x, %x, contracting_dims = [0] x [1] : (tensor<256x256xf32>, tensor<256x256xf32>) -> tensor<256x256xf32>
      return %b, %r : tensor<256x256xf32>, tensor<256xf32>
    }}"""
    f = xla_est(text.format(), backend="tpu")     # (modelled in program order)
    # x (256K) kept, the outputs b (256K) and r (1K) from entry; a (256K) dies at the
    # reduce, before b is made: it lies in b's allocation. Peak: x + b + r.
    assert f.peak_bytes == 256 * K + 256 * K + K
    assert f.live_bytes_timeline == [513 * K] * 4
    # XLA:CPU runs ops breadth first: both dots come first (they read only x), so a is
    # live when b is made and takes 256K of its own (XLA:CPU of jaxlib 0.10.2 and 0.12,
    # YNNPACK fusions off: 795,664 B with the reduce's 8K of scratch)
    assert xla_est(text.format()).peak_bytes == 3 * 256 * K + K
    # a and b both read where the add makes the result s (in place, elementwise): one of
    # them lies in s's allocation, the other needs 256K of its own
    late = xla_est(text.format().replace(
        "return %b, %r", "%s = stablehlo.add %a, %b : tensor<256x256xf32>\n      return %s, %r")
        .replace("%r = stablehlo.reduce(%a", "%r = stablehlo.reduce(%x"))
    assert late.peak_bytes == 3 * 256 * K + K


def test_xla_model_folds_transposes_into_dots_and_duplicates_cheap_producers():
    """transpose(dot(a, b)) is dot(b, a) in XLA: no copy. A cheap elementwise op read by
    two elementwise ops is computed inside each (not stored); an expensive one is stored."""
    folded = xla_est("""
    func.func @main(%x: tensor<128x256xf32>, %y: tensor<128x512xf32>) -> tensor<512x256xf32> {
      %d = stablehlo.dot_general %x, %y, contracting_dims = [0] x [0] : (tensor<128x256xf32>, tensor<128x512xf32>) -> tensor<256x512xf32>
      %t = stablehlo.transpose %d, dims = [1, 0] : (tensor<256x512xf32>) -> tensor<512x256xf32>
      return %t : tensor<512x256xf32>
    }""")
    # x (128K) and y (256K) kept, the result (512K) is the dot's own buffer
    assert folded.peak_bytes == (128 + 256 + 512) * K
    cheap, expensive = (xla_est(_chain(op)) for op in ("negate", "tanh"))
    # x and the result: the whole chain is one fusion into the reduce
    assert cheap.peak_bytes == K + 4
    # tanh is stored (1K) for its two readers
    assert expensive.peak_bytes == 2 * K + 4


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_xla_model_fuses_through_a_rounding_to_the_values_own_type(backend):
    """A `reduce_precision` to its operand's own type (insert-reduce-precision's, rp.jit's
    rounded residuals) is fused as the elementwise op it is: a cheap value rounded is
    computed again inside its readers, as without the rounding. (On a GPU it was stored:
    GPT's rounded joint form was estimated 18% over XLA's footprint, which is the same
    with the rounding and without: 12,193,048 against 12,193,056 B of temp on an H200.)"""
    rounded = xla_est(_chain("negate", rounding="e8m23"), backend)
    plain = xla_est(_chain("negate"), backend)
    assert plain.peak_bytes == K + 4             # x and the result: one fusion
    assert rounded.peak_bytes == plain.peak_bytes
    # a rounding to fewer bits is no view: the value it rounds is still fused into it
    narrower = xla_est(_chain("negate", rounding="e5m10"), backend)
    assert narrower.peak_bytes == K + 4


def test_xla_model_placement_annotations_are_views_on_cpu():
    text = """
    func.func @main(%x: tensor<256xf32>) -> tensor<256xf32> {
      %a = stablehlo.sine %x : tensor<256xf32>
      %h = stablehlo.custom_call @annotate_device_placement(%a) {has_side_effect = true, mhlo.frontend_attributes = {_xla_buffer_placement = "pinned_host"}} : (tensor<256xf32>) -> tensor<256xf32>
      return %h : tensor<256xf32>
    }"""
    # XLA:CPU drops the annotation: the sine writes into the output (x + result)
    assert xla_est(text, "cpu").peak_bytes == 2 * K
    # on a GPU the copy to host is a move: the result is in host memory
    assert xla_est(text, "gpu").peak_bytes == 2 * K


def test_xla_model_copies_returned_arguments_and_counts_host_memory_on_cpu():
    text = """
    func.func @main(%x: tensor<256xf32>, %h: tensor<256xf32> {mhlo.memory_kind = "pinned_host"}) -> (tensor<256xf32>, tensor<256xf32>) {
      %a = stablehlo.sine %x : tensor<256xf32>
      return %a, %x : tensor<256xf32>, tensor<256xf32>
    }"""
    # x and h are kept; the returned x is copied into an output buffer of its own
    cpu, gpu = xla_est(text, "cpu"), xla_est(text, "gpu")
    assert cpu.peak_bytes == K + K + K + K     # x, h (one memory on CPU), a, copy of x
    # XLA makes that copy first: it is live from the start (after the sine: all four)
    assert cpu.live_bytes_timeline == [4 * K]
    assert gpu.peak_bytes == K + K + K         # h is in host memory
    with pytest.raises(RematError, match="unknown memory model 'exact'"):
        estimate_memory(rp.Module.parse(text), model="exact")
    # (a backend the model does not know was taken as neither CPU nor GPU, silently)
    with pytest.raises(RematError, match="unknown backend 'tpu9'.*known: cpu, gpu, tpu"):
        estimate_memory(rp.Module.parse(text), model="xla", backend="tpu9")


@pytest.mark.parametrize("policy", ["nothing_saveable", "dots_saveable"])
def test_xla_model_predicts_xla_cpu_on_an_mlp(mlp_module, policy):
    """Against XLA:CPU's memory_analysis() of each split half (temp + arguments + outputs
    - aliased): the xla model within 15%, the program-order one not."""
    split = rp.remat(mlp_module, policy, mode="split")
    inputs = [jnp.zeros(a.shape, a.dtype) for a in split.to_exported("main_fwd").in_avals]
    fwd_c = rp.compile(split, "main_fwd").lower(*inputs).compile()
    res = fwd_c(*inputs)
    bwd_c = rp.compile(split, "main_bwd").lower(*res[1:], jnp.ones_like(res[0])).compile()
    xla_model = estimate_memory(split, model="xla", backend="cpu")
    order = estimate_memory(split)
    for name, compiled in (("main_fwd", fwd_c), ("main_bwd", bwd_c)):
        m = compiled.memory_analysis()
        footprint = (m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes
                     - m.alias_size_in_bytes)
        assert abs(xla_model[name].peak_bytes - footprint) <= 0.15 * footprint, name
        assert abs(order[name].peak_bytes - footprint) > 0.15 * footprint, name


def test_xla_model_counts_the_transposed_copies_of_a_weight_gradient_convolution():
    """A convolution in the dimension order XLA's kernels take costs its result; one with
    its operands in another (the weight gradient: [f, 0, b]x[i, 0, o]->[0, b, f]) works on
    transposed copies of both operands and of its result, live while it runs."""
    conv = """
    func.func @main(%x: tensor<{x}xf32>, %w: tensor<{w}xf32>) -> tensor<{y}xf32> {{
      %0 = stablehlo.convolution(%x, %w) dim_numbers = {dims}, window = {{pad = [[1, 1]]}} {{batch_group_count = 1 : i64, feature_group_count = 1 : i64}} : (tensor<{x}xf32>, tensor<{w}xf32>) -> tensor<{y}xf32>
      return %0 : tensor<{y}xf32>
    }}"""
    # 4 images of 8 pixels, 16 channels in, 32 out: x 2K, w 6K, y 4K bytes
    forward = xla_est(conv.format(x="4x8x16", w="3x16x32", y="4x8x32",
                                  dims="[b, 0, f]x[0, i, o]->[b, 0, f]"))
    assert forward.peak_bytes == 2 * K + 6 * K + 4 * K
    # its weight gradient: x as [f, 0, b] (2K), the output gradient as the kernel
    # [i, 0, o] (4K), the result [0, b, f] (6K): all three copied
    weight_grad = xla_est(conv.format(x="4x8x16", w="4x8x32", y="3x16x32",
                                      dims="[f, 0, b]x[i, 0, o]->[0, b, f]"))
    assert weight_grad.peak_bytes == (2 * K + 4 * K + 6 * K) + (2 * K + 4 * K + 6 * K)


def test_xla_model_makes_a_convolutions_copies_where_xla_cpu_runs_them(monkeypatch):
    """XLA:CPU makes the transposed copies a weight-gradient convolution works on before it
    runs: at entry where they read only the function's arguments (one of them, or an
    elementwise chain fused into the copy, as a split backward's relu(residual + bias);
    measured on jaxlib 0.12: the conv net's split backward under `dots_saveable`, estimate
    -18% of XLA's footprint before, -9% after), and, as it runs ops breadth first, any
    copy as soon as what it reads is there (the conv net's sweep of budgets on jaxlib 0.10:
    at 897,280 B the split backward's estimate +18% before, +2% after)."""
    from remat_passes.cost import memory
    monkeypatch.setattr(memory, "PEAK_VALUES", 12)     # every buffer live at the peak
    conv = """
    func.func @main(%x: tensor<4x8x16xf32>, %b: tensor<16xf32>, %g: tensor<4x8x32xf32>,
                    %m: tensor<16x16xf32>) -> tensor<3x16x32xf32> {{
      %c = stablehlo.constant dense<0.0> : tensor<f32>
      %bb = stablehlo.broadcast_in_dim %b, dims = [2] : (tensor<16xf32>) -> tensor<4x8x16xf32>
      %z = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<f32>) -> tensor<4x8x16xf32>
      %0 = {first}
      %1 = stablehlo.add %0, %bb : tensor<4x8x16xf32>
      %2 = stablehlo.maximum %1, %z : tensor<4x8x16xf32>
      %3 = stablehlo.convolution(%2, %g) dim_numbers = [f, 0, b]x[i, 0, o]->[0, b, f], window = {{pad = [[1, 1]]}} {{batch_group_count = 1 : i64, feature_group_count = 1 : i64}} : (tensor<4x8x16xf32>, tensor<4x8x32xf32>) -> tensor<3x16x32xf32>
      return %3 : tensor<3x16x32xf32>
    }}"""
    arguments = xla_est(conv.format(first="stablehlo.sine %x : tensor<4x8x16xf32>"))
    computed = xla_est(conv.format(
        first="stablehlo.dot_general %x, %m, contracting_dims = [2] x [0] : "
              "(tensor<4x8x16xf32>, tensor<16x16xf32>) -> tensor<4x8x16xf32>"))
    # sine-add-max reads x alone: its copy (2K) is there from the start
    assert (2 * K, "tensor<4x8x16xf32>, a transposed copy made at entry") in \
        arguments.peak_values
    scratch = "transposed copies of the op's operands"     # the result's copy (6K), ...
    assert (6 * K, scratch) in arguments.peak_values
    # ... and the copy of what reads the product is made right after it (breadth first)
    assert (2 * K, "tensor<4x8x16xf32>, a transposed copy made early") in computed.peak_values
    assert (6 * K, scratch) in computed.peak_values


def test_xla_model_duplicates_what_a_barrier_reads_into_a_convolutions_copy(monkeypatch):
    """Where XLA:CPU keeps barriers through fusion (jaxlib 0.11 on), an elementwise value a
    barrier reads is stored for it, and the transposed copy a convolution works on of what
    it feeds computes it again from its inputs (the joint conv net under `dots_saveable`:
    the recomputed pre-activation, read by the next group's barrier and, through the ReLU,
    by a weight gradient's copy). XLA:CPU runs ops breadth first, so the copy is made as
    soon as those inputs are there, and a value the copy reads last is not written over by
    the op it follows (the conv net's joint program: estimate -12% of XLA's footprint with
    the program's order, 0.0% so). At the product in the middle: the sum (2K), stored for
    the barrier, and the copy (2K); not x (128 B), which the copy read."""
    from remat_passes import jax_compat
    from remat_passes.cost import memory
    text = """
    func.func @main(%w: tensor<4x8x16xf32>, %b: tensor<16xf32>, %g: tensor<4x8x32xf32>,
                    %m: tensor<128x128xf32>) -> (tensor<3x16x32xf32>, tensor<f32>) {
      %c = stablehlo.constant dense<0.0> : tensor<f32>
      %x = stablehlo.dot_general %w, %w, batching_dims = [0, 1] x [0, 1], contracting_dims = [2] x [2] : (tensor<4x8x16xf32>, tensor<4x8x16xf32>) -> tensor<4x8xf32>
      %xb = stablehlo.broadcast_in_dim %x, dims = [0, 1] : (tensor<4x8xf32>) -> tensor<4x8x16xf32>
      %bb = stablehlo.broadcast_in_dim %b, dims = [2] : (tensor<16xf32>) -> tensor<4x8x16xf32>
      %z = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<f32>) -> tensor<4x8x16xf32>
      %y = stablehlo.multiply %w, %xb : tensor<4x8x16xf32>
      %0 = stablehlo.add %y, %bb : tensor<4x8x16xf32>
      %1:2 = stablehlo.optimization_barrier %0, %g : tensor<4x8x16xf32>, tensor<4x8x32xf32>
      %3 = stablehlo.dot_general %m, %m, contracting_dims = [1] x [0] : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
      %4 = stablehlo.reduce(%3 init: %c) applies stablehlo.add across dimensions = [0, 1] : (tensor<128x128xf32>, tensor<f32>) -> tensor<f32>
      %5 = stablehlo.maximum %0, %z : tensor<4x8x16xf32>
      %6 = stablehlo.convolution(%5, %g) dim_numbers = [f, 0, b]x[i, 0, o]->[0, b, f], window = {pad = [[1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<4x8x16xf32>, tensor<4x8x32xf32>) -> tensor<3x16x32xf32>
      %7 = stablehlo.multiply %1#0, %1#0 : tensor<4x8x16xf32>
      %8 = stablehlo.reduce(%7 init: %c) applies stablehlo.add across dimensions = [0, 1, 2] : (tensor<4x8x16xf32>, tensor<f32>) -> tensor<f32>
      %9 = stablehlo.add %8, %4 : tensor<f32>
      return %6, %9 : tensor<3x16x32xf32>, tensor<f32>
    }"""
    monkeypatch.setattr(jax_compat, "xla_cpu_fuses_across_barriers", lambda: False)
    monkeypatch.setattr(memory, "PEAK_VALUES", 12)      # every buffer live at the peak
    f = xla_est(text)
    assert f.peak_op.startswith("stablehlo.reduce at line 13")     # the product's sum
    assert (2 * K, "tensor<4x8x16xf32> from stablehlo.add at line 10") in f.peak_values
    assert (2 * K, "tensor<4x8x16xf32>, a transposed copy made early") in f.peak_values
    assert not any("line 5" in what for _, what in f.peak_values), f.peak_values
    monkeypatch.undo()
    if jax.default_backend() == "cpu" and not jax_compat.xla_cpu_fuses_across_barriers():
        # XLA's own figure (151,700 B on jaxlib 0.12), with YNNPACK's fusions off: XLA does
        # not count the buffers of the product they would take (tools/benchmarks/ynn_probe)
        module = rp.Module.parse(text)
        m = rp.compile(module, "main").lower(
            jnp.ones((4, 8, 16)), jnp.ones(16), jnp.ones((4, 8, 32)), jnp.ones((128, 128))) \
            .compile(compiler_options={"xla_cpu_experimental_ynn_fusion_type": ""}) \
            .memory_analysis()
        got = m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes
        assert abs(f.peak_bytes - got) <= got * 0.01, (f.peak_bytes, got)


def test_xla_model_sees_through_barriers_that_xla_cpu_deletes_first(monkeypatch):
    """Where XLA:CPU deletes barriers before it fuses (jaxlib 0.10), a barrier holds nothing
    alive, and a cheap elementwise value stored for a reader that cannot fuse it (a
    convolution) is computed again inside the fusions of its elementwise readers, through
    the barrier too: they read its inputs (the joint conv net under
    save_anything_except_these_names(conv0): the forward's ReLU is stored for the next
    convolution only, and the backward's copy recomputes it from the pre-activation, held
    anyway for the mask; estimate +22% of XLA's footprint before, +2% after). Here the ReLU
    (2K) is dead at the product in the middle (which waits for the second convolution); the
    pre-activation it is computed from (2K), read after the product, is live there."""
    from remat_passes import jax_compat
    from remat_passes.cost import memory
    text = """
    func.func @main(%x: tensor<8x8x8xf32>, %w: tensor<3x8x8xf32>, %m: tensor<64x64xf32>,
                    %g: tensor<4xf32>) -> (tensor<f32>, tensor<4xf32>) {
      %c = stablehlo.constant dense<0.0> : tensor<f32>
      %z = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<f32>) -> tensor<8x8x8xf32>
      %a = stablehlo.convolution(%x, %w) dim_numbers = [b, 0, f]x[0, i, o]->[b, 0, f], window = {pad = [[1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<8x8x8xf32>, tensor<3x8x8xf32>) -> tensor<8x8x8xf32>
      %r = stablehlo.maximum %a, %z : tensor<8x8x8xf32>
      %y = stablehlo.convolution(%r, %w) dim_numbers = [b, 0, f]x[0, i, o]->[b, 0, f], window = {pad = [[1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<8x8x8xf32>, tensor<3x8x8xf32>) -> tensor<8x8x8xf32>
      %sy = stablehlo.reduce(%y init: %c) applies stablehlo.add across dimensions = [0, 1, 2] : (tensor<8x8x8xf32>, tensor<f32>) -> tensor<f32>
      %my = stablehlo.broadcast_in_dim %sy, dims = [] : (tensor<f32>) -> tensor<64x64xf32>
      %mm = stablehlo.multiply %m, %my : tensor<64x64xf32>
      %p = stablehlo.dot_general %mm, %m, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32>
      %sp = stablehlo.reduce(%p init: %c) applies stablehlo.add across dimensions = [0, 1] : (tensor<64x64xf32>, tensor<f32>) -> tensor<f32>
      %s8 = stablehlo.broadcast_in_dim %sp, dims = [] : (tensor<f32>) -> tensor<8x8x8xf32>
      %b:2 = stablehlo.optimization_barrier %r, %g : tensor<8x8x8xf32>, tensor<4xf32>
      %q = stablehlo.multiply %b#0, %s8 : tensor<8x8x8xf32>
      %sq = stablehlo.reduce(%q init: %c) applies stablehlo.add across dimensions = [0, 1, 2] : (tensor<8x8x8xf32>, tensor<f32>) -> tensor<f32>
      %k = stablehlo.compare GT, %a, %z : (tensor<8x8x8xf32>, tensor<8x8x8xf32>) -> tensor<8x8x8xi1>
      %f = stablehlo.convert %k : (tensor<8x8x8xi1>) -> tensor<8x8x8xf32>
      %fs = stablehlo.multiply %f, %s8 : tensor<8x8x8xf32>
      %sk = stablehlo.reduce(%fs init: %c) applies stablehlo.add across dimensions = [0, 1, 2] : (tensor<8x8x8xf32>, tensor<f32>) -> tensor<f32>
      %s1 = stablehlo.add %sq, %sk : tensor<f32>
      return %s1, %b#1 : tensor<f32>, tensor<4xf32>
    }"""
    monkeypatch.setattr(jax_compat, "xla_cpu_fuses_across_barriers", lambda: True)
    monkeypatch.setattr(memory, "PEAK_VALUES", 12)      # every buffer live at the peak
    f = xla_est(text)
    assert f.peak_op.startswith("stablehlo.dot_general at line 12")     # the product
    described = [what for _, what in f.peak_values]
    assert "tensor<8x8x8xf32> from stablehlo.convolution at line 6" in described
    assert not any("stablehlo.maximum" in what for what in described), f.peak_values
    # the arguments (2K + 768 + 16K + 16), the pre-activation (2K), the scaled matrix and
    # the product (16K each), %g copied to its result slot (16) and the output's add (4)
    assert f.peak_bytes == 2 * K + 768 + 16 * K + 16 + 2 * K + 2 * 16 * K + 16 + 4
    monkeypatch.undo()
    if jax.default_backend() == "cpu" and jax_compat.xla_cpu_fuses_across_barriers():
        # XLA's own figure (54,068 B on jaxlib 0.10.2, YNNPACK's fusions off)
        m = rp.compile(rp.Module.parse(text), "main").lower(
            jnp.ones((8, 8, 8)), jnp.ones((3, 8, 8)), jnp.ones((64, 64)), jnp.ones(4)) \
            .compile(compiler_options={"xla_cpu_experimental_ynn_fusion_type": ""}) \
            .memory_analysis()
        got = m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes
        assert abs(f.peak_bytes - got) <= got * 0.01, (f.peak_bytes, got)


def test_xla_model_folds_a_transpose_into_the_dots_that_read_it(monkeypatch):
    """A transpose read by dot_generals alone is folded into them (XLA's TransposeFolding
    and its simplifier rewrite the dots' dimension numbers): each dot reads what it
    transposes, copied only where that is out of the dot's kernel order (the measured
    case: an MLP backward's `g.T`, read by the input gradient, which needs no copy, and by
    the weight gradient, which does; the Equinox backwards' estimates -12.5% of XLA's
    footprint before, -9.8% after). The transpose is no buffer of its own, whether it swaps
    the two groups of dimensions or also reorders one (XLA's footprint is the same)."""
    from remat_passes.cost import memory
    monkeypatch.setattr(memory, "PEAK_VALUES", 12)      # every buffer live at the peak
    program = """
    func.func @main(%x: tensor<8x32x64xf32>, %w: tensor<64x256xf32>, %h: tensor<8x32x256xf32>) -> (tensor<{a}x256xf32>, tensor<64x256xf32>) {{
      %g = stablehlo.multiply %x, %x : tensor<8x32x64xf32>
      %t = stablehlo.transpose %g, dims = [{perm}] : (tensor<8x32x64xf32>) -> tensor<64x{a}xf32>
      %a = stablehlo.dot_general %t, %w, contracting_dims = [0] x [0] : (tensor<64x{a}xf32>, tensor<64x256xf32>) -> tensor<{a}x256xf32>
      %b = stablehlo.dot_general %t, %h, contracting_dims = [{c}] x [0, 1] : (tensor<64x{a}xf32>, tensor<8x32x256xf32>) -> tensor<64x256xf32>
      return %a, %b : tensor<{a}x256xf32>, tensor<64x256xf32>
    }}"""
    for perm, a, c in (("2, 0, 1", "8x32", "1, 2"), ("2, 1, 0", "32x8", "2, 1")):
        text = program.format(perm=perm, a=a, c=c)
        f = xla_est(text)
        # the arguments (64K + 64K + 256K) and outputs (256K + 64K) for the whole call; of
        # the rest, only the weight gradient's copy (64K): g lies in an output allocation
        assert f.peak_bytes == 64 * K + 64 * K + 256 * K + 256 * K + 64 * K + 64 * K, perm
        described = [what for _, what in f.peak_values]
        assert sum("a transposed copy made early" in what for what in described) == 1
        assert not any("stablehlo.transpose" in what for what in described), f.peak_values
        if jax.default_backend() == "cpu":   # XLA's own figure: 786,448 B, YNNPACK fusions off
            m = rp.compile(rp.Module.parse(text), "main").lower(
                jnp.ones((8, 32, 64)), jnp.ones((64, 256)), jnp.ones((8, 32, 256))) \
                .compile(compiler_options={"xla_cpu_experimental_ynn_fusion_type": ""}) \
                .memory_analysis()
            got = m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes
            assert abs(f.peak_bytes - got) <= got * 0.01, (perm, f.peak_bytes, got)


def test_xla_model_counts_the_transposed_copies_of_a_dot_out_of_order():
    """A matrix is read transposed where it is: x @ W and x @ W.T cost their result. An
    operand of more dimensions out of the kernels' order (the right one with its free
    dimensions before the contracting one; attention's scores with the heads not leading)
    is copied, live while the dot runs."""
    dot = """
    func.func @main(%x: tensor<{x}xf32>, %w: tensor<{w}xf32>) -> tensor<{y}xf32> {{
      %0 = stablehlo.dot_general %x, %w, {dims} : (tensor<{x}xf32>, tensor<{w}xf32>) -> tensor<{y}xf32>
      return %0 : tensor<{y}xf32>
    }}"""
    # x 8x32 (1K), W 32x64 or 64x32 (8K), y 8x64 (2K)
    for w, dims in (("32x64", "[1] x [0]"), ("64x32", "[1] x [1]")):
        matrix = xla_est(dot.format(x="8x32", w=w, y="8x64", dims=f"contracting_dims = {dims}"))
        assert matrix.peak_bytes == K + 8 * K + 2 * K
    # W (64x32, 8K) times a batch of 2x4 vectors of 32 (1K) laid out as the right operand
    # [2, 4, 32]: the result 64x2x4 (2K), and the vectors copied
    batch = xla_est(dot.format(x="64x32", w="2x4x32", y="64x2x4",
                               dims="contracting_dims = [1] x [2]"))
    assert batch.peak_bytes == 8 * K + K + 2 * K + K
    # q, k: (batch 2, seq 4, heads 2, dim 16) = 1K each; scores (2, 2, 4, 4) 256 B
    heads = xla_est(dot.format(x="2x4x2x16", w="2x4x2x16", y="2x2x4x4",
                               dims="batching_dims = [0, 2] x [0, 2], "
                                    "contracting_dims = [3] x [3]"))
    assert heads.peak_bytes == 2 * K + 256 + 2 * K


@pytest.mark.parametrize("policy", ["nothing_saveable", "dots_saveable"])
def test_xla_model_predicts_xla_cpu_on_a_conv_net_backward(policy, monkeypatch):
    """Against XLA:CPU's memory_analysis() of a two-layer conv net's split backward: within
    15% with the weight gradients' transposed copies counted (measured +0.7% and +0.7%),
    more than 15% under without them."""
    from jax import lax
    from remat_passes.cost import memory

    def loss(W1, W2, x):
        for W, s in ((W1, 1), (W2, 2)):
            x = jax.nn.relu(lax.conv_general_dilated(
                x, W, (s, s), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")))
        return jnp.mean(x ** 2)
    args = (jnp.ones((3, 3, 4, 16)) * 0.1, jnp.ones((3, 3, 16, 32)) * 0.1, jnp.ones((8, 32, 32, 4)))
    split = rp.remat(rp.export_vjp(loss, *args), policy, mode="split")
    inputs = [jnp.zeros(a.shape, a.dtype) for a in split.to_exported("main_fwd").in_avals]
    res = rp.compile(split, "main_fwd").lower(*inputs).compile()(*inputs)
    m = rp.compile(split, "main_bwd").lower(*res[1:], jnp.ones_like(res[0])).compile() \
        .memory_analysis()
    footprint = (m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes
                 - m.alias_size_in_bytes)
    with_copies = estimate_memory(split, model="xla", backend="cpu")["main_bwd"].peak_bytes
    monkeypatch.setitem(memory.COPIES, "stablehlo.convolution", lambda op: [])
    without = estimate_memory(split, model="xla", backend="cpu")["main_bwd"].peak_bytes
    assert abs(with_copies - footprint) <= 0.15 * footprint
    assert abs(without - footprint) > 0.15 * footprint


def test_the_measured_error_printed_is_that_of_the_stored_benchmark():
    """`--print-memory --memory-model=xla` says how close the model came to XLA per backend
    and, on CPU, per XLA:CPU generation (xla_buffers.MEASURED): the figures are those of the
    stored `python -m tools.benchmarks xla` results, so a rerun that changes them fails here
    until MEASURED says so too. The line quotes the installed jaxlib's."""
    import json
    from remat_passes import jax_compat
    from remat_passes.cost.xla_buffers import MEASURED, measured_key, model_line
    from tools.benchmarks import xla_memory
    results = pathlib.Path(__file__).resolve().parents[2] / "tools" / "benchmarks" / "results"
    files = {"cpu": "xla.json", "cpu, jaxlib >= 0.11": "xla_cpu_jax0_12.json",
             "gpu": "xla_gpu.json"}
    assert set(files) == set(MEASURED)
    for key, name in files.items():
        checks = xla_memory.checks(json.loads((results / name).read_text()))
        within = [ok for text, ok in checks if "estimate off" in text]
        assert MEASURED[key][:2] == (sum(within), len(within)), key
    old = jax_compat.xla_cpu_fuses_across_barriers()
    assert measured_key("cpu") == ("cpu" if old else "cpu, jaxlib >= 0.11")
    assert ("jaxlib 0.10" if old else "jaxlib 0.12") in model_line("cpu")
    docs = " ".join((results.parents[2] / "docs" / "cli.md").read_text().split())
    assert model_line("cpu") in docs             # the examples there are today's lines
    assert "not measured" in model_line("tpu")


def test_the_xla_page_checks_each_sweep_and_its_monotone_twin():
    """A sweep's check: XLA's footprint at a budget at most 1.02x that of any larger budget;
    where `xla --monotone` measured the same budgets with a monotone rule, that sweep is
    checked too, and the page shows it beside the plain one with its rule (* where it took
    another budget's plan; sweeps stored before the rule was recorded took smaller ones)."""
    from tools.benchmarks import xla_memory

    def point(budget, footprint, mono=None, key="other_budgets_plan"):
        p = {"budget": budget, "activations": budget, "levels": 1,
             "halves": [{"temp": footprint, "args": 0, "out": 0}]}
        if mono is not None:
            p["monotone"] = {"activations": mono[0], "halves": [{"temp": mono[1], "args": 0,
                                                                "out": 0}],
                             key: mono[0] != budget}
        return p
    plain = {"model": "m", "points": [point(0, 100), point(10, 130), point(20, 110)]}
    assert [(t, ok) for t, ok in xla_memory.checks({"rows": [], "sweeps": [plain]})] == [
        ("m sweep: XLA footprint at a budget at most 1.182x that of any larger budget", False)]
    older = {"model": "m", "monotone_commit": "abc1234", "points": [
        point(b, f, m, key="smaller_budgets_plan")
        for b, f, m in ((0, 100, (0, 100)), (10, 130, (0, 100)), (20, 110, (20, 110)))]}
    larger = {"model": "n", "monotone_commit": "def5678", "monotone_rule": "larger",
              "points": [point(0, 100, (20, 110)), point(10, 130, (20, 110)),
                         point(20, 110, (20, 110))]}
    checks = xla_memory.checks({"rows": [], "sweeps": [older, larger]})
    assert [ok for _, ok in checks] == [False, True, False, True]
    assert checks[1][0].startswith("m sweep (monotone=smaller): XLA footprint at a budget at "
                                   "most 1.000x")
    assert checks[3][0].startswith("n sweep (monotone=larger): XLA footprint at a budget at "
                                   "most 1.000x")
    import json
    stored = json.loads((pathlib.Path(__file__).resolve().parents[2] / "tools" / "benchmarks"
                         / "results" / "xla.json").read_text())
    page = xla_memory.render(dict(stored, rows=[], sweeps=[older, larger]))
    assert "| m (monotone=smaller at abc1234) | 0 | 0 | 1 | 100 | 0 | 100 |" in page
    assert "| m | 10 | 10 | 1 | 130 | 0 * | 100 |" in page
    assert "| n (monotone=larger at def5678) | 0 | 0 | 1 | 100 | 20 * | 110 |" in page
    assert "| n | 20 | 20 | 1 | 110 | 20 | 110 |" in page


def test_the_report_names_what_is_live_at_the_peak():
    """`peak_values`: the largest buffers live at the peak, largest first, summing to the
    peak where no more than five are live (arguments by number, values by their op)."""
    f = only(est("""
    func.func @main(%a: tensor<16xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
      %c = stablehlo.constant dense<0.0> : tensor<f32>
      %0 = stablehlo.sine %a : tensor<16xf32>
      %1 = stablehlo.reduce(%0 init: %c) applies stablehlo.add across dimensions = [0] : (tensor<16xf32>, tensor<f32>) -> tensor<f32>
      %2 = stablehlo.broadcast_in_dim %1, dims = [] : (tensor<f32>) -> tensor<4xf32>
      %3 = stablehlo.add %2, %b : tensor<4xf32>
      return %3 : tensor<4xf32>
    }"""))
    assert f.peak_op.startswith("stablehlo.sine")
    assert [b for b, _ in f.peak_values] == [64, 64, 16, 4]
    assert sum(b for b, _ in f.peak_values) == f.peak_bytes
    what = [w for _, w in f.peak_values]
    assert sorted(what[:2]) == ["tensor<16xf32> argument #0",
                                "tensor<16xf32> from stablehlo.sine at line 4"]
    assert what[2:] == ["tensor<4xf32> argument #1", "tensor<f32> from stablehlo.constant at line 3"]
    text = format_memory(MemoryEstimate({"main": f}), peak_values=True).splitlines()
    assert len(text) == 2 and text[1].startswith("  live at the peak: 64 B tensor<16xf32>")


def test_xla_liveness_reads_the_peak_of_a_dump(tmp_path):
    """tools.benchmarks.xla_liveness: from an XLA dump of a program with two scratch
    buffers live at once, the values it finds at XLA's peak fill the temp allocation."""
    import sys
    from tools.benchmarks import ynn_probe
    from tools.benchmarks.xla_liveness import liveness
    code = ("import jax, jax.numpy as jnp\n"
            "def f(W, x):\n"
            "    h = jnp.tanh(x @ W)\n"
            "    g = jnp.sin(h @ W)\n"
            "    return (g @ W) * h\n"
            "jax.jit(f).lower(jnp.ones((256, 256)), jnp.ones((64, 256))).compile()\n")
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_dump_to={tmp_path} {ynn_probe.YNN_OFF}")
    proc = run_process([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    r = liveness(str(tmp_path), "jit_f")
    assert r["temp"] >= 2 * 64 * 256 * 4           # h and g @ W, or g, live together
    assert r["peak"] == r["temp"] and r["gap"] == 0, r   # no hole: the values fill it
    # XLA's own live ranges where the dump has them (`*-live-range.txt`)
    assert r["ranges"] == ("xla" if list(tmp_path.glob("*jit_f*live-range.txt")) else "uses")
    assert sum(size for size, _, _ in r["values"]) == r["peak"]
    assert all(shape.startswith("f32[64,256]") for _, _, shape in r["values"])
    # tools.benchmarks.xla_heap: the heap packed again as XLA packs it is XLA's allocation
    from tools.benchmarks.xla_heap import replay
    packed = replay(str(tmp_path), "jit_f")
    if r["ranges"] == "xla":
        assert packed["replayed"] == r["temp"] and packed["live"] == r["peak"], packed
    else:
        assert packed is None      # (no live ranges in the dump to replay)


@pytest.mark.slow
def test_xla_dump_sets_the_estimate_beside_xla_for_one_program(tmp_path, monkeypatch, capsys):
    """tools.benchmarks.xla_dump: one benchmark program's split halves, compiled with XLA's
    dump on under the names rp.compile gives them (jit_main_fwd, jit_main_bwd), each with
    XLA's footprint, the estimate and XLA's own scratch peak read from the dump, then the same
    of JAX's split of jax.checkpoint (jit_fwd, jit_bwd); with --joint the same of the joint
    form (jit_main) and JAX's joint program; a model or policy it does not know is an error
    naming what it knows."""
    import sys
    run = [sys.executable, "-m", "tools.benchmarks.xla_dump"]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    root = pathlib.Path(__file__).resolve().parents[2]
    # (the conv net under dots_saveable: the tied and the untied backward, both compiled,
    # differ in XLA's temp, so the scratch peak printed must be the measured variant's)
    proc = run_process(run + ["convnet", "dots", str(tmp_path)], env=env, cwd=root,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    for half in ("main_fwd", "main_bwd"):
        assert list(tmp_path.glob(f"module_*.jit_{half}.*buffer-assignment.txt")), half
        block = proc.stdout.split(f"@{half}:")[1].split("\n@")[0]
        assert "XLA footprint" in block and "estimate, live at the peak" in block
        temp = int(re.search(r"temp ([\d,]+),", block)[1].replace(",", ""))
        assert f"XLA: temp allocation {temp:,} B" in block      # the dump is the run's
        assert re.search(r"XLA's packing replayed: .*\(XLA's;", block), block
    for half in ("fwd", "bwd"):       # JAX's split of jax.checkpoint, beside ours
        assert list(tmp_path.glob(f"module_*.jit_{half}.*buffer-assignment.txt")), half
        block = proc.stdout.split(f"JAX's {half}:")[1].split("\nJAX's")[0]
        temp = int(re.search(r"temp ([\d,]+),", block)[1].replace(",", ""))
        assert f"XLA: temp allocation {temp:,} B" in block
        assert re.search(r"XLA's packing replayed: .*\(XLA's;", block), block
    # --joint: the joint form as rp.jit builds it (jit_main), then JAX's joint program
    proc = run_process(run + ["convnet", "dots", str(tmp_path / "joint"), "--joint"],
                       env=env, cwd=root, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("convnet dots, joint form (per-")
    assert list((tmp_path / "joint" / "ours").glob("module_*.jit_main.*buffer-assignment.txt"))
    for head in ("@main:", "JAX's joint:"):
        block = proc.stdout.split(head)[1].split("\nJAX's")[0]
        temp = int(re.search(r"temp ([\d,]+),", block)[1].replace(",", ""))
        assert f"XLA: temp allocation {temp:,} B" in block, block    # the dump is the run's
        # XLA's heap packed again over its own live ranges: XLA's allocation to the byte
        assert re.search(r"XLA's packing replayed: .*\(XLA's;", block), block
    assert "estimate, live at the peak" in proc.stdout.split("@main:")[1]
    # (a wrong model or policy, in this process: main() sets XLA_FLAGS, put back after)
    from tools.benchmarks import xla_dump
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
    for bad, needle in ((["nope", "none"], "unknown model 'nope'"),
                        (["mlp", "nope"], "unknown policy 'nope' for mlp; known: none"),
                        (["mlp", "auto=lots"], "auto=BYTES takes a whole number of bytes")):
        assert xla_dump.main(bad + [str(tmp_path / "x")]) == 2, bad
        assert needle in capsys.readouterr().err, bad


@pytest.mark.slow
def test_xla_dump_dumps_a_program_jax_has_cached(tmp_path):
    """JAX's persistent compilation cache leaves --xla_dump_to out of its key: with a cache
    that holds the programs (the second run into the same cache directory), XLA would compile,
    and dump, none of them. xla_dump turns the cache off, so it dumps them every time."""
    import sys
    cache = tmp_path / "cache"
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=str(cache),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    root = pathlib.Path(__file__).resolve().parents[2]
    for run in ("first", "second"):
        proc = run_process([sys.executable, "-m", "tools.benchmarks.xla_dump", "mlp", "none",
                            str(tmp_path / run)], env=env, cwd=root, capture_output=True,
                           text=True)
        assert proc.returncode == 0, proc.stderr
        for half in ("main_fwd", "main_bwd", "fwd", "bwd"):
            assert list((tmp_path / run).rglob(f"module_*.jit_{half}.*buffer-assignment.txt")), \
                (run, half)


def test_xla_model_counts_split_k_partials_on_a_gpu():
    """XLA:GPU computes a product with a small output and a long contraction as partial
    products over slices of the contraction (split-K), summed afterwards: the partials are
    scratch while it runs (K // 64 of them, 4 to 16). Not for a batched product, a large
    output, a short contraction, nor (measured: the scanned models) inside a loop body."""
    def dot(m, k, n=512):
        return f"""
    func.func @main(%x: tensor<{m}x{k}xf32>, %w: tensor<{k}x{n}xf32>) -> tensor<{m}x{n}xf32> {{
      %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<{m}x{k}xf32>, tensor<{k}x{n}xf32>) -> tensor<{m}x{n}xf32>
      return %0 : tensor<{m}x{n}xf32>
    }}"""

    def partials(text):
        return xla_est(text, "gpu").peak_bytes - xla_est(text, "tpu").peak_bytes
    # 512 // 64 partial products of the f32 output; a contraction of 128 gives the
    # minimum of 4, one of 4096 the maximum of 16
    for k, n in ((512, 8), (128, 4), (4096, 16)):
        assert partials(dot(128, k)) == n * 128 * 512 * 4, k
    assert any(what == "split-K partial products"
               for _, what in xla_est(dot(128, 512), "gpu").peak_values)
    assert partials(dot(512, 512)) == 0      # 262,144 outputs
    assert partials(dot(128, 64)) == 0       # a short contraction
    batched = """
    func.func @main(%x: tensor<4x32x512xf32>, %w: tensor<4x512x32xf32>) -> tensor<4x32x32xf32> {
      %0 = stablehlo.dot_general %x, %w, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<4x32x512xf32>, tensor<4x512x32xf32>) -> tensor<4x32x32xf32>
      return %0 : tensor<4x32x32xf32>
    }"""
    assert partials(batched) == 0
    looped = """
    func.func @main(%x: tensor<128x512xf32>, %w: tensor<512x512xf32>) -> tensor<128x512xf32> {
      %c0 = stablehlo.constant dense<0> : tensor<i32>
      %c1 = stablehlo.constant dense<1> : tensor<i32>
      %c4 = stablehlo.constant dense<4> : tensor<i32>
      %r:2 = stablehlo.while(%i = %c0, %h = %x) : tensor<i32>, tensor<128x512xf32>
        cond {
          %p = stablehlo.compare LT, %i, %c4 : (tensor<i32>, tensor<i32>) -> tensor<i1>
          stablehlo.return %p : tensor<i1>
        } do {
          %n = stablehlo.add %i, %c1 : tensor<i32>
          %d = stablehlo.dot_general %h, %w, contracting_dims = [1] x [0] : (tensor<128x512xf32>, tensor<512x512xf32>) -> tensor<128x512xf32>
          stablehlo.return %n, %d : tensor<i32>, tensor<128x512xf32>
        }
      return %r#1 : tensor<128x512xf32>
    }"""
    assert partials(looped) == 0
    # estimate_function (what the two-level decision compares) models the backend too
    from remat_passes.cost.memory import estimate_function
    m = rp.Module.parse(dot(128, 512))
    with m.op.context:
        f = m.op.body.operations[0]
        gpu, cpu = (estimate_function(f, "xla", backend=b) for b in ("gpu", "cpu"))
    assert gpu - cpu == 8 * 128 * 512 * 4


def test_xla_model_fuses_across_barriers_only_where_xla_cpu_does(monkeypatch):
    """XLA:CPU of jaxlib 0.10 drops optimization barriers before it fuses: an elementwise
    op read through a barrier is computed inside the barrier's reader, never stored. From
    jaxlib 0.11 its fusions stop at barriers (as XLA:GPU's): the op is stored (measured on
    jax 0.12: the conv net's joint form under everything_saveable, estimate 33% under ->
    0%)."""
    from remat_passes import jax_compat
    text = """
    func.func @main(%x: tensor<256xf32>) -> tensor<f32> {
      %z = stablehlo.constant dense<0.0> : tensor<f32>
      %0 = stablehlo.sine %x : tensor<256xf32>
      %1 = stablehlo.optimization_barrier %0 : tensor<256xf32>
      %2 = stablehlo.reduce(%1 init: %z) applies stablehlo.add across dimensions = [0] : (tensor<256xf32>, tensor<f32>) -> tensor<f32>
      return %2 : tensor<f32>
    }"""
    peaks = {}
    for across in (True, False):
        monkeypatch.setattr(jax_compat, "xla_cpu_fuses_across_barriers", lambda a=across: a)
        peaks[across] = xla_est(text).peak_bytes
    assert peaks[False] - peaks[True] == 1 * K      # the sine's buffer


def test_xla_model_pads_a_convolutions_input_on_a_gpu():
    """XLA:GPU gives cuDNN symmetric padding only: a convolution padded 0 below and 1 above
    (a stride-2 'SAME' one) works on a padded copy of its input, made just before it. The
    copy is live with the input where it is made and with the result while the
    convolution runs (the input dies in between). cuDNN reads any layout: no transposed
    copies on a GPU. Symmetric padding, or lhs dilation (cuDNN's backward-input
    convolution), pads nothing."""
    def conv(pad, hw=16, lhs_dilation=""):
        o = f"tensor<8x{hw}x{hw}x32xf32>"
        return f"""
    func.func @main(%x: tensor<8x32x32x16xf32>, %w: tensor<3x3x16x32xf32>) -> {o} {{
      %a = stablehlo.sine %x : tensor<8x32x32x16xf32>
      %0 = stablehlo.convolution(%a, %w) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {{stride = [2, 2], pad = {pad}{lhs_dilation}}} {{batch_group_count = 1 : i64, feature_group_count = 1 : i64}} : (tensor<8x32x32x16xf32>, tensor<3x3x16x32xf32>) -> {o}
      return %0 : {o}
    }}"""
    x, w = 8 * 32 * 32 * 16 * 4, 3 * 3 * 16 * 32 * 4
    out, padded = 8 * 16 * 16 * 32 * 4, 8 * 33 * 33 * 16 * 4
    # the copy is live with `a` (the pad) or with the result (the convolution): the larger
    gpu = xla_est(conv("[[0, 1], [0, 1]]"), "gpu")
    assert gpu.peak_bytes == x + w + padded + max(x, out), gpu.peak_values
    assert any(what == "a padded copy of the input" for _, what in gpu.peak_values)
    # symmetric padding: x, w, a and the result, while the convolution runs
    assert xla_est(conv("[[1, 1], [1, 1]]"), "gpu").peak_bytes == x + w + x + out
    # lhs dilation (63 wide, padded to 64: 31 outputs): no copy
    dilated = conv("[[0, 1], [0, 1]]", 31, ", lhs_dilate = [2, 2]")
    assert xla_est(dilated, "gpu").peak_bytes == x + w + x + 8 * 31 * 31 * 32 * 4


def test_xla_model_copies_host_values_in_early_on_a_gpu():
    """XLA:GPU starts the copy of a value from host memory back to the device early (at the
    start of the program, measured on the offload policies' backward halves): its device
    buffer is live from there, not from where the annotation is."""
    text = """
    func.func @main(%x: tensor<256xf32>, %h: tensor<1024xf32> {mhlo.memory_kind = "pinned_host"}) -> tensor<256xf32> {
      %z = stablehlo.constant dense<0.0> : tensor<f32>
      %b = stablehlo.broadcast_in_dim %x, dims = [1] : (tensor<256xf32>) -> tensor<8x256xf32>
      %c = stablehlo.tanh %b : tensor<8x256xf32>
      %s1 = stablehlo.reduce(%c init: %z) applies stablehlo.add across dimensions = [0] : (tensor<8x256xf32>, tensor<f32>) -> tensor<256xf32>
      %s2 = stablehlo.reduce(%c init: %z) applies stablehlo.maximum across dimensions = [0] : (tensor<8x256xf32>, tensor<f32>) -> tensor<256xf32>
      %d = stablehlo.custom_call @annotate_device_placement(%h) {has_side_effect = true, mhlo.frontend_attributes = {_xla_buffer_placement = "device"}} : (tensor<1024xf32>) -> tensor<1024xf32>
      %q = stablehlo.reshape %d : (tensor<1024xf32>) -> tensor<4x256xf32>
      %m = stablehlo.reduce(%q init: %z) applies stablehlo.maximum across dimensions = [0] : (tensor<4x256xf32>, tensor<f32>) -> tensor<256xf32>
      %s = stablehlo.add %s1, %s2 : tensor<256xf32>
      %r = stablehlo.add %s, %m : tensor<256xf32>
      return %r : tensor<256xf32>
    }"""
    # x (1K, kept) and the result (1K) throughout; the tanh's 8K (stored: an expensive op
    # read twice) with the first sum (1K; the second goes into the result's buffer): 11K.
    # On a GPU the 4K copied in is there beside them: 15K
    assert xla_est(text, "tpu").peak_bytes == 11 * K
    assert xla_est(text, "gpu").peak_bytes == 15 * K
    # held by an optimization barrier with the sum (as annotate-host-offload places it,
    # as JAX does), the copy cannot start before the barrier: the tanh is gone by then,
    # and the peak is the CPU's 11K again (at the tanh: x, the result, tanh and a sum)
    held = text.replace(
        "%d = stablehlo.custom_call @annotate_device_placement(%h)",
        "%hb:2 = stablehlo.optimization_barrier %h, %s1 : tensor<1024xf32>, tensor<256xf32>\n"
        "      %d = stablehlo.custom_call @annotate_device_placement(%hb#0)").replace(
        "%s = stablehlo.add %s1, %s2", "%s = stablehlo.add %hb#1, %s2")
    assert "%hb#0" in held and "%hb#1, %s2" in held
    assert xla_est(held, "gpu").peak_bytes == 11 * K


def test_xla_model_makes_values_returned_to_host_memory_there():
    """A value the function returns only in a result slot in host memory (a scan's stacked
    residuals, offloaded in split form) is made there: no device bytes, except on CPU (one
    memory). Returned to a device slot as well, it is on the device."""
    text = """
    func.func @main(%x: tensor<1024xf32>) -> (tensor<1024xf32>, tensor<1024xf32> {mhlo.memory_kind = "pinned_host"}) {
      %a = stablehlo.sine %x : tensor<1024xf32>
      %b = stablehlo.cosine %x : tensor<1024xf32>
      return %a, %b : tensor<1024xf32>, tensor<1024xf32>
    }"""
    assert xla_est(text, "gpu").peak_bytes == 8 * K       # x and a
    assert xla_est(text, "cpu").peak_bytes == 12 * K      # and b
    both = text.replace("return %a, %b", "return %a, %a").replace(
        "%b = stablehlo.cosine %x : tensor<1024xf32>", "")
    assert xla_est(both, "gpu").peak_bytes == 8 * K       # a on the device, its copy not
    assert xla_est(both, "cpu").peak_bytes == 12 * K      # (on CPU the copy is memory too)
