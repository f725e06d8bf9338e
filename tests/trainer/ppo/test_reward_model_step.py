"""A training step with a reward model: the reward-model group's ``rm_scores`` become the token-level scores.

The worker groups are stand-ins that record what they get: the rollout returns a fixed batch, the reward-model
group returns fixed scores, and the actor's update receives the advantages, which GRPO derives from those scores.
"""

import numpy as np
import pytest
import torch

from verl.protocol import DataProto

RESPONSE_LENGTH = 3


class FakeGroup:
    """A worker group whose methods return canned answers and record their argument."""

    def __init__(self, **methods):
        self.calls: dict[str, DataProto] = {}
        for name, answer in methods.items():
            setattr(self, name, self._recorder(name, answer))

    def _recorder(self, name, answer):
        def call(data):
            self.calls[name] = data
            return answer(data)

        return call

    def pop_call_timings(self):
        return {}


def rollout(prompts: DataProto) -> DataProto:
    """Two samples of one prompt: 2 prompt tokens and responses of 3 and 2 tokens."""
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    responses = torch.tensor([[5, 6, 7], [8, 9, 0]])
    batch = DataProto.from_dict(
        tensors={
            "prompts": torch.tensor([[3, 4], [3, 4]]),
            "responses": responses,
            "input_ids": torch.cat([torch.tensor([[3, 4], [3, 4]]), responses], dim=1),
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "response_mask": mask[:, -RESPONSE_LENGTH:],
        },
        non_tensors={
            "uid": np.array(["a", "a"], dtype=object),
            "raw_prompt": np.array(["1+1=", "1+1="], dtype=object),
            "ground_truth": np.array(["2", "2"], dtype=object),
        },
    )
    batch.meta_info["metrics"] = {"timing_s/gen": 0.0}
    return batch


def rm_scores(data: DataProto) -> DataProto:
    # score 1.0 on the first response's last token (column 2), 3.0 on the second's (column 1)
    return DataProto.from_dict(tensors={"rm_scores": torch.tensor([[0.0, 0.0, 1.0], [0.0, 3.0, 0.0]])})


def one_applied_update(data):
    """What one rank of the actor group returns for a step with one applied update."""
    from verl.workers.update_outcome.outcome import UpdateOutcome
    from verl.workers.update_outcome.result import UpdateResult

    outcome = UpdateOutcome(True, grad_norm=1.0, num_zeros_in_grad=None, loss_scale=None, min_loss_scale=None, step=1)
    return [UpdateResult("actor", (outcome,), 1, 0, {"actor/pg_loss": 0.0})]


def training_data(reward_fn):
    from verl.trainer.data_setup import TrainingData

    return TrainingData(train_loader=None, val_batches=[], reward_fn=reward_fn, num_train_prompts=0)


def rule_reward(data, return_dict=False):
    raise AssertionError("the reward function must not be called when the reward model scored the batch")


def make_trainer(reward_model_wg, reward_fn=rule_reward):
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, TrainerRun
    from verl.trainer.ray_setup import WorkerGroups
    from verl.workers.config import compose_ppo_config

    config = compose_ppo_config(
        [
            "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.rollout.n=2",
            "critic.enable=false",
            "reward_model.enable=true",
            "reward_model.model.path=unused",
            "reward_model.micro_batch_size_per_gpu=2",
        ]
    )
    actor_wg = FakeGroup(generate_with_log_probs=rollout, update_actor=one_applied_update)
    groups = WorkerGroups(actor_wg, reward_model=reward_model_wg)
    trainer = RayPPOTrainer(config, groups, training_data(reward_fn), tracker=None, run=TrainerRun(1))
    return trainer, actor_wg


def test_the_training_step_scores_with_the_reward_model():
    reward_model_wg = FakeGroup(compute_rm_score=rm_scores)
    trainer, actor_wg = make_trainer(reward_model_wg)
    prompts = DataProto.from_dict(
        tensors={"input_ids": torch.tensor([[3, 4]])}, non_tensors={"raw_prompt": np.array(["1+1="], dtype=object)}
    )
    metrics = trainer.train_step(prompts)
    # the reward model read the sequences and the prompt texts, nothing else of the batch
    sent = reward_model_wg.calls["compute_rm_score"]
    assert set(sent.batch.keys()) == {"prompts", "responses", "input_ids", "attention_mask", "position_ids"}
    assert set(sent.non_tensor_batch) == {"raw_prompt"}
    # GRPO over the group's two scores (1, 3): mean 2, unbiased std sqrt(2); advantages -+1/sqrt(2) on every
    # response token of each sample
    update = actor_wg.calls["update_actor"]
    expected = torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 0.0]]) / 2**0.5
    torch.testing.assert_close(update.batch["advantages"], expected, atol=1e-4, rtol=0)
    assert metrics["critic/score/mean"] == pytest.approx(2.0)  # the sequence scores 1 and 3


