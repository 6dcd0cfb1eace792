"""python -m tools.benchmarks COMMAND [options]

COMMAND: models, budgets, scaling, memory, xla, startup, dispatch, train, libraries, gpu,
barriers, zoo, scans, render or all:

  models   the comparison with hand-written jax.checkpoint   -> results/models.json
  budgets  the planner, auto(budget=...), on the same models -> results/budgets.json
  scaling  pass time and memory against module size          -> results/scaling.json
  memory   static peak-memory figures                        -> results/memory.json
  xla      XLA's memory of our halves beside JAX's -> results/xla.json (xla_gpu.json on a GPU,
           xla_cpu_jax0_12.json on CPU with jax 0.12: see xla_memory.results_name)
  startup  remat-opt start-up time against `import jax`      -> results/startup.json
  dispatch the cost of a call, rp.jit beside jax.jit         -> results/dispatch.json
  train    a training step through rp.jit beside jax.jit     -> results/train.json
  libraries Flax NNX and Equinox steps beside nnx.jit, eqx.filter_jit -> results/libraries.json
  gpu      XLA memory and step time of every plan (on a GPU)  -> results/gpu.json
  barriers per-use against per-region barriers (on a GPU) -> results/barriers_<backend>.json
  zoo      models from other libraries (installs them, pinned) -> results/zoo.json
  scans    long scans in segments beside the hand-written scheme -> results/scans.json
  render   docs/benchmarks.md and its plot from those files (the others only measure)
  all      the ten measurements on CPU (models to train, libraries, scans), then render
           (about 1.5 hours on 2 cores)

Run from the repository root after `pip install -e ".[bench]"`.
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _failed(checks) -> None:
    """Log each of a benchmark's (text, ok) checks that failed."""
    for text, ok in checks:
        if not ok:
            _log(f"check failed: {text}")


