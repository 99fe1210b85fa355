"""The import graph of the project's packages, and what breaks its layering.

Reads every ``.py`` file of ``llmsched_gym/``, ``agents/`` and ``baselines/`` with :mod:`ast` (nothing
is imported) and records one edge per project module a file imports, wherever the import is:
module level, inside a function, under ``if TYPE_CHECKING``, a string literal handed to
``importlib.import_module("...")``, a dotted module name in a list or tuple of strings (modules
looped over by ``importlib``), and the imports of a script kept in a string (``python -c CODE``
children); running ``python -m MODULE`` in a child process is not an import. ``from X import Y`` points at ``X/Y.py`` when that is a module and
at ``X`` otherwise. Importing ``a.b.c`` also runs ``a/__init__.py`` and ``a/b/__init__.py``; those
implicit package edges are not counted (every file would otherwise depend on its package's
``__init__``); an explicit ``import a`` or ``from a import name`` is.

Prints, for the checkout given (default: this one)::

    python tools/import_graph.py [ROOT]

* the strongly connected components (SCCs) of the file graph with more than one file: the import
  circles; for each, a shortest circle through each edge that crosses folders;
* the edges that go *up* the layer order below (a lower layer importing a higher one);
* the largest files (lines) and functions (lines from ``def`` to the last line, methods named
  ``Class.method``), 15 each.

The layers, top to bottom (an import goes down or stays in its layer; nothing imports ``cli/``)::

    6 cli        llmsched_gym/cli/ (the ``llmsched`` entry point, its help formatter, the subcommands)
    5 apps       demo, benchmark, bench, fidelity, hindsight, goodput, placement, reproduce/, and the package facade
                 llmsched_gym/__init__.py (registers the envs and the GPU latency model)
    4 env, agents   env/, agents/
    3 sim        sim, cluster_sim, parallel
    2 baselines  baselines/
    1 core       core/, and the leaves beside it: fluid and optimum (reference bounds, no project
                 imports) and backends/ (the GPU latency model, a plug-in of core/latency)
    0 ground     config, data (the catalogue)

``tests/test_layers.py`` runs the same analysis and fails on a circle between folders, an upward
edge, or any import of ``cli/``.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = ("llmsched_gym", "agents", "baselines")

# (rank, name, path prefixes relative to the root); the first prefix that matches wins, so the
# more specific prefixes come first
# (llmsched_gym/cli.py, help.py and optimum.py: modules before they became packages or moved, so
# that the report of an older checkout reads the same)
LAYERS: list[tuple[int, str, tuple[str, ...]]] = [
    (6, "cli", ("llmsched_gym/cli/", "llmsched_gym/cli.py")),
    (5, "apps", ("llmsched_gym/demo.py", "llmsched_gym/benchmark.py", "llmsched_gym/bench.py",
                 "llmsched_gym/fidelity.py", "llmsched_gym/hindsight.py", "llmsched_gym/route_hindsight.py",
                 "llmsched_gym/reproduce/",
                 "llmsched_gym/goodput.py", "llmsched_gym/placement.py", "llmsched_gym/__init__.py")),
    (4, "env, agents", ("llmsched_gym/env/", "agents/")),
    (3, "sim", ("llmsched_gym/sim.py", "llmsched_gym/cluster_sim.py", "llmsched_gym/parallel.py")),
    (2, "baselines", ("baselines/",)),
    (1, "core", ("llmsched_gym/core/", "llmsched_gym/fluid.py", "llmsched_gym/optimum/", "llmsched_gym/optimum.py",
                "llmsched_gym/backends/")),
    (0, "ground", ("llmsched_gym/config.py", "llmsched_gym/data.py", "llmsched_gym/help.py")),
]


def layer(path: str) -> tuple[int, str]:
    """``(rank, name)`` of the layer a file (a path relative to the root) belongs to; ``(-1, "?")``
    for a file no layer names (a new top-level module: add it to :data:`LAYERS`)."""
    for rank, name, prefixes in LAYERS:
        if any(path == p or (p.endswith("/") and path.startswith(p)) for p in prefixes):
            return rank, name
    return -1, "?"


def folder(path: str) -> str:
    """The folder a file lives in (``llmsched_gym/core``; ``llmsched_gym`` for top-level modules)."""
    return path.rsplit("/", 1)[0]


@dataclass
class Graph:
    """Files (paths relative to the root), their import edges, and the line counts."""

    root: Path
    edges: dict[str, set[str]] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)
    functions: list[tuple[int, str]] = field(default_factory=list)  # (lines, "path: qualname")


def _module_files(root: Path) -> dict[str, str]:
    """Dotted module name -> file path relative to root, for every file of the packages."""
    out = {}
    for pkg in PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            rel = f.relative_to(root).as_posix()
            parts = rel[:-3].split("/")
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = rel
    return out


def _resolve(module: str, modules: dict[str, str]) -> str | None:
    """The file that ``import module`` names: the module itself, or its longest prefix that is one."""
    parts = module.split(".")
    while parts:
        name = ".".join(parts)
        if name in modules:
            return modules[name]
        parts.pop()
    return None


def _imported_names(tree: ast.AST, here: str) -> Iterator[str]:
    """Dotted names of what a module imports (``from X import Y`` gives ``X.Y``; the resolver
    falls back to ``X`` when ``X.Y`` is not a module). ``here`` is the module's own dotted
    package, for relative imports."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = here.split(".")
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            for a in node.names:
                yield f"{base}.{a.name}" if a.name != "*" else base
        elif isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
            if (name == "import_module" and node.args and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)):
                yield node.args[0].value
        elif isinstance(node, ast.List | ast.Tuple):
            # a module named in a list, as ("agents.cli", ...) looped over by importlib; but not the
            # X of [python, "-m", X]: running the command in a child process is no import
            for prev, item in zip([None, *node.elts], node.elts, strict=False):
                if (_string(item) and "." in item.value and item.value.split(".")[0] in PACKAGES
                        and all(part.isidentifier() for part in item.value.split("."))
                        and not (prev is not None and _string(prev) and prev.value == "-m")):
                    yield item.value
        elif _string(node) and "import " in node.value and "\n" in node.value:
            # a script run in a child process (python -c CODE) imports what its code imports
            try:
                script = ast.parse(node.value)
            except SyntaxError:
                continue
            yield from _imported_names(script, here)


