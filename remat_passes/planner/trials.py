"""The trial plans of auto(monotone=...) and auto(objective=peak), kept for the process.

Both plan the module at trial residual budgets and measure each plan's peak. A trial
depends on the module, the pass's options, the policy's own options, what the pipeline
state tells it and the backend alone, so a sweep of budgets plans each trial once:
`remembered(key(...), kind, budget, make)` runs `make()` the first time only; `kept` is
that bounded memo, which the solvers' memo of solutions (`solvers.SOLVED`) uses too.
"""
from __future__ import annotations

import collections
import hashlib

TRIALS: collections.OrderedDict = collections.OrderedDict()
TRIALS_MEMO = 1024      # trials kept (the oldest go first)


def remembered(memo, kind: str, rb: int, make):
    """`make()`, the trial `kind` at residual budget `rb`, once per `memo` (None: each time)."""
    if memo is None:
        return make()
    return kept(TRIALS, TRIALS_MEMO, (memo, kind, rb), make)


def remembered_all(memo, kind: str, rbs: list, make_all) -> list:
    """`remembered` of each residual budget of `rbs`, those not made yet made together:
    `make_all(those budgets)` gives one trial per budget (trial plans compiled side by
    side)."""
    found, missing = {}, []
    for rb in dict.fromkeys(rbs):
        if memo is not None and (memo, kind, rb) in TRIALS:
            found[rb] = TRIALS[(memo, kind, rb)]
        else:
            missing.append(rb)
    for rb, trial in zip(missing, make_all(missing) if missing else ()):
        found[rb] = remembered(memo, kind, rb, lambda trial=trial: trial)
    return [found[rb] for rb in rbs]


def kept(store: collections.OrderedDict, size: int, k, make):
    """`store[k]`, made by `make()` the first time; `store` keeps its `size` newest."""
    if k not in store:
        store[k] = make()
        while len(store) > size:
            store.popitem(last=False)
    return store[k]


def key(module_op, options: dict, region_policies: dict, loop_body: bool, policy):
    """The key of `module_op`'s trials under `options` (the pass's, but the policy),
    `policy`'s own options, the policies of recorded checkpoint regions and whether the
    function is a loop body, on the platform JAX runs on; None where the solver is a function
    (it may keep state)."""
    if callable(policy.solver):
        return None
    from remat_passes import jax_compat

    def named(v):
        return getattr(v, "spec", getattr(v, "pattern", v))
    text = module_op.operation.get_asm(enable_debug_info=True)
    settings = [(k, named(v)) for k, v in options.items() if k != "policy"]
    regions = sorted((str(k), named(v)) for k, v in region_policies.items())
    return (hashlib.sha256(text.encode()).hexdigest(), str(settings), str(regions),
            loop_body, policy.offload, policy.device, policy.solver,
            jax_compat.platform_in_use())