def run_models(argv) -> None:
    from tools.benchmarks import common, measure
    from tools.benchmarks.models import MODELS
    ap = argparse.ArgumentParser(prog="python -m tools.benchmarks models")
    ap.add_argument("--models", default=",".join(MODELS),
                    help=f"comma-separated subset of {','.join(MODELS)}")
    ap.add_argument("--repeat", type=int, default=3, help="timings: best of N (default 3)")
    args = ap.parse_args(argv)
    keys = [k.strip() for k in args.models.split(",") if k.strip()]
    unknown = [k for k in keys if k not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {', '.join(MODELS)}")
    _log(f"wrote {common.write_json('models', measure.measure(keys, args.repeat, _log))}")


def run_budgets(argv) -> None:
    from tools.benchmarks import budgets, common
    ap = argparse.ArgumentParser(prog="python -m tools.benchmarks budgets")
    known = budgets.PAGE_MODELS
    ap.add_argument("--models", default=",".join(known),
                    help=f"comma-separated subset of {','.join(known)}")
    ap.add_argument("--sizes", default="40,400",
                    help="transformer depths for the large-module solves (default 40,400: "
                         "about 10k and 100k ops; empty: none)")
    ap.add_argument("--merge", action="store_true",
                    help="replace only these models' results (and, with --sizes, the "
                         "large-module solves) in the stored ones")
    ap.add_argument("--peaks-only", action="store_true",
                    help="measure only the joint peak figures again (the no-remat peak, the "
                         "sweeps', objective=peak's) into the stored results: for a change "
                         "to the peak estimate alone")
    args = ap.parse_args(argv)
    if args.peaks_only:
        data = budgets.refresh_peaks(common.read_json("budgets"), _log)
        _log(f"wrote {common.write_json('budgets', data)}")
        for line in budgets.checks(data):
            _log(f"check failed: {line}")
        return
    keys = [k.strip() for k in args.models.split(",") if k.strip()]
    unknown = [k for k in keys if k not in known]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {', '.join(known)}")
    sizes = tuple(int(s) for s in args.sizes.split(",") if s.strip())
    # as the xla benchmark does: XLA:CPU's FLOP counts without YNNPACK fusions, which change
    # them a little (the decoder's no-remat split: 1,380,917,536 off, 1,380,211,488 on)
    from tools.benchmarks import ynn_probe
    ynn_probe.turn_off()
    stored = common.read_json("budgets") if args.merge else None
    if args.merge and stored is None:
        ap.error("--merge: no stored results budgets.json to merge into")
    data = budgets.measure(keys, _log, sizes)
    if stored is not None:
        data = budgets.merge(stored, data)
    _log(f"wrote {common.write_json('budgets', data)}")
    for line in budgets.checks(data):
        _log(f"check failed: {line}")


def run_memory(argv) -> None:
    from tools.benchmarks import common, memory_figures
    argparse.ArgumentParser(prog="python -m tools.benchmarks memory").parse_args(argv)
    _log(f"wrote {common.write_json('memory', memory_figures.measure())}")


def _parts_and_stored(ap, paths):
    """The results files (or .tgz of them) at `paths`, all of one backend, and the stored
    results of that backend: (their name, the stored data or None, the parts)."""
    from tools.benchmarks import common, xla_memory
    try:
        parts = xla_memory.read_parts(paths)
    except (OSError, ValueError, KeyError) as e:
        ap.error(f"cannot read the parts to merge: {e}")
    if not parts:
        ap.error(f"no xla results in {' '.join(paths)}")
    backends = {p["meta"]["backend"] for p in parts}
    if len(backends) != 1:
        ap.error(f"the parts were measured on different backends: {sorted(backends)}")
    name = xla_memory.results_name(backends.pop())
    return name, common.read_json(name), parts


def _write_and_check(name, data) -> None:
    from tools.benchmarks import common, xla_memory
    _log(f"wrote {common.write_json(name, data)}")
    _failed(xla_memory.checks(data))


def run_xla(argv) -> None:
    from tools.benchmarks import common, xla_memory
    from tools.benchmarks.models import MODELS
    ap = argparse.ArgumentParser(prog="python -m tools.benchmarks xla")
    ap.add_argument("--models", default=",".join(MODELS),
                    help=f"comma-separated subset of {','.join(MODELS)}")
    ap.add_argument("--merge", action="store_true",
                    help="replace only these models' rows in the stored results (a device "
                         "run in pieces, one call per few models; a sweep's monotone twins "
                         "stay where it measured the same, else the log says they went)")
    ap.add_argument("--merge-from", metavar="FILE", nargs="+",
                    help="merge results measured elsewhere into the stored ones, each part's "
                         "models replacing theirs: xla_*.json files, or the .tgz of them "
                         "device_round.sh --parallel hands back (static: no device needed)")
    ap.add_argument("--merge-monotone-from", metavar="FILE", nargs="+",
                    help="fold into the stored results the monotone sweeps measured "
                         "elsewhere (xla --monotone runs: their results files, or the .tgz "
                         "device_round.sh hands back with MONOTONE set; static)")
    ap.add_argument("--merge-peak-from", metavar="FILE", nargs="+",
                    help="fold into the stored results the objective=peak sweeps measured "
                         "elsewhere (xla --peak runs: their results files, or the .tgz "
                         "device_round.sh hands back with PEAK set; static)")
    ap.add_argument("--re-estimate", metavar="BACKEND", choices=("cpu", "gpu"),
                    help="make the estimate of the stored results of BACKEND again with this "
                         "checkout (static: no device needed; same jax as measured)")
    ap.add_argument("--monotone", nargs="?", const="larger", choices=("larger", "smaller"),
                    help="add to the stored results of this backend and jax, at each sweep "
                         "budget of --models, the plan of auto(b, monotone=RULE) measured "
                         "the same way (default rule: larger)")
    ap.add_argument("--peak", action="store_true",
                    help="add to the stored results of this backend and jax, for each of "
                         "--models, auto(b, objective=peak) at 10 peak budgets: XLA's "
                         "footprint of the joint and split forms")
    ap.add_argument("--compiled", action="store_true",
                    help="with --peak: at each budget also auto(b, objective=peak, "
                         "score=xla), which weighs its trial plans by XLA's footprint of "
                         "each compiled")
    args = ap.parse_args(argv)
    if args.merge_from:
        name, data, parts = _parts_and_stored(ap, args.merge_from)
        for part in parts:
            data = xla_memory.merge(data, part, _log)
        models = sorted({r["model"] for p in parts for r in p["rows"]})
        _log(f"merged {len(parts)} part(s): {', '.join(models)}")
        _write_and_check(name, data)
        return
    for given, merge in ((args.merge_monotone_from, xla_memory.merge_monotone),
                         (args.merge_peak_from, xla_memory.merge_peak)):
        if not given:
            continue
        name, data, parts = _parts_and_stored(ap, given)
        if data is None:
            ap.error(f"no stored results {name}.json to add the sweeps to")
        try:
            for part in parts:
                data = merge(data, part)
        except ValueError as e:
            ap.error(str(e))
        _write_and_check(name, data)
        return
    if args.re_estimate:
        name = xla_memory.results_name(args.re_estimate)
        stored = common.read_json(name)
        if stored is None:
            ap.error(f"no stored results {name}.json to re-estimate")
        _log(f"wrote {common.write_json(name, xla_memory.reestimate(stored, _log))}")
        return
    keys = [k.strip() for k in args.models.split(",") if k.strip()]
    unknown = [k for k in keys if k not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {', '.join(MODELS)}")
    if args.monotone and args.peak:
        ap.error("--monotone and --peak are separate runs: give one")
    if args.compiled and not args.peak:
        ap.error("--compiled goes with --peak")
    if args.monotone or args.peak:
        from tools.benchmarks import ynn_probe
        ynn_probe.turn_off()      # (as the stored sweeps were measured; before XLA starts)
        import jax
        name = xla_memory.results_name(jax.default_backend())
        stored = common.read_json(name)
        if stored is None:
            ap.error(f"no stored results {name}.json to add the sweeps to")
        _write_and_check(name, xla_memory.measure_peak(stored, keys, _log, args.compiled)
                         if args.peak
                         else xla_memory.measure_monotone(stored, keys, args.monotone, _log))
        return
    # XLA:CPU's YNNPACK fusions hide their buffers from memory_analysis(): measure without
    # them (set before XLA's CPU client starts; `ynn_probe` shows what they hide)
    from tools.benchmarks import ynn_probe
    ynn_off = ynn_probe.turn_off()
    data = xla_memory.measure(keys, _log)
    backend = data["meta"]["backend"]     # a device's run has its own file (and page section)
    data["meta"]["xla_flags"] = os.environ.get("XLA_FLAGS", "")
    if ynn_off and backend == "cpu":
        _log("xla: what memory_analysis() misses inside YNNPACK fusions")
        data["ynn_probe"] = ynn_probe.probe()
    name = xla_memory.results_name(backend)
    if args.merge:
        data = xla_memory.merge(common.read_json(name), data, _log)
    _log(f"wrote {common.write_json(name, data)}")
    _failed(xla_memory.checks(data))


def run_startup(argv) -> None:
    from tools.benchmarks import common, startup
    ap = argparse.ArgumentParser(prog="python -m tools.benchmarks startup")
    ap.add_argument("--repeat", type=int, default=15, help="rounds (default 15)")
    args = ap.parse_args(argv)
    _log(f"wrote {common.write_json('startup', startup.measure(args.repeat, _log))}")


def run_dispatch(argv) -> None:
    from tools.benchmarks import common, dispatch
    ap = argparse.ArgumentParser(prog="python -m tools.benchmarks dispatch",
                                 description=dispatch.__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15, help="rounds (default 15)")
    args = ap.parse_args(argv)
    data = dispatch.measure(args.rounds, _log)
    _log(f"wrote {common.write_json('dispatch', data)}")
    _failed(dispatch.checks(data))


def run_train(argv) -> None:
    from tools.benchmarks import common, train
    ap = argparse.ArgumentParser(prog="python -m tools.benchmarks train")
    ap.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    args = ap.parse_args(argv)
    _log(f"wrote {common.write_json('train', train.measure(args.steps, _log))}")


def run_libraries(argv) -> None:
    from tools.benchmarks import common, libraries
    ap = argparse.ArgumentParser(prog="python -m tools.benchmarks libraries",
                                 description=libraries.__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    args = ap.parse_args(argv)
    data = libraries.measure(args.steps, _log)
    _log(f"wrote {common.write_json('libraries', data)}")
    _failed(libraries.checks(data))


def run_gpu(argv) -> None:
    from tools.benchmarks import gpu
    from tools.benchmarks.models import MODELS
    ap = argparse.ArgumentParser(prog="python -m tools.benchmarks gpu",
                                 description=gpu.__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated model keys")
    ap.add_argument("--only", default=None,
                    help="comma-separated short policy labels (none, nothing, dots, ...)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    ap.add_argument("--time-limit", type=float, default=540.0,
                    help="stop after this many seconds; run again to resume (default 540)")
    ap.add_argument("--out", default=None, help="results file (default results/gpu.json)")
    ap.add_argument("--dry-run", action="store_true",
                    help="a tiny MLP on whatever backend: checks the harness")
    ap.add_argument("--retry-failed", action="store_true",
                    help="measure again the runs the results file records as failed")
    args = ap.parse_args(argv)
    data = gpu.measure(args.models.split(","), args.only.split(",") if args.only else None,
                       args.steps, args.out, args.time_limit, _log, args.dry_run,
                       args.retry_failed)
    _log(f"gpu: {len(data['rows'])} rows, {'complete' if data.get('complete') else 'incomplete'}")


def run_barriers(argv) -> None:
    from tools.benchmarks import barriers
    from tools.benchmarks.models import MODELS
    ap = argparse.ArgumentParser(prog="python -m tools.benchmarks barriers",
                                 description=barriers.__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated model keys")
    ap.add_argument("--time-limit", type=float, default=540.0,
                    help="stop after this many seconds; run again to resume (default 540)")
    ap.add_argument("--out", default=None, help="results file")
    ap.add_argument("--dry-run", action="store_true",
                    help="a tiny MLP on whatever backend: checks the harness")
    ap.add_argument("--fence-chains", choices=("on", "off"), default=None,
                    help="rp.jit's fence_chains forced on or off (default: rp.jit's default "
                    "for the backend); with --out another file")
    args = ap.parse_args(argv)
    fence = None if args.fence_chains is None else args.fence_chains == "on"
    data = barriers.measure(args.models.split(","), args.out, args.time_limit, _log,
                            args.dry_run, fence)
    _failed(barriers.checks(data))


def run_zoo(argv) -> None:
    from tools.benchmarks import common, zoo
    ap = argparse.ArgumentParser(prog="python -m tools.benchmarks zoo",
                                 description=zoo.__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(zoo.MODELS),
                    help=f"comma-separated subset of {','.join(zoo.MODELS)}")
    args = ap.parse_args(argv)
    keys = [k.strip() for k in args.models.split(",") if k.strip()]
    unknown = [k for k in keys if k not in zoo.MODELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {', '.join(zoo.MODELS)}")
    # as the xla benchmark does: XLA:CPU's YNNPACK fusions hide their buffers from
    # memory_analysis(), so the footprints and temp bytes are taken without them
    from tools.benchmarks import ynn_probe
    ynn_probe.turn_off()
    new = zoo.measure(keys, _log)
    for m in new["models"].values():
        m["xla_flags"] = os.environ.get("XLA_FLAGS", "")
    data = zoo.merge(common.read_json("zoo"), new)
    _log(f"wrote {common.write_json('zoo', data)}")


def run_scans(argv) -> None:
    from tools.benchmarks import common, scans
    argparse.ArgumentParser(prog="python -m tools.benchmarks scans",
                            description=scans.__doc__.split("\n\n")[0]).parse_args(argv)
    data = scans.measure(log=_log)
    _log(f"wrote {common.write_json('scans', data)}")
    _failed(scans.checks(data))


def main(argv: list[str]) -> int:
    commands = ("models", "budgets", "scaling", "memory", "xla", "startup", "dispatch",
                "train", "libraries", "gpu", "barriers", "zoo", "scans", "render", "all")
    if not argv or argv[0] not in commands:
        print(__doc__, file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    if command in ("models", "all"):
        run_models(rest if command == "models" else [])
    if command in ("budgets", "all"):
        run_budgets(rest if command == "budgets" else [])
    if command in ("scaling", "all"):
        from tools.benchmarks import scaling
        scaling.main(rest if command == "scaling" else [])
    if command in ("memory", "all"):
        run_memory(rest if command == "memory" else [])
    if command in ("xla", "all"):
        run_xla(rest if command == "xla" else [])
    if command in ("startup", "all"):
        run_startup(rest if command == "startup" else [])
    if command in ("dispatch", "all"):
        run_dispatch(rest if command == "dispatch" else [])
    if command in ("train", "all"):
        run_train(rest if command == "train" else [])
    if command in ("libraries", "all"):
        run_libraries(rest if command == "libraries" else [])
    if command in ("scans", "all"):
        run_scans(rest if command == "scans" else [])
    if command == "gpu":          # (not part of `all`: it is for the device machine)
        run_gpu(rest)
    if command == "barriers":     # (not part of `all`: it is for the device machine)
        run_barriers(rest)
    if command == "zoo":          # (not part of `all`: it installs other libraries)
        run_zoo(rest)
    if command in ("render", "all"):
        from tools.benchmarks import render
        render.render()
        _log(f"wrote {render.PAGE}")
    else:
        _log("docs/benchmarks.md is rebuilt from the results by: python -m tools.benchmarks render")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
