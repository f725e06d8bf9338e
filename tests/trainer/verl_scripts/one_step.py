"""One training step of a verl example script on the tiny model: ``python -m tests.trainer.verl_scripts.one_step
[--set january|current]`` runs it for every script of the set that passes start-up validation (about 40 minutes on 2
cores for January's; ``--only NAME ...`` for those whose path contains a NAME; the test
``tests/trainer/test_verl_scripts_one_step.py`` runs thirteen of the two sets) and prints
one line per script: ``OK`` or the error lines of the run.

The normalised script (:func:`~tests.trainer.verl_scripts.harness.normalise`) is shrunk to a step a 2-core CPU runs
in seconds (:data:`SMALL_STEP`): 8 prompts of at most 64 tokens, responses of at most 8, the micro-batch sizes that
divide that, one step, no validation, no checkpoint, the console and jsonl loggers (verl's scripts log to W&B), vLLM's
KV cache at 2% of the RAM. Everything else is the script's own.
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

REPO = Path(__file__).resolve().parents[3]
# The sizes of one small step (on top of the normalised script).
SMALL_STEP = (
    "data.train_batch_size=8",
    "data.val_batch_size=null",
    "data.max_prompt_length=64",
    "data.max_response_length=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.02",
    "critic.ppo_mini_batch_size=8",
    "critic.ppo_micro_batch_size_per_gpu=8",
    "reward_model.micro_batch_size_per_gpu=8",
    "trainer.total_training_steps=1",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.save_freq=-1",
    "trainer.resume_mode=disable",
    "trainer.logger=[console,jsonl]",
    "trainer.progress_bar=false",
    "trainer.plot=false",
    "ray_init.num_cpus=2",
)


def _small_async_step(script: Script) -> tuple[str, ...]:
    """A fully async script counts its run in prompts (``rollout.total_rollout_steps``, which then decides the
    steps): one step's worth, 8 prompts (one local update of ``ppo_mini_batch_size`` 8); () for the others, where
    the key must stay unset."""
    keys = {o.partition("=")[0].lstrip("+~") for o in script.overrides}
    return ("rollout.total_rollout_steps=8",) if "rollout.total_rollout_steps" in keys else ()


def run_one_step(
    script: Script,
    inputs: dict[str, str],
    cwd: Path,
    out_dir: Path,
    timeout_s: float = 600,
    extra: tuple[str, ...] = (),
) -> subprocess.CompletedProcess:
    """``python -m <the script's entry point>`` with its normalised command line, :data:`SMALL_STEP` and then
    ``extra``, writing to ``out_dir``; the finished process, its output captured."""
    # a key the script sets with '+' (it is absent from verl's config) keeps its '+'; ours are plain overrides of
    # keys the config has, so only those the script does not set are added, and the ones it sets are replaced
    small = SMALL_STEP + _small_async_step(script)
    ours = {o.partition("=")[0] for o in small}
    kept = [o for o in normalise(script.overrides, inputs) if o.partition("=")[0].lstrip("+~") not in ours]
    argv = script.argv(tuple(kept) + small + tuple(extra) + (f"trainer.default_local_dir={out_dir}",))
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
