"""Unrolled scans differentiated step by step, so that each step's checkpoints are its own.

JAX traces a scan's body once. With `unroll` above 1 its lowering repeats the body's ops
for each step under the same name stack, so a checkpoint region in the body (an
`rp.checkpoint` call's `remat[N]` frame, or a `jax.checkpoint` exported as a region) is
one scope over every step it is repeated in: remat-partial-eval cannot tell where one
step's region ends and the next begins. A scan unrolled whole then keeps every step's
values (no loop pairs to rewrite), and the steps of one unrolled iteration are recomputed
from the first step's input, where `jax.checkpoint` saves each step's input.

Within `steps_apart(regions=...)`, differentiating such a scan differentiates what its
lowering runs instead, written out as JAX's `_scan_impl` lays it out: a loop of
`length // unroll` iterations of `unroll` steps (none when the scan is unrolled whole)
and the remaining steps after it (before it, reversed), each step's body evaluated in a
name-stack frame of its own, `step[i]`. Each call of a region in the body is then a scope
of its own, as each `jax.checkpoint` call is in JAX; the math is the same. A scan that
is not unrolled keeps JAX's rule.

An unrolled scan whose body has no region (a `remat[N]` frame, or a `jax.checkpoint` call
where `regions` is true) keeps it too, unless `unroll` does not divide its length: JAX's
lowering then peels the remaining steps out of the loop and writes their stacks beside the
loop's with `concatenate`s and `slice`s, which remat-partial-eval cannot pair, so the loop
stayed atomic (a module policy recomputed it whole). Such a scan is differentiated as the
two scans it runs: the loop's `length // unroll * unroll` steps with the same `unroll`,
then the remaining steps one to an iteration (reversed: the loop over the last steps
first; where the loop would run once, one scan of one step to an iteration). The loops pair
and a policy decides per iteration, as in JAX; the remaining steps run as a short loop where
JAX's lowering writes them out.
"""
from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp

from remat_passes import jax_compat
from remat_passes.ir import graph


def _has_regions(jaxpr, checkpoints: bool) -> bool:
    """Does `jaxpr` (a Jaxpr, its sub-jaxprs included) make a checkpoint region: an op in
    a `remat[N]` frame, or (`checkpoints`) a `jax.checkpoint` call?"""
    todo = [jaxpr]
    while todo:
        for eqn in todo.pop().eqns:
            if checkpoints and jax_compat.is_checkpoint(eqn):
                return True
            if graph.SCOPE_FRAME_RE.search(str(eqn.source_info.name_stack)):
                return True
            todo.extend(jax_compat.sub_jaxprs(eqn))
    return False


def _steps(body, n_carry: int, length: int, reverse: bool, unroll: int):
    """`run(consts, carry, xs) -> (carry, ys)`: the scan of `body` (consts, carry, x ->
    carry, y, flat lists) with its `unroll` steps written out, each in its own frame."""
    def run_steps(first, count, consts, carry, xs):
        """Steps first .. first+count-1 of `xs` (leading axis `count`), in scan order."""
        ys = [None] * count
        # each step's x (lax.split: its transpose is a concatenate, index_in_dim's a pad
        # and an add of the whole block per step)
        steps_xs = list(zip(*(jax.lax.split(x, [1] * count) for x in xs))) or [()] * count
        for j in (reversed(range(count)) if reverse else range(count)):
            with jax.named_scope(f"step[{first + j}]"):
                out = body(*consts, *carry, *(x.reshape(x.shape[1:]) for x in steps_xs[j]))
            carry, ys[j] = out[:n_carry], out[n_carry:]
        return carry, [jnp.stack(y) for y in zip(*ys)]

    def run(consts, carry, xs):
        trips, rest = divmod(length, unroll) if 0 < unroll < length else (0, length)
        if trips == 0:
            return run_steps(0, length, consts, carry, xs)
        # the loop runs xs[:trips * unroll] (reversed: xs[rest:], first), then the rest
        loop_xs, rest_xs = _cut(xs, trips * unroll, rest, reverse)
        blocks = [x.reshape(trips, unroll, *x.shape[1:]) for x in loop_xs]
        carry, loop_ys = jax.lax.scan(
            lambda c, block: run_steps(0, unroll, consts, c, block), carry, blocks,
            length=trips, reverse=reverse)
        loop_ys = [y.reshape(trips * unroll, *y.shape[2:]) for y in loop_ys]
        if not rest:
            return carry, loop_ys
        carry, rest_ys = run_steps(unroll, rest, consts, carry, rest_xs)
        return carry, [jnp.concatenate([a, b] if not reverse else [b, a])
                       for a, b in zip(loop_ys, rest_ys)]
    return run


