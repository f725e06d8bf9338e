"""Mismatch metrics and rollout correction on numbers small enough to derive by hand (derivations in comments)."""

import math

import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.ppo import rollout_corr_helper as helper
from verl.trainer.ppo.rollout_corr import compute_mismatch_metrics

# Two sequences; the second one's second token is padding. Probabilities (engine mu, trainer pi):
#   valid tokens: (0.5, 0.25), (0.25, 0.25), (0.8, 0.4)  -> ratios r = pi/mu: 0.5, 1, 0.5
MU = torch.tensor([[0.5, 0.25], [0.8, 0.9]]).log()
PI = torch.tensor([[0.25, 0.25], [0.4, 0.1]]).log()
MASK = torch.tensor([[1, 1], [1, 0]])
LOG2 = math.log(2)


def test_mismatch_metrics_match_the_hand_derivation():
    m = compute_mismatch_metrics(MU, PI, MASK)
    # |p_mu - p_pi| = 0.25, 0, 0.4: mean 0.65/3, max 0.4, population std sqrt(0.081667/3)
    assert m["training/rollout_probs_diff_mean"] == pytest.approx(0.65 / 3)
    assert m["training/rollout_probs_diff_max"] == pytest.approx(0.4)
    assert m["training/rollout_probs_diff_std"] == pytest.approx(0.164992, abs=1e-6)
    # centred: x = (-1/60, -16/60, 17/60), y = (-0.05, -0.05, 0.1): 0.0425 / sqrt(0.151667 * 0.015)
    assert m["training/rollout_actor_probs_pearson_corr"] == pytest.approx(0.891042, abs=1e-5)
    # k1: mean of -log r = (log 2 + 0 + log 2) / 3; k3: mean of r - 1 - log r = 2 (0.5 - 1 + log 2) / 3
    assert m["rollout_corr/kl"] == pytest.approx(2 * LOG2 / 3)
    assert m["rollout_corr/k3_kl"] == pytest.approx(2 * (LOG2 - 0.5) / 3)
    # per sequence d = mean log mu - mean log pi = mean(-log r): log2 / 2 and log2 (verl's sign: log ppl_pi/ppl_mu)
    assert m["rollout_corr/log_ppl_diff"] == pytest.approx(0.75 * LOG2)
    assert m["rollout_corr/log_ppl_abs_diff"] == pytest.approx(0.75 * LOG2)
    assert m["rollout_corr/log_ppl_diff_max"] == pytest.approx(LOG2)
    assert m["rollout_corr/log_ppl_diff_min"] == pytest.approx(LOG2 / 2)
    assert m["rollout_corr/ppl_ratio"] == pytest.approx((math.sqrt(2) + 2) / 2)  # mean of exp(d)
    # perplexities exp(-token mean of log p): pi 1/0.25 = 4 and 1/0.4 = 2.5; mu 1/sqrt(0.5 * 0.25) and 1/0.8
    assert m["rollout_corr/training_ppl"] == pytest.approx(3.25)
    assert m["rollout_corr/training_log_ppl"] == pytest.approx((math.log(4) + math.log(2.5)) / 2)
    assert m["rollout_corr/rollout_ppl"] == pytest.approx((1 / math.sqrt(0.125) + 1.25) / 2)
    assert m["rollout_corr/rollout_log_ppl"] == pytest.approx((-math.log(math.sqrt(0.125)) + math.log(1.25)) / 2)
    # E[r^2] - 1 = (0.25 + 1 + 0.25) / 3 - 1; both sequences' products are 0.5, so E[prod^2] - 1 = 0.25 - 1
    assert m["rollout_corr/chi2_token"] == pytest.approx(-0.5)
    assert m["rollout_corr/chi2_seq"] == pytest.approx(-0.75)


def test_identical_probabilities_show_no_mismatch():
    m = compute_mismatch_metrics(MU, MU.clone(), MASK)
    assert m["training/rollout_probs_diff_max"] == 0.0 and m["rollout_corr/kl"] == 0.0
    assert m["training/rollout_actor_probs_pearson_corr"] == pytest.approx(1.0)
    assert m["rollout_corr/chi2_token"] == pytest.approx(0.0) and m["rollout_corr/chi2_seq"] == pytest.approx(0.0)
    assert m["rollout_corr/ppl_ratio"] == pytest.approx(1.0)


# one sequence of two tokens: pi_old = (0.5, 0.3), mu = (0.1, 0.3) -> r = (5, 1), product 5
OLD = torch.tensor([[0.5, 0.3]]).log()
ROLLOUT = torch.tensor([[0.1, 0.3]]).log()
ONE = torch.tensor([[1, 1]])


