"""Tests for verl.trainer.ppo.core_algos: aggregation, KL, policy/value losses, advantage estimators, registries."""

import math
from collections import Counter
from types import SimpleNamespace

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
        ("seq-mean-token-sum-norm", 6.0),  # verl's Dr. GRPO form: (3 + 15) / R=3, no division by the 2 sequences
    ],
)
def test_agg_loss_modes(mode, expected):
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    assert ca.agg_loss(loss, mask, mode).item() == pytest.approx(expected)


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 3.6),  # the empty row adds no token: 18 / 5
        ("seq-mean-token-sum", 9.0),  # the fully masked row is not a sequence: (3 + 15) / 2, not / 3
        ("seq-mean-token-mean", 3.25),  # (1.5 + 5) / 2
        ("seq-mean-token-sum-norm", 6.0),  # 18 / R=3
    ],
)
def test_agg_loss_skips_fully_masked_rows(mode, expected):
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    assert ca.agg_loss(loss, mask, mode).item() == pytest.approx(expected)


def test_agg_loss_global_normalisers():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    # token-mean over a global batch of 10 tokens on 2 ranks: 18 / 10 * 2 = 3.6
    assert ca.agg_loss(loss, mask, "token-mean", dp_size=2, batch_num_tokens=10).item() == pytest.approx(3.6)
    # seq-mean-token-sum over 4 global sequences on 2 ranks: (3 + 15) / 4 * 2 = 9
    assert ca.agg_loss(loss, mask, "seq-mean-token-sum", dp_size=2, global_batch_size=4).item() == pytest.approx(9.0)
    # seq-mean-token-mean: (1.5 + 5) / 4 * 2 = 3.25
    got = ca.agg_loss(loss, mask, "seq-mean-token-mean", dp_size=2, global_batch_size=4)
    assert got.item() == pytest.approx(3.25)
    # a fixed normaliser for Dr. GRPO: 18 / 6 = 3
    assert ca.agg_loss(loss, mask, "seq-mean-token-sum-norm", loss_scale_factor=6).item() == pytest.approx(3.0)


def test_agg_loss_token_sum():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    # 1 + 2 + 4 + 5 + 6 = 18; on 2 ranks the averaged gradient must be the global sum -> 18 * 2
    assert ca.agg_loss(loss, mask, "token-sum").item() == pytest.approx(18.0)
    assert ca.agg_loss(loss, mask, "token-sum", dp_size=2).item() == pytest.approx(36.0)


def test_value_loss_forwards_the_global_normalisers():
    # vpred 2 vs return 1 (unclipped wins, as below): per token (2 - 1)^2 = 1 on 2 tokens, sum 2
    # 0.5 * 2 / 8 global tokens * 2 ranks = 0.25
    vf_loss, _ = ca.compute_value_loss(
        torch.full((1, 2), 2.0),
        torch.ones(1, 2),
        torch.zeros(1, 2),
        torch.ones(1, 2),
        cliprange_value=0.2,
        dp_size=2,
        batch_num_tokens=8,
    )
    assert vf_loss.item() == pytest.approx(0.25)


def test_agg_loss_empty_mask_is_zero_not_nan():
    loss, mask = torch.ones(2, 3), torch.zeros(2, 3)
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        assert ca.agg_loss(loss, mask, mode).item() == 0.0


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
    # log r = 100 is clamped to 20 before exp, so the result is finite (and then clamped to 10)
    assert ca.kl_penalty(torch.tensor([0.0]), torch.tensor([100.0]), "k3").item() == pytest.approx(10.0)
    # log r = -100 -> clamped to -20: e^-20 + 20 - 1 = 19.000000002 -> clamped to 10
    assert ca.kl_penalty(torch.tensor([0.0]), torch.tensor([-100.0]), "k3").item() == pytest.approx(10.0)
    assert set(ca.KL_TYPES) == {"kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"}


