"""The fp16 loss-scale rule, its config and AmpOptimizer's megatron-core step contract, on hand-set gradients."""

from __future__ import annotations

import pytest
import torch

from verl.utils.amp_optimizer import AmpOptimizer, DynamicLossScale
from verl.workers.config import LossScaleConfig, OptimConfig, load_section


def scale_config(initial_loss_scale=2.0**32, min_loss_scale=1.0, loss_scale_window=1000, hysteresis=2):
    return LossScaleConfig(
        initial_loss_scale=initial_loss_scale,
        min_loss_scale=min_loss_scale,
        loss_scale_window=loss_scale_window,
        hysteresis=hysteresis,
    )


def test_dynamic_loss_scale_follows_megatron_rule_with_floor_and_hysteresis():
    scale = DynamicLossScale(scale_config(initial_loss_scale=16.0, min_loss_scale=2.0, loss_scale_window=3))
    seen = []
    for found_inf in [True, True, True, True, True, False, False, False, True]:
        scale.update(found_inf)
        seen.append(scale.scale)
    # hysteresis 2: the 1st overflow only uses up one tolerance (16); the 2nd backs off (8) and so does every later
    # one until a growth resets the tolerance (4, 2); the floor holds at 2. Three clean steps (the window) double it
    # to 4 and restore hysteresis 2, so the next overflow keeps 4.
    assert seen == [16.0, 8.0, 4.0, 2.0, 2.0, 2.0, 2.0, 4.0, 4.0]


def optim_section(**overrides) -> OptimConfig:
    from verl.workers.config import ActorConfig

    return load_section(ActorConfig, {"optim": overrides}).optim


def test_loss_scale_values_are_checked_with_their_full_key():
    # The YAML's values are megatron-core's defaults; no value is taken from code.
    assert optim_section().loss_scale() == scale_config()
    # 0 is a value, not "missing": it must fail with the key, not silently become a default.
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.optim\.min_loss_scale must be a number > 0"):
        optim_section(min_loss_scale=0)
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.optim\.hysteresis must be an integer >= 1"):
        optim_section(hysteresis=0)
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.optim\.min_loss_scale .*must not exceed"):
        optim_section(initial_loss_scale=4.0, min_loss_scale=8.0)


def _optimizer(loss_scale: LossScaleConfig | None, clip_grad: float = 1.0):
    weight = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    adam = torch.optim.AdamW([weight], lr=0.1, weight_decay=0.0)
    return weight, AmpOptimizer(adam, clip_grad=clip_grad, loss_scale=loss_scale)


def _backward(opt: AmpOptimizer, weight: torch.Tensor, grad: list[float]) -> None:
    """A backward pass whose unscaled gradient is ``grad``: d/dw sum(w * g) = g, times the loss scale."""
    opt.zero_grad()
    opt.backward((weight * torch.tensor(grad)).sum())


def test_fp32_step_reports_the_norm_before_clipping_and_clips():
    weight, opt = _optimizer(None)
    weight.grad = torch.tensor([3.0, 4.0])
    successful, grad_norm, zeros = opt.step()
    # |(3, 4)| = 5 is reported; clipping to 1 leaves (0.6, 0.8) for AdamW.
    assert (successful, grad_norm, zeros) == (True, pytest.approx(5.0), None)
    assert torch.allclose(weight.grad, torch.tensor([0.6, 0.8]))
    assert opt.get_loss_scale() is None


def test_fp16_overflow_skips_the_update_and_backs_off():
    weight, opt = _optimizer(scale_config(initial_loss_scale=8.0, min_loss_scale=1.0, hysteresis=1))
    before = weight.detach().clone()
    _backward(opt, weight, [float("inf"), 1.0])
    assert opt.step() == (False, None, None)  # megatron-core reports no norm for a skipped fp16 update
    assert torch.equal(weight.detach(), before)
    assert opt.optimizer.state == {}  # no moments, no step count: optimizer.step() was not called
    assert opt.get_loss_scale() == 4.0  # hysteresis 1: the first overflow halves the scale
    # The next backward runs at scale 4: gradients (12, 16) unscale to (3, 4), norm 5, and the update happens.
    _backward(opt, weight, [3.0, 4.0])
    assert torch.equal(weight.grad, torch.tensor([12.0, 16.0]))
    successful, grad_norm, _ = opt.step()
    assert successful and grad_norm == pytest.approx(5.0)
    assert not torch.equal(weight.detach(), before)
    assert int(opt.optimizer.state[weight]["step"]) == 1


def test_nonfinite_norm_without_loss_scaling_still_fails_and_reports_it():
    weight, opt = _optimizer(None)
    weight.grad = torch.tensor([float("nan"), 0.0])
    successful, grad_norm, _ = opt.step()
    assert not successful and grad_norm != grad_norm  # NaN norm is reported, as megatron-core does in bf16/fp32
    assert torch.equal(weight.detach(), torch.tensor([1.0, 2.0]))


def test_state_dict_round_trips_the_loss_scale():
    config = scale_config(initial_loss_scale=8.0, hysteresis=1)
    weight, opt = _optimizer(config)
    _backward(opt, weight, [float("inf"), 1.0])
    opt.step()
    state = opt.state_dict()
    weight_restored, restored = _optimizer(config)
    restored.load_state_dict(state)
    assert restored.get_loss_scale() == 4.0
    _backward(restored, weight_restored, [1.0, 0.0])
    assert torch.equal(weight_restored.grad, torch.tensor([4.0, 0.0]))  # the next backward uses the restored scale


def test_plain_parameters_get_the_fused_adamw_step_with_the_same_result():
    from verl.utils.amp_optimizer import build_amp_optimizer

    def trained(fused_allowed: bool) -> torch.Tensor:
        torch.manual_seed(0)
        layer = torch.nn.Linear(8, 4)
        optimizer, _ = build_amp_optimizer(
            layer.parameters(), optim_section(lr=0.1), dtype=torch.float32, total_training_steps=10
        )
        optimizer.optimizer.defaults["fused"] = fused_allowed
        for group in optimizer.optimizer.param_groups:
            group["fused"] = fused_allowed
        for _ in range(3):
            optimizer.zero_grad()
            optimizer.backward(layer(torch.ones(2, 8)).pow(2).sum())
            optimizer.step()
        return layer.weight.detach().clone()

    torch.manual_seed(0)
    optimizer, _ = build_amp_optimizer(
        torch.nn.Linear(8, 4).parameters(), optim_section(), dtype=torch.float32, total_training_steps=10
    )
    assert optimizer.optimizer.param_groups[0]["fused"] is True
    # one fused kernel or the per-tensor loop: the same AdamW arithmetic, to rounding
    torch.testing.assert_close(trained(True), trained(False), atol=1e-6, rtol=1e-6)


def test_scheduler_follows_the_sections_cosine_keys():
    from verl.utils.amp_optimizer import build_scheduler

    torch_optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    optim = optim_section(lr=1.0, lr_scheduler="cosine", num_cycles=1.0, min_lr_ratio=None)
    scheduler = build_scheduler(torch_optimizer, optim, total_training_steps=4)
    lrs = []
    for _ in range(5):
        lrs.append(scheduler.get_last_lr()[0])
        torch_optimizer.step()
        scheduler.step()
    # a whole wave over 4 steps, floor 0 (null reads 0): 0.5 * (1 + cos(2 pi * step / 4)) = 1, 0.5, 0, 0.5, 1
    assert lrs == pytest.approx([1.0, 0.5, 0.0, 0.5, 1.0])
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.optim\.num_cycles must be a number > 0"):
        optim_section(num_cycles=0)
