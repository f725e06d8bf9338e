"""Tests for verl.trainer.ppo.core_algos: aggregation, KL, policy/value losses, advantage estimators, registries."""

import math

import numpy as np
import pytest
import torch

from verl.trainer.ppo import core_algos as ca
from verl.utils.torch_functional import masked_mean, masked_var


def _approx(tensor, expected, atol=1e-6):
    torch.testing.assert_close(tensor, torch.as_tensor(expected, dtype=tensor.dtype), atol=atol, rtol=1e-5)


# ---------------------------------------------------------------------------------------------- agg_loss, KL


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 3.6),  # (1 + 2 + 4 + 5 + 6) / 5
        ("seq-mean-token-sum", 9.0),  # (3 + 15) / 2
        ("seq-mean-token-mean", 3.25),  # (3/2 + 15/3) / 2
        ("seq-mean-token-sum-norm", 3.0),  # (3 + 15) / (2 sequences * R=3)
    ],
)
def test_agg_loss_modes(mode, expected):
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    assert ca.agg_loss(loss, mask, mode).item() == pytest.approx(expected)


def test_agg_loss_unknown_mode():
    with pytest.raises(ValueError, match="token-mean"):
        ca.agg_loss(torch.ones(1, 2), torch.ones(1, 2), "sum")


def test_kl_penalty_all_types():
    logp = torch.tensor([-1.0, -2.0])
    ref = torch.tensor([-1.5, -1.0])
    # diff = logp - ref = [0.5, -1.0]
    for name in ("kl", "k1"):
        _approx(ca.kl_penalty(logp, ref, name), [0.5, -1.0])
    _approx(ca.kl_penalty(logp, ref, "abs"), [0.5, 1.0])
    for name in ("mse", "k2"):
        _approx(ca.kl_penalty(logp, ref, name), [0.125, 0.5])  # 0.5 * diff^2
    # k3: log r = ref - logp = [-0.5, 1.0]; r - log r - 1 = [e^-0.5 - 0.5, e - 2] = [0.106531, 0.718282]
    for name in ("low_var_kl", "k3"):
        _approx(ca.kl_penalty(logp, ref, name), [math.exp(-0.5) - 0.5, math.e - 2.0])
    # a huge log-ratio (e^20) is clamped to 10
    assert ca.kl_penalty(torch.tensor([0.0]), torch.tensor([20.0]), "k3").item() == pytest.approx(10.0)
    assert set(ca.KL_TYPES) == {"kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"}


def test_kl_penalty_unknown_type():
    with pytest.raises(ValueError, match="low_var_kl"):
        ca.kl_penalty(torch.zeros(1), torch.zeros(1), "k4")


# ---------------------------------------------------------------------------------------------- policy loss


def _policy_loss(ratios, advantages, mask=None, **kwargs):
    ratios = torch.tensor([ratios])
    advantages = torch.tensor([advantages])
    mask = torch.ones_like(ratios) if mask is None else torch.tensor([mask])
    old = torch.zeros_like(ratios)
    return ca.compute_policy_loss(old, ratios.log(), advantages, mask, **kwargs)


def test_policy_loss_no_clip():
    # ratios within [0.8, 1.2], A = 1: per-token -ratio -> mean -(1.1 + 0.9) / 2 = -1
    loss, clipfrac, ppo_kl, clipfrac_lower = _policy_loss([1.1, 0.9], [1.0, 1.0], cliprange=0.2)
    assert loss.item() == pytest.approx(-1.0)
    assert clipfrac.item() == 0.0 and clipfrac_lower.item() == 0.0
    # ppo_kl = mean(-log ratio) = -log(0.99) / 2
    assert ppo_kl.item() == pytest.approx(-math.log(0.99) / 2, rel=1e-4)


def test_policy_loss_clips_positive_advantage():
    # ratio 1.5, A = 1, clip 0.2: max(-1.5, -1.2) = -1.2
    loss, clipfrac, _, clipfrac_lower = _policy_loss([1.5], [1.0], cliprange=0.2)
    assert loss.item() == pytest.approx(-1.2)
    assert clipfrac.item() == 1.0 and clipfrac_lower.item() == 0.0


def test_policy_loss_asymmetric_clip():
    # low 0.1, high 0.3. token 0: ratio 1.5, A=1 -> -1.3. token 1: ratio 0.5, A=-1 -> max(0.5, 0.9) = 0.9.
    # token 2: ratio 0.5, A=1 -> max(-0.5, -0.9) = -0.5 (pessimistic: not clipped). mean = (-1.3 + 0.9 - 0.5) / 3
    loss, clipfrac, _, _ = _policy_loss(
        [1.5, 0.5, 0.5], [1.0, -1.0, 1.0], cliprange=0.2, cliprange_low=0.1, cliprange_high=0.3
    )
    assert loss.item() == pytest.approx((-1.3 + 0.9 - 0.5) / 3, rel=1e-5)
    assert clipfrac.item() == pytest.approx(2.0 / 3.0)
    # only one side given with no symmetric default is an error
    with pytest.raises(ValueError, match="cliprange"):
        _policy_loss([1.0], [1.0], cliprange_low=0.1)