def test_kl_penalty_straight_through_suffix():
    logp = torch.tensor([-1.0, -2.0], requires_grad=True)
    ref = torch.tensor([-1.5, -1.0])
    kl = ca.kl_penalty(logp, ref, "k3+")
    # value: k3's, [e^-0.5 - 0.5, e - 2]
    _approx(kl.detach(), [math.exp(-0.5) - 0.5, math.e - 2.0])
    kl.sum().backward()
    # gradient: k2's, d/dlogp 0.5 (logp - ref)^2 = logp - ref = [0.5, -1.0]
    _approx(logp.grad, [0.5, -1.0])
    # k2 has no straight-through variant to take: "k2+" is plain k2
    _approx(ca.kl_penalty(logp.detach(), ref, "k2+"), [0.125, 0.5])
    assert torch.equal(ca.kl_penalty_forward(logp.detach(), ref, "k1"), torch.tensor([0.5, -1.0]))


def test_kl_penalty_unknown_type():
    with pytest.raises(ValueError, match="low_var_kl"):
        ca.kl_penalty(torch.zeros(1), torch.zeros(1), "k4")
    with pytest.raises(NotImplementedError, match="vocabulary"):
        ca.kl_penalty(torch.zeros(1), torch.zeros(1), "full")


def test_compute_rewards_subtracts_k1_penalty():
    scores = torch.tensor([[0.0, 1.0]])
    # kl = old - ref = [0.5, -1.0]; rewards = scores - 0.1 * kl = [-0.05, 1.1]
    rewards = ca.compute_rewards(scores, torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]]), kl_ratio=0.1)
    _approx(rewards, [[-0.05, 1.1]])


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


def _actor_config(**overrides):
    """The actor config the policy losses read, as attributes (like the typed config dataclass)."""
    from tests.trainer.ppo.policy_loss_helpers import actor_config

    return actor_config(**overrides)


def test_vanilla_policy_loss_is_registered():
    fn = ca.get_policy_loss_fn("vanilla")
    assert fn is ca.compute_policy_loss_vanilla
    old = torch.zeros(1, 2)
    log_prob = torch.tensor([[math.log(1.5), math.log(5.0)]])
    advantages = torch.tensor([[1.0, -1.0]])
    config = _actor_config(clip_ratio_high=0.3)
    loss, metrics = fn(old, log_prob, advantages, torch.ones(1, 2), "token-mean", config)
    # token 0: ratio 1.5 clipped at 1 + 0.3 -> -1.3; token 1: dual clip -> 3; mean 0.85
    assert loss.item() == pytest.approx(0.85, rel=1e-5)
    assert set(metrics) == {"pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"}
    assert all(isinstance(v, float) for v in metrics.values())
    assert metrics["pg_clipfrac"] == pytest.approx(0.5)
    assert metrics["pg_clipfrac_lower"] == pytest.approx(0.5)


def test_vanilla_policy_loss_reads_config_attributes_without_defaults():
    old, log_prob = torch.zeros(1, 1), torch.tensor([[math.log(0.5)]])
    advantages, mask = torch.tensor([[-1.0]]), torch.ones(1, 1)
    # ratio 0.5, A = -1, clip_ratio_low 0.1: max(0.5, 0.9) = 0.9 (the low side comes from clip_ratio_low)
    loss, _ = ca.compute_policy_loss_vanilla(old, log_prob, advantages, mask, config=_actor_config(clip_ratio_low=0.1))
    assert loss.item() == pytest.approx(0.9)
    # without clip_ratio_low the symmetric 0.2 applies: max(0.5, 0.8) = 0.8
    loss, _ = ca.compute_policy_loss_vanilla(old, log_prob, advantages, mask, config=_actor_config())
    assert loss.item() == pytest.approx(0.8)
    # no fallback defaults: a config without clip_ratio_c is an error, not a silent 3.0
    incomplete = SimpleNamespace(clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=None)
    with pytest.raises(AttributeError, match="clip_ratio_c"):
        ca.compute_policy_loss_vanilla(old, log_prob, advantages, mask, config=incomplete)
    with pytest.raises(ValueError, match="actor config"):
        ca.compute_policy_loss_vanilla(old, log_prob, advantages, mask)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        ca.compute_policy_loss_vanilla(old, log_prob, advantages, mask, config=_actor_config(clip_ratio_c=1.0))


