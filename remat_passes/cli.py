"""remat-opt: an mlir-opt-style driver for the remat_passes pipeline.

    remat-opt in.mlir --pass-pipeline='builtin.module(inline,remat-partial-eval{policy=dots_saveable})'
    remat-opt in.mlir --remat-partial-eval='policy=nothing_saveable mode=split' -o out.mlir
    remat-opt in.mlir --print-saved-residuals --remat-partial-eval='policy=dots_saveable'

User errors (bad MLIR, unknown passes or options, failed verification,
missing files) print a message naming the problem and where it is, exit 1,
and write no output file.
"""
from __future__ import annotations

import argparse
import difflib
import os
import sys

# jaxlib's C++ logs its device count at INFO once our MLIR context exists; a command-line
# tool should not print that (read when the library starts: set before it is loaded)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

from remat_passes import __version__, jax_compat
from remat_passes.core.residuals import residual_bytes_text
from remat_passes.cost.memory import BACKENDS, estimate_memory
from remat_passes.cost.memory_report import format_memory
from remat_passes.cost.xla_buffers import model_line
from remat_passes.ir import mlir
from remat_passes.ir.mlir import RematError
from remat_passes.jax.module import Module, compiled_cost, compiled_memory, write_atomically
from remat_passes.passes import diagnostics
from remat_passes.passes.base import PassState
from remat_passes.passes.manager import make_pass, parse_options, parse_pipeline, run_pipeline
from remat_passes.passes.registry import CORE_PASSES, registry

SPLIT_MARKER = "// -----"


class _PassFlag(argparse.Action):
    """`--<pass-name>[=options]`: append the pass to the pipeline, in command-line order."""

    def __call__(self, parser, namespace, values, option_string=None):
        steps = getattr(namespace, "pass_flags", None) or []
        steps.append((self.dest.replace("_", "-"), parse_options(values or "")))
        namespace.pass_flags = steps


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message):
        if message.startswith("unrecognized arguments:"):
            flags = [o for a in self._actions for o in a.option_strings]
            hints = []
            for arg in message.split(":", 1)[1].split():
                close = difflib.get_close_matches(arg.split("=", 1)[0], flags, n=3)
                if close:
                    hints.append(f"{arg}: did you mean {', '.join(close)}?")
            if hints:
                message += " (" + "; ".join(hints) + ")"
        sys.stderr.write(f"remat-opt: error: {message}\n")
        sys.stderr.write("(see remat-opt --help)\n")
        sys.exit(1)


AUTO_REMARK = "auto recomputes "
SHOWN_AUTO_REMARKS = 5


def _remarks(remarks: list, every: bool) -> list:
    """The remarks to print: under auto, one per recomputed value would be hundreds of lines
    on a real model; the first few and a count, unless --all-remarks."""
    per_value = [r for r in remarks if r.startswith(AUTO_REMARK)]
    if every or len(per_value) <= SHOWN_AUTO_REMARKS:
        return list(remarks)
    out, shown = [], 0
    for r in remarks:
        if r.startswith(AUTO_REMARK):
            shown += 1
            if shown > SHOWN_AUTO_REMARKS:
                continue
        out.append(r)
    out.append(f"... and {len(per_value) - SHOWN_AUTO_REMARKS} more values auto recomputes "
               "(--all-remarks lists them)")
    return out


def _policies_help() -> str:
    import textwrap

    from remat_passes.policy.policies import POLICIES
    names = textwrap.fill("policies (policy=..., region-policy=...): " + ", ".join(POLICIES) + ".",
                          width=88, subsequent_indent="  ")
    return (names + "\n"
            "  Names take bare words: save_only_these_names(a,b); policies nest:\n"
            "  save_from_both_policies(dots_saveable,save_only_these_names(a)).\n"
            "  auto(BUDGET[, offload=pinned_host][, device=cpu|h100|...][, objective=peak]\n"
            "       [, monotone=larger|smaller][, check=false][, ties=peak|later|earlier|none])\n"
            "  plans the cheapest recomputation within BUDGET: bytes (1000000), with a unit\n"
            "  (512MiB, 2GiB, 1.5GB) or a percentage of what no remat keeps (50%).\n"
            "  e.g. remat-opt model.mlir --remat='policy=auto(12MiB) mode=split'")


