"""The user documentation (docs/*.md) runs as written and says what the code does.

Conventions the docs follow (and this file enforces):

* Every ```python block runs, in document order, in one namespace per
  document, in a fresh working directory. A document's python blocks are
  compiled as one file, `tutorial.py` for the tutorial and `example.py` for
  the others, with line numbers counted through the blocks in order: source
  positions in printed residuals (`from tutorial.py:12:11 (g)`) are those a
  reader gets by saving the snippets, in order, under that name.
* Every ```sh block runs with bash in the same working directory, with
  `remat-opt` on PATH and JAX_PLATFORMS=cpu; stdout and stderr are taken
  together. The sh blocks between two python (or file) blocks run
  concurrently, so a sh block may use files that earlier python and file
  blocks wrote, or that it writes itself, but not those of another sh block.
  A sh block made only of plain `remat-opt ...` command lines (no pipes,
  redirections, `;` or variables) runs those commands in this process, through
  the same `remat_passes.cli.main` as the console script: starting Python and
  importing JAX for each one would be most of the run time.
* A ```text or ```mlir block that directly follows a python or sh block (only
  blank lines in between) is that block's expected output. Lines are compared
  after stripping trailing blanks; a line `...` in the expected text stands
  for any number of lines.
* `<!-- file: NAME -->` on the line before a block writes the block to NAME
  in the working directory instead of running it (inputs for sh blocks).
* `<!-- no-run -->` before a block leaves it alone.

Run with REMAT_DOCS_UPDATE=1 to rewrite expected outputs that do not match
(blocks without `...` lines only) after a deliberate change.

Reference checks: every pass of `remat_passes.passes.registry()` is documented
in docs/passes.md with exactly its options and has a lit test; every flag
named in docs/cli.md is in `remat-opt --help` and every flag of `--help` is
documented; every policy of `remat_passes.policy.policies.POLICIES` is documented in
docs/policies.md, and every policy spec written there parses.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import remat_passes as rp
from remat_passes.passes.registry import CORE_PASSES, registry
from remat_passes.policy.policies import POLICIES, Policy, parse_policy

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
LIT = ROOT / "test" / "lit"
UPDATE = os.environ.get("REMAT_DOCS_UPDATE") == "1"
RUN_DOCS = ["tutorial.md", "passes.md", "cli.md", "policies.md"]
OUTPUT_LANGS = ("text", "mlir")
RUNNABLE_LANGS = ("python", "sh")

FENCE_RE = re.compile(r"^```([\w-]*)\s*$")
DIRECTIVE_RE = re.compile(r"^<!--\s*(file:\s*(?P<file>\S+)|(?P<norun>no-run))\s*-->\s*$")


# ------------------------------------------------------------ markdown --
@dataclasses.dataclass
class Block:
    lang: str
    text: str
    first: int            # 0-based index of the first content line
    last: int             # 0-based index of the closing fence
    file: str | None = None
    no_run: bool = False
    output: "Block | None" = None   # the expected-output block that follows


def read_blocks(path: Path) -> tuple[list[str], list[Block]]:
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    prev_block_end = None  # index after the closing fence of the previous block
    while i < len(lines):
        m = FENCE_RE.match(lines[i])
        if not m or not m.group(1):
            i += 1
            continue
        lang = m.group(1)
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        if j == len(lines):
            raise AssertionError(f"{path.name}:{i + 1}: unclosed code block")
        block = Block(lang, "\n".join(lines[i + 1:j]) + "\n", i + 1, j)
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        d = DIRECTIVE_RE.match(lines[k]) if k >= 0 else None
        if d:
            block.file = d.group("file")
            block.no_run = bool(d.group("norun"))
        between_blank = prev_block_end is not None and \
            all(not line.strip() for line in lines[prev_block_end:i])
        prev = blocks[-1] if blocks else None
        if (lang in OUTPUT_LANGS and not d and between_blank and prev is not None
                and prev.lang in RUNNABLE_LANGS and prev.file is None and not prev.no_run):
            prev.output = block
        blocks.append(block)
        prev_block_end = j + 1
        i = j + 1
    return lines, blocks


def inline_code(text: str) -> list[str]:
    """The `inline code` spans of markdown text, code blocks excluded."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.findall(r"`([^`\n]+)`", text)


# ------------------------------------------------------------- outputs --
def _norm(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    return lines


def output_matches(expected: str, actual: str) -> bool:
    """Line-wise equality; an expected line '...' matches any number of lines."""
    exp, act = _norm(expected), _norm(actual)
    if "..." not in exp:
        return exp == act
    chunks, cur = [], []
    for line in exp:
        if line == "...":
            chunks.append(cur)
            cur = []
        else:
            cur.append(line)
    chunks.append(cur)
    pos = 0
    for n, chunk in enumerate(chunks):
        if not chunk:
            continue
        if n == 0:  # anchored at the start
            if act[:len(chunk)] != chunk:
                return False
            pos = len(chunk)
            continue
        last = n == len(chunks) - 1
        found = None
        for start in range(pos, len(act) - len(chunk) + 1):
            if act[start:start + len(chunk)] == chunk:
                found = start
                if not last:
                    break
        if found is None:
            return False
        if last and found + len(chunk) != len(act):
            return False
        pos = found + len(chunk)
    return True


def _env() -> dict:
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["JAX_PLATFORMS"] = "cpu"
    env.setdefault("COLUMNS", "100")
    return env


def plain_remat_opt_commands(script: str) -> list[list[str]] | None:
    """The argument lists of a sh block made only of plain `remat-opt ...` lines (no
    pipes, redirections, `;`, variables or stdin input), else None."""
    argvs = []
    for line in script.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        unquoted = re.sub(r"'[^']*'|\"[^\"]*\"", "", line)
        if any(c in unquoted for c in "|;&<>$`\\"):
            return None
        argv = shlex.split(line)
        if argv[0] != "remat-opt" or "-" in argv[1:]:
            return None
        argvs.append(argv[1:])
    return argvs or None


