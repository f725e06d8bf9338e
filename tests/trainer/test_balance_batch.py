"""``trainer.balance_batch``: the step's batch reordered so that every data-parallel rank gets the same share of
tokens, with verl's ``global_seqlen/*`` metrics; GRPO's advantages unchanged by the order. Numbers derived by hand.
"""

import numpy as np
import pytest
import torch

from verl.algorithms.group_advantages import compute_grpo_outcome_advantage
from verl.protocol import DataProto
from verl.single_controller.decorator import DISPATCH_TABLE, Dispatch
from verl.trainer.ppo.balance import actor_data_parallel_size, balance_batch


def batch_of_lengths(lengths, uids=None):
    """Rows whose attention masks hold ``lengths`` real tokens; row r's first token is 100 + r (to follow it)."""
    width = max(lengths)
    mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])
    ids = mask * (100 + torch.arange(len(lengths))).unsqueeze(-1)
    non_tensors = {"uid": np.array(uids if uids is not None else ["u"] * len(lengths), dtype=object)}
    return DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask}, non_tensors=non_tensors)


def rank_chunks(batch: DataProto, dp_size: int) -> list[DataProto]:
    """What each rank receives of ``batch`` from a DP_COMPUTE_PROTO call: the real dispatch's chunks."""
    per_rank_args, _, _ = DISPATCH_TABLE[Dispatch.DP_COMPUTE_PROTO].dispatch(dp_size, (batch,), {})
    return [args[0] for args in per_rank_args]


def test_four_sequences_over_two_ranks():
    # lengths 7, 5, 3, 1 -> partitions {7, 1} (rows 0, 3) and {5, 3} (rows 1, 2): 8 tokens per rank
    batch = batch_of_lengths([7, 5, 3, 1], uids=["a", "a", "b", "b"])
    metrics = balance_batch(batch, dp_size=2)
    assert batch.batch["input_ids"][:, 0].tolist() == [100, 103, 101, 102]
    assert list(batch.non_tensor_batch["uid"]) == ["a", "b", "a", "b"]  # the non-tensors move with their rows
    # before: rank 0 would have had 7 + 5 = 12, rank 1 3 + 1 = 4
    assert metrics == {
        "global_seqlen/min": 4.0,
        "global_seqlen/max": 12.0,
        "global_seqlen/minmax_diff": 8.0,
        "global_seqlen/balanced_min": 8.0,
        "global_seqlen/balanced_max": 8.0,
        "global_seqlen/mean": 8.0,
    }
    chunks = rank_chunks(batch, 2)
    assert [len(chunk) for chunk in chunks] == [2, 2]
    assert [int(chunk.batch["attention_mask"].sum()) for chunk in chunks] == [8, 8]


def test_one_rank_keeps_the_order():
    # one partition holding every row, in the batch's order: nothing moves; before = after = 16 tokens
    batch = batch_of_lengths([7, 5, 3, 1])
    metrics = balance_batch(batch, dp_size=1)
    assert batch.batch["input_ids"][:, 0].tolist() == [100, 101, 102, 103]
    assert metrics["global_seqlen/minmax_diff"] == 0.0
    assert metrics["global_seqlen/balanced_max"] == metrics["global_seqlen/mean"] == 16.0


def test_rows_that_do_not_split_evenly_are_left_alone():
    batch = batch_of_lengths([7, 5, 3])
    assert balance_batch(batch, dp_size=2) == {}
    assert batch.batch["input_ids"][:, 0].tolist() == [100, 101, 102]


