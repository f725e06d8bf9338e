"""GPU checks of the megatron actor with megatron-core's own optimizer, DDP and schedules (fp16 from 2**32).

The loss-scale sequence of the warm-up step by step, a failed update leaving the fp16 weights, the fp32 main copies
and the Adam moments bit for bit, the strict policy, log-probs against the HF model and a checkpoint round trip.
Run by tests/special_gpu/run_all.sh on a machine with a CUDA device; skipped elsewhere.
"""

import pytest
import torch

from tests.special_gpu.checks import assert_bitwise_equal, num_optimizer_state_tensors, training_state
from tests.workers.actor.conftest import actor_config, megatron_world_of_one, ppo_batch, tiny_qwen2  # noqa: F401
from verl.workers.actor.megatron_backend import MegatronScheduleBackend
from verl.workers.update_outcome import FP16WarnAndCountHandler, UpdateFailedError

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.usefixtures("megatron_world_of_one"),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def gpu_actor(hf_model=None, dtype="float16", distributed_optimizer=False, **overrides):
    from verl.workers.actor.megatron_builder import build_megatron_actor

    hf_model = hf_model or tiny_qwen2(seed=0)
    megatron = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "use_megatron_optimizer": True}
    megatron["use_distributed_optimizer"] = distributed_optimizer
    config = actor_config(strategy="megatron", dtype=dtype, megatron=megatron, seed=1, **overrides)
    return build_megatron_actor(
        hf_model.config, config, device="cuda", total_training_steps=100, hf_state_dict=hf_model.state_dict()
    )


def cuda_batch(actor):
    batch = ppo_batch().to("cuda")
    batch.batch["old_log_probs"], _ = actor.compute_log_prob(batch)
    return batch


def test_megatron_core_optimizer_passes_its_fp16_warm_up_then_trains(figure):
    actor = gpu_actor()
    assert isinstance(actor.backend, MegatronScheduleBackend) and actor.training_path.startswith("GPU path")
    assert isinstance(actor.update_outcome_handler, FP16WarnAndCountHandler)
    batch = cuda_batch(actor)
    failed, losses, scales = [], [], []
    for _ in range(40):
        metrics = actor.update_policy(batch).metrics  # must not raise under the default policy
        failed.append(metrics["actor/update_failed"])
        losses.append(metrics["actor/pg_loss"])
        scales.append(metrics["actor/loss_scale"])
    assert scales[0] == 2.0**32 and failed[0] == 1.0
    first_success = failed.index(0.0)
    assert metrics["actor/update_failures_total"] >= first_success >= 1
    figure("megatron_fp16_warm_up_num_skipped_updates", first_success)
    figure("megatron_fp16_first_applied_loss_scale", scales[first_success])
    # megatron-core's DynamicGradScaler (hysteresis 2): 2**32, 2**32, 2**31, 2**30, ... until an update fits
    assert scales[: first_success + 1] == [2.0**32] + [2.0 ** (32 - k) for k in range(first_success)]
    assert failed[:first_success] == [1.0] * first_success
    assert failed[-5:] == [0.0] * 5
    assert losses[-1] < losses[first_success]


def test_strict_raises_on_the_first_overflow():
    actor = gpu_actor(update_failure_policy="strict")
    with pytest.raises(UpdateFailedError, match="actor update failed at step 1: gradient overflow"):
        actor.update_policy(cuda_batch(actor))


def test_fire_drill_through_the_megatron_schedule():
    # On this path the drill poisons the losses of update 30 (before DDP's reduction, so every data-parallel rank
    # would see it); the NaN gradients must be caught by megatron-core's own inf check and the update skipped,
    # leaving the fp16 weights, the fp32 main copies, the moments and the step counts bit for bit.
    actor = gpu_actor(fault_injection={"nonfinite_grad_steps": [30], "ranks": [0]})
    assert actor.backend.fire_drill_target == "loss"
    batch = cuda_batch(actor)
    results = [actor.update_policy(batch).metrics["actor/update_failed"] for _ in range(29)]
    assert results[-1] == 0.0  # the warm-up is over: updates apply
    before = training_state(actor.model_module(), actor.optimizer)
    assert num_optimizer_state_tensors(before) > 0
    results.append(actor.update_policy(batch).metrics["actor/update_failed"])
    assert_bitwise_equal(before, training_state(actor.model_module(), actor.optimizer))
    results.append(actor.update_policy(batch).metrics["actor/update_failed"])
    assert results[-2] == 1.0 and results[-1] == 0.0


