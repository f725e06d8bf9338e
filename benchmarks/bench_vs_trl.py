"""GRPO training throughput of verl's trainer (``dp`` backend) against TRL's ``GRPOTrainer`` on the same job.

Both train the embedded tiny model on the same prompts (one parquet file of the reverse-the-digits task, written
once), with the same group size, response length, prompts per step, learning rate, clipping, loss aggregation
(token mean over the batch: TRL's ``dapo``), no KL term and the same precision, one optimizer update per step.
Each run is a fresh subprocess; the two trainers alternate (verl, TRL, TRL, verl, ...) so that machine drift
cancels. A step's time is the trainer's own: ``timing_s/step`` from verl's ``metrics.jsonl``, and the time between
``on_step_begin`` and ``on_step_end`` in TRL (generation, reward, advantages, forward/backward, optimizer step).
Throughput is completions per second; the figure of merit is the median over rounds of verl's / TRL's.

TRL lives in its own virtual environment so that it can never change the project's ``transformers``:

    python3 -m venv .venv-bench && .venv-bench/bin/pip install torch==2.13.0 && .venv-bench/bin/pip install -e . trl
    .venv-bench/bin/python benchmarks/bench_vs_trl.py
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402


def write_prompts(path: Path, num_prompts: int, seed: int) -> None:
    """The shared training prompts: ``prompt``, ``ground_truth``, ``data_source`` columns, as parquet."""
    import pandas as pd

    from verl.utils.reward_score import tiny_task

    rng = random.Random(seed)
    rows = []
    for _ in range(num_prompts):
        prompt, answer = tiny_task.make_example(rng)
        rows.append({"prompt": prompt, "ground_truth": answer, "data_source": tiny_task.DATA_SOURCE})
    pd.DataFrame(rows).to_parquet(path)


# ---------------------------------------------------------------------------------------------- verl


def verl_overrides(args, data_file: Path, log_dir: Path) -> list[str]:
    num_samples = args.prompts_per_step * args.group_size
    actor = "actor_rollout_ref.actor"
    return [
        f"data.train_files={data_file}",
        f"data.train_batch_size={args.prompts_per_step}",
        f"data.max_prompt_length={args.max_prompt_length}",
        f"data.max_response_length={args.response_length}",
        f"actor_rollout_ref.rollout.n={args.group_size}",
        f"actor_rollout_ref.rollout.name={args.rollout}",
        "actor_rollout_ref.rollout.temperature=1.0",
        f"{actor}.strategy=dp",
        f"{actor}.dtype={args.dtype}",
        f"{actor}.ppo_mini_batch_size={args.prompts_per_step}",
        f"{actor}.ppo_micro_batch_size_per_gpu={num_samples}",
        f"{actor}.log_prob_micro_batch_size_per_gpu={num_samples}",
        f"{actor}.optim.lr={args.lr}",
        f"{actor}.optim.clip_grad={args.max_grad_norm}",
        f"{actor}.optim.weight_decay=0.0",
        f"{actor}.clip_ratio={args.clip_ratio}",
        f"{actor}.loss_agg_mode=token-mean",
        f"{actor}.use_kl_loss=false",
        f"{actor}.entropy_coeff=0.0",
        "algorithm.adv_estimator=grpo",
        "algorithm.norm_adv_by_std_in_grpo=true",
        f"trainer.total_training_steps={args.steps}",
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={log_dir}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.save_freq=-1",
        "trainer.plot=false",
        "trainer.progress_bar=false",
        "trainer.resume_mode=disable",
        f"trainer.device={args.device}",
        f"ray_init.num_cpus={os.cpu_count()}",
    ]


def run_verl(args, data_file: Path, workdir: Path) -> tuple[list[float], dict[str, float]]:
    """Step times (s) of one verl run, and its median phase times (``timing_s/*``), from its metrics.jsonl."""
    log_dir = workdir / f"verl_{time.monotonic_ns()}"
    command = [sys.executable, "-m", "verl.trainer.main_ppo", *verl_overrides(args, data_file, log_dir)]
    proc = subprocess.run(command, cwd=common.REPO_ROOT, capture_output=True, text=True, timeout=args.timeout_s)
    files = sorted(log_dir.rglob("metrics.jsonl"))
    if proc.returncode != 0 or not files:
        raise RuntimeError(f"verl run failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    records = [json.loads(line) for line in files[0].read_text().splitlines() if line.strip()]
    steps = [r for r in records if "timing_s/step" in r]
    measured = steps[args.warmup_steps :] or steps
    phases = {k: common.median([float(r[k]) for r in measured if k in r]) for k in measured[0] if "timing_s/" in k}
    return [float(r["timing_s/step"]) for r in steps], phases


# ---------------------------------------------------------------------------------------------- TRL


def trl_child(args) -> int:
    """Inside the TRL subprocess: train, and print the step times as one JSON line."""
    import pandas as pd
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from verl.models.loading import load_hf_causal_lm, load_tokenizer
    from verl.utils.reward_score import tiny_task

    dataset = Dataset.from_pandas(pd.read_parquet(args.trl_child)[["prompt", "ground_truth"]])
    tokenizer = load_tokenizer()
    model = load_hf_causal_lm(dtype=torch.float32)

    def reward(completions, ground_truth, **_):
        return [tiny_task.compute_score(c, g) for c, g in zip(completions, ground_truth, strict=True)]

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times: list[float] = []
            self._start = 0.0

        def on_step_begin(self, *_, **__):
            common.synchronize()
            self._start = time.perf_counter()

        def on_step_end(self, *_, **__):
            common.synchronize()
            self.times.append(time.perf_counter() - self._start)

    timer = StepTimer()
    with tempfile.TemporaryDirectory(prefix="bench_trl_") as out:
        config = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=args.prompts_per_step * args.group_size,
            gradient_accumulation_steps=1,
            num_generations=args.group_size,
            max_completion_length=args.response_length,
            temperature=1.0,
            learning_rate=args.lr,
            lr_scheduler_type="constant",
            weight_decay=0.0,
            max_grad_norm=args.max_grad_norm,
            epsilon=args.clip_ratio,
            beta=0.0,
            loss_type="dapo",
            scale_rewards="group",
            max_steps=args.steps,
            gradient_checkpointing=False,
            use_cpu=args.device == "cpu",
            bf16=args.dtype == "bfloat16",
            fp16=args.dtype == "float16",
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            seed=1,
            disable_tqdm=True,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[timer],
        )
        trainer.train()
    print("STEP_TIMES " + json.dumps(timer.times), flush=True)
    return 0


def run_trl(args, data_file: Path) -> tuple[list[float], dict[str, float]]:
    command = [sys.executable, __file__, "--trl-child", str(data_file), *child_flags(args)]
    proc = subprocess.run(command, cwd=common.REPO_ROOT, capture_output=True, text=True, timeout=args.timeout_s)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("STEP_TIMES ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"TRL run failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return json.loads(lines[-1].removeprefix("STEP_TIMES ")), {}


def child_flags(args) -> list[str]:
    names = ["steps", "prompts_per_step", "group_size", "response_length", "lr", "max_grad_norm", "clip_ratio"]
    flags = [f"--{n.replace('_', '-')}={getattr(args, n)}" for n in names]
    return [*flags, f"--dtype={args.dtype}", f"--device={args.device}"]


# ---------------------------------------------------------------------------------------------- main


def summarise_round(name: str, step_times: list[float], num_warmup: int, num_samples: int) -> dict[str, Any]:
    measured = step_times[num_warmup:]
    if not measured:
        raise RuntimeError(f"{name}: {len(step_times)} step(s), none left after {num_warmup} warm-up step(s)")
    step_s = common.median(measured)
    return {"trainer": name, "step_s": step_s, "samples_per_second": num_samples / step_s, "step_times": step_times}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4, help="verl/TRL run pairs (order flips every round)")
    parser.add_argument("--steps", type=int, default=12, help="training steps per run")
    parser.add_argument("--warmup-steps", type=int, default=2, help="first steps of a run left out")
    parser.add_argument("--prompts-per-step", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=4, help="samples per prompt (GRPO group)")
    parser.add_argument("--response-length", type=int, default=8)
    parser.add_argument("--max-prompt-length", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--clip-ratio", type=float, default=0.2)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument(
        "--rollout",
        default="hf",
        choices=["hf", "naive"],
        help="verl's rollout: hf (transformers generate with a KV cache, the engine TRL uses) or naive",
    )
    parser.add_argument("--device", default="cuda" if _cuda() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--timeout-s", type=float, default=300.0)
    parser.add_argument("--trl-child", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def main(argv=None) -> int:
    args = parse_args(argv)
    common.quiet_libraries()
    if args.trl_child:
        return trl_child(args)
    if args.dtype == "float16" and args.device == "cpu":
        raise SystemExit("--dtype float16 needs --device cuda: TRL (accelerate) has no fp16 mixed precision on CPU.")
    import trl

    num_samples = args.prompts_per_step * args.group_size
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_vs_trl_") as tmp:
        workdir = Path(tmp)
        data_file = workdir / "prompts.parquet"
        write_prompts(data_file, num_prompts=max(args.steps * args.prompts_per_step * 2, 256), seed=1)
        for round_index in range(args.rounds):
            order = ["verl", "trl"] if round_index % 2 == 0 else ["trl", "verl"]
            for name in order:
                start = time.perf_counter()
                load_before = os.getloadavg()[0]
                times, phases = run_verl(args, data_file, workdir) if name == "verl" else run_trl(args, data_file)
                row = summarise_round(name, times, args.warmup_steps, num_samples)
                row.update(round=round_index, process_wall_s=time.perf_counter() - start, phases_s=phases)
                row.update(load_1m_before=load_before, load_1m_after=os.getloadavg()[0])
                rows.append(row)
                print(f"  round {round_index} {name}: {row['step_s'] * 1e3:.1f} ms/step", flush=True)
    ratios = []
    for round_index in range(args.rounds):
        by_name = {r["trainer"]: r for r in rows if r["round"] == round_index}
        ratios.append(by_name["verl"]["samples_per_second"] / by_name["trl"]["samples_per_second"])
    columns = ["round", "trainer", "step_s", "samples_per_second", "process_wall_s", "load_1m_before", "load_1m_after"]
    print(common.format_table(rows, columns))
    pooled = {n: common.median([r["samples_per_second"] for r in rows if r["trainer"] == n]) for n in ("verl", "trl")}
    verl_phases = [r["phases_s"] for r in rows if r["trainer"] == "verl"]
    phase_medians = {k: common.median([p[k] for p in verl_phases if k in p]) for k in verl_phases[0]}
    print(
        "verl phase medians (s): "
        + ", ".join(f"{k.removeprefix('timing_s/')}={v:.4f}" for k, v in phase_medians.items())
    )
    print(f"verl / TRL throughput (median over {args.rounds} rounds): {common.median(ratios):.3f}")
    payload = {
        "settings": {k: v for k, v in vars(args).items() if k != "trl_child"},
        "trl_version": trl.__version__,
        "throughput_ratio_verl_over_trl": common.median(ratios),
        "ratios_per_round": ratios,
        "throughput_ratio_pooled_medians": pooled["verl"] / pooled["trl"],
        "verl_phase_medians_s": phase_medians,
        "rows": rows,
    }
    print(f"wrote {common.write_results('bench_vs_trl', payload)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
