"""Balanced partitions of sequence lengths (verl's ``seqlen_balancing`` names), with partitions derived by hand."""

import random

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.utils.seqlen_balancing import (
    calculate_workload,
    ceildiv,
    get_group_balanced_partitions,
    get_reverse_idx,
    get_seqlen_balanced_partitions,
    greedy_partition,
    karmarkar_karp,
    log_seqlen_unbalance,
    prepare_dynamic_batch,
    rearrange_micro_batches,
    restore_dynamic_batch,
    roundup_divisible,
)


def test_four_lengths_into_two_equal_partitions():
    # sorted pairs (1, 3) and (5, 7) are the partial solutions {3 | 1} and {7 | 5}; combining the largest subset of
    # one with the smallest of the other gives {7, 1} and {5, 3}: 8 tokens each, two sequences each
    assert get_seqlen_balanced_partitions([7, 5, 3, 1], k_partitions=2, equal_size=True) == [[0, 3], [1, 2]]


def test_six_lengths_into_three_equal_partitions():
    # lengths 9..4 at indices 0..5: (4, 5, 6) and (7, 8, 9) combine reversed: 9+4, 8+5, 7+6 = 13 each
    partitions = get_seqlen_balanced_partitions([9, 8, 7, 6, 5, 4], k_partitions=3, equal_size=True)
    assert partitions == [[0, 5], [1, 4], [2, 3]]


def test_partitions_of_free_size_balance_the_sums_only():
    # one long sequence and four short ones: the best split is {10} against {1, 1, 1, 1} (10 vs 4), which the
    # differencing reaches by adding each 1 to the smaller side
    assert karmarkar_karp([10, 1, 1, 1, 1], k_partitions=2, equal_size=False) == [[0], [1, 2, 3, 4]]
    assert get_seqlen_balanced_partitions([10, 1, 1, 1, 1], 2, equal_size=False) == [[0], [1, 2, 3, 4]]


def test_tensor_lengths_are_accepted():
    assert get_seqlen_balanced_partitions(torch.tensor([7, 5, 3, 1]), 2, equal_size=True) == [[0, 3], [1, 2]]


@pytest.mark.parametrize("seed", range(20))
def test_random_batches_split_evenly_and_beat_the_contiguous_split(seed):
    rng = random.Random(seed)
    k = rng.choice([2, 4])
    lengths = [rng.randint(1, 200) for _ in range(k * rng.randint(2, 8))]
    partitions = get_seqlen_balanced_partitions(lengths, k, equal_size=True)
    assert sorted(i for part in partitions for i in part) == list(range(len(lengths)))
    assert {len(part) for part in partitions} == {len(lengths) // k}
    sums = [sum(lengths[i] for i in part) for part in partitions]
    chunk = len(lengths) // k
    contiguous = [sum(lengths[s : s + chunk]) for s in range(0, len(lengths), chunk)]
    assert max(sums) - min(sums) <= max(contiguous) - min(contiguous)
    assert max(sums) - min(sums) <= max(lengths)  # no worse than one sequence apart on these batches


def test_refuses_what_cannot_be_partitioned():
    with pytest.raises(ValueError, match="cannot fill 3 partitions"):
        get_seqlen_balanced_partitions([1, 2], 3, equal_size=False)
    with pytest.raises(ValueError, match="5 items do not split into 2 partitions"):
        get_seqlen_balanced_partitions([1, 2, 3, 4, 5], 2, equal_size=True)


def test_unbalance_metrics_before_and_after():
    # before: contiguous halves [7, 5] = 12 and [3, 1] = 4; after: {7, 1} and {5, 3} = 8 each; mean 16 / 2 = 8
    metrics = log_seqlen_unbalance([7, 5, 3, 1], [[0, 3], [1, 2]], prefix="global_seqlen")
    assert metrics == {
        "global_seqlen/min": 4,
        "global_seqlen/max": 12,
        "global_seqlen/minmax_diff": 8,
        "global_seqlen/balanced_min": 8,
        "global_seqlen/balanced_max": 8,
        "global_seqlen/mean": 8.0,
    }


def test_workload_weighs_tokens_and_attention():
    # 24576 * L + L^2: L = 2 -> 49152 + 4; L = 100 -> 2457600 + 10000
    assert calculate_workload(torch.tensor([2, 100])).tolist() == [49156, 2467600]


def test_greedy_partition_fills_the_emptiest_partition():
    # 5 -> p0, 4 -> p1, 3 -> p1 (sum 4 < 5), 2 -> p0 (one item against two): {5, 2} and {4, 3}, 7 each
    assert greedy_partition([5, 4, 3, 2], 2, equal_size=True) == [[0, 3], [1, 2]]
    # without equal sizes the 2 also goes to the smaller sum: p0 = 5 against p1 = 7
    assert greedy_partition([5, 4, 3, 2], 2, equal_size=False) == [[0, 3], [1, 2]]
    assert greedy_partition([9, 1, 1], 2, equal_size=False) == [[0], [1, 2]]


def test_small_helpers():
    assert (ceildiv(7, 3), ceildiv(6, 3)) == (3, 2)
    assert (roundup_divisible(7, 4), roundup_divisible(8, 4)) == (8, 8)
    assert get_reverse_idx([2, 0, 1]) == [1, 2, 0]


def test_group_balanced_partitions_keep_each_uid_together():
    # uids a..d at rows (0, 4), (1, 5), (2, 6), (3, 7), lengths 1..4 each: group workloads 2 w(1) .. 2 w(4), with
    # w(L) = 24576 L + L^2. Sorted pairs (a, b) and (c, d) -> {b | a} and {d | c}; combined {d, a} and {c, b}:
    # 2 (w(4) + w(1)) = 245794 and 2 (w(3) + w(2)) = 245786, the larger first
    uids = ["a", "b", "c", "d"] * 2
    assert get_group_balanced_partitions([1, 2, 3, 4] * 2, uids, k_partitions=2) == [[0, 3, 4, 7], [1, 2, 5, 6]]
    with pytest.raises(ValueError, match="3 uid groups do not split into 2 partitions"):
        get_group_balanced_partitions([1, 2, 3], ["a", "b", "c"], k_partitions=2)


def rows_of_lengths(lengths, width=4):
    mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])
    ids = mask * (10 + torch.arange(len(lengths))).unsqueeze(-1)  # row r holds token 10 + r
    return DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask})


