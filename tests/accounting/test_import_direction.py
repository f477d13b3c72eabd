"""Layers import downwards only: `accounting` never imports `mechanisms` or the planner; `mechanisms` not the planner.

The accounting reads events (`EventSource`); `tfdp_embed.planning` is the one
place that joins a mechanism and its accounting.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "tfdp_embed"


def imported_modules(path: pathlib.Path) -> set:
    """Every module a file imports (`import a.b`, `from a.b import c` -> a.b and a.b.c), at any depth."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def offenders(package: str, forbidden: tuple) -> dict:
    files = sorted((PACKAGE / package).rglob("*.py"))
    assert files, f"no Python files under tfdp_embed/{package}"
    bad = {}
    for path in files:
        hits = sorted(m for m in imported_modules(path) if m.startswith(forbidden))
        if hits:
            bad[str(path.relative_to(PACKAGE.parent))] = hits
    return bad


@pytest.mark.parametrize(
    "package, forbidden",
    [("accounting", ("tfdp_embed.mechanisms", "tfdp_embed.planning")), ("mechanisms", ("tfdp_embed.planning",))],
)
def test_no_upward_imports(package, forbidden):
    assert offenders(package, forbidden) == {}


def test_the_check_sees_an_upward_import(tmp_path):
    source = tmp_path / "x.py"
    source.write_text("def f():\n    from tfdp_embed.mechanisms.base import one_off_events\n")
    assert "tfdp_embed.mechanisms.base" in imported_modules(source)
    source.write_text("from tfdp_embed import mechanisms\n")
    assert "tfdp_embed.mechanisms" in imported_modules(source)
