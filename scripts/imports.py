#!/usr/bin/env python
"""The package's import graph: files, levels, circles, and imports that hide one.

Reads every module under miyamoto/ as text (nothing is imported or run) and prints one
JSON object: how many files and arrows, how many levels (the longest chain of imports run
at import time; a file that imports nothing of ours is level 1), the circles between files
(counting the arrows of imports made inside a function or under ``TYPE_CHECKING`` too)
and between packages, and those deferred imports with where they are.
``tests/unit/test_layout.py`` holds the package to no circle at either scale.

    .venv/bin/python scripts/imports.py [--root DIR]
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from functools import lru_cache
from pathlib import Path

PACKAGE = "miyamoto"


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under root/miyamoto."""
    out = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _target(name: str, known: dict[str, Path]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(mod: str, path: Path, known: dict[str, Path], rel: str) -> tuple[set[str], list[dict]]:
    """What ``mod`` imports at module level, and the imports it makes lazily."""
    tree = ast.parse(path.read_text(), str(path))
    top: set[str] = set()
    lazy: list[dict] = []

    def names(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            return [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        return []

    def visit(node: ast.AST, where: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = f"function {child.name}"
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                inner = "TYPE_CHECKING"
            for name in names(child):
                if not name.startswith(PACKAGE + "."):
                    continue
                t = _target(name, known)
                if t is None or t == mod:
                    continue
                entry = {"file": rel,
                         "line": child.lineno, "where": where, "imports": t}
                if where is None:
                    top.add(t)
                elif entry not in lazy:
                    lazy.append(entry)
            visit(child, inner)

    visit(tree, None)
    # a package's __init__ is imported with every module under it: not an arrow of ours
    top.discard(PACKAGE)
    return top, lazy


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(10000)

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def package_of(mod: str) -> str:
    parts = mod.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else mod


def measure(root: Path) -> dict:
    known = modules(root)
    graph: dict[str, set[str]] = {}
    lazy: list[dict] = []
    for mod, path in known.items():
        graph[mod], found = imports(mod, path, known, str(path.relative_to(root)))
        lazy += found
    # a circle counts whether its arrows run at import time or inside a function
    every = {mod: graph[mod] | {e["imports"] for e in lazy
                                if e["file"] == str(known[mod].relative_to(root))}
             for mod in known}
    circles = _circles(every)
    packages: dict[str, set[str]] = {}
    for mod, targets in graph.items():
        packages.setdefault(package_of(mod), set()).update(
            package_of(t) for t in targets if package_of(t) != package_of(mod))

    @lru_cache(maxsize=None)
    def level(mod: str, seen: frozenset = frozenset()) -> int:
        below = [t for t in graph[mod] if t not in seen]
        return 1 + max((level(t, seen | {mod}) for t in below), default=0)

    return {
        "files": len(known),
        "arrows": sum(len(t) for t in graph.values()),
        "levels": max(level(m) for m in known),
        "circles": circles,
        "package_circles": _circles(packages),
        "lazy_imports": lazy,
        "file_levels": {str(known[m].relative_to(root)): level(m) for m in known},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default=str(Path(__file__).resolve().parent.parent),
                   help="the checkout to read (default: this one)")
    p.add_argument("--levels", action="store_true", help="also print each file's level")
    args = p.parse_args(argv)
    graph = measure(Path(args.root))
    if not args.levels:
        graph.pop("file_levels")
    print(json.dumps(graph, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
