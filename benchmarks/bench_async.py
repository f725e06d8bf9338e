"""Synchronous against one-step-off-policy training: samples per second, phases and the reward curve, same work.

Each mode runs ``python -m verl.trainer.main_ppo`` in a subprocess (its own Ray instance) with the same prompts,
seed, group size, lengths and learning rate; only ``actor_rollout_ref.hybrid_engine`` differs:

- ``sync`` (``hybrid_engine=true``): the rollout lives in the actor worker; each step generates, then trains. One
  worker process uses every core (``VERL_NUM_THREADS`` = cores / worker processes).
- ``one_step_off`` (``hybrid_engine=false``): a rollout worker group of its own (one process) generates the next
  batch while the trainer trains on this one; the cores are split between the two processes.
- ``fully_async``: the same groups, ``async_training.staleness_threshold=0.5``, a weight sync every 2 steps, partial
  rollouts (responses in progress at a sync continue with the new weights).

The modes alternate round by round (sync, one_step_off, fully_async, sync, ...), so that drift of the machine hits both.
Reported per mode: the median step time after the warm-up steps and the samples (responses) per second it gives,
the whole process's wall time, the median phase times (``gen``; ``wait_prev_gen``, the trainer's wait for samples,
in one_step_off; ``old_log_prob``; ``update_actor``), the idle ratios, and the reward curve (``critic/score/mean``
per step, and ``val/score/mean`` at the end).

Sizes: ``tiny`` (the embedded model and task, which learns within the run: the reward curve) and ``10m`` (the
10M-parameter model of ``bench_vs_trl.py`` at its settings: the throughput; a random model at lr 1e-6 learns
nothing in a few steps).

Run: ``.venv/bin/python benchmarks/bench_async.py --sizes tiny,10m --rounds 2``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

MODES = {
    "sync": ["actor_rollout_ref.hybrid_engine=true"],
    "one_step_off": ["actor_rollout_ref.hybrid_engine=false"],
    # a sync every 2 steps, up to 3 batches a version, responses in progress continued with the new weights
    "fully_async": [
        "actor_rollout_ref.hybrid_engine=false",
        "async_training.staleness_threshold=0.5",
        "async_training.trigger_parameter_sync_step=2",
        "async_training.partial_rollout=true",
    ],
}
PHASES = ("gen", "wait_prev_gen", "old_log_prob", "update_actor", "step")


def size_overrides(size: str, workdir: Path, steps: int) -> tuple[list[str], int]:
    """The run's settings at ``size`` (shared by both modes), and its samples (responses) per step."""
    common_keys = [
        "trainer.logger=[jsonl]",
        f"trainer.total_training_steps={steps}",
        "trainer.save_freq=-1",
        "trainer.plot=false",
        "trainer.progress_bar=false",
        "trainer.resume_mode=disable",
        f"ray_init.num_cpus={os.cpu_count()}",
    ]
    if size == "tiny":  # the embedded GRPO fp16 run (README's first command): 16 prompts x 4 responses a step
        return [*common_keys, "trainer.val_before_train=false", f"trainer.test_freq={steps}"], 16 * 4
    from bench_vs_trl import SIZE_DEFAULTS, write_10m_model, write_prompts

    settings = SIZE_DEFAULTS["10m"]
    model = write_10m_model(workdir / "model_10m")
    data = workdir / "prompts.parquet"
    write_prompts(data, 1024, seed=0)
    prompts, group = 8, 4
    actor = "actor_rollout_ref.actor"
    return [
        *common_keys,
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        f"data.train_files={data}",
        f"data.train_batch_size={prompts}",
        "data.max_prompt_length=64",
        f"data.max_response_length={int(settings['response_length'])}",
        f"actor_rollout_ref.model.path={model}",
        f"actor_rollout_ref.model.tokenizer_path={model}",
        f"actor_rollout_ref.rollout.n={group}",
        "actor_rollout_ref.rollout.temperature=1.0",
        f"{actor}.strategy=dp",
        f"{actor}.dtype=float32",
        f"{actor}.ppo_mini_batch_size={prompts}",
        f"{actor}.ppo_micro_batch_size_per_gpu={prompts * group}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={prompts * group}",
        f"{actor}.use_dynamic_bsz=true",
        f"{actor}.ppo_max_token_len_per_gpu={int(settings['max_token_len'])}",
        f"{actor}.optim.lr={settings['lr']}",
        f"{actor}.use_kl_loss=false",
        "algorithm.adv_estimator=grpo",
    ], prompts * group