def run_remat_opt_in_process(argv: list[str]) -> str:
    """What `remat-opt ARGV` prints (stdout and stderr together), run in this process.

    The same `remat_passes.cli.main` as the console script; it saves starting a
    Python (and importing JAX) for each command, which is most of the run time."""
    from remat_passes import cli
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="utf-8", write_through=True)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            cli.main(argv)
        except SystemExit:  # argparse: --help, --version, usage errors
            pass
    out.flush()
    return raw.getvalue().decode("utf-8")


def run_document(name: str, workdir: Path) -> None:
    path = DOCS / name
    lines, blocks = read_blocks(path)
    filename = "tutorial.py" if name == "tutorial.md" else "example.py"
    namespace = {"__name__": "__docs__"}
    py_lines = 0
    failures, updates = [], []
    running = []  # (block, Popen) of sh blocks still running

    def check(block, actual):
        where = f"docs/{name}:{block.first}"
        if block.lang == "sh" and "Traceback" in actual:
            failures.append(f"{where}: a Python traceback:\n{actual}")
            return
        if block.output is None:
            return
        if not output_matches(block.output.text, actual):
            if UPDATE and "..." not in _norm(block.output.text):
                updates.append((block.output, actual))
            else:
                failures.append(
                    f"{where}: output differs from the block at docs/{name}:"
                    f"{block.output.first}\n--- expected\n{block.output.text}"
                    f"--- actual\n{actual}")

    def wait_for_sh():
        for block, proc in running:
            out, _ = proc.communicate(timeout=300)
            check(block, out)
        running.clear()

    old_cwd = os.getcwd()
    os.chdir(workdir)
    try:
        for block in blocks:
            if block.no_run:
                continue
            if block.file:
                wait_for_sh()
                (workdir / block.file).write_text(block.text)
            elif block.lang == "python":
                wait_for_sh()
                code = compile("\n" * py_lines + block.text, filename, "exec")
                py_lines += block.text.count("\n")
                buf = io.StringIO()
                try:
                    with contextlib.redirect_stdout(buf):
                        exec(code, namespace)
                except Exception as e:
                    raise AssertionError(f"docs/{name}:{block.first}: the python block raised "
                                         f"{type(e).__name__}: {e}") from e
                check(block, buf.getvalue())
            elif block.lang == "sh":
                argvs = plain_remat_opt_commands(block.text)
                if argvs is not None:
                    wait_for_sh()
                    check(block, "".join(run_remat_opt_in_process(a) for a in argvs))
                    continue
                # sh blocks run concurrently with each other (each one may use what earlier
                # python and file blocks wrote, not what other sh blocks write).
                running.append((block, subprocess.Popen(
                    ["bash", "-c", block.text], cwd=workdir, env=_env(), text=True,
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)))
        wait_for_sh()
    finally:
        for _, proc in running:
            proc.kill()
        os.chdir(old_cwd)
    if updates:
        for out, actual in sorted(updates, key=lambda u: -u[0].first):
            lines[out.first:out.last] = _norm(actual)
        path.write_text("\n".join(lines) + "\n")
    assert not failures, "\n\n".join(failures)


