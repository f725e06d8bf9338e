"""Pre-commit check: text files end with exactly one newline and carry no trailing whitespace.

A stand-in for pre-commit-hooks' ``end-of-file-fixer`` and ``trailing-whitespace`` that needs no network: it only
reports (``file:line: problem``) and exits 1, leaving the fix to the author. Files that are not UTF-8 text (binary
assets) are skipped, since whitespace rules do not apply to them.

Usage: ``python tests/special_sanity/check_whitespace.py [--check eof|trailing|all] FILE...``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _read_text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def check_end_of_file(path: Path, text: str) -> list[str]:
    """Problems with how ``text`` ends: missing final newline, or blank lines after the last content line."""
    if not text:
        return []
    num_lines = text.count("\n") + (0 if text.endswith("\n") else 1)
    if not text.endswith("\n"):
        return [f"{path}:{num_lines}: no newline at end of file"]
    stripped = text.rstrip("\r\n")
    if not stripped:
        return [f"{path}:1: file holds only blank lines"]
    num_content_lines = stripped.count("\n") + 1
    if num_lines > num_content_lines:
        return [f"{path}:{num_content_lines + 1}: blank line(s) at end of file"]
    return []


def check_trailing_whitespace(path: Path, text: str) -> list[str]:
    """One problem per line that ends with spaces or tabs (a CRLF line ending is not trailing whitespace)."""
    problems = []
    for num, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if line != line.rstrip(" \t"):
            problems.append(f"{path}:{num}: trailing whitespace")
    return problems


def check_file(path: Path, check: str = "all") -> list[str]:
    """All problems of ``path`` for ``check`` ("eof", "trailing" or "all"); binary files have none."""
    text = _read_text(path)
    if text is None:
        return []
    problems = []
    if check in ("eof", "all"):
        problems += check_end_of_file(path, text)
    if check in ("trailing", "all"):
        problems += check_trailing_whitespace(path, text)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", choices=("eof", "trailing", "all"), default="all")
    parser.add_argument("files", nargs="*", type=Path)
    args = parser.parse_args(argv)
    problems = [p for path in args.files for p in check_file(path, args.check)]
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
