"""Tests for verl.trainer.ppo.pg_losses: gpg, dro, dppo_tv, dppo_kl, the REINFORCE loss and bypass_mode."""

import math
from types import SimpleNamespace

import pytest
import torch

from tests.trainer.ppo.policy_loss_helpers import actor_config
from verl.trainer.ppo import core_algos as ca

ln = math.log


def _probs(p, p_old):
    """(log pi leaf with grad, log pi_old) from per-token probabilities, one sequence."""
    return torch.tensor([[ln(x) for x in p]], requires_grad=True), torch.tensor([[ln(x) for x in p_old]])


def test_gpg_is_the_plain_policy_gradient():
    log_prob = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    # per token -A log pi: -(1)(-1) = 1 and -(-1)(-2) = -2 -> mean -0.5; the old log-probs play no part
    loss, metrics = ca.compute_policy_loss_gpg(None, log_prob, torch.tensor([[1.0, -1.0]]), torch.ones(1, 2))
    assert loss.item() == pytest.approx(-0.5) and metrics == {}
    loss.backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-0.5, 0.5]]))  # -A / 2 tokens


def test_dro_quadratic_penalty():
    log_prob, old = torch.tensor([[-1.0]], requires_grad=True), torch.tensor([[-1.5]])
    config = actor_config(policy_loss=SimpleNamespace(loss_mode="dro", dro_beta=0.5))
    # -(A log pi - beta/2 (log pi - log pi_old)^2) = -(2 * -1 - 0.25 * 0.25) = 2.0625
    loss, metrics = ca.compute_policy_loss_dro(old, log_prob, torch.tensor([[2.0]]), torch.ones(1, 1), config=config)
    assert loss.item() == pytest.approx(2.0625)
    assert metrics["ppo_kl"] == pytest.approx(-0.5)
    loss.backward()
    # d/d log pi = -A + beta * (log pi - log pi_old) = -2 + 0.5 * 0.5
    assert log_prob.grad.item() == pytest.approx(-1.75)


@pytest.mark.parametrize("policy_loss", ["dro", SimpleNamespace(loss_mode="dro", dro_beta=None), {"dro_beta": 0.0}])
def test_dro_needs_a_positive_beta(policy_loss):
    config = actor_config(policy_loss=policy_loss)
    with pytest.raises(ValueError, match="dro_beta"):
        ca.compute_policy_loss_dro(
            torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), config=config
        )


def test_dppo_tv_keeps_tokens_within_the_probability_budget():
    # (p, p_old, A): (0.8, 0.5, +) moved +0.3 > 0.2: dropped; (0.6, 0.5, +) kept; (0.2, 0.5, -) moved -0.3: dropped;
    # (0.45, 0.5, -) kept; (0.4, 0.1, -) moved up, kept, ratio 4 truncated at clip_ratio_c 3
    log_prob, old = _probs([0.8, 0.6, 0.2, 0.45, 0.4], [0.5, 0.5, 0.5, 0.5, 0.1])
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0]])
    loss, metrics = ca.compute_policy_loss_dppo_tv(old, log_prob, advantages, torch.ones(1, 5), config=actor_config())
    # kept tokens, -A * sg(min(r, 3)) * log pi: -1.2 ln 0.6, 0.9 ln 0.45, 3 ln 0.4; mean over the 5 tokens
    expected = (-1.2 * ln(0.6) + 0.9 * ln(0.45) + 3 * ln(0.4)) / 5
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert metrics["pg_clipfrac"] == pytest.approx(2 / 5)  # dropped tokens
    assert metrics["pg_clipfrac_lower"] == pytest.approx(1 / 5)  # kept and truncated
    loss.backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([[0.0, -1.2, 0.0, 0.9, 3.0]]) / 5)


def test_dppo_kl_keeps_tokens_within_the_binary_kl_budget():
    # binary KL from p_old 0.5: p = 0.8 or 0.2 -> 0.5 ln(0.5/0.8) + 0.5 ln(0.5/0.2) = 0.2231 > 0.2; p = 0.6 -> 0.0204.
    # (0.8, +) over budget and moved up: dropped; (0.6, +) kept; (0.2, +) moved down, nothing to restrain: kept;
    # (0.2, -) over budget and moved down: dropped; (0.8, -) moved up: kept
    log_prob, old = _probs([0.8, 0.6, 0.2, 0.2, 0.8], [0.5] * 5)
    advantages = torch.tensor([[1.0, 1.0, 1.0, -1.0, -1.0]])
    loss, metrics = ca.compute_policy_loss_dppo_kl(old, log_prob, advantages, torch.ones(1, 5), config=actor_config())
    # kept: -1.2 ln 0.6, -0.4 ln 0.2, +1.6 ln 0.8 (ratios 1.2, 0.4, 1.6)
    expected = (-1.2 * ln(0.6) - 0.4 * ln(0.2) + 1.6 * ln(0.8)) / 5
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert metrics["pg_clipfrac"] == pytest.approx(2 / 5)
    # a budget of 0.3 on the positive side keeps (0.8, +) as well: 0.2231 <= 0.3
    _, metrics = ca.compute_policy_loss_dppo_kl(
        old, log_prob, advantages, torch.ones(1, 5), config=actor_config(clip_ratio_high=0.3)
    )
    assert metrics["pg_clipfrac"] == pytest.approx(1 / 5)


