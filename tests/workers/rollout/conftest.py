"""Shared builders for the rollout tests: sampling options from the YAML, a tiny random Hugging Face causal LM and a
left-padded prompt batch."""

import functools

import pytest
import torch

from verl.protocol import DataProto

PAD_ID = 0
VOCAB_SIZE = 32


@functools.cache
def _default_sampling():
    from verl.workers.config import RolloutConfig, load_section

    return load_section(RolloutConfig).sampling_options()


def sampling_options(**overrides):
    """The rollout's sampling options as ``ppo_trainer.yaml`` sets them, with ``overrides`` (validated) applied."""
    return _default_sampling().replace(**overrides)


def make_prompts(rows: list[list[int]], num_prompt_tokens: int, non_tensors: dict | None = None, meta=None):
    """Left-pad token rows to ``num_prompt_tokens`` and build the prompt DataProto of the shared layout."""
    input_ids = torch.full((len(rows), num_prompt_tokens), PAD_ID, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for i, row in enumerate(rows):
        input_ids[i, num_prompt_tokens - len(row) :] = torch.tensor(row)
        attention_mask[i, num_prompt_tokens - len(row) :] = 1
    position_ids = torch.clamp(attention_mask.cumsum(-1) - 1, min=0)
    tensors = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
    return DataProto.from_dict(tensors, non_tensors, meta)


def build_tiny_model(arch: str = "qwen2", **overrides):
    """A 2-layer, hidden-32, vocab-32 random model of a Llama-family ``arch`` (llama, mistral, qwen2, qwen3, gemma); a
    wide init so greedy paths do not collapse to one token. ``overrides`` go to the config."""
    import transformers

    prefix = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3", "gemma": "Gemma"}[arch]
    config = getattr(transformers, f"{prefix}Config")(
        **{
            "vocab_size": VOCAB_SIZE,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 64,
            "initializer_range": 0.5,
            "pad_token_id": PAD_ID,
            **overrides,
        }
    )
    torch.manual_seed(0)
    return getattr(transformers, f"{prefix}ForCausalLM")(config).eval()


def hf_logits_fn(model):
    """The shared model contract over a Hugging Face model."""

    def logits_fn(input_ids, attention_mask, position_ids):
        return model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits

    return logits_fn


def decoding_prompts():
    """Four prompts whose positions all start elsewhere (left padding of 3, 1, 0 and 2 tokens)."""
    return make_prompts([[5, 6], [7, 8, 9, 10], [11, 12, 13, 14, 15], [16, 17, 18]], num_prompt_tokens=5)


def step_logits(decoder, prompts, num_steps, drop_after):
    """Greedy-feed ``decoder`` for ``num_steps`` tokens; after step ``drop_after`` only rows 0, 2 and 3 go on."""
    ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
    positions = prompts.batch["position_ids"]
    logits = [decoder.prefill(ids, mask, positions, num_steps)]
    next_position = positions[:, -1] + 1
    for step in range(num_steps):
        tokens = logits[-1].argmax(-1)
        if step == drop_after:
            keep = torch.tensor([0, 2, 3])
            decoder.keep_rows(keep)
            tokens, mask, next_position = tokens[keep], mask[keep], next_position[keep]
        mask = torch.cat([mask, torch.ones(mask.shape[0], 1, dtype=mask.dtype)], dim=-1)
        logits.append(decoder.decode(tokens, mask, next_position))
        next_position = next_position + 1
    return logits


@pytest.fixture(scope="module")
def tiny_model():
    return build_tiny_model("qwen2")


@pytest.fixture
def prompts():
    # row 0 is left-padded by 3, row 1 by 1, row 2 not at all
    return make_prompts(
        [[5, 6], [7, 8, 9, 10], [11, 12, 13, 14, 15]],
        num_prompt_tokens=5,
        non_tensors={"uid": ["a", "b", "c"], "ground_truth": ["1", "2", "3"]},
        meta={"global_step": 7},
    )
