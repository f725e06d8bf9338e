"""Activation recomputation of the megatron actor's model on CPU: what autograd keeps, and what the backward costs.

``python benchmarks/bench_mcore_recompute.py [--layers 8 --hidden 512 --seq 256 --batch 4]`` builds a Qwen2-shaped
megatron-core GPTModel and runs a forward and backward for each ``recompute_granularity=full`` setting verl's
scripts use and for ``selective`` ones, counting the bytes of every tensor autograd saves (a saved-tensor hook:
deterministic, unlike the process's peak memory) and the median of 3 forward+backward times.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import Qwen2Config

from verl.models.mcore import build_gpt_model, ensure_model_parallel_initialized, forward_logits

FULL = {"recompute_granularity": "full"}
SELECTIVE = {"recompute_granularity": "selective"}
SETTINGS = {
    "stored (no recomputation)": {},
    "full, uniform, 1 layer per group": {**FULL, "recompute_method": "uniform", "recompute_num_layers": 1},
    "full, uniform, 4 layers per group": {**FULL, "recompute_method": "uniform", "recompute_num_layers": 4},
    "full, block, first 4 layers": {**FULL, "recompute_method": "block", "recompute_num_layers": 4},
    "selective, core_attn": {**SELECTIVE, "recompute_modules": ["core_attn"]},
    "selective, core_attn + mlp": {**SELECTIVE, "recompute_modules": ["core_attn", "mlp"]},
}


def measure(config: Qwen2Config, batch: int, seq: int, **recompute) -> tuple[float, float]:
    """(MiB autograd saved, median seconds of forward + backward)."""
    model = build_gpt_model(config, seed=1, **recompute).train()
    input_ids = torch.randint(0, config.vocab_size, (batch, seq))
    position_ids = torch.arange(seq).expand(batch, seq)
    saved: list[int] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    seconds = []
    for _ in range(3):
        saved.clear()
        start = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            loss = forward_logits(model, input_ids, torch.ones_like(input_ids), position_ids).logsumexp(-1).mean()
        loss.backward()
        seconds.append(time.perf_counter() - start)
    return sum(saved) / 2**20, statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    ensure_model_parallel_initialized(tp=1, pp=1)
    config = Qwen2Config(
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        num_key_value_heads=max(1, args.hidden // 128),
        intermediate_size=3 * args.hidden,
        vocab_size=1024,
        max_position_embeddings=4 * args.seq,
        attn_implementation="eager",
    )
    print(f"{args.layers} layers, hidden {args.hidden}, batch {args.batch} x {args.seq} tokens, fp32 on CPU")
    for name, recompute in SETTINGS.items():
        mib, seconds = measure(config, args.batch, args.seq, **recompute)
        print(f"{name:36s} saved {mib:7.1f} MiB   forward+backward {seconds:.2f} s")


if __name__ == "__main__":
    main()
