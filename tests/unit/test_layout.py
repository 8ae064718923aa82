"""The package's shape, held: no import circle between files or packages, imports deferred
only where start-up weight says so, and functions within 60 lines (scripts/imports.py)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from helpers import REPO

_spec = importlib.util.spec_from_file_location("imports_script", REPO / "scripts" / "imports.py")
imports = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(imports)  # type: ignore[union-attr]

# deferred imports that keep `import miyamoto` and the CLI's start-up light, and the
# optional opentelemetry extra, imported only when tracing starts
DEFERRED_OK = ("miyamoto/__init__.py", "miyamoto/cli/", "miyamoto/config/settings.py",
               "miyamoto/tracing.py")


def test_no_circle_between_files_or_packages() -> None:
    graph = imports.measure(REPO)
    assert graph["circles"] == []
    assert graph["package_circles"] == []


def test_imports_are_deferred_only_for_start_up() -> None:
    lazy = imports.measure(REPO)["lazy_imports"]
    assert [e for e in lazy if not e["file"].startswith(DEFERRED_OK)] == []
    assert not any(e["where"] == "TYPE_CHECKING" for e in lazy)


def test_the_checker_sees_a_circle_and_a_hidden_import(tmp_path: Path) -> None:
    pkg = tmp_path / "miyamoto"
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("")
    (pkg / "a" / "x.py").write_text("from miyamoto.a import y\n")
    (pkg / "a" / "y.py").write_text("def f():\n    from miyamoto.a import x\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from miyamoto.a import x\n")
    graph = imports.measure(tmp_path)
    assert graph["circles"] == [["miyamoto.a.x", "miyamoto.a.y"]]
    assert {e["where"] for e in graph["lazy_imports"]} == {"function f", "TYPE_CHECKING"}


def test_functions_stay_within_60_lines() -> None:
    long = []
    for path in sorted((REPO / "miyamoto").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.end_lineno - node.lineno + 1 > 60:
                    long.append(f"{path.relative_to(REPO)}:{node.name}")
    assert long == []
