"""A disk cache of rewritten modules, so that a second process skips the remat pipeline.

`rp.jit(..., cache_dir=PATH)` (or the environment variable `REMAT_PASSES_CACHE_DIR`) keeps
what `rp.remat` made for each exported program in PATH. The key is everything the result
depends on: the exported module itself (its text with the op names and name stacks of its
locations, which carry checkpoint scopes and JAX's transpose frames, but without their file
positions: an edit elsewhere in the script, which moves the lines of the call, still hits),
the options of the pipeline with the policy as its spec, the policies of
its checkpoint regions, the backend and device kind, the versions of remat_passes, jax and
jaxlib, and a digest of remat_passes' own source files (`code_digest`: a checkout that
changed a pass since the entry was written, under the same version number, misses). A
policy that is Python code (a callable of the user's) has no spec that says what it
decides, so a program under one is never cached.

On a hit, the residuals' source positions ("output of sin from train.py:40") are those of
the run that wrote the entry.

The function is still traced and exported in the second process (the key is the program,
so an edited model can never be served a stale rewrite); XLA's compilation is cached by
JAX's own persistent cache (`jax.config.update("jax_compilation_cache_dir", PATH)`).

An entry is two files, `<key>.mlirbc` (the module as MLIR bytecode) and `<key>.json` (its
residuals and remarks), each written atomically; the JSON file, written last, makes the
entry complete. An entry that cannot be read is a miss and is written again.

rp.jit compiles several programs for a signature and runs the one with the smallest XLA
footprint (`api/variants`). Which one that was is kept too (`<key>.choice.json`, by
`choice_key`: the programs' bytecode, how they are compiled and for what arguments, the
versions), so a later process with the same candidates compiles only that one: XLA's
compilations, not the pipeline, are most of a first call's time.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
from pathlib import Path

from remat_passes.core.residuals import Residual
from remat_passes.ir import mlir
from remat_passes.ir.verdicts import Offloadable
from remat_passes.jax.module import Module, write_atomically
from remat_passes.policy.policies import as_policy, parse_policy

ENV = "REMAT_PASSES_CACHE_DIR"
_FILE_POSITION = re.compile(r'"[^"]*":\d+:\d+(?: to (?:\d+)?:\d+)?')
_FORMAT = 1


def cache_dir(option) -> str | None:
    """The directory to use: `option` (a path; False: none), else $REMAT_PASSES_CACHE_DIR."""
    if option is False:
        return None
    if option is not None:
        return os.fspath(option)
    return os.environ.get(ENV) or None


@functools.cache
def code_digest() -> str:
    """A digest of the remat_passes package's Python files (read once per process): what
    the passes that made an entry were, beyond the version number."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _spec(policy) -> str | None:
    """A spec string that recreates `policy`, or None when it is Python code of the user's."""
    if policy is None:
        return "none"
    spec = as_policy(policy).spec
    try:
        return spec if parse_policy(spec).spec == spec else None
    except Exception:   # "<callable f>": not a spec at all
        return None


def key(exported: Module, options: dict) -> str | None:
    """The cache key of `rp.remat(exported, **options)`, or None when it cannot be cached."""
    import jax
    import jaxlib

    from remat_passes import __version__
    if exported.exported is None:
        return None
    specs = {"policy": _spec(options.get("policy"))}
    for scope, pol in sorted(exported.region_policies.items(), key=lambda kv: str(kv[0])):
        specs[f"region {scope}"] = _spec(pol)
    if any(s is None for s in specs.values()):
        return None
    device = jax.devices()[0]
    described = json.dumps({
        "format": _FORMAT, "remat_passes": __version__, "code": code_digest(),
        "jax": jax.__version__, "jaxlib": jaxlib.__version__, "backend": device.platform,
        "device": getattr(device, "device_kind", ""),
        "options": {k: repr(v) for k, v in sorted(options.items()) if k != "policy"},
        "policies": specs}, sort_keys=True)
    h = hashlib.sha256(described.encode())
    h.update(_FILE_POSITION.sub("", exported.text(debug_info=True)).encode())
    return h.hexdigest()[:32]


