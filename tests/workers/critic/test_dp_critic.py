"""DataParallelPPOCritic over a ValueModel: real fp16 overflow, checkpoint resume, the value model itself."""

import logging

import pytest
import torch

from tests.workers.actor.conftest import tiny_qwen2
from tests.workers.critic.conftest import critic_config, value_batch
from verl.utils.checkpoint import atomic_directory
from verl.workers.critic import ValueModel, build_dp_critic
from verl.workers.update_outcome import FP16WarnAndCountHandler


def make_critic(seed=0, **overrides):
    return build_dp_critic(tiny_qwen2(seed), critic_config(**overrides), total_training_steps=100)


def test_value_model_keeps_the_lm_backbone_and_starts_near_zero():
    lm = tiny_qwen2()
    model = ValueModel.from_pretrained_lm(lm, seed=1)
    assert model.backbone is lm.model and not hasattr(model, "lm_head")
    batch = value_batch().batch
    values = model(batch["input_ids"], batch["attention_mask"], batch["position_ids"])
    assert values.shape == (8, 8)
    # head weights ~ N(0, 1e-3^2) over 32 RMS-normalised features: |v| is a few 1e-3, far below 0.1
    assert values.abs().max() < 0.1 and values.abs().max() > 0
    same_seed = ValueModel.from_pretrained_lm(tiny_qwen2(), seed=1)
    assert torch.equal(same_seed.value_head.weight, model.value_head.weight)
    other_seed = ValueModel.from_pretrained_lm(tiny_qwen2(), seed=2)
    assert not torch.equal(other_seed.value_head.weight, model.value_head.weight)


def test_value_model_rejects_a_module_without_hidden_size():
    with pytest.raises(ValueError, match="hidden_size"):
        ValueModel.from_pretrained_lm(torch.nn.Linear(2, 2))


def train(critic, batch, num_steps):
    """PPO's critic loop: the old values are the critic's own, recomputed before every update.

    (With fixed old values of 0 the clipped loss could not fall below 0.5 * (1 - 0.5)^2 = 0.125.)
    """
    all_metrics = []
    for _ in range(num_steps):
        batch.batch["values"] = critic.compute_values(batch)
        all_metrics.append(critic.update_critic(batch).metrics)
    return all_metrics


def mean_abs_error(critic, batch):
    values, mask = critic.compute_values(batch), batch.batch["response_mask"]
    return float(((values - batch.batch["returns"]).abs() * mask).sum() / mask.sum())


def test_fp32_critic_learns_the_returns():
    critic = make_critic(optim={"lr": 1e-2})
    batch = value_batch()
    losses = [m["critic/vf_loss"] for m in train(critic, batch, 15)]
    # returns are +-1 on valid tokens and the values start near 0: the first loss is ~0.5 * 1 = 0.5
    assert losses[0] == pytest.approx(0.5, abs=0.05)
    assert losses[-1] < 0.1 * losses[0]
    assert mean_abs_error(critic, batch) < 0.2  # started at ~1


def test_real_fp16_overflow_is_absorbed_then_the_value_loss_falls(caplog):
    # Loss scale 2**32 overflows the fp16 backward; with hysteresis 2 the scaler halves from the second overflow
    # on until the gradients fit. auto -> fp16_warn_and_count (critic.dtype=float16), which skips with a warning.
    critic = make_critic(dtype="float16", optim={"lr": 1e-2})
    assert isinstance(critic.update_outcome_handler, FP16WarnAndCountHandler)
    batch = value_batch()
    failed, losses, scales = [], [], []
    with caplog.at_level(logging.WARNING):
        for metrics in train(critic, batch, 40):
            failed.append(metrics["critic/update_failed"])
            losses.append(metrics["critic/vf_loss"])
            scales.append(metrics["critic/loss_scale"])
    first_success = failed.index(0.0)
    assert first_success >= 2 and failed[:first_success] == [1.0] * first_success
    assert failed[-5:] == [0.0] * 5
    assert metrics["critic/update_failures_total"] == sum(failed)
    assert scales[0] == 2.0**32 and scales[-1] < 2.0**20
    assert any("critic" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    # skipped updates leave the model alone, so the loss is flat until the first applied one, then falls
    assert losses[first_success] == pytest.approx(losses[0], rel=1e-3)
    assert losses[-1] < 0.1 * losses[first_success]
    assert mean_abs_error(critic, batch) < 0.2


def test_checkpoint_round_trip_restores_handler_and_loss_scaler(tmp_path):
    batch = value_batch()
    straight = make_critic(dtype="float16")
    for _ in range(20):
        straight.update_critic(batch)
    source = make_critic(dtype="float16")
    for _ in range(18):
        source.update_critic(batch)
    assert source.update_outcome_handler.num_total_failures > 0  # the state being restored is not the initial one
    with atomic_directory(tmp_path / "critic") as tmp:
        source.save_checkpoint(tmp)
    resumed = make_critic(seed=123, dtype="float16")  # a different init: everything must come from the checkpoint
    resumed.load_checkpoint(tmp_path / "critic")
    assert resumed.update_outcome_handler.state_dict() == source.update_outcome_handler.state_dict()
    assert resumed.optimizer.get_loss_scale() == source.optimizer.get_loss_scale()
    assert resumed.optimizer.loss_scale.state_dict() == source.optimizer.loss_scale.state_dict()
    for _ in range(2):
        resumed.update_critic(batch)
    for key, value in straight.critic_module.state_dict().items():
        assert torch.equal(value, resumed.critic_module.state_dict()[key]), key
    assert resumed.num_update_steps == straight.num_update_steps == 20
    assert resumed.update_outcome_handler.state_dict() == straight.update_outcome_handler.state_dict()
    assert resumed.lr_scheduler.last_epoch == straight.lr_scheduler.last_epoch


def test_the_critic_needs_no_temperature():
    # only the actor's log-probs depend on the sampling temperature; a value batch without one trains
    critic = make_critic()
    batch = value_batch()
    batch.meta_info.clear()
    metrics = critic.update_critic(batch).metrics
    assert critic.num_update_steps == 1 and metrics["critic/update_failed"] == 0.0
