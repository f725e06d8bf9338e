"""The documentation builds offline with warnings as errors, exactly as CI builds it."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_sphinx_build_with_warnings_as_errors(tmp_path):
    out = tmp_path / "html"
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "-b", "html", "-d", str(tmp_path / "doctrees"), "docs", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"sphinx-build failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    for page in ("index", "start/install", "start/quickstart", "advance/update_failure_policy", "api/update_outcome"):
        assert (out / f"{page}.html").is_file(), page
    # The example handler is pulled in with literalinclude, and autodoc found the built-in handlers.
    assert "SkipBudgetHandler" in (out / "advance/update_failure_policy.html").read_text(encoding="utf-8")
    assert "FP16WarnAndCountHandler" in (out / "api/update_outcome.html").read_text(encoding="utf-8")
