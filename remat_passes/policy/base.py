"""What a policy is: `Policy`, a callable from an op's `OpInfo` to a verdict, with the spec
that recreates it; `PolicyError` when one fails."""
from __future__ import annotations

from typing import Any, Callable

from remat_passes.ir.mlir import RematError
from remat_passes.ir.verdicts import normalize_verdict


class PolicyError(RematError, ValueError):
    """A policy raised or returned nonsense: a ValueError, as in JAX, and a user error."""


class Policy:
    """A callable OpInfo -> verdict with a spec string that recreates it."""

    def __init__(self, fn: Callable[[Any], Any], spec: str, reads_attributes: bool = False,
                 constant=None, names=None, names_any: bool = False):
        self._fn = fn
        self.spec = spec
        # The checkpoint names the policy looks for (None: it does not look at names); a
        # name no value has gets a remark from remat-partial-eval (with `names_any`, only
        # when no value has any of them: a preset for several model families).
        self.names = frozenset(names) if names is not None else None
        self.names_any = names_any
        # The verdict for every op, when the policy does not look at ops at all.
        self.constant = constant
        # Built-in policies never look at OpInfo.attributes; user callables may.
        self.reads_attributes = reads_attributes

    def __call__(self, op):
        return self._fn(op)

    def verdict(self, op):
        try:
            value = self._fn(op)
        except RematError:
            raise
        except Exception as e:          # (a user's policy: KeyError, IndexError, ... too)
            what = str(e) if isinstance(e, (ValueError, TypeError)) else \
                f"{type(e).__name__}: {e}"
            raise PolicyError(f"error: policy {self.spec} failed on {op.name}: {what}") from e
        return normalize_verdict(value, self)

    def __repr__(self):
        return f"<policy {self.spec}>"
