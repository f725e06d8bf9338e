"""Tests for verl.models.loading and the embedded tiny model assets."""

import logging
import random

import pytest
import torch

from verl.models.loading import (
    DEFAULT_MODEL_PATH,
    load_hf_causal_lm,
    load_hf_config,
    load_tokenizer,
    resolve_model_path,
)
from verl.utils.reward_score import tiny_task


def test_default_path_resolution_and_assets():
    for name in (None, "", "default"):
        assert resolve_model_path(name) == str(DEFAULT_MODEL_PATH)
    assert resolve_model_path("/some/dir") == "/some/dir"
    for filename in ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors", "README.md"):
        assert (DEFAULT_MODEL_PATH / filename).is_file(), filename
    # The brief caps the weights at 2 MB (about 100k fp32 parameters is 0.4 MB).
    assert (DEFAULT_MODEL_PATH / "model.safetensors").stat().st_size < 2 * 1024 * 1024


def test_tokenizer_round_trip_and_special_tokens():
    tokenizer = load_tokenizer("default")
    # Vocabulary order: <pad>=0 <s>=1 </s>=2 <unk>=3, then '0'..'9' = 4..13, then '=' = 14.
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    assert tokenizer.unk_token_id == 3
    assert tokenizer.padding_side == "left"
    ids = tokenizer("312=")["input_ids"]
    assert ids == [1, 7, 5, 6, 14]  # bos is prepended; '3' = 4 + 3, '1' = 5, '2' = 6
    assert tokenizer.decode(ids + [2, 0], skip_special_tokens=True) == "312="
    # Spaces and letters are single characters too and survive decoding unchanged.
    text = "ab c 9?"
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text
    # Characters outside the vocabulary are dropped (the byte-level BPE that transformers builds for qwen2 has
    # no unk fallback), so "é1" encodes as "1" alone.
    assert tokenizer("é1", add_special_tokens=False)["input_ids"] == [5]


def test_left_padding_batch():
    tokenizer = load_tokenizer(None)
    encoded = tokenizer(["12=", "3="], padding=True)
    assert encoded["input_ids"][1] == [0, 1, 7, 14]
    assert encoded["attention_mask"][1] == [0, 1, 1, 1]


def test_config():
    config = load_hf_config()
    assert config.model_type == "qwen2"
    assert (config.hidden_size, config.num_hidden_layers) == (64, 2)
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 2)
    assert config.tie_word_embeddings is True
    assert config.vocab_size == len(load_tokenizer())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_model_forward(dtype):
    model = load_hf_causal_lm("default", dtype=dtype)
    assert next(model.parameters()).dtype == dtype
    assert not model.training
    input_ids = torch.tensor([[0, 1, 7, 5, 14], [1, 5, 6, 7, 14]])
    attention_mask = (input_ids != 0).long()
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    assert logits.shape == (2, 5, 50)
    assert torch.isfinite(logits).all()


def test_warm_start_leaves_room_to_learn():
    """The shipped warm start knows the format but not the whole task: greedy score strictly between 0.2 and 0.9."""
    tokenizer, model = load_tokenizer(), load_hf_causal_lm()
    examples = [tiny_task.make_example(random.Random(i)) for i in range(64)]
    encoded = tokenizer([p for p, _ in examples], padding=True, return_tensors="pt")
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    for _ in range(tiny_task.MAX_DIGITS + 1):
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            next_token = model(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits[:, -1].argmax(-1)
        ids, mask = torch.cat([ids, next_token[:, None]], 1), torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
    texts = tokenizer.batch_decode(ids[:, encoded["input_ids"].shape[1] :], skip_special_tokens=False)
    responses = [t.split("</s>")[0] for t in texts]
    score = sum(tiny_task.compute_score(r, a) for r, (_, a) in zip(responses, examples)) / len(examples)
    assert 0.2 < score < 0.9


def test_missing_pad_token_falls_back_to_eos(tmp_path):
    tokenizer = load_tokenizer()
    tokenizer.pad_token = None
    tokenizer.save_pretrained(tmp_path)
    reloaded = load_tokenizer(tmp_path)
    assert reloaded.pad_token == "</s>"
    assert reloaded.pad_token_id == 2


def test_bad_dtype():
    with pytest.raises(ValueError, match="floating-point torch.dtype"):
        load_hf_causal_lm(dtype=torch.int64)
    with pytest.raises(ValueError, match="floating-point torch.dtype"):
        load_hf_causal_lm(dtype="float16")


def test_config_overrides_reach_the_config_and_the_built_model():
    # verl's model.override_config: attributes set on the Hugging Face config before the model is built
    assert load_hf_config(None, overrides={"rms_norm_eps": 1e-3}).rms_norm_eps == 1e-3
    model = load_hf_causal_lm(None, config_overrides={"rms_norm_eps": 1e-3})
    assert model.config.rms_norm_eps == 1e-3
    assert all(layer.input_layernorm.variance_epsilon == 1e-3 for layer in model.model.layers)
    plain = load_hf_causal_lm(None)
    assert plain.config.rms_norm_eps != 1e-3  # the override is not the default by chance
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), plain.state_dict().values()))


def test_an_override_of_an_attribute_the_config_lacks_is_set_with_a_warning_naming_it(caplog):
    # verl's dapo_30b_a3b_math_fsdp_npu.sh sets GPT-2's embd_pdrop and resid_pdrop on a Qwen model: verl sets them and
    # moves on; here too, and the warning names each (a typo of a real attribute would otherwise go unnoticed)
    with caplog.at_level(logging.WARNING, logger="verl.models.loading"):
        config = load_hf_config(None, overrides={"embd_pdrop": 0.0, "resid_pdrop": 0.0, "attention_dropout": 0.0})
    assert (config.embd_pdrop, config.resid_pdrop, config.attention_dropout) == (0.0, 0.0, 0.0)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 2  # attention_dropout is a Qwen2Config attribute: no warning for it
    assert warned[0].startswith("model.override_config.embd_pdrop: the model's config (Qwen2Config) has no attribute")
    assert warned[1].startswith("model.override_config.resid_pdrop:")
    # the model builds from such a config (the attribute rides along, as transformers keeps unknown config keys)
    assert load_hf_causal_lm(None, config_overrides={"embd_pdrop": 0.0}).config.embd_pdrop == 0.0


def test_verls_megatron_spelling_nests_the_overrides_under_model_config():
    config = load_hf_config(None, overrides={"model_config": {"max_position_embeddings": 96}, "rms_norm_eps": 1e-3})
    assert (config.max_position_embeddings, config.rms_norm_eps) == (96, 1e-3)
    with pytest.raises(ValueError, match="moe_config sets a mixture-of-experts router; MoE models are out of scope"):
        load_hf_config(None, overrides={"moe_config": {"freeze_moe_router": True}})
