"""`rp.jit`: `jax.jit` for functions that differentiate themselves, with our remat applied.

On the first call for an input signature (the pytree structure, each leaf's shape, dtype,
weak type and sharding, and the values of the static arguments) the function is exported
with its checkpoint names kept (`rp.export`), the default pipeline runs on it (`rp.remat`)
and the result is compiled once; later calls with that signature run the compiled program.
Arguments and results are the function's own pytrees in both forms:

* `mode="joint"`: one executable, the rewritten program;
* `mode="split"`: two executables, `<f>_fwd` then `<f>_bwd` (`api/split_run.py`); the
  residuals pass from one to the other (donated to the second), and the function's outputs,
  computed by either half, are put back in their places. On a GPU the f32 residuals the
  backward only reads back are rounded to their own type, as jax.checkpoint rounds them
  (rp.remat's `round_read_back`: exact, the values do not change; XLA:GPU needs less
  scratch for the forward then). A kept product both halves read through the same
  transpose (a vmapped `W @ x`) crosses in that order (fold-dot-transposes across-halves:
  the residuals are rp.jit's own; `.residuals` says "transpose of");
* `mode="auto"` (the default): joint, on every backend. On CPU the recomputation is tied
  to the cotangent by data (`tie_to_cotangent`, on by default there): XLA:CPU deletes
  optimization barriers before it schedules, and without the tie it would merge the clones
  with the forward and keep nothing of the saving (see place-optimization-barriers). In
  split form the backward is a program of its own, where the tie only orders it and can
  cost scratch as well as save it, so there rp.jit builds it tied and untied and runs the
  smaller (unless `tie_to_cotangent` is given). `jitted.lower(*args).mode` says which form
  it took, `.tied` whether the tie runs.
  On XLA:CPU of jaxlib >= 0.11 a cheap backward chain that a dot stores and other readers
  would compute again also gets a barrier of its own, so XLA computes it once
  (`fence_chains`, place-optimization-barriers' fence-chains; the Equinox benchmark model
  under `nothing_saveable`: 4.76 MB -> 4.23 MB, joint). In split form it does not lower
  every program (RecurrentGemma under `nothing_saveable`: 6% more backward temp), so there
  by default the smallest variant is also built without it where it placed a fence, and
  the smaller runs (`.unfenced` says whether that one did). `fence_chains=True` (or False)
  turns it on (off) on any backend, one way only; by default (None) it is on only where it
  was measured.

On XLA:CPU no f32/f64 residual is rounded to its own type (rp.remat's `round_exact=False`,
`variants.rounds_exact`): the rounding is the identity there and makes XLA compute a kept
elementwise value twice, for the rounding and again inside each fusion that reads it; `auto`
then prices none. (Measured, jaxlib 0.12, the smaller barrier variant: the GPT under
`dots_saveable` compiles to 1,411,436,215 FLOPs instead of 1,414,221,495, same footprint; the
split forward's scratch is lower or equal for every benchmark model and policy.) bf16 and the
other narrow floats stay rounded on every backend. Other backends round f32 as
jax.checkpoint does until one has measured it.

`barrier_groups` chooses where the optimization barriers go (place-optimization-barriers):
"per-use" (one per recomputation, at its consumer), "per-region" (one per checkpoint region,
as `jax.checkpoint`) or "smaller": build both, compile both, run the one with the smaller XLA
footprint (temp + arguments + outputs; the larger half in split form). The default is
"smaller" on a backend that keeps barriers (GPU, TPU, and CPU from jaxlib 0.11: there
XLA:CPU's fusions stop at barriers too; measured, the benchmarks' GPT under `nothing_saveable`
20.6 MB per use, 18.5 MB per region) and "per-use" on CPU with jaxlib 0.10, where the tie
decides instead. Neither grouping is smaller everywhere (measured on an H200: Equinox under
`nothing_saveable` 5.51 MB per use, 3.86 MB per region; under `dots_saveable` 3.29 MB per use,
3.73 MB per region); per region matches `jax.checkpoint`'s footprint, so the smaller of the
two is never above it. `jitted.lower(*args).barrier_groups` says which ran, `.footprints` what
each measured.

Where nothing is recomputed (`everything_saveable`, no policy) the joint form of each grouping
is also built with its residuals rounded to their own type as jax.checkpoint rounds them
(`round_read_back`: exact), and the smallest runs (`.rounded`). On XLA:CPU (jaxlib 0.10) the
rounding makes XLA compute a saved value once instead of again in each backward fusion that
reads it (RecurrentGemma: 530,304 B of temp -> 472,960 B, JAX's 459,136 B) but costs the MLP
786 KB.

Called under a JAX transformation (`api/traced.py`): inside `jax.jit` the joint form's
rewritten program becomes part of the program being traced (`Exported.call`), and the split
form, two executables, says it cannot; under `jax.vmap` it is `rp.jit(jax.vmap(fun, ...))`
(also where the vmap is around a jax.jit that calls it);
inside `jax.shard_map` it refuses where an argument varies over the manual axes;
differentiated from outside (`jax.grad(rp.jit(loss))`), a function with no backward of its
own runs its rewritten split halves as a `jax.custom_vjp`'s (`api/differentiated.py`). On several
devices (sharded arguments) the split form's backward takes the residuals sharded as the
forward's executable returns them.

A step that accumulates gradients over microbatches (`jax.grad` inside `lax.scan`) has its
backward inside the loop body: the policy applies to each iteration (`regions.loop_backward`),
in joint form only (the split form has no place for a backward inside a loop). So does a
step that runs `jax.grad` inside a branch of `lax.cond`, and a data-parallel step,
`jax.grad` inside `jax.shard_map`: the policy applies inside the branch, the body.

Flax NNX objects among the arguments (Module, Optimizer, Rngs) are taken as `nnx.jit` takes
them: what the step changes in them reaches the caller's objects (`api/graph_nodes.py`).
An Equinox Module's leaves that are not arrays are static, as `eqx.filter_jit` takes them,
and so is any leaf jax.jit cannot take, in the arguments and results (`api/static_leaves.py`).

`jax_checkpoint="regions"` makes the `jax.checkpoint` calls of the model code checkpoint
regions the passes apply (a layer JAX would rematerialize at export becomes one `policy`
or a budget can reach into; see `rp.export`).

Arguments are taken as `jax.jit` takes them: positional and keyword ones are dynamic (traced)
unless `static_argnums` / `static_argnames` make them static (hashable Python values, part of
the signature; a parameter static by position is static when passed by keyword, and the other
way round); `donate_argnums` / `donate_argnames` donate as `jax.jit` does (the donated inputs
are deleted after the call). A parameter left out takes its default as a Python value.
`in_shardings` / `out_shardings` are taken as `jax.jit` takes them (a Sharding, None, or a
pytree prefix of the dynamic positional arguments / of the results): an argument not yet
on a device is put there, one committed elsewhere is an error, and the exported program
carries them, so the results come out so sharded in both forms. Without them the program
follows the shardings of the arguments it is called with. `compiler_options` (XLA's options
by name, as `jax.jit` takes them) go to each program a build compiles to run, so the
variant kept is the smallest under them too (the trial plans of `score=xla` compile
without them); called inside another `jax.jit`, or differentiated from outside, the
program is the caller's, as for a `jax.jit` nested there.
`jitted.lower(*args)` gives what was built for those arguments (`api/lowered.py`): the
rewritten Module, the residuals, the remarks, the executables (for XLA's `memory_analysis()`);
the arguments may be `jax.ShapeDtypeStruct`s.

`cache_dir` (default: `$REMAT_PASSES_CACHE_DIR`; False: none) keeps the rewritten modules
on disk, so that another process with the same program skips the pipeline, and which of the
programs a build weighed ran, so that it compiles only that one (see `api/cache.py`; XLA's
compilation has JAX's own cache).

The programs of one build (each variant above; two per variant in split form) are lowered
one after another and, on the CPU backend, compiled side by side, up to one XLA compile per
CPU (`$REMAT_PASSES_COMPILE_THREADS` sets the number on any backend, 1: one after another;
`jax_run.compiling`; on a GPU, where XLA autotunes on the device as it compiles, one after
another unless asked, until it is measured there: `python -m tools.benchmarks.compile_threads`,
device_round.sh's compile-threads step). Measured on
2 CPUs, test_jit's training step, medians of 5 interleaved: split `dots_saveable` (ten
compiles on jax 0.12) 7.28 s -> 6.74 s on jax 0.12, 3.55 s -> 3.12 s on 0.10.2; joint
2.90 s -> 2.65 s on 0.12 (`jax.jit`: 1.1 s). Two CPUs leave little room: XLA:CPU's own
compile already keeps about 1.5 of them busy. More CPUs were not measured.
"""
from __future__ import annotations

