"""BasePPOCritic through a scripted value model: value-loss numbers and gradients by hand, the shared step contract.

The scripted model returns the same per-position values for every row, from a learnable table over the S = 4
positions: [9, 1, 2, 9]. With P = 2 prompt and R = 2 response tokens the response values are read at positions
P + t - 1 = 1, 2 (the log-prob alignment), i.e. vpreds = [1, 2] in every row; the 9s would show any misalignment.
"""

import pytest
import torch

from tests.workers.actor.conftest import actor_config, tiny_qwen2
from tests.workers.critic.conftest import critic_config
from verl.protocol import DataProto
from verl.utils.amp_optimizer import AmpOptimizer
from verl.workers.actor.dp_actor import build_dp_actor
from verl.workers.actor.update_loop import build_loop_parts
from verl.workers.critic import DataParallelPPOCritic
from verl.workers.update_outcome import FP16WarnAndCountHandler, StrictHandler, UpdateFailedError


class ScriptedValues(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.tensor([9.0, 1.0, 2.0, 9.0]))

    def forward(self, input_ids, attention_mask, position_ids):
        return self.table.expand(input_ids.shape[0], -1)


def scripted_batch():
    # row 0: both response tokens valid; row 1: the second response token is padding (masked out).
    responses = torch.tensor([[5, 6], [7, 0]])
    prompts = torch.tensor([[3, 4], [3, 4]])
    attention_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    return DataProto.from_dict(
        tensors={
            "input_ids": torch.cat([prompts, responses], -1),
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "responses": responses,
            "response_mask": attention_mask[:, 2:],
            "values": torch.tensor([[0.8, 2.0], [0.0, 3.0]]),
            "returns": torch.tensor([[1.5, 1.0], [2.0, 5.0]]),
        }
    )


def scripted_critic(micro=2, **overrides):
    cfg = critic_config(ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=micro, **overrides)
    module = ScriptedValues()
    # plain SGD with lr 1 and no clipping: the update is exactly minus the gradient
    optimizer = AmpOptimizer(torch.optim.SGD(module.parameters(), lr=1.0), clip_grad=0.0)
    return DataParallelPPOCritic(cfg, module, optimizer, **build_loop_parts(cfg, rank=0))


def test_compute_values_reads_positions_p_plus_t_minus_1_and_masks_padding():
    values = scripted_critic().compute_values(scripted_batch())
    # positions 1 and 2 -> [1, 2]; row 1's padded response token -> 0
    torch.testing.assert_close(values, torch.tensor([[1.0, 2.0], [1.0, 0.0]]))


def test_value_loss_numbers_by_hand():
    # cliprange 0.5. Per token max((v - G)^2, (clip(v, old +- 0.5) - G)^2):
    #   row0 t0: v=1, old=0.8 -> clip(1)=1; (1 - 1.5)^2 = 0.25 both ways          -> 0.25, not clipped
    #   row0 t1: v=2, old=2   -> 2;         (2 - 1)^2   = 1                       -> 1,    not clipped
    #   row1 t0: v=1, old=0   -> 0.5;       (1-2)^2 = 1 < (0.5-2)^2 = 2.25         -> 2.25, clipped
    #   row1 t1: masked.
    # token-mean: 0.5 * (0.25 + 1 + 2.25) / 3 = 0.58333; clipfrac 1/3; vpred mean (1 + 2 + 1) / 3 = 4/3.
    metrics = scripted_critic().update_critic(scripted_batch()).metrics
    assert metrics["critic/vf_loss"] == pytest.approx(3.5 / 6)
    assert metrics["critic/vf_clipfrac"] == pytest.approx(1 / 3)
    assert metrics["critic/vpred_mean"] == pytest.approx(4 / 3)
    # seq-mean-token-mean: 0.5 * mean((0.25 + 1) / 2, 2.25 / 1) = 0.5 * 1.4375 = 0.71875
    metrics = scripted_critic(loss_agg_mode="seq-mean-token-mean").update_critic(scripted_batch()).metrics
    assert metrics["critic/vf_loss"] == pytest.approx(0.71875)


