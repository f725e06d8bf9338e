"""The training-inference mismatch in float32, bfloat16 and float16: how far a rollout engine's probabilities are
from the trainer's, on the same model, prompts and sampled responses.

For each model size, a randomly initialised Qwen2-shaped model (a wide initialisation, so that its distributions are
peaked like a trained model's rather than near-uniform) samples responses to fixed prompts once, in float32. Then,
for each precision, the same tokens are scored by

- the trainer: fp32 master weights, one full-sequence forward under autocast (what the actor's log-prob pass does);
- the engines:
  - ``hf``: the weights cast to the precision and a KV-cached, token-by-token decode (how an inference engine runs);
  - ``naive``: the in-house sampler's computation, a forward of each growing prefix under autocast;
  - ``vllm``: a vLLM engine's own log-probs of the tokens, when vllm is installed.

and :func:`verl.trainer.ppo.rollout_corr.compute_mismatch_metrics` compares each engine with the trainer: mean and
max |p_engine - p_trainer| and the KL (k1). For each engine and size the JSON gives every figure per precision and
the bfloat16-to-float16 ratios (``ratio_bf16_to_fp16_*``): Qi et al. (2025) report that fp16 shrinks the mismatch
that bf16 has. Writes ``benchmarks/results/bench_mismatch.json`` and ``bench_mismatch.png``.

Usage: ``python benchmarks/bench_mismatch.py [--num-prompts 8] [--response-length 24]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common  # noqa: E402
from verl.trainer.ppo.rollout_corr import compute_mismatch_metrics  # noqa: E402
from verl.utils.torch_functional import compute_response_log_probs  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# head_dim 64 everywhere (what vLLM's CPU kernels accept); the larger model has 4x the parameters
SIZES = {
    "small": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2},
    "medium": {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4},
}
FIGURES = ("mean_abs_dp", "max_abs_dp", "kl")


def build_model(size: str, seed: int):
    """A Qwen2 model of ``size`` with a wide initialisation (peaked distributions), fp32."""
    return common.tiny_qwen2(
        seed, num_key_value_heads=SIZES[size]["num_attention_heads"], **SIZES[size], initializer_range=0.3
    )


@torch.no_grad()
def sample_responses(model, prompts: torch.Tensor, response_length: int, seed: int) -> torch.Tensor:
    """(B, P + R) prompts followed by responses sampled in fp32 at temperature 1 (KV-cached)."""
    generator = torch.Generator().manual_seed(seed)
    out = model(input_ids=prompts, use_cache=True)
    past, tokens = out.past_key_values, [prompts]
    logits = out.logits[:, -1]
    for _ in range(response_length):
        token = torch.multinomial(torch.softmax(logits.float(), -1), 1, generator=generator)
        tokens.append(token)
        out = model(input_ids=token, past_key_values=past, use_cache=True)
        past, logits = out.past_key_values, out.logits[:, -1]
    return torch.cat(tokens, dim=-1)


def autocast(dtype: torch.dtype):
    return contextlib.nullcontext() if dtype == torch.float32 else torch.autocast("cpu", dtype=dtype)


@torch.no_grad()
def trainer_log_probs(model, sequences: torch.Tensor, response_length: int, dtype: torch.dtype) -> torch.Tensor:
    """The actor's log-prob pass: fp32 weights, one full forward under autocast."""
    with autocast(dtype):
        logits = model(input_ids=sequences, use_cache=False).logits
    return compute_response_log_probs(logits.float(), sequences, response_length)[0]


def _token_log_probs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), -1).gather(-1, tokens[:, None]).squeeze(-1)


@torch.no_grad()
def hf_engine_log_probs(model, sequences: torch.Tensor, response_length: int, dtype: torch.dtype) -> torch.Tensor:
    """An inference engine's way: weights in ``dtype``, a KV-cached decode of the given tokens."""
    import copy

    engine = copy.deepcopy(model).to(dtype)
    prompt_length = sequences.shape[1] - response_length
    out = engine(input_ids=sequences[:, :prompt_length], use_cache=True)
    past, logits, log_probs = out.past_key_values, out.logits[:, -1], []
    for t in range(response_length):
        token = sequences[:, prompt_length + t]
        log_probs.append(_token_log_probs(logits, token))
        out = engine(input_ids=token[:, None], past_key_values=past, use_cache=True)
        past, logits = out.past_key_values, out.logits[:, -1]
    return torch.stack(log_probs, dim=-1)


@torch.no_grad()
def naive_engine_log_probs(model, sequences: torch.Tensor, response_length: int, dtype: torch.dtype) -> torch.Tensor:
    """The in-house sampler's way: fp32 weights under autocast, a full forward of each growing prefix."""
    prompt_length = sequences.shape[1] - response_length
    log_probs = []
    for t in range(response_length):
        with autocast(dtype):
            logits = model(input_ids=sequences[:, : prompt_length + t], use_cache=False).logits[:, -1]
        log_probs.append(_token_log_probs(logits, sequences[:, prompt_length + t]))
    return torch.stack(log_probs, dim=-1)


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:  # an absent or broken install both mean "not here"
        return False
    return True


