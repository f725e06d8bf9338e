"""Pre-commit check: every YAML file parses.

A stand-in for pre-commit-hooks' ``check-yaml`` that needs no network. Each file is parsed with
``yaml.safe_load_all`` (multi-document files are fine); a parse error is reported as ``file:line:column: problem``
and the script exits 1.

Usage: ``python tests/special_sanity/check_yaml.py FILE...``
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml


def check_file(path: Path) -> list[str]:
    """The parse error of ``path`` as ``["file:line:column: problem"]``, or ``[]`` when it parses."""
    try:
        with open(path, encoding="utf-8") as handle:
            for _ in yaml.safe_load_all(handle):
                pass
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{mark.line + 1}:{mark.column + 1}" if mark is not None else "1:1"
        problem = " ".join(str(part) for part in (err.context, err.problem) if part)
        return [f"{path}:{where}: {problem or err}"]
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        return [f"{path}:1:1: {err}"]
    return []


def main(argv: list[str] | None = None) -> int:
    paths = [Path(arg) for arg in (sys.argv[1:] if argv is None else argv)]
    problems = [p for path in paths for p in check_file(path)]
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
