"""The driver's reward shaping and advantage call: the KL penalty in the reward, with hand-derived numbers."""

import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import get_kl_controller
from verl.trainer.ppo.ray_trainer import apply_kl_penalty
from verl.workers.config import AlgorithmConfig, load_section


def kl_batch():
    # one sample, two response tokens; old - ref = (0.5, -0.5) in log space
    return DataProto.from_dict(
        tensors={
            "old_log_probs": torch.tensor([[0.0, -1.0]]),
            "ref_log_prob": torch.tensor([[-0.5, -0.5]]),
            "response_mask": torch.tensor([[1, 1]]),
            "token_level_scores": torch.tensor([[0.0, 1.0]]),
        }
    )


def test_fixed_kl_penalty_subtracts_beta_times_the_token_kl():
    algo = load_section(AlgorithmConfig, {"use_kl_in_reward": True, "kl_ctrl": {"kl_coef": 0.1}})
    batch, ctrl = kl_batch(), get_kl_controller(algo.kl_ctrl)
    metrics = apply_kl_penalty(batch, ctrl, "kl")
    # k1 per token: (0.5, -0.5); rewards = scores - 0.1 * kl = (0 - 0.05, 1 + 0.05)
    torch.testing.assert_close(batch.batch["token_level_rewards"], torch.tensor([[-0.05, 1.05]]))
    # the batch's KL: token mean per sequence (0), averaged over sequences; a fixed coefficient stays 0.1
    assert metrics == {"actor/reward_kl_penalty": 0.0, "actor/reward_kl_penalty_coeff": pytest.approx(0.1)}
    assert ctrl.value == pytest.approx(0.1)


def test_adaptive_controller_moves_the_coefficient_towards_the_target():
    algo = load_section(
        AlgorithmConfig,
        {"use_kl_in_reward": True, "kl_ctrl": {"type": "adaptive", "kl_coef": 0.1, "target_kl": 0.1, "horizon": 10}},
    )
    batch, ctrl = kl_batch(), get_kl_controller(algo.kl_ctrl)
    batch.batch["ref_log_prob"] = torch.tensor([[-0.5, -1.0]])  # kl = (0.5, 0): mean 0.25, above the target
    apply_kl_penalty(batch, ctrl, "kl")
    # error = clip(0.25 / 0.1 - 1, -0.2, 0.2) = 0.2; one sample over a horizon of 10: 0.1 * (1 + 0.2 * 1 / 10)
    assert ctrl.value == pytest.approx(0.1 * 1.02)


def test_kl_in_reward_needs_a_reference_and_forces_the_old_log_prob_pass():
    from verl.workers.config import compose_ppo_config

    config = compose_ppo_config(["algorithm.use_kl_in_reward=true"])
    assert config.needs_reference and config.computes_old_log_prob
    with pytest.raises(ValueError, match="algorithm.use_kl_in_reward=true needs reference log-probs"):
        compose_ppo_config(["algorithm.use_kl_in_reward=true", "actor_rollout_ref.ref.enable=false"])
