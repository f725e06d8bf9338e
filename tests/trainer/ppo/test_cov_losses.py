"""Tests for verl.trainer.ppo.cov_losses: clip_cov and kl_cov.

One sequence of 4 tokens with advantages A = [3, -1, -1, -1] (mean 0) and log-probs [-1, -3, -2, -2] (mean -2):
the covariance products (A - 0) * (log pi + 2) are [3, 1, 0, 0].
"""

import math
from types import SimpleNamespace

import pytest
import torch

from tests.trainer.ppo.policy_loss_helpers import actor_config
from verl.trainer.ppo import core_algos as ca

ADVANTAGES = torch.tensor([[3.0, -1.0, -1.0, -1.0]])
MASK = torch.ones(1, 4)


def _log_probs(log_ratios):
    log_prob = torch.tensor([[-1.0, -3.0, -2.0, -2.0]], requires_grad=True)
    return log_prob, log_prob.detach() - torch.tensor([log_ratios])


def test_clip_cov_drops_the_gradient_of_a_high_covariance_token():
    log_prob, old = _log_probs([0.0, 0.0, 0.0, 0.0])
    # candidates need 1 < cov < 5: only token 0 (cov 3; token 1's cov 1 is not > 1). verl's default share 0.0002
    # of 4 tokens rounds to 0 -> at least 1 token dropped. Per token -A r = -3, 1, 1, 1 -> with token 0 dropped 0.75
    loss, metrics = ca.compute_policy_loss_clip_cov(old, log_prob, ADVANTAGES, MASK, config=actor_config())
    assert loss.item() == pytest.approx(0.75)
    assert metrics["pg_clipfrac"] == pytest.approx(0.25)
    loss.backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([[0.0, 0.25, 0.25, 0.25]]))  # -A r / 4, token 0 cut


def test_clip_cov_bounds_come_from_the_policy_loss_section():
    log_prob, old = _log_probs([0.0, 0.0, 0.0, 0.0])
    # clip_cov_ub 2.5 puts token 0's cov 3 out of range: nothing dropped, loss (-3 + 1 + 1 + 1) / 4 = 0
    config = actor_config(policy_loss={"loss_mode": "clip_cov", "clip_cov_ub": 2.5})
    loss, metrics = ca.compute_policy_loss_clip_cov(old, log_prob, ADVANTAGES, MASK, config=config)
    assert loss.item() == pytest.approx(0.0, abs=1e-6)
    assert metrics["pg_clipfrac"] == 0.0


def test_clip_cov_spares_tokens_ppo_already_clipped():
    log_prob, old = _log_probs([math.log(1.5), 0.0, 0.0, 0.0])
    # token 0: ratio 1.5, A = 3 -> clipped at 1.2 by PPO (-3.6), so it is no candidate; (-3.6 + 3) / 4 = -0.15
    loss, metrics = ca.compute_policy_loss_clip_cov(old, log_prob, ADVANTAGES, MASK, config=actor_config())
    assert loss.item() == pytest.approx(-0.15, rel=1e-5)
    assert metrics["pg_clipfrac"] == 0.0


def test_clip_cov_drops_the_configured_share_at_random():
    log_prob = torch.tensor([[-1.0, -1.0, -3.0, -3.0]], requires_grad=True)
    advantages = torch.tensor([[2.0, 2.0, -2.0, -2.0]])
    # every cov is 2 * 1 = 2, all candidates; share 0.5 of 4 tokens -> exactly 2 dropped, which ones is random
    config = actor_config(policy_loss=SimpleNamespace(loss_mode="clip_cov", clip_cov_ratio=0.5))
    loss, metrics = ca.compute_policy_loss_clip_cov(log_prob.detach(), log_prob, advantages, MASK, config=config)
    assert metrics["pg_clipfrac"] == pytest.approx(0.5)
    loss.backward()
    assert int((log_prob.grad == 0).sum()) == 2


def test_kl_cov_penalises_the_top_covariance_token():
    log_prob, old = _log_probs([0.1, 0.2, 0.0, 0.0])
    # top max(1, int(4 * 0.0002)) = 1 token by cov: token 0 -> -3 e^0.1 + ppo_kl_coef 0.1 * |0.1|;
    # others unclipped -A r: e^0.2, 1, 1
    loss, metrics = ca.compute_policy_loss_kl_cov(old, log_prob, ADVANTAGES, MASK, config=actor_config())
    expected = (-3 * math.exp(0.1) + 0.01 + math.exp(0.2) + 2) / 4
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert metrics["ppo_kl"] == pytest.approx(0.3 / 4)  # mean |log r|
    # share 0.5 and coefficient 1 from the policy_loss section: tokens 0 and 1 (cov 3 and 1) get + |log r|
    config = actor_config(policy_loss={"loss_mode": "kl_cov", "kl_cov_ratio": 0.5, "ppo_kl_coef": 1.0})
    loss, _ = ca.compute_policy_loss_kl_cov(old, log_prob, ADVANTAGES, MASK, config=config)
    expected = (-3 * math.exp(0.1) + 0.1 + math.exp(0.2) + 0.2 + 2) / 4
    assert loss.item() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("name, key", [("clip_cov", "clip_cov_ratio"), ("kl_cov", "kl_cov_ratio")])
def test_cov_losses_refuse_a_non_positive_share(name, key):
    log_prob, old = _log_probs([0.0] * 4)
    config = actor_config(policy_loss={"loss_mode": name, key: 0.0})
    with pytest.raises(ValueError, match=key):
        ca.get_policy_loss_fn(name)(old, log_prob, ADVANTAGES, MASK, config=config)