def load(directory: str, entry: str, exported: Module) -> Module | None:
    """The cached rewrite of `exported` under `entry`, or None (a miss)."""
    base = os.path.join(directory, entry)
    try:
        with open(base + ".json", encoding="utf-8") as f:
            meta = json.load(f)
        with open(base + ".mlirbc", "rb") as f:
            data = f.read()
        if meta.get("format") != _FORMAT:
            return None
        residuals = [Residual(**{**r, "offload": Offloadable(**r["offload"])
                                 if r.get("offload") else None}) for r in meta["residuals"]]
        op, _ = mlir.parse(data, base + ".mlirbc")
    except (OSError, ValueError, KeyError, TypeError, mlir.RematError):
        return None
    dims: dict = {}
    for name, arg, labels in meta["dim_symbols"]:
        dims.setdefault(name, {})[arg] = tuple(labels)
    out = Module(op, exported.exported, exported.region_policies, exported.filename, dims)
    out.exported_signature = exported.exported_signature   # as Module.clone: the export's
    out.residuals = residuals
    out.remarks = list(meta["remarks"])
    out.timings, out.plan_reports = [], []
    return out


def store(directory: str, entry: str, module: Module) -> None:
    """Keep `module` (a result of rp.remat) under `entry`; a cache that cannot be written
    is skipped, not an error (the program runs anyway)."""
    base = os.path.join(directory, entry)
    meta = {"format": _FORMAT,
            "residuals": [dataclasses.asdict(r) for r in module.residuals or []],
            "remarks": [str(r) for r in module.remarks],
            "dim_symbols": [[name, arg, list(labels)]
                            for name, args in (module.dim_symbols or {}).items()
                            for arg, labels in args.items()]}
    try:
        os.makedirs(directory, exist_ok=True)
        write_atomically(base + ".mlirbc", module.bytecode())
        write_atomically(base + ".json", json.dumps(meta, indent=1).encode())
    except (OSError, mlir.RematError, TypeError):
        pass


def choice_key(programs: list[bytes], described: dict) -> str:
    """The key of rp.jit's choice among `programs` (each one's bytecode, in the order it
    builds them), compiled as `described` says (the form, donation, the arguments'
    shardings, the compiler options), on this backend with these versions."""
    import jax
    import jaxlib

    from remat_passes import __version__
    device = jax.devices()[0]
    h = hashlib.sha256(json.dumps({
        "format": _FORMAT, "remat_passes": __version__, "code": code_digest(),
        "jax": jax.__version__, "jaxlib": jaxlib.__version__, "backend": device.platform,
        "device": getattr(device, "device_kind", ""), **described},
        sort_keys=True, default=repr).encode())
    for program in programs:
        h.update(hashlib.sha256(program).digest())
    return h.hexdigest()[:32]


def arguments_described(leaves) -> list:
    """What of the arguments' leaves (arrays, `jax.ShapeDtypeStruct`s, Python numbers) a
    choice among compiled programs depends on, for `choice_key`."""
    return [(type(a).__name__, getattr(a, "shape", None), str(getattr(a, "dtype", "")),
             str(getattr(a, "sharding", None))) for a in leaves]


def load_choice(directory: str, entry: str) -> dict | None:
    """The choice kept under `entry` (`store_choice`'s dict), or None."""
    try:
        with open(os.path.join(directory, entry + ".choice.json"), encoding="utf-8") as f:
            choice = json.load(f)
        return choice if choice.get("format") == _FORMAT else None
    except (OSError, ValueError, AttributeError):
        return None


def store_choice(directory: str, entry: str, choice: dict) -> None:
    """Keep rp.jit's choice (a JSON-able dict) under `entry`; skipped where it cannot be
    written."""
    try:
        os.makedirs(directory, exist_ok=True)
        write_atomically(os.path.join(directory, entry + ".choice.json"),
                         json.dumps({"format": _FORMAT, **choice}, indent=1).encode())
    except (OSError, TypeError, ValueError):
        pass