def test_vanilla_policy_loss_rollout_is_weights():
    old, log_prob = torch.zeros(1, 2), torch.zeros(1, 2)  # ratio 1: per-token loss is -A
    advantages, mask = torch.tensor([[1.0, 2.0]]), torch.ones(1, 2)
    weights = torch.tensor([[0.5, 2.0]])
    # (-1 * 0.5 + -2 * 2) / 2 tokens = -2.25
    loss, _ = ca.compute_policy_loss_vanilla(
        old, log_prob, advantages, mask, config=_actor_config(), rollout_is_weights=weights
    )
    assert loss.item() == pytest.approx(-2.25)


def test_entropy_loss():
    # uniform over 4 tokens: entropy log 4; a one-hot-like row (logits 0, -inf...) is masked out
    logits = torch.zeros(1, 2, 4)
    logits[0, 1] = torch.tensor([100.0, 0.0, 0.0, 0.0])
    mask = torch.tensor([[1.0, 0.0]])
    assert ca.compute_entropy_loss(logits, mask).item() == pytest.approx(math.log(4), rel=1e-5)
    # both tokens: (log 4 + ~0) / 2
    both = ca.compute_entropy_loss(logits, torch.ones(1, 2))
    assert both.item() == pytest.approx(math.log(4) / 2, rel=1e-4)


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
    # the same numbers when gamma and lam come from the algorithm config (attributes)
    _, from_config = ca.compute_gae_advantage_return(rewards, values, mask, config=SimpleNamespace(gamma=0.5, lam=0.5))
    _approx(from_config, returns)
    with pytest.raises(ValueError, match="algorithm.gamma"):
        ca.compute_gae_advantage_return(rewards, values, mask)


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


def test_grpo_two_groups_by_hand():
    # group "p": scores 1, 0, 0, 1 -> mean 0.5, unbiased var (4 * 0.25) / 3 = 1/3, std 0.57735
    #   advantages +-0.5 / 0.57735 = +-0.86603
    # group "q": scores 2, 4 -> mean 3, unbiased var (1 + 1) / 1 = 2, std 1.41421 -> -1 / 1.41421, +1 / 1.41421
    rewards = torch.zeros(6, 2)
    rewards[:, 1] = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 4.0])
    mask = torch.ones(6, 2)
    uids = np.array(["p", "p", "p", "p", "q", "q"], dtype=object)
    adv, _ = ca.compute_grpo_outcome_advantage(rewards, mask, uids)
    half = 0.5 / math.sqrt(1 / 3)
    expected = torch.tensor([half, -half, -half, half, -1 / math.sqrt(2), 1 / math.sqrt(2)])
    _approx(adv[:, 0], expected, atol=1e-5)
    _approx(adv[:, 1], expected, atol=1e-5)  # the scalar is broadcast to every valid token
    # norm_adv_by_std_in_grpo=False (Dr. GRPO) -> just centred: 0.5, -0.5, -0.5, 0.5, -1, 1
    adv, _ = ca.compute_grpo_outcome_advantage(rewards, mask, uids, norm_adv_by_std_in_grpo=False)
    _approx(adv[:, 0], [0.5, -0.5, -0.5, 0.5, -1.0, 1.0])
    # when not passed, the flag comes from the algorithm config
    cfg = SimpleNamespace(norm_adv_by_std_in_grpo=False)
    _approx(ca.compute_grpo_outcome_advantage(rewards, mask, uids, config=cfg)[0][:, 0], [0.5, -0.5, -0.5, 0.5, -1, 1])


