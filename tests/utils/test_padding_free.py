"""Padding-free passes: packing the real tokens into one row gives the padded forward's outputs at the real tokens."""

import pytest
import torch

from tests.tolerances import assert_gradients_close, logits_tolerance
from tests.workers.actor.conftest import ppo_batch, tiny_qwen2
from verl.utils.padding_free import (
    forward_packed,
    pack,
    pad_response_columns,
    real_column_span,
    trim_padding_columns,
    unpack,
)


def test_pack_keeps_real_tokens_and_their_own_positions():
    # row 0: [pad, 5, 6]; row 1: [7, 8, 9] -> packed 5 6 7 8 9 with positions 0 1 0 1 2
    input_ids = torch.tensor([[0, 5, 6], [7, 8, 9]])
    attention_mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    position_ids = torch.tensor([[0, 0, 1], [0, 1, 2]])
    packed = pack(input_ids, attention_mask, position_ids)
    assert packed.input_ids.tolist() == [[5, 6, 7, 8, 9]] and packed.position_ids.tolist() == [[0, 1, 0, 1, 2]]
    allowed = (packed.attention_mask[0, 0] == 0).int().tolist()
    # causal within each sample, nothing across: token 7 (third) sees only itself
    assert allowed == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 1, 1, 1]]
    restored = unpack(torch.arange(5.0)[None, :, None], packed)[..., 0]
    assert restored.tolist() == [[0.0, 0.0, 1.0], [2.0, 3.0, 4.0]]  # zeros at the pad


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logits_equal_the_padded_forward_at_real_tokens(attn):
    model = tiny_qwen2(seed=0).eval()
    model.config._attn_implementation = attn
    batch = ppo_batch().batch  # one left-padded prompt, one early-ending response
    ids, mask, pos = batch["input_ids"], batch["attention_mask"], batch["position_ids"]
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        packed = forward_packed(model, ids, mask, pos)
    real = mask.bool()
    # the same sums in another order (one packed row instead of padded rows): the reordering bound of tests/tolerances
    atol = logits_tolerance(padded[real], model.config, ids.shape[1])
    torch.testing.assert_close(packed[real], padded[real], atol=atol, rtol=0)
    assert torch.count_nonzero(packed[~real]) == 0


def test_padding_free_actor_takes_the_same_update():
    from tests.workers.actor.conftest import actor_config
    from verl.workers.actor.dp_actor import build_dp_actor

    plain = build_dp_actor(actor_config(), tiny_qwen2(seed=0), total_training_steps=10)
    packed = build_dp_actor(actor_config(), tiny_qwen2(seed=0), total_training_steps=10, use_remove_padding=True)
    batch = ppo_batch()
    config, num_positions = plain.actor_module.config, batch.batch["input_ids"].shape[1]
    plain_log_probs = plain.compute_log_prob(batch)[0]
    # a log-prob is a logit less a log-sum-exp over the vocabulary: twice a logit's reordering bound
    atol = 2 * logits_tolerance(plain_log_probs, config, num_positions)
    torch.testing.assert_close(packed.compute_log_prob(batch)[0], plain_log_probs, atol=atol, rtol=0)
    batch.batch["old_log_probs"] = plain_log_probs
    plain.update_policy(batch)
    packed.update_policy(batch)
    assert_gradients_close(plain.actor_module, packed.actor_module, num_positions)


def test_real_column_span_finds_the_columns_with_a_real_token():
    # columns 0-1 are left padding in both rows, column 5 right padding in both
    mask = torch.tensor([[0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 0]])
    assert real_column_span(mask) == (2, 5)
    assert real_column_span(torch.zeros(2, 3)) == (0, 0)


def test_trimming_keeps_the_layout_prompt_then_response():
    # P = 4, R = 3: prompts left-padded by 2 and 3, responses of 1 and 2 tokens (column 6 is padding everywhere)
    mask = torch.tensor([[0, 0, 1, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1, 0]])
    ids = torch.arange(14).reshape(2, 7) * mask
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    ids_t, mask_t, pos_t, kept = trim_padding_columns(ids, mask, pos, response_length=3)
    # columns 2..5 stay: prompt columns 2, 3 and response columns 4, 5
    assert kept == 2 and torch.equal(ids_t, ids[:, 2:6]) and torch.equal(pos_t, pos[:, 2:6])
    assert torch.equal(mask_t, mask[:, 2:6])
    # no response token at all: the last prompt column stays, no response column does
    none = torch.tensor([[0, 1, 1, 0, 0]])
    assert trim_padding_columns(none, none, none, response_length=2)[3] == 0
    assert trim_padding_columns(none, none, none, response_length=2)[0].shape == (1, 2)
    assert torch.equal(pad_response_columns(torch.ones(2, 1), 3), torch.tensor([[1.0, 0, 0], [1.0, 0, 0]]))


def test_log_probs_on_the_trimmed_columns_equal_the_full_forward():
    """A batch with two all-padding prompt columns and two all-padding response columns."""
    from tests.workers.actor.conftest import actor_config
    from verl.utils.torch_functional import compute_response_log_probs
    from verl.workers.actor.dp_actor import build_dp_actor

    model = tiny_qwen2(seed=0).eval()
    actor = build_dp_actor(actor_config(), model, total_training_steps=10)
    batch = ppo_batch()
    tensors = batch.batch
    response_length = tensors["responses"].shape[1]
    pad = torch.zeros(len(batch), 2, dtype=torch.long)
    for key in ("input_ids", "attention_mask", "position_ids"):
        tensors[key] = torch.cat([pad, tensors[key], pad], dim=-1)
    tensors["responses"] = torch.cat([tensors["responses"], pad], dim=-1)
    with torch.no_grad():
        ids, mask, pos = tensors["input_ids"], tensors["attention_mask"], tensors["position_ids"]
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    full, _ = compute_response_log_probs(logits, tensors["input_ids"], response_length + 2)
    trimmed, _ = actor.compute_log_prob(batch)
    real = torch.cat([batch.batch["response_mask"], pad], dim=-1).bool()
    torch.testing.assert_close(trimmed[:, :response_length][real[:, :response_length]], full[real], atol=1e-5, rtol=0)
    assert torch.count_nonzero(trimmed[:, response_length:]) == 0  # the dropped columns come back as padding
