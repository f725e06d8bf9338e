"""The ``naive`` rollout's generation on the ~10M Qwen2 shape of ``bench_vs_trl.py``, decoder by decoder.

One generate call: 16 left-padded prompts x 4 samples, up to 64 new tokens, seeded sampling (every variant samples
the same tokens from the same seed, up to float rounding of near-ties). Variants, timed interleaved in one process:

- ``hf_mkl``: ``transformers``' forward on the preallocated cache (``HFCachedDecoder``), linear layers on torch's
  kernels (MKL on CPU);
- ``hf_onednn``: the same with the linear layers on oneDNN (``verl.utils.cpu_linear``);
- ``lean_onednn``: the lean Llama-family decode step (``verl.models.llama_decode``) on oneDNN, the ``dp`` default
  on CPU: query/key/value and gate/up as one product each on weights concatenated at each call's prefill;
- ``lean_onednn_unfused``: the same with one product per projection and nothing concatenated (the default on CUDA);
- ``lean_onednn_rows1``: the lean step with finished rows leaving the batch one by one (``ROW_BUCKET`` = 1) instead
  of in steps of 8.

``fused_weight_mb`` is what a variant's decoder concatenates per generate call (held from prefill to release).

Run: ``.venv/bin/python benchmarks/bench_rollout_decode.py`` (about a minute; ``--repeats`` for more;
``--num-prompts`` / ``--response-length`` for a smaller run, ``--no-save`` to leave the results file alone).
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from bench_vs_trl import write_10m_model  # noqa: E402

from verl.models.llama_decode import LlamaFamilyDecoder  # noqa: E402
from verl.models.loading import load_hf_causal_lm  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.utils.cpu_linear import OneDNNLinear, use_onednn_linear  # noqa: E402
from verl.workers.config import RolloutConfig, load_section  # noqa: E402
from verl.workers.rollout import NaiveRollout, naive_rollout  # noqa: E402
from verl.workers.rollout.decoding import HFCachedDecoder  # noqa: E402

NUM_PROMPTS, GROUP, PROMPT_LENGTH, RESPONSE_LENGTH = 16, 4, 16, 64


def prompts(vocab_size: int, num_prompts: int = NUM_PROMPTS) -> DataProto:
    gen = torch.Generator().manual_seed(1)
    lengths = torch.randint(8, PROMPT_LENGTH + 1, (num_prompts,), generator=gen)
    mask = (torch.arange(PROMPT_LENGTH)[None] >= (PROMPT_LENGTH - lengths)[:, None]).long()
    ids = torch.randint(3, vocab_size, (num_prompts, PROMPT_LENGTH), generator=gen) * mask
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask, "position_ids": positions})


def fused_weight_bytes(decoder, batch: DataProto) -> int:
    """Bytes ``decoder`` concatenates for a generate call (held from its prefill to its release)."""
    if not isinstance(decoder, LlamaFamilyDecoder):
        return 0
    with torch.no_grad():
        decoder.prefill(batch.batch["input_ids"], batch.batch["attention_mask"], batch.batch["position_ids"], 1)
    try:
        return decoder.num_fused_bytes()
    finally:
        decoder.release()


def set_linear_kernel(model: torch.nn.Module, onednn: bool) -> None:
    if onednn:
        use_onednn_linear(model)
    else:
        for module in model.modules():
            if type(module) is OneDNNLinear:
                module.__class__ = torch.nn.Linear


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=6, help="interleaved timings per variant")
    parser.add_argument("--num-prompts", type=int, default=NUM_PROMPTS, help="prompts per generate call")
    parser.add_argument("--response-length", type=int, default=RESPONSE_LENGTH, help="most new tokens per sample")
    parser.add_argument("--no-save", action="store_true", help="print the table only (no results file)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as workdir:
        model = load_hf_causal_lm(write_10m_model(Path(workdir) / "model"), dtype=torch.float32).eval()
    model.config._attn_implementation = "sdpa"
    batch = prompts(model.config.vocab_size, args.num_prompts)
    config = load_section(RolloutConfig).sampling_options()
    config = config.replace(response_length=args.response_length, n=GROUP, seed=3, temperature=1.0, do_sample=True)
    variants = {  # name: (decoder factory, oneDNN linear layers, rows the batch shrinks by)
        "hf_mkl": (HFCachedDecoder, False, 8),
        "hf_onednn": (HFCachedDecoder, True, 8),
        "lean_onednn": (LlamaFamilyDecoder, True, 8),
        "lean_onednn_unfused": (functools.partial(LlamaFamilyDecoder, fuse_projections=False), True, 8),
        "lean_onednn_rows1": (LlamaFamilyDecoder, True, 1),
    }
    tokens: dict[str, float] = {}

    def generate(name: str):
        make_decoder, onednn, bucket = variants[name]
        set_linear_kernel(model, onednn)
        naive_rollout.ROW_BUCKET = bucket
        rollout = NaiveRollout(make_decoder(model), config, model.config.pad_token_id, model.config.eos_token_id)
        with torch.no_grad():
            out = rollout.generate_sequences(batch)
        tokens[name] = float(out.batch["response_mask"].sum()) / len(out)
        return out

    def runner(name: str):
        return lambda: generate(name)

    timings = common.alternate({name: runner(name) for name in variants}, num_repeats=args.repeats)
    naive_rollout.ROW_BUCKET = 8
    rows = []
    for name, values in timings.items():
        rss = common.peak_memory_bytes(runner(name))[0] / 2**30
        rows.append(
            {
                "variant": name,
                "median_s": common.median(values),
                "min_s": min(values),
                "max_s": max(values),
                "mean_response_tokens": tokens[name],
                "peak_memory_gb": rss,
                "fused_weight_mb": fused_weight_bytes(variants[name][0](model), batch) / 2**20,
            }
        )
    print(common.format_table(rows, list(rows[0])))
    if args.no_save:
        return 0
    path = common.write_results(
        "bench_rollout_decode",
        {
            "settings": {
                "repeats": args.repeats,
                "prompts": args.num_prompts,
                "group_size": GROUP,
                "prompt_length": PROMPT_LENGTH,
                "response_length": args.response_length,
            },
            "rows": rows,
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
