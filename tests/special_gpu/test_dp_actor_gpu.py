"""The ``dp`` backend on CUDA: fp16 autocast, the fused AdamW step, the dynamic loss scale and a failed update.

``build_dp_actor`` on a CUDA module computes under ``torch.autocast("cuda")``, steps a fused AdamW (one kernel over
every parameter) and, in fp16, scales the loss by megatron-core's dynamic rule. Each check asserts numbers: log-probs
within fp16 rounding of fp32, the fused step equal to the per-tensor loop, the loss-scale sequence of the warm-up
from 2**32 step by step, and a failed update leaving weights, moments and step counts bit for bit. The CPU variants
run the same code on the CPU (where AdamW is fused too).
"""

import copy

import pytest
import torch

from tests.special_gpu.checks import NEEDS_CUDA, assert_bitwise_equal, num_optimizer_state_tensors, training_state
from tests.workers.actor.conftest import actor_config, ppo_batch, tiny_qwen2
from verl.workers.actor.dp_actor import build_dp_actor

DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=[pytest.mark.gpu, NEEDS_CUDA])]


def dp_actor(device: str, module=None, **overrides):
    module = (module if module is not None else tiny_qwen2(seed=0)).to(device)
    return build_dp_actor(actor_config(**overrides), module, total_training_steps=100)


def batch_on(device: str):
    return ppo_batch().to(device)


@pytest.mark.parametrize("device", DEVICES)
def test_fp16_autocast_gives_the_fp32_log_probs_within_fp16_rounding(device, figure):
    module = tiny_qwen2(seed=0)
    fp32 = dp_actor(device, copy.deepcopy(module))
    fp16 = dp_actor(device, module, dtype="float16")
    batch = batch_on(device)
    with fp16.autocast():
        logits = fp16.forward_logits(*(batch.batch[k] for k in ("input_ids", "attention_mask", "position_ids")))
    assert logits.dtype == torch.float16 and logits.device.type == device
    assert next(module.parameters()).dtype == torch.float32  # fp32 master weights
    want, _ = fp32.compute_log_prob(batch)
    got, _ = fp16.compute_log_prob(batch)
    mask = batch.batch["response_mask"].bool()
    difference = figure("fp16_log_prob_max_abs_diff", float((got - want)[mask].abs().max()))
    # log-probs of order 3.5 (log 32) through 2 fp16 layers: ~1e-3; a wrong cast or mask gives order 1
    assert 0 < difference < 2e-2


@pytest.mark.parametrize("device", DEVICES)
def test_the_fused_adamw_step_equals_the_per_tensor_loop(device, figure):
    module = tiny_qwen2(seed=0)
    fused = dp_actor(device, copy.deepcopy(module))
    loop = dp_actor(device, module)
    adamw = fused.optimizer.optimizer
    assert adamw.param_groups[0]["fused"] is True
    # the reference: the same AdamW settings stepping one tensor at a time
    settings = {k: adamw.param_groups[0][k] for k in ("lr", "betas", "eps", "weight_decay")}
    loop.optimizer.optimizer = torch.optim.AdamW(loop.optimizer.params, **settings, foreach=False, fused=False)
    batch = batch_on(device)
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    for _ in range(2):  # the second step reads the moments the first one wrote
        assert fused.update_policy(batch).metrics["actor/update_failed"] == 0.0
        assert loop.update_policy(batch).metrics["actor/update_failed"] == 0.0
    moved = max(float((p - before[n]).abs().max()) for n, p in module.named_parameters())
    difference = figure(
        "fused_adamw_max_abs_weight_diff",
        max(
            float((a - b).abs().max())
            for a, b in zip(fused.model_module().parameters(), loop.model_module().parameters(), strict=True)
        ),
    )
    # lr 1e-2: Adam moves each weight by about 1e-2 per step; the two kernels differ in rounding only, which the
    # second forward pass carries on (measured on CPU: 3e-7); a wrong moment or bias correction differs by ~1e-3
    assert moved > 1e-3 and difference <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
def test_a_failed_fp16_update_leaves_weights_moments_and_step_counts_bit_for_bit(device, figure):
    actor = dp_actor(
        device,
        dtype="float16",
        optim={"lr": 1e-2, "initial_loss_scale": 1024.0, "hysteresis": 1},
        fault_injection={"nonfinite_grad_steps": [2]},
    )
    batch = batch_on(device)
    first = actor.update_policy(batch).metrics
    before = training_state(actor.model_module(), actor.optimizer)
    assert num_optimizer_state_tensors(before) > 0  # the first update created the moments and step counts
    second = actor.update_policy(batch).metrics  # the drill makes this update's gradients NaN
    assert_bitwise_equal(before, training_state(actor.model_module(), actor.optimizer))
    third = actor.update_policy(batch).metrics
    scales = [m["actor/loss_scale"] for m in (first, second, third)]
    # 1024 fits; the NaN at update 2 is an overflow: with hysteresis 1 the scale halves at once, to 512 for update 3
    assert [m["actor/update_failed"] for m in (first, second, third)] == [0.0, 1.0, 0.0]
    assert scales == [1024.0, 1024.0, 512.0]
    figure("loss_scale_after_failed_update", scales[-1])
    after = training_state(actor.model_module(), actor.optimizer)
    assert any(not torch.equal(before[key], after[key]) for key in before)  # update 3 was applied


@pytest.mark.parametrize("device", DEVICES)
def test_the_fp16_warm_up_from_2_32_halves_the_scale_after_hysteresis_until_an_update_fits(device, figure):
    actor = dp_actor(device, dtype="float16")  # the YAML's scaler: 2**32, hysteresis 2, window 1000
    batch = batch_on(device)
    steps = []
    for _ in range(40):
        metrics = actor.update_policy(batch).metrics  # fp16_warn_and_count absorbs the back-offs
        steps.append((metrics["actor/loss_scale"], metrics["actor/update_failed"]))
        if metrics["actor/update_failed"] == 0.0:
            break
    num_failed = figure("dp_fp16_warm_up_num_skipped_updates", len(steps) - 1)
    # megatron-core's rule: the first overflow only spends the hysteresis (2 -> 1), the second halves the scale and
    # every later one halves it again: 2**32, 2**32, 2**31, 2**30, ... until an update fits
    expected = [2.0**32] + [2.0 ** (32 - k) for k in range(num_failed)]
    assert [scale for scale, _ in steps] == expected
    assert [failed for _, failed in steps] == [1.0] * num_failed + [0.0]
    # fp16 holds at most 65504: a loss of order 1 times 2**32 overflows; the scale that fits is far lower
    assert 5 <= num_failed < 39
    figure("dp_fp16_first_applied_loss_scale", steps[-1][0])
