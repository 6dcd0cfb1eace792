"""The (model, policy) cases of the comparison, generated from the policy table.

Every policy of `jax.checkpoint_policies` (ours and JAX's spelled the same),
with each model's checkpoint names filled in, plus no remat and per-layer
regions. `jax_function(model, case)` is the hand-written JAX side of a case.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax

import remat_passes as rp
from tools.benchmarks.models import Model, _identity


@dataclasses.dataclass
class Case:
    label: str              # the policy as written (ours and JAX use the same spelling)
    short: str              # for the plot
    kind: str               # 'plain' (no checkpoint), 'whole' (checkpoint around the model), 'layers'
    jax_policy: Any = None
    our_policy: Any = None


def cases_for(model: Model) -> list[Case]:
    cp, P = jax.checkpoint_policies, rp.policies
    n = model.names

    def q(names):
        return ", ".join(names)
    cases = [
        Case("none (no remat)", "none", "plain"),
        Case("everything_saveable", "all", "whole", cp.everything_saveable,
             P.everything_saveable),
        Case("nothing_saveable", "nothing", "whole", cp.nothing_saveable, P.nothing_saveable),
        Case("dots_saveable", "dots", "whole", cp.dots_saveable, P.dots_saveable),
        Case("dots_with_no_batch_dims_saveable", "dots_nb", "whole",
             cp.dots_with_no_batch_dims_saveable, P.dots_with_no_batch_dims_saveable),
        Case(f"save_only_these_names({q(n['only'])})", "only", "whole",
             cp.save_only_these_names(*n["only"]), P.save_only_these_names(*n["only"])),
        Case(f"save_any_names_but_these({q(n['but'])})", "but", "whole",
             cp.save_any_names_but_these(*n["but"]), P.save_any_names_but_these(*n["but"])),
        Case(f"save_anything_except_these_names({q(n['but'])})", "except", "whole",
             cp.save_anything_except_these_names(*n["but"]),
             P.save_anything_except_these_names(*n["but"])),
        Case(f"save_from_both_policies(dots_with_no_batch_dims_saveable, "
             f"save_only_these_names({q(n['keep'])}))", "both", "whole",
             cp.save_from_both_policies(cp.dots_with_no_batch_dims_saveable,
                                        cp.save_only_these_names(*n["keep"])),
             P.save_from_both_policies(P.dots_with_no_batch_dims_saveable,
                                       P.save_only_these_names(*n["keep"]))),
        Case("offload_dot_with_no_batch_dims(device, pinned_host)", "off_dots", "whole",
             cp.offload_dot_with_no_batch_dims("device", "pinned_host"),
             P.offload_dot_with_no_batch_dims("device", "pinned_host")),
        Case(f"save_and_offload_only_these_names(saved=[{q(n['keep'])}], "
             f"offloaded=[{q(n['offload'])}])",
             "off_names", "whole",
             cp.save_and_offload_only_these_names(
                 names_which_can_be_saved=n["keep"], names_which_can_be_offloaded=n["offload"],
                 offload_src="device", offload_dst="pinned_host"),
             P.save_and_offload_only_these_names(
                 names_which_can_be_saved=n["keep"], names_which_can_be_offloaded=n["offload"],
                 offload_src="device", offload_dst="pinned_host")),
        Case("per-layer regions", "layers", "layers"),
    ]
    return [c for c in cases if model.only_cases is None or c.short in model.only_cases]


def jax_function(model: Model, case: Case):
    """A fresh JAX function for `case` (fresh closures: no tracing caches hit)."""
    if case.kind == "plain":
        return model.build(_identity)
    if case.kind == "whole" and model.scanned:
        # scan(checkpoint(layer, policy)), and every piece outside the loop checkpointed with
        # the same policy: what our module policy means (it applies everywhere)
        def ckpt(fn):
            return jax.checkpoint(fn, policy=case.jax_policy)
        return model.build(ckpt, outer=ckpt)
    if case.kind == "whole":
        return jax.checkpoint(model.build(_identity), policy=case.jax_policy)
    return model.build(model.jax_layer_wrap)
