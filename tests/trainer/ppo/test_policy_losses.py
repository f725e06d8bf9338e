"""Tests for verl.trainer.ppo.policy_losses: gspo, geo_mean, cispo, sapo, and vanilla's verl config reads.

Inputs are built from the ratios r = pi / pi_old the expected numbers are derived with; clip ranges are 0.2 unless a
test says otherwise.
"""

import math

import pytest
import torch

from tests.trainer.ppo.policy_loss_helpers import actor_config
from verl.trainer.ppo import core_algos as ca

ALL_LOSSES = [
    "vanilla",
    "gspo",
    "gpg",
    "clip_cov",
    "kl_cov",
    "geo_mean",
    "cispo",
    "sapo",
    "dppo_kl",
    "dppo_tv",
    "dro",
    "bypass_mode",
]


def inputs(log_prob, ratios):
    """(log_prob leaf with grad, old_log_prob) for the given log-probs and ratios pi / pi_old."""
    log_prob = torch.tensor(log_prob, requires_grad=True)
    old = (log_prob.detach() - torch.tensor(ratios).log()).clone()
    return log_prob, old


@pytest.mark.parametrize("name", ALL_LOSSES)
def test_verls_loss_modes_are_registered(name):
    fn = ca.get_policy_loss_fn(name)
    assert fn is getattr(ca, f"compute_policy_loss_{name}")


def test_unknown_loss_mode_lists_the_registered_ones():
    with pytest.raises(ValueError, match="Unsupported loss mode") as err:
        ca.get_policy_loss_fn("ppo2")
    assert all(name in str(err.value) for name in ALL_LOSSES)


def test_vanilla_uses_the_global_batch_normalisers_when_the_config_has_them():
    log_prob, old = inputs([[-1.0, -1.0]], [[1.0, 1.0]])
    advantages, mask = torch.tensor([[1.0, 2.0]]), torch.ones(1, 2)
    # ratio 1: per token -A = -1, -2 (sum -3); 6 tokens in the global batch over 2 ranks -> -3 / 6 * 2 = -1
    config = actor_config(global_batch_info={"dp_size": 2, "batch_num_tokens": 6})
    loss, _ = ca.compute_policy_loss_vanilla(old, log_prob, advantages, mask, "token-mean", config)
    assert loss.item() == pytest.approx(-1.0)
    # without them (this project's config today): the local token mean -3 / 2
    loss, _ = ca.compute_policy_loss_vanilla(old, log_prob, advantages, mask, "token-mean", actor_config())
    assert loss.item() == pytest.approx(-1.5)


# ---------------------------------------------------------------------------------------------- gspo


def test_gspo_sequence_ratio_and_its_gradient():
    # sequence 0: token ratios 1.5 and 1.0 -> s = sqrt(1.5) = 1.2247, A = 1 -> clipped at 1.2 -> -1.2 per token
    # sequence 1: one valid token, ratio 0.9, A = -1 -> max(0.9, 0.9) = 0.9 (unclipped)
    log_prob, old = inputs([[-1.0, -2.0], [-0.5, -3.0]], [[1.5, 1.0], [0.9, 5.0]])
    advantages = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, metrics = ca.compute_policy_loss_gspo(old, log_prob, advantages, mask, "token-mean", actor_config())
    # always per sequence (seq-mean-token-mean), whatever loss_agg_mode says: (-1.2 + 0.9) / 2 = -0.15
    assert loss.item() == pytest.approx(-0.15, rel=1e-5)
    assert metrics["pg_clipfrac"] == pytest.approx(2 / 3)  # the two tokens of sequence 0
    assert metrics["ppo_kl"] == pytest.approx(-(math.log(1.5) + math.log(0.9)) / 3, rel=1e-5)
    assert metrics["pg_clipfrac_lower"] == 0.0
    loss.backward()
    # each token carries the gradient of its own log-prob: d(-A s_t)/d log pi_t = -A s = 0.9 on sequence 1's token,
    # times 1/2 sequences x 1/1 token; the clipped tokens of sequence 0 get none
    torch.testing.assert_close(log_prob.grad, torch.tensor([[0.0, 0.0], [0.45, 0.0]]))


# ---------------------------------------------------------------------------------------------- geo_mean


