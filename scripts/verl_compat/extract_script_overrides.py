"""Extract the trainer command lines of verl's own RL example scripts, as data.

Each ``*.sh`` under a set of directories of verl's repository at a given commit (:data:`SCRIPT_SETS`: ``january``,
the GRPO/PPO examples of b178a3c; ``current``, every PPO-family example of 1dda039 and verl's experimental async
trainers' scripts) is read from a bare git directory, written into a temporary directory laid out like verl's
repository, and run with bash in a clean environment whose ``PATH`` starts with shims: ``python``, ``python3``,
``uv``, ``ray``, ``huggingface-cli`` and the other programs the scripts call record their argv (and the environment
variables the script exported) instead of running. The shell expands the script's variables exactly as it would for
a user; the recorded ``python -m <entry point>`` call gives the entry point, the ``--config-path``/``--config-name``
and the Hydra overrides, verbatim.

A script whose entry point is not one of this package's trainers (:data:`OUR_ENTRY_POINTS`: SFT, generation, verl's
synchronous trainer, another launcher) or that runs a trainer this package leaves out (on-policy distillation) is
listed under ``not_ours`` with the reason, never dropped silently.

The result is stored as JSON beside the start-up test (``tests/trainer/verl_scripts/scripts.json`` for January,
``scripts_<commit>.json`` for the others), so that the test fetches nothing:
``python scripts/verl_compat/extract_script_overrides.py [--set january|current] [--git-dir DIR] [--commit C]
[--dirs D ...] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

logger = logging.getLogger("verl.compat")

DEFAULT_GIT_DIR = "/work/.mirror/verl-project+verl/repo"
OUT_DIR = Path(__file__).resolve().parents[2] / "tests" / "trainer" / "verl_scripts"
# The PPO-family trainers' examples of verl's current release (each directory read recursively), its experimental
# async trainers' scripts, and the examples of its other trainers (listed under ``not_ours``, with the reason).
_CURRENT_DIRS = (
    *(
        f"examples/{name}_trainer"
        for name in (
            "grpo",
            "ppo",
            "gspo",
            "sapo",
            "cispo",
            "dppo",
            "gdpo",
            "gmpo",
            "gpg",
            "reinforce_plus_plus",
            "remax",
            "rloo",
            "otb",
            "mtp",
        )
    ),
    "examples/rollout_correction",
    "examples/prefix_grouper",
    "examples/router_replay",
    "examples/tuning",
    "examples/profile",
    "examples/ascend_extras",
    "verl/experimental/fully_async_policy/shell",
    "verl/experimental/one_step_off_policy/shell",
    "examples/on_policy_distillation_trainer",
    "examples/sft",
    "examples/generation",
)
# name -> (verl's commit, the directories whose scripts to extract, the JSON file written).
SCRIPT_SETS = {
    "january": ("b178a3c", ("examples/grpo_trainer", "examples/ppo_trainer"), OUT_DIR / "scripts.json"),
    "current": ("1dda039", _CURRENT_DIRS, OUT_DIR / "scripts_1dda039.json"),
}
# The entry points this package has (``python -m <module>``) -> the config each composes when the script names none.
OUR_ENTRY_POINTS = {
    "verl.trainer.main_ppo": "ppo_trainer",
    "verl.experimental.fully_async_policy.fully_async_main": "fully_async_ppo_trainer",
    "verl.experimental.one_step_off_policy.main_ppo": "one_step_off_ppo_trainer",
}
# Trainers of verl's that this package leaves out, known by an override their scripts set: the reason each is listed.
_OTHER_TRAINERS = {"distillation.enabled=True": "on-policy distillation trainer (a teacher model), not in this package"}
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
    "uv",
    "torchrun",
    "nsys",
    "modelscope",
    "sleep",
    "mkdir",
)
# Sourced before each script (bash's BASH_ENV): a ``source`` of a vendor's file that is not here (Ascend's set_env.sh)
# does nothing, so that a script under ``set -e`` still reaches its main_ppo call; so does a ``ulimit`` this
# machine's hard limits refuse (a cluster's allow it).
_BASH_ENV = 'source() { if [ -f "$1" ]; then builtin source "$@"; fi; return 0; }\nulimit() { return 0; }\n'

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
    "LORA_ADAPTER_PATH": f"{FAKE_HOME}/models/lora_adapter",
    "HDFS_ROOT": f"{FAKE_HOME}/hdfs",
    "DATA_ROOT": f"{FAKE_HOME}/data",
    "RAY_DATA_HOME": f"{FAKE_HOME}/verl",  # the value the scripts that default it give it
    "KIMI_K2_6_MODEL_PATH": f"{FAKE_HOME}/models/kimi_k2_6",
    "INFER_BACKEND": "vllm",  # read before the line that defaults it to vllm (run_qwen3_vl_30b_a3b_fsdp.sh)
}

_RECORDER = r"""
import json, os, sys
entry = {"program": os.path.basename(sys.argv[1]), "argv": sys.argv[2:], "cwd": os.getcwd(),
         "env": {k: v for k, v in os.environ.items() if k not in json.loads(os.environ["_SHIM_BASE_ENV"])}}
