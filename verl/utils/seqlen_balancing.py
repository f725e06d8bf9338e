"""Splitting a batch's sequences into partitions of nearly equal total length: verl's ``seqlen_balancing`` names.

The trainer gives each data-parallel rank one contiguous chunk of the batch. When the sequences' lengths vary, the
rank with the longest ones sets the pace of every step; reordering the batch first so that each chunk holds about
the same number of tokens (``trainer.balance_batch``, see :mod:`verl.trainer.ppo.balance`) evens that out.

The partitioning is the largest differencing method of Karmarkar and Karp, generalised to ``k`` partitions: each
item starts as a partial solution of ``k`` subsets; the two partial solutions with the largest spread (largest
subset sum minus smallest) are combined by putting the largest subset of one with the smallest of the other, the
second largest with the second smallest, and so on, until one solution is left. With ``equal_size`` the items are
first taken ``k`` at a time in sorted order (one per subset), so every subset ends with the same number of items.

Example: lengths [7, 5, 3, 1] into 2 equal-size partitions. Sorted pairs (1, 3) and (5, 7) are partial solutions
{3 | 1} and {7 | 5}, each of spread 2; combining them gives {7, 1} and {5, 3}: 8 tokens each.

Here: :func:`calculate_workload`, :func:`karmarkar_karp`, :func:`greedy_partition`,
:func:`get_seqlen_balanced_partitions`, :func:`get_group_balanced_partitions`, :func:`log_seqlen_unbalance`,
:func:`ceildiv`, :func:`roundup_divisible`, :func:`get_reverse_idx`, and verl's dynamic micro-batches for code written
against verl (:func:`rearrange_micro_batches`, :func:`prepare_dynamic_batch`, :func:`restore_dynamic_batch`), with
verl's signatures. This project's own workers split a rank's rows by a token budget in
:mod:`verl.utils.micro_batching`. Only :mod:`verl.utils.tensordict_utils` is imported from verl.
"""

from __future__ import annotations

import copy
import heapq
import itertools
from collections.abc import Hashable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from verl.utils.tensordict_utils import index_select_tensor_dict

# The per-token and quadratic terms of a dense transformer block's cost for a hidden size of 4096 (12 h^2 L + 2 h L^2
# FLOPs, divided by 2 h): the constants verl weighs sequences by when it balances ranks.
_LINEAR_COST = 24576


def calculate_workload(seqlen_list: torch.Tensor) -> torch.Tensor:
    """A relative estimate of a forward pass's cost per sequence: ``24576 * L + L**2`` for ``L`` tokens.

    The linear term is the dense layers, the quadratic one the attention; the ratio is that of a 7B model (hidden
    size 4096). Only ratios matter: the values rank and balance sequences, they are not FLOP counts.
    """
    return _LINEAR_COST * seqlen_list + seqlen_list**2


class _PartialSolution:
    """``k`` subsets of items, kept in descending order of their sums (ties: more items first, then index order)."""

    def __init__(self, subsets: list[tuple[int, list[int]]]):
        self.subsets = sorted(subsets, key=lambda s: (-s[0], -len(s[1]), s[1]))

    @property
    def spread(self) -> int:
        return self.subsets[0][0] - self.subsets[-1][0]

    def combine(self, other: _PartialSolution) -> _PartialSolution:
        """Largest subset with the other's smallest, second largest with its second smallest, ..."""
        paired = zip(self.subsets, reversed(other.subsets), strict=True)
        return _PartialSolution([(a_sum + b_sum, a_items + b_items) for (a_sum, a_items), (b_sum, b_items) in paired])


def _initial_solutions(seqlen_list: Sequence[int], k: int, equal_size: bool) -> list[_PartialSolution]:
    ordered = sorted(range(len(seqlen_list)), key=lambda i: (seqlen_list[i], i))
    if equal_size:
        # k items of neighbouring size at a time, one per subset: every subset keeps the same number of items
        chunks = [ordered[start : start + k] for start in range(0, len(ordered), k)]
        return [_PartialSolution([(seqlen_list[i], [i]) for i in chunk]) for chunk in chunks]
    empty: list[tuple[int, list[int]]] = [(0, []) for _ in range(k - 1)]
    return [_PartialSolution([(seqlen_list[i], [i]), *empty]) for i in ordered]