def _two_scans(body, n_carry: int, length: int, reverse: bool, unroll: int):
    """`run(consts, carry, xs) -> (carry, ys)`: the scan of `body` as two scans, the loop's
    `length // unroll * unroll` steps with `unroll` to an iteration, then the rest, one;
    where the loop would run once (JAX's lowering keeps a one-trip loop, which a scan of
    `unroll` steps would lower unrolled whole), one scan of one step to an iteration."""
    def step(consts):
        def f(carry, x):
            out = body(*consts, *carry, *x)
            return out[:n_carry], out[n_carry:]
        return f

    def run(consts, carry, xs):
        rest = length % unroll
        if length - rest == unroll:   # a loop that runs once: one scan, a step an iteration
            return jax.lax.scan(step(consts), carry, xs, length=length, reverse=reverse)
        parts = zip(_cut(xs, length - rest, rest, reverse), (length - rest, rest), (unroll, 1))
        ys = []
        for part_xs, steps, k in parts:      # the loop's steps, then the rest
            carry, part_ys = jax.lax.scan(step(consts), carry, part_xs, length=steps,
                                          reverse=reverse, unroll=k)
            ys.append(part_ys)
        return carry, [jnp.concatenate(y if not reverse else y[::-1]) for y in zip(*ys)]
    return run


def _cut(xs: list, loop: int, rest: int, reverse: bool) -> tuple[list, list]:
    """The scanned-over arrays `xs` cut along their leading axis into the loop's `loop` steps
    and the `rest` after them (reversed: the loop's are the last), with `lax.split`, whose
    transpose is a concatenate (slices' is pads and adds)."""
    sizes = (loop, rest) if not reverse else (rest, loop)
    first, second = (list(p) for p in zip(*(jax.lax.split(x, sizes) for x in xs))) \
        if xs else ([], [])
    return (first, second) if not reverse else (second, first)


def _unrolled(params: dict) -> bool:
    """Has the scan more than one step to an iteration?"""
    return params["unroll"] != 1 and params["length"] > 1


def _remainder(params: dict) -> bool:
    """Does `unroll` leave steps out of the loop (neither 1, nor the length or above, nor a
    divisor of it)?"""
    return 1 < params["unroll"] < params["length"] and params["length"] % params["unroll"] != 0


def _with_regions(params: dict, checkpoints: bool) -> bool:
    """Has the scan's body a region?"""
    jaxpr = params["jaxpr"]
    return _has_regions(getattr(jaxpr, "jaxpr", jaxpr), checkpoints)


def _jvp(checkpoints: bool):
    """The JVP rule of the scans `steps_apart` takes: of the steps written out (`_steps`)
    where the body has a region, else of the two scans (`_two_scans`)."""
    def rule(primals, tangents, **params):
        written_out = _with_regions(params, checkpoints)
        return _scan_jvp(_steps if written_out else _two_scans, primals, tangents, params)
    return rule


def _scan_jvp(rewrite, primals, tangents, params):
    """The JVP of the scan run as `rewrite` lays it out."""
    n_consts, n_carry = jax_compat.scan_layout(params)
    run = rewrite(jax_compat.jaxpr_function(params["jaxpr"]), n_carry, params["length"],
                  params["reverse"], params["unroll"])

    def scan(*args):
        consts, carry = list(args[:n_consts]), list(args[n_consts:n_consts + n_carry])
        carry, ys = run(consts, carry, list(args[n_consts + n_carry:]))
        return [*carry, *ys]
    out, out_dot = jax.jvp(scan, tuple(primals),
                           tuple(jax_compat.instantiate_zeros(t) for t in tangents))
    return list(out), list(out_dot)


@contextlib.contextmanager
def steps_apart(regions: bool):
    """Within it, an unrolled scan whose body has checkpoint regions is differentiated step
    by step, and one that leaves steps out of its loop as two scans (see the module
    docstring); `regions`: `jax.checkpoint` calls are made regions
    (`jax_checkpoint="regions"`), so they count as regions too."""
    def wants(params):
        return _unrolled(params) and (_remainder(params) or _with_regions(params, regions))
    with jax_compat.scans_differentiated_by(wants, _jvp(regions)):
        yield