def build_parser() -> argparse.ArgumentParser:
    p = _ArgumentParser(
        prog="remat-opt", allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_policies_help(),
        description="Rematerialization (gradient checkpointing) passes over StableHLO, "
                    "mlir-opt style. Input: MLIR text or bytecode, a StableHLO portable "
                    "artifact, or a serialized jax.export.Exported.")
    p.add_argument("input", nargs="?", default="-", help="input file, or - for stdin (default)")
    p.add_argument("-o", dest="output", default="-", help="output file (default: stdout)")
    p.add_argument("--pass-pipeline", help="MLIR pipeline, e.g. 'builtin.module(inline,cse)'")
    p.add_argument("--split-input-file", action="store_true",
                   help="split the input at '// -----' lines and process each part on its own")
    p.add_argument("--verify-each", default="true", choices=["true", "false"],
                   help="run the verifier after each pass (default: true)")
    p.add_argument("--mlir-print-ir-before-all", action="store_true",
                   help="print the IR before each pass (to stderr)")
    p.add_argument("--mlir-print-ir-after-all", action="store_true",
                   help="print the IR after each pass (to stderr)")
    p.add_argument("--mlir-print-debuginfo", action="store_true",
                   help="print locations in the output")
    p.add_argument("--emit-bytecode", action="store_true", help="write MLIR bytecode")
    p.add_argument("--emit-exported", action="store_true",
                   help="write @main as a serialized jax.export.Exported; an input that was "
                        "one keeps its calling convention (pytrees), others get a flat one")
    p.add_argument("--print-saved-residuals", action="store_true",
                   help="print the residuals each remat-partial-eval saves, one per line as "
                        "JAX prints them (runs remat-partial-eval with its defaults if the "
                        "pipeline has none); the module goes to -o only")
    p.add_argument("--verify-diagnostics", action="store_true",
                   help="check the errors and remarks against the input's expected-error / "
                        "expected-remark comments (as mlir-opt does)")
    p.add_argument("--all-remarks", action="store_true",
                   help="print every remark (by default auto's per-value remarks are cut to "
                        f"the first {SHOWN_AUTO_REMARKS} and a count)")
    p.add_argument("--print-memory", action="store_true",
                   help="print a static peak-live-bytes estimate of each public function after "
                        "the pipeline, one line per function (the module goes to -o only)")
    p.add_argument("--memory-model", choices=("program-order", "xla"), default="program-order",
                   help="the model of --print-memory: program order with no reuse (default), "
                        "or what XLA's buffer assignment does on the platform JAX runs on (kept "
                        "arguments, fusion, in-place ops, copies of returned arguments)")
    p.add_argument("--memory-backend", choices=BACKENDS,
                   help="the XLA backend --memory-model=xla models (default: the platform JAX "
                        "runs on, as for --pareto-device), so a GPU's memory can be estimated "
                        "on a machine without one")
    p.add_argument("--print-pareto", action="store_true",
                   help="print, for a sweep of memory budgets, what auto(budget=...) keeps "
                        "and recomputes (residual bytes, extra FLOPs, joint peak, solve time) "
                        "after the pipeline; the module goes to -o only")
    p.add_argument("--pareto-points", type=int, default=20, metavar="N",
                   help="budgets in the --print-pareto sweep, from the minimum to no remat "
                        "(default 20)")
    p.add_argument("--pareto-offload", choices=["pinned_host", "unpinned_host"],
                   help="let the --print-pareto plans offload to this memory")
    p.add_argument("--pareto-device", metavar="PROFILE",
                   help="cost profile of the --print-pareto plans: cpu, h100, tpu-v5e, flops "
                        "(default: the platform JAX runs on, found without starting it: "
                        "JAX_PLATFORMS, else an installed GPU or TPU plugin, else cpu)")
    p.add_argument("--pareto-monotone", nargs="?", const="larger", default="",
                   choices=["larger", "smaller"],
                   help="plan the --print-pareto budgets with auto(..., monotone=RULE): a "
                        "budget whose plan would peak above a larger budget's takes that "
                        "larger budget's plan (larger, the default) or the cheapest smaller "
                        "budget's plan that peaks no higher (smaller)")
    p.add_argument("--pareto-round-exact", choices=["true", "false"], default="true",
                   help="false: plan, build and count the --print-pareto plans without "
                        "roundings of f32/f64 residuals (as rp.jit builds on XLA:CPU; "
                        "insert-reduce-precision{round-exact=false}); default true, as "
                        "jax.checkpoint rounds them")
    p.add_argument("--list-passes", action="store_true", help="list the passes and their options")
    p.add_argument("--version", action="version", version=f"remat-opt {__version__}")
    group = p.add_argument_group("passes (run in command-line order)")
    for name, pass_ in registry().items():
        group.add_argument(f"--{name}", dest=name.replace("-", "_"), action=_PassFlag,
                           nargs="?", const="", metavar="OPTIONS", help=pass_.summary)
    for name, (_, summary) in CORE_PASSES.items():
        group.add_argument(f"--{name}", dest=name.replace("-", "_"), action=_PassFlag,
                           nargs="?", const="", metavar="OPTIONS", help=summary)
    return p


