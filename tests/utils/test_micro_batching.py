"""Micro-batches by sample count or by token budget (``use_dynamic_bsz``): bounds derived by hand."""

import pytest
import torch

from verl.protocol import DataProto
from verl.utils.micro_batching import sort_by_length, split_micro_batches, split_to_count, token_budget_bounds
from verl.workers.config.roles import MicroBatching


def test_token_budget_packs_consecutive_samples():
    # budget 9: 5+4 = 9 fits; 3 then +7 = 10 does not, so 3 goes alone; 7+1 = 8 fits
    assert token_budget_bounds([5, 4, 3, 7, 1], 9) == [(0, 2), (2, 3), (3, 5)]
    # a sample above the budget on its own is a micro-batch of one, never dropped
    assert token_budget_bounds([12, 2, 2], 9) == [(0, 1), (1, 3)]
    assert token_budget_bounds([], 9) == []


def batch_of_lengths(lengths):
    mask = torch.zeros(len(lengths), 6, dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, 6 - length :] = 1
    return DataProto.from_dict(tensors={"attention_mask": mask, "row": torch.arange(len(lengths))})


def test_split_keeps_order_and_every_row():
    batch = batch_of_lengths([5, 4, 3, 6, 1])
    by_tokens = split_micro_batches(batch, MicroBatching(size=2, use_dynamic_bsz=True, max_token_len=9))
    # 5+4 = 9 | 3+6 = 9 | 1: each micro-batch fills the budget exactly, and the rows stay in order
    assert [m.batch["row"].tolist() for m in by_tokens] == [[0, 1], [2, 3], [4]]
    by_count = split_micro_batches(batch, MicroBatching(size=2, use_dynamic_bsz=False, max_token_len=9))
    assert [len(m) for m in by_count] == [2, 2, 1]  # the budget is unused without use_dynamic_bsz


def test_split_to_count_halves_the_largest_micro_batch_and_keeps_the_order():
    batch = batch_of_lengths([1, 1, 1, 1, 1, 1, 1])
    micro_batches = [batch[0:4], batch[4:5], batch[5:7]]  # 4, 1 and 2 rows
    # to 5: the 4 is halved (2, 2, 1, 2), then the first of the largest, the first 2 (1, 1, 2, 1, 2)
    split = split_to_count(micro_batches, 5)
    assert [m.batch["row"].tolist() for m in split] == [[0], [1], [2, 3], [4], [5, 6]]
    assert split_to_count(micro_batches, 3) == micro_batches  # already there
    with pytest.raises(ValueError, match="7 rows cannot make 8 micro-batches"):
        split_to_count(micro_batches, 8)


def test_sort_by_length_is_stable_and_restorable():
    # real tokens per row: 3, 1, 3, 2 -> sorted rows 1, 3, 0, 2 (rows 0 and 2 tie and keep their order)
    mask = torch.tensor([[1, 1, 1], [0, 0, 1], [1, 1, 1], [0, 1, 1]])
    data = DataProto.from_dict({"attention_mask": mask, "row": torch.arange(4)}, {"uid": ["a", "b", "c", "d"]})
    by_length, restore = sort_by_length(data)
    assert by_length.batch["row"].tolist() == [1, 3, 0, 2] and list(by_length.non_tensor_batch["uid"]) == list("bdac")
    assert torch.equal(by_length.batch["row"][restore], torch.arange(4))
    assert data.batch["row"].tolist() == [0, 1, 2, 3]  # the input is left as it was


def test_log_probs_come_back_in_the_batch_order_from_length_sorted_micro_batches():
    from tests.workers.actor.conftest import actor_config, ppo_batch, tiny_qwen2
    from verl.workers.actor.dp_actor import build_dp_actor

    actor = build_dp_actor(actor_config(), tiny_qwen2(seed=0), total_training_steps=10)
    batch = ppo_batch(num_samples=6)
    # rows end after 6, 1, 4, 2, 5 and 3 response tokens: every micro-batch of 2 sorted rows trims differently
    for row, keep in enumerate([6, 1, 4, 2, 5, 3]):
        prompt_length = batch.batch["prompts"].shape[1]
        batch.batch["attention_mask"][row, prompt_length + keep :] = 0
    whole, _ = actor.compute_log_prob(batch)
    split, _ = actor.compute_log_prob(batch, MicroBatching(size=2, use_dynamic_bsz=False, max_token_len=0))
    mask = batch.batch["attention_mask"][:, -whole.shape[1] :].bool()
    torch.testing.assert_close(split[mask], whole[mask], atol=1e-5, rtol=0)
