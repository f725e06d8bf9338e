"""What ``model.use_remove_padding`` saves: the log-prob and update passes on packed real tokens vs padded batches.

A Qwen2-shaped model (fp32, hidden 256, 4 layers, ~3M parameters) and a batch whose prompts and responses have
uniformly random real lengths (about half of the (B, P + R) positions are padding). For each micro-batch size the
benchmark times one ``compute_log_prob`` and one ``update_policy`` of a ``dp`` actor, padded and padding-free,
alternating, and reports medians. On CPU the packed row's attention is dense over all its tokens (a block-diagonal
mask), so packing saves the linear layers' padding work but pays attention over the packed length: it wins with
small micro-batches and loses with large ones. A GPU with flash attention pays per sample instead. Writes
``benchmarks/results/bench_remove_padding.json``.

Usage: ``python benchmarks/bench_remove_padding.py [--repeats 5]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common  # noqa: E402
from verl.protocol import DataProto  # noqa: E402

MODEL = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4}


def padded_batch(num_samples: int, prompt_length: int, response_length: int, vocab: int, seed: int) -> DataProto:
    """Left-padded prompts and right-padded responses of random real lengths, in the rollout layout."""
    generator = torch.Generator().manual_seed(seed)
    width = prompt_length + response_length
    input_ids = torch.randint(1, vocab, (num_samples, width), generator=generator)
    attention_mask = torch.zeros(num_samples, width, dtype=torch.long)
    for row in range(num_samples):
        real_prompt = int(torch.randint(prompt_length // 8, prompt_length + 1, (1,), generator=generator))
        real_response = int(torch.randint(response_length // 16, response_length + 1, (1,), generator=generator))
        attention_mask[row, prompt_length - real_prompt : prompt_length + real_response] = 1
    input_ids = input_ids * attention_mask
    response_mask = attention_mask[:, prompt_length:]
    sign = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(num_samples)])
    return DataProto.from_dict(
        tensors={
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "responses": input_ids[:, prompt_length:],
            "response_mask": response_mask,
            "advantages": sign[:, None] * response_mask,
        },
        meta_info={"temperature": 1.0},  # the sampling temperature the actor's log-probs are taken at
    )


def build(use_remove_padding: bool, micro: int, num_samples: int):
    from verl.workers.actor.dp_actor import build_dp_actor

    config = common.actor_config(ppo_mini_batch_size=num_samples, ppo_micro_batch_size_per_gpu=micro)
    model = common.tiny_qwen2(0, num_key_value_heads=4, **MODEL)
    model.config._attn_implementation = "sdpa"
    return build_dp_actor(config, model, total_training_steps=100, use_remove_padding=use_remove_padding)


def main(argv=None) -> dict:
    from verl.workers.config.roles import MicroBatching

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-samples", type=int, default=32)
    parser.add_argument("--prompt-length", type=int, default=64)
    parser.add_argument("--response-length", type=int, default=64)
    parser.add_argument("--micro-batch-sizes", default="4,32")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    batch = padded_batch(args.num_samples, args.prompt_length, args.response_length, 128, seed=0)
    real = float(batch.batch["attention_mask"].float().mean())
    results = {"machine": common.machine_info(), "args": vars(args), "real_token_fraction": real, "runs": {}}
    for micro in (int(m) for m in args.micro_batch_sizes.split(",")):
        actors = {name: build(name == "padding_free", micro, args.num_samples) for name in ("padded", "padding_free")}
        times: dict[str, dict[str, list[float]]] = {name: {"log_prob": [], "update": []} for name in actors}
        batching = MicroBatching(size=micro, use_dynamic_bsz=False, max_token_len=0)
        for _ in range(args.repeats + 1):  # the first round warms up
            for name, actor in actors.items():
                start = time.perf_counter()
                log_probs, _ = actor.compute_log_prob(batch, batching)
                middle = time.perf_counter()
                data = DataProto.from_dict(
                    tensors={**dict(batch.batch.items()), "old_log_probs": log_probs}, meta_info=batch.meta_info
                )
                actor.update_policy(data)
                times[name]["log_prob"].append(middle - start)
                times[name]["update"].append(time.perf_counter() - middle)
        row = {name: {k: statistics.median(v[1:]) for k, v in t.items()} for name, t in times.items()}
        for phase in ("log_prob", "update"):
            row[f"speedup_{phase}"] = row["padded"][phase] / row["padding_free"][phase]
        results["runs"][f"micro_{micro}"] = row
        print(
            f"micro-batch {micro:>3}: log-prob {row['padded']['log_prob']:.3f}s -> "
            f"{row['padding_free']['log_prob']:.3f}s ({row['speedup_log_prob']:.2f}x), "
            f"update {row['padded']['update']:.3f}s -> "
            f"{row['padding_free']['update']:.3f}s ({row['speedup_update']:.2f}x)",
            flush=True,
        )
    path = common.RESULTS_DIR / "bench_remove_padding.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"real tokens: {real:.0%} of the padded batch; wrote {path}")
    return results


if __name__ == "__main__":
    main()
