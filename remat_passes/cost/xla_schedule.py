"""The order XLA:CPU runs a function's ops in, for `estimate_memory(model="xla")` on CPU.

XLA:CPU schedules each computation with its concurrency-optimized scheduler (on by
default, `--xla_cpu_enable_concurrency_optimized_scheduler`; `BFSMemoryScheduler` in XLA):
a breadth-first topological order. The parameters and constants are ready first; an
instruction is queued, first in first out, when the last of its operands has run. So an
op that reads only the function's arguments runs at the start of the program wherever it
is written (in a split backward: a recomputation from residuals alone, the transposed copy
of a residual), and one reading a value made early runs soon after it, not where its
reader needs it. Its result is held until then.

What the graph holds of the optimization barriers differs by jaxlib
(`jax_compat.xla_cpu_fuses_across_barriers`). XLA:CPU of 0.10 deletes them before it
schedules, so a recomputation waits only for what it reads (unless place-optimization-
barriers' tie makes it read the cotangent). Later ones keep them until after, each as
three steps of the queue: a tuple of its operands, the barrier, and one get-tuple-element
per result, which its readers wait for. Read from XLA:CPU 0.12's scheduled HLO
(`--xla_dump_hlo_pass_re=cse_barrier_expander`, before the barriers go): the split
Equinox and conv net backwards and the conv net's joint program under `dots_saveable` run
in exactly that breadth-first order of their fused graphs, every pair of instructions.

`bfs_order` gives a block's ops in that order, on the graph XLA schedules: an op fused
into its readers is no instruction of its own (a reader waits for what the fused op
reads), and the ops XLA:CPU deletes (placement annotations; with jaxlib 0.10 the
barriers) pass their operands through. The block's terminator stays last. Measured with
XLA's own dumps (`python -m tools.benchmarks.xla_dump`): on jaxlib 0.10 the conv net's
split backward under `offload_dot_with_no_batch_dims(names)`, whose footprint the
program-order model put 17% under XLA's; on jaxlib 0.12 the Equinox backward under
`save_and_offload_only_these_names`, 18% under.
"""
from __future__ import annotations

from collections import deque

from remat_passes.ir import graph
from remat_passes.ir.mlir import ir, op_id


def deletes_barriers(backend: str | None = None) -> bool:
    """May XLA on `backend` (by default JAX's) delete optimization barriers before it
    schedules? XLA:CPU of jaxlib 0.10 does: a recomputation then waits only for what it
    reads, so only a data dependency on the cotangent (place-optimization-barriers' tie)
    keeps it late. (Later XLA:CPU keeps them until after it schedules; the tie is built on
    CPU all the same, and rp.jit runs the smaller of the tied and untied programs.)"""
    if backend is None:
        from remat_passes import jax_compat
        backend = jax_compat.platform_in_use()
    return backend == "cpu"


def fences_chains(backend: str | None = None) -> bool:
    """Does rp.jit fence cheap chains XLA would compute again in several readers
    (place-optimization-barriers' `fence-chains`) on `backend`? Where it was measured to pay:
    XLA:CPU that keeps barriers until after it fuses (jaxlib >= 0.11). XLA:CPU of jaxlib 0.10
    deletes them before it fuses, so a fence changes nothing there; on a GPU it is not
    measured yet."""
    from remat_passes import jax_compat
    return deletes_barriers(backend) and not jax_compat.xla_cpu_fuses_across_barriers()


def compiled_forms(mode: str, backend: str | None = None) -> list[tuple[bool, str]]:
    """The (tied to the cotangent, barrier grouping) forms rp.jit compiles on `backend` and
    runs the smaller of (api/variants.barrier_variants, for the passes, which cannot import
    api): in split form on CPU tied and untied; both groupings but where XLA:CPU fuses
    across barriers (jaxlib 0.10). monotone's trials weigh each plan in all of them (on
    jaxlib 0.12 the conv net's plan for 299,093 B peaks at 2.83 MB per use, 2.57 MB per
    region; its plan for 897,280 B at 2.96 MB tied, 2.69 MB untied)."""
    from remat_passes import jax_compat
    cpu = deletes_barriers(backend)
    ties = (True, False) if mode == "split" and cpu else (True,)
    groupings = ("per-use",) if cpu and jax_compat.xla_cpu_fuses_across_barriers() else \
        ("per-use", "per-region")
    return [(tie, groups) for tie in ties for groups in groupings]


def peak_forms(recomputes: bool, backend: str | None = None) -> list[dict]:
    """The joint forms objective=peak weighs a plan in, at the lowest of their peaks (the
    benchmarks' budgets page measures the same), as rp-remat options: `groups`, `rounded`
    (round_read_back), `tie`. Those rp.jit compiles (`compiled_forms`; on jaxlib 0.12 the
    conv net's plan for residual budget 0 peaks at 3,239,872 B per use, 2,387,584 B per
    region), and for a plan that recomputes nothing where barriers do not decide (XLA:CPU
    of jaxlib 0.10), with its residuals rounded too (rp.jit builds that one then:
    api/variants; where they decide, per region, JAX's one barrier, is among them)."""
    forms = [dict(groups=groups, rounded=False, tie=tie)
             for tie, groups in compiled_forms("joint", backend)]
    if not recomputes and len(forms) == 1:
        forms.append(dict(groups="per-use", rounded=True, tie=True))
    return forms


