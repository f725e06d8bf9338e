"""The figures ``run_all.sh`` prints: MFU and peak memory of one update step, and the fp16 loss-scale warm-up.

A Qwen2-shaped model of Qwen2.5-0.5B's dimensions (494M parameters, built from its config with random weights,
nothing downloaded) takes PPO updates on 16 rows of 1024 real tokens (one mini-batch, 4 micro-batches of 4) on
one GPU, for each of: ``megatron`` (megatron-core's DDP, optimizer and schedule) and ``fsdp2`` (FSDP2 over a world
of one), in fp16 and bf16. For each it prints, as ``FIGURE <name>: <value>`` lines:

- ``<backend>_<dtype>_update_s``: the median wall time of 3 applied updates (after the warm-up);
- ``<backend>_<dtype>_mfu``: model FLOPs of an update / that time / the H200's dense fp16/bf16 peak (989.4
  TFLOP/s, the datasheet's), with model FLOPs = 6 N T + 12 L d S T (N parameters in matrix products, the tied LM
  head included; T tokens of the mini-batch; L layers, d = heads x head_dim, S sequence length: PaLM's count);
- ``<backend>_<dtype>_peak_memory_GiB``: the most GPU memory allocated from building the actor to the last update;
- ``<backend>_fp16_warm_up_num_skipped_updates``: the updates skipped from the YAML's initial loss scale 2**32
  until one applies (megatron's is megatron-core's own ``DynamicGradScaler``).

``--dry-run`` runs the same code on the CPU with a tiny model (the megatron backend on its CPU path), to rehearse
the script without a GPU; its figures mean nothing. Exit status: the number of configurations that failed.

Usage: python tests/special_gpu/bench_gpu_figures.py [--dry-run]
"""

from __future__ import annotations

import argparse
import datetime
import gc
import logging
import socket
import statistics
import sys
import time
import traceback

import torch
import torch.distributed as dist

logger = logging.getLogger("bench_gpu_figures")

PEAK_FLOPS = 989.4e12  # H200 SXM, dense fp16/bf16 tensor cores (NVIDIA datasheet)
QWEN2_0_5B = {
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
TINY = {**QWEN2_0_5B, "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2}
TINY.update(num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
CONFIGS = [("megatron", "float16"), ("megatron", "bfloat16"), ("fsdp2", "float16"), ("fsdp2", "bfloat16")]
MAX_WARM_UP = 45  # 2**32 halves to 1 within 33 failures after the hysteresis
NUM_TIMED = 3


def hf_config(dry_run: bool):
    from transformers import Qwen2Config

    return Qwen2Config(**(TINY if dry_run else QWEN2_0_5B), attn_implementation="sdpa")


def model_flops(config, num_rows: int, seq_len: int) -> float:
    """6 N T + 12 L d S T of one update (forward and backward) on ``num_rows`` rows of ``seq_len`` tokens."""
    hidden, layers, heads = config.hidden_size, config.num_hidden_layers, config.num_attention_heads
    head_dim = hidden // heads
    kv = config.num_key_value_heads * head_dim
    per_layer = hidden * (heads * head_dim) * 2 + hidden * kv * 2 + 3 * hidden * config.intermediate_size
    matrix_params = layers * per_layer + config.vocab_size * hidden  # + the (tied) LM head
    tokens = num_rows * seq_len
    return 6.0 * matrix_params * tokens + 12.0 * layers * heads * head_dim * seq_len * tokens


def update_batch(config, num_rows: int, prompt: int, response: int, device: str):
    """Rows of real tokens only (no padding), advantages +-1, in the rollout layout; one on-policy update."""
    from verl.protocol import DataProto

    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, config.vocab_size, (num_rows, prompt + response), generator=generator)
    mask = torch.ones_like(input_ids)
    sign = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(num_rows)])[:, None]
    tensors = {
        "input_ids": input_ids,
        "attention_mask": mask,
        "position_ids": torch.arange(prompt + response).expand(num_rows, -1).clone(),
        "responses": input_ids[:, prompt:],
        "response_mask": mask[:, prompt:].clone(),
        "advantages": sign.expand(-1, response).clone(),
    }
    return DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0}).to(device)