def run_mode(mode: str, overrides: list[str], log_dir: Path, timeout_s: float) -> tuple[list[dict[str, Any]], float]:
    command = [sys.executable, "-m", "verl.trainer.main_ppo", *MODES[mode], f"trainer.default_local_dir={log_dir}"]
    start = time.perf_counter()
    proc = subprocess.run(
        [*command, *overrides], cwd=common.REPO_ROOT, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    wall = time.perf_counter() - start
    metrics = log_dir / "metrics.jsonl"
    if proc.returncode != 0 or not metrics.exists():
        raise RuntimeError(f"{mode} run failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [row for row in rows if "critic/score/mean" in row], wall


def summarise(rows: list[dict[str, Any]], wall: float, warmup: int, samples_per_step: int) -> dict[str, Any]:
    steady = rows[warmup:]

    def median(key: str) -> float | None:
        values = [row[key] for row in steady if key in row]
        return statistics.median(values) if values else None

    return {
        "wall_s": wall,
        "step_s": median("timing_s/step"),
        "samples_per_step": samples_per_step,
        "phases_s": {phase: median(f"timing_s/{phase}") for phase in PHASES},
        "trainer_idle_ratio": median("trainer/idle_ratio"),
        "rollouter_idle_ratio": median("rollouter/idle_ratio"),
        "reward_curve": [row["critic/score/mean"] for row in rows],
        "val_score": next((row["val/score/mean"] for row in reversed(rows) if "val/score/mean" in row), None),
        "updates_applied": sum(row.get("actor/num_updates_successful", 0) > 0 for row in rows),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="tiny,10m")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each mode per size, alternating")
    parser.add_argument("--steps-tiny", type=int, default=60)
    parser.add_argument("--steps-10m", type=int, default=8)
    parser.add_argument("--warmup-steps", type=int, default=2, help="first steps left out of the medians")
    parser.add_argument("--timeout-s", type=float, default=900.0)
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"sizes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for size in args.sizes.split(","):
            steps = args.steps_tiny if size == "tiny" else args.steps_10m
            overrides, samples_per_step = size_overrides(size, workdir, steps)
            runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
            for round_index in range(args.rounds):
                for mode in MODES:
                    log_dir = workdir / f"{size}_{mode}_{round_index}"
                    rows, wall = run_mode(mode, overrides, log_dir, args.timeout_s)
                    runs[mode].append(summarise(rows, wall, args.warmup_steps, samples_per_step))
                    print(
                        f"{size} {mode} round {round_index}: step {runs[mode][-1]['step_s']:.3f} s, wall {wall:.1f} s",
                        flush=True,
                    )
            results["sizes"][size] = runs
    print_table(results)
    out = common.write_results("bench_async", results)
    print(f"results: {out}")
    return 0


def _median_of(summaries: list[dict[str, Any]], get, digits: int) -> str:
    values = [value for value in map(get, summaries) if value is not None]
    return f"{statistics.median(values):.{digits}f}" if values else "-"


def print_table(results: dict[str, Any]) -> None:
    print(
        "| size | mode | step s (median, range) | samples/s | wall s | gen | wait | old_log_prob | update | "
        "trainer idle | rollouter idle | last-10 reward | val |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for size, runs in results["sizes"].items():
        for mode, summaries in runs.items():
            steps = [s["step_s"] for s in summaries]
            step = statistics.median(steps)
            cells = [
                f"{step:.3f} ({min(steps):.3f}-{max(steps):.3f})",
                f"{summaries[0]['samples_per_step'] / step:.0f}",
                _median_of(summaries, lambda s: s["wall_s"], 1),
                *(_median_of(summaries, lambda s, p=p: s["phases_s"][p], 3) for p in PHASES[:-1]),
                _median_of(summaries, lambda s: s["trainer_idle_ratio"], 2),
                _median_of(summaries, lambda s: s["rollouter_idle_ratio"], 2),
                _median_of(summaries, lambda s: statistics.mean(s["reward_curve"][-10:]), 3),
                _median_of(summaries, lambda s: s["val_score"], 3),
            ]
            print(f"| {size} | {mode} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