def list_passes() -> str:
    lines = ["Passes of remat_passes:"]
    for name, pass_ in sorted(registry().items()):
        lines.append(f"  {name:28s} {pass_.summary}")
        for f in pass_.option_fields():
            default = "" if f.default is None else \
                f" (default: {getattr(f.default, 'spec', f.default)})"
            lines.append(f"      {pass_.option_name(f):24s} {f.metadata['help']}{default}")
    lines.append("Core MLIR passes (from jaxlib):")
    for name, (_, summary) in sorted(CORE_PASSES.items()):
        lines.append(f"  {name:28s} {summary}")
    return "\n".join(lines) + "\n"


def _read_input(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise RematError(f"error: cannot read '{path}': {e.strerror}") from None


def _chunks(data: bytes, split: bool) -> list[bytes]:
    """Split at '// -----' lines; pad with newlines so errors keep their line numbers. A
    binary input (bytecode, a serialized Exported) is one chunk: only text is split."""
    if not split or mlir.is_binary(data):
        return [data]
    text = data.decode("utf-8", errors="replace")
    chunks, cur, line_no, start = [], [], 0, 0
    for line in text.splitlines(keepends=True):
        if line.startswith(SPLIT_MARKER):
            chunks.append("\n" * start + "".join(cur))
            cur, start = [], line_no + 1
        else:
            cur.append(line)
        line_no += 1
    chunks.append("\n" * start + "".join(cur))
    return [c.encode() for c in chunks]


def _process(data: bytes, steps: list, args, filename: str, remarks_to=None) -> tuple[bytes, str]:
    """Run the steps on one input; `remarks_to`: a list that takes the remarks instead of
    printing them (--verify-diagnostics)."""
    module = Module.parse(data, filename=filename, allow_empty=True)
    state = PassState(filename=filename)
    state.compiled_cost = compiled_cost
    state.compiled_memory = compiled_memory
    run_pipeline(module.op, steps, state,
                 verify_each=args.verify_each == "true",
                 print_before=args.mlir_print_ir_before_all,
                 print_after=args.mlir_print_ir_after_all)
    report = ""
    if args.print_memory:
        backend = None
        if args.memory_model == "xla":
            backend = args.memory_backend
            if backend is None:
                backend = jax_compat.platform_in_use()
            report += model_line(backend) + "\n"
        estimate = estimate_memory(module.op, dim_symbols=state.dim_symbols,
                                   model=args.memory_model, backend=backend)
        report += format_memory(estimate, peak_values=True) + "\n"
    if args.print_pareto:
        from remat_passes.api.sweeps import format_pareto, pareto
        from remat_passes.cost.devices import PROFILES
        if args.pareto_device is not None and args.pareto_device not in PROFILES:
            raise RematError(f"error: unknown --pareto-device '{args.pareto_device}'; known: "
                             f"{', '.join(PROFILES)}")
        if args.pareto_points < 1:
            raise RematError("error: --pareto-points must be at least 1")
        points = pareto(module, points=args.pareto_points, offload=args.pareto_offload,
                        device=args.pareto_device, monotone=args.pareto_monotone,
                        round_exact=args.pareto_round_exact == "true")
        report += format_pareto(points) + "\n"
    if remarks_to is not None:
        remarks_to.extend(state.remarks)
    if args.print_saved_residuals:
        for fname, residuals in state.residuals.items():
            count = f"{len(residuals)} value" + ("" if len(residuals) == 1 else "s")
            report += f"// saved residuals of @{fname}: {count}, " \
                      f"{residual_bytes_text(residuals)}\n"
            report += "".join(f"{r}\n" for r in residuals)
        if remarks_to is None:
            report += "".join(f"// remark: {text}\n"
                              for text in _remarks(state.remarks, args.all_remarks))
    elif remarks_to is None:   # (the saved-residuals report carries them; else to stderr)
        sys.stderr.write("".join(f"remat-opt: remark: {text}\n"
                                 for text in _remarks(state.remarks, args.all_remarks)))
    out = module.bytecode() if args.emit_bytecode else \
        module.serialize_exported() if args.emit_exported else \
        module.text(debug_info=args.mlir_print_debuginfo).encode()
    return out, report


def run(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.list_passes:
        sys.stdout.write(list_passes())
        return 0
    flags = getattr(args, "pass_flags", None) or []
    if args.pass_pipeline and flags:
        raise RematError("error: use either --pass-pipeline or per-pass flags, not both")
    steps = parse_pipeline(args.pass_pipeline) if args.pass_pipeline else \
        [make_pass(name, options) for name, options in flags]
    if args.print_saved_residuals and not any(s.name in ("remat-partial-eval", "remat")
                                              for s in steps):
        steps = [make_pass("inline", {}), make_pass("remat-partial-eval", {})] + steps
    binary = "--emit-bytecode" if args.emit_bytecode else \
        "--emit-exported" if args.emit_exported else None
    if args.emit_bytecode and args.emit_exported:
        raise RematError("error: use either --emit-bytecode or --emit-exported, not both")
    if binary and args.split_input_file:
        raise RematError(f"error: {binary} cannot be combined with --split-input-file")
    if args.memory_backend and not (args.print_memory and args.memory_model == "xla"):
        raise RematError("error: --memory-backend chooses what --print-memory "
                         "--memory-model=xla models; give those too")
    filename = "<stdin>" if args.input == "-" else args.input
    data = _read_input(args.input)
    outputs, reports, errors = [], [], []
    for chunk in _chunks(data, args.split_input_file):
        remarks = [] if args.verify_diagnostics else None
        produced = []
        try:
            out, report = _process(chunk, steps, args, filename, remarks)
            outputs.append(out)
            reports.append(report)
        except RematError as e:
            located = RematError(e.located(filename))
            if args.verify_diagnostics:
                produced.append(diagnostics.of_error(str(located)))
            elif not args.split_input_file:
                raise located from None
            else:
                errors.append(_format_error(located))
        if args.verify_diagnostics:
            produced += [diagnostics.of_remark(r) for r in remarks]
            expected = diagnostics.expectations(chunk.decode("utf-8", errors="replace"))
            errors += diagnostics.check(expected, produced, filename)
    if errors:
        sys.stderr.write("\n".join(errors) + "\n")
        return 1
    joiner = f"\n{SPLIT_MARKER}\n".encode()
    result = outputs[0] if binary else joiner.join(o.rstrip(b"\n") for o in outputs) + b"\n"
    if args.print_saved_residuals or args.print_memory or args.print_pareto:
        sys.stdout.write(f"{SPLIT_MARKER}\n".join(reports))
        if args.output != "-":
            write_atomically(args.output, result)
        return 0
    if args.output == "-":
        sys.stdout.buffer.write(result)
    else:
        write_atomically(args.output, result)
    return 0


def _format_error(e: RematError) -> str:
    """'FILE:LINE:COL: error: ...' as is (as mlir-opt prints it); others get our name."""
    msg = str(e)
    return f"remat-opt: {msg}" if msg.startswith("error:") else msg


def main(argv: list[str] | None = None) -> int:
    try:
        code = run(sys.argv[1:] if argv is None else argv)
        sys.stdout.flush()
    except RematError as e:
        sys.stderr.write(_format_error(e) + "\n")
        code = 1
    except KeyboardInterrupt:
        sys.stderr.write("remat-opt: interrupted\n")
        code = 130
    except RuntimeError as e:   # the MLIR bindings, on a string attribute that is not UTF-8
        if "conversion error" not in str(e):
            raise
        sys.stderr.write("remat-opt: error: the module holds a string that is not valid UTF-8 "
                         "(a corrupt attribute or name)\n")
        code = 1
    except OSError as e:        # writing the output: a full disk, a closed pipe
        _silence_stdout()
        sys.stderr.write(f"remat-opt: error: cannot write the output: {e.strerror or e}\n")
        code = 1
    return code


def _silence_stdout() -> None:
    """After a failed write to stdout, point it at /dev/null so that the interpreter's own
    flush at exit does not fail (and print) again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
