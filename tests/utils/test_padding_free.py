"""Padding-free passes: packing the real tokens into one row gives the padded forward's outputs at the real tokens."""

import pytest
import torch

from tests.workers.actor.conftest import ppo_batch, tiny_qwen2
from verl.utils.padding_free import forward_packed, pack, unpack


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
    torch.testing.assert_close(packed[real], padded[real], atol=1e-5, rtol=1e-5)
    assert torch.count_nonzero(packed[~real]) == 0


def test_padding_free_actor_takes_the_same_update():
    from tests.workers.actor.conftest import actor_config
    from verl.workers.actor.dp_actor import build_dp_actor

    plain = build_dp_actor(actor_config(), tiny_qwen2(seed=0), total_training_steps=10)
    packed = build_dp_actor(actor_config(), tiny_qwen2(seed=0), total_training_steps=10, use_remove_padding=True)
    batch = ppo_batch()
    torch.testing.assert_close(packed.compute_log_prob(batch)[0], plain.compute_log_prob(batch)[0], atol=1e-5, rtol=0)
    batch.batch["old_log_probs"], _ = plain.compute_log_prob(batch)
    plain.update_policy(batch)
    packed.update_policy(batch)
    for a, b in zip(plain.actor_module.parameters(), packed.actor_module.parameters()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
