"""Importing verl.tools stays light: no Ray and no transformers are loaded by any of its modules."""

from __future__ import annotations

import subprocess
import sys

MODULES = [
    "verl.tools",
    "verl.tools.schemas",
    "verl.tools.base_tool",
    "verl.tools.function_schema",
    "verl.tools.function_tool",
    "verl.tools.tool_registry",
    "verl.tools.calculator_tool",
]


def test_no_ray_or_transformers_at_import():
    code = "import sys\n" + "".join(f"import {m}\n" for m in MODULES)
    code += "print(sorted(m for m in ('ray', 'transformers') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
