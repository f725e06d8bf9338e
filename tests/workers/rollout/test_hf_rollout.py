"""Tests for the hf rollout: same responses as the naive rollout under greedy decoding, layout, seeding."""

import logging

import pytest
import torch

from verl.workers.rollout import HFRollout, NaiveRollout

from .conftest import PAD_ID, build_tiny_model, hf_logits_fn, sampling_options

UNUSED_EOS = 31


def _responses(rollout, prompts):
    return rollout.generate_sequences(prompts).batch


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_greedy_hf_equals_naive_with_left_padding_and_eos(arch, prompts):
    model = build_tiny_model(arch)
    config = sampling_options(n=1, response_length=6, do_sample=False)
    # pick an eos the greedy path actually emits mid-response, so eos handling is compared too
    probe = _responses(NaiveRollout(hf_logits_fn(model), config, PAD_ID, UNUSED_EOS), prompts)["responses"]
    eos = int(probe[0, 2])
    naive = _responses(NaiveRollout(hf_logits_fn(model), config, PAD_ID, eos), prompts)
    hf = _responses(HFRollout(model, config, PAD_ID, eos), prompts)
    assert hf["response_mask"][0].tolist()[3:] == [0, 0, 0]
    for key in ("prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask"):
        assert torch.equal(hf[key], naive[key]), key


def test_layout_n_and_non_tensors(tiny_model, prompts):
    out = HFRollout(
        tiny_model, sampling_options(response_length=4, n=2, seed=0), PAD_ID, UNUSED_EOS
    ).generate_sequences(prompts)
    batch = out.batch
    assert batch["responses"].shape == (6, 4) and batch["input_ids"].shape == (6, 9)
    assert torch.equal(batch["prompts"], prompts.batch["input_ids"].repeat_interleave(2, dim=0))
    assert torch.equal(batch["input_ids"], torch.cat([batch["prompts"], batch["responses"]], dim=-1))
    assert torch.equal(batch["response_mask"], batch["attention_mask"][:, 5:])
    expected_positions = torch.clamp(batch["attention_mask"].cumsum(-1) - 1, min=0)
    assert torch.equal(batch["position_ids"], expected_positions)
    assert list(out.non_tensor_batch["uid"]) == ["a", "a", "b", "b", "c", "c"]
    assert out.meta_info == {"global_step": 7}


def test_seeded_sampling_is_reproducible_and_restores_global_rng(tiny_model, prompts):
    config = sampling_options(response_length=6, n=2, temperature=1.5)
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    first = _responses(HFRollout(tiny_model, config.replace(seed=5), PAD_ID, UNUSED_EOS), prompts)["responses"]
    assert torch.equal(torch.random.get_rng_state(), state)
    again = _responses(HFRollout(tiny_model, config.replace(seed=5), PAD_ID, UNUSED_EOS), prompts)["responses"]
    other = _responses(HFRollout(tiny_model, config.replace(seed=6), PAD_ID, UNUSED_EOS), prompts)["responses"]
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_top_k_one_equals_greedy_and_training_mode_restored(tiny_model, prompts):
    greedy = _responses(
        HFRollout(tiny_model, sampling_options(n=1, response_length=6, do_sample=False), PAD_ID, UNUSED_EOS), prompts
    )
    tiny_model.train()
    try:
        top1 = _responses(
            HFRollout(tiny_model, sampling_options(n=1, response_length=6, top_k=1, seed=0), PAD_ID, UNUSED_EOS),
            prompts,
        )
        assert tiny_model.training
    finally:
        tiny_model.eval()
    assert torch.equal(top1["responses"], greedy["responses"])


def test_rejects_module_without_generate():
    with pytest.raises(ValueError, match="naive"):
        HFRollout(torch.nn.Linear(2, 2), sampling_options(n=1, response_length=2), PAD_ID, UNUSED_EOS)


def test_the_token_observer_hears_each_response_token_before_it_is_generated(tiny_model, prompts):
    # what the profiler's token window listens to: index t before token t; none after the last (index 4)
    rollout = HFRollout(tiny_model, sampling_options(response_length=4, do_sample=False), PAD_ID, UNUSED_EOS)
    heard = []
    rollout.token_observer = heard.append
    assert rollout.generate_sequences(prompts).batch["responses"].shape[1] == 4
    assert heard == [0, 1, 2, 3]


def test_generate_is_called_without_a_transformers_deprecation(tiny_model, prompts):
    # transformers 5 deprecates generation arguments passed beside a generation_config: all of ours are in it
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    hf_logger = logging.getLogger("transformers")  # its records do not reach the root logger (caplog)
    logging.Logger.warning_once.cache_clear()  # transformers' once-per-process warnings: this test sees its own
    hf_logger.addHandler(handler)
    try:
        HFRollout(tiny_model, sampling_options(response_length=4, n=1, seed=0), PAD_ID, UNUSED_EOS).generate_sequences(
            prompts
        )
    finally:
        hf_logger.removeHandler(handler)
    assert [m for m in messages if "deprecated" in m] == []