import functools
import inspect
import threading
from typing import Any, Callable, Sequence

import jax

from remat_passes import jax_compat
from remat_passes.api import (arguments, cache, call_cache, graph_nodes, split_run,
                              static_leaves, traced)
from remat_passes.api.differentiated import NoBackward
from remat_passes.api.lowered import Lowered, shape_key
from remat_passes.api.remat import remat_variants
from remat_passes.api.variants import (BARRIER_GROUPS, barrier_variants, fences_chains,
                                       needs_tie, recomputes_nothing, report,
                                       rounding, smaller, ties)
from remat_passes.ir.mlir import RematError
from remat_passes.jax.bridge import JAX_CHECKPOINT, export
from remat_passes.jax import run as jax_run
from remat_passes.passes.fences import CHAINS_FENCED
from remat_passes.passes.fold_dot_transposes import FoldDotTransposes, residuals_as_folded
from remat_passes.passes.manager import run_pipeline
from remat_passes.passes.remat_partial_eval import LEVELS
from remat_passes.policy.policies import as_policy

MODES = ("auto", "joint", "split")


def default_mode() -> str:
    """The form `mode="auto"` takes: joint on every backend (on CPU with the tie,
    `needs_tie`, which keeps its recomputation where XLA:CPU would undo it; measured
    against the split form in docs/benchmarks.md)."""
    return "joint"