with open(os.environ["_SHIM_LOG"], "a") as f:
    f.write(json.dumps(entry) + "\n")
# a GPU user's python has no torch_npu: the scripts' ``python3 -c 'import torch_npu'`` probe answers "gpu"
sys.exit(1 if "-c" in sys.argv[2:] and "torch_npu" in " ".join(sys.argv[2:]) else 0)
"""


def list_scripts(git_dir: str, commit: str, dirs: tuple[str, ...]) -> list[str]:
    """The example scripts' paths under ``dirs`` (recursively) in verl's repository at ``commit``, sorted."""
    out = subprocess.run(
        ["git", f"--git-dir={git_dir}", "ls-tree", "-r", "--name-only", commit, "--", *dirs],
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


def run_script(text: str, rel_path: str, workdir: Path, shim_dir: Path) -> tuple[list[dict], list[str], str]:
    """Run one script's text with bash under the shims: the recorded calls, in order, bash's errors and the last line
    of its stderr."""
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
    last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
    return calls, [e.split(": ", 1)[1] if ": " in e else e for e in errors], last.split(": ", 1)[-1]


def _module_of(argv: list[str]) -> str | None:
    """The module a recorded argv runs with ``-m`` (``python -m M``, ``uv run python -m M``), if any."""
    for i, arg in enumerate(argv[:-1]):
        if arg == "-m":
            return argv[i + 1]
    return None


def _trainer_call(calls: list[dict]) -> dict | None:
    """The recorded call that runs a trainer (``python -m verl...``, directly or after ``ray job submit ... --``),
    with ``entry_point`` (the module) and ``index`` (in ``calls``) added and its argv cut to what follows the module."""
    for index, call in enumerate(calls):
        argv = call["argv"]
        if call["program"] == "ray" and "--" in argv:
            argv = argv[argv.index("--") + 1 :]
        module = _module_of(argv)
        if module is not None and module.split(".")[0].startswith("verl"):
            return {**call, "entry_point": module, "index": index, "argv": argv[argv.index(module) + 1 :]}
    return None


def split_trainer_argv(after: list[str]) -> tuple[str | None, str | None, list[str], list[str]]:
    """(config path, config name, overrides, other options) of the argv after ``-m <entry point>``."""
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


def not_ours_reason(entry_point: str | None, overrides: list[str]) -> str | None:
    """Why a script whose trainer call was recorded is left out of the start-up check (None: the trainer is ours)."""
    if entry_point not in OUR_ENTRY_POINTS:
        return f"entry point {entry_point} is not one of this package's trainers"
    for override, reason in _OTHER_TRAINERS.items():
        if override in overrides:
            return reason
    return None


def _record(rel_path: str, text: str, run: tuple[list[dict], list[str], str]) -> dict:
    """The stored record of one script (its text and :func:`run_script`'s result): its entry point, config,
    overrides and exported env, or why it is not checked here."""
    calls, shell_errors, last_error = run
    call = _trainer_call(calls)
    if call is None:  # bash stopped first: the module its text names
        module = next((m.group(1) for m in re.finditer(r"-m\s+(verl[\w.]*)", text)), None)
        if module is not None and module not in OUR_ENTRY_POINTS:
            return {"script": rel_path, "entry_point": module, "reason": not_ours_reason(module, [])}
        return {"script": rel_path, "entry_point": module, "reason": f"stops before its trainer call: {last_error}"}
    config_path, config_name, overrides, other = split_trainer_argv(call["argv"])
    reason = not_ours_reason(call["entry_point"], overrides)
    if reason is not None:
        return {"script": rel_path, "entry_point": call["entry_point"], "reason": reason}
    return {
        "script": rel_path,
        "entry_point": call["entry_point"],
        "config_path": config_path,
        "config_name": config_name,
        "overrides": overrides,
        "other_options": other,
        "env": call["env"],
        "other_calls": [[c["program"], *c["argv"]] for i, c in enumerate(calls) if c["argv"] and i != call["index"]],
        "shell_errors": shell_errors,
    }


# Where each entry point of verl's looks for its config (relative to verl's package) and the config it composes.
_VERL_CONFIG_DIRS = {
    "verl.trainer.main_ppo": "trainer/config",
    "verl.experimental.fully_async_policy.fully_async_main": "experimental/fully_async_policy/config",
    "verl.experimental.one_step_off_policy.main_ppo": "experimental/one_step_off_policy/config",
}
# Run in a Python whose ``verl`` is verl's own (the archive's), so that verl's ``pkg://verl.trainer.config`` search
# path finds verl's files: composes each script's overrides with verl's own Hydra config tree; prints
# {script: Hydra's first line, or null}.
_VERL_COMPOSE = r"""
import json, os, sys
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
root, jobs = sys.argv[1], json.load(sys.stdin)
out = {}
for job in jobs:
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=os.path.join(root, job["config_dir"]), version_base=None):
            compose(config_name=job["config_name"], overrides=job["overrides"])
        out[job["script"]] = None
    except Exception as err:
        out[job["script"]] = f"{type(err).__name__}: {str(err).splitlines()[0]}"