def test_policy_loss_dual_clip():
    # ratio 5, A = -1: clip loss max(5, 1.2) = 5, dual bound -A * c = 3 -> loss 3; the masked token is ignored
    loss, clipfrac, _, clipfrac_lower = _policy_loss([5.0, 7.0], [-1.0, 4.0], mask=[1.0, 0.0], cliprange=0.2)
    assert loss.item() == pytest.approx(3.0)
    assert clipfrac_lower.item() == 1.0
    assert clipfrac.item() == 0.0  # the ppo clip did not bind: the unclipped 5 > 1.2


@pytest.mark.parametrize("clip_ratio_c", [1.0, 0.5])
def test_policy_loss_dual_clip_bound_must_exceed_one(clip_ratio_c):
    with pytest.raises(ValueError, match="clip_ratio_c"):
        _policy_loss([1.0], [1.0], cliprange=0.2, clip_ratio_c=clip_ratio_c)


def test_vanilla_policy_loss_is_registered():
    fn = ca.get_policy_loss_fn("vanilla")
    assert fn is ca.compute_policy_loss_vanilla
    old = torch.zeros(1, 2)
    log_prob = torch.tensor([[math.log(1.5), math.log(5.0)]])
    advantages = torch.tensor([[1.0, -1.0]])
    config = {"clip_ratio": 0.2, "clip_ratio_high": 0.3, "clip_ratio_c": 3.0}
    loss, metrics = fn(old, log_prob, advantages, torch.ones(1, 2), "token-mean", config)
    # token 0: ratio 1.5 clipped at 1 + 0.3 -> -1.3; token 1: dual clip -> 3; mean 0.85
    assert loss.item() == pytest.approx(0.85, rel=1e-5)
    assert set(metrics) == {"pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"}
    assert all(isinstance(v, float) for v in metrics.values())
    assert metrics["pg_clipfrac"] == pytest.approx(0.5)
    assert metrics["pg_clipfrac_lower"] == pytest.approx(0.5)


# ---------------------------------------------------------------------------------------------- value loss


def test_value_loss_clipped():
    # old values 0, clip 0.2, returns 1. token 0: vpred 0.5 -> clipped 0.2: max(0.25, 0.64) = 0.64.
    # token 1: vpred 0.1 inside the range: 0.81. loss 0.5 * (0.64 + 0.81) / 2 = 0.3625
    vpreds, returns, values = torch.tensor([[0.5, 0.1]]), torch.ones(1, 2), torch.zeros(1, 2)
    vf_loss, vf_clipfrac = ca.compute_value_loss(vpreds, returns, values, torch.ones(1, 2), cliprange_value=0.2)
    assert vf_loss.item() == pytest.approx(0.3625)
    assert vf_clipfrac.item() == pytest.approx(0.5)


def test_value_loss_unclipped():
    vpreds, returns, values = torch.tensor([[0.5, 0.1]]), torch.ones(1, 2), torch.zeros(1, 2)
    # a wide range never clips: 0.5 * (0.25 + 0.81) / 2 = 0.265
    vf_loss, vf_clipfrac = ca.compute_value_loss(vpreds, returns, values, torch.ones(1, 2), cliprange_value=10.0)
    assert vf_loss.item() == pytest.approx(0.265)
    assert vf_clipfrac.item() == 0.0
    # overshooting: vpred 2 vs return 1, clipped 0.2 -> max(1, 0.64) = 1 keeps the unclipped loss
    vf_loss, vf_clipfrac = ca.compute_value_loss(
        torch.tensor([[2.0]]), torch.ones(1, 1), torch.zeros(1, 1), torch.ones(1, 1), cliprange_value=0.2
    )
    assert vf_loss.item() == pytest.approx(0.5) and vf_clipfrac.item() == 0.0


# ---------------------------------------------------------------------------------------------- GAE


def test_gae_gamma_lam_one_returns_reward_to_go():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.2, 0.3], [0.1, 0.4, 9.0]])  # 9.0 sits on a pad position
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    advantages, returns = ca.compute_gae_advantage_return(rewards, values, mask, gamma=1.0, lam=1.0)
    # gamma = lam = 1 telescopes: raw advantage = reward-to-go - V, so returns = reward-to-go = 1 everywhere valid
    _approx(returns * mask, mask)
    assert advantages[1, 2].item() == 0.0
    assert masked_mean(advantages, mask).item() == pytest.approx(0.0, abs=1e-6)
    assert masked_var(advantages, mask).item() == pytest.approx(1.0, rel=1e-4)