def test_rearrange_micro_batches_by_a_token_budget():
    # 4 + 1 + 3 + 2 = 10 tokens, budget 5 -> min(4 rows, ceil(10 / 5)) = 2 micro-batches; the differencing pairs the
    # longest with the shortest: rows {0, 1} (5 tokens) and {2, 3} (5 tokens)
    data = rows_of_lengths([4, 1, 3, 2])
    micro_batches, parts = rearrange_micro_batches(data.batch, max_token_len=5)
    assert parts == [[0, 1], [2, 3]]
    assert [int(mb["attention_mask"].sum()) for mb in micro_batches] == [5, 5]
    restored = restore_dynamic_batch(torch.cat([mb["input_ids"] for mb in micro_batches]), parts)
    assert torch.equal(restored, data.batch["input_ids"])
    # pairs of consecutive rows stay together: units (0, 1) and (2, 3), one micro-batch each
    assert rearrange_micro_batches(data.batch, max_token_len=5, force_group_size=2)[1] == [[0, 1], [2, 3]]


def test_rearrange_micro_batches_counts_and_refusals():
    data = rows_of_lengths([4, 1, 3, 2])
    # at least 3: w(1..4) = 24577, 49156, 73737, 98320 -> rows {0} (98320), {2} (73737), {1, 3} (24577 + 49156 =
    # 73733). By weight, heaviest first: [0], [2], [1, 3]; every other one reversed, then the rest:
    # [[1, 3], [0]] + [[2]] -- the heaviest inside, the lighter ones at both ends
    _, parts = rearrange_micro_batches(data.batch, max_token_len=5, min_num_micro_batch=3)
    assert parts == [[1, 3], [0], [2]]
    _, parts = rearrange_micro_batches(data.batch, 5, min_num_micro_batch=3, use_dynamic_bsz_balance=False)
    assert parts == [[0], [2], [1, 3]]  # the partitioning's own order: largest sum first
    _, parts = rearrange_micro_batches(data.batch, max_token_len=8, num_batches_divided_by=4)  # 2 rounded up to 4
    assert len(parts) == 4
    with pytest.raises(ValueError, match="below the sequence length 4"):
        rearrange_micro_batches(data.batch, max_token_len=3)
    with pytest.raises(ValueError, match="5 micro-batches asked of 4 rows"):
        rearrange_micro_batches(data.batch, max_token_len=5, min_num_micro_batch=5)


def test_prepare_dynamic_batch_keeps_non_tensors_with_their_rows():
    data = rows_of_lengths([4, 1, 3, 2])
    data.non_tensor_batch["uid"] = np.array(["w", "x", "y", "z"], dtype=object)
    data.meta_info["temperature"] = 0.7
    micro_batches, parts = prepare_dynamic_batch(data, max_token_len=5)
    assert parts == [[0, 1], [2, 3]]
    assert [list(mb.non_tensor_batch["uid"]) for mb in micro_batches] == [["w", "x"], ["y", "z"]]
    assert micro_batches[0].meta_info == {"temperature": 0.7}
    assert micro_batches[0].meta_info is not data.meta_info


def _count_on_rank(rank: int, init_file: str, counts) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        # rank 0: 4 + 1 + 3 + 2 = 10 tokens -> 2 micro-batches of budget 5; rank 1: 4 x 4 = 16 tokens -> 4
        lengths = [4, 1, 3, 2] if rank == 0 else [4, 4, 4, 4]
        micro_batches, _ = rearrange_micro_batches(rows_of_lengths(lengths).batch, 5, dp_group=dist.group.WORLD)
        counts[rank] = len(micro_batches)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two gloo processes: about 20 s here
def test_the_data_parallel_group_agrees_on_the_largest_count(tmp_path):
    import torch.multiprocessing as mp

    counts = mp.Manager().dict()
    mp.spawn(_count_on_rank, args=(str(tmp_path / "init"), counts), nprocs=2, join=True)
    assert dict(counts) == {0: 4, 1: 4}  # both ranks take rank 1's 4
