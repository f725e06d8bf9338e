"""Throughput of the whole PPO/GRPO loop: the trainer's own per-phase figures, and the update phase's FLOP/s.

Runs ``python -m verl.trainer.main_ppo`` in a subprocess (its own Ray instance, nothing shared with this process)
with ``trainer.logger=[jsonl]``, then reads the run's ``metrics.jsonl``: ``perf/tokens_per_second`` for the whole
step and per phase (``gen``, ``old_log_prob``, ``update_actor``), and the ``timing_s/*`` phase times. The first
steps are warm-up and are left out of the medians. The update phase's achieved FLOP/s is estimated as
6 x parameters x tokens per update (forward + backward of a dense model) over ``timing_s/update_actor``, and shown
as a fraction of this machine's measured fp32 matmul rate (a 1024 x 1024 product timed in a loop).

Run: ``.venv/bin/python benchmarks/bench_train_loop.py`` (``--help``; extra ``key=value`` arguments go to the
trainer, e.g. ``actor_rollout_ref.actor.strategy=megatron``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

PHASES = ("gen", "old_log_prob", "ref", "update_actor")


def trainer_overrides(args, log_dir: Path) -> list[str]:
    """The command-line overrides of the benchmarked run (no validation, plots or checkpoints in the timing)."""
    return [
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={log_dir}",
        f"trainer.total_training_steps={args.steps}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.save_freq=-1",
        "trainer.plot=false",
        "trainer.progress_bar=false",
        "trainer.resume_mode=disable",
        f"actor_rollout_ref.actor.strategy={args.strategy}",
        f"actor_rollout_ref.actor.dtype={args.dtype}",
        f"ray_init.num_cpus={args.ray_cpus}",
        *args.overrides,
    ]


def run_trainer(overrides: list[str], log_dir: Path, timeout_s: float) -> tuple[list[dict[str, Any]], float]:
    """Run the trainer; returns the records of its metrics.jsonl and the wall time of the whole process.

    Raises:
        RuntimeError: the trainer exited non-zero or wrote no metrics (the tail of its output is in the message).
    """
    command = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides]
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=common.REPO_ROOT, capture_output=True, text=True, timeout=timeout_s, check=False)
    wall = time.perf_counter() - start
    found = sorted(log_dir.rglob("metrics.jsonl"))
    if proc.returncode != 0 or not found:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise RuntimeError(f"trainer exited with {proc.returncode}, metrics files: {found}\n{tail}")
    with open(found[0]) as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    return records, wall


def count_model_parameters(model_path: str) -> int:
    """Parameters of the trained model (tied weights once), built on the meta device from its config."""
    import torch
    from transformers import AutoModelForCausalLM

    from verl.models.loading import load_hf_config

    config = load_hf_config(None if model_path == "default" else model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return common.num_parameters(model)


def summarise(records: list[dict[str, Any]], num_warmup: int, num_params: int, fp32_rate: float) -> dict[str, Any]:
    """Medians over the steps after warm-up, and the update phase's FLOP/s and its share of the matmul rate."""
    steps = [r for r in records if "timing_s/update_actor" in r][num_warmup:]
    if not steps:
        raise RuntimeError(f"no training step after {num_warmup} warm-up step(s) in {len(records)} record(s)")

    def med(key: str) -> float | None:
        values = [float(r[key]) for r in steps if isinstance(r.get(key), int | float)]
        return common.median(values) if values else None

    summary: dict[str, Any] = {"num_steps_measured": len(steps), "num_parameters": num_params}
    summary["tokens_per_second"] = med("perf/tokens_per_second")
    for phase in PHASES:
        summary[f"tokens_per_second/{phase}"] = med(f"perf/tokens_per_second/{phase}")
    for key in sorted({k for r in steps for k in r if k.startswith("timing_s/")}):
        summary[key] = med(key)
    update_flops = [
        6.0 * num_params * float(r["perf/num_tokens"]) / float(r["timing_s/update_actor"])
        for r in steps
        if r.get("perf/num_tokens") and r.get("timing_s/update_actor")
    ]
    summary["update_flops_per_second"] = common.median(update_flops) if update_flops else None
    summary["fp32_matmul_flops_per_second"] = fp32_rate
    if summary["update_flops_per_second"] is not None:
        summary["update_fraction_of_fp32_matmul"] = summary["update_flops_per_second"] / fp32_rate
    return summary


COLUMNS = ["metric", "value"]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8, help="training steps of the run")
    parser.add_argument("--warmup-steps", type=int, default=2, help="first steps left out of the medians")
    parser.add_argument("--strategy", default="dp", choices=["dp", "megatron"])
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--model-path", default="default", help="actor_rollout_ref.model.path (for the FLOP count)")
    parser.add_argument("--ray-cpus", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument("--tag", default="", help="suffix of the result file name (for runs with overrides)")
    parser.add_argument("overrides", nargs="*", help="extra trainer overrides, key=value")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    common.quiet_libraries()
    if args.steps <= args.warmup_steps:
        raise SystemExit(f"--steps ({args.steps}) must exceed --warmup-steps ({args.warmup_steps}).")
    if args.model_path != "default":
        args.overrides.append(f"actor_rollout_ref.model.path={args.model_path}")
    fp32_rate = common.matmul_flops_per_second(1024)
    num_params = count_model_parameters(args.model_path)
    with tempfile.TemporaryDirectory(prefix="bench_train_loop_") as tmp:
        log_dir = Path(tmp) / "run"
        overrides = trainer_overrides(args, log_dir)
        records, wall = run_trainer(overrides, log_dir, args.timeout_s)
    summary = summarise(records, args.warmup_steps, num_params, fp32_rate)
    summary["process_wall_s"] = wall
    print(common.format_table([{"metric": k, "value": v} for k, v in summary.items()], COLUMNS))
    payload = {
        "settings": {k: v for k, v in vars(args).items()},
        "trainer_command": "python -m verl.trainer.main_ppo " + " ".join(overrides),
        "summary": summary,
        "records": records,
    }
    name = f"bench_train_loop_{args.strategy}_{args.dtype}" + (f"_{args.tag}" if args.tag else "")
    print(f"wrote {common.write_results(name, payload)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