@pytest.fixture
def jax_defaults():
    """JAX's default configuration, as a reader has it (conftest.py raises the
    default matmul precision for the numerics tests; that shows in printed IR)."""
    import jax
    saved = jax.config.jax_default_matmul_precision
    jax.config.update("jax_default_matmul_precision", None)
    try:
        yield
    finally:
        jax.config.update("jax_default_matmul_precision", saved)


@pytest.mark.parametrize("name", RUN_DOCS)
def test_document_runs_as_written(name, tmp_path, jax_defaults):
    run_document(name, tmp_path)


# -------------------------------------------------------------- passes --
def documented_passes() -> dict[str, set[str]]:
    """`## `pass`` sections of passes.md -> option names from their `| `opt` |` rows."""
    text = (DOCS / "passes.md").read_text()
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    sections = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"^## `([a-z-]+)`", line)
        if m:
            current = m.group(1)
            sections[current] = set()
            continue
        if line.startswith("## "):
            current = None
            continue
        m = re.match(r"^\|\s*`([a-z-]+)`", line)
        if current and m:
            sections[current].add(m.group(1))
    return sections


def test_every_pass_is_documented_with_its_options():
    documented = documented_passes()
    ours = registry()
    assert set(documented) == set(ours), \
        f"passes.md sections {sorted(documented)} vs registry {sorted(ours)}"
    for name, options in documented.items():
        registered = {ours[name].option_name(f) for f in ours[name].option_fields()}
        assert options == registered, \
            f"options of {name}: documented {sorted(options)}, registry {sorted(registered)}"


@pytest.mark.parametrize("name", sorted(registry()))
def test_every_documented_pass_has_a_lit_test(name):
    assert name in documented_passes()
    assert (LIT / f"{name}.mlir").is_file(), f"no lit test test/lit/{name}.mlir"


def test_pass_names_in_pipeline_examples_exist():
    """Every --pass-pipeline of the docs parses, and names known passes only."""
    known = set(registry()) | set(CORE_PASSES)
    found = 0
    for name in RUN_DOCS:
        for spec in re.findall(r"--pass-pipeline='([^']*)'", (DOCS / name).read_text()):
            if "canonicalise" in spec:
                continue  # the misspelt pass of an error example
            found += 1
            for step in rp.parse_pipeline(spec):
                assert step.name in known, (name, step.name)
    assert found


# ----------------------------------------------------------------- cli --
def _help_text() -> str:
    """What `remat-opt --help` prints (the same parser, without a subprocess)."""
    from remat_passes.cli import build_parser
    return build_parser().format_help()