def test_grpo_vectorized_matches_loop_on_random_data():
    generator = torch.Generator().manual_seed(0)
    for norm in (True, False):
        rewards = torch.randn(64, 7, generator=generator)
        mask = (torch.rand(64, 7, generator=generator) > 0.2).float()
        # up to 20 groups of uneven sizes (64 draws from 20 labels, so some groups of one), string labels
        uids = np.array([f"uid-{i}" for i in torch.randint(0, 20, (64,), generator=generator).tolist()], dtype=object)
        sizes = Counter(uids.tolist()).values()
        assert min(sizes) == 1 and max(sizes) > 2  # the draw covers singleton groups and larger ones
        loop, loop_returns = ca.compute_grpo_outcome_advantage(rewards, mask, uids, norm_adv_by_std_in_grpo=norm)
        vec, vec_returns = ca.compute_grpo_vectorized_outcome_advantage(
            rewards, mask, uids, norm_adv_by_std_in_grpo=norm
        )
        torch.testing.assert_close(vec, loop, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(vec_returns, loop_returns, atol=1e-5, rtol=1e-5)
        assert vec.dtype == loop.dtype


def test_grpo_vectorized_hand_example_and_identical_scores():
    rewards, mask, uids = _outcome_batch()
    adv, _ = ca.compute_grpo_vectorized_outcome_advantage(rewards, mask, uids)
    # the same numbers as test_grpo_with_std_normalisation, singleton group "c" included
    expected = torch.tensor([0.5**0.5, -(0.5**0.5), -1.0, 0.0, 1.0, 0.7])
    _approx(adv[:, 0], expected, atol=1e-5)
    # identical scores in a group: std 0 -> advantage 0 / (0 + eps) = 0 in both versions
    same = torch.tensor([[1.0], [1.0]])
    ids = np.array([7, 7])
    assert ca.compute_grpo_vectorized_outcome_advantage(same, torch.ones(2, 1), ids)[0].abs().max().item() == 0.0
    assert ca.compute_grpo_outcome_advantage(same, torch.ones(2, 1), ids)[0].abs().max().item() == 0.0


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
    # verl's form: gamma from the algorithm config
    _, from_config = ca.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config=SimpleNamespace(gamma=0.5))
    _approx(from_config, [[1.5, 1.0, 2.0], [0.5, 1.0, 0.0]])


def test_reinforce_plus_plus_carries_the_return_across_masked_tokens():
    # multi-turn: position 1 is a tool's output (masked); the final reward still reaches position 0, as in verl
    rewards, mask = torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[1.0, 0.0, 1.0]])
    adv, returns = ca.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.5)
    # t2: 1; t1 masked: return 0, the carry stays 1; t0: 0 + 0.5 * 1 = 0.5
    _approx(returns, [[0.5, 0.0, 1.0]])
    # whitened over the 2 valid tokens 0.5 and 1: mean 0.75, unbiased var 0.125 -> -+0.25 / sqrt(0.125)
    _approx(adv, [[-0.25 / math.sqrt(0.125), 0.0, 0.25 / math.sqrt(0.125)]], atol=1e-4)


def test_remax_is_score_minus_baseline():
    # outcome rewards on the last valid token: row 0 scores 1 (3 valid tokens), row 1 scores 0.2 (2 valid tokens)
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.2, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    baselines = torch.tensor([0.25, 0.5])  # the greedy responses' scores
    adv, returns = ca.compute_remax_outcome_advantage(rewards, baselines, mask)
    # reward-to-go = the score on every valid token; advantage = score - baseline there, 0 on padding
    _approx(returns, [[1.0, 1.0, 1.0], [0.2, 0.2, 0.0]])
    _approx(adv, [[0.75, 0.75, 0.75], [-0.3, -0.3, 0.0]])
    assert ca.get_adv_estimator_fn("remax") is ca.compute_remax_outcome_advantage
    with pytest.raises(ValueError, match="reward_baselines"):
        ca.compute_remax_outcome_advantage(rewards, None, mask)