def test_four_ranks_get_equal_counts_and_tokens():
    # 8 rows over 4 ranks: the sorted fours (1..4) and (5..8) combine reversed: 8+1, 7+2, 6+3, 5+4 = 9 each
    batch = batch_of_lengths([8, 7, 6, 5, 4, 3, 2, 1])
    metrics = balance_batch(batch, dp_size=4)
    chunks = rank_chunks(batch, 4)
    assert [len(chunk) for chunk in chunks] == [2, 2, 2, 2]
    assert [int(chunk.batch["attention_mask"].sum()) for chunk in chunks] == [9, 9, 9, 9]
    # before: 8+7, 6+5, 4+3, 2+1 = 15, 11, 7, 3
    assert (metrics["global_seqlen/min"], metrics["global_seqlen/max"]) == (3.0, 15.0)
    assert metrics["global_seqlen/mean"] == 9.0


def test_grpo_advantages_do_not_depend_on_the_order():
    # groups a (rows 0, 1) and b (rows 2, 3) end up split over the ranks; each row's advantage is still the one
    # its group gives it: a scores (1, 0) -> +-1/sqrt(2) (mean 0.5, unbiased std sqrt(0.5)), b scores (0, 1)
    batch = batch_of_lengths([7, 5, 3, 1], uids=["a", "a", "b", "b"])
    batch.batch["token_level_rewards"] = torch.tensor([[1.0], [0.0], [0.0], [1.0]])
    batch.batch["response_mask"] = torch.ones(4, 1)
    balance_batch(batch, dp_size=2)  # rows 0, 3, 1, 2
    advantages, _ = compute_grpo_outcome_advantage(
        batch.batch["token_level_rewards"], batch.batch["response_mask"], batch.non_tensor_batch["uid"]
    )
    expected = torch.tensor([[1.0], [1.0], [-1.0], [-1.0]]) / 2**0.5
    torch.testing.assert_close(advantages, expected, atol=1e-5, rtol=0)


TP2 = [
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
]


@pytest.mark.parametrize(
    ("config_name", "overrides", "dp_size"),
    [
        ("ppo_trainer", [], 1),
        ("ppo_trainer", ["trainer.n_gpus_per_node=2"], 2),
        # 4 ranks, each copy of the model split over 2 tensor-parallel ranks: 4 / 2 = 2 data-parallel ranks
        pytest.param("ppo_megatron_trainer", ["trainer.n_gpus_per_node=4", *TP2], 2, marks=pytest.mark.slow),
    ],
)
def test_the_actors_data_parallel_size(config_name, overrides, dp_size):
    from verl.workers.config import compose_ppo_config

    config = compose_ppo_config(["data.train_batch_size=16", *overrides], config_name=config_name)
    assert actor_data_parallel_size(config) == dp_size


# ---------------------------------------------------------------------------------------------- in the training step


class FakeActorGroup:
    """The actor worker group of a 2-rank run: a canned rollout; the update records what it was sent."""

    def __init__(self):
        self.sent: DataProto | None = None

    def generate_with_log_probs(self, prompts: DataProto) -> DataProto:
        # two prompts (one token each) x rollout.n 2: responses of 7, 5, 3 and 1 tokens -> 8, 6, 4, 2 real tokens
        lengths = torch.tensor([7, 5, 3, 1])
        response_mask = (torch.arange(7) < lengths.unsqueeze(-1)).long()
        responses = response_mask * (100 + torch.arange(4)).unsqueeze(-1)  # row r's tokens are 100 + r
        prompt_ids = torch.ones(4, 1, dtype=torch.long)
        mask = torch.cat([torch.ones(4, 1, dtype=torch.long), response_mask], dim=1)
        batch = DataProto.from_dict(
            tensors={
                "prompts": prompt_ids,
                "responses": responses,
                "input_ids": torch.cat([prompt_ids, responses], dim=1),
                "attention_mask": mask,
                "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
                "response_mask": response_mask,
            },
            non_tensors={"uid": np.repeat(prompts.non_tensor_batch["uid"], 2)},
        )
        batch.meta_info["metrics"] = {"timing_s/gen": 0.0}
        return batch

    def update_actor(self, data: DataProto):
        from verl.workers.update_outcome.outcome import UpdateOutcome
        from verl.workers.update_outcome.result import UpdateResult

        self.sent = data
        outcome = UpdateOutcome(True, 1.0, num_zeros_in_grad=None, loss_scale=None, min_loss_scale=None, step=1)
        return [UpdateResult("actor", (outcome,), 1, 0, {})]

    def pop_call_timings(self):
        return {}