class Jitted:
    """`rp.jit(fun, ...)`: call it like `fun`."""

    def __init__(self, fun: Callable, *, policy=None, mode: str = "auto",
                 donate_argnums: int | Sequence[int] = (),
                 static_argnums: int | Sequence[int] = (), prevent_cse: bool = True,
                 tie_to_cotangent: bool | None = None, jax_checkpoint: str = "jax",
                 scan_segments: int | str = 0, scan_segments_offload: str | None = None,
                 barrier_groups: str | None = None, levels: str = "auto", cache_dir=None,
                 static_argnames: str | Sequence[str] = (),
                 donate_argnames: str | Sequence[str] = (), in_shardings=None,
                 out_shardings=None, fence_chains: bool | None = None,
                 compiler_options: dict | None = None):
        if not callable(fun):
            raise TypeError(f"rp.jit: expected a function to compile, got "
                            f"{type(fun).__name__} {fun!r}")
        if policy is not None:
            as_policy(policy)    # a bad spec is an error here, not at the first call
        self.in_shardings, self.out_shardings = in_shardings, out_shardings
        # (what a Jitted of the same function under jax.vmap is built with: `like`)
        self._options = dict(policy=policy, mode=mode, prevent_cse=prevent_cse,
                             tie_to_cotangent=tie_to_cotangent, jax_checkpoint=jax_checkpoint,
                             scan_segments=scan_segments,
                             scan_segments_offload=scan_segments_offload,
                             barrier_groups=barrier_groups, levels=levels,
                             cache_dir=cache_dir, fence_chains=fence_chains,
                             compiler_options=compiler_options)
        if compiler_options is not None and (not isinstance(compiler_options, dict) or not all(
                isinstance(k, str) for k in compiler_options)):
            raise TypeError("rp.jit: compiler_options must be a dict of XLA option names to "
                            f"values, as jax.jit takes, got {compiler_options!r}")
        # (jax.jit's keyword for each program rp.jit compiles itself)
        self._jit_kw = dict(compiler_options=compiler_options) if compiler_options else {}
        if mode not in MODES:
            raise ValueError(f"rp.jit: mode must be one of {', '.join(MODES)}, got {mode!r}")
        if barrier_groups is not None and barrier_groups not in BARRIER_GROUPS:
            raise ValueError(f"rp.jit: barrier_groups must be one of "
                             f"{', '.join(BARRIER_GROUPS)}, got {barrier_groups!r}")
        self.barrier_groups = barrier_groups
        if str(levels) not in LEVELS:    # (remat-partial-eval's)
            raise ValueError(f"rp.jit: levels must be one of {', '.join(LEVELS)}, "
                             f"got {levels!r}")
        self.levels = str(levels)
        self.fun = fun
        self.policy = policy
        self.mode = mode
        self.prevent_cse = prevent_cse
        self.tie_to_cotangent = tie_to_cotangent
        self.fence_chains = fence_chains
        self.scan_segments = scan_segments
        self.scan_segments_offload = scan_segments_offload
        if jax_checkpoint not in JAX_CHECKPOINT:
            raise ValueError(f"rp.jit: jax_checkpoint must be one of "
                             f"{', '.join(JAX_CHECKPOINT)}, got {jax_checkpoint!r}")
        self.jax_checkpoint = jax_checkpoint
        self.cache_dir = cache.cache_dir(cache_dir)
        static_nums = {static_argnums} if isinstance(static_argnums, int) else set(static_argnums)
        donate_nums = {donate_argnums} if isinstance(donate_argnums, int) else set(donate_argnums)
        static_names = set(arguments.as_names(static_argnames, "static_argnames"))
        donate_names = set(arguments.as_names(donate_argnames, "donate_argnames"))
        # as jax.jit: a parameter named static (donated) is so by position too, and one
        # static (donated) by position is so when passed by keyword
        sig = arguments.signature(fun)
        self._params = list(sig.parameters.values()) if sig is not None else []
        index = {p.name: i for i, p in enumerate(self._params)
                 if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD}
        takes_any = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in self._params)
        for names, what in ((static_names, "static_argnames"), (donate_names, "donate_argnames")):
            unknown = sorted(n for n in names if n not in {p.name for p in self._params}
                             and not takes_any)
            if unknown and self._params:
                raise ValueError(f"rp.jit: {what} names {unknown[0]!r}, which is not a "
                                 f"parameter of {getattr(fun, '__name__', 'the function')}")
        for nums, names in ((static_nums, static_names), (donate_nums, donate_names)):
            nums.update(index[n] for n in names if n in index)
            names.update(p.name for i, p in enumerate(self._params)
                         if i in nums and p.name in index)
        self.static_argnums = tuple(sorted(static_nums))
        self.donate_argnums = tuple(sorted(donate_nums))
        self.static_argnames = tuple(sorted(static_names))
        self.donate_argnames = tuple(sorted(donate_names))
        both = (set(self.static_argnums) & set(self.donate_argnums)) or (
            static_names & donate_names)
        if both:
            raise ValueError(f"rp.jit: arguments {sorted(both, key=str)} are both static "
                             "and donated")
        self._cache: dict = {}
        self._calls = call_cache.CallCache(self)   # (the short way for a call like an earlier)
        # (held while a signature is built: threads calling with a new one build it once)
        self._building = threading.RLock()
        self._batched: dict = {}  # (call, in_axes) -> the Jitted of jax.vmap of the function
        # signature -> the function differentiated from outside (api/differentiated)
        self._differentiated: dict = {}
        self.builds = 0          # how many signatures were exported, rewritten, compiled
        functools.update_wrapper(self, fun)

    # ------------------------------------------------------------------ calling --
    def _key(self, call, dynamic) -> tuple:
        leaves, tree = jax.tree_util.tree_flatten(dynamic)
        return call, tree, tuple(arguments.leaf_key(x) for x in leaves)

    # (False for `like`'s: its function is another's, which takes NNX objects and non-array
    # leaves as this one gives them)
    takes_objects = True

    def _taken(self, args, kwargs) -> tuple:
        """(Flax NNX objects split, or None; args; kwargs with those split and the leaves
        that are not arrays static), as `_call` and `_bound`'s function take them."""
        if not self.takes_objects:
            return None, args, kwargs
        nodes = graph_nodes.split(self, args, kwargs)
        if nodes is not None:
            args, kwargs = nodes.args, nodes.kwargs
        return (nodes, *static_leaves.wrap(self, args, kwargs))

    def __call__(self, *args, **kwargs):
        out = self._calls.run(args, kwargs)      # (a call like one run before)
        if out is not call_cache.MISS:
            return out
        if not self.takes_objects:      # (its results go back to the other one as they are)
            return self._call(args, kwargs, (args, kwargs))
        nodes, taken_args, taken_kwargs = self._taken(args, kwargs)
        out = self._call(taken_args, taken_kwargs, (args, kwargs) if nodes is None else None)
        out = static_leaves.unwrap(out)
        return out if nodes is None else nodes.update(out)   # (NNX objects, in place)

    def _call(self, args, kwargs, given):
        """The results of a call (NNX objects split, non-array leaves static), recorded for
        later calls like it (`call_cache`) where it had no NNX object: `given`, the
        arguments as they came (else None)."""
        call, dynamic = arguments.split(self, args, kwargs)
        leaves = jax.tree_util.tree_leaves(dynamic)
        traced.check_manual(self, leaves)
        if jax_compat.vmap_batches(leaves):
            return traced.call_batched(self, call, dynamic)
        if any(isinstance(x, jax.core.Tracer) for x in leaves):
            mode = default_mode() if self.mode == "auto" else self.mode
            return traced.call_traced(self, call, dynamic, mode)
        for i, x in enumerate(leaves):
            if isinstance(x, jax.ShapeDtypeStruct):
                raise TypeError(f"rp.jit: argument leaf {i} is a jax.ShapeDtypeStruct, which "
                                "has no data to run on: give specs to .lower(...), arrays "
                                "to the call")
        lowered = self._lowered(call, dynamic)
        out = lowered.run(*dynamic)
        if given is not None:
            self._calls.add(given, (args, kwargs), lowered.run, call.kw_names,
                            out if self.takes_objects else None)
        return out

    def __get__(self, obj, objtype=None):
        """As a method: the instance is the first argument (its leaves static unless arrays;
        an NNX Module split), as `eqx.filter_jit` and `nnx.jit` take it."""
        return self if obj is None else arguments.Method(self, obj)

    def like(self, fun: Callable, donate_argnums: Sequence[int]) -> "Jitted":
        """An rp.jit of `fun` (the dynamic arguments alone) with this one's options."""
        jitted = Jitted(fun, donate_argnums=donate_argnums, **self._options)
        jitted.takes_objects = False
        return jitted

    def lower(self, *args, **kwargs) -> Lowered:
        """What is (or would be) built for `args`: the rewritten Module, its residuals, the
        executables. Builds it if this signature has not been called yet."""
        _, args, kwargs = self._taken(args, kwargs)
        return self._lowered(*arguments.split(self, args, kwargs))

    def eval_shape(self, *args, **kwargs):
        """As `jax.jit(fun).eval_shape`: the results' shapes and dtypes
        (`jax.ShapeDtypeStruct`s, the leaves that are not arrays as they are) for these
        arguments (arrays or `jax.ShapeDtypeStruct`s), from a trace of the function: nothing
        is built, and NNX objects are left as they are."""
        nodes, args, kwargs = self._taken(args, kwargs)
        call, dynamic = arguments.split(self, args, kwargs)
        out = static_leaves.unwrap(jax.eval_shape(self._bound(call, len(dynamic)), *dynamic))
        return out if nodes is None else out[0]     # (results, what it changed in them)

    def _lowered(self, call, dynamic) -> Lowered:
        key = self._key(call, dynamic)
        lowered = self._cache.get(key)
        if lowered is not None:
            return lowered
        with self._building:
            lowered = self._cache.get(key)     # (another thread may have built it)
            if lowered is None:
                lowered = self._build(call, dynamic)
                leaves, tree = jax.tree_util.tree_flatten(dynamic)
                lowered.signature = (call.kw_names, tree, tuple(shape_key(x) for x in leaves))
                self._cache[key] = lowered
        return lowered

    # ----------------------------------------------------------------- building --
    def _build(self, call, dynamic) -> Lowered:
        n_pos = len(dynamic) - len(call.kw_names)
        dynamic_fun = self._bound(call, len(dynamic))
        out_shardings = graph_nodes.out_shardings(self.out_shardings, dynamic)
        shardings = {k: v for k, v in (("in_shardings", self.in_shardings),
                                       ("out_shardings", out_shardings)) if v is not None}
        exported = export(dynamic_fun, *dynamic, jax_checkpoint=self.jax_checkpoint,
                          shardings=shardings)
        mode = default_mode() if self.mode == "auto" else self.mode
        donated = arguments.donated_positions(self, call, n_pos)
        variants = self._variants(mode)
        name = dynamic_fun.__name__
        own = ties(exported) if any(v.tie for v in variants) else 0
        jobs, used = [], []   # (a distinct program, its Lowered's fields); the variant of each
        for v, (module, hit) in zip(variants, self._remat(exported, mode, name, variants)):
            if any(module.bytecode() == m.bytecode() for m, _ in jobs):
                continue       # (one barrier per region either way, no tie placed, ...)
            jobs.append((module, dict(from_cache=hit, barrier_groups=v.groups,
                                      tied=v.tie and ties(module) > own)))  # (placed)
            used.append(v)
        if mode == "joint" and self.prevent_cse and \
                not rounding(mode).get("round_read_back") and \
                recomputes_nothing(exported, jobs[0][0]) and \
                not all(r.argument for r in jobs[0][0].residuals or ()):
            # nothing recomputed: each also with the residuals rounded (module docstring;
            # per region, a gradient step's barrier over what the backward reads). (Where
            # every residual is an argument there is nothing to round.)
            for (module, hit), (_, fields) in zip(
                    self._remat(exported, mode, name, used, round_read_back=True), list(jobs)):
                if not any(module.bytecode() == m.bytecode() for m, _ in jobs):
                    jobs.append((module, dict(fields, from_cache=hit, rounded=True)))
        # (a function on several devices, arguments on none: as jax.jit places them)
        placed = arguments.for_devices(dynamic, exported.exported.nr_devices, dynamic_fun)
        self.builds += 1
        return self._chosen(mode, exported, name, jobs, used, placed, donated)

    def _chosen(self, mode, exported, name, jobs, used, dynamic, donated) -> Lowered:
        """The Lowered that runs of the programs `jobs` ((module, fields); `used`: the
        barrier variant of each): each compiled, the smallest in split form also without
        fences (`_unfenced`), the smallest XLA footprint kept (`variants.smaller`). With a
        disk cache, the choice is stored, and where an earlier process made it among the
        same programs, that one alone is compiled."""
        choice = self._choice_key(mode, jobs, dynamic, donated)
        kept = cache.load_choice(self.cache_dir, choice) if choice else None
        if kept is not None:
            lowered = self._kept_choice(kept, exported, name, jobs, used, mode, dynamic,
                                        donated)
            if lowered is not None:
                return lowered
        built = self._compile_all(mode, exported, jobs, dynamic, donated)
        of = None        # (the program built again without fences, where one was)
        if self._may_unfence(mode):
            sizes = [b.footprint() for b in built]
            of = 0 if None in sizes else sizes.index(min(sizes))
            job = self._unfenced(exported, name, jobs[of], used[of])
            if job is None:
                of = None
            else:
                built += self._compile_all("split", exported, [job], dynamic, donated)
        best = smaller(built)
        if choice and len(built) > 1:
            cache.store_choice(self.cache_dir, choice, dict(
                index=of if best.unfenced else built.index(best),
                unfenced=best.unfenced, footprints=best.footprints or {}))
        return best

    def _compile_all(self, mode, exported, jobs, dynamic, donated) -> list:
        """The Lowered of each (module, fields) of `jobs`, in `mode`, with those fields
        set. Each program is lowered in turn and XLA compiles them side by side
        (`jax_run.compiling`: a split build of four variants is eight compiles)."""
        build = self._build_joint if mode == "joint" else functools.partial(split_run.build, self)
        with jax_run.compiling() as start:
            finishes = [build(exported, module, dynamic, donated, start) for module, _ in jobs]
            built = [finish() for finish in finishes]
        for lowered, (_, fields) in zip(built, jobs):
            for field, value in fields.items():
                setattr(lowered, field, value)
        return built

    def _may_unfence(self, mode: str) -> bool:
        """Is the smallest split program also built without fence-chains' fences, where it
        has some? (`_unfenced`)"""
        return mode == "split" and self.prevent_cse and self.fence_chains is None and \
            fences_chains()

    def _unfenced(self, exported, name, job, variant):
        """fence-chains, on by default where it was measured (module docstring), makes XLA
        compute a cheap backward chain once, which mostly lowers the footprint but not
        always in split form: RecurrentGemma under nothing_saveable, XLA:CPU of jaxlib
        0.12, 563,072 B of backward temp with its one fence, 530,304 B without (JAX's
        530,432 B), XLA scheduling the separate backward otherwise around it. So in split
        form the smallest variant (`job`, (module, fields), built with the barrier
        `variant`) is built again without it where it placed a fence: the (module, fields)
        of that, or None. (Not in joint form, where no program measured was larger with
        the fence, and one more compile would add two thirds to a build: docs/passes.md.)"""
        module, fields = job
        if not any(CHAINS_FENCED in r for r in module.remarks):
            return None          # (no fence placed)
        options = self.remat_options("split")
        del options["fence_chains"]
        (unfenced, hit), = self._remat(exported, "split", name, [variant], options=options)
        return unfenced, dict(from_cache=hit, unfenced=True,
                              barrier_groups=fields["barrier_groups"], tied=fields["tied"])

    def _choice_key(self, mode, jobs, dynamic, donated) -> str | None:
        """The disk cache's key of the choice among the programs `jobs` (None: no cache,
        or one program only)."""
        if not self.cache_dir or (len(jobs) == 1 and not self._may_unfence(mode)):
            return None
        return cache.choice_key([m.bytecode() for m, _ in jobs], dict(
            mode=mode, donated=donated, compiler_options=self._jit_kw,
            fields=[sorted((k, v) for k, v in f.items() if k != "from_cache") for _, f in jobs],
            arguments=cache.arguments_described(jax.tree_util.tree_leaves(dynamic))))

    def _kept_choice(self, kept, exported, name, jobs, used, mode, dynamic, donated):
        """The program an earlier process chose among `jobs` (`kept`, from the disk
        cache), compiled alone; None where the record does not fit them."""
        i = kept.get("index")
        if not isinstance(i, int) or not 0 <= i < len(jobs):
            return None
        job = self._unfenced(exported, name, jobs[i], used[i]) if kept.get("unfenced") \
            else jobs[i]
        if job is None:
            return None
        lowered, = self._compile_all(mode, exported, [job], dynamic, donated)
        if kept.get("footprints"):
            if lowered.barriers not in kept["footprints"]:
                return None
            report(lowered, kept["footprints"], kept=True)
        return lowered

    def _bound(self, call, n_dynamic: int) -> Callable:
        """The function of the `n_dynamic` dynamic arguments alone (the positional ones, then
        the keyword ones of `call`, by position), with the function's parameter names: the
        static ones bound as `call` gives them."""
        fun = static_leaves.functional(graph_nodes.functional(self.fun)) \
            if self.takes_objects else self.fun
        statics, static_kw, kw_names = dict(call.static), dict(call.static_kw), call.kw_names
        n_pos = n_dynamic - len(kw_names)

        def dynamic_fun(*args):       # (named as jax names the arguments of *args)
            it = iter(args[:n_pos])
            full = [statics[i] if i in statics else next(it)
                    for i in range(n_pos + len(statics))]
            return fun(*full, **dict(zip(kw_names, args[n_pos:])), **static_kw)
        dynamic_fun.__name__ = getattr(fun, "__name__", "fun")
        dynamic_fun.__qualname__ = getattr(fun, "__qualname__", dynamic_fun.__name__)
        arguments.keep_parameter_names(dynamic_fun, fun, call, n_dynamic)
        return dynamic_fun

    def _variants(self, mode: str) -> tuple:
        return barrier_variants(mode, self.tie_to_cotangent, self.barrier_groups,
                                self.prevent_cse)

    def remat_options(self, mode: str, round_read_back: bool = False) -> dict:
        """rp.remat's options for `mode` as this rp.jit asks for them (the barrier variant
        aside: `_variants`)."""
        tie = self.tie_to_cotangent
        options = dict(policy=self.policy, mode=mode, prevent_cse=self.prevent_cse,
                       tie_to_cotangent=needs_tie() if tie is None else tie,
                       levels=self.levels)
        options.update(rounding(mode, round_read_back))
        if self.prevent_cse and (fences_chains() if self.fence_chains is None
                                 else self.fence_chains):
            options["fence_chains"] = True
        if self.scan_segments:
            options["scan_segments"] = self.scan_segments
        if self.scan_segments_offload:
            options["scan_segments_offload"] = self.scan_segments_offload
        return options

    def _remat(self, exported, mode, name, variants, round_read_back=False,
               options: dict | None = None) -> list:
        """The rewritten module per barrier variant, from the disk cache when it has it:
        [(module, was it)]. The ones it lacks are rewritten together (`remat_variants`: the
        plan is made once). `options`: rp.remat's, where not `remat_options(mode)`."""
        if options is None:
            options = self.remat_options(mode, round_read_back)

        def key(v):
            if not self.cache_dir:
                return None
            # (per-use, the default, keeps the keys written before the option existed)
            opts = dict(options, tie_to_cotangent=v.tie)
            return cache.key(exported, opts if v.groups == "per-use"
                             else dict(opts, barrier_groups=v.groups))
        keys = {v: key(v) for v in variants}      # (None: not cached, a Python policy)
        found = {v: None if keys[v] is None else cache.load(self.cache_dir, keys[v], exported)
                 for v in variants}
        missing = [v for v in variants if found[v] is None]
        made = {}
        if missing:
            try:
                made = dict(zip(missing, remat_variants(exported, missing, **options)))
            except RematError as e:
                if "cannot tell forward from backward" not in str(e):
                    raise
                raise NoBackward(
                    f"error: rp.jit: {name} has no backward pass (no jax.grad, "
                    "jax.value_and_grad or jax.vjp inside, or none whose result reaches "
                    "what it returns: a gradient written into an argument in place is "
                    "lost, as under jax.jit, except in Flax NNX objects): called alone "
                    "there is nothing to rematerialize; differentiate it from outside, "
                    f"jax.grad(rp.jit({name})), or use jax.jit") from None
            for v, module in made.items():
                if keys[v] is not None:
                    cache.store(self.cache_dir, keys[v], module)
        out = [(found[v], True) if found[v] is not None else (made[v], False)
               for v in variants]
        if mode == "split":
            # (the residuals cross between rp.jit's own halves alone: a kept product each
            # half reads transposed may cross in that order, fold-dot-transposes across-halves)
            for module, _ in out:
                run_pipeline(module.op, [FoldDotTransposes(across_halves=True)])
                if module.residuals is not None:
                    module.residuals = residuals_as_folded(module.op, module.residuals)
        return out

    # A build lowers its program(s), starts XLA's compilation of each (`start`, from
    # jax_run.compiling) and gives back a function that waits for them and makes the Lowered:
    # the joint form's here, the split form's `split_run.build`.
    def _build_joint(self, exported, module, dynamic, donated, start) -> Callable[[], Lowered]:
        exp = module.to_exported()
        if exp.in_tree != exported.exported.in_tree or exp.out_tree != exported.exported.out_tree:
            raise RematError("error: rp.jit: the rewritten program does not keep the calling "
                             "convention of the function (report this as a bug)")
        exp, jit_kw = jax_compat.exported_for_call(exp)
        compiling = start(jax.jit(exp.call, donate_argnums=donated, **jit_kw,
                                  **self._jit_kw).lower(*dynamic))

        def finish():
            compiled = compiling()
            return Lowered("joint", exported, module, (compiled,), compiled, traced=exp.call)
        return finish