def build_actor(backend: str, dtype: str, config, device: str, num_rows: int):
    from verl.workers.config import ActorConfig, load_section

    overrides = {
        "strategy": backend,
        "dtype": dtype,
        "ppo_mini_batch_size": num_rows,
        "ppo_micro_batch_size_per_gpu": max(num_rows // 4, 1),
        "optim": {"lr": 1e-6},
    }
    actor_config = load_section(ActorConfig, overrides)
    if backend == "megatron":
        from verl.workers.actor.megatron_builder import build_megatron_actor

        return build_megatron_actor(config, actor_config, device=device, total_training_steps=100)
    from transformers import Qwen2ForCausalLM

    from verl.utils.fsdp_utils import device_mesh
    from verl.workers.actor.fsdp_actor import build_fsdp_actor

    with torch.device(device):  # random weights initialised where they are used
        module = Qwen2ForCausalLM(config).float()
    return build_fsdp_actor(actor_config, module, mesh=device_mesh(device), total_training_steps=100)


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(backend: str, dtype: str, config, device: str, shape: tuple[int, int, int]) -> dict[str, float]:
    """Figures of one (backend, dtype): warm-up length (fp16), median update time, MFU and peak memory."""
    num_rows, prompt, response = shape
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    actor = build_actor(backend, dtype, config, device, num_rows)
    batch = update_batch(config, num_rows, prompt, response, device)
    figures = {}
    num_skipped = 0
    while actor.update_policy(batch).metrics["actor/update_failed"] == 1.0:  # fp16: from 2**32 until an update fits
        num_skipped += 1
        if num_skipped >= MAX_WARM_UP:
            raise RuntimeError(f"no update applied in {MAX_WARM_UP} steps")
    if dtype == "float16":
        figures["warm_up_num_skipped_updates"] = num_skipped
    times = []
    for _ in range(NUM_TIMED):
        synchronize(device)
        start = time.perf_counter()
        failed = actor.update_policy(batch).metrics["actor/update_failed"]
        synchronize(device)
        times.append(time.perf_counter() - start)
        if failed:
            raise RuntimeError("an update after the warm-up was skipped: the timing would not be an update's")
    seconds = statistics.median(times)
    figures["update_s"] = seconds
    figures["mfu"] = model_flops(config, num_rows, prompt + response) / seconds / PEAK_FLOPS
    if device == "cuda":
        figures["peak_memory_GiB"] = torch.cuda.max_memory_allocated() / 2**30
    del actor, batch
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return figures


def init_process_group(device: str) -> None:
    """One rank: NCCL for CUDA tensors and gloo for CPU ones (megatron-core and FSDP2 both use it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group(
        "cpu:gloo,cuda:nccl" if device == "cuda" else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=300),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny model on the CPU (rehearsal)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
    logger.setLevel(logging.INFO)
    logging.getLogger("verl").setLevel(logging.ERROR)  # the warm-up's skipped updates are expected here
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        logger.error("no CUDA device: run with --dry-run to rehearse on the CPU")
        return len(CONFIGS)
    config = hf_config(args.dry_run)
    shape = (4, 4, 4) if args.dry_run else (16, 512, 512)
    init_process_group(device)
    num_failed = 0
    for backend, dtype in CONFIGS:
        name = f"{backend}_{'fp16' if dtype == 'float16' else 'bf16'}"
        try:
            figures = measure(backend, dtype, config, device, shape)
        except Exception:  # one configuration's failure must not hide the others' figures
            num_failed += 1
            logger.info("FIGURE %s: FAILED\n%s", name, traceback.format_exc())
            continue
        for key, value in figures.items():
            logger.info("FIGURE %s_%s: %.4g", name, key, value)
    dist.destroy_process_group()
    return num_failed


if __name__ == "__main__":
    sys.exit(main())