def test_without_a_reward_model_the_reward_function_scores():
    def rule(data, return_dict=False):
        return {"reward_tensor": torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]), "reward_extra_info": {}}

    trainer, _ = make_trainer(None, reward_fn=rule)
    batch = trainer._generate_and_score(DataProto.from_dict(tensors={"input_ids": torch.tensor([[3, 4]])}), {})
    assert "rm_scores" not in batch.batch.keys()
    assert batch.batch["token_level_scores"].sum().item() == 1.0


def test_dapo_compares_the_final_rewards_with_the_kl_penalty_in_them():
    # Both samples score 1 on their last token: by score the group is uniform and DAPO would drop it. With the KL
    # penalty in the reward (fixed beta 0.5) they differ: sample 0 has old - ref = 0.2 on its 3 tokens (k1 sum 0.6),
    # sample 1 has 0 -> final rewards 1 - 0.5 x 0.6 = 0.7 and 1: seq_final_reward keeps the group.
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, TrainerRun
    from verl.trainer.ray_setup import WorkerGroups
    from verl.workers.config import compose_ppo_config

    config = compose_ppo_config(
        [
            "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.rollout.n=2",
            "critic.enable=false",
            "algorithm.use_kl_in_reward=true",
            "algorithm.kl_ctrl.kl_coef=0.5",
            "algorithm.filter_groups.enable=true",
            "algorithm.filter_groups.metric=seq_final_reward",
            "algorithm.filter_groups.max_num_gen_batches=1",
            "data.train_batch_size=1",
            "actor_rollout_ref.actor.ppo_mini_batch_size=1",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        ]
    )

    def rollout_with_log_probs(prompts):
        batch = rollout(prompts)
        batch.batch["ref_log_prob"] = torch.zeros(2, RESPONSE_LENGTH)
        batch.batch["old_log_probs"] = torch.tensor([[0.2, 0.2, 0.2], [0.0, 0.0, 0.0]])
        return batch

    def last_token_scores(data, return_dict=False):
        return {"reward_tensor": torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]]), "reward_extra_info": {}}

    actor_wg = FakeGroup(generate_with_log_probs=rollout_with_log_probs, update_actor=one_applied_update)
    trainer = RayPPOTrainer(
        config, WorkerGroups(actor_wg), training_data(last_token_scores), tracker=None, run=TrainerRun(1)
    )
    prompts = DataProto.from_dict(
        tensors={"input_ids": torch.tensor([[3, 4]])}, non_tensors={"raw_prompt": np.array(["1+1="], dtype=object)}
    )
    metrics = trainer.train_step(prompts)
    assert metrics["train/num_groups_dropped"] == 0.0
    rewards = actor_wg.calls["update_actor"]
    assert rewards.batch["advantages"][0, 0].item() < 0 < rewards.batch["advantages"][1, 0].item()  # 0.7 < 1


def test_the_driver_decides_the_weight_sync_from_the_result_not_from_a_metric():
    # the actor's result says no update was applied; its metrics carry no count at all: the rollout source is told
    # "not updated" from the typed result
    from verl.workers.update_outcome.outcome import UpdateOutcome
    from verl.workers.update_outcome.result import UpdateResult

    failed = UpdateOutcome(False, grad_norm=None, num_zeros_in_grad=None, loss_scale=None, min_loss_scale=None, step=1)
    for outcome, expected in ((failed, [False]), (None, [True])):
        trainer, actor_wg = make_trainer(FakeGroup(compute_rm_score=rm_scores))
        if outcome is not None:
            actor_wg.update_actor = lambda data, o=outcome: [UpdateResult("actor", (o,), 1, 1, {})]
        told = []
        trainer.rollout_source.after_update = lambda updated, told=told: told.append(updated) or {}
        prompts = DataProto.from_dict(
            tensors={"input_ids": torch.tensor([[3, 4]])}, non_tensors={"raw_prompt": np.array(["1+1="], dtype=object)}
        )
        trainer.train_step(prompts)
        assert told == expected
