"""The package's shape: no import cycle (function-local imports included), small modules,
a short root. Read from the source with `ast`; nothing is imported.

An edge A -> B is any `import B` / `from B import x` in A, at any depth of A's code;
`from P import m` where P.m is a module is an edge to P.m (not to P's `__init__`).
"""
from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "remat_passes"
MAX_LINES = 700
MAX_ROOT_MODULES = 10


def modules(root: pathlib.Path = PACKAGE) -> dict[str, pathlib.Path]:
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_graph(mods: dict[str, pathlib.Path]) -> dict[str, dict[str, int]]:
    """module -> {imported module: line of the first import}."""
    graph: dict[str, dict[str, int]] = {}
    for name, path in mods.items():
        is_package = path.name == "__init__.py"
        edges = graph.setdefault(name, {})
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = name.split(".")
                    if not is_package:
                        parent.pop()
                    parent = parent[:len(parent) - (node.level - 1)]
                    base = ".".join(parent + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                           for a in node.names]
            for t in targets:
                if t in mods and t != name:
                    edges.setdefault(t, node.lineno)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def describe(component: list[str], graph, mods) -> str:
    inside = set(component)
    lines = [f"import cycle of {len(component)} modules:"]
    for a in component:
        for b, line in sorted(graph[a].items()):
            if b in inside:
                lines.append(f"  {mods[a].relative_to(PACKAGE.parent)}:{line} imports {b}")
    return "\n".join(lines)


def test_no_import_cycle():
    mods = modules()
    graph = import_graph(mods)
    found = cycles(graph)
    assert not found, "\n".join(describe(c, graph, mods) for c in found)


def test_cycle_finder_finds_a_function_local_cycle(tmp_path):
    """The check above can fail: a back edge hidden in a function is found."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from pkg import a\n")
    (pkg / "c.py").write_text("from pkg import a\n")
    mods = modules(pkg)
    assert cycles(import_graph(mods)) == [["pkg.a", "pkg.sub.b"]]


def test_packages_have_no_cycle_either():
    """Packages (the first level below remat_passes; a module at the root is one on its
    own) import each other in one direction: a layered whole."""
    mods = modules()
    graph = import_graph(mods)

    def package(m):
        return ".".join(m.split(".")[:2])
    packages: dict[str, dict[str, int]] = {}
    for a, edges in graph.items():
        for b, line in edges.items():
            pa, pb = package(a), package(b)
            packages.setdefault(pb, {})
            if pa != pb:
                packages.setdefault(pa, {}).setdefault(pb, line)
    assert not cycles(packages), [
        sorted((a, b) for a in c for b in packages[a] if b in c) for c in cycles(packages)]


@pytest.mark.parametrize("name", sorted(modules()))
def test_module_is_short(name):
    lines = len(modules()[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name}: {lines} lines (at most {MAX_LINES})"


def test_root_is_a_table_of_contents():
    root = [p.name for p in PACKAGE.glob("*.py")]
    assert len(root) <= MAX_ROOT_MODULES, sorted(root)
