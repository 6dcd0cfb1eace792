"""remat_passes.flops: the static FLOP count, checked against XLA's own cost analysis.

On loop-free programs the count must equal what XLA's HloCostAnalysis reports
(`flops + transcendentals` of the lowered, unoptimized program) for the same
module; for scans, the loop body counts once per iteration (XLA counts it once),
so a scan over N layers costs N times one layer.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import remat_passes as rp
from remat_passes.cost import flops
from remat_passes.ir import graph


def xla_flops(module) -> float:
    exp = module.to_exported()
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in exp.in_avals]
    ca = jax.jit(exp.call).lower(*args).cost_analysis()
    ca = ca[0] if isinstance(ca, (list, tuple)) else ca
    return float(ca.get("flops", 0.0)) + float(ca.get("transcendentals", 0.0))


def mlp(W, x):
    for _ in range(3):
        x = jnp.tanh(x @ W)
    return jnp.sum(x)


def conv(w, x):
    y = jax.lax.conv_general_dilated(x, w, (2, 2), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return jnp.sum(jax.nn.relu(y))


def grouped_conv(w, x):
    y = jax.lax.conv_general_dilated(x, w, (1, 1), ((1, 2), (0, 1)), rhs_dilation=(2, 1),
                                     dimension_numbers=("NCHW", "OIHW", "NCHW"),
                                     feature_group_count=2)
    return jnp.sum(jnp.exp(y))


def attention(wq, x):
    q = x @ wq
    s = jnp.einsum("bqd,bkd->bqk", q, x)
    return jnp.sum(jax.nn.softmax(s, axis=-1) @ x)


CASES = {
    "mlp": (mlp, (jnp.ones((64, 64)), jnp.ones((8, 64)))),
    "conv": (conv, (jnp.ones((3, 3, 4, 8)), jnp.ones((2, 15, 16, 4)))),
    "grouped_conv": (grouped_conv, (jnp.ones((6, 2, 3, 2)), jnp.ones((2, 4, 9, 7)))),
    "attention": (attention, (jnp.ones((16, 16)), jnp.ones((2, 8, 16)))),
}


@pytest.mark.parametrize("name", list(CASES))
def test_equals_xla_cost_analysis_without_loops(name):
    fun, args = CASES[name]
    module = rp.export_vjp(fun, *args)
    ours, theirs = flops.function_flops(module), xla_flops(module)
    assert theirs > 0
    # XLA may count the very last scalar op differently; everything else is equal
    assert abs(ours - theirs) <= max(2.0, 1e-4 * theirs), (ours, theirs)


def _layer(h, w):
    return jnp.tanh(h @ w), None


def scanned(Ws, x):
    return jnp.sum(jax.lax.scan(_layer, x, Ws)[0])


def unrolled(Ws, x):   # the same layers, one weight argument each
    for W in Ws:
        x = _layer(x, W)[0]
    return jnp.sum(x)


def test_scan_body_counts_once_per_iteration():
    Ws, x = jnp.ones((8, 32, 32)) * 0.1, jnp.ones((4, 32))
    loop = flops.function_flops(rp.export_vjp(scanned, Ws, x))
    flat = flops.function_flops(rp.export_vjp(unrolled, list(Ws), x))
    # the loop adds its counter and index arithmetic per iteration (a few scalar ops)
    assert flat <= loop <= flat + 2 * 8 * 8, (loop, flat)
    assert xla_flops(rp.export_vjp(scanned, Ws, x)) < flat / 4   # XLA: the body once


def test_trip_counts():
    def counted(x):
        return jax.lax.fori_loop(0, 5, lambda i, v: jnp.sin(v), x)

    def data_dependent(x):
        return jax.lax.while_loop(lambda v: jnp.sum(v) < 10.0, lambda v: v * 2.0, x)
    for fun, expected in ((counted, 5), (data_dependent, None)):
        module = rp.Module.parse(jax.jit(fun).lower(jnp.ones(3)).as_text())
        with module.op.context:
            whiles = [op.operation for op in graph.body_block(
                graph.find_func(module.op, "main")).operations
                if op.operation.name == "stablehlo.while"]
            assert whiles
            assert flops.trip_count(whiles[0]) == expected


def test_op_bytes():
    module = rp.Module.parse("""
