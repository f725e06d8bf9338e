"""The actor runs the policy loss the config names (``policy_loss.loss_mode``, or the bare-name alias)."""

import pytest
import torch

from tests.workers.actor.conftest import ppo_batch, tiny_qwen2
from verl.trainer.ppo import core_algos as ca
from verl.workers.actor.dp_actor import build_dp_actor
from verl.workers.config import compose_ppo_config

A = "actor_rollout_ref.actor"


def actor_from_command_line(*overrides):
    cfg = compose_ppo_config([f"{A}.dtype=float32", *overrides])
    actor_cfg = cfg.actor_rollout_ref.actor.per_rank(rollout_n=cfg.actor_rollout_ref.rollout.n, world_size=1)
    return build_dp_actor(actor_cfg, tiny_qwen2(0), total_training_steps=1)


@pytest.mark.parametrize("spelling", [f"{A}.policy_loss.loss_mode=gspo", f"{A}.policy_loss=gspo"])
def test_the_actor_loss_is_the_configured_one(spelling):
    actor = actor_from_command_line(spelling)
    batch = ppo_batch(num_samples=4, seed=2)
    # old log-probs off the current ones, so that gspo's sequence ratio differs from vanilla's token ratios
    current, _ = actor.compute_log_prob(batch)
    batch.batch["old_log_probs"] = current + torch.linspace(-0.3, 0.3, current.numel()).view_as(current)
    loss, metrics = actor._micro_batch_loss(batch, temperature=1.0)
    tensors = batch.batch
    args = (tensors["old_log_probs"], current, tensors["advantages"], tensors["response_mask"])
    gspo, _ = ca.compute_policy_loss_gspo(*args, "token-mean", actor.config)
    vanilla, _ = ca.compute_policy_loss_vanilla(*args, "token-mean", actor.config)
    assert abs(gspo.item() - vanilla.item()) > 1e-3  # the check below tells the two apart
    assert metrics["actor/pg_loss"] == pytest.approx(gspo.item(), rel=1e-4, abs=1e-6)
    assert loss.item() == pytest.approx(gspo.item(), rel=1e-4, abs=1e-6)