def karmarkar_karp(seqlen_list: list[int], k_partitions: int, equal_size: bool) -> list[list[int]]:
    """``k_partitions`` lists of indices into ``seqlen_list`` whose sums are nearly equal (largest differencing).

    Args:
        seqlen_list: the values to balance (token counts, or :func:`calculate_workload` of them).
        k_partitions: how many partitions.
        equal_size: every partition gets ``len(seqlen_list) / k_partitions`` items.

    Returns:
        The partitions, largest sum first; the indices of one partition in the order they were joined.

    Raises:
        ValueError: ``equal_size`` and the items do not divide into ``k_partitions`` equal parts.
    """
    if k_partitions < 1:
        raise ValueError(f"k_partitions must be at least 1, got {k_partitions}.")
    if equal_size and len(seqlen_list) % k_partitions:
        raise ValueError(f"{len(seqlen_list)} items do not split into {k_partitions} partitions of equal size.")
    if not seqlen_list:
        return [[] for _ in range(k_partitions)]
    order = itertools.count()  # among equal keys, the solution pushed first comes out first: a fixed result
    heap = []
    for solution in _initial_solutions(seqlen_list, k_partitions, equal_size):
        heapq.heappush(heap, (-solution.spread, -solution.subsets[0][0], next(order), solution))
    while len(heap) > 1:
        first = heapq.heappop(heap)[-1]
        second = heapq.heappop(heap)[-1]
        combined = first.combine(second)
        heapq.heappush(heap, (-combined.spread, -combined.subsets[0][0], next(order), combined))
    return [items for _, items in heap[0][-1].subsets]


def greedy_partition(seqlen_list: list[int], k_partitions: int, equal_size: bool) -> list[list[int]]:
    """Each item, in the given order, to the partition with the smallest sum so far (the fewest items first, with
    ``equal_size``); simpler than :func:`karmarkar_karp` and usually less even.

    Raises:
        ValueError: ``equal_size`` and the items do not divide into ``k_partitions`` equal parts.
    """
    if equal_size and len(seqlen_list) % k_partitions:
        raise ValueError(f"{len(seqlen_list)} items do not split into {k_partitions} partitions of equal size.")
    partitions: list[list[int]] = [[] for _ in range(k_partitions)]
    sums = [0] * k_partitions
    for index, value in enumerate(seqlen_list):
        target = min(range(k_partitions), key=lambda p: (len(partitions[p]) if equal_size else 0, sums[p], p))
        partitions[target].append(index)
        sums[target] += value
    return partitions


def get_seqlen_balanced_partitions(seqlen_list: list[int], k_partitions: int, equal_size: bool) -> list[list[int]]:
    """Balanced partitions of ``range(len(seqlen_list))`` by :func:`karmarkar_karp`, each list of indices sorted.

    Args:
        seqlen_list: one value per item (a tensor or a list of numbers).
        k_partitions: how many partitions (data-parallel ranks).
        equal_size: every partition gets the same number of items.

    Raises:
        ValueError: fewer items than partitions; ``equal_size`` with a count that does not divide.
    """
    values = [v.item() if isinstance(v, torch.Tensor) else v for v in seqlen_list]
    if len(values) < k_partitions:
        raise ValueError(f"{len(values)} items cannot fill {k_partitions} partitions (each needs at least one).")
    partitions = karmarkar_karp(values, k_partitions, equal_size)
    assert sorted(i for part in partitions for i in part) == list(range(len(values))), "every item exactly once"
    assert all(partitions), "no partition is empty"
    return [sorted(part) for part in partitions]


def log_seqlen_unbalance(seqlen_list: list[int], partitions: list[list[int]], prefix: str) -> dict[str, Any]:
    """The spread of tokens per rank before and after balancing, under verl's names.

    Before: the batch as it was, cut into ``len(partitions)`` contiguous chunks of equal size (what the ranks would
    have received). After: the partitions' sums.

    Returns:
        ``{prefix}/min`` and ``/max`` (the smallest and largest chunk sum before), ``/minmax_diff`` (their
        difference), ``/balanced_min`` and ``/balanced_max`` (the smallest and largest partition sum) and ``/mean``
        (total / number of partitions).
    """
    lengths = [v.item() if isinstance(v, torch.Tensor) else v for v in seqlen_list]
    k = len(partitions)
    chunk = len(lengths) // k
    before = [sum(lengths[start : start + chunk]) for start in range(0, chunk * k, chunk)] if chunk else [0]
    after = [sum(lengths[i] for i in part) for part in partitions]
    return {
        f"{prefix}/min": min(before),
        f"{prefix}/max": max(before),
        f"{prefix}/minmax_diff": max(before) - min(before),
        f"{prefix}/balanced_min": min(after),
        f"{prefix}/balanced_max": max(after),
        f"{prefix}/mean": sum(lengths) / k,
    }