def _string(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _functions(tree: ast.AST, path: str) -> Iterator[tuple[int, str]]:
    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[int, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                q = f"{prefix}{child.name}"
                yield child.end_lineno - child.lineno + 1, f"{path}: {q}"
                yield from walk(child, q + ".")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def build(root: Path) -> Graph:
    """The file-level import graph of the packages under ``root``."""
    root = Path(root)
    modules = _module_files(root)
    g = Graph(root)
    for mod, rel in modules.items():
        text = (root / rel).read_text()
        tree = ast.parse(text, rel)
        here = mod if rel.endswith("__init__.py") else mod.rsplit(".", 1)[0]
        targets = {_resolve(name, modules) for name in _imported_names(tree, here)}
        g.edges[rel] = {t for t in targets if t is not None and t != rel}
        g.lines[rel] = len(text.splitlines())
        g.functions.extend(_functions(tree, rel))
    return g


def sccs(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one file, largest first (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return sorted(out, key=lambda c: (-len(c), c))


def shortest_path(edges: dict[str, set[str]], src: str, dst: str, within: set[str]) -> list[str] | None:
    """A shortest import chain ``src -> ... -> dst`` using only files in ``within``."""
    prev: dict[str, str | None] = {src: None}
    todo = deque([src])
    while todo:
        v = todo.popleft()
        if v == dst:
            path = [v]
            while prev[path[-1]] is not None:
                path.append(prev[path[-1]])
            return path[::-1]
        for w in sorted(edges.get(v, ())):
            if w in within and w not in prev:
                prev[w] = v
                todo.append(w)
    return None


def cross_folder_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """For every edge between two folders that lies on a circle: a shortest circle through it
    (``[a, b, ..., a]``), duplicates removed."""
    seen: set[tuple[str, ...]] = set()
    out = []
    for comp in sccs(edges):
        members = set(comp)
        for a in comp:
            for b in sorted(edges[a] & members):
                if folder(a) == folder(b):
                    continue
                back = shortest_path(edges, b, a, members)
                cycle = [a] + back
                i = cycle.index(min(cycle[:-1]))
                key = tuple(cycle[i:-1] + cycle[:i])
                if key not in seen:
                    seen.add(key)
                    out.append(cycle)
    return out


def upward_edges(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Edges from a file to a file of a higher layer, and edges into ``cli/`` from outside it."""
    out = []
    for a in sorted(edges):
        for b in sorted(edges[a]):
            if layer(b)[0] > layer(a)[0] or (layer(b)[1] == "cli" and layer(a)[1] != "cli"):
                out.append((a, b))
    return out


def report(g: Graph, top: int = 15) -> str:
    """The printed report (see the module docstring)."""
    out = []
    n_edges = sum(len(v) for v in g.edges.values())
    out.append(f"files: {len(g.edges)}, import edges: {n_edges}, lines: {sum(g.lines.values())}")
    unlayered = sorted(p for p in g.edges if layer(p)[0] < 0)
    if unlayered:
        out.append(f"files in no layer (add them to LAYERS): {', '.join(unlayered)}")
    comps = sccs(g.edges)
    out.append(f"\nstrongly connected components (import circles): {len(comps)}")
    for c in comps:
        folders = sorted({folder(p) for p in c})
        out.append(f"  {len(c)} files in {len(folders)} folder(s) ({', '.join(folders)}):")
        out.extend(f"    {p}" for p in c)
    cyc = cross_folder_cycles(g.edges)
    out.append(f"\ncircles across folders (a shortest one through each cross-folder edge): {len(cyc)}")
    out.extend("  " + " -> ".join(c) for c in cyc)
    up = upward_edges(g.edges)
    out.append(f"\nedges up the layer order: {len(up)}")
    out.extend(f"  {a} ({layer(a)[1]}) -> {b} ({layer(b)[1]})" for a, b in up)
    out.append(f"\nlargest files (lines), top {top}:")
    out.extend(f"  {n:5d} {p}" for p, n in sorted(g.lines.items(), key=lambda kv: (-kv[1], kv[0]))[:top])
    out.append(f"\nlargest functions (lines), top {top}:")
    out.extend(f"  {n:5d} {q}" for n, q in sorted(g.functions, key=lambda t: (-t[0], t[1]))[:top])
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", nargs="?", default=str(Path(__file__).resolve().parents[1]),
                    help="the checkout to read (default: this one)")
    ap.add_argument("--top", type=int, default=15, help="how many of the largest files and functions")
    ap.add_argument("--over", type=int, default=None, metavar="N",
                    help="instead of the report, list every function longer than N lines")
    args = ap.parse_args(argv)
    g = build(Path(args.root))
    if args.over is not None:
        for n, q in sorted(g.functions, key=lambda t: (-t[0], t[1])):
            if n > args.over:
                print(f"{n:5d} {q}")
        return 0
    print(report(g, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