print(json.dumps(out))
"""


def broken_in_verl(git_dir: str, commit: str, records: list[dict]) -> dict[str, str | None]:
    """{script: why it cannot start in verl itself, or None}: its command line does not compose with verl's own
    config files at ``commit`` (a key verl's YAML lacks, a config file verl does not have), or an override names a
    file of verl's repository that ``commit`` does not have. Such a script cannot start here either; the start-up
    test counts it apart, with this reason."""
    with tempfile.TemporaryDirectory(prefix="verl_tree_") as tmp:
        archive = subprocess.run(
            ["git", "--git-dir", git_dir, "archive", commit, "verl"], capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        jobs = []
        for record in records:
            config_dir = _VERL_CONFIG_DIRS[record["entry_point"]]
            if record["config_path"]:  # verl resolves it against the entry point's directory
                config_dir = os.path.normpath(os.path.join(os.path.dirname(config_dir), record["config_path"]))
            name = (record["config_name"] or OUR_ENTRY_POINTS[record["entry_point"]]).removesuffix(".yaml")
            jobs.append(
                {
                    "script": record["script"],
                    "config_dir": config_dir,
                    "config_name": name,
                    "overrides": record["overrides"],
                }
            )
        env = {**os.environ, "PYTHONPATH": tmp, "HYDRA_FULL_ERROR": "0"}
        done = subprocess.run(
            [sys.executable, "-c", _VERL_COMPOSE, os.path.join(tmp, "verl")],
            input=json.dumps(jobs),
            capture_output=True,
            text=True,
            env=env,
            check=True,
            cwd=tmp,
        )
        reasons = json.loads(done.stdout.strip().splitlines()[-1])
    for record in records:
        if reasons[record["script"]] is None:
            reasons[record["script"]] = _missing_repo_file(git_dir, commit, record)
    return {script: (f"in verl {commit} too: {why}" if why else None) for script, why in reasons.items()}


def _missing_repo_file(git_dir: str, commit: str, record: dict) -> str | None:
    """The first override whose value is a Python file of the repository the script ran in (the extraction's
    ``.../repo/``) that ``commit`` lacks, as "<key> names <path>, which verl's repository does not have"; else
    None."""
    for override in record["overrides"]:
        key, _, value = override.partition("=")
        match = re.search(r"/verl_scripts_[^/]+/repo/(\S+\.py)\b", value)  # code (data files are the user's)
        if match is None:
            continue
        path = match.group(1).strip("'\"")
        found = subprocess.run(["git", "--git-dir", git_dir, "cat-file", "-e", f"{commit}:{path}"], capture_output=True)
        if found.returncode != 0:
            return f"{key.lstrip('+~')} names {path}, which verl's repository does not have"
    return None


def extract(git_dir: str, commit: str, dirs: tuple[str, ...]) -> tuple[list[dict], list[dict]]:
    """(records of the scripts this package's trainers run, records of the others with the reason) under ``dirs``."""
    ours, not_ours = [], []
    with tempfile.TemporaryDirectory(prefix="verl_scripts_") as tmp:
        root = Path(tmp)
        recorder = root / "record.py"
        recorder.write_text(_RECORDER)
        _write_shims(root / "shims", recorder)
        for rel_path in list_scripts(git_dir, commit, dirs):
            text = _show(git_dir, commit, rel_path)
            record = _record(rel_path, text, run_script(text, rel_path, root / "repo", root / "shims"))
            (not_ours if "reason" in record else ours).append(record)
    return ours, not_ours


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=sorted(SCRIPT_SETS), default="january", help="the commit, dirs and file")
    parser.add_argument("--git-dir", default=DEFAULT_GIT_DIR, help="bare git directory of verl's repository")
    parser.add_argument("--commit", default=None, help="verl's commit whose scripts to extract (default: the set's)")
    parser.add_argument("--dirs", nargs="+", default=None, help="directories of verl's repository (default: the set's)")
    parser.add_argument("--out", type=Path, default=None, help="the JSON file to write (default: the set's)")
    parser.add_argument(
        "--recheck-in-verl",
        action="store_true",
        help="only check the stored scripts against verl's own config (broken_in_verl), without extracting again",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    commit, dirs, out = SCRIPT_SETS[args.set]
    commit, dirs, out = args.commit or commit, tuple(args.dirs or dirs), args.out or out
    git_dir = os.path.abspath(args.git_dir) if os.path.exists(args.git_dir) else args.git_dir
    if args.recheck_in_verl:
        payload = json.loads(out.read_text())
        reasons = broken_in_verl(git_dir, payload["verl_commit"], payload["scripts"])
        for record in payload["scripts"]:
            record["broken_in_verl"] = reasons[record["script"]]
        out.write_text(json.dumps(payload, indent=1) + "\n")
        logger.info("%d of %d scripts cannot start in verl either", sum(map(bool, reasons.values())), len(reasons))
        return
    ours, not_ours = extract(git_dir, commit, dirs)
    if args.set != "january":  # January's file predates this check (its start-up test lists verl's broken ones)
        reasons = broken_in_verl(git_dir, commit, ours)
        for record in ours:
            record["broken_in_verl"] = reasons[record["script"]]
    payload = {"verl_commit": commit, "source_dirs": list(dirs), "scripts": ours}
    if args.set != "january" or not_ours:  # the January file predates the listing (every script there is ours)
        payload["not_ours"] = not_ours
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1) + "\n")
    logger.info("%d scripts written to %s (%d listed as not ours)", len(ours), out, len(not_ours))


if __name__ == "__main__":
    main()
