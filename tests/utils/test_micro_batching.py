"""Micro-batches by sample count or by token budget (``use_dynamic_bsz``): bounds derived by hand."""

import torch

from verl.protocol import DataProto
from verl.utils.micro_batching import split_micro_batches, token_budget_bounds
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