@pytest.mark.parametrize("micro", [2, 1])
def test_update_is_minus_the_hand_derived_gradient(micro):
    # token-mean loss L = 0.5 / 3 * [(v1 - 1.5)^2 + (v2 - 1)^2 + (clip - 2)^2]; the clipped term is saturated
    # (no gradient), so dL/dv1 = (1 - 1.5) / 3 = -1/6 and dL/dv2 = (2 - 1) / 3 = 1/3; positions 0 and 3 get none.
    # With one row per micro-batch the token weights 2/3 and 1/3 make the accumulated gradient the same.
    critic = scripted_critic(micro=micro)
    metrics = critic.update_critic(scripted_batch()).metrics
    torch.testing.assert_close(critic.critic_module.table.detach(), torch.tensor([9.0, 1 + 1 / 6, 2 - 1 / 3, 9.0]))
    assert metrics["critic/update_failed"] == 0.0 and metrics["critic/num_updates_successful"] == 1.0


def test_metric_names_use_the_critic_prefix():
    metrics = scripted_critic().update_critic(scripted_batch()).metrics
    assert all(key.startswith("critic/") for key in metrics), sorted(metrics)
    expected = {"critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/update_failed"}
    expected |= {"critic/update_failures_consecutive", "critic/update_failures_total", "critic/grad_norm"}
    assert expected <= set(metrics)


def test_fire_drill_under_strict_names_the_critic_and_its_policy_key():
    critic = scripted_critic(fault_injection={"nonfinite_grad_steps": [1]})  # float32 + auto -> strict
    assert isinstance(critic.update_outcome_handler, StrictHandler)
    with pytest.raises(UpdateFailedError, match=r"critic update failed at step 1") as err:
        critic.update_critic(scripted_batch())
    assert "critic.update_failure_policy" in str(err.value) and err.value.role == "critic"
    # the failed update left the weights untouched
    torch.testing.assert_close(critic.critic_module.table.detach(), torch.tensor([9.0, 1.0, 2.0, 9.0]))


def test_fire_drill_under_fp16_warn_and_count_skips_and_counts():
    critic = scripted_critic(
        update_failure_policy={"name": "fp16_warn_and_count", "max_consecutive_failures": 3},
        fault_injection={"nonfinite_grad_steps": [1]},
    )
    skipped = critic.update_critic(scripted_batch()).metrics
    assert skipped["critic/update_failed"] == 1.0 and skipped["critic/update_failures_total"] == 1.0
    assert skipped["critic/num_updates_successful"] == 0.0
    torch.testing.assert_close(critic.critic_module.table.detach(), torch.tensor([9.0, 1.0, 2.0, 9.0]))
    # step 2 is clean: the hand-derived update of the test above
    applied = critic.update_critic(scripted_batch()).metrics
    assert applied["critic/update_failed"] == 0.0 and applied["critic/update_failures_consecutive"] == 0.0
    torch.testing.assert_close(critic.critic_module.table.detach(), torch.tensor([9.0, 1 + 1 / 6, 2 - 1 / 3, 9.0]))


def test_auto_follows_the_critic_dtype_not_the_actor_dtype():
    lm = tiny_qwen2()
    actor_cfg = actor_config(dtype="float16")
    actor = build_dp_actor(actor_cfg, lm, total_training_steps=1)
    assert isinstance(actor.update_outcome_handler, FP16WarnAndCountHandler)
    assert isinstance(scripted_critic(dtype="float32").update_outcome_handler, StrictHandler)
    assert isinstance(scripted_critic(dtype="bfloat16").update_outcome_handler, StrictHandler)
    assert isinstance(scripted_critic(dtype="float16").update_outcome_handler, FP16WarnAndCountHandler)


def test_bad_critic_config_values_name_the_critic_keys():
    with pytest.raises(ValueError, match=r"critic\.dtype"):
        scripted_critic(dtype="float8")
    with pytest.raises(ValueError, match=r"critic\.cliprange_value"):
        scripted_critic(cliprange_value=0.0)
    with pytest.raises(ValueError, match=r"critic\.fault_injection\.nonfinite_grad_steps"):
        scripted_critic(fault_injection={"nonfinite_grad_steps": [0]})
    with pytest.raises(ValueError, match=r"critic\.update_failure_policy"):
        scripted_critic(update_failure_policy="no_such_policy")


def test_the_critic_is_the_actors_sibling_not_its_subclass():
    # One update loop, two roles: the critic has no log-prob pass and no policy loss to inherit by accident.
    from verl.workers.actor.base import BasePPOActor
    from verl.workers.actor.update_loop import UpdateLoop

    critic = scripted_critic()
    assert isinstance(critic, UpdateLoop) and not isinstance(critic, BasePPOActor)
    assert not hasattr(critic, "compute_log_prob") and critic.role == "critic"
