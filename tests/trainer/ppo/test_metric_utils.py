"""verl's trainer metrics (``metric_utils``) on a batch small enough to derive every number by hand."""

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.ppo.metric_utils import (
    calc_maj_val,
    compute_data_metrics,
    compute_throughout_metrics,
    compute_timing_metrics,
    process_validation_metrics,
    validation_metrics,
)


def three_samples():
    """Prompts of 2 columns, responses of 3. Sample 0: prompt 2 tokens, response 3 (at the maximum); sample 1: 1
    and 1; sample 2: 2 and 0 (an aborted, empty response)."""
    prompt_mask = torch.tensor([[1, 1], [0, 1], [1, 1]])
    response_mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [5.0, 0.0, 0.0]])
    return DataProto.from_dict(
        tensors={
            "prompts": torch.ones(3, 2, dtype=torch.long),
            "responses": torch.ones(3, 3, dtype=torch.long),
            "attention_mask": torch.cat([prompt_mask, response_mask], dim=-1),
            "response_mask": response_mask,
            "token_level_scores": scores,
            "token_level_rewards": scores - torch.tensor([[0.1, 0.0, 0.0]]),
            "advantages": torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [9.0, 9.0, 9.0]]),
            "returns": torch.tensor([[1.0, 1.0, 1.0], [3.0, 9.0, 9.0], [9.0, 9.0, 9.0]]),
            "values": torch.tensor([[1.0, 1.0, 1.0], [2.0, 9.0, 9.0], [9.0, 9.0, 9.0]]),
        }
    )


def test_data_metrics_by_hand():
    m = compute_data_metrics(three_samples(), use_critic=True)
    # scores per answered sample: 1 and 0 (sample 2's 5 has no response and is left out)
    assert (m["critic/score/mean"], m["critic/score/max"], m["critic/score/min"]) == pytest.approx((0.5, 1.0, 0.0))
    # rewards 0.1 below the scores per sequence: 0.9 and -0.1
    assert (m["critic/rewards/mean"], m["critic/rewards/max"]) == pytest.approx((0.4, 0.9))
    # over the 4 valid tokens only (the 9s are padding): advantages 1, 2, 3, 4; returns 1, 1, 1, 3
    assert (m["critic/advantages/mean"], m["critic/advantages/max"], m["critic/advantages/min"]) == (2.5, 4.0, 1.0)
    assert (m["critic/returns/mean"], m["critic/returns/max"]) == (1.5, 3.0)
    # values 1, 1, 1, 2: G - V = 0, 0, 0, 1 has unbiased variance 0.25, G has 1: explained 1 - 0.25 / 1.00001
    assert m["critic/values/mean"] == 1.25
    assert m["critic/vf_explained_var"] == pytest.approx(0.75, abs=1e-5)
    # response lengths 3, 1, 0 (one at the maximum 3, one aborted); prompt lengths 2, 1, 2 (two at the maximum 2)
    assert m["response_length/mean"] == pytest.approx(4 / 3) and m["response_length/clip_ratio"] == pytest.approx(1 / 3)
    assert (m["response_length/max"], m["response_length/min"]) == (3.0, 0.0)
    assert m["response_length_non_aborted/mean"] == 2.0 and m["response_length_non_aborted/clip_ratio"] == 0.5
    assert m["response/aborted_ratio"] == pytest.approx(1 / 3)
    assert m["prompt_length/mean"] == pytest.approx(5 / 3) and m["prompt_length/clip_ratio"] == pytest.approx(2 / 3)


def test_without_a_critic_there_are_no_value_metrics():
    m = compute_data_metrics(three_samples(), use_critic=False)
    assert "critic/values/mean" not in m and "critic/vf_explained_var" not in m


def test_timing_and_throughput_by_hand():
    batch = three_samples()
    m = compute_timing_metrics(batch, {"gen": 0.5, "ref": 0.18, "step": 1.0})
    # generation per response token (4 of them), the reference per token of the batch (4 + 5 = 9)
    assert m["timing_per_token_ms/gen"] == pytest.approx(125.0)
    assert m["timing_per_token_ms/ref"] == pytest.approx(20.0)
    assert m["timing_s/step"] == 1.0 and "timing_per_token_ms/step" not in m
    batch.meta_info["global_token_num"] = [5, 2, 2]
    t = compute_throughout_metrics(batch, {"step": 1.5}, n_gpus=2)
    assert t == {"perf/total_num_tokens": 9, "perf/time_per_step": 1.5, "perf/throughput": 3.0}  # 9 / (1.5 * 2)


def test_validation_metrics_by_hand_and_verl_s_names():
    # prompt u1: rewards 1, 0 (mean 0.5, population std 0.5); prompt u2: 1, 1 (mean 1, std 0); averaged over prompts
    infos = {"reward": [1.0, 0.0, 1.0, 1.0], "pred": ["x", "y", "x", "x"]}
    result = process_validation_metrics(["a"] * 4, ["u1", "u1", "u2", "u2"], infos)
    reward = result["a"]["reward"]
    assert reward["mean@2"] == 0.75 and reward["std@2"] == 0.25
    assert "pred" not in result["a"]  # strings are votes, not values
    assert 0.5 < reward["best@2/mean"] < 1.0 and reward["worst@2/mean"] < reward["best@2/mean"]
    named = validation_metrics(["a"] * 4, ["u1", "u1", "u2", "u2"], infos)
    assert named["val-core/a/reward/mean@2"] == 0.75
    assert {"val-core/a/reward/best@2/mean", "val-core/a/reward/maj@2/mean", "val-aux/a/reward/std@2"} <= set(named)
    assert "val-aux/a/reward/worst@2/mean" in named


def test_majority_vote_takes_the_first_value_of_the_most_common_answer():
    votes = [{"pred": "A", "val": 0.9}, {"pred": "B", "val": 0.8}, {"pred": "A", "val": 0.7}]
    assert calc_maj_val(votes, vote_key="pred", val_key="val") == 0.9
    assert np.isclose(calc_maj_val(votes[1:2], "pred", "val"), 0.8)


def test_bootstrap_leaves_the_global_generator_alone():
    from verl.trainer.ppo.metric_utils import bootstrap_metric

    np.random.seed(7)
    expected = np.random.rand()
    np.random.seed(7)
    [(mean, _)] = bootstrap_metric([1.0, 2.0, 3.0], 2, [np.mean], n_bootstrap=50)
    assert np.random.rand() == expected
    assert 1.0 <= mean <= 3.0
