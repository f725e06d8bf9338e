"""GRPO training throughput and memory of verl's trainer (``dp``) against TRL's ``GRPOTrainer``, at any model shape.

Both trainers train the same model directory on the same prompts (one parquet file of the reverse-the-digits task,
written once), with the same group size, response length, prompts per step, learning rate, clipping, loss
aggregation (token mean over the batch: TRL's ``dapo``), no KL term and the same precision, one optimizer update
per step. ``--sizes`` picks the models, run one after the other:

* ``tiny``: the embedded model (``verl/models/tiny``, 0.1M parameters); response length 8, 12 steps, 4 rounds,
  learning rate 3e-3; verl updates the whole batch as one micro-batch (a budget of 4096 real tokens).
* ``10m``: a Qwen2-shaped model written once into the benchmark's temporary directory (hidden 384, MLP 1024, 6
  layers, 6 query / 2 kv heads of 64, tied embeddings, context 256, the tiny model's tokenizer and vocabulary,
  seeded random init, fp32 safetensors; about 9.5M parameters); response length 64, 6 steps, 2 rounds, learning
  rate 1e-6, so that neither trainer's policy moves away from the random model's response lengths within the run
  (both trainers' mean response lengths are reported, to show that they did the same work); verl updates in
  micro-batches of at most 512 real tokens (``use_dynamic_bsz``, cut from length-sorted rows). TRL computes the
  batch as one (``per_device_train_batch_size`` = the batch, no gradient accumulation).

Any other model: ``--model DIR`` (a Hugging Face model directory with its tokenizer), ``--shape`` (a family,
hidden size, layers, heads, key/value heads, head size, MLP size, vocabulary and tied or untied LM head, written as a
seeded random model: see ``model_shapes.py``), or ``--sweep``: the shapes of ``model_shapes.SWEEP`` (Llama, Mistral,
Qwen2, Qwen3 and Gemma shapes of 10-60M parameters, tied and untied, vocabularies of 50 to 151,936 tokens, responses
of 32 to 128 tokens), each side by side with TRL in its own alternating rounds (``--sweep-cases`` picks some).
These take ``SHAPE_DEFAULTS`` (5 steps, 2 rounds, learning rate 1e-6, micro-batches of 512 real tokens; a sweep
case its own response length), each overridable (``--steps``, ``--rounds``, ``--response-length``, ``--lr``,
``--max-token-len``). ``--compile`` adds a third trainer to every round: verl with
``actor_rollout_ref.actor.use_torch_compile=true``. Results go to ``benchmarks/results/bench_vs_trl_sweep.json``
(``--sweep`` alone), ``bench_vs_trl_custom.json`` (any other mix) or ``bench_vs_trl.json`` (the two sizes).

verl loads the directory through ``actor_rollout_ref.model.path`` (and ``tokenizer_path``), TRL through
``verl.models.loading.load_hf_causal_lm`` / ``load_tokenizer``. verl generates with ``--rollout`` (default
``naive``, the project's default rollout; ``hf`` is transformers' ``generate``, the engine TRL uses).

Each run is a fresh subprocess; the two trainers alternate (verl, TRL, then TRL, verl, ...) so that machine drift
cancels. A step's time is the trainer's own: ``timing_s/step`` from verl's ``metrics.jsonl``, and the time between
``on_step_begin`` and ``on_step_end`` in TRL (generation, reward, advantages, forward/backward, optimizer step); the
first ``--warmup-steps`` of every run are left out. Throughput is completions per second; the figure of merit of a
size, ``throughput_ratio_<size>``, is the median over rounds of verl's / TRL's (each round pairs its verl and TRL
run). Since the two sample their own responses, whose lengths differ a little, each size also reports the ratio in
tokens per second (``token_throughput_ratio``: prompt + response tokens per step over the step time).

Peak memory is the resident set (CPU). TRL's is its process's peak (``os.wait4`` on the child). verl's is the
driver's peak (``os.wait4`` on ``main_ppo``) plus the actor worker's own peak, which the worker logs each step as
``perf/cpu_peak_rss_gb`` (max over steps); Ray's own daemons (GCS, raylet, dashboard) are not counted. Linux's
``wait4`` reports the largest peak of the child and of any descendant it reaped, never a sum.

Each phase's share of the machine's fp32 matmul rate (``common.matmul_flops_per_second``: ``torch.mm``, which is MKL
on CPU; and again against oneDNN's rate, the kernel verl's linear layers use on CPU, see ``verl.utils.cpu_linear``;
both measured once per case right before its rounds), with N the parameters that take part in products (an untied
input embedding is a lookup and is left out) and T real tokens (prompt +
response) of a step's batch (verl's ``perf/num_tokens``, median over steps and runs): generation ~ 2*N*T (a
KV-cached decode's work), update ~ 6*N*T, an old-log-prob pass (when verl times one) ~ 2*N*T; a whole step is their
sum. Share = FLOPs / (median seconds * rate). TRL's step share uses the same generation + update FLOPs at verl's
token count (TRL does no old-log-prob pass with one update per step) over TRL's own median step time; the two
trainers' batches are sampled independently, so their real token counts differ a little.

TRL lives in its own virtual environment so that it can never change the project's ``transformers`` (the project's
``.venv`` has no TRL):

    python3 -m venv .venv-bench && .venv-bench/bin/pip install torch==2.13.0 && .venv-bench/bin/pip install -e . trl
    .venv-bench/bin/python benchmarks/bench_vs_trl.py                       # both sizes, several minutes
    .venv-bench/bin/python benchmarks/bench_vs_trl.py --sizes 10m --rounds-10m 4
    .venv-bench/bin/python benchmarks/bench_vs_trl.py --sweep                 # about an hour on 2 cores
    .venv-bench/bin/python benchmarks/bench_vs_trl.py --shape family=llama,hidden=512,layers=8,heads=8,kv_heads=8
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from model_shapes import SHAPE_10M, SWEEP, Shape, parse_shape, write_model  # noqa: E402

from verl.utils.cpu_linear import onednn_available  # noqa: E402

# Per-size defaults; each is overridable as --<field>-<size> (e.g. --steps-10m 8).
# The 10m model starts from random weights, and at the tiny model's learning rate its policy moves within a few
# steps, differently in each trainer (measured: verl's mean response fell from 64 to 8 tokens by step 3 in one run
# while TRL's stayed long), so the two would no longer do the same work; at 1e-6 both keep the random model's
# response lengths, and every step still runs the full forward, backward and optimizer step.
# verl's update takes micro-batches of at most ``max_token_len`` real tokens: the whole tiny batch (about 700
# tokens) in one, so that its per-call costs are paid once; 512 at 10m, where the arithmetic dominates and
# micro-batches of rows of similar length carry little padding (measured on 2 cores: the update took 1.1 s against
# 2.0 s as one micro-batch of 64 padded rows; 256 and 1024 tokens gave 1.15 s and 1.39 s).
# --model, --shape and --sweep cases (a sweep case brings its own response length); 5 steps, the first 2 left out.
SHAPE_DEFAULTS: dict[str, float] = {"response_length": 64, "steps": 5, "rounds": 2, "lr": 1e-6, "max_token_len": 512}

# verl with torch.compile on the actor's forward (--compile)
COMPILE_OVERRIDES = ("actor_rollout_ref.actor.use_torch_compile=true",)

SIZE_DEFAULTS: dict[str, dict[str, float]] = {
    "tiny": {"response_length": 8, "steps": 12, "rounds": 4, "lr": 3e-3, "max_token_len": 4096},
    "10m": {"response_length": 64, "steps": 6, "rounds": 2, "lr": 1e-6, "max_token_len": 512},
}


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


def write_10m_model(out_dir: Path, seed: int = 0) -> Path:
    """Write the ~9.5M-parameter Qwen2 model of the ``10m`` size (``model_shapes.SHAPE_10M``)."""
    return write_model(SHAPE_10M, out_dir, seed)


def model_dir(size: str, workdir: Path) -> Path:
    from verl.models.loading import resolve_model_path

    if size == "tiny":
        return Path(resolve_model_path(None))
    return write_10m_model(workdir / f"model_{size}")


def count_parameters(path: Path) -> tuple[int, int]:
    """The model's distinct parameters, and those that take part in matrix products.

    An untied input embedding is a lookup, not a product, so it is left out of the second count (a tied one is the
    LM head's weight and stays in); the FLOP estimates use the second.
    """
    import torch

    from verl.models.loading import load_hf_causal_lm

    model = load_hf_causal_lm(path, dtype=torch.float32)
    total = common.num_parameters(model)
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = head is not None and head.weight is embedding.weight
    return total, total if tied else total - embedding.weight.numel()


# ---------------------------------------------------------------------------------------------- processes


def run_process(name: str, command: list[str], log_stem: Path, timeout_s: float) -> tuple[int, float, str]:
    """Run ``command`` with stdout/stderr to files; its exit code, its peak RSS (GiB, ``wait4``) and its stdout.

    On timeout the child's whole process group is killed (the exit code is then negative).
    """
    stdout_path, stderr_path = log_stem.with_suffix(".out"), log_stem.with_suffix(".err")
    with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
        proc = subprocess.Popen(command, cwd=common.REPO_ROOT, stdout=out, stderr=err, start_new_session=True)
        timer = threading.Timer(timeout_s, lambda: _kill_group(proc.pid))
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here; Popen must not wait again
    stdout = stdout_path.read_text(errors="replace")
    if proc.returncode != 0:
        tail = (stdout + stderr_path.read_text(errors="replace"))[-3000:]
        raise RuntimeError(f"{name} run failed (exit {proc.returncode}; logs {log_stem}.*):\n{tail}")
    return proc.returncode, usage.ru_maxrss / 2**20, stdout  # ru_maxrss is KiB on Linux


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# ---------------------------------------------------------------------------------------------- verl


def verl_overrides(args, model_path: Path, data_file: Path, log_dir: Path) -> list[str]:
    num_samples = args.prompts_per_step * args.group_size
    actor = "actor_rollout_ref.actor"
    return [
        f"data.train_files={data_file}",
        f"data.train_batch_size={args.prompts_per_step}",
        f"data.max_prompt_length={args.max_prompt_length}",
        f"data.max_response_length={args.response_length}",
        f"actor_rollout_ref.model.path={model_path}",
        f"actor_rollout_ref.model.tokenizer_path={model_path}",
        f"actor_rollout_ref.rollout.n={args.group_size}",
        f"actor_rollout_ref.rollout.name={args.rollout}",
        "actor_rollout_ref.rollout.temperature=1.0",
        f"{actor}.strategy=dp",
        f"{actor}.dtype={args.dtype}",
        f"{actor}.ppo_mini_batch_size={args.prompts_per_step}",
        f"{actor}.ppo_micro_batch_size_per_gpu={num_samples}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={num_samples}",
        # micro-batches by a budget of real tokens, cut from length-sorted rows (see verl.utils.micro_batching)
        f"{actor}.use_dynamic_bsz=true",
        f"{actor}.ppo_max_token_len_per_gpu={args.max_token_len}",
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


def run_verl(
    args, model_path: Path, data_file: Path, workdir: Path, extra_overrides: tuple[str, ...] = ()
) -> dict[str, Any]:
    """One verl run: its step times, median phase times and token counts (from metrics.jsonl), and peak RSS."""
    log_dir = workdir / f"verl_{time.monotonic_ns()}"
    log_dir.mkdir()
    overrides = [*verl_overrides(args, model_path, data_file, log_dir), *extra_overrides]
    command = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides]
    _, driver_rss_gb, _ = run_process("verl", command, log_dir / "driver", args.timeout_s)
    files = sorted(log_dir.rglob("metrics.jsonl"))
    if not files:
        raise RuntimeError(f"verl run wrote no metrics.jsonl under {log_dir}")
    records = [json.loads(line) for line in files[0].read_text().splitlines() if line.strip()]
    steps = [r for r in records if "timing_s/step" in r]
    measured = steps[args.warmup_steps :] or steps
    phases = {k: common.median([float(r[k]) for r in measured if k in r]) for k in measured[0] if "timing_s/" in k}
    worker_rss = [float(r["perf/cpu_peak_rss_gb"]) for r in steps if "perf/cpu_peak_rss_gb" in r]
    worker_rss_gb = max(worker_rss) if worker_rss else None
    return {
        "step_times": [float(r["timing_s/step"]) for r in steps],
        "response_lengths": [float(r["response_length/mean"]) for r in steps if "response_length/mean" in r],
        "phases_s": phases,
        "num_tokens": _median_of(measured, "perf/num_tokens"),
        "response_length_mean": _median_of(measured, "response_length/mean"),
        "driver_peak_rss_gb": driver_rss_gb,
        "worker_peak_rss_gb": worker_rss_gb,
        "peak_rss_gb": driver_rss_gb + (worker_rss_gb or 0.0),
    }


def _median_of(records: list[dict[str, Any]], key: str) -> float | None:
    values = [float(r[key]) for r in records if key in r]
    return common.median(values) if values else None


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
    tokenizer = load_tokenizer(args.model_path)
    model = load_hf_causal_lm(args.model_path, dtype=torch.float32)

    def reward(completions, ground_truth, **_):
        return [tiny_task.compute_score(c, g) for c, g in zip(completions, ground_truth, strict=True)]

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times: list[float] = []
            self.completion_lengths: list[float] = []  # mean completion tokens of each step, as TRL logs it
            self._start = 0.0

        def on_log(self, *_, logs=None, **__):
            if logs and "completions/mean_length" in logs:
                self.completion_lengths.append(float(logs["completions/mean_length"]))

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
    print("COMPLETION_LENGTHS " + json.dumps(timer.completion_lengths), flush=True)
    return 0


def run_trl(args, model_path: Path, data_file: Path, workdir: Path) -> dict[str, Any]:
    """One TRL run (a subprocess): its step times and its peak RSS."""
    flags = [f"--{n.replace('_', '-')}={getattr(args, n)}" for n in CHILD_FLAGS]
    command = [sys.executable, __file__, "--trl-child", str(data_file), f"--model-path={model_path}", *flags]
    _, rss_gb, stdout = run_process("TRL", command, workdir / f"trl_{time.monotonic_ns()}", args.timeout_s)
    lines = [line for line in stdout.splitlines() if line.startswith("STEP_TIMES ")]
    if not lines:
        raise RuntimeError(f"TRL run printed no STEP_TIMES line:\n{stdout[-3000:]}")
    lengths = [line for line in stdout.splitlines() if line.startswith("COMPLETION_LENGTHS ")]
    completion_lengths = json.loads(lengths[-1].removeprefix("COMPLETION_LENGTHS ")) if lengths else []
    measured = completion_lengths[args.warmup_steps :] or completion_lengths
    return {
        "step_times": json.loads(lines[-1].removeprefix("STEP_TIMES ")),
        "peak_rss_gb": rss_gb,
        "response_length_mean": common.median(measured) if measured else None,
        "response_lengths": completion_lengths,
    }


CHILD_FLAGS = [
    "steps",
    "prompts_per_step",
    "group_size",
    "response_length",
    "lr",
    "max_grad_norm",
    "clip_ratio",
    "dtype",
    "device",
]


# ---------------------------------------------------------------------------------------------- cases


@dataclasses.dataclass
class Case:
    """One model and its settings, benchmarked in ``run.rounds`` rounds of every trainer."""

    name: str
    run: argparse.Namespace  # ``args`` with the case's response_length, steps, rounds, lr and max_token_len
    write_model: Callable[[Path], Path]  # the model directory, written under the benchmark's work directory
    model_info: dict[str, Any]


def size_args(args, size: str) -> argparse.Namespace:
    """``args`` with this size's steps, rounds and response length in the plain fields."""
    run = argparse.Namespace(**vars(args))
    for field in SIZE_DEFAULTS[size]:
        setattr(run, field, getattr(args, f"{field}_{size}"))
    return run


def shape_args(args, response_length: int | None = None) -> argparse.Namespace:
    """``args`` with a model or shape case's settings: the flags given, else the case's, else SHAPE_DEFAULTS."""
    run = argparse.Namespace(**vars(args))
    for field, default in SHAPE_DEFAULTS.items():
        if field == "response_length" and response_length is not None:
            default = response_length
        given = getattr(args, field)
        setattr(run, field, default if given is None else given)
    return run


def build_cases(args) -> list[Case]:
    """The cases of ``--sizes``, ``--model``, ``--shape`` and ``--sweep``, in that order."""
    cases = []
    for size in args.sizes:
        info = {"path": "verl/models/tiny"} if size == "tiny" else {"shape": dataclasses.asdict(SHAPE_10M), "seed": 0}
        cases.append(Case(size, size_args(args, size), functools.partial(model_dir, size), info))
    if args.model:
        path = Path(args.model).resolve()
        cases.append(Case(path.name, shape_args(args), lambda _workdir: path, {"path": str(path)}))
    if args.shape:
        shape = parse_shape(args.shape)
        cases.append(Case("shape", shape_args(args), _shape_writer("shape", shape), _shape_info(shape)))
    if args.sweep:
        wanted = {name.strip() for name in args.sweep_cases.split(",") if name.strip()} if args.sweep_cases else None
        known = {case.name for case in SWEEP}
        if wanted and wanted - known:
            raise SystemExit(f"--sweep-cases: unknown {sorted(wanted - known)}; choose from {sorted(known)}")
        for case in SWEEP:
            if wanted is None or case.name in wanted:
                run = shape_args(args, case.response_length)
                cases.append(Case(case.name, run, _shape_writer(case.name, case.shape), _shape_info(case.shape)))
    return cases


def _shape_writer(name: str, shape: Shape) -> Callable[[Path], Path]:
    return lambda workdir: write_model(shape, workdir / f"model_{name}")


def _shape_info(shape: Shape) -> dict[str, Any]:
    return {"shape": dataclasses.asdict(shape), "describe": shape.describe(), "seed": 0}


def trainers(args) -> dict[str, Callable[..., dict[str, Any]]]:
    """The trainers of every round, by name: verl, TRL, and verl with ``use_torch_compile`` under ``--compile``."""
    named: dict[str, Callable[..., dict[str, Any]]] = {"verl": run_verl}
    if args.compile:
        named["verl_compile"] = functools.partial(run_verl, extra_overrides=COMPILE_OVERRIDES)
    named["trl"] = run_trl
    return named


def summarise_run(name: str, result: dict[str, Any], num_warmup: int, num_samples: int) -> dict[str, Any]:
    measured = result["step_times"][num_warmup:]
    if not measured:
        raise RuntimeError(f"{name}: {len(result['step_times'])} step(s), none left after {num_warmup} warm-up")
    step_s = common.median(measured)
    return {"trainer": name, "step_s": step_s, "samples_per_second": num_samples / step_s, **result}


def phase_shares(
    num_params: int, num_tokens: float, phases: dict[str, float], verl_step_s: float, trl_step_s: float, rate: float
) -> tuple[dict[str, float], dict[str, float]]:
    """FLOPs of a step's work (see the module docstring) and each phase's share of the matmul rate."""
    flops = {"gen": 2.0 * num_params * num_tokens, "update_actor": 6.0 * num_params * num_tokens}
    if "timing_s/old_log_prob" in phases:
        flops["old_log_prob"] = 2.0 * num_params * num_tokens
    step_flops = sum(flops.values())
    trl_flops = flops["gen"] + flops["update_actor"]
    shares = {
        f"verl_{phase}": work / (phases[f"timing_s/{phase}"] * rate)
        for phase, work in flops.items()
        if f"timing_s/{phase}" in phases
    }
    shares["verl_step"] = step_flops / (verl_step_s * rate)
    shares["trl_step"] = trl_flops / (trl_step_s * rate)
    return {**flops, "verl_step": step_flops, "trl_step": trl_flops}, shares


def token_throughput_ratios(rows: list[dict[str, Any]], num_rounds: int, num_samples: int) -> list[float]:
    """Per round, verl's tokens per second over TRL's (prompt + response tokens of a step, per step time).

    Both read the same prompts; a sample's prompt tokens are verl's (its real tokens per step less its responses),
    its response tokens each trainer's own mean. Empty when verl logged no token count.
    """
    ratios = []
    for round_index in range(num_rounds):
        by_name = {r["trainer"]: r for r in rows if r["round"] == round_index}
        verl, trl = by_name["verl"], by_name["trl"]
        if verl["num_tokens"] is None or verl["response_length_mean"] is None or trl["response_length_mean"] is None:
            return []
        prompt_tokens = verl["num_tokens"] / num_samples - verl["response_length_mean"]
        trl_tokens = num_samples * (prompt_tokens + trl["response_length_mean"])
        ratios.append((verl["num_tokens"] / verl["step_s"]) / (trl_tokens / trl["step_s"]))
    return ratios


def _finite(value: float) -> float | None:
    return value if value == value else None  # NaN (too few rounds) -> null in the JSON


def bench_case(args, case: Case, data_file: Path, workdir: Path) -> dict[str, Any]:
    run = case.run
    num_samples = run.prompts_per_step * run.group_size
    path = case.write_model(workdir)
    num_params, matmul_params = count_parameters(path)
    print(f"[{case.name}] model {path} ({num_params:,} parameters); measuring the fp32 matmul rate", flush=True)
    rate = common.matmul_flops_per_second()
    onednn_rate = common.matmul_flops_per_second(kernel="onednn") if onednn_available() else None
    named = trainers(args)
    rows = []
    for round_index in range(run.rounds):
        order = list(named) if round_index % 2 == 0 else list(reversed(named))
        for name in order:
            start = time.perf_counter()
            load_before = os.getloadavg()[0]
            row = summarise_run(name, named[name](run, path, data_file, workdir), run.warmup_steps, num_samples)
            row.update(round=round_index, process_wall_s=time.perf_counter() - start)
            row.update(load_1m_before=load_before, load_1m_after=os.getloadavg()[0])
            rows.append(row)
            print(
                f"  [{case.name}] round {round_index} {name}: {row['step_s'] * 1e3:.1f} ms/step, "
                f"peak RSS {row['peak_rss_gb']:.2f} GiB",
                flush=True,
            )

    def of(trainer: str) -> list[dict[str, Any]]:
        return [r for r in rows if r["trainer"] == trainer]

    def ratios_of(trainer: str) -> list[float]:
        ratios = []
        for round_index in range(run.rounds):
            by_name = {r["trainer"]: r for r in rows if r["round"] == round_index}
            ratios.append(by_name[trainer]["samples_per_second"] / by_name["trl"]["samples_per_second"])
        return ratios

    ratios = ratios_of("verl")
    token_ratios = token_throughput_ratios(rows, run.rounds, num_samples)
    verl_step_s = common.median([r["step_s"] for r in of("verl")])
    trl_step_s = common.median([r["step_s"] for r in of("trl")])
    verl_phases = [r["phases_s"] for r in of("verl")]
    phase_medians = {k: common.median([p[k] for p in verl_phases if k in p]) for k in verl_phases[0]}
    tokens = [r["num_tokens"] for r in of("verl") if r["num_tokens"] is not None]
    num_tokens = common.median(tokens) if tokens else None
    flops, shares, onednn_shares = {}, {}, {}
    if num_tokens is not None:
        flops, shares = phase_shares(matmul_params, num_tokens, phase_medians, verl_step_s, trl_step_s, rate)
        if onednn_rate is not None:
            _, onednn_shares = phase_shares(
                matmul_params, num_tokens, phase_medians, verl_step_s, trl_step_s, onednn_rate
            )
    response_lengths = [r["response_length_mean"] for r in of("verl") if r["response_length_mean"] is not None]
    trl_lengths = [r["response_length_mean"] for r in of("trl") if r.get("response_length_mean") is not None]
    worker_rss = [r["worker_peak_rss_gb"] for r in of("verl") if r["worker_peak_rss_gb"] is not None]
    result = {
        "throughput_ratio": common.median(ratios),
        "ratios_per_round": ratios,
        "ratio_spread": {
            "min": min(ratios),
            "max": max(ratios),
            "half_iqr_over_median": _finite(common.spread(ratios)),
        },
        # the same ratio in tokens per second (prompt + response), which credits the trainer with longer responses
        "token_throughput_ratio": common.median(token_ratios) if token_ratios else None,
        "token_ratios_per_round": token_ratios,
        "verl_step_s_median": verl_step_s,
        "trl_step_s_median": trl_step_s,
        "verl_peak_rss_gb": max(r["peak_rss_gb"] for r in of("verl")),
        "verl_driver_peak_rss_gb": max(r["driver_peak_rss_gb"] for r in of("verl")),
        "verl_worker_peak_rss_gb": max(worker_rss) if worker_rss else None,
        "trl_peak_rss_gb": max(r["peak_rss_gb"] for r in of("trl")),
        "matmul_flops_per_second": rate,
        "matmul_flops_per_second_onednn": onednn_rate,
        "num_parameters": num_params,
        "num_matmul_parameters": matmul_params,
        "model": case.model_info,
        "settings": {field: getattr(run, field) for field in SHAPE_DEFAULTS},
        "num_tokens_per_step_median": num_tokens,
        "response_length_mean_median": common.median(response_lengths) if response_lengths else None,
        # the same work needs the same response lengths: TRL's own mean completion length, for comparison
        "trl_completion_length_mean_median": common.median(trl_lengths) if trl_lengths else None,
        "flops_per_step": flops,
        "shares_of_matmul_rate": shares,
        "shares_of_onednn_matmul_rate": onednn_shares,
        "verl_phase_medians_s": phase_medians,
        "rows": rows,
    }
    if "verl_compile" in named:
        compile_ratios = ratios_of("verl_compile")
        result["compile_throughput_ratio"] = common.median(compile_ratios)
        result["compile_ratios_per_round"] = compile_ratios
        result["verl_compile_step_s_median"] = common.median([r["step_s"] for r in of("verl_compile")])
    print_case(case.name, run, result)
    return result


def print_case(name: str, run, result: dict[str, Any]) -> None:
    columns = ["round", "trainer", "step_s", "samples_per_second", "peak_rss_gb", "process_wall_s", "load_1m_before"]
    print(f"\n== {name}: {result['num_parameters']:,} parameters, response length {run.response_length}")
    print(common.format_table(result["rows"], columns))
    phases = result["verl_phase_medians_s"]
    print("verl phase medians (s): " + ", ".join(f"{k.removeprefix('timing_s/')}={v:.4f}" for k, v in phases.items()))
    shares = ", ".join(f"{k}={v:.1%}" for k, v in result["shares_of_matmul_rate"].items()) or "n/a (no perf/num_tokens)"
    verl_length, trl_length = result["response_length_mean_median"], result["trl_completion_length_mean_median"]
    if verl_length is not None and trl_length is not None:
        print(f"[{name}] mean response tokens: verl {verl_length:.1f}, TRL {trl_length:.1f}")
    if result["token_throughput_ratio"] is not None:
        token_ratios = result["token_ratios_per_round"]
        print(
            f"[{name}] verl/TRL tokens per second {result['token_throughput_ratio']:.3f} "
            f"({min(token_ratios):.3f}..{max(token_ratios):.3f})"
        )
    if "compile_throughput_ratio" in result:
        print(f"[{name}] verl with use_torch_compile / TRL: {result['compile_throughput_ratio']:.3f}")
    worker = result["verl_worker_peak_rss_gb"]
    worker_text = f"{worker:.2f}" if worker is not None else "n/a"
    print(
        f"[{name}] verl/TRL throughput {result['throughput_ratio']:.3f} (median of {len(result['ratios_per_round'])}"
        f" rounds, {result['ratio_spread']['min']:.3f}..{result['ratio_spread']['max']:.3f}); step "
        f"verl {result['verl_step_s_median']:.4f} s, TRL {result['trl_step_s_median']:.4f} s; peak RSS verl "
        f"{result['verl_peak_rss_gb']:.2f} GiB (driver {result['verl_driver_peak_rss_gb']:.2f} + worker "
        f"{worker_text}), TRL {result['trl_peak_rss_gb']:.2f} GiB; matmul "
        f"{result['matmul_flops_per_second'] / 1e9:.1f} GFLOP/s; share of it: {shares}",
        flush=True,
    )
    if result["matmul_flops_per_second_onednn"] is not None:
        onednn = ", ".join(f"{k}={v:.1%}" for k, v in result["shares_of_onednn_matmul_rate"].items())
        print(
            f"[{name}] oneDNN's fp32 matmul {result['matmul_flops_per_second_onednn'] / 1e9:.1f} GFLOP/s; share of "
            f"it: {onednn or 'n/a'}",
            flush=True,
        )


# ---------------------------------------------------------------------------------------------- main


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        default=None,
        help=f"comma list of model sizes from {list(SIZE_DEFAULTS)} (default: both, unless --model, --shape or "
        "--sweep is given)",
    )
    for size, defaults in SIZE_DEFAULTS.items():
        for field, value in defaults.items():
            parser.add_argument(f"--{field.replace('_', '-')}-{size}", type=type(value), default=value)
    parser.add_argument("--model", default=None, help="a Hugging Face model directory (with its tokenizer)")
    parser.add_argument(
        "--shape",
        default=None,
        help="a model shape, e.g. family=llama,hidden=384,layers=6,heads=6,kv_heads=6,"
        "vocab=32000,tied=false (see model_shapes.py)",
    )
    parser.add_argument("--sweep", action="store_true", help="the shapes of model_shapes.SWEEP, one after the other")
    parser.add_argument("--sweep-cases", default=None, help="comma list: only these cases of the sweep")
    parser.add_argument("--compile", action="store_true", help="also run verl with actor.use_torch_compile=true")
    # --model / --shape / --sweep settings (default: SHAPE_DEFAULTS, a sweep case's own response length); the TRL
    # child receives its case's values through the same flags.
    parser.add_argument("--response-length", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--max-token-len", type=int, default=None, help="verl's ppo_max_token_len_per_gpu")
    parser.add_argument("--warmup-steps", type=int, default=2, help="first steps of a run left out")
    parser.add_argument("--prompts-per-step", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=4, help="samples per prompt (GRPO group)")
    parser.add_argument("--max-prompt-length", type=int, default=16)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--clip-ratio", type=float, default=0.2)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument(
        "--rollout",
        default="naive",
        choices=["hf", "naive"],
        help="verl's rollout: naive (the project's default) or hf (transformers generate, the engine TRL uses)",
    )
    parser.add_argument("--device", default="cuda" if _cuda() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--timeout-s", type=float, default=900.0, help="limit of one trainer run")
    parser.add_argument("--results-name", default=None, help="results file stem (default: by what was run)")
    # The TRL child's own settings (one case's values, passed down by run_trl).
    parser.add_argument("--trl-child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model-path", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.sizes is None:
        args.sizes = "" if (args.model or args.shape or args.sweep) else "tiny,10m"
    args.sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in args.sizes if s not in SIZE_DEFAULTS]
    if unknown:
        parser.error(f"--sizes: unknown {unknown}; choose from {list(SIZE_DEFAULTS)}")
    if not (args.sizes or args.model or args.shape or args.sweep or args.trl_child):
        parser.error("nothing to run: give --sizes, --model, --shape or --sweep")
    if args.shape:
        try:
            parse_shape(args.shape)
        except ValueError as error:
            parser.error(f"--shape: {error}")
    if args.model and not Path(args.model).is_dir():
        parser.error(f"--model: {args.model} is not a directory")
    return args


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def results_name(args) -> str:
    if args.results_name:
        return args.results_name
    if args.sweep and not (args.sizes or args.model or args.shape):
        return "bench_vs_trl_sweep"
    if args.model or args.shape or args.sweep:
        return "bench_vs_trl_custom"
    return "bench_vs_trl"


def main(argv=None) -> int:
    args = parse_args(argv)
    common.quiet_libraries()
    if args.trl_child:
        return trl_child(args)
    if args.dtype == "float16" and args.device == "cpu":
        raise SystemExit("--dtype float16 needs --device cuda: TRL (accelerate) has no fp16 mixed precision on CPU.")
    import trl

    cases = build_cases(args)
    child_only = {"trl_child", "model_path"}
    payload: dict[str, Any] = {
        "settings": {k: v for k, v in vars(args).items() if k not in child_only},
        "trl_version": trl.__version__,
    }
    per_case = {}
    with tempfile.TemporaryDirectory(prefix="bench_vs_trl_") as tmp:
        workdir = Path(tmp)
        data_file = workdir / "prompts.parquet"
        max_steps = max(case.run.steps for case in cases)
        write_prompts(data_file, num_prompts=max(max_steps * args.prompts_per_step * 2, 256), seed=1)
        for case in cases:
            per_case[case.name] = bench_case(args, case, data_file, workdir)
            payload[f"throughput_ratio_{case.name}"] = per_case[case.name]["throughput_ratio"]
    payload["per_size"] = per_case
    print()
    for name, result in per_case.items():
        print(f"verl / TRL throughput, {name}: {result['throughput_ratio']:.3f}")
    print(f"wrote {common.write_results(results_name(args), payload)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