def test_reinforce_loss_with_importance_weights():
    log_prob, rollout = _probs([0.5, 0.25], [0.25, 0.5])
    advantages, weights = torch.tensor([[1.0, -1.0]]), torch.tensor([[2.0, 0.5]])
    # -A w log pi: -2 ln 0.5 = 1.3863 and 0.5 ln 0.25 = -0.6931; seq-mean-token-sum over 1 sequence -> ln 2
    loss, metrics = ca.compute_policy_loss_reinforce(
        rollout, log_prob, advantages, torch.ones(1, 2), config=None, rollout_is_weights=weights
    )
    assert loss.item() == pytest.approx(ln(2), rel=1e-5)
    # ppo_kl: mean of log mu - log pi = (ln 0.5 + ln 2) / 2 = 0
    assert metrics["ppo_kl"] == pytest.approx(0.0, abs=1e-6)


def _bypass_config(**correction):
    section = SimpleNamespace(loss_mode="bypass_mode", rollout_correction=SimpleNamespace(**correction))
    return actor_config(policy_loss=section)


def test_bypass_mode_reinforce_weights_by_the_current_over_rollout_ratio():
    # old_log_prob holds the rollout's: pi / mu = 0.6 / 0.2 = 3 and 0.2 / 0.4 = 0.5 -> weights min(r, 2) = 2, 0.5
    log_prob, rollout = _probs([0.6, 0.2], [0.2, 0.4])
    config = _bypass_config(loss_type="reinforce", rollout_is="token", rollout_is_threshold=2.0)
    loss, metrics = ca.compute_policy_loss_bypass_mode(
        rollout, log_prob, torch.ones(1, 2), torch.ones(1, 2), "token-mean", config
    )
    # -A w log pi: -2 ln 0.6 and -0.5 ln 0.2, token mean
    assert loss.item() == pytest.approx((-2 * ln(0.6) - 0.5 * ln(0.2)) / 2, rel=1e-5)
    assert "ppo_kl" in metrics and any(key.startswith("rollout_corr/") for key in metrics)
    loss.backward()
    # the weights are constants: d/d log pi = -A w / 2
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-1.0, -0.25]]))


def test_bypass_mode_ppo_clip_clips_against_the_rollout():
    log_prob, rollout = _probs([0.6, 0.2], [0.2, 0.4])
    config = _bypass_config(loss_type="ppo_clip", rollout_is="token")
    # vanilla against the rollout's log-probs, without the weights: max(-3, -1.2) = -1.2, max(-0.5, -0.8) = -0.5
    loss, metrics = ca.compute_policy_loss_bypass_mode(
        rollout, log_prob, torch.ones(1, 2), torch.ones(1, 2), "token-mean", config
    )
    assert loss.item() == pytest.approx(-0.85, rel=1e-5)
    assert metrics["pg_clipfrac"] == pytest.approx(0.5)


def test_bypass_mode_rejects_against_the_current_policy():
    # r = pi / mu = (3, 0.5); token_k1 with 2.0 keeps mu / pi in [0.5, 2]: 1/3 is out, 2 is in (bounds inclusive)
    log_prob, rollout = _probs([0.6, 0.2], [0.2, 0.4])
    config = _bypass_config(loss_type="ppo_clip", rollout_rs="token_k1", rollout_rs_threshold=2.0)
    loss, metrics = ca.compute_policy_loss_bypass_mode(
        rollout, log_prob, torch.ones(1, 2), torch.ones(1, 2), "token-mean", config
    )
    # only the second token is left, max(-0.5, -0.8) = -0.5, over the 2 valid tokens: -0.25
    assert loss.item() == pytest.approx(-0.25, rel=1e-5)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == 0.5


def test_bypass_mode_with_rejection_adds_up_over_micro_batches():
    # REINFORCE with rejection, 2 rows x 4 tokens, A = 1. Row 0: pi = mu on every token (all kept); row 1: pi / mu = 3
    # on its first 3 tokens (rejected by token_k1 at 2.0), 1 on its last. Over the mini-batch, token-mean over the 8
    # valid tokens: d loss / d log pi = -1/8 on each kept token. Micro-batches of one row each, weighted by their
    # valid tokens (4 of 8 each), must give the same -1/8: row 1's one kept token must not get -1/1 x 4/8 = -1/2.
    mu = torch.full((2, 4), 0.25).log()
    pi = torch.tensor([[0.25] * 4, [0.75, 0.75, 0.75, 0.25]]).log()
    config = _bypass_config(loss_type="reinforce", rollout_rs="token_k1", rollout_rs_threshold=2.0)
    mask, advantages = torch.ones(2, 4), torch.ones(2, 4)

    def grad_of(rows_per_micro_batch):
        log_prob = pi.clone().requires_grad_(True)
        for start in range(0, 2, rows_per_micro_batch):
            rows = slice(start, start + rows_per_micro_batch)
            loss, _ = ca.compute_policy_loss_bypass_mode(
                mu[rows], log_prob[rows], advantages[rows], mask[rows], "token-mean", config
            )
            (loss * mask[rows].sum() / mask.sum()).backward()  # the update loop's weight: its share of the tokens
        return log_prob.grad

    whole = grad_of(2)
    torch.testing.assert_close(whole, torch.tensor([[-0.125] * 4, [0.0, 0.0, 0.0, -0.125]]))
    torch.testing.assert_close(grad_of(1), whole)


def test_bypass_mode_needs_its_settings():
    log_prob, rollout = _probs([0.5], [0.5])
    with pytest.raises(ValueError, match="rollout_correction"):
        ca.compute_policy_loss_bypass_mode(rollout, log_prob, torch.ones(1, 1), torch.ones(1, 1), config=actor_config())
    with pytest.raises(ValueError, match="loss_type"):
        ca.compute_policy_loss_bypass_mode(
            rollout, log_prob, torch.ones(1, 1), torch.ones(1, 1), config=_bypass_config(loss_type="ppo")
        )
