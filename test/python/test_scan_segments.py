"""segment-scans (issue 27): a scan keeps its carry every k iterations and the backward reruns
one segment at a time. Checked live: gradients and outputs against `jax.vjp` of the same
function, for trip counts k divides and does not, per-iteration policies inside the body,
pytree carries with `xs` and `ys`, reverse, nested and consecutive scans; XLA's scratch
memory of a 256-step scan against the unsegmented program; and what the pass refuses."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

import remat_passes as rp
from remat_passes.ir.mlir import RematError
from remat_testlib import assert_trees_close, leaves, reference_vjp, run_joint, run_split

KEY = jax.random.PRNGKey(0)


def rnn(params, xs):
    W, U = params

    def step(h, x):
        h = jnp.tanh(jnp.sin(h @ W) + x @ U)
        return h, h.sum(axis=1)
    h, ys = jax.lax.scan(step, jnp.zeros((4, 16)), xs)
    return (h ** 2).sum() + (ys ** 2).sum()


def rnn_args(n):
    k1, k2, k3 = jax.random.split(KEY, 3)
    return ((jax.random.normal(k1, (16, 16)) * 0.3, jax.random.normal(k2, (8, 16)) * 0.3),
            jax.random.normal(k3, (n, 4, 8)))


def lstm_like(params, xs):
    """A pytree carry (h, c, step count) and per-iteration outputs."""
    W = params

    def step(carry, x):
        h, c, t = carry
        z = jnp.tanh(h @ W + x)
        c = 0.5 * c + jnp.cos(z)
        h = c * z
        return (h, c, t + 1), (h.mean(), c)
    (h, c, t), (m, cs) = jax.lax.scan(step, (jnp.ones((2, 8)), jnp.zeros((2, 8)), 0), xs)
    return h.sum() + (c ** 2).sum() + m.sum() + jnp.sin(cs).sum() + t


def lstm_args(n):
    return jax.random.normal(KEY, (8, 8)) * 0.4, jax.random.normal(KEY, (n, 2, 8))


def check_gradients(fun, args, policy, k, **kw):
    """Joint and split form: the outputs and gradients of jax.vjp, every loop segmented."""
    module = rp.export_vjp(fun, *args)
    out, ct, grads = reference_vjp(fun, args)
    expected = leaves(out) + leaves(grads)
    seg = rp.remat(module, policy, scan_segments=k, **kw)
    assert_trees_close(run_joint(seg, args, ct), expected, what=f"{policy} segments={k}")
    split = rp.remat(module, policy, scan_segments=k, mode="split", **kw)
    got, residuals = run_split(split, args, ct, len(leaves(out)))
    assert_trees_close(got, expected, what=f"split {policy} segments={k}")
    assert len(residuals) == len(split.residuals)
    for module_ in (seg, split):
        assert not [r for r in module_.remarks if "not segmented" in r]
        assert "stablehlo.remainder" in str(module_)    # (the forward's every-k-th test)
    return seg


def whiles(module) -> int:
    return str(module).count("stablehlo.while")


@pytest.mark.parametrize("n,k", [(12, 4), (12, 5), (12, 1), (12, 11), (97, 10)])
@pytest.mark.parametrize("policy", [None, "nothing_saveable", "dots_saveable"])
def test_gradients_equal_jax(n, k, policy):
    seg = check_gradients(rnn, rnn_args(n), policy, k)
    assert whiles(seg) == 3          # forward, backward, and the segment loop inside it


@pytest.mark.parametrize("levels", [4, "5x2"])
def test_saved_carries_offloaded_to_host(levels):
    """scan_segments_offload: each saved carry goes to host memory as the forward loop
    writes it into its buffer and comes back as the backward reads it (JAX's offload inside
    a scan: annotate_device_placement on the written and the read slot); in split form the
    buffer crosses in host memory (the result of main_fwd and the argument of main_bwd say
    so). Gradients are jax.vjp's (XLA:CPU ignores the placements); a bad memory is an
    error that names the option."""
    args = rnn_args(12)
    seg = check_gradients(rnn, args, "nothing_saveable", levels,
                          scan_segments_offload="pinned_host")
    text = str(seg)
    assert text.count('_xla_buffer_placement = "pinned_host"') == 1     # the write
    assert text.count('_xla_buffer_placement = "device"') == 1          # the outer read
    module = rp.export_vjp(rnn, *args)
    split = rp.remat(module, "nothing_saveable", mode="split", scan_segments=levels,
                     scan_segments_offload="pinned_host")
    from remat_passes.jax.run import memory_kinds
    carries = [i for i, r in enumerate(split.residuals) if "every segment" in r.description]
    assert len(carries) == 1
    n_out = len(memory_kinds(split, "main_fwd", "res_attrs")) - len(split.residuals)
    assert memory_kinds(split, "main_fwd", "res_attrs")[n_out + carries[0]] == "pinned_host"
    assert memory_kinds(split, "main_bwd", "arg_attrs")[carries[0]] == "pinned_host"
    plain = str(rp.remat(module, "nothing_saveable", scan_segments=levels))
    assert "_xla_buffer_placement" not in plain
    with pytest.raises(rp.RematError, match="scan_segments_offload: expected pinned_host"):
        rp.remat(module, scan_segments=4, scan_segments_offload="disk")


def test_segment_loop_is_inside_the_backward_and_stacks_are_gone():
    args = rnn_args(12)
    module = rp.export_vjp(rnn, *args)
    plain = str(rp.remat(module, "nothing_saveable"))
    seg = str(rp.remat(module, "nothing_saveable", scan_segments=4))
    # unsegmented: a [12, 4, 16] stack of carries crosses; segmented: 3 (+1 scratch)
    # saved carries and a 4-slot segment buffer
    assert "tensor<12x4x16xf32>" in plain and "tensor<12x4x16xf32>" not in seg
    assert "tensor<4x4x16xf32>" in seg
    assert seg.count("stablehlo.remainder") == 1


@pytest.mark.parametrize("n,levels", [(97, "10x3"), (64, [16, 4, 2]), (12, "5x2"), (50, "cbrt")])
def test_segments_within_segments(n, levels):
    """More levels: segments rerun in sub-segments (n^(1/3) memory for three levels, one
    more forward per level); trip counts no level divides."""
    seg = check_gradients(rnn, rnn_args(n), None, levels)
    assert len(seg.segmented[0].levels) == (len(levels) if isinstance(levels, list) else
                                            2 if levels == "cbrt" else levels.count("x") + 1)
    assert str(seg).count("stablehlo.while") == 2 + len(seg.segmented[0].levels)


def test_pytree_carries_xs_and_ys():
    check_gradients(lstm_like, lstm_args(10), "nothing_saveable", 3)
    check_gradients(lstm_like, lstm_args(10), None, 4)


def test_reverse_scan():
    def f(params, xs):
        W = params

        def step(h, x):
            return jnp.tanh(h @ W + x), h.sum()
        h, ys = jax.lax.scan(step, jnp.ones((2, 8)), xs, reverse=True)
        return h.sum() + ys.sum()
    check_gradients(f, lstm_args(9), "nothing_saveable", 2)


def test_nested_and_consecutive_scans():
    def f(params, xs):
        W = params

        def inner(h, x):
            return jnp.sin(h @ W + x), None

        def outer(h, xblock):
            h, _ = jax.lax.scan(inner, h, xblock)
            return jnp.tanh(h), h.sum()
        h, ys = jax.lax.scan(outer, jnp.ones((2, 8)), xs.reshape(4, 3, 2, 8))
        g, _ = jax.lax.scan(inner, h, xs)          # a second top-level scan
        return g.sum() + ys.sum()
    check_gradients(f, lstm_args(12), "nothing_saveable", 2)
    check_gradients(f, lstm_args(12), None, 3)


def test_checkpoint_names_inside_the_body():
    from jax.ad_checkpoint import checkpoint_name

    def f(params, xs):
        W = params

        def step(h, x):
            a = checkpoint_name(jnp.sin(h @ W), "a")
            return jnp.tanh(a + x), None
        h, _ = jax.lax.scan(step, jnp.ones((2, 8)), xs)
        return (h ** 2).sum()
    check_gradients(f, lstm_args(20), "save_only_these_names(a)", 6)


def test_xla_memory_of_a_long_scan():
    """256 steps of an 8x64 carry (the issue's example): XLA's scratch bytes of the segmented
    program against the unsegmented one, same policy, CPU (loops keep their structure)."""
    W = jax.random.normal(KEY, (64, 64)) * 0.1

    def f(W, xs):
        def step(h, x):
            return jnp.tanh(h @ W + x), None
        h, _ = jax.lax.scan(step, jnp.zeros((8, 64)), xs)
        return (h ** 2).sum()
    xs = jax.random.normal(KEY, (256, 8, 64))
    module = rp.export_vjp(f, W, xs)
    ct = jnp.float32(1.0)

    def temp(m):
        return rp.compile(m, "main").lower(W, xs, ct).compile().memory_analysis().temp_size_in_bytes
    plain = temp(rp.remat(module, "nothing_saveable"))
    seg = temp(rp.remat(module, "nothing_saveable", scan_segments=16))
    carries = 256 * 8 * 64 * 4                     # the 256 stacked carries: 524,288 B
    assert plain >= carries
    assert seg < 0.25 * plain, (seg, plain)       # 17 + 16 carries' worth, and scratch


def test_refusals_say_why():
    args = rnn_args(12)
    module = rp.export_vjp(rnn, *args)
    out = rp.remat(module, "nothing_saveable", scan_segments=12)
    assert any("not segmented: segments=12 is not less than the trip count 12" in r
               for r in out.remarks)
    assert str(out) == str(rp.remat(module, "nothing_saveable"))


def test_cli_option(tmp_path):
    from remat_passes import cli
    args = rnn_args(8)
    src = tmp_path / "rnn.mlir"
    src.write_text(str(rp.export_vjp(rnn, *args)))
    out = tmp_path / "out.mlir"
    assert cli.main([str(src), "--remat=policy=nothing_saveable scan-segments=3",
                     "-o", str(out)]) == 0
    assert out.read_text().count("stablehlo.while") == 3
    bad = tmp_path / "bad.mlir"
    assert cli.main([str(src), "--segment-scans=segments=-1", "-o", str(bad)]) == 1
    assert not bad.exists()
    with pytest.raises(RematError, match="expected a count of iterations .* or cbrt"):
        rp.remat(rp.export_vjp(rnn, *args), scan_segments="some")


def test_sqrt_picks_the_length_that_keeps_the_fewest_bytes():
    from remat_passes.regions.scan_segments import least_bytes_k, least_bytes_levels
    assert least_bytes_k(256, 100, 100) == 16 and least_bytes_k(4096, 100, 100) == 64
    # the O(sqrt n) search finds what trying every length finds
    import random
    rng = random.Random(0)

    def kept(n, c, s, k):
        return (-(-n // k) + 1) * c + k * s
    for _ in range(200):
        n, c, s = rng.randint(2, 300), rng.randint(1, 40), rng.randint(1, 40)
        every = min(range(1, n), key=lambda k: (kept(n, c, s, k), k))
        assert least_bytes_k(n, c, s) == every, (n, c, s)
        if n >= 3:
            k1, k2 = least_bytes_levels(n, c, s)
            best = min(kept(n, c, 0, a) + kept(a, c, s, least_bytes_k(a, c, s))
                       for a in range(2, n))
            assert kept(n, c, 0, k1) + kept(k1, c, s, k2) == best, (n, c, s)
    assert least_bytes_k(100, 400, 100) == 20          # a carry 4x a slot: longer segments
    # under nothing_saveable a slot is the carry: of 97 steps, segments of 9, 10 and 11 keep
    # 20 carries' worth; the shortest wins the tie: 11 saved carries (+ scratch) and 9 slots
    seg = check_gradients(rnn, rnn_args(97), "nothing_saveable", "sqrt")
    assert "tensor<12x4x16xf32>" in str(seg) and "tensor<9x4x16xf32>" in str(seg)


def test_rp_jit_training_step_with_segments():
    """A training step through rp.jit with scan_segments: jax.jit's results, less memory."""
    W = jax.random.normal(KEY, (64, 64)) * 0.1
    xs = jax.random.normal(KEY, (256, 8, 64))

    def loss(W, xs):
        def step(h, x):
            return jnp.tanh(h @ W + x), None
        h, _ = jax.lax.scan(step, jnp.zeros((8, 64)), xs)
        return (h ** 2).sum()

    def train_step(W, xs):
        value, g = jax.value_and_grad(loss)(W, xs)
        return W - 0.1 * g, value
    plain = jax.jit(train_step)
    ours = rp.jit(train_step, scan_segments="sqrt")
    for got, want in zip(ours(W, xs), plain(W, xs)):
        assert jnp.allclose(got, want, rtol=1e-6, atol=1e-6)
    temp = ours.lower(W, xs).executables[0].memory_analysis().temp_size_in_bytes
    theirs = plain.lower(W, xs).compile().memory_analysis().temp_size_in_bytes
    assert temp < 0.3 * theirs, (temp, theirs)


def test_the_scans_benchmark_runs_and_its_checks_hold():
    """`python -m tools.benchmarks scans` on a short scan: ours beside the hand-written
    two-level scheme, every check (gradients, FLOPs, XLA scratch) passing."""
    from tools.benchmarks import scans
    data = scans.measure({32: (4, 8)}, log=lambda s: None, sweeps=False)
    assert [r["k"] for r in data["rows"]] == ["0", "4", "8"]
    failed = [text for text, ok in scans.checks(data) if not ok]
    assert not failed, failed
    assert "| 32 | 8 |" in scans.render(data)


# ------------------------------------------------------------- the planner --
def _kept(module) -> int:
    """Activation bytes after segmentation: what partial-eval keeps, less the stacks that
    segment-scans removed, plus the saved carries and segment buffers it added."""
    from remat_passes.core.residuals import activation_bytes
    return activation_bytes(module.residuals, module.segmented)


def _long_rnn(n):
    from tools.benchmarks import scans
    k1, k2, k3 = jax.random.split(KEY, 3)
    params = (jax.random.normal(k1, (64, 64)) * 0.1, jax.random.normal(k2, (32, 64)) * 0.1)
    xs = jax.random.normal(k3, (n, 8, 32))
    return scans, params, xs


def test_auto_segments_a_scan_whose_budget_a_per_iteration_plan_cannot_meet():
    """The issue's case: 256 steps of an 8x64 carry, a budget of 48 carries."""
    from remat_passes.cost.flops import function_flops
    scans, params, xs = _long_rnn(256)
    module = rp.export_vjp(scans.rnn, params, xs)
    carry = 8 * 64 * 4
    out = rp.remat(module, f"auto(budget={48 * carry})")
    assert out.segmented and _kept(out) <= 48 * carry
    assert any("scans run in segments" in r for r in out.remarks)
    _, ct, grads = reference_vjp(scans.rnn, (params, xs))
    assert_trees_close(run_joint(out, (params, xs), ct)[1:], leaves(grads), what="auto 48")
    hand = function_flops(rp.export_vjp(scans.two_level(16), params, xs))
    assert function_flops(out) <= 1.01 * hand, (function_flops(out), hand)
    three = rp.remat(module, f"auto(budget={30 * carry})")     # two levels reach 34 carries
    assert three.segmented[0].levels[1:] and _kept(three) <= 30 * carry
    assert_trees_close(run_joint(three, (params, xs), ct)[1:], leaves(grads), what="auto 30")
    with pytest.raises(RematError, match=r"in segments \(three levels\), 47104 B"):
        rp.remat(module, f"auto(budget={20 * carry})")
    split = rp.remat(module, f"auto(budget={48 * carry})", mode="split")
    got, residuals = run_split(split, (params, xs), ct, 1)
    assert_trees_close(got[1:], leaves(grads), what="auto 48 split")
    assert sum(r.size * r.dtype.itemsize for r in residuals) - sum(
        r.bytes for r in split.residuals if r.argument) <= 48 * carry


def _short_loop(w, x, xs):
    """A tanh RNN over the steps of xs (the short-loop tests' function)."""
    h, _ = jax.lax.scan(lambda h, xt: (jnp.tanh(h @ w + xt), None), x, xs)
    return jnp.sum(h ** 2)


def test_a_budget_below_what_segments_reach_names_that_least():
    """A short loop (9 steps): two levels reach less than a per-iteration plan, three levels
    no less. A budget below both is an error that names what the segments reach (it named
    the per-iteration least, as if segments could not help), and that least is met."""
    args = (jnp.ones((64, 64)) * 0.01, jnp.ones((8, 64)), jnp.ones((9, 8, 64)) * 0.1)
    module = rp.export_vjp(_short_loop, *args)
    lo, _ = rp.bounds(module)
    with pytest.raises(RematError) as e:
        rp.remat(module, "auto(budget=8000)")
    m = re.search(r"in segments \(two levels\), (\d+) B \(per iteration: (\d+) B", str(e.value))
    assert m and int(m.group(1)) < int(m.group(2)) == lo, str(e.value)
    least = rp.remat(module, f"auto(budget={m.group(1)})")
    assert least.segmented and _kept(least) <= int(m.group(1))
    _, ct, grads = reference_vjp(_short_loop, args)
    assert_trees_close(run_joint(least, args, ct)[1:], leaves(grads), what="auto at the least")


def test_a_loop_too_short_for_segments_says_its_least_is_the_carries():
    """A 4-step loop: segments keep more than a per-iteration plan, so the least is that
    plan's, the loop's carry for every step and its output. The error said it was made of
    'outputs of side-effecting ops and values nothing may recompute', which this function
    has none of; it now names the scan's carries and what segments would keep, and the least
    it names is met."""
    args = (jnp.ones((16, 16)) * 0.1, jnp.ones((8, 16)), jnp.ones((4, 8, 16)) * 0.1)
    module = rp.export_vjp(_short_loop, *args)
    lo, _ = rp.bounds(module)
    carry = 8 * 16 * 4
    assert lo == 5 * carry      # (four carries stacked, and the last, the loop's output)
    with pytest.raises(RematError) as e:
        rp.remat(module, "auto(budget=0)")
    m = re.search(r"can keep, (\d+) B \(its scan loops keep their carry for every iteration"
                  r".*segments keep no less \((\d+) B with two levels\)", str(e.value))
    assert m and int(m.group(1)) == lo <= int(m.group(2)), str(e.value)
    # (one error, raised after the per-iteration plan's: not chained to it, whose traceback
    # printed "During handling of the above exception, another exception occurred")
    assert e.value.__context__ is None
    least = rp.remat(module, f"auto(budget={lo})")
    assert _kept(least) <= lo
    _, ct, grads = reference_vjp(_short_loop, args)
    assert_trees_close(run_joint(least, args, ct)[1:], leaves(grads), what="auto at the least")


def test_auto_sweep_over_a_scan_keeps_within_budget_and_cost_falls_as_budget_grows():
    from remat_passes.cost.flops import function_flops
    scans, params, xs = _long_rnn(64)
    module = rp.export_vjp(scans.rnn, params, xs)
    lo, hi = 24 * 2048, 70 * 2048       # below the per-iteration least (65 carries) to above
    points = []
    for b in range(lo, hi + 1, (hi - lo) // 8):
        out = rp.remat(module, f"auto(budget={b})")
        assert _kept(out) <= b, (b, _kept(out))
        points.append(function_flops(out))
    assert all(a >= b for a, b in zip(points, points[1:])), points


def test_rp_scan_marks_one_loop():
    """`rp.scan(..., segments=k)`: that loop is cut into segments whatever the pipeline's
    own option; the other scan of the function is not; under jax.jit it is lax.scan."""
    def f(params, xs):
        W = params

        def step(h, x):
            return jnp.tanh(h @ W + x), h.sum()
        h, ys = rp.scan(step, jnp.ones((2, 8)), xs, segments=3)
        g, _ = jax.lax.scan(step, h, xs)
        return g.sum() + ys.sum()
    args = lstm_args(10)
    assert jnp.allclose(jax.jit(f)(*args), f(*args))
    module = rp.export_vjp(f, *args)
    out, ct, grads = reference_vjp(f, args)
    for mode in ("joint", "split"):
        seg = rp.remat(module, "nothing_saveable", mode=mode)
        assert [d.levels for d in seg.segmented] == [[3]], mode
        got = run_joint(seg, args, ct) if mode == "joint" else \
            run_split(seg, args, ct, len(leaves(out)))[0]
        assert_trees_close(got, leaves(out) + leaves(grads), what=mode)
        assert "remat.segments" not in str(seg)           # the marker is stripped
    both = rp.remat(module, "nothing_saveable", scan_segments=2)
    assert sorted(d.levels for d in both.segmented) == [[2], [3]]   # the mark wins for its loop
    with pytest.raises(RematError, match="rp.scan: segments"):
        rp.scan(lambda c, x: (c, None), 0.0, jnp.ones(3), segments="many")