def first_token_scores(batch, return_dict=False):
    """Score 1 for the responses of rows 0 and 3 (one of each prompt's pair), 0 for rows 1 and 2."""
    scores = torch.zeros(len(batch), batch.batch["responses"].shape[1])
    scores[[0, 3], 0] = 1.0
    return {"reward_tensor": scores, "reward_extra_info": {}}


def two_rank_step(balance: bool):
    from verl.trainer.data_setup import TrainingData
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, TrainerRun
    from verl.trainer.ray_setup import WorkerGroups
    from verl.workers.config import compose_ppo_config

    config = compose_ppo_config(
        [
            f"trainer.balance_batch={balance}",
            "trainer.n_gpus_per_node=2",
            "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.rollout.n=2",
            "data.train_batch_size=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        ]
    )
    actor = FakeActorGroup()
    data = TrainingData(train_loader=None, val_batches=[], reward_fn=first_token_scores, num_train_prompts=0)
    trainer = RayPPOTrainer(config, WorkerGroups(actor), data, tracker=None, run=TrainerRun(total_training_steps=1))
    prompts = DataProto.from_dict(
        tensors={"input_ids": torch.ones(2, 1, dtype=torch.long)},
        non_tensors={"raw_prompt": np.array(["p", "q"], dtype=object)},
    )
    return trainer.train_step(prompts), actor.sent


def test_the_step_sends_each_rank_the_same_tokens():
    metrics, sent = two_rank_step(balance=True)
    # real tokens 8, 6, 4, 2: rows 0 and 3 (8 + 2) go to rank 0, rows 1 and 2 (6 + 4) to rank 1
    assert sent.batch["responses"][:, 0].tolist() == [100, 103, 101, 102]
    chunks = rank_chunks(sent, 2)
    assert [len(chunk) for chunk in chunks] == [2, 2]
    assert [int(chunk.batch["attention_mask"].sum()) for chunk in chunks] == [10, 10]
    # before: rank 0 would have had 8 + 6 = 14, rank 1 4 + 2 = 6; mean 20 / 2 = 10
    assert {key: value for key, value in metrics.items() if key.startswith("global_seqlen/")} == {
        "global_seqlen/min": 6.0,
        "global_seqlen/max": 14.0,
        "global_seqlen/minmax_diff": 8.0,
        "global_seqlen/balanced_min": 10.0,
        "global_seqlen/balanced_max": 10.0,
        "global_seqlen/mean": 10.0,
    }
    # GRPO after the reordering, by uid: each prompt's pair scored (1, 0) -> +1/sqrt(2) for rows 0 and 3, -1/sqrt(2)
    # for rows 1 and 2 (mean 0.5, unbiased std sqrt(0.5)); on every response token, 0 on padding
    per_row = sent.batch["advantages"].sum(-1) / sent.batch["response_mask"].sum(-1)
    torch.testing.assert_close(per_row, torch.tensor([1.0, 1.0, -1.0, -1.0]) / 2**0.5, atol=1e-5, rtol=0)


def test_the_step_without_balancing_keeps_the_order():
    metrics, sent = two_rank_step(balance=False)
    assert sent.batch["responses"][:, 0].tolist() == [100, 101, 102, 103]
    assert not any(key.startswith("global_seqlen/") for key in metrics)
    per_row = sent.batch["advantages"].sum(-1) / sent.batch["response_mask"].sum(-1)
    torch.testing.assert_close(per_row, torch.tensor([1.0, -1.0, -1.0, 1.0]) / 2**0.5, atol=1e-5, rtol=0)