def ceildiv(a: int, b: int) -> int:
    """``a / b`` rounded up: ``ceildiv(7, 3) == 3``."""
    return -(a // -b)


def roundup_divisible(a: int, b: int) -> int:
    """The smallest multiple of ``b`` that is at least ``a``: ``roundup_divisible(7, 4) == 8``."""
    return ceildiv(a, b) * b


def get_reverse_idx(idx_map: Sequence[int]) -> list[int]:
    """The inverse permutation: ``result[idx_map[i]] == i``."""
    reverse = [0] * len(idx_map)
    for position, index in enumerate(idx_map):
        reverse[index] = position
    return reverse


def get_group_balanced_partitions(seqlen_list: list[int], uid_list: list, k_partitions: int) -> list[list[int]]:
    """Balanced partitions that keep every sample of one ``uid`` (a GRPO group) in the same partition.

    Each group weighs the sum of its samples' :func:`calculate_workload`; the groups are split by
    :func:`get_seqlen_balanced_partitions` with the same number of groups per partition.

    Returns:
        ``k_partitions`` sorted lists of sample indices.

    Raises:
        ValueError: the lists differ in length, or the groups do not divide into ``k_partitions`` equal counts.
    """
    if len(seqlen_list) != len(uid_list):
        raise ValueError(f"seqlen_list has {len(seqlen_list)} items, uid_list {len(uid_list)}: one uid per sample.")
    members: dict[Hashable, list[int]] = {}
    for index, uid in enumerate(uid_list):
        members.setdefault(uid, []).append(index)
    groups = list(members.values())
    if len(groups) < k_partitions or len(groups) % k_partitions:
        raise ValueError(f"{len(groups)} uid groups do not split into {k_partitions} partitions of equal group count.")
    lengths = torch.as_tensor([int(v) for v in seqlen_list], dtype=torch.int64)
    workloads = [int(calculate_workload(lengths[group]).sum()) for group in groups]
    parts = get_seqlen_balanced_partitions(workloads, k_partitions, equal_size=True)
    return [sorted(i for group_index in part for i in groups[group_index]) for part in parts]


def _effective_lengths(batch: Any) -> tuple[torch.Tensor, int]:
    """Real tokens per row and the longest row a micro-batch must hold (the padded width, or the longest nested row)."""
    input_ids = batch["input_ids"]
    if input_ids.is_nested:
        lengths = input_ids.offsets().diff()
        return lengths.long(), int(lengths.max())
    mask = batch["attention_mask"]
    return mask.sum(dim=1).long(), mask.shape[-1]


def _micro_batch_count(num_units: int, total_tokens: int, max_token_len: int, dp_group, options: dict) -> int:
    """How many micro-batches: the token budget's count, at least ``min_num_micro_batch``, the largest over the
    data-parallel group with ``same_micro_num_in_dp``, rounded up to ``num_batches_divided_by``."""
    count = min(num_units, ceildiv(total_tokens, max_token_len))
    if options["min_num_micro_batch"] is not None:
        count = max(count, options["min_num_micro_batch"])
    if options["same_micro_num_in_dp"] and dp_group is not None and dist.is_initialized():
        on_gpu = dist.get_backend(dp_group) == "nccl"
        shared = torch.tensor([count], device=f"cuda:{torch.cuda.current_device()}" if on_gpu else "cpu")
        dist.all_reduce(shared, op=dist.ReduceOp.MAX, group=dp_group)
        count = int(shared.item())
    if options["num_batches_divided_by"] is not None:
        count = roundup_divisible(count, options["num_batches_divided_by"])
    if count > num_units:
        raise ValueError(f"{count} micro-batches asked of {num_units} rows (or row groups): some would be empty.")
    return count


def rearrange_micro_batches(
    batch,
    max_token_len: int,
    dp_group=None,
    num_batches_divided_by: int | None = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: int | None = None,
    use_dynamic_bsz_balance: bool = True,
    force_group_size: int = 1,
) -> tuple[list[Any], list[list[int]]]:
    """A TensorDict's rows split into micro-batches of at most about ``max_token_len`` real tokens, balanced by
    :func:`calculate_workload` (verl's dynamic batch size).

    Args:
        batch: a TensorDict with ``input_ids`` and (unless nested) ``attention_mask``.
        max_token_len: the token budget of one micro-batch; at least the padded sequence length.
        dp_group: with ``same_micro_num_in_dp``, every rank of this group gets the largest count among them.
        num_batches_divided_by: the count is rounded up to a multiple of it (megatron's virtual pipeline stages).
        min_num_micro_batch: at least this many micro-batches.
        use_dynamic_bsz_balance: order the micro-batches by workload, the lightest at both ends.
        force_group_size: that many consecutive rows always share a micro-batch.

    Returns:
        The micro-batches and, for each, the row indices it holds (see :func:`get_reverse_idx`).

    Raises:
        ValueError: a budget below the sequence length, rows that do not divide into groups, or too many
            micro-batches asked for.
    """
    lengths, longest = _effective_lengths(batch)
    if max_token_len < longest:
        raise ValueError(f"max_token_len={max_token_len} is below the sequence length {longest}.")
    if len(lengths) % force_group_size:
        raise ValueError(f"{len(lengths)} rows do not divide into groups of force_group_size={force_group_size}.")
    options = {
        "min_num_micro_batch": min_num_micro_batch,
        "same_micro_num_in_dp": same_micro_num_in_dp,
        "num_batches_divided_by": num_batches_divided_by,
    }
    num_units = len(lengths) // force_group_size
    count = _micro_batch_count(num_units, int(lengths.sum()), max_token_len, dp_group, options)
    workloads = calculate_workload(lengths).reshape(num_units, force_group_size).sum(dim=1).tolist()
    unit_parts = get_seqlen_balanced_partitions(workloads, count, equal_size=False)
    if use_dynamic_bsz_balance:
        unit_parts.sort(key=lambda part: (sum(workloads[u] for u in part), part[0]), reverse=True)
        unit_parts = unit_parts[::2][::-1] + unit_parts[1::2]  # heaviest in the middle, lightest at both ends
    parts = [[u * force_group_size + i for u in part for i in range(force_group_size)] for part in unit_parts]
    return [index_select_tensor_dict(batch, part) for part in parts], parts


def prepare_dynamic_batch(
    data,
    max_token_len: int,
    dp_group=None,
    num_batches_divided_by: int | None = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: int | None = None,
    use_dynamic_bsz_balance: bool = True,
) -> tuple[list[Any], list[list[int]]]:
    """:func:`rearrange_micro_batches` of a DataProto: micro-batch DataProtos (their non-tensors with their rows,
    each a copy of the meta info) and the row indices of each."""
    _, parts = rearrange_micro_batches(
        data.batch,
        max_token_len=max_token_len,
        dp_group=dp_group,
        num_batches_divided_by=num_batches_divided_by,
        same_micro_num_in_dp=same_micro_num_in_dp,
        min_num_micro_batch=min_num_micro_batch,
        use_dynamic_bsz_balance=use_dynamic_bsz_balance,
    )
    micro_batches = []
    for part in parts:
        micro = data.select_idxs(part)
        micro.meta_info = copy.deepcopy(data.meta_info)
        micro_batches.append(micro)
    return micro_batches, parts


def restore_dynamic_batch(data: torch.Tensor, batch_idx_list: list[list[int]]) -> torch.Tensor:
    """The rows of the concatenated micro-batches (``data``, nested or not) put back in the original order."""
    order = [index for part in batch_idx_list for index in part]
    if len(order) != data.shape[0]:
        raise ValueError(f"the index lists name {len(order)} rows, the data has {data.shape[0]}.")
    reverse = get_reverse_idx(order)
    if data.is_nested:
        rows = data.unbind()
        return torch.nested.as_nested_tensor([rows[i] for i in reverse], layout=torch.jagged)
    return data[torch.tensor(reverse, dtype=torch.long)]
