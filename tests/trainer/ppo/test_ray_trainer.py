"""The driver's reward shaping and advantage call: the KL penalty in the reward, with hand-derived numbers."""

import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import get_kl_controller
from verl.trainer.ppo.ray_trainer import apply_kl_penalty
from verl.trainer.ppo.rollout_source import ColocatedRollout
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


# ---------------------------------------------------------------------------------------------- the estimator call


def trainer_for(*overrides, reward_fn=None):
    from verl.trainer.data_setup import TrainingData
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, TrainerRun
    from verl.trainer.ray_setup import WorkerGroups
    from verl.workers.config import compose_ppo_config

    config = compose_ppo_config(list(overrides))
    data = TrainingData(train_loader=None, val_batches=[], reward_fn=reward_fn, num_train_prompts=0)
    return RayPPOTrainer(config, WorkerGroups(None), data, tracker=None, run=TrainerRun(total_training_steps=1))


def four_one_token_responses():
    import numpy as np

    return DataProto.from_dict(
        tensors={"response_mask": torch.ones(4, 1, dtype=torch.long), "responses": torch.ones(4, 1, dtype=torch.long)},
        non_tensors={"uid": np.array(["a", "a", "b", "b"], dtype=object)},
    )


def test_gdpo_reads_the_reward_components_the_scorer_returned():
    # The scorer returns two components besides the score; the trainer puts them in the non-tensor batch and
    # calls gdpo with batch= and non_tensor_batch=, as verl does.
    def reward_fn(batch, return_dict=False):
        result = {
            "reward_tensor": torch.tensor([[1.0], [1.0], [2.0], [1.0]]),
            "reward_extra_info": {"format": [1.0, 0.0, 1.0, 1.0], "accuracy": [0.0, 1.0, 1.0, 0.0]},
        }
        return result if return_dict else result["reward_tensor"]

    trainer = trainer_for(
        "algorithm.adv_estimator=gdpo",
        "algorithm.gdpo_reward_keys=[format,accuracy]",
        "algorithm.gdpo_reward_weights=[1,2]",
        reward_fn=reward_fn,
    )
    batch = four_one_token_responses()
    scores = trainer.score(batch)
    assert list(batch.non_tensor_batch["accuracy"]) == [0.0, 1.0, 1.0, 0.0]
    batch.batch["token_level_rewards"] = scores
    trainer.compute_advantage(batch)
    # GRPO per component and group (std of two values a, b is |a - b| / sqrt 2): format a: (+.7071, -.7071),
    # b: (0, 0); accuracy a: (-.7071, +.7071), b: (+.7071, -.7071). Weighted 1 and 2: (-.7071, .7071, 1.4142,
    # -1.4142); whitened over the 4 tokens (mean 0, unbiased variance (.5 + .5 + 2 + 2) / 3 = 5/3): x / 1.2910
    expected = torch.tensor([[-0.5477], [0.5477], [1.0954], [-1.0954]])
    torch.testing.assert_close(batch.batch["advantages"], expected, atol=1e-4, rtol=0)


def test_a_registered_estimator_named_in_the_config_gets_verls_keywords():
    # A user's estimator, registered before the config is validated, is reachable by name from a real config; the
    # trainer calls it with verl's keywords only: not the old log-probs the batch also holds (verl passes those to
    # its token-baseline estimators alone, which this trainer's config refuses), and not the batch (gdpo only).
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est

    calls = []

    with ADV_ESTIMATOR_REGISTRY.scoped():

        @register_adv_est("test_minus_group_mean")
        def minus_group_mean(token_level_rewards, response_mask, index, config, **kwargs):
            calls.append({"index": list(index), "config": config, **kwargs})
            scores = token_level_rewards.sum(-1)
            groups = {uid: scores[index == uid].mean() for uid in set(index)}
            baseline = torch.stack([groups[uid] for uid in index])
            advantages = (scores - baseline).unsqueeze(-1) * response_mask
            return advantages, advantages

        trainer = trainer_for("algorithm.adv_estimator=test_minus_group_mean")
        batch = four_one_token_responses()
        batch.batch["token_level_rewards"] = torch.tensor([[1.0], [0.0], [3.0], [1.0]])
        batch.batch["old_log_probs"] = torch.zeros(4, 1)
        trainer.compute_advantage(batch)

    (call,) = calls
    assert call == {"index": ["a", "a", "b", "b"], "config": trainer.config.algorithm}
    # group a: (1, 0), mean 0.5 -> (0.5, -0.5); group b: (3, 1), mean 2 -> (1, -1); returns are the same here
    expected = torch.tensor([[0.5], [-0.5], [1.0], [-1.0]])
    torch.testing.assert_close(batch.batch["advantages"], expected)
    torch.testing.assert_close(batch.batch["returns"], expected)