def vllm_engine_log_probs(model, sequences, response_length, dtype, workdir: Path) -> torch.Tensor:
    """vLLM's own log-probs of the given response tokens (prompt log-probs of the full sequences)."""
    import os

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM, SamplingParams, TokensPrompt

    model_dir = workdir / f"model_{dtype}"
    model.save_pretrained(model_dir)
    # an explicit KV-cache size: vLLM's CPU sizing subtracts this whole process's memory and can leave nothing
    llm = LLM(
        model=str(model_dir),
        dtype=str(dtype).split(".")[-1],
        enforce_eager=True,
        kv_cache_memory_bytes=256 * 2**20,
        generation_config="vllm",
    )
    params = SamplingParams(max_tokens=1, prompt_logprobs=0)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=row.tolist()) for row in sequences], params)
    prompt_length = sequences.shape[1] - response_length
    rows = []
    for output, row in zip(outputs, sequences):
        entries = output.prompt_logprobs[prompt_length:]
        rows.append([entry[int(token)].logprob for entry, token in zip(entries, row[prompt_length:])])
    return torch.tensor(rows, dtype=torch.float32)


def figures(engine: torch.Tensor, trainer: torch.Tensor) -> dict[str, float]:
    metrics = compute_mismatch_metrics(engine, trainer, torch.ones_like(engine, dtype=torch.long))
    return {
        "mean_abs_dp": metrics["training/rollout_probs_diff_mean"],
        "max_abs_dp": metrics["training/rollout_probs_diff_max"],
        "kl": metrics["rollout_corr/kl"],
    }


def with_ratios(per_dtype: dict[str, dict[str, float]]) -> dict:
    """The figures per precision plus ``ratio_bf16_to_fp16_<figure>`` (|figure| in bf16 over |figure| in fp16)."""
    result = dict(per_dtype)
    for name in FIGURES:
        fp16, bf16 = abs(per_dtype["float16"][name]), abs(per_dtype["bfloat16"][name])
        result[f"ratio_bf16_to_fp16_{name}"] = bf16 / fp16 if fp16 > 0 else float("inf")
    return result


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(results["sizes"])
    engines = list(results["sizes"][sizes[0]]["engines"])
    fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 4), squeeze=False)
    for axis, size in zip(axes[0], sizes):
        width = 0.8 / len(engines)
        for i, engine in enumerate(engines):
            values = [results["sizes"][size]["engines"][engine][d]["mean_abs_dp"] for d in DTYPES]
            axis.bar([x + i * width for x in range(len(DTYPES))], values, width, label=engine)
        axis.set_xticks([x + width * (len(engines) - 1) / 2 for x in range(len(DTYPES))], list(DTYPES))
        axis.set_yscale("log")
        axis.set_title(f"{size} model ({results['sizes'][size]['num_parameters'] / 1e6:.2f}M parameters)")
        axis.set_ylabel("mean |p_engine - p_trainer|")
        axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--prompt-length", type=int, default=16)
    parser.add_argument("--response-length", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sizes", default="small,medium")
    args = parser.parse_args(argv)
    use_vllm = vllm_available()
    engines = {"hf": hf_engine_log_probs, "naive": naive_engine_log_probs}
    results = {"machine": common.machine_info(), "args": vars(args), "vllm": use_vllm, "sizes": {}}
    for size in args.sizes.split(","):
        start = time.perf_counter()
        model = build_model(size, args.seed).eval()
        generator = torch.Generator().manual_seed(args.seed)
        vocab = model.config.vocab_size
        prompts = torch.randint(0, vocab, (args.num_prompts, args.prompt_length), generator=generator)
        sequences = sample_responses(model, prompts, args.response_length, args.seed)
        per_engine: dict[str, dict] = {}
        for dtype_name, dtype in DTYPES.items():
            trainer = trainer_log_probs(model, sequences, args.response_length, dtype)
            for engine, fn in engines.items():
                engine_lp = fn(model, sequences, args.response_length, dtype)
                per_engine.setdefault(engine, {})[dtype_name] = figures(engine_lp, trainer)
            if use_vllm:
                import tempfile

                with tempfile.TemporaryDirectory() as workdir:
                    engine_lp = vllm_engine_log_probs(model, sequences, args.response_length, dtype, Path(workdir))
                per_engine.setdefault("vllm", {})[dtype_name] = figures(engine_lp, trainer)
        results["sizes"][size] = {
            "num_parameters": common.num_parameters(model),
            "engines": {engine: with_ratios(per_dtype) for engine, per_dtype in per_engine.items()},
            "seconds": round(time.perf_counter() - start, 1),
        }
        for engine, row in results["sizes"][size]["engines"].items():
            print(
                f"{size:>6} {engine:>5}: mean|dp| fp32 {row['float32']['mean_abs_dp']:.2e}  bf16 "
                f"{row['bfloat16']['mean_abs_dp']:.2e}  fp16 {row['float16']['mean_abs_dp']:.2e}  "
                f"bf16/fp16 {row['ratio_bf16_to_fp16_mean_abs_dp']:.1f}x (max|dp| "
                f"{row['ratio_bf16_to_fp16_max_abs_dp']:.1f}x, KL {row['ratio_bf16_to_fp16_kl']:.1f}x)",
                flush=True,
            )
    common.RESULTS_DIR.mkdir(exist_ok=True)
    json_path = common.RESULTS_DIR / "bench_mismatch.json"
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    plot(results, common.RESULTS_DIR / "bench_mismatch.png")
    print(f"wrote {json_path} and {json_path.with_suffix('.png')}")
    return results


if __name__ == "__main__":
    main()
