"""``trainer.balance_batch``: reorder a step's batch so that every data-parallel rank gets about the same work.

A worker call splits the batch into as many contiguous chunks of equal size as the actor has data-parallel ranks,
one per rank (:mod:`verl.single_controller.decorator`). Before the step's value pass and updates, the driver
reorders the rows so that those chunks hold nearly equal numbers of tokens (the attention mask's sum per
sequence): a balanced partition of the sequences into one part per rank, each part with the same number of
sequences (:func:`~verl.utils.seqlen_balancing.get_seqlen_balanced_partitions`, weighing each sequence by
:func:`~verl.utils.seqlen_balancing.calculate_workload`, as verl does), and the parts laid end to end.

As in verl, the members of a GRPO group may land on different ranks: everything computed per group after this
point (the advantages) finds a group by its ``uid``, not by position, so the order does not change it. Within a
part the rows keep the batch's order (verl also sorts each part by length for Megatron's pipeline bubbles), so
with one data-parallel rank the order, and every number of the run, stays as it was. What changes with more than
one rank is which rows share a mini-batch on a rank, as in verl.

The step logs ``global_seqlen/{min,max,minmax_diff}`` (tokens per rank before), ``global_seqlen/{balanced_min,
balanced_max}`` (after) and ``global_seqlen/mean``.
"""

from __future__ import annotations

import logging

import torch

from verl.protocol import DataProto
from verl.utils.seqlen_balancing import calculate_workload, get_seqlen_balanced_partitions, log_seqlen_unbalance
from verl.workers.config import PPOConfig

logger = logging.getLogger("verl.trainer")


def actor_data_parallel_size(config: PPOConfig) -> int:
    """How many data-parallel ranks split the actor's batches: the trainer's ranks, over the ranks one copy of the
    model spans (megatron's tensor-parallel ranks x pipeline stages; 1 on dp and fsdp2)."""
    actor = config.actor_rollout_ref.actor
    model_parallel = actor.megatron.model_parallel_size if actor.strategy == "megatron" else 1
    return max(config.world_size // model_parallel, 1)


def balanced_order(seqlens: list[int], dp_size: int) -> list[list[int]]:
    """One list of row indices per rank, each sorted and of equal length, with nearly equal work."""
    workloads = calculate_workload(torch.tensor(seqlens, dtype=torch.int64)).tolist()
    return get_seqlen_balanced_partitions(workloads, k_partitions=dp_size, equal_size=True)


def balance_batch(batch: DataProto, dp_size: int, prefix: str = "global_seqlen") -> dict[str, float]:
    """Reorder ``batch`` in place so that its ``dp_size`` contiguous chunks hold nearly equal numbers of tokens.

    Args:
        batch: the step's batch, with ``attention_mask`` (B, S).
        dp_size: the data-parallel ranks the batch is dispatched to.
        prefix: the metrics' prefix.

    Returns:
        verl's balance metrics (see the module's docstring); empty, with the batch unchanged, when its rows do not
        split into ``dp_size`` equal chunks (the dispatch pads such a batch; there is nothing equal to balance).
    """
    size = len(batch)
    if size == 0 or size % dp_size:
        logger.warning(
            "trainer.balance_batch: %d rows do not split into %d equal data-parallel chunks; not balanced.",
            size,
            dp_size,
        )
        return {}
    seqlens = batch.batch["attention_mask"].reshape(size, -1).sum(-1).tolist()
    partitions = balanced_order(seqlens, dp_size)
    order = [row for part in partitions for row in part]
    if order != list(range(size)):
        batch.reorder(torch.tensor(order))
    return {key: float(value) for key, value in log_seqlen_unbalance(seqlens, partitions, prefix).items()}
