"""Failed updates told apart by cause (``UpdateOutcome.cause``): non-finite inputs to the loss and a non-finite loss
stop at once without touching the loss scale; an fp16 overflow of the scaled gradients backs the scale off and is
absorbed as before; fp32 non-finite gradients are named as such."""

import pytest
import torch

from tests.workers.actor.conftest import actor_config, ppo_batch, tiny_qwen2
from tests.workers.critic.conftest import critic_config, value_batch
from verl.workers.actor.dp_actor import build_dp_actor
from verl.workers.critic.dp_critic import build_dp_critic
from verl.workers.update_outcome import FailureCause, UpdateFailedError, UpdateOutcomeHandler

FITTING_SCALE = {"initial_loss_scale": 1024.0}  # fits the tiny model's fp16 gradients: no overflow on its own


def make_actor(**overrides):
    return build_dp_actor(actor_config(**overrides), tiny_qwen2(0), total_training_steps=100)


def with_old_log_probs(actor):
    batch = ppo_batch()
    batch.batch["old_log_probs"], _ = actor.compute_log_prob(batch)
    return batch


def weights(module):
    return {name: tensor.detach().clone() for name, tensor in module.state_dict().items()}


class SkipEverything(UpdateOutcomeHandler):
    """A custom policy that skips every failure: what it sees is what the loop reports."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_failure(self, outcome):
        self.seen.append(outcome)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_a_nan_reward_stops_at_once_naming_the_inputs_and_leaves_the_scale(dtype):
    # the batch as the driver sends it: a NaN reward on row 2's valid tokens made row 2's advantages NaN
    actor = make_actor(dtype=dtype, optim=FITTING_SCALE)
    batch = with_old_log_probs(actor)
    batch.batch["token_level_rewards"] = torch.zeros_like(batch.batch["advantages"])
    batch.batch["token_level_rewards"][2] = float("nan")
    batch.batch["advantages"][2] = float("nan")
    scale_before = actor.optimizer.get_loss_scale()
    before = weights(actor.actor_module)
    with pytest.raises(UpdateFailedError) as info:
        actor.update_policy(batch)
    outcome = info.value.outcome
    # row 2 has all 4 response tokens valid (only rows 0 and 1 are padded): 4 tokens each
    assert outcome.cause == FailureCause.NONFINITE_INPUTS
    assert outcome.nonfinite_inputs == {"token_level_rewards": 4, "advantages": 4}
    assert outcome.step == 1 and not outcome.absorbable
    message = str(info.value)
    assert "non-finite inputs to the loss (token_level_rewards on 4 tokens, advantages on 4 tokens)" in message
    assert "the reward function" in message
    assert actor.optimizer.get_loss_scale() == scale_before  # None in fp32, 1024 in fp16
    assert all(torch.equal(before[k], v) for k, v in weights(actor.actor_module).items())


def test_nan_on_a_padding_token_is_named_too():
    # row 1's last response token is padding (response_mask 0), yet the losses mask by multiplying and NaN * 0 is
    # NaN: it would poison the loss, so it is reported as an input, not found later as a non-finite loss
    actor = make_actor(dtype="float16", optim=FITTING_SCALE)
    batch = with_old_log_probs(actor)
    assert batch.batch["response_mask"][1, -1] == 0
    batch.batch["old_log_probs"][1, -1] = float("-inf")
    with pytest.raises(UpdateFailedError) as info:
        actor.update_policy(batch)
    assert info.value.outcome.nonfinite_inputs == {"old_log_probs": 1}
    assert "old_log_probs on 1 tokens" in str(info.value)


def test_nan_rewards_with_finite_advantages_do_not_fail_the_update():
    # the actor reads the advantages, not the rewards: rewards are only named as the source of bad advantages
    actor = make_actor(optim=FITTING_SCALE)
    batch = with_old_log_probs(actor)
    batch.batch["token_level_rewards"] = torch.full_like(batch.batch["advantages"], float("nan"))
    assert actor.update_policy(batch).metrics["actor/update_failed"] == 0.0


def test_a_nan_loss_is_not_a_scaler_overflow_the_scale_stays_and_the_update_is_skipped(monkeypatch):
    # a kernel returning NaN log-probs: the loss is NaN before any scaling. A custom policy that skips everything
    # sees the cause; the loss scale, the weights and Adam's state are untouched, and the next update applies.
    actor = make_actor(dtype="float16", optim=FITTING_SCALE)
    handler = actor.update_outcome_handler = SkipEverything()
    batch = with_old_log_probs(actor)
    actor.update_policy(batch)  # one applied update: Adam has state to protect
    before, adam_before = weights(actor.actor_module), actor.optimizer.optimizer.state_dict()
    real_loss = actor._micro_batch_loss
    monkeypatch.setattr(actor, "_micro_batch_loss", lambda *a: (lambda r: (r[0] * float("nan"), r[1]))(real_loss(*a)))
    metrics = actor.update_policy(batch).metrics
    assert [o.cause for o in handler.seen] == [FailureCause.NONFINITE_LOSS]
    assert metrics["actor/update_failures/nonfinite_loss"] == 1.0 and metrics["actor/loss_scale"] == 1024.0
    assert all(torch.equal(before[k], v) for k, v in weights(actor.actor_module).items())
    adam_after = actor.optimizer.optimizer.state_dict()["state"]
    for param_id, state in adam_before["state"].items():
        assert all(torch.equal(state[key], adam_after[param_id][key]) for key in ("exp_avg", "exp_avg_sq"))
    monkeypatch.undo()
    assert actor.update_policy(batch).metrics["actor/update_failed"] == 0.0


def test_a_nan_loss_stops_fp16_warn_and_count_at_once(monkeypatch):
    actor = make_actor(dtype="float16", optim=FITTING_SCALE)
    real_loss = actor._micro_batch_loss
    monkeypatch.setattr(actor, "_micro_batch_loss", lambda *a: (lambda r: (r[0] * float("inf"), r[1]))(real_loss(*a)))
    with pytest.raises(UpdateFailedError, match=r"step 1: non-finite loss before any loss scaling") as info:
        actor.update_policy(with_old_log_probs(actor))
    assert "fp16_warn_and_count stops at once" in str(info.value) and "loss_scale=1024" in str(info.value)


def test_an_fp16_overflow_still_backs_the_scale_off_and_is_absorbed():
    # 2**32 overflows the tiny model's fp16 backward (its loss is finite): after the scaler's hysteresis (2 overflows)
    # it halves; the policy skips those updates without stopping
    actor = make_actor(dtype="float16")
    batch = with_old_log_probs(actor)
    for _ in range(3):
        metrics = actor.update_policy(batch).metrics
    assert metrics["actor/update_failures/scaled_grad_overflow"] == metrics["actor/update_failures_total"] >= 2
    assert actor.optimizer.get_loss_scale() < 2.0**32
    assert "actor/update_failures/nonfinite_loss" not in metrics


def test_fp32_nan_gradients_with_a_finite_loss_are_named_non_finite_gradients():
    actor = make_actor(update_failure_policy="strict", fault_injection={"nonfinite_grad_steps": [1]})
    with pytest.raises(UpdateFailedError) as info:
        actor.update_policy(with_old_log_probs(actor))
    assert info.value.outcome.cause == FailureCause.NONFINITE_GRADS
    assert "[nonfinite_grads]" in str(info.value)


def test_the_critic_names_non_finite_returns_and_their_rewards():
    critic = build_dp_critic(tiny_qwen2(0), critic_config(dtype="float16"), total_training_steps=10)
    batch = value_batch()
    batch.batch["token_level_rewards"] = torch.zeros_like(batch.batch["returns"])
    batch.batch["token_level_rewards"][0, 0] = float("inf")
    batch.batch["returns"][0] = float("nan")  # row 0 (one left-padded prompt token, 4 valid response tokens)
    with pytest.raises(UpdateFailedError) as info:
        critic.update_critic(batch)
    assert info.value.outcome.role == "critic"
    assert info.value.outcome.nonfinite_inputs == {"token_level_rewards": 1, "returns": 4}
