"""The actor runs the policy loss the config names (``policy_loss.loss_mode``, or the bare-name alias)."""

import math

import pytest
import torch

from tests.workers.actor.conftest import ppo_batch, tiny_qwen2
from verl.workers.actor.dp_actor import build_dp_actor
from verl.workers.config import compose_ppo_config

A = "actor_rollout_ref.actor"

# The log-ratios log pi - log pi_old the test sets, per response token (R = 4). Row 0 (advantage +1) has 4 valid
# tokens; row 1 (advantage -1) ended early and has 3, its last position is padding.
LOG_RATIOS = torch.tensor([[0.4, 0.0, 0.0, 0.0], [0.0, 0.0, -0.3, 0.0]])

# gspo: one ratio per sequence, exp(token-mean log-ratio), inside [1 - 0.2, 1 + 0.2] here, so nothing clips:
#   row 0: exp(0.4 / 4) = exp(0.1) = 1.10517, loss per token -1 * 1.10517; row 1: exp(-0.3 / 3) = exp(-0.1) = 0.90484,
#   loss per token +0.90484. Aggregated per sequence whatever loss_agg_mode says: (-1.10517 + 0.90484) / 2.
GSPO_LOSS = (-math.exp(0.1) + math.exp(-0.1)) / 2  # -0.100167
# vanilla: token ratios, clipped per token. Row 0 (A = +1): exp(0.4) = 1.492 clips to 1.2, so max(-1.492, -1.2) =
#   -1.2, and three tokens of -1: sum -4.2. Row 1 (A = -1): exp(-0.3) = 0.741 clips to 0.8, max(0.741, 0.8) = 0.8
#   (dual clip at 3 does not bite), and two tokens of +1: sum 2.8. token-mean over the 7 valid tokens: -1.4 / 7.
VANILLA_LOSS = (-4.2 + 2.8) / 7  # -0.2


def actor_from_command_line(*overrides):
    cfg = compose_ppo_config([f"{A}.dtype=float32", *overrides])
    actor_cfg = cfg.actor_rollout_ref.actor.per_rank(rollout_n=cfg.actor_rollout_ref.rollout.n, world_size=1)
    return build_dp_actor(actor_cfg, tiny_qwen2(0), total_training_steps=1)


@pytest.mark.parametrize(
    ("spelling", "expected"),
    [
        (f"{A}.policy_loss.loss_mode=gspo", GSPO_LOSS),
        (f"{A}.policy_loss=gspo", GSPO_LOSS),
        (f"{A}.policy_loss.loss_mode=vanilla", VANILLA_LOSS),
    ],
)
def test_the_actor_loss_is_the_configured_one(spelling, expected):
    actor = actor_from_command_line(spelling)
    config = actor.config
    # the numbers above assume verl's defaults: clip 0.2 both sides, dual clip 3, no entropy bonus, no KL loss
    assert (config.clip_ratio, config.clip_ratio_low, config.clip_ratio_high, config.clip_ratio_c) == (
        0.2,
        None,
        None,
        3.0,
    )
    assert config.entropy_coeff == 0 and not config.use_kl_loss and config.loss_agg_mode == "token-mean"
    batch = ppo_batch(num_samples=2, seed=2)
    assert batch.batch["response_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert batch.batch["advantages"][:, 0].tolist() == [1.0, -1.0]
    # old log-probs set off the model's own, so that the log-ratio is LOG_RATIOS whatever the model computes
    current, _ = actor.compute_log_prob(batch)
    batch.batch["old_log_probs"] = current - LOG_RATIOS
    loss, metrics = actor._micro_batch_loss(batch, temperature=1.0)
    assert metrics["actor/pg_loss"] == pytest.approx(expected, abs=1e-5)
    assert loss.item() == pytest.approx(expected, abs=1e-5)
