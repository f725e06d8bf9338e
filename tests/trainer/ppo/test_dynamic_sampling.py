"""DAPO's dynamic sampling: which groups are uniform, how rounds refill the batch, and the bound on the rounds."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.ppo.dynamic_sampling import informative_rows, keep_informative_groups, metric_values


def scored(uids, scores, acc=None):
    """A scored batch: one response token per sample holding its score; ``acc`` as a reward extra."""
    non_tensors = {"uid": np.array(uids, dtype=object)}
    if acc is not None:
        non_tensors["acc"] = np.array(acc, dtype=np.float64)
    return DataProto.from_dict(
        tensors={"token_level_scores": torch.tensor(scores, dtype=torch.float32)[:, None]}, non_tensors=non_tensors
    )


def test_uniform_groups_are_found_and_single_responses_kept():
    # group a: 1, 1 (uniform); b: 0, 1 (kept); c: a single response (kept, as in verl); d: 0, 0 (uniform)
    uids = np.array(["a", "a", "b", "b", "c", "d", "d"])
    rows, kept, num_groups = informative_rows(uids, np.array([1.0, 1.0, 0.0, 1.0, 0.5, 0.0, 0.0]))
    assert rows == [2, 3, 4] and kept == ["b", "c"] and num_groups == 4


def test_a_group_of_equal_fractions_is_uniform():
    # partial credit 0.1 on all three: np.std gives 1.4e-17 (the mean rounds), yet the group teaches nothing
    rows, kept, _ = informative_rows(np.array(["a", "a", "a"]), np.array([0.1, 0.1, 0.1]))
    assert rows == [] and kept == []


def test_metric_values_read_scores_or_the_reward_extras():
    batch = scored(["a", "a"], [0.25, 0.75], acc=[0.0, 1.0])
    assert metric_values(batch, "seq_reward").tolist() == [0.25, 0.75]
    assert metric_values(batch, "seq_final_reward").tolist() == [0.25, 0.75]  # no rewards yet: the scores
    assert metric_values(batch, "acc").tolist() == [0.0, 1.0]
    with pytest.raises(ValueError, match=r"metric='accuracy' is not a value of this batch; it has \[.*'acc'"):
        metric_values(batch, "accuracy")


def rounds(*batches):
    """generate_more() returning the given batches in turn, counting the calls."""
    queue = list(batches)

    def generate_more():
        generate_more.calls += 1
        return queue.pop(0)

    generate_more.calls = 0
    return generate_more


def test_rounds_refill_the_batch_and_the_surplus_is_cut():
    config = SimpleNamespace(metric="seq_reward", max_num_gen_batches=3)
    # round 1: a uniform, b informative; round 2: c uniform, d and e informative -> 3 informative, 2 wanted
    first = scored(["a", "a", "b", "b"], [1.0, 1.0, 0.0, 1.0])
    second = scored(["c", "c", "d", "d", "e", "e"], [0.0, 0.0, 0.2, 0.4, 0.1, 0.3])
    more = rounds(second)
    batch, metrics = keep_informative_groups(first, config, 2, more)
    assert more.calls == 1
    assert batch.non_tensor_batch["uid"].tolist() == ["b", "b", "d", "d"]  # e, the surplus, cut off
    assert batch.batch["token_level_scores"][:, 0].tolist() == pytest.approx([0.0, 1.0, 0.2, 0.4])
    # 5 groups generated over 2 rounds, 2 of them uniform (a, c)
    assert metrics == {"train/num_gen_batches": 2.0, "train/num_groups_dropped": 2.0, "train/dropped_group_ratio": 0.4}


def test_a_full_first_round_generates_nothing_more():
    config = SimpleNamespace(metric="seq_reward", max_num_gen_batches=1)
    more = rounds()
    batch, metrics = keep_informative_groups(scored(["a", "a"], [0.0, 1.0]), config, 1, more)
    assert more.calls == 0 and len(batch) == 2 and metrics["train/num_groups_dropped"] == 0.0


def test_too_many_rounds_is_a_clear_error():
    config = SimpleNamespace(metric="acc", max_num_gen_batches=2)
    uniform = scored(["a", "a"], [1.0, 1.0], acc=[1.0, 1.0])
    more = rounds(scored(["b", "b"], [0.0, 0.0], acc=[0.0, 0.0]))
    with pytest.raises(ValueError, match=r"2 generation rounds gave 0 groups .*max_num_gen_batches"):
        keep_informative_groups(uniform, config, 1, more)
