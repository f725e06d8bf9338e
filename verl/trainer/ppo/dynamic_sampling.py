"""DAPO's dynamic sampling (``algorithm.filter_groups``): keep only the groups that carry a learning signal.

Under a group-relative estimator (GRPO and its kin) a group whose responses all score the same gets zero advantage
on every token: it costs a forward and a backward pass and teaches nothing. With the filter on, the trainer drops
such groups (the value compared is ``filter_groups.metric``: the summed score ``seq_reward``, the summed reward
``seq_final_reward``, or any per-sample entry of the reward function's result dict) and generates from further
prompt batches until ``data.train_batch_size`` groups are left, for at most ``max_num_gen_batches`` rounds; the
surplus of the last round is cut off. A group of a single response is kept, as in verl.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from verl.protocol import DataProto


def metric_values(batch: DataProto, metric: str) -> np.ndarray:
    """(B,) the per-sample value ``metric`` names, from a scored batch.

    Raises:
        ValueError: the batch has no such value; the message lists the ones it has.
    """
    tensors = batch.batch
    if metric == "seq_reward":
        return tensors["token_level_scores"].sum(-1).float().cpu().numpy()
    if metric == "seq_final_reward":
        key = "token_level_rewards" if "token_level_rewards" in tensors.keys() else "token_level_scores"
        return tensors[key].sum(-1).float().cpu().numpy()
    if metric not in batch.non_tensor_batch:
        available = ["seq_reward", "seq_final_reward", *sorted(batch.non_tensor_batch)]
        raise ValueError(
            f"algorithm.filter_groups.metric={metric!r} is not a value of this batch; it has {available}. Name one "
            "of them, or return the value from the reward function's result dict (reward_manager dapo reports acc)."
        )
    return np.asarray(batch.non_tensor_batch[metric], dtype=np.float64)


def informative_rows(uids: np.ndarray, values: np.ndarray) -> tuple[list[int], list[str], int]:
    """The rows of the groups whose values are not all equal (or that have a single response).

    Args:
        uids: (B,) group ids (the prompt's ``uid``).
        values: (B,) the metric per sample.

    Returns:
        (the kept rows in batch order, the kept groups' uids in order of first appearance, the number of groups).
    """
    by_uid: dict[Any, list[int]] = {}
    for row, uid in enumerate(uids):
        by_uid.setdefault(uid, []).append(row)
    # "not all equal" exactly: the spread, not the standard deviation, whose mean rounds (std of [0.1] x 3 is 1e-17)
    kept_uids = [uid for uid, rows in by_uid.items() if len(rows) == 1 or np.ptp(values[rows]) > 0]
    kept = set(kept_uids)
    return [row for row, uid in enumerate(uids) if uid in kept], kept_uids, len(by_uid)


def keep_informative_groups(
    batch: DataProto, filter_groups: Any, num_groups_wanted: int, generate_more: Callable[[], DataProto]
) -> tuple[DataProto, dict[str, float]]:
    """Drop the uniform groups of ``batch``, generating more (``generate_more()``, a scored batch) until
    ``num_groups_wanted`` informative groups are collected; returns exactly those groups' rows, and the metrics.

    Metrics: ``train/num_gen_batches`` (verl's: generation rounds this step), ``train/num_groups_dropped`` (uniform
    groups left out over the rounds) and ``train/dropped_group_ratio`` (their share of the groups generated).

    Raises:
        ValueError: still short of ``num_groups_wanted`` after ``filter_groups.max_num_gen_batches`` rounds, or a
            metric the batch does not have.
    """
    parts, kept_uids, num_generated, num_rounds = [], [], 0, 1
    while True:
        values = metric_values(batch, filter_groups.metric)
        rows, uids, num_groups = informative_rows(batch.non_tensor_batch["uid"], values)
        num_generated += num_groups
        if rows:
            parts.append(batch.select_idxs(np.asarray(rows)))
            kept_uids.extend(uids)
        if len(kept_uids) >= num_groups_wanted:
            break
        if num_rounds >= filter_groups.max_num_gen_batches:
            raise ValueError(
                f"algorithm.filter_groups: {num_rounds} generation rounds gave {len(kept_uids)} groups whose "
                f"{filter_groups.metric!r} differs within the group, fewer than data.train_batch_size="
                f"{num_groups_wanted}; the rest were uniform (every response scored the same). Raise "
                "algorithm.filter_groups.max_num_gen_batches, increase actor_rollout_ref.rollout.n or the sampling "
                "temperature, or check that the reward can tell the responses apart."
            )
        batch = generate_more()
        num_rounds += 1
    merged = parts[0] if len(parts) == 1 else DataProto.concat(parts)
    wanted = set(kept_uids[:num_groups_wanted])
    selected = [row for row, uid in enumerate(merged.non_tensor_batch["uid"]) if uid in wanted]
    num_dropped = num_generated - len(kept_uids)
    metrics = {
        "train/num_gen_batches": float(num_rounds),
        "train/num_groups_dropped": float(num_dropped),
        "train/dropped_group_ratio": num_dropped / max(num_generated, 1),
    }
    return merged.select_idxs(np.asarray(selected)), metrics