def test_cli_flags_match_help():
    help_flags = set(re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", _help_text()))
    text = (DOCS / "cli.md").read_text()
    documented = set(re.findall(r"(?<![\w/-])(--[a-z][a-z0-9-]*)", text))
    # flags shown on purpose in an error example
    documented -= set(re.findall(r"unrecognized arguments: (--[a-z-]+)", text))
    missing = documented - help_flags
    assert not missing, f"flags in docs/cli.md that remat-opt --help does not list: {missing}"
    pass_flags = {f"--{n}" for n in list(registry()) + list(CORE_PASSES)}
    undocumented = {f for f in help_flags - pass_flags if f.startswith("--")} - documented
    assert not undocumented, f"flags of remat-opt --help missing from docs/cli.md: {undocumented}"
    for flag in ("-o", "-h"):
        assert f"`{flag}" in text, flag


def test_cli_pass_table_lists_each_pass_with_its_options():
    """docs/cli.md's table of pass flags: a row per pass, naming every option it takes (a
    pass named in the row stands for its own options: remat's "the options of
    `remat-partial-eval`")."""
    ours = registry()
    rows = re.findall(r"^\| `--([a-z-]+)(?:\[=OPTIONS\])?` \| \[`[a-z-]+`\]\([^)]*\)(.*)\|$",
                      (DOCS / "cli.md").read_text(), re.M)
    assert {name for name, _ in rows} == set(ours)
    for name, rest in rows:
        listed = set()
        for word in re.findall(r"`([a-z-]+)`", rest):
            listed |= {ours[word].option_name(f) for f in ours[word].option_fields()} \
                if word in ours else {word}
        registered = {ours[name].option_name(f) for f in ours[name].option_fields()}
        assert listed == registered, \
            f"docs/cli.md --{name}: lists {sorted(listed)}, takes {sorted(registered)}"


# ------------------------------------------------------------ policies --
def test_every_policy_is_documented():
    spans = set(inline_code((DOCS / "policies.md").read_text()))
    heads = {re.match(r"[\w.]*", s).group(0).rsplit(".", 1)[-1] for s in spans}
    missing = [name for name in POLICIES if name not in heads]
    assert not missing, f"policies not documented in docs/policies.md: {missing}"


def policy_specs() -> list[str]:
    specs = []
    for doc in ("policies.md", "cli.md", "tutorial.md", "passes.md"):
        for span in inline_code((DOCS / doc).read_text()):
            span = span.strip()
            if span.startswith("policy="):
                span = span[len("policy="):]
            m = re.fullmatch(r"([a-z_]+)(\(.*\))?", span)
            if not m or m.group(1) not in POLICIES:
                continue
            if m.group(2) is None and not isinstance(POLICIES[m.group(1)], Policy):
                continue  # a factory named without arguments
            specs.append(span)
    return sorted(set(specs))


def test_policy_specs_in_the_docs_parse():
    specs = policy_specs()
    assert len(specs) >= len(POLICIES), specs
    for spec in specs:
        parse_policy(spec)  # raises RematError on a bad spec


# --------------------------------------------------------------- links --
def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def test_links_between_the_docs_resolve():
    anchors = {}
    pages = sorted(p.name for p in DOCS.glob("*.md"))
    for doc in pages:
        text = re.sub(r"^```.*?^```", "", (DOCS / doc).read_text(), flags=re.S | re.M)
        anchors[doc] = {_slug(h) for h in re.findall(r"^#+ (.*)$", text, flags=re.M)}
    for doc in pages:
        text = re.sub(r"^```.*?^```", "", (DOCS / doc).read_text(), flags=re.S | re.M)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://")):
                continue
            page, _, anchor = target.partition("#")
            if page and not page.endswith(".md"):
                assert (DOCS / page).is_file(), f"docs/{doc}: no file {target}"
                continue
            page = page or doc
            assert page in anchors, f"docs/{doc}: link to unknown page {target}"
            if anchor:
                assert anchor in anchors[page], f"docs/{doc}: no heading for {target}"
