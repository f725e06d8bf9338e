"""One training step of a verl example script on the tiny model: ``python -m tests.trainer.verl_scripts.one_step
[--set january|current]`` runs it for every script of the set that passes start-up validation (about 40 minutes on 2
cores for January's; ``--only NAME ...`` for those whose path contains a NAME; the test
``tests/trainer/test_verl_scripts_one_step.py`` runs thirteen of the two sets) and prints
one line per script: ``OK`` or the error lines of the run.

The normalised script (:func:`~tests.trainer.verl_scripts.harness.normalise`) is shrunk to a step a 2-core CPU runs
in seconds by what ``--smoke-test`` does to a user's command line (:func:`verl.trainer.smoke_test.smoke_test_overrides`:
8 prompts of at most 64 tokens, responses of at most 8, the micro-batch sizes that divide that, one step, no
validation, no checkpoint, the console and jsonl loggers, vLLM's KV cache at 2% of the RAM). Everything else is the
script's own.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.trainer.verl_scripts.harness import (
    SCRIPT_SETS,
    Script,
    load_scripts,
    normalise,
    start_up_check,
    write_inputs,
)
from verl.trainer.smoke_test import MODEL_PATH_KEYS, smoke_test_overrides

REPO = Path(__file__).resolve().parents[3]


def one_step_argv(
    script: Script, inputs: dict[str, str], out_dir: Path, extra: tuple[str, ...] = (), own_model: bool = False
) -> list[str]:
    """The command line after ``python -m <entry point>``: the normalised script shrunk as ``--smoke-test`` shrinks
    it, then ``extra`` (which wins over the smoke test's sizes), writing to ``out_dir``.

    With ``own_model`` the script keeps its own model paths (``Qwen/Qwen3-8B``, ...), which the smoke test replaces
    with the embedded tiny model, as in a user's smoke test (docs/start/from_verl.md).
    """
    overrides = normalise(script.overrides, inputs)
    if own_model:  # the script's own value of each model path, where normalise put the scripts' model
        own = {o.partition("=")[0]: o for o in script.overrides if o.partition("=")[0].lstrip("+~") in MODEL_PATH_KEYS}
        overrides = tuple(own.get(o.partition("=")[0], o) for o in overrides)
    small = smoke_test_overrides(overrides)
    return script.argv(small + tuple(extra) + (f"trainer.default_local_dir={out_dir}",))


def run_one_step(
    script: Script,
    inputs: dict[str, str],
    cwd: Path,
    out_dir: Path,
    timeout_s: float = 600,
    extra: tuple[str, ...] = (),
    own_model: bool = False,
) -> subprocess.CompletedProcess:
    """``python -m <the script's entry point>`` with :func:`one_step_argv`; the finished process, its output
    captured."""
    argv = one_step_argv(script, inputs, out_dir, extra, own_model)
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_DEDUP_LOGS": "0"}
    return subprocess.run(
        [sys.executable, "-m", script.entry_point, *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="also write the lines to this file")
    parser.add_argument("--only", nargs="+", default=None, help="run only the scripts whose path contains one of these")
    parser.add_argument("--set", choices=sorted(SCRIPT_SETS), default="january", help="which stored scripts")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    lines = []
    with tempfile.TemporaryDirectory(prefix="verl_scripts_one_step_") as tmp:
        inputs = write_inputs(Path(tmp) / "inputs")
        for number, script in enumerate(load_scripts(SCRIPT_SETS[args.set])):
            if args.only and not any(part in script.name for part in args.only):
                continue
            try:
                start_up_check(script, inputs)
            except ValueError:
                continue  # refused at start-up: the start-up report says why
            proc = run_one_step(script, inputs, Path(tmp), Path(tmp) / f"run{number}")
            errors = [line for line in proc.stderr.splitlines() if "Error" in line][-3:]
            lines.append(f"{script.name}: {'OK' if proc.returncode == 0 else ' | '.join(errors)}")
            print(lines[-1], flush=True)
    passed = sum(line.endswith(": OK") for line in lines)
    lines.append(f"{passed} of {len(lines)} scripts that start train one step")
    print(lines[-1])
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