def test_gae_hand_computed_with_padding():
    rewards = torch.tensor([[1.0, 0.0, 2.0], [1.0, 2.0, 0.0]])
    values = torch.tensor([[0.5, 1.0, 0.4], [0.5, 0.4, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    _, returns = ca.compute_gae_advantage_return(rewards, values, mask, gamma=0.5, lam=0.5)
    # row 0: d2 = 2 - 0.4 = 1.6 -> A2 = 1.6; d1 = 0.5*0.4 - 1 = -0.8 -> A1 = -0.8 + 0.25*1.6 = -0.4;
    #        d0 = 1 + 0.5*1 - 0.5 = 1 -> A0 = 1 + 0.25*(-0.4) = 0.9; returns = A + V = [1.4, 0.6, 2.0]
    # row 1 (length 2, the pad value 7 must not leak): d1 = 2 - 0.4 = 1.6 -> A1 = 1.6;
    #        d0 = 1 + 0.5*0.4 - 0.5 = 0.7 -> A0 = 0.7 + 0.25*1.6 = 1.1; returns = [1.6, 2.0]
    _approx(returns[0], [1.4, 0.6, 2.0])
    _approx(returns[1, :2], [1.6, 2.0])


# ---------------------------------------------------------------------------------------------- outcome estimators


def _outcome_batch():
    # scores sit on the last valid token; rows 0-1 are group "a" (1, 0), rows 2-4 group "b" (1, 2, 3), row 5 "c"
    scores = [1.0, 0.0, 1.0, 2.0, 3.0, 0.7]
    rewards = torch.zeros(6, 3)
    mask = torch.ones(6, 3)
    mask[0, 2] = 0.0  # row 0 is right-padded
    for i, s in enumerate(scores):
        rewards[i, 1 if i == 0 else 2] = s
    uids = np.array(["a", "a", "b", "b", "b", "c"], dtype=object)
    return rewards, mask, uids


def test_grpo_with_std_normalisation():
    rewards, mask, uids = _outcome_batch()
    adv, returns = ca.compute_grpo_outcome_advantage(rewards, mask, uids)
    # a: mean 0.5, unbiased std sqrt(0.5) -> +-0.5 / 0.70711 = +-0.70711; b: mean 2, std 1 -> -1, 0, 1;
    # c (a group of one): mean 0, std 1 -> its score 0.7
    expected = torch.tensor([0.5**0.5, -(0.5**0.5), -1.0, 0.0, 1.0, 0.7])
    _approx(adv[:, 0], expected, atol=1e-5)
    _approx(adv[1:, 2], expected[1:], atol=1e-5)
    assert adv[0, 2].item() == 0.0  # padding gets no advantage
    assert torch.equal(adv, returns)


def test_grpo_without_std_normalisation():
    rewards, mask, uids = _outcome_batch()
    adv, _ = ca.compute_grpo_outcome_advantage(rewards, mask, uids, norm_adv_by_std_in_grpo=False)
    # score - group mean: a: 0.5, -0.5; b: -1, 0, 1; c: 0.7
    _approx(adv[:, 0], [0.5, -0.5, -1.0, 0.0, 1.0, 0.7])


def test_rloo():
    rewards, mask, uids = _outcome_batch()
    adv, returns = ca.compute_rloo_outcome_advantage(rewards, mask, uids)
    # leave-one-out means: a: 1 - 0 = 1, 0 - 1 = -1; b: 1 - 2.5, 2 - 2, 3 - 1.5; c alone keeps its score
    _approx(adv[:, 0], [1.0, -1.0, -1.5, 0.0, 1.5, 0.7], atol=1e-5)
    assert adv[0, 2].item() == 0.0
    assert torch.equal(adv, returns)


def test_reinforce_plus_plus():
    rewards = torch.tensor([[1.0, 0.0, 2.0], [0.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, returns = ca.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.5)
    # row 0: 2, 0 + 0.5*2 = 1, 1 + 0.5*1 = 1.5; row 1: pad 0, 1, 0 + 0.5*1 = 0.5
    _approx(returns, [[1.5, 1.0, 2.0], [0.5, 1.0, 0.0]])
    # advantages: returns whitened over the 5 valid tokens, 0 on the pad
    assert adv[1, 2].item() == 0.0
    assert masked_mean(adv, mask).item() == pytest.approx(0.0, abs=1e-6)
    assert masked_var(adv, mask).item() == pytest.approx(1.0, rel=1e-4)
    # mean 1.2, unbiased var (0.09 + 0.04 + 0.64 + 0.49 + 0.04) / 4 = 0.325: row 0 token 0 -> 0.3 / sqrt(0.325)
    assert adv[0, 0].item() == pytest.approx(0.3 / math.sqrt(0.325), rel=1e-4)


# ---------------------------------------------------------------------------------------------- registries


@pytest.fixture
def isolated_registries(monkeypatch):
    """Let a test register names without leaking them into other tests."""
    for registry in (ca.POLICY_LOSS_REGISTRY, ca.ADV_ESTIMATOR_REGISTRY):
        monkeypatch.setattr(registry, "_entries", dict(registry._entries))


def test_register_custom_policy_loss(isolated_registries):
    @ca.register_policy_loss("test_half_loss")
    def half_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None):
        return 0.5 * ca.agg_loss(-advantages, response_mask, loss_agg_mode), {}

    assert ca.get_policy_loss_fn("test_half_loss") is half_loss
    loss, _ = half_loss(None, None, torch.tensor([[2.0, 4.0]]), torch.ones(1, 2))
    assert loss.item() == pytest.approx(-1.5)  # 0.5 * -(2 + 4) / 2
    # re-registering the same function is a no-op; a different function under a taken name is an error
    ca.register_policy_loss("test_half_loss")(half_loss)
    with pytest.raises(ValueError, match="taken"):
        ca.register_policy_loss("vanilla")(half_loss)


def test_register_custom_estimator(isolated_registries):
    @ca.register_adv_est("test_zero")
    def zero_adv(token_level_rewards, response_mask, **kwargs):
        zeros = torch.zeros_like(token_level_rewards)
        return zeros, zeros

    assert ca.get_adv_estimator_fn("test_zero") is zero_adv
    assert "test_zero" in ca.ADV_ESTIMATOR_REGISTRY.names()
    with pytest.raises(ValueError, match="taken"):
        ca.register_adv_est(ca.AdvantageEstimator.GAE)(zero_adv)


def test_unknown_names_list_registered():
    with pytest.raises(ValueError, match="vanilla") as err:
        ca.get_policy_loss_fn("nope")
    assert "actor_rollout_ref.actor.policy_loss" in str(err.value)
    with pytest.raises(ValueError, match="algorithm.adv_estimator") as err:
        ca.get_adv_estimator_fn("nope")
    for name in ("gae", "grpo", "rloo", "reinforce_plus_plus"):
        assert name in str(err.value)


def test_advantage_estimator_enum_lookups():
    assert ca.AdvantageEstimator("grpo") is ca.AdvantageEstimator.GRPO
    assert ca.AdvantageEstimator.GAE == "gae"
    assert ca.get_adv_estimator_fn(ca.AdvantageEstimator.GRPO) is ca.compute_grpo_outcome_advantage
    assert ca.get_adv_estimator_fn("rloo") is ca.compute_rloo_outcome_advantage
    assert (
        ca.get_adv_estimator_fn(ca.AdvantageEstimator.REINFORCE_PLUS_PLUS)
        is ca.compute_reinforce_plus_plus_outcome_advantage
    )
    assert ca.get_adv_estimator_fn("gae") is ca.compute_gae_advantage_return
    with pytest.raises(ValueError):
        ca.AdvantageEstimator("ppo")


# ---------------------------------------------------------------------------------------------- KL controllers


def test_fixed_kl_controller():
    ctrl = ca.get_kl_controller({"type": "fixed", "kl_coef": 0.05})
    assert isinstance(ctrl, ca.FixedKLController)
    ctrl.update(current_kl=10.0, n_steps=100)
    assert ctrl.value == 0.05


def test_adaptive_kl_controller():
    ctrl = ca.get_kl_controller({"type": "adaptive", "kl_coef": 0.1, "target_kl": 0.1, "horizon": 100})
    assert isinstance(ctrl, ca.AdaptiveKLController)
    # kl 0.11: error 0.11/0.1 - 1 = 0.1 -> value *= 1 + 0.1 * 10 / 100 = 1.01
    ctrl.update(current_kl=0.11, n_steps=10)
    assert ctrl.value == pytest.approx(0.101)
    # kl 0.2: error 1 clipped to 0.2 -> *= 1.02 (the coefficient grows when KL is too high)
    ctrl.update(current_kl=0.2, n_steps=10)
    assert ctrl.value == pytest.approx(0.101 * 1.02)
    # kl 0.01: error -0.9 clipped to -0.2 -> *= 0.98 (shrinks when KL is too low)
    ctrl.update(current_kl=0.01, n_steps=10)
    assert ctrl.value == pytest.approx(0.101 * 1.02 * 0.98)


def test_kl_controller_unknown_type():
    with pytest.raises(ValueError, match="adaptive"):
        ca.get_kl_controller({"type": "pid"})