def test_geo_mean_clips_log_ratios_by_advantage_sign():
    # sequence 0 (A = 1): log r = ln 1.5 -> min(0.405, 0.2) = 0.2; ln 0.9 stays -> ratio exp((0.2 + ln 0.9) / 2)
    # sequence 1 (A = -1): ln 1.5 -> -min(-0.405, -0.2) = ln 1.5; ln 0.5 -> -min(0.693, 0.2) = -0.2
    #   -> ratio exp((ln 1.5 - 0.2) / 2); the loss is the plain mean of -A * ratio over the 2 sequences
    log_prob, old = inputs([[-1.0, -1.0], [-1.0, -1.0]], [[1.5, 0.9], [1.5, 0.5]])
    advantages = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    loss, metrics = ca.compute_policy_loss_geo_mean(old, log_prob, advantages, torch.ones(2, 2), config=actor_config())
    seq0 = -math.exp((0.2 + math.log(0.9)) / 2)
    seq1 = math.exp((math.log(1.5) - 0.2) / 2)
    assert loss.item() == pytest.approx((seq0 + seq1) / 2, rel=1e-5)
    # clipped: (0, 0) with A > 0 -> 1 of 4 tokens; (1, 0) and (1, 1) with A < 0 -> 2 of 4
    assert metrics["pg_clipfrac"] == pytest.approx(0.25)
    assert metrics["pg_clipfrac_lower"] == pytest.approx(0.5)


def test_geo_mean_importance_weights_enter_per_sequence():
    log_prob, old = inputs([[-1.0, -1.0]], [[1.0, 1.0]])
    weights = torch.tensor([[4.0, 1.0]])
    # ratio 1, A = 2 -> -2; times the geometric mean of the weights sqrt(4 * 1) = 2 -> -4
    loss, _ = ca.compute_policy_loss_geo_mean(
        old, log_prob, torch.full((1, 2), 2.0), torch.ones(1, 2), config=actor_config(), rollout_is_weights=weights
    )
    assert loss.item() == pytest.approx(-4.0, rel=1e-5)


# ---------------------------------------------------------------------------------------------- cispo


def test_cispo_clips_the_weight_not_the_gradient():
    log_prob, old = inputs([[-1.0, -2.0, -0.5]], [[1.5, 0.5, 1.0]])
    advantages = torch.tensor([[1.0, 1.0, -2.0]])
    loss, metrics = ca.compute_policy_loss_cispo(old, log_prob, advantages, torch.ones(1, 3), config=actor_config())
    # weights clip(r, 0.8, 1.2) = 1.2, 0.8, 1.0; per token -w A log pi = 1.2, 1.6, -1.0 -> mean 0.6
    assert loss.item() == pytest.approx(0.6, rel=1e-5)
    assert metrics["pg_clipfrac"] == pytest.approx(2 / 3)
    loss.backward()
    # every token keeps a gradient, -w A / 3 tokens (the clipped ones included)
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-1.2, -0.8, 2.0]]) / 3)


# ---------------------------------------------------------------------------------------------- sapo


def test_sapo_gate_at_ratio_one():
    log_prob, old = inputs([[-1.0, -1.0]], [[1.0, 1.0]])
    advantages = torch.tensor([[1.0, -1.0]])
    # r = 1: gate sigmoid(0) * 4 / tau = 2 / tau; tau_pos 1 (A > 0), tau_neg 1.05 (verl's defaults, not in our config)
    # per token -2 and +2 / 1.05; one sequence of 2 tokens -> (-2 + 2 / 1.05) / 2
    loss, metrics = ca.compute_policy_loss_sapo(old, log_prob, advantages, torch.ones(1, 2), config=actor_config())
    assert loss.item() == pytest.approx((-2 + 2 / 1.05) / 2, rel=1e-5)
    assert metrics["pg_clipfrac"] == 0.0 and metrics["ppo_kl"] == pytest.approx(0.0, abs=1e-7)
    loss.backward()
    # slope of the gate at r = 1: sigmoid'(0) * tau * 4 / tau = 1, so the gradient is the plain -A / 2 tokens
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-0.5, 0.5]]))


def test_sapo_reads_tau_from_the_config():
    log_prob, old = inputs([[-1.0, -1.0]], [[1.0, 1.0]])
    # tau 2 on both sides: gate 2 / 2 = 1 -> per token -1 and +1 -> mean 0
    config = actor_config(tau_pos=2.0, tau_neg=2.0)
    loss, _ = ca.compute_policy_loss_sapo(old, log_prob, torch.tensor([[1.0, -1.0]]), torch.ones(1, 2), config=config)
    assert loss.item() == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("name", ["gspo", "geo_mean", "cispo", "dppo_tv", "dppo_kl", "clip_cov"])
def test_clip_based_losses_need_the_actor_config(name):
    log_prob, old = inputs([[-1.0]], [[1.0]])
    with pytest.raises(ValueError, match="actor config"):
        ca.get_policy_loss_fn(name)(old, log_prob, torch.ones(1, 1), torch.ones(1, 1))
