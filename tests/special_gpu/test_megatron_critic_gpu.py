"""The megatron critic on CUDA: a GPTModel (megatron-core's CUDA layer spec) with a value head, on the adapter.

``build_megatron_critic`` on CUDA keeps fp32 master weights and trains through the torch.optim adapter under
autocast (megatron-core's own optimizer is not wired up for the critic), on megatron's ``local`` spec instead of the
portable one. Checked: values equal the ``dp`` value model's on the same LM and head (fp32), the fp16 loss-scale
warm-up from 2**32 step by step, a failed fp16 update leaving weights, moments and step counts bit for bit, and
training that lowers the value loss. The CPU variants run the same checks on the portable spec.
"""

import pytest
import torch

from tests.special_gpu.checks import NEEDS_CUDA, assert_bitwise_equal, num_optimizer_state_tensors, training_state
from tests.workers.actor.conftest import megatron_world_of_one, tiny_qwen2  # noqa: F401
from tests.workers.critic.conftest import critic_config, value_batch
from verl.workers.critic.dp_critic import ValueModel, build_dp_critic
from verl.workers.critic.megatron_critic import build_megatron_critic

pytestmark = pytest.mark.usefixtures("megatron_world_of_one")
DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=[pytest.mark.gpu, NEEDS_CUDA])]


def megatron_critic(device: str, lm=None, **overrides):
    lm = lm if lm is not None else tiny_qwen2(seed=0)
    return build_megatron_critic(
        lm.config,
        critic_config(strategy="megatron", **overrides),
        total_training_steps=100,
        hf_state_dict=lm.state_dict(),
        device=device,
    )


@pytest.mark.parametrize("device", DEVICES)
def test_values_equal_the_dp_value_model_on_the_same_lm(device, figure):
    lm = tiny_qwen2(seed=0)
    critic = megatron_critic(device, lm)
    assert next(critic.model_module().parameters()).device.type == device
    # the dp value model on the same LM; both heads get the same weights of std 1, so that values are of order 1
    value_model = ValueModel.from_pretrained_lm(lm, device=device)
    generator = torch.Generator().manual_seed(4)
    head = {"weight": torch.randn(1, lm.config.hidden_size, generator=generator), "bias": torch.tensor([0.5])}
    value_model.value_head.load_state_dict(head)
    critic.model_module().output_layer.load_state_dict(head)
    reference = build_dp_critic(value_model, critic_config(), total_training_steps=1, device=device)
    batch = value_batch().to(device)
    got, want = critic.compute_values(batch), reference.compute_values(batch)
    assert got.device.type == device
    difference = figure("critic_value_max_abs_diff", float((got - want).abs().max()))
    # values of order 1: fp32 over the same hidden states (another attention kernel) agrees to ~1e-6
    assert float(want.abs().max()) > 0.5 and difference <= 1e-4


@pytest.mark.parametrize("device", DEVICES)
def test_the_fp16_warm_up_from_2_32_and_a_failed_update_leave_the_state_bit_for_bit(device, figure):
    critic = megatron_critic(device, dtype="float16", fault_injection={"nonfinite_grad_steps": [40]})
    batch = value_batch().to(device)
    steps = []
    while len(steps) < 39:
        metrics = critic.update_critic(batch).metrics
        steps.append((metrics["critic/loss_scale"], metrics["critic/update_failed"]))
        if metrics["critic/update_failed"] == 0.0:
            break
    num_failed = figure("critic_fp16_warm_up_num_skipped_updates", len(steps) - 1)
    # hysteresis 2: 2**32, 2**32, 2**31, 2**30, ... until an update fits
    assert [scale for scale, _ in steps] == [2.0**32] + [2.0 ** (32 - k) for k in range(num_failed)]
    assert [failed for _, failed in steps] == [1.0] * num_failed + [0.0]
    while critic.num_update_steps < 39:
        critic.update_critic(batch)
    before = training_state(critic.model_module(), critic.optimizer)
    assert num_optimizer_state_tensors(before) > 0
    assert critic.update_critic(batch).metrics["critic/update_failed"] == 1.0  # update 40: the drill's NaN gradients
    assert_bitwise_equal(before, training_state(critic.model_module(), critic.optimizer))


@pytest.mark.parametrize("device", DEVICES)
def test_fp16_training_lowers_the_value_loss(device, figure):
    critic = megatron_critic(device, dtype="float16", optim={"lr": 3e-3, "initial_loss_scale": 1024.0})
    batch = value_batch().to(device)
    metrics = [critic.update_critic(batch).metrics for _ in range(15)]
    assert [m["critic/update_failed"] for m in metrics] == [0.0] * 15
    losses = [m["critic/vf_loss"] for m in metrics]
    figure("critic_vf_loss_first", losses[0])
    figure("critic_vf_loss_last", losses[-1])
    # returns +-1 against values near 0: the loss starts near 0.5 (token-mean of 0.5 * 1) and falls
    assert losses[-1] < 0.5 * losses[0]
