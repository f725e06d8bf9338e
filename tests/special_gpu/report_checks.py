"""One line per GPU check, from the JUnit report pytest wrote for one test file (``run_all.sh``'s reporter).

For each test of the file: ``CHECK <file>::<test>: PASS (<seconds>s) <figure>=<value> ...``, the figures being
what the test recorded with the ``figure`` fixture (``tests/special_gpu/conftest.py``). A test that failed, errored
or was skipped is a FAIL, followed by the reason and the end of the file's log: on a CUDA machine a skipped GPU
test is a check that did not run. With ``--rehearse`` (no CUDA here) a skip whose reason is the missing CUDA device
is what a rehearsal expects (``REHEARSED``); any other skip would happen on the GPU machine too, and fails. A file
with no report (timed out, crashed) or no test marked ``gpu`` fails as a whole.

Exit status: the number of failed checks of the file (at most 100). Standard library only: it runs on the GPU image
before anything is installed, and here.

Usage: python report_checks.py --file tests/x/test_y.py --junit y.xml --log y.log --rc <pytest's exit status>
    [--rehearse]
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

NUM_LOG_LINES = 30
NO_CUDA_WORDS = ("CUDA", "cuda", "GPU")


def _log_tail(log: Path) -> list[str]:
    if not log.is_file():
        return [f"    (no log at {log})"]
    lines = log.read_text(errors="replace").splitlines()[-NUM_LOG_LINES:]
    return ["    " + line for line in lines]


def _outcome(case: ET.Element, rehearse: bool) -> tuple[str, str]:
    """(status, detail) of one ``<testcase>``: status PASS, FAIL or REHEARSED."""
    for tag in ("failure", "error"):
        node = case.find(tag)
        if node is not None:
            message = (node.get("message") or "").splitlines()
            return "FAIL", f"{tag}: {message[0][:200] if message else ''}"
    skipped = case.find("skipped")
    if skipped is not None:
        reason = skipped.get("message") or ""
        if rehearse and any(word in reason for word in NO_CUDA_WORDS):
            return "REHEARSED", f"skipped without CUDA: {reason}"
        where = "a rehearsal skip that is no missing CUDA device" if rehearse else "skipped on the CUDA machine"
        return "FAIL", f"{where}: {reason}"
    return "PASS", ""


def report(file: str, junit: Path, log: Path, rc: int, rehearse: bool) -> tuple[list[str], int]:
    """The lines to print for one test file and its number of failed checks."""
    if not junit.is_file():
        why = "timed out" if rc in (124, 137) else f"no report (pytest exit status {rc})"
        return [f"CHECK {file}: FAIL ({why})", *_log_tail(log)], 1
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    if not cases:
        why = "no test of this file is marked gpu" if rc == 5 else f"no test ran (pytest exit status {rc})"
        return [f"CHECK {file}: FAIL ({why})", *_log_tail(log)], 1
    lines, num_failed = [], 0
    for case in cases:
        status, detail = _outcome(case, rehearse)
        figures = " ".join(f"{p.get('name')}={p.get('value')}" for p in case.iter("property"))
        seconds = float(case.get("time") or 0.0)
        name = case.get("name") or "?"
        text = f"CHECK {file}::{name}: {status} ({seconds:.1f}s)"
        lines.append(" ".join(part for part in (text, figures, detail if status != "PASS" else "") if part))
        num_failed += status == "FAIL"
    if num_failed:
        lines += _log_tail(log)
    elif rc not in (0, 5):  # every case passed, yet pytest failed (an error outside the tests, a crash at exit)
        lines += [f"CHECK {file}: FAIL (pytest exit status {rc} with every test passed)", *_log_tail(log)]
        num_failed = 1
    return lines, num_failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", required=True, help="the test file, as named on the CHECK lines")
    parser.add_argument("--junit", required=True, type=Path)
    parser.add_argument("--log", required=True, type=Path)
    parser.add_argument("--rc", required=True, type=int, help="pytest's exit status (124/137: timed out)")
    parser.add_argument("--rehearse", action="store_true", help="no CUDA here: a CUDA skip is expected")
    args = parser.parse_args(argv)
    lines, num_failed = report(args.file, args.junit, args.log, args.rc, args.rehearse)
    sys.stdout.write("\n".join(lines) + "\n")
    return min(num_failed, 100)


if __name__ == "__main__":
    sys.exit(main())
