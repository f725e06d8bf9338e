"""Peak memory and step time of a PPO update with and without LoRA, on the ``dp`` and ``fsdp2`` backends.

Two Qwen2 models in fp32: the ``10m`` model of ``bench_vs_trl.py`` (written to a temporary directory and loaded as
the trainer loads it) and a larger one built in memory from a ``Qwen2Config`` with random weights (``large``, about
57M parameters by default). Each is trained with full fine-tuning and with LoRA adapters (rank 8, alpha 16,
``target_modules: all-linear``; ``verl.utils.lora.add_lora_adapters``, as the workers do it, before sharding), on
``dp`` (one process) and on ``fsdp2`` (two gloo ranks on the CPU, spawned processes; CUDA + NCCL on a GPU machine).
Every configuration runs in fresh processes, so one's memory does not hide in another's.

Per configuration (per rank for fsdp2, whose ranks each train their own batch of the same size as dp's):

- the trainable and total parameters (whole model, adapters included);
- the optimizer state in bytes this rank holds (every tensor in the AdamW state: ``exp_avg``, ``exp_avg_sq``,
  ``step``), which should shrink by the ratio of trainable parameters;
- memory measured over the moment before the model existed (CPU: the resident set, with glibc told to return freed
  tensors; CUDA: allocated bytes): what is resident after building the actor and one log-prob pass (the weights the
  trainer loads from safetensors are file-backed pages, resident once a forward pass has read them), and the peak
  while training (the warm-up update, which creates the AdamW state, and the timed ones), also counted from just
  before training (``update_added_MiB``: gradients, AdamW state, activations);
- the median time of ``--steps`` ``update_policy`` calls after the warm-up one (``old_log_probs`` from the actor's
  own ``compute_log_prob`` first).

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_lora.py`` (a few minutes on 2 cores; ``--help`` for the
sizes); writes ``results/bench_lora.json`` (``--no-save`` to leave it alone).
"""

from __future__ import annotations

import argparse
import gc
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from bench_vs_trl import write_10m_model  # noqa: E402