def correct(**settings):
    weights, mask, metrics = helper.compute_rollout_correction_and_rejection_mask(OLD, ROLLOUT, ONE, **settings)
    return None if weights is None else weights.batch["rollout_is_weights"], mask, metrics


def test_token_weights_are_truncated_and_described():
    weights, mask, m = correct(rollout_is="token", rollout_is_threshold=2.0)
    torch.testing.assert_close(weights, torch.tensor([[2.0, 1.0]]))  # min(5, 2), min(1, 2)
    assert torch.equal(mask, ONE)  # no rejection asked
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx(1.5)
    assert (m["rollout_corr/rollout_is_max"], m["rollout_corr/rollout_is_min"]) == pytest.approx((2.0, 1.0))
    # raw weights above 2: one of two; below 1/2: none
    assert m["rollout_corr/rollout_is_ratio_fraction_high"] == 0.5
    assert m["rollout_corr/rollout_is_ratio_fraction_low"] == 0.0
    # population std of (2, 1): 0.5; ESS = 1 / mean((w / 1.5)^2) = 1 / ((16/9 + 4/9) / 2) = 0.9
    assert m["rollout_corr/rollout_is_std"] == pytest.approx(0.5)
    assert m["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(0.9, rel=1e-6)
    assert m["rollout_corr/rollout_is_seq_mean"] == pytest.approx(1.5)
    assert m["rollout_corr/rollout_is_seq_max_deviation"] == pytest.approx(0.5)
    # the raw per-sequence mean (5 + 1) / 2 = 3 is above 2, which the truncated mean 1.5 could never show
    assert m["rollout_corr/rollout_is_seq_fraction_high"] == 1.0


def test_batch_normalised_weights_average_one():
    weights, _, m = correct(rollout_is="token", rollout_is_threshold=2.0, rollout_is_batch_normalize=True)
    torch.testing.assert_close(weights, torch.tensor([[2.0, 1.0]]) / 1.5)
    assert m["rollout_corr/rollout_is_batch_norm_factor"] == pytest.approx(1.5)


def test_sequence_weight_is_the_truncated_product_on_every_token():
    weights, _, m = correct(rollout_is="sequence", rollout_is_threshold=2.0)
    torch.testing.assert_close(weights, torch.tensor([[2.0, 2.0]]))  # min(5 * 1, 2)
    assert m["rollout_corr/rollout_is_max"] == pytest.approx(5.0)  # the untruncated product, from its log
    assert m["rollout_corr/rollout_is_ratio_fraction_high"] == 1.0


def test_icepop_zeroes_weights_outside_the_band_and_keeps_the_mask():
    weights, mask, m = correct(rollout_is="token", rollout_is_threshold="0.5_4.0")
    torch.testing.assert_close(weights, torch.tensor([[0.0, 1.0]]))  # 5 is outside [0.5, 4]
    assert torch.equal(mask, ONE)
    assert m["rollout_corr/rollout_is_oob_ratio"] == 0.5


@pytest.mark.parametrize(
    "rollout_rs, threshold, kept",
    [
        # k1 = -log r = (-log 5, 0) against [log 0.5, log 2]: the first token is rejected
        ("token_k1", 2.0, [[0, 1]]),
        ("token", 2.0, [[0, 1]]),  # this project's earlier name for token_k1
        # the sequence's sum -log 5 = -1.61 lies above log(1/6) = -1.79, but not above log(1/4) = -1.39
        ("seq_sum_k1", 6.0, [[1, 1]]),
        ("sequence", 4.0, [[0, 0]]),
        # k2 = (log r)^2 / 2 = (1.295, 0): token 0 fails 1.0; the max fails too; the mean 0.648 passes
        ("token_k2", 1.0, [[0, 1]]),
        ("seq_max_k2", 1.0, [[0, 0]]),
        ("seq_mean_k2", 1.0, [[1, 1]]),
        # k3 = r - 1 - log r = (2.391, 0): the sequence's sum passes 2.5, fails 2.0
        ("seq_sum_k3", 2.5, [[1, 1]]),
        ("seq_sum_k3", 2.0, [[0, 0]]),
        ("seq_max_k3", "2.5", [[1, 1]]),
    ],
)
def test_rejection_criteria_by_hand(rollout_rs, threshold, kept):
    _, mask, m = correct(rollout_rs=rollout_rs, rollout_rs_threshold=threshold)
    assert mask.tolist() == kept
    rejected = 1 - sum(kept[0]) / 2
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(rejected)


def test_criteria_chain_and_report_each():
    # token_k2 <= 1 rejects token 0; seq_mean_k3 = 2.391 / 2 = 1.195 > 0.5 rejects the sequence
    _, mask, m = correct(rollout_rs="token_k2,seq_mean_k3", rollout_rs_threshold="1.0,0.5")
    assert mask.tolist() == [[0, 0]]
    assert m["rollout_corr/rollout_rs_token_k2_masked_fraction"] == 0.5
    assert m["rollout_corr/rollout_rs_seq_mean_k3_masked_fraction"] == 1.0
    assert m["rollout_corr/rollout_rs_seq_mean_k3_mean"] == pytest.approx((4 - math.log(5)) / 2, rel=1e-6)
    assert m["rollout_corr/rollout_rs_masked_fraction"] == 1.0
    assert m["rollout_corr/rollout_rs_seq_masked_fraction"] == 1.0


@pytest.mark.parametrize(
    "settings, error, match",
    [
        ({"rollout_is": "token", "rollout_is_threshold": True}, TypeError, "not a boolean"),
        ({"rollout_is": "token", "rollout_is_threshold": "2_1"}, ValueError, "lower bound must not exceed"),
        ({"rollout_is": "tokens"}, ValueError, "rollout_is='tokens' is not supported"),
        ({"rollout_rs": "token_k4", "rollout_rs_threshold": 2.0}, ValueError, "token_k4"),
        ({"rollout_rs": "token_k1"}, ValueError, "rollout_rs_threshold must be set"),
        ({"rollout_rs": "seq_max_k2", "rollout_rs_threshold": "0.5_2.0"}, ValueError, "one upper bound"),
        ({"rollout_rs": "token_k1,token_k2", "rollout_rs_threshold": "1,2,3"}, ValueError, "3 thresholds for 2"),
    ],
)
def test_bad_settings_are_refused_with_the_accepted_forms(settings, error, match):
    with pytest.raises(error, match=match):
        correct(**settings)


def test_add_to_batch_reads_the_typed_config_and_a_dict():
    from verl.workers.config.algorithm import RolloutCorrectionConfig

    for config in (
        RolloutCorrectionConfig.decoupled_token_is(threshold=2.0),
        {"rollout_is": "token", "rollout_is_threshold": 2.0},
    ):
        batch = DataProto.from_dict(
            tensors={"old_log_probs": OLD, "rollout_log_probs": ROLLOUT, "response_mask": ONE.clone()}
        )
        batch, metrics = helper.compute_rollout_correction_and_add_to_batch(batch, config)
        torch.testing.assert_close(batch.batch["rollout_is_weights"], torch.tensor([[2.0, 1.0]]))
        assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(1.5)


def test_bypass_mode_makes_the_rollout_log_probs_the_old_ones():
    batch = DataProto.from_dict(tensors={"rollout_log_probs": ROLLOUT, "response_mask": ONE})
    section = {"loss_mode": "vanilla"}
    helper.apply_bypass_mode(batch, {"loss_type": "reinforce"}, section)
    assert torch.equal(batch.batch["old_log_probs"], ROLLOUT)
    assert section == {"loss_mode": "bypass_mode", "rollout_correction": {"loss_type": "reinforce"}}
    with pytest.raises(ValueError, match="no rollout_log_probs"):
        helper.apply_bypass_mode(DataProto.from_dict(tensors={"response_mask": ONE}))


def test_metrics_from_logprobs_are_the_off_policy_ones_prefixed():
    m = helper.compute_rollout_corr_metrics_from_logprobs(PI, MU, MASK)
    assert m["rollout_corr/kl"] == pytest.approx(2 * LOG2 / 3)
    assert all(key.startswith("rollout_corr/") for key in m) and "rollout_corr/training_ppl" in m


def test_the_share_of_rejected_sequences_counts_sequences_with_a_valid_token():
    # 3 rows: row 0 far off (log r = 3 > log 2: token_k1 at 2.0 rejects it), row 1 on policy, row 2 all padding.
    # 1 of the 2 sequences with a valid token is rejected: 1/2, for the criterion and over all of them (not 1/3)
    log_ratio = torch.tensor([[3.0, 3.0], [0.0, 0.0], [0.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 1], [0, 0]])
    kept, m = helper.compute_rollout_rejection_mask(log_ratio, mask, "token_k1", 2.0)
    assert kept.tolist() == [[0, 0], [1, 1], [0, 0]]
    assert m["rollout_rs_token_k1_seq_masked_fraction"] == 0.5
    assert m["rollout_rs_seq_masked_fraction"] == 0.5
