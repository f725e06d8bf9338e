"""Micro-batch weights follow the aggregation the policy loss actually uses: accumulated gradients equal the
whole mini-batch's, for every ``loss_agg_mode`` and for the losses that fix their own aggregation."""

import pytest
import torch

from tests.workers.actor.conftest import PROMPT, RESPONSE, actor_config, ppo_batch, tiny_qwen2
from verl.trainer.ppo.loss_agg import loss_share
from verl.workers.actor.dp_actor import build_dp_actor


def test_loss_share_by_hand():
    # micro: rows [3 tokens, 0 tokens]; mini adds rows [4 tokens, 1 token] -> 8 tokens, 3 non-empty rows, 4 rows
    micro = torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0]])
    mini = torch.cat([micro, torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])])
    assert loss_share(micro, mini, "token-mean") == pytest.approx(3 / 8)
    assert loss_share(micro, mini, "seq-mean-token-mean") == pytest.approx(1 / 3)  # the empty row does not count
    assert loss_share(micro, mini, "seq-mean-token-sum") == pytest.approx(1 / 3)
    assert loss_share(micro, mini, "row-mean") == pytest.approx(2 / 4)
    assert loss_share(micro, mini, "token-sum") == 1.0  # a sum: every micro-batch counts whole
    assert loss_share(micro, mini, "seq-mean-token-sum-norm") == 1.0  # divided by a constant (R)
    with pytest.raises(ValueError, match="token-mean"):
        loss_share(micro, mini, "seq-sum")


def uneven_batch():
    """8 samples whose responses hold 4, 4, 3, 3, 2, 1, 1 and 0 tokens, so that micro-batches of 2 (cut from
    length-sorted rows) differ in tokens, in non-empty sequences and in rows; old log-probs off the current ones."""
    batch = ppo_batch(num_samples=8, seed=3)
    lengths = [4, 4, 3, 3, 2, 1, 1, 0]
    response_mask = torch.tensor([[1] * n + [0] * (RESPONSE - n) for n in lengths])
    tensors = batch.batch
    tensors["attention_mask"][:, PROMPT:] = response_mask
    tensors["attention_mask"][0, 0] = 1
    tensors["position_ids"] = (tensors["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    tensors["response_mask"] = response_mask
    gen = torch.Generator().manual_seed(1)
    advantages = torch.randn(8, 1, generator=gen).expand(-1, RESPONSE)
    tensors["advantages"] = advantages * response_mask
    tensors["old_log_probs"] = -2.0 + 0.3 * torch.randn(8, RESPONSE, generator=gen)
    return batch


def gradients(micro_size, **overrides):
    actor = build_dp_actor(
        actor_config(ppo_micro_batch_size_per_gpu=micro_size, **overrides), tiny_qwen2(0), total_training_steps=10
    )
    mini = uneven_batch()
    actor.current_mini_batch = mini  # as UpdateLoop.update sets it around each mini-batch
    actor._backward_mini_batch(mini, temperature=1.0)
    return [p.grad.clone() for p in actor.actor_module.parameters()]


CASES = [
    {"loss_agg_mode": mode}
    for mode in ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
] + [
    {"policy_loss": {"loss_mode": "gspo"}},
    {"policy_loss": {"loss_mode": "sapo"}, "loss_agg_mode": "token-sum"},
    {"policy_loss": {"loss_mode": "geo_mean"}},
    # a loss with its own aggregation next to an entropy term that follows loss_agg_mode (token-mean)
    {"policy_loss": {"loss_mode": "gspo"}, "entropy_coeff": 0.1},
    {"policy_loss": {"loss_mode": "geo_mean"}, "entropy_coeff": 0.1, "loss_agg_mode": "seq-mean-token-sum"},
]


@pytest.mark.parametrize("overrides", CASES, ids=lambda o: "-".join(str(v) for v in o.values()))
def test_accumulated_micro_batch_gradients_equal_the_mini_batch_gradient(overrides):
    whole = gradients(8, **overrides)
    accumulated = gradients(2, **overrides)  # four micro-batches of unequal token and sequence counts
    assert any(g.abs().sum() > 0 for g in whole)
    for a, b in zip(accumulated, whole, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_the_row_weights_alone_would_be_wrong_for_token_sum():
    # The check above can fail: weighting token-sum micro-batches by their share of rows (what every non-token-mean
    # mode got before) gives a quarter of the gradient here, four micro-batches of 2 rows out of 8.
    from verl.workers.actor.update_loop import UpdateLoop

    whole = gradients(8, loss_agg_mode="token-sum")
    original = UpdateLoop._micro_batch_weight
    try:
        UpdateLoop._micro_batch_weight = lambda self, micro, mini: len(micro) / len(mini)
        by_rows = gradients(2, loss_agg_mode="token-sum")
    finally:
        UpdateLoop._micro_batch_weight = original
    ratio = sum(float(g.abs().sum()) for g in by_rows) / sum(float(g.abs().sum()) for g in whole)
    assert ratio == pytest.approx(0.25, rel=1e-4)