MiB = 2**20
# The larger model: hidden 768, 8 layers, vocabulary 8192 (tied) -> about 57M parameters, 50M of them in the linear
# layers that all-linear adapts. fp32: fp16 matmuls on the CPU are ~100x slower.
LARGE_MODEL = {
    "vocab_size": 8192,
    "hidden_size": 768,
    "intermediate_size": 2048,
    "num_hidden_layers": 8,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _resident_bytes() -> int:
    """Live memory now: allocated CUDA bytes, or the process's resident set on the CPU."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.memory_allocated()
    return (common._proc_status_kib("VmRSS") or 0) * 1024


def _make_model(spec: dict[str, Any]):
    """The fp32 model of ``spec``: ``{"path": ...}`` loads a saved one, ``{"config": {...}}`` builds a random one."""
    import torch

    if "path" in spec:
        from verl.models.loading import load_hf_causal_lm

        return load_hf_causal_lm(spec["path"], dtype=torch.float32, attn_implementation="sdpa")
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        **spec["config"], max_position_embeddings=256, tie_word_embeddings=True, attn_implementation="sdpa"
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).float()


def _build_actor(strategy: str, module, lora: dict[str, Any] | None, config, device: str):
    """The actor over ``module`` with adapters added first when ``lora`` is given (the workers' order)."""
    peft_model = None
    if lora is not None:
        from verl.utils.lora import add_lora_adapters
        from verl.workers.config import ModelConfig, load_section

        peft_model = add_lora_adapters(module, load_section(ModelConfig, lora))
    if strategy == "fsdp2":
        from verl.utils.fsdp_utils import device_mesh
        from verl.workers.actor.fsdp_actor import build_fsdp_actor

        actor = build_fsdp_actor(config, module, mesh=device_mesh(device), total_training_steps=100)
    else:
        from verl.workers.actor.dp_actor import build_dp_actor

        actor = build_dp_actor(config, module.to(device), total_training_steps=100)
    actor.peft_model = peft_model
    return actor


def _optimizer_state_bytes(actor) -> int:
    """Bytes of every tensor in the AdamW state this rank holds (local shards under FSDP2)."""
    from verl.utils.fsdp_utils import local_tensor

    total = 0
    for entries in actor.optimizer.optimizer.state.values():
        for value in entries.values():
            if hasattr(value, "numel"):
                local = local_tensor(value)
                total += local.numel() * local.element_size()
    return total


def _rank_main(rank: int, world: int, port: int, job: dict[str, Any], queue) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(job["threads"])
    common.quiet_libraries()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    strategy = job["strategy"]
    if strategy == "fsdp2":
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        if cuda:
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    samples = job["samples"]
    config = common.actor_config(
        strategy, "float32", ppo_mini_batch_size=samples, ppo_micro_batch_size_per_gpu=job["micro_batch"]
    )

    # a first, tiny run imports and initialises everything (code pages count in the resident set too)
    warmup = _build_actor(strategy, common.tiny_qwen2(0), job["lora"], config, device)
    tiny_batch = common.ppo_batch(samples, 8, 8, common.TINY_MODEL["vocab_size"]).to(device)
    tiny_batch.batch["old_log_probs"], _ = warmup.compute_log_prob(tiny_batch)
    warmup.update_policy(tiny_batch)
    del warmup, tiny_batch
    gc.collect()

    result: dict[str, Any] = {}
    actors = []
    baseline = _resident_bytes()
    result["build_peak_bytes"], result["peak_method"] = common.peak_memory_bytes(
        lambda: actors.append(_build_actor(strategy, _make_model(job["model"]), job["lora"], config, device))
    )
    actor = actors[0]

    vocab_size = actor.model_module().config.vocab_size
    batch = common.ppo_batch(samples, job["prompt_length"], job["response_length"], vocab_size, seed=rank)
    batch = batch.to(device)
    batch.batch["old_log_probs"], _ = actor.compute_log_prob(batch)
    gc.collect()
    # after the first forward pass: weights loaded from safetensors are file-backed pages, resident once touched
    before_train = _resident_bytes() - baseline
    result["resident_before_train_bytes"] = before_train

    step_times: list[float] = []
    failed: list[float] = []

    def update() -> None:
        failed.append(actor.update_policy(batch).metrics["actor/update_failed"])

    def train() -> None:
        update()  # warm-up: creates the AdamW state
        for _ in range(job["steps"]):
            step_times.append(common.time_call(update))

    train_peak, _ = common.peak_memory_bytes(train)
    # the peak of the updates over the same baseline as the build's: what the model costs while training
    result["train_peak_bytes"] = before_train + train_peak
    result["train_added_peak_bytes"] = train_peak
    result["step_times_s"] = step_times
    result["update_failed"] = max(failed)
    module = actor.model_module()
    params = {id(p): p for p in module.parameters()}.values()  # tied weights once; DTensor.numel() is global
    result["num_parameters"] = sum(p.numel() for p in params)
    result["num_trainable"] = sum(p.numel() for p in params if p.requires_grad)
    result["optimizer_state_bytes"] = _optimizer_state_bytes(actor)
    queue.put((rank, result))
    if strategy == "fsdp2":
        dist.barrier()
        dist.destroy_process_group()


def run_job(job: dict[str, Any], world: int, timeout_s: float) -> list[dict[str, Any]]:
    """Run ``job`` on ``world`` spawned ranks; each rank's result."""
    import torch.multiprocessing as mp

    # glibc then serves every allocation above 64 KiB (all tensors that matter) with mmap and returns it on free,
    # so that the resident set follows the live tensors instead of keeping freed memory in its arenas
    os.environ.update(MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(rank, world, port, job, queue)) for rank in range(world)]
    for proc in procs:
        proc.start()
    results = dict(queue.get(timeout=timeout_s) for _ in procs)
    for proc in procs:
        proc.join(timeout=120)
        if proc.exitcode != 0:
            raise RuntimeError(f"{job['name']}: rank process exited with {proc.exitcode}")
    return [results[rank] for rank in range(world)]


def summarise(job: dict[str, Any], world: int, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """One table row: rank 0's counts, the largest memory of any rank, the slowest rank's median step."""
    first = ranks[0]
    return {
        "size": job["size"],
        "backend": job["strategy"],
        "ranks": world,
        "lora": "on" if job["lora"] else "off",
        "params_M": first["num_parameters"] / 1e6,
        "trainable_M": first["num_trainable"] / 1e6,
        "trainable_pct": 100.0 * first["num_trainable"] / first["num_parameters"],
        "optim_state_MiB": max(r["optimizer_state_bytes"] for r in ranks) / MiB,
        "resident_MiB": max(r["resident_before_train_bytes"] for r in ranks) / MiB,
        "train_peak_MiB": max(r["train_peak_bytes"] for r in ranks) / MiB,
        "update_added_MiB": max(r["train_added_peak_bytes"] for r in ranks) / MiB,
        "step_s": max(common.median(r["step_times_s"]) for r in ranks),
        "update_failed": max(r["update_failed"] for r in ranks),
    }


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """On each LoRA row: how much smaller the trainable parameters and the optimizer state are than full tuning's."""
    full = {(r["size"], r["backend"]): r for r in rows if r["lora"] == "off"}
    for row in rows:
        base = full.get((row["size"], row["backend"]))
        if row["lora"] == "on" and base is not None:
            row["trainable_shrink_x"] = base["trainable_M"] / row["trainable_M"]
            row["optim_shrink_x"] = base["optim_state_MiB"] / row["optim_state_MiB"]
            row["peak_ratio"] = row["train_peak_MiB"] / base["train_peak_MiB"]
            row["step_ratio"] = row["step_s"] / base["step_s"]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["10m", "large"], choices=["10m", "large"])
    parser.add_argument("--backends", nargs="+", default=["dp", "fsdp2"], choices=["dp", "fsdp2"])
    parser.add_argument("--world", type=int, default=2, help="fsdp2 ranks")
    parser.add_argument("--large-hidden", type=int, default=LARGE_MODEL["hidden_size"])
    parser.add_argument("--large-intermediate", type=int, default=LARGE_MODEL["intermediate_size"])
    parser.add_argument("--large-layers", type=int, default=LARGE_MODEL["num_hidden_layers"])
    parser.add_argument("--large-heads", type=int, default=LARGE_MODEL["num_attention_heads"])
    parser.add_argument("--large-kv-heads", type=int, default=LARGE_MODEL["num_key_value_heads"])
    parser.add_argument("--large-vocab", type=int, default=LARGE_MODEL["vocab_size"])
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--lora-alpha", type=float, default=16.0)
    parser.add_argument("--target-modules", default="all-linear")
    parser.add_argument("--samples", type=int, default=8, help="samples per rank (one mini-batch)")
    parser.add_argument("--micro-batch", type=int, default=8, help="ppo_micro_batch_size_per_gpu")
    parser.add_argument("--prompt-length", type=int, default=16)
    parser.add_argument("--response-length", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3, help="timed updates after the warm-up one")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--timeout-s", type=float, default=900.0)
    parser.add_argument("--no-save", action="store_true", help="print the table only (no results file)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    common.quiet_libraries()
    large = {
        "vocab_size": args.large_vocab,
        "hidden_size": args.large_hidden,
        "intermediate_size": args.large_intermediate,
        "num_hidden_layers": args.large_layers,
        "num_attention_heads": args.large_heads,
        "num_key_value_heads": args.large_kv_heads,
    }
    lora = {"lora_rank": args.lora_rank, "lora_alpha": args.lora_alpha, "target_modules": args.target_modules}
    rows, raw = [], []
    with tempfile.TemporaryDirectory(prefix="bench_lora_") as workdir:
        models = {"10m": {"path": str(write_10m_model(Path(workdir) / "model_10m"))}, "large": {"config": large}}
        for size in args.sizes:
            for strategy in args.backends:
                world = args.world if strategy == "fsdp2" else 1
                for use_lora in (False, True):
                    job = {
                        "name": f"{size}/{strategy}/lora={'on' if use_lora else 'off'}",
                        "size": size,
                        "model": models[size],
                        "strategy": strategy,
                        "lora": lora if use_lora else None,
                        "samples": args.samples,
                        "micro_batch": args.micro_batch,
                        "prompt_length": args.prompt_length,
                        "response_length": args.response_length,
                        "steps": args.steps,
                        "threads": args.threads,
                    }
                    ranks = run_job(job, world, args.timeout_s)
                    rows.append(summarise(job, world, ranks))
                    raw.append({"job": {k: v for k, v in job.items() if k != "model"}, "ranks": ranks})
                    print(f"done {job['name']}: step {rows[-1]['step_s']:.3f} s", flush=True)
    add_ratios(rows)
    columns = [
        "size",
        "backend",
        "ranks",
        "lora",
        "params_M",
        "trainable_M",
        "trainable_pct",
        "optim_state_MiB",
        "trainable_shrink_x",
        "optim_shrink_x",
        "resident_MiB",
        "train_peak_MiB",
        "update_added_MiB",
        "step_s",
        "peak_ratio",
        "step_ratio",
    ]
    print(common.format_table(rows, columns))
    if any(row["update_failed"] for row in rows):
        print("warning: an update failed (see update_failed); its step time is not a full step's")
    if args.no_save:
        return 0
    payload = {
        "settings": vars(args),
        "models": {"10m": "bench_vs_trl.MODEL_10M (tiny tokenizer's vocabulary)", "large": large},
        "peak_method": raw[0]["ranks"][0]["peak_method"],
        "rows": rows,
        "raw": raw,
    }
    print(f"wrote {common.write_results('bench_lora', payload)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
