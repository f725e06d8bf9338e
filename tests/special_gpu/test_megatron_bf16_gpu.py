"""The megatron actor's bf16 GPU path: megatron-core's optimizer without a loss scaler, and the NaN guard before it.

In bf16 megatron-core scales nothing and would apply non-finite gradients (it reports success with a NaN norm), so
``MegatronBackend.step`` checks the reduced gradients first and skips the step. Checked on CUDA: bf16 parameters,
log-probs against the HF model within bf16 rounding, updates that apply with no loss scale reported, and a NaN
update (the fire drill, through the schedule's losses) leaving the bf16 weights, the fp32 main copies and the Adam
state bit for bit, or stopping the run under the strict policy (bf16's default).
"""

import pytest
import torch

from tests.special_gpu.checks import (
    NEEDS_CUDA,
    assert_bitwise_equal,
    half_precision_bound,
    num_optimizer_state_tensors,
    training_state,
)
from tests.workers.actor.conftest import actor_config, megatron_world_of_one, ppo_batch, tiny_qwen2  # noqa: F401
from verl.workers.update_outcome import UpdateFailedError

pytestmark = [pytest.mark.gpu, NEEDS_CUDA, pytest.mark.usefixtures("megatron_world_of_one")]


def bf16_actor(hf_model=None, **overrides):
    from verl.workers.actor.megatron_builder import build_megatron_actor

    hf_model = hf_model if hf_model is not None else tiny_qwen2(seed=0)
    config = actor_config(
        strategy="megatron", dtype="bfloat16", megatron={"use_megatron_optimizer": True}, seed=1, **overrides
    )
    return build_megatron_actor(
        hf_model.config, config, device="cuda", total_training_steps=100, hf_state_dict=hf_model.state_dict()
    )


def cuda_batch(actor):
    batch = ppo_batch().to("cuda")
    batch.batch["old_log_probs"], _ = actor.compute_log_prob(batch)
    return batch


def test_bf16_log_probs_follow_the_hf_model_within_bf16_rounding(figure):
    from verl.workers.actor.dp_actor import build_dp_actor

    hf_model = tiny_qwen2(seed=0)
    actor = bf16_actor(hf_model)
    assert actor.training_path.startswith("GPU path")
    assert {p.dtype for p in actor.model_module().parameters()} == {torch.bfloat16}
    got, _ = actor.compute_log_prob(ppo_batch().to("cuda"))
    batch = ppo_batch()
    want, _ = build_dp_actor(actor_config(), hf_model, total_training_steps=1).compute_log_prob(batch)
    mask = batch.batch["response_mask"].bool()
    difference = figure("bf16_log_prob_max_abs_diff", float((got.cpu() - want)[mask].abs().max()))
    bound = half_precision_bound(want[mask], torch.bfloat16, num_roundings=16)  # log-probs of order 3.5: 0.22
    assert 0 < difference <= bound, f"{difference} not in (0, {bound}]"


def test_bf16_updates_apply_without_a_loss_scale_and_lower_the_loss(figure):
    actor = bf16_actor()
    batch = cuda_batch(actor)
    metrics = [actor.update_policy(batch).metrics for _ in range(10)]
    assert [m["actor/update_failed"] for m in metrics] == [0.0] * 10
    assert all(m.get("actor/loss_scale") is None for m in metrics)  # no dynamic scaling in bf16
    losses = [m["actor/pg_loss"] for m in metrics]
    figure("bf16_pg_loss_drop", losses[0] - losses[-1])
    assert losses[-1] < losses[0]


def test_a_nan_bf16_update_is_skipped_before_megatron_core_applies_it(figure):
    actor = bf16_actor(
        update_failure_policy="fp16_warn_and_count", fault_injection={"nonfinite_grad_steps": [3], "ranks": [0]}
    )
    batch = cuda_batch(actor)
    results = [actor.update_policy(batch).metrics for _ in range(2)]
    before = training_state(actor.model_module(), actor.optimizer)
    assert num_optimizer_state_tensors(before) > 0
    results.append(actor.update_policy(batch).metrics)  # update 3: NaN losses through the schedule
    assert_bitwise_equal(before, training_state(actor.model_module(), actor.optimizer))
    results.append(actor.update_policy(batch).metrics)
    assert [m["actor/update_failed"] for m in results] == [0.0, 0.0, 1.0, 0.0]
    figure("bf16_failed_updates", sum(m["actor/update_failed"] for m in results))


def test_a_nan_bf16_update_stops_the_run_under_the_strict_default():
    actor = bf16_actor(fault_injection={"nonfinite_grad_steps": [1], "ranks": [0]})  # auto: strict outside fp16
    with pytest.raises(UpdateFailedError, match="step 1"):
        actor.update_policy(cuda_batch(actor))