def bfs_order(ops: list, passes_through, arguments, copied=lambda op: (),
              copies_after: dict | None = None) -> list:
    """`ops` (a block's top-level ops, its terminator last) in XLA:CPU's breadth-first
    order. `passes_through(op)`: is op no instruction of its own (fused into its readers,
    or deleted)? Such an op goes right before the first instruction that reads it. An
    optimization barrier that does not pass through is a tuple, the barrier and a
    get-tuple-element per result read (module docstring).
    `arguments`: the block's arguments, ready first, in order. `copied(op)`: the operands
    op works on transposed copies of; each copy is an instruction of its own, which op
    waits for (so op runs a step after the ops that read the same values directly).
    `copies_after`, if given, gets where each copy runs: (op id, operand) -> the index in
    the order returned of the op it runs after (-1: at entry, as one of arguments and
    literals alone)."""
    if len(ops) < 3:
        return ops
    body, term = ops[:-1], ops[-1]
    n = len(body)
    index = {op_id(op): i for i, op in enumerate(body)}
    through = [passes_through(op) for op in body]
    arg_slot = {a: -1 - k for k, a in enumerate(arguments)}
    readers: list = [[] for _ in range(n)]   # the ops reading op i's results directly
    parts: list = [()] * n                   # an op passing through: where its inputs come from
    waits: list = [()] * n                   # the instructions op i waits for; a copy: n + k
    copy_of: dict = {}                       # a copy's number -> (op index, operand)
    element: dict = {}                       # (kept barrier, result) -> its get-tuple-element
    ran_after: dict = {}                     # a copy's number -> the op it runs after

    def owner(v):
        return index.get(op_id(v.owner)) if isinstance(v, ir.OpResult) else None

    def source(v):
        """What v comes from: an argument's slot, an op (one passing through included) or
        None (defined outside the block: a capture)."""
        if v in arg_slot:
            return arg_slot[v]
        j = owner(v)
        if j is not None and through[j] and body[j].name == "stablehlo.optimization_barrier":
            return source(body[j].operands[v.result_number])   # deleted: result k is operand k
        if j is not None and body[j].name == "stablehlo.optimization_barrier":
            key = (j, v.result_number)        # kept: its result k is a get-tuple-element
            if key not in element:
                element[key] = len(waits)
                waits.append((j,))
            return element[key]
        return j

    def producers(values) -> list:
        """The instructions reading `values` waits for, through the ops that pass through
        (walked here, where an instruction reads them: a fused chain once), in order, once
        each."""
        out, seen, walked = [], set(), set()
        stack = [iter([source(v) for v in values])]
        while stack:
            for s in stack[-1]:
                if s is not None and 0 <= s < n and through[s]:
                    if s not in walked:
                        walked.add(s)
                        stack.append(iter(parts[s]))
                        break
                elif s is not None and s not in seen:
                    seen.add(s)
                    out.append(s)
            else:
                stack.pop()
        return out

    for i, op in enumerate(body):
        values = graph.read_values(op)
        for v in values:
            if owner(v) is not None:
                readers[owner(v)].append(i)
        if through[i]:
            parts[i] = [source(v) for v in values]
            continue
        copies = set(copied(op))
        deps = []
        if op.name == "stablehlo.optimization_barrier":    # (kept) after a tuple
            waited = producers(values)
            waits[i] = (len(waits),)
            waits.append(waited)
            continue
        for v in values:
            if v in copies:
                waited = producers([v])       # (first: it may number get-tuple-elements)
                deps.append(len(waits))       # the copy (numbered after the ops)
                copy_of[len(waits)] = (i, v)
                waits.append(waited)
            else:
                deps += producers([v])
        waits[i] = tuple(dict.fromkeys(deps))
    users: dict = {}
    pending = [0] * len(waits)
    queue = deque(-1 - k for k in range(len(arguments)))
    for i in range(len(waits)):
        if i < n and through[i]:
            continue
        pending[i] = len(waits[i])
        for d in waits[i]:
            users.setdefault(d, []).append(i)
        if not waits[i]:
            queue.append(i)
    order = []
    while queue:
        d = queue.popleft()
        if 0 <= d < n:
            order.append(d)
        elif d in copy_of and order and any(
                w >= n or (w >= 0 and body[w].name != "stablehlo.constant") for w in waits[d]):
            ran_after[d] = order[-1]      # (of arguments and literals alone: at entry)
        for u in users.get(d, ()):
            pending[u] -= 1
            if pending[u] == 0:
                queue.append(u)
    position = {i: k for k, i in enumerate(order)}
    first = [n] * n        # position of the first instruction reading op i, through
    for i in reversed(range(n)):
        for j in readers[i]:
            first[i] = min(first[i], first[j] if through[j] else position[j])
    later = sorted((i for i in range(n) if through[i]), key=lambda i: (first[i], i))
    out, k, at = [], 0, {}
    for i in order:
        while k < len(later) and first[later[k]] <= position[i]:
            out.append(body[later[k]])
            k += 1
        at[i] = len(out)
        out.append(body[i])
    if copies_after is not None:
        for c, (i, v) in copy_of.items():
            j = ran_after.get(c)
            copies_after[(op_id(body[i]), v)] = -1 if j is None else at[j]
    return out + [body[i] for i in later[k:]] + [term]
