"""Splitting a batch into micro-batches: by sample count, or by a budget of real tokens (``use_dynamic_bsz``).

With responses of very different lengths, a fixed number of samples per micro-batch either wastes memory on short
samples or runs out of it on long ones. A token budget packs as many consecutive samples as fit
``max_token_len`` real (attention-mask) tokens into each micro-batch, so the work per micro-batch follows the real
tokens. Samples keep their order, so per-sample outputs concatenate back in the batch's order; a sample longer than
the budget on its own is a micro-batch of one (the config refuses budgets below the longest possible sample).
The functions take any batch of rows that behaves like a :class:`verl.protocol.DataProto` (:class:`RowBatch`) and
return the same type, so this module sits below ``verl.protocol`` and imports nothing from verl above it;
:class:`MicroBatching`, the three settings a split needs, lives here for the same reason (the config sections
build it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class MicroBatching:
    """How a batch splits into micro-batches: ``size`` samples each, or (``use_dynamic_bsz``) as many samples as
    fit ``max_token_len`` real tokens (see :func:`split_micro_batches`). Not a section of the YAML: each config
    section that has these three settings hands them over as one."""

    size: int | None  # None only with use_dynamic_bsz (PPOConfig refuses it otherwise)
    use_dynamic_bsz: bool
    max_token_len: int


class RowBatch(Protocol):
    """What these functions use of a batch (a :class:`verl.protocol.DataProto`): the tensors, the number of rows,
    and new batches of some of the rows."""

    batch: Any  # a TensorDict holding ``attention_mask`` (B, S)

    def __len__(self) -> int: ...

    def __getitem__(self, rows: slice) -> Any: ...

    def split(self, split_size: int) -> Sequence[Any]: ...

    def select_idxs(self, idxs: torch.Tensor) -> Any: ...


Rows = TypeVar("Rows", bound=RowBatch)


def token_budget_bounds(num_tokens: list[int], max_token_len: int) -> list[tuple[int, int]]:
    """``(start, end)`` row ranges of consecutive samples whose token counts add up to at most ``max_token_len``.

    Example: counts [5, 4, 3, 7, 1] with a budget of 9 -> [(0, 2), (2, 3), (3, 5)]: 5+4, 3 (3+7 is 10), 7+1.
    """
    bounds, start, used = [], 0, 0
    for row, count in enumerate(num_tokens):
        if row > start and used + count > max_token_len:
            bounds.append((start, row))
            start, used = row, 0
        used += count
    if num_tokens:
        bounds.append((start, len(num_tokens)))
    return bounds


def split_micro_batches(data: Rows, batching: MicroBatching) -> list[Rows]:
    """Micro-batches of ``data`` (in order): ``batching.size`` samples each, or by token budget.

    Args:
        data: rows with ``attention_mask`` (B, S) when ``batching.use_dynamic_bsz``.
        batching: the size, whether to use a token budget, and the budget.
    """
    if not batching.use_dynamic_bsz:
        return data.split(batching.size)
    num_tokens = data.batch["attention_mask"].sum(dim=-1).tolist()
    return [data[start:end] for start, end in token_budget_bounds(num_tokens, batching.max_token_len)]


def sort_by_length(data: Rows) -> tuple[Rows, torch.Tensor]:
    """The rows of ``data`` from the fewest real (attention-mask) tokens to the most, and the way back.

    Micro-batches cut from sorted rows hold samples of similar length, so a forward pass that drops the columns that
    are padding in every row of its micro-batch (``verl.utils.padding_free.trim_padding_columns``) drops most of
    the padding: with responses of 1 to 64 tokens, four micro-batches of 16 sorted rows carry about a third fewer
    columns than one of 64. Which rows share a micro-batch changes no gradient: the update weights each
    micro-batch by its share of the tokens or sequences (``UpdateLoop._micro_batch_weight``).

    Returns:
        ``(sorted_data, restore)``: a new batch of the same type (the sort is stable) and the index with
        ``per_row_output_of_sorted[restore]`` in ``data``'s row order.
    """
    lengths = data.batch["attention_mask"].sum(dim=-1)
    order = torch.sort(lengths, stable=True).indices
    return data.select_idxs(order), torch.argsort(order)


def split_to_count(micro_batches: list[Rows], count: int) -> list[Rows]:
    """``micro_batches`` cut further, until there are ``count`` of them: the one with the most rows is halved each
    time (its first half, then its second, in place), so the rows keep their order and every micro-batch stays within
    the token budget it was cut to.

    Example: micro-batches of 4, 1 and 2 rows to a count of 5 -> 2, 2, 1, 1, 1 (the 4 halved, then the 2).

    Raises:
        ValueError: fewer rows than ``count`` (a micro-batch cannot be empty).
    """
    micro_batches = list(micro_batches)
    num_rows = sum(len(micro) for micro in micro_batches)
    if count > num_rows:
        raise ValueError(f"{num_rows} rows cannot make {count} micro-batches: every micro-batch needs a row.")
    while len(micro_batches) < count:
        largest = max(range(len(micro_batches)), key=lambda index: len(micro_batches[index]))
        micro = micro_batches[largest]
        half = (len(micro) + 1) // 2
        micro_batches[largest : largest + 1] = [micro[:half], micro[half:]]
    return micro_batches


def split_by_length(
    data: Rows, batching: MicroBatching, lockstep: LockstepGroup | None = None
) -> tuple[list[Rows], torch.Tensor]:
    """Micro-batches of ``data`` cut from its length-sorted rows (:func:`sort_by_length`, then
    :func:`split_micro_batches`), and the index that puts the concatenated per-row outputs back in ``data``'s order.

    What every pass over micro-batches uses: the update, the log-prob passes and the critic's value pass.

    Args:
        lockstep: the ranks that must run as many forward passes as this one (a model sharded over them, FSDP2, whose
            every forward and backward is a collective), or None. A token budget cuts each rank's rows into its own
            number of micro-batches (long rows, more of them); with ``lockstep`` the ranks agree on the largest count
            (one small all-reduce) and the others cut theirs further (:func:`split_to_count`). Each rank must hold at
            least that many rows, which the dispatch's equal shares give. A count by samples is equal on every rank
            already, and no collective is made.
    """
    by_length, restore = sort_by_length(data)
    micro_batches = split_micro_batches(by_length, batching)
    if lockstep is not None and batching.use_dynamic_bsz:
        micro_batches = split_to_count(micro_batches, lockstep.largest(len(micro_batches)))
    return micro_batches, restore


@dataclass(frozen=True)
class LockstepGroup:
    """Ranks that must take the same number of forward passes: a process group and the device its collectives
    take tensors on (``"cpu"`` for gloo, ``"cuda"`` for NCCL)."""

    group: Any
    device: str

    def largest(self, count: int) -> int:
        """The largest ``count`` over the group's ranks (a collective: every rank calls it)."""
        reduced = torch.tensor([count], dtype=torch.long, device=self.device)
        dist.all_reduce(reduced, op=dist.ReduceOp.MAX, group=self.group)
        return int(reduced.item())