def test_log_probs_equal_the_hf_model_in_fp32():
    # megatron-core's CUDA layer spec must honour the padding mask: rows 0 (left pad) and 1 (right pad) of
    # ppo_batch would differ from the HF model otherwise.
    from verl.workers.actor.dp_actor import build_dp_actor

    hf_model = tiny_qwen2(seed=0)
    actor = gpu_actor(hf_model, dtype="float32")
    batch = ppo_batch()
    # DataProto.to moves the batch in place: the CUDA copy is a batch of its own, the HF model reads the CPU one
    got, _ = actor.compute_log_prob(ppo_batch().to("cuda"))
    want, _ = build_dp_actor(actor_config(), hf_model, total_training_steps=1).compute_log_prob(batch)
    assert batch.batch["input_ids"].device.type == "cpu"
    mask = batch.batch["response_mask"].bool()
    torch.testing.assert_close(got.cpu()[mask], want[mask], atol=1e-3, rtol=1e-3)


def test_checkpoint_restores_megatron_loss_scaler_and_handler(tmp_path):
    from verl.utils.checkpoint import atomic_directory

    actor = gpu_actor()
    batch = cuda_batch(actor)
    for _ in range(20):
        actor.update_policy(batch)
    with atomic_directory(tmp_path / "ckpt") as tmp:
        actor.save_checkpoint(tmp)
    restored = gpu_actor(tiny_qwen2(seed=7))
    restored.load_checkpoint(tmp_path / "ckpt")
    assert float(restored.optimizer.get_loss_scale()) == float(actor.optimizer.get_loss_scale()) < 2.0**32
    assert restored.update_outcome_handler.state_dict() == actor.update_outcome_handler.state_dict()
    # the restored fp32 main weights must be the trained ones: the next update of both is the same
    torch.testing.assert_close(restored.compute_log_prob(batch)[0], actor.compute_log_prob(batch)[0])
    assert (
        restored.update_policy(batch).metrics["actor/update_failed"]
        == actor.update_policy(batch).metrics["actor/update_failed"]
    )


def test_a_distributed_optimizer_checkpoint_resumes_its_main_weights_and_moments(tmp_path):
    # megatron-core's distributed optimizer keeps the fp32 main weights and the moments out of its state_dict(): a
    # checkpoint must carry them (distrib_optim.pt), or the first step after a resume copies the restored model's
    # main weights from the freshly built ones and steps with uninitialised moments. bf16: every update applies.
    from verl.utils.checkpoint import atomic_directory
    from verl.workers.actor.megatron_checkpoint import DISTRIBUTED_OPTIMIZER_FILE

    actor = gpu_actor(dtype="bfloat16", distributed_optimizer=True)
    batch = cuda_batch(actor)
    for _ in range(3):
        assert actor.update_policy(batch).metrics["actor/update_failed"] == 0.0
    with atomic_directory(tmp_path / "ckpt") as tmp:
        actor.save_checkpoint(tmp)
    assert (tmp_path / "ckpt" / DISTRIBUTED_OPTIMIZER_FILE).is_file()
    restored = gpu_actor(tiny_qwen2(seed=7), dtype="bfloat16", distributed_optimizer=True)
    restored.load_checkpoint(tmp_path / "ckpt")
    torch.testing.assert_close(restored.compute_log_prob(batch)[0], actor.compute_log_prob(batch)[0])
    # the same next update: the same main weights and moments (seed 7's weights or empty moments would differ)
    for model in (actor, restored):
        assert model.update_policy(batch).metrics["actor/update_failed"] == 0.0
    torch.testing.assert_close(restored.compute_log_prob(batch)[0], actor.compute_log_prob(batch)[0])


def test_fused_kernels_through_the_megatron_schedule_match_the_plain_logits():
    # model.use_fused_kernels on the GPU path: megatron-core's schedule runs the model, whose output layer computes
    # the log-probs chunk by chunk; bf16 (no loss-scale warm-up), so the first update applies on both
    plain = gpu_actor(dtype="bfloat16", entropy_coeff=0.01)
    fused = gpu_actor(dtype="bfloat16", entropy_coeff=0.01, use_fused_kernels=True)
    batch = cuda_batch(plain)
    got, _ = fused.compute_log_prob(batch)
    # the same bf16 products in both; only the fp32 softmax sums are grouped by chunk
    torch.testing.assert_close(got, batch.batch["old_log_probs"], atol=2e-2, rtol=0)
    plain_metrics, fused_metrics = plain.update_policy(batch).metrics, fused.update_policy(batch).metrics
    assert plain_metrics["actor/update_failed"] == fused_metrics["actor/update_failed"] == 0.0
    assert fused_metrics["actor/grad_norm"] == pytest.approx(plain_metrics["actor/grad_norm"], rel=2e-2)
