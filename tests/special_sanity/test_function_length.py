"""Every function of the package reads on one screen: under 60 lines, its docstring included (DESIGN.md section 6).

A function that grows past the limit fails here with its file, name and length, so that it is split when it grows,
not in a later clean-up.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "verl"
MAX_LINES = 59  # "under 60"


def function_lengths(source: str) -> list[tuple[str, int]]:
    """(qualified name, lines from ``def`` to its last line) of every function and method in ``source``."""
    lengths: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                lengths.append((name, child.end_lineno - child.lineno + 1))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return lengths


def test_function_lengths_are_measured_from_def_to_the_last_line():
    # def (1) + docstring (1) + 3 statements = 5 lines; the nested helper's 2 lines are inside it and counted apart
    source = "def outer():\n    '''doc'''\n    def inner():\n        return 1\n    return inner()\n"
    assert function_lengths(source) == [("outer", 5), ("outer.inner", 2)]


def test_no_function_of_the_package_reaches_60_lines():
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for name, num_lines in function_lengths(path.read_text()):
            if num_lines > MAX_LINES:
                too_long.append(f"{path.relative_to(PACKAGE.parent)}:{name} has {num_lines} lines")
    if too_long:
        pytest.fail("functions of 60 lines or more (split them):\n" + "\n".join(too_long))