# ---------------------------------------------------------------------------------------------- checkpoints, samples


class _SavingGroup:
    """A worker group's checkpoint calls: writes the two files of a complete role directory."""

    def save_checkpoint(self, path):
        from pathlib import Path

        from verl.utils.checkpoint import save_state, save_weights

        Path(path).mkdir(parents=True)
        save_weights(Path(path) / "model.safetensors", {"w": torch.zeros(2)})
        save_state(Path(path) / "train_state.pt", {"steps": 0})


class _Loader:
    def state_dict(self):
        return {"epoch": 0, "position": 0}


@pytest.mark.parametrize(("keep", "left"), [("null", [1, 2, 3]), ("2", [2, 3])])
def test_save_checkpoint_keeps_max_actor_ckpt_to_keep(tmp_path, keep, left):
    trainer = trainer_for(f"trainer.default_local_dir={tmp_path}", f"trainer.max_actor_ckpt_to_keep={keep}")
    from verl.trainer.ray_setup import WorkerGroups

    trainer.groups, trainer.train_loader = WorkerGroups(_SavingGroup()), _Loader()
    trainer.rollout_source = ColocatedRollout(trainer.actor_wg, trainer.train_loader)
    for step in (1, 2, 3):
        trainer.global_step = step
        trainer.save_checkpoint()
    assert sorted(int(p.name.split("_")[-1]) for p in tmp_path.iterdir()) == left


def test_decoded_samples_strip_the_padding_of_prompt_and_response():
    from verl.trainer.ppo.ray_trainer import decoded_samples

    class Letters:  # token id i decodes to the i-th letter; 0 is padding
        def decode(self, ids, skip_special_tokens):
            return "".join(chr(ord("a") + i - 1) for i in ids)

    # prompts are left-padded to 3, responses right-padded to 2: [0 1 2 | 3 0] and [4 5 6 | 7 8]
    output = DataProto.from_dict(
        tensors={
            "prompts": torch.tensor([[0, 1, 2], [4, 5, 6]]),
            "responses": torch.tensor([[3, 0], [7, 8]]),
            "attention_mask": torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]]),
        }
    )
    samples = decoded_samples(Letters(), output, torch.tensor([0.5, 1.0]), limit=5)
    assert samples == [
        {"input": "ab", "output": "c", "score": 0.5},
        {"input": "def", "output": "gh", "score": 1.0},
    ]
    assert decoded_samples(Letters(), output, torch.tensor([0.5, 1.0]), limit=1) == samples[:1]


# ---------------------------------------------------------------------------------------------- typed update results


def _outcome(successful: bool, step: int):
    from verl.workers.update_outcome.outcome import UpdateOutcome

    return UpdateOutcome(
        successful, grad_norm=None, num_zeros_in_grad=None, loss_scale=None, min_loss_scale=None, step=step
    )


def test_the_run_summary_counts_from_the_merged_results_not_from_metric_names():
    from verl.workers.update_outcome.result import UpdateResult

    trainer = trainer_for()
    # two ranks of one step: update 3 failed, update 4 applied; 4 attempted and 1 failed since the run began
    outcomes = (_outcome(False, 3), _outcome(True, 4))
    ranks = [UpdateResult("actor", outcomes, 4, 1, {"actor/pg_loss": loss}) for loss in (1.0, 3.0)]
    merged = trainer._record_update(ranks)
    assert merged.metrics == {"actor/pg_loss": 2.0}  # the mean over ranks: (1 + 3) / 2, no count metric needed
    assert merged.updated
    assert trainer.update_counts() == {"actor": (3, 1)}  # 4 - 1 applied, 1 skipped
    # a role that never reported (no critic in this run) is not counted
    assert "critic" not in trainer.update_counts()