func.func @main(%a: tensor<4x8xf32>, %b: tensor<8x2xbf16>) -> tensor<4x2xf32> {
  %c = stablehlo.convert %b : (tensor<8x2xbf16>) -> tensor<8x2xf32>
  %d = stablehlo.dot_general %a, %c, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x2xf32>) -> tensor<4x2xf32>
  return %d : tensor<4x2xf32>
}""")
    with module.op.context:
        ops = list(graph.body_block(graph.find_func(module.op, "main")).operations)
        assert flops.op_bytes(ops[0]) == 8 * 2 * 2 + 8 * 2 * 4
        assert flops.op_bytes(ops[1]) == 4 * 8 * 4 + 8 * 2 * 4 + 4 * 2 * 4
        assert flops.CostModel().op_flops(ops[1]) == 2 * 4 * 2 * 8


def test_ragged_dot_counts_each_row_with_its_own_group():
    """`jax.lax.ragged_dot` (a mixture of experts' grouped matmul) exports for GPU and TPU
    as a `stablehlo.composite "chlo.ragged_dot"` whose decomposition runs every group over
    every row. Each row meets its own group's weights only, so each ragged dot of the
    training step (the forward's, and the two its transpose makes: the weight gradient
    contracts the ragged rows) costs what one dense matmul of all rows costs, as XLA counts
    that matmul."""
    M, K, N = 32, 16, 24
    x, w = jnp.ones((M, K)), jnp.ones((4, K, N))
    sizes = jnp.array([5, 11, 0, 16], jnp.int32)

    def loss(x, w):
        return jnp.sum(jnp.sin(jax.lax.ragged_dot(x, w, sizes)))
    module = rp.export(jax.grad(loss, argnums=(0, 1)), x, w, platforms=("cuda",))
    with module.op.context:
        model = flops.CostModel(module.op)
        ragged = [model.op_flops(op) for op in graph.body_block(
            graph.find_func(module.op, "main")).operations
            if op.operation.name == "stablehlo.composite"]
    dense = xla_flops(rp.export(lambda x, v: x @ v, x, w[0]))
    assert dense == 2 * M * K * N
    assert ragged == [dense] * 3, ragged


def test_a_composite_costs_its_decomposition():
    module = rp.Module.parse("""
func.func @main(%a: tensor<4x8xf32>, %b: tensor<8x2xf32>) -> tensor<4x2xf32> {
  %d = stablehlo.composite "test.matmul" %a, %b {decomposition = @impl} : (tensor<4x8xf32>, tensor<8x2xf32>) -> tensor<4x2xf32>
  return %d : tensor<4x2xf32>
}
func.func private @impl(%a: tensor<4x8xf32>, %b: tensor<8x2xf32>) -> tensor<4x2xf32> {
  %d = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x2xf32>) -> tensor<4x2xf32>
  %t = stablehlo.tanh %d : tensor<4x2xf32>
  return %t : tensor<4x2xf32>
}""")
    assert flops.function_flops(module) == 2 * 4 * 2 * 8 + 4 * 2


def _custom_calls(module) -> list:
    """The custom calls of a Module, in every function."""
    return graph.ops_named(module.op, "stablehlo.custom_call")


def test_a_block_scaled_matmul_counts_as_its_dot():
    """`jax.nn.scaled_dot_general` on GPU is a custom call: it costs the dot it computes,
    as XLA counts the same dot (the lowering for CPU, a dot_general of the dequantized
    operands, counted here by XLA)."""
    from jax.nn import get_scaled_dot_general_config, scaled_dot_general
    cfg = get_scaled_dot_general_config("mxfp8")
    a, b = jnp.ones((2, 64, 64)), jnp.ones((2, 32, 64))

    def f(a, b):
        return scaled_dot_general(a, b, (((2,), (2,)), ((0,), (0,))), configs=[cfg] * 3)
    module = rp.export(f, a, b, platforms=("cuda",))
    with module.op.context:
        found = _custom_calls(module)
        assert [flops.CostModel(module.op).op_flops(op) for op in found] == \
            [2 * 2 * 64 * 32 * 64]
    dense = rp.export(lambda a, b: jnp.einsum("bmk,bnk->bmn", a, b), a, b)
    assert xla_flops(dense) == 2 * 2 * 64 * 32 * 64


def test_a_pallas_tpu_kernel_costs_its_cost_estimate():
    """A Pallas kernel is a custom call whose work the count cannot see; on TPU it carries
    the `cost_estimate` given to `pallas_call` (what XLA's cost analysis reads), and the
    count takes its flops and transcendentals. Lowered for TPU here, without one."""
    from jax.experimental import pallas as pl

    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.sin(x_ref[...]) * 2.0

    def f(x):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              cost_estimate=pl.CostEstimate(flops=12345, transcendentals=678,
                                                            bytes_accessed=9999))(x)
    module = rp.export(f, jnp.ones((8, 128)), platforms=("tpu",))
    with module.op.context:
        found = _custom_calls(module)
        assert [flops.CostModel(module.op).op_flops(op) for op in found] == [12345 + 678]
