"""Extract the ``main_ppo`` command lines of verl's own GRPO/PPO example scripts, as data.

Each script ``examples/grpo_trainer/*.sh`` and ``examples/ppo_trainer/*.sh`` of verl at a given commit is read from
a bare git directory, written into a temporary directory laid out like verl's repository, and run with bash in a
clean environment whose ``PATH`` starts with shims: ``python``, ``python3``, ``ray``, ``huggingface-cli`` and the
other programs the scripts call record their argv (and the environment variables the script exported) instead of
running. The shell expands the script's variables exactly as it would for a user; the recorded call to
``verl.trainer.main_ppo`` gives the ``--config-path``/``--config-name`` and the Hydra overrides, verbatim.

The result is stored as JSON (``tests/trainer/verl_scripts/scripts.json``), so that the start-up test fetches
nothing: ``python scripts/verl_compat/extract_script_overrides.py [--git-dir DIR] [--commit C] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

logger = logging.getLogger("verl.compat")

DEFAULT_GIT_DIR = "/work/.mirror/verl-project+verl/repo"
DEFAULT_COMMIT = "b178a3c"
SCRIPT_DIRS = ("examples/grpo_trainer", "examples/ppo_trainer")
DEFAULT_OUT = Path(__file__).resolve().parents[2] / "tests" / "trainer" / "verl_scripts" / "scripts.json"
# The programs verl's scripts call besides bash's builtins and coreutils: each records its argv instead of running.
SHIMMED = (
    "python",
    "python3",
    "ray",
    "huggingface-cli",
    "hf",
    "nvidia-smi",
    "npu-smi",
    "pip",
    "pip3",
    "wget",
    "curl",
    "git",
    "torchrun",
    "nsys",
    "modelscope",
    "sleep",
    "mkdir",
)
# Sourced before each script (bash's BASH_ENV): a ``source`` of a vendor's file that is not here (Ascend's set_env.sh)
# does nothing, so that a script under ``set -e`` still reaches its main_ppo call.
_BASH_ENV = 'source() { if [ -f "$1" ]; then builtin source "$@"; fi; return 0; }\n'

# The environment a user would have, fixed so that the expansion does not depend on who runs the extraction.
FAKE_HOME = "/home/user"
SCRIPT_TIMEOUT_S = 60
# Variables some scripts read without setting them (their comments ask the user to export them): a user's values.
USER_ENV = {
    "CKPT_DIR": f"{FAKE_HOME}/ckpts",
    "DIST_CKPT_PATH": f"{FAKE_HOME}/mcore_ckpt",
    "LLM": f"{FAKE_HOME}/models/llm",
    "gsm8k_train_path": f"{FAKE_HOME}/data/gsm8k/train.parquet",
    "gsm8k_test_path": f"{FAKE_HOME}/data/gsm8k/test.parquet",
}

_RECORDER = r"""
import json, os, sys
entry = {"program": os.path.basename(sys.argv[1]), "argv": sys.argv[2:], "cwd": os.getcwd(),
         "env": {k: v for k, v in os.environ.items() if k not in json.loads(os.environ["_SHIM_BASE_ENV"])}}
with open(os.environ["_SHIM_LOG"], "a") as f:
    f.write(json.dumps(entry) + "\n")