# ---------------------------------------------------------------------------------------------- registries


@pytest.fixture
def isolated_registries():
    """Let a test register names without leaking them into other tests."""
    with ca.POLICY_LOSS_REGISTRY.scoped(), ca.ADV_ESTIMATOR_REGISTRY.scoped():
        yield


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


def test_verl_style_custom_estimator_runs_through_registry(isolated_registries):
    # written as for verl: keyword arguments token_level_rewards, response_mask, index, config; no **kwargs
    @ca.register_adv_est("test_my_est")
    def my_est(token_level_rewards, response_mask, index, config=None):
        scores = token_level_rewards.sum(dim=-1) * config.gamma
        advantages = scores.unsqueeze(-1) * response_mask
        return advantages, advantages

    rewards = torch.tensor([[0.0, 2.0], [1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    fn = ca.get_adv_estimator_fn("test_my_est")
    # the call verl's trainer makes for a non-GAE estimator
    adv, returns = fn(
        token_level_rewards=rewards, response_mask=mask, config=SimpleNamespace(gamma=0.5), index=np.array(["a", "b"])
    )
    # scores 2 and 1, times gamma 0.5 -> 1 and 0.5, masked
    _approx(adv, [[1.0, 1.0], [0.5, 0.0]])
    assert torch.equal(adv, returns)


@pytest.mark.parametrize("name", ["grpo", "grpo_vectorized", "rloo", "reinforce_plus_plus", "remax"])
def test_builtin_estimators_accept_verls_generic_call(name):
    # verl's trainer passes token_level_rewards, response_mask, config (+ index, + reward_baselines when present)
    rewards, mask, uids = _outcome_batch()
    config = SimpleNamespace(gamma=1.0, lam=1.0, norm_adv_by_std_in_grpo=True)
    adv, returns = ca.get_adv_estimator_fn(name)(
        token_level_rewards=rewards, response_mask=mask, config=config, index=uids, reward_baselines=torch.zeros(6)
    )
    assert adv.shape == returns.shape == (6, 3)
    assert adv[0, 2].item() == 0.0  # row 0's pad position gets no advantage
    # each estimator's row-1 advantage (score 0 in group "a" with scores 1, 0):
    # grpo: -0.5 / std 0.7071 = -0.7071; rloo: 0 - 1 = -1; reinforce++: whitened return; remax: 0 - 0 = 0
    expected_row1 = {"grpo": -(0.5**0.5), "grpo_vectorized": -(0.5**0.5), "rloo": -1.0, "remax": 0.0}
    if name in expected_row1:
        assert adv[1, 0].item() == pytest.approx(expected_row1[name], abs=1e-5)


def test_gae_accepts_verls_gae_call_and_the_trainers_extra_kwargs():
    rewards = torch.tensor([[0.0, 1.0]])
    values = torch.tensor([[0.5, 0.5]])
    mask = torch.ones(1, 2)
    # verl's trainer: gae is called with token_level_rewards, values, response_mask, gamma, lam
    _, returns = ca.compute_gae_advantage_return(
        token_level_rewards=rewards, values=values, response_mask=mask, gamma=1.0, lam=1.0
    )
    # gamma = lam = 1: returns = reward-to-go = [1, 1]
    _approx(returns, [[1.0, 1.0]])
    # extra keyword arguments (index, norm_adv_by_std_in_grpo, config) are accepted and ignored
    _, again = ca.compute_gae_advantage_return(
        token_level_rewards=rewards,
        values=values,
        response_mask=mask,
        gamma=1.0,
        lam=1.0,
        index=np.array(["a"]),
        norm_adv_by_std_in_grpo=True,
        config=SimpleNamespace(gamma=0.0, lam=0.0),  # explicit gamma / lam win over the config
    )
    _approx(again, returns)


def test_registry_functions_use_the_table_the_module_holds_now(monkeypatch):
    # verl's own tests swap a plain dict in for the registry; register and get must follow the swap
    table = {"gae": ca.compute_gae_advantage_return}
    monkeypatch.setattr(ca, "ADV_ESTIMATOR_REGISTRY", table)

    def first(**kwargs):
        return None

    def second(**kwargs):
        return None

    assert ca.register_adv_est("mine")(first) is first
    assert table["mine"] is first and ca.get_adv_estimator_fn("mine") is first
    ca.register_adv_est("mine")(first)  # the same function again: no-op
    with pytest.raises(ValueError, match="taken"):
        ca.register_adv_est("mine")(second)
    with pytest.raises(ValueError, match="Unknown advantage estimator simply: grpo"):
        ca.get_adv_estimator_fn("grpo")  # not in the swapped-in table
    monkeypatch.setattr(ca, "POLICY_LOSS_REGISTRY", {})
    ca.register_policy_loss("mine")(first)
    assert ca.get_policy_loss_fn("mine") is first


def test_unknown_names_list_registered():
    with pytest.raises(ValueError, match="vanilla") as err:
        ca.get_policy_loss_fn("nope")
    assert "actor_rollout_ref.actor.policy_loss" in str(err.value)
    with pytest.raises(ValueError, match="algorithm.adv_estimator") as err:
        ca.get_adv_estimator_fn("nope")
    for name in ("gae", "grpo", "grpo_vectorized", "rloo", "reinforce_plus_plus", "remax"):
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
    assert ca.get_adv_estimator_fn(ca.AdvantageEstimator.REMAX) is ca.compute_remax_outcome_advantage
    assert (
        ca.get_adv_estimator_fn(ca.AdvantageEstimator.GRPO_VECTORIZED) is ca.compute_grpo_vectorized_outcome_advantage
    )
    # verl's names, each registered with a function of its own
    assert {e.value for e in ca.AdvantageEstimator} == {
        "gae",
        "grpo",
        "grpo_vectorized",
        "grpo_passk",
        "gdpo",
        "gpg",
        "opo",
        "rloo",
        "rloo_vectorized",
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
        "remax",
        "optimal_token_baseline",
        "tir_optimal_token_baseline",
    }
    functions = [ca.get_adv_estimator_fn(e) for e in ca.AdvantageEstimator]
    assert len(set(functions)) == len(functions)
    with pytest.raises(ValueError):
        ca.AdvantageEstimator("ppo")


# ---------------------------------------------------------------------------------------------- KL controllers


def test_fixed_kl_controller():
    ctrl = ca.get_kl_controller(SimpleNamespace(type="fixed", kl_coef=0.05))
    assert isinstance(ctrl, ca.FixedKLController)
    ctrl.update(current_kl=10.0, n_steps=100)
    assert ctrl.value == 0.05


def test_adaptive_kl_controller():
    ctrl = ca.get_kl_controller(SimpleNamespace(type="adaptive", kl_coef=0.1, target_kl=0.1, horizon=100))
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


def test_kl_controller_unknown_type_and_bad_horizon():
    with pytest.raises(ValueError, match="adaptive"):
        ca.get_kl_controller(SimpleNamespace(type="pid"))
    with pytest.raises(ValueError, match="horizon"):
        ca.get_kl_controller(SimpleNamespace(type="adaptive", kl_coef=0.1, target_kl=0.1, horizon=0))


def test_kl_controller_reads_attributes_without_defaults():
    # a kl_ctrl config without kl_coef is an error, not a silent 0.001
    with pytest.raises(AttributeError, match="kl_coef"):
        ca.get_kl_controller(SimpleNamespace(type="fixed"))
    with pytest.raises(AttributeError, match="target_kl"):
        ca.get_kl_controller(SimpleNamespace(type="adaptive", kl_coef=0.1, horizon=10))