def jit(fun: Callable | None = None, *, policy=None, mode: str = "auto",
        donate_argnums: int | Sequence[int] = (), static_argnums: int | Sequence[int] = (),
        prevent_cse: bool = True, tie_to_cotangent: bool | None = None,
        jax_checkpoint: str = "jax", scan_segments: int | str = 0,
        scan_segments_offload: str | None = None, barrier_groups: str | None = None,
        levels: str = "auto", cache_dir=None, static_argnames: str | Sequence[str] = (),
        donate_argnames: str | Sequence[str] = (), in_shardings=None,
        out_shardings=None, fence_chains: bool | None = None,
        compiler_options: dict | None = None) -> Any:
    """`jax.jit` with remat for a function whose program contains its backward pass (a
    training step with `jax.grad` / `jax.value_and_grad` inside, or a gradient function):
    `policy` (a spec, a policy of `rp.policies`, `auto(budget=...)` or JAX's own) decides
    what the forward keeps; `scan_segments=k` (or "sqrt") keeps each scan's carry every k
    iterations (as `rp.remat`'s; `scan_segments_offload="pinned_host"` keeps those carries
    in host memory); `levels` as `rp.remat`'s (two levels of recomputation under `auto`
    where they lower the peak). Usable as a decorator, with or without
    arguments. See the module docstring for the arguments (static, donated, keyword), the
    modes, `barrier_groups` and `cache_dir`."""
    if fun is None:
        return functools.partial(jit, policy=policy, mode=mode, donate_argnums=donate_argnums,
                                 static_argnums=static_argnums, prevent_cse=prevent_cse,
                                 tie_to_cotangent=tie_to_cotangent,
                                 jax_checkpoint=jax_checkpoint, scan_segments=scan_segments,
                                 scan_segments_offload=scan_segments_offload,
                                 barrier_groups=barrier_groups, levels=levels,
                                 cache_dir=cache_dir, static_argnames=static_argnames,
                                 donate_argnames=donate_argnames, in_shardings=in_shardings,
                                 out_shardings=out_shardings, fence_chains=fence_chains,
                                 compiler_options=compiler_options)
    return Jitted(fun, policy=policy, mode=mode, donate_argnums=donate_argnums,
                  static_argnums=static_argnums, prevent_cse=prevent_cse,
                  tie_to_cotangent=tie_to_cotangent, jax_checkpoint=jax_checkpoint,
                  scan_segments=scan_segments, scan_segments_offload=scan_segments_offload,
                  barrier_groups=barrier_groups, levels=levels, cache_dir=cache_dir,
                  static_argnames=static_argnames, donate_argnames=donate_argnames,
                  in_shardings=in_shardings, out_shardings=out_shardings,
                  fence_chains=fence_chains, compiler_options=compiler_options)
