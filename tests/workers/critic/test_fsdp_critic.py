"""The fsdp2 critic's gradients, on a world of one rank (gloo): equal to an unwrapped copy's, with no warning.

FSDP2 hooks the outputs of the sharded root module for the backward pass and warns when that output is a view
("FSDPValueModel returned a view tensor ... can cause backward to fail or produce wrong gradients"): an in-place op
on such a view would drop the hook. The value model returns a tensor of its own, and its gradients equal those of
the same value model unwrapped, parameter by parameter.
"""

import warnings

import pytest
import torch
from torch.distributed.tensor import DTensor

from tests.workers.actor.conftest import tiny_qwen2, world_of_one  # noqa: F401  (the fixture, by its name)
from tests.workers.critic.conftest import critic_config, value_batch
from verl.utils.fsdp_utils import device_mesh
from verl.workers.critic.dp_critic import ValueModel, build_dp_critic
from verl.workers.critic.fsdp_critic import build_fsdp_critic

pytestmark = pytest.mark.usefixtures("world_of_one")  # FSDP2 needs a process group


def test_the_sharded_value_models_gradients_equal_the_unwrapped_copys_without_a_view_warning():
    plain = ValueModel.from_pretrained_lm(tiny_qwen2(0), seed=3)
    dp = build_dp_critic(plain, critic_config(), total_training_steps=10)
    fsdp = build_fsdp_critic(
        ValueModel.from_pretrained_lm(tiny_qwen2(0), seed=3),
        critic_config(),
        mesh=device_mesh("cpu"),
        total_training_steps=10,
    )
    micro = value_batch()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sharded_loss, _ = fsdp._micro_batch_loss(micro, None)  # the critic's own forward and clipped value loss
        sharded_loss.backward()
    assert not [w for w in caught if "view tensor" in str(w.message)]
    loss, _ = dp._micro_batch_loss(micro, None)
    loss.backward()
    assert sharded_loss.item() == loss.item()

    sharded = dict(fsdp.critic_module.named_parameters())
    for name, param in plain.named_parameters():
        grad = sharded[name].grad
        grad = grad.full_tensor() if isinstance(grad, DTensor) else grad
        # one rank, fp32: the all-gather and the reduce-scatter are copies, so the numbers are the same bit for bit
        torch.testing.assert_close(grad, param.grad, atol=0, rtol=0, msg=name)

    # The head's bias by hand. The old values are 0 and the new ones within cliprange_value=0.5 of them, so the
    # clipped term equals the unclipped one and the loss is 0.5 * sum_i (v_i - G_i)^2 / N over the N response
    # tokens of the mask: dL/db = sum_i (v_i - G_i) / N. Returns are +1 on even rows and -1 on odd rows; rows 0-7
    # have 4 response tokens each except row 1 (one ended early): N = 31, sum_i G_i = 16 - 15 = 1.
    mask = micro.batch["response_mask"].bool()
    with torch.no_grad():
        values = dp._forward_response_values(micro)[mask]
    assert values.abs().max() < 0.5 and mask.sum() == 31
    by_hand = (values.sum() - 1.0) / 31
    torch.testing.assert_close(sharded["value_head.bias"].grad.full_tensor(), by_hand.reshape(1))
