"""Mismatch metrics and rollout correction on numbers small enough to derive by hand (derivations in comments)."""

import math

import pytest
import torch

from verl.trainer.ppo.rollout_corr import compute_mismatch_metrics, compute_rollout_correction
from verl.workers.config import AlgorithmConfig, load_section

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
    # per-sequence token means of log r: -log2 / 2 and -log2; their mean, and the mean of their absolute values
    assert m["rollout_corr/log_ppl_diff"] == pytest.approx(-0.75 * LOG2)
    assert m["rollout_corr/log_ppl_abs_diff"] == pytest.approx(0.75 * LOG2)
    # E[r^2] - 1 = (0.25 + 1 + 0.25) / 3 - 1; both sequences' products are 0.5, so E[prod^2] - 1 = 0.25 - 1
    assert m["rollout_corr/chi2_token"] == pytest.approx(-0.5)
    assert m["rollout_corr/chi2_seq"] == pytest.approx(-0.75)


def test_identical_probabilities_show_no_mismatch():
    m = compute_mismatch_metrics(MU, MU.clone(), MASK)
    assert m["training/rollout_probs_diff_max"] == 0.0 and m["rollout_corr/kl"] == 0.0
    assert m["training/rollout_actor_probs_pearson_corr"] == pytest.approx(1.0)
    assert m["rollout_corr/chi2_token"] == pytest.approx(0.0) and m["rollout_corr/chi2_seq"] == pytest.approx(0.0)


def correction(**overrides):
    return load_section(AlgorithmConfig, {"rollout_correction": overrides}).rollout_correction


# one sequence of two tokens: pi_old = (0.5, 0.3), mu = (0.1, 0.3) -> r = (5, 1), product 5
OLD = torch.tensor([[0.5, 0.3]]).log()
ROLLOUT = torch.tensor([[0.1, 0.3]]).log()
ONE = torch.tensor([[1, 1]])


def test_token_weights_are_truncated_at_the_threshold():
    weights, mask, m = compute_rollout_correction(OLD, ROLLOUT, ONE, correction(rollout_is="token"))
    torch.testing.assert_close(weights, torch.tensor([[2.0, 1.0]]))  # min(5, 2), min(1, 2)
    assert torch.equal(mask, ONE)  # no rejection asked
    assert m["rollout_corr/is_clip_frac"] == 0.5 and m["rollout_corr/is_weight_mean"] == pytest.approx(1.5)
    assert m["rollout_corr/is_weight_max"] == pytest.approx(2.0)
    normalised, _, _ = compute_rollout_correction(
        OLD, ROLLOUT, ONE, correction(rollout_is="token", rollout_is_batch_normalize=True)
    )
    torch.testing.assert_close(normalised, torch.tensor([[2.0, 1.0]]) / 1.5)  # mean 1 after dividing by 1.5


def test_sequence_weight_is_the_truncated_product_on_every_token():
    weights, _, _ = compute_rollout_correction(OLD, ROLLOUT, ONE, correction(rollout_is="sequence"))
    torch.testing.assert_close(weights, torch.tensor([[2.0, 2.0]]))  # min(5 * 1, 2)


def test_rejection_masks_tokens_or_sequences_outside_the_band():
    _, mask, m = compute_rollout_correction(OLD, ROLLOUT, ONE, correction(rollout_rs="token"))
    assert mask.tolist() == [[0, 1]] and m["rollout_corr/rs_reject_frac"] == 0.5  # 5 > 2; 1 is in [0.5, 2]
    wide_band = correction(rollout_rs="sequence", rollout_rs_threshold=6)
    _, mask, _ = compute_rollout_correction(OLD, ROLLOUT, ONE, wide_band)
    assert mask.tolist() == [[1, 1]]  # the product 5 lies in [1/6, 6]


def test_reinforce_loss_needs_bypass_mode():
    with pytest.raises(ValueError, match=r"algorithm.rollout_correction.loss_type=reinforce .* bypass_mode=true"):
        correction(loss_type="reinforce")