"""


def list_scripts(git_dir: str, commit: str) -> list[str]:
    """The example scripts' paths in verl's repository at ``commit``, sorted."""
    out = subprocess.run(
        ["git", f"--git-dir={git_dir}", "ls-tree", "--name-only", commit, *[d + "/" for d in SCRIPT_DIRS]],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return sorted(p for p in out.split() if p.endswith(".sh"))


def _show(git_dir: str, commit: str, path: str) -> str:
    return subprocess.run(
        ["git", f"--git-dir={git_dir}", "show", f"{commit}:{path}"], check=True, capture_output=True, text=True
    ).stdout


def _write_shims(shim_dir: Path, recorder: Path) -> None:
    shim_dir.mkdir(parents=True)
    for name in SHIMMED:
        shim = shim_dir / name
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{recorder}" "$0" "$@"\n')
        shim.chmod(0o755)
    (shim_dir / "bash_env.sh").write_text(_BASH_ENV)


def run_script(text: str, rel_path: str, workdir: Path, shim_dir: Path) -> tuple[list[dict], list[str]]:
    """Run one script's text with bash under the shims: the recorded calls, in order, and bash's errors."""
    script = workdir / rel_path
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(text)
    log = workdir / "calls.jsonl"
    log.unlink(missing_ok=True)
    env = {"PATH": f"{shim_dir}:/usr/bin:/bin", "HOME": FAKE_HOME, "USER": "user", "LANG": "C.UTF-8", **USER_ENV}
    base_keys = sorted(env) + ["_SHIM_LOG", "_SHIM_BASE_ENV", "BASH_ENV", "PWD", "SHLVL", "_", "OLDPWD"]
    env["_SHIM_LOG"] = str(log)
    env["_SHIM_BASE_ENV"] = json.dumps(base_keys)
    env["BASH_ENV"] = str(shim_dir / "bash_env.sh")
    proc = subprocess.run(
        ["bash", str(script)], cwd=workdir, env=env, capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S
    )
    if proc.returncode != 0:
        logger.info("%s exited %d (harmless for the shims): %s", rel_path, proc.returncode, proc.stderr[-300:])
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    # verl's own slips that bash reports (a broken line continuation leaves the rest as a command of its own)
    errors = [line for line in proc.stderr.splitlines() if "command not found" in line]
    return calls, [e.split(": ", 1)[1] if ": " in e else e for e in errors]


def _main_ppo_call(calls: list[dict]) -> dict | None:
    """The recorded call that runs ``verl.trainer.main_ppo`` (directly, or after ``ray job submit ... --``)."""
    for call in calls:
        argv = call["argv"]
        if "verl.trainer.main_ppo" in argv:
            return call
        if call["program"] == "ray" and "--" in argv:
            rest = argv[argv.index("--") + 1 :]
            if "verl.trainer.main_ppo" in rest:
                return {**call, "argv": rest[1:]}
    return None


def split_main_ppo_argv(argv: list[str]) -> tuple[str | None, str | None, list[str], list[str]]:
    """(config path, config name, overrides, other options) of the argv after ``-m verl.trainer.main_ppo``."""
    after = argv[argv.index("verl.trainer.main_ppo") + 1 :]
    config_path = config_name = None
    overrides, other = [], []
    i = 0
    while i < len(after):
        arg = after[i]
        for flag in ("--config-path", "-cp", "--config-name", "-cn"):
            if arg == flag or arg.startswith(flag + "="):
                value = arg.split("=", 1)[1] if "=" in arg else after[i + 1]
                i += 0 if "=" in arg else 1
                if flag in ("--config-path", "-cp"):
                    config_path = value
                else:
                    config_name = value
                break
        else:
            (other if arg.startswith("-") else overrides).append(arg)
        i += 1
    return config_path, config_name, overrides, other


def extract(git_dir: str, commit: str) -> list[dict]:
    """One record per script: name, config path and name (None: main_ppo's defaults), overrides, exported env."""
    records = []
    with tempfile.TemporaryDirectory(prefix="verl_scripts_") as tmp:
        root = Path(tmp)
        recorder = root / "record.py"
        recorder.write_text(_RECORDER)
        _write_shims(root / "shims", recorder)
        for rel_path in list_scripts(git_dir, commit):
            workdir = root / "repo"
            calls, shell_errors = run_script(_show(git_dir, commit, rel_path), rel_path, workdir, root / "shims")
            call = _main_ppo_call(calls)
            if call is None:
                raise RuntimeError(f"{rel_path}: no call to verl.trainer.main_ppo recorded ({calls})")
            config_path, config_name, overrides, other = split_main_ppo_argv(call["argv"])
            records.append(
                {
                    "script": rel_path,
                    "config_path": config_path,
                    "config_name": config_name,
                    "overrides": overrides,
                    "other_options": other,
                    "env": call["env"],
                    "other_calls": [[c["program"], *c["argv"]] for c in calls if c is not call and c["argv"]],
                    "shell_errors": shell_errors,
                }
            )
    return records


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--git-dir", default=DEFAULT_GIT_DIR, help="bare git directory of verl's repository")
    parser.add_argument("--commit", default=DEFAULT_COMMIT, help="verl's commit whose scripts to extract")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the JSON file to write")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    records = extract(os.path.abspath(args.git_dir) if os.path.exists(args.git_dir) else args.git_dir, args.commit)
    payload = {"verl_commit": args.commit, "source_dirs": list(SCRIPT_DIRS), "scripts": records}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=1) + "\n")
    logger.info("%d scripts written to %s", len(records), args.out)


if __name__ == "__main__":
    main()
