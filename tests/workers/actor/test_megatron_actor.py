"""MegatronPPOActor on CPU: the real megatron-core GPTModel under the shared loop and step contract."""

import dataclasses

import pytest
import torch

from tests.workers.actor.conftest import actor_config, ppo_batch, tiny_qwen2
from verl.utils.checkpoint import atomic_directory
from verl.workers.actor.dp_actor import build_dp_actor
from verl.workers.actor.megatron_backend import MegatronBackend
from verl.workers.actor.megatron_builder import build_megatron_actor
from verl.workers.actor.update_loop import build_loop_parts
from verl.workers.update_outcome import FP16WarnAndCountHandler, UpdateFailedError

pytestmark = pytest.mark.usefixtures("megatron_world_of_one")


def megatron_config(**overrides):
    megatron = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "use_megatron_optimizer": "auto"}
    megatron.update(overrides.pop("megatron", {}))
    return actor_config(strategy="megatron", megatron=megatron, seed=1, **overrides)


def make_megatron_actor(hf_model=None, **overrides):
    hf_model = hf_model or tiny_qwen2(seed=0)
    return build_megatron_actor(
        hf_model.config,
        megatron_config(**overrides),
        device="cpu",
        total_training_steps=100,
        hf_state_dict=hf_model.state_dict(),
    )


def with_old_log_probs(actor):
    batch = ppo_batch()
    batch.batch["old_log_probs"], _ = actor.compute_log_prob(batch)
    return batch


class ScriptedOptimizer:
    """The real AmpOptimizer, except that chosen steps report (False, None, None) and apply nothing."""

    def __init__(self, inner, failing_steps):
        self.inner, self.failing_steps, self.num_steps = inner, set(failing_steps), 0

    def step(self):
        self.num_steps += 1
        if self.num_steps in self.failing_steps:
            return False, None, None
        return self.inner.step()

    def __getattr__(self, name):
        return getattr(self.inner, name)


def script_failures(actor, failing_steps):
    """Give ``actor`` (and its backend, which took the optimizer when the actor was built) a ScriptedOptimizer."""
    actor.optimizer = ScriptedOptimizer(actor.optimizer, failing_steps)
    actor.backend.attach(dataclasses.replace(actor.backend.parts, optimizer=actor.optimizer))


def test_training_path_is_the_cpu_adapter():
    actor = make_megatron_actor()
    assert actor.training_path.startswith("CPU path") and type(actor.backend) is MegatronBackend


def test_log_probs_equal_the_dp_actor_on_the_same_weights():
    hf_model = tiny_qwen2(seed=0)
    megatron = make_megatron_actor(hf_model)
    dp = build_dp_actor(actor_config(), hf_model, total_training_steps=1)
    batch = ppo_batch()
    got, _ = megatron.compute_log_prob(batch)
    want, _ = dp.compute_log_prob(batch)
    mask = batch.batch["response_mask"].bool()
    torch.testing.assert_close(got[mask], want[mask], atol=1e-4, rtol=1e-4)


def test_real_fp16_overflow_is_absorbed_then_training_works():
    # auto + float16 -> fp16_warn_and_count. The loss scale starts at 2**32: the fp16 backward through the real
    # GPTModel overflows, the scaler halves (after hysteresis 2) until the gradients fit, and each of those
    # failures is absorbed (scale > floor 1.0), so nothing raises although there are more than 10 in a row.
    actor = make_megatron_actor(dtype="float16")
    assert isinstance(actor.update_outcome_handler, FP16WarnAndCountHandler)
    batch = with_old_log_probs(actor)
    failed, losses, scales = [], [], []
    for _ in range(30):
        metrics = actor.update_policy(batch).metrics
        failed.append(metrics["actor/update_failed"])
        losses.append(metrics["actor/pg_loss"])
        scales.append(metrics["actor/loss_scale"])
    first_success = failed.index(0.0)
    assert scales[0] == 2.0**32 and scales[first_success] < 2.0**32
    assert first_success >= 2 and failed[:first_success] == [1.0] * first_success
    assert metrics["actor/update_failures_total"] == sum(failed)
    assert failed[-5:] == [0.0] * 5
    assert losses[-1] < losses[first_success] - 0.05


def test_strict_raises_on_the_first_scripted_failure():
    actor = make_megatron_actor(update_failure_policy="strict")
    script_failures(actor, failing_steps=[2])
    batch = with_old_log_probs(actor)
    actor.update_policy(batch)  # step 1 applies
    with pytest.raises(UpdateFailedError, match="actor update failed at step 2: non-finite gradients"):
        actor.update_policy(batch)


def optimizer_snapshot(actor):
    """Weights, Adam moments and Adam's step counts, cloned."""
    weights = {k: v.clone() for k, v in actor.model_module().state_dict().items() if isinstance(v, torch.Tensor)}
    adam_state = actor.optimizer.inner.optimizer.state_dict()["state"]
    moments = {(pid, key): v.clone() for pid, state in adam_state.items() for key, v in state.items()}
    return weights, moments


def assert_bitwise_equal(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_fp16_policy_skips_counts_and_raises_exactly_at_its_limit():
    # fp32, so loss_scale is None and no failure is absorbed; limit 2. Optimizer steps 2, 3 and 4 fail:
    # step 2 -> consecutive 1 (<= 2, skipped), step 3 -> consecutive 2 (<= 2, skipped), step 4 -> consecutive 3,
    # more than 2 -> raise at step 4. One update_policy call is one step (8 samples, mini-batch 8, one epoch).
    actor = make_megatron_actor(update_failure_policy={"name": "fp16_warn_and_count", "max_consecutive_failures": 2})
    script_failures(actor, failing_steps=[2, 3, 4])
    batch = with_old_log_probs(actor)
    actor.update_policy(batch)  # step 1 applies, so Adam has moments and a step count of 1
    weights, moments = optimizer_snapshot(actor)
    lr_epoch = actor.lr_scheduler.last_epoch
    metrics = [actor.update_policy(batch).metrics for _ in range(2)]
    assert [m["actor/update_failures_consecutive"] for m in metrics] == [1.0, 2.0]
    assert [m["actor/update_failures_total"] for m in metrics] == [1.0, 2.0]
    assert [m["actor/update_failed"] for m in metrics] == [1.0, 1.0]
    # skipped steps leave weights, moments and Adam's step count bit for bit, and the LR schedule where it was
    after_weights, after_moments = optimizer_snapshot(actor)
    assert_bitwise_equal(weights, after_weights)
    assert_bitwise_equal(moments, after_moments)
    assert actor.lr_scheduler.last_epoch == lr_epoch
    with pytest.raises(UpdateFailedError, match="step 4.*max_consecutive_failures=2"):
        actor.update_policy(batch)


def test_a_success_resets_the_consecutive_count():
    # limit 2, failures at steps 2, 3, 5, 6: the success at step 4 resets the count, so the run never has more
    # than 2 consecutive failures -> no raise; totals 1, 2, (success), 3, 4; consecutive 1, 2, 0, 1, 2.
    actor = make_megatron_actor(update_failure_policy={"name": "fp16_warn_and_count", "max_consecutive_failures": 2})
    script_failures(actor, failing_steps=[2, 3, 5, 6])
    batch = with_old_log_probs(actor)
    metrics = [actor.update_policy(batch).metrics for _ in range(6)][1:]
    assert [m["actor/update_failures_consecutive"] for m in metrics] == [1.0, 2.0, 0.0, 1.0, 2.0]
    assert [m["actor/update_failures_total"] for m in metrics] == [1.0, 2.0, 2.0, 3.0, 4.0]


def test_metric_names_match_the_dp_actor():
    hf_model = tiny_qwen2(seed=0)
    megatron = make_megatron_actor(hf_model, dtype="float16")
    dp = build_dp_actor(actor_config(dtype="float16"), hf_model, total_training_steps=1)
    batch = with_old_log_probs(dp)
    assert set(megatron.update_policy(batch).metrics) == set(dp.update_policy(batch).metrics)


def test_checkpoint_restores_loss_scaler_and_handler(tmp_path):
    actor = make_megatron_actor(dtype="float16")
    batch = with_old_log_probs(actor)
    for _ in range(5):
        actor.update_policy(batch)
    with atomic_directory(tmp_path / "ckpt") as tmp:
        actor.save_checkpoint(tmp)
    restored = make_megatron_actor(tiny_qwen2(seed=7), dtype="float16")
    restored.load_checkpoint(tmp_path / "ckpt")
    assert restored.optimizer.get_loss_scale() == actor.optimizer.get_loss_scale() < 2.0**32
    assert restored.update_outcome_handler.state_dict() == actor.update_outcome_handler.state_dict()
    assert restored.num_update_steps == 5
    for key, value in actor.model_module().state_dict().items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, restored.model_module().state_dict()[key]), key


@pytest.mark.parametrize(
    "megatron, match",
    [
        ({"use_megatron_optimizer": True}, "use_megatron_optimizer=true needs CUDA"),
        (
            {"use_megatron_optimizer": "yes"},
            r"use_megatron_optimizer='yes' has the wrong type: expected bool \| 'auto'",
        ),
        # tensor parallelism runs on CPU, but megatron-core splits heads evenly: 4 heads do not split 3 ways
        ({"tensor_model_parallel_size": 3}, r"tensor_model_parallel_size=3: .* not divisible by 3"),
        (
            {"pipeline_model_parallel_size": 3},
            r"megatron.pipeline_model_parallel_size=3: the model's 2 layers do not share out evenly over 3 pipeline",
        ),
        ({"tensor_model_parallel_size": 0}, "tensor_model_parallel_size must be an integer >= 1, got 0"),
        ({"pipeline_model_parallel_size": -1}, "pipeline_model_parallel_size must be an integer >= 1, got -1"),
    ],
)
def test_invalid_megatron_settings_fail_at_start_up(megatron, match):
    with pytest.raises(ValueError, match=match):
        make_megatron_actor(megatron=megatron)


def test_invalid_dtype_fails_at_start_up():
    with pytest.raises(ValueError, match="actor_rollout_ref.actor.dtype='float8' is not supported"):
        make_megatron_actor(dtype="float8")


def test_a_model_directory_gives_the_same_actor(tmp_path):
    hf_model = tiny_qwen2(seed=0)
    hf_model.save_pretrained(tmp_path / "model")
    from_dir = build_megatron_actor(str(tmp_path / "model"), megatron_config(), device="cpu", total_training_steps=1)
    batch = ppo_batch()
    got, _ = from_dir.compute_log_prob(batch)
    want, _ = make_megatron_actor(hf_model).compute_log_prob(batch)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_megatron_core_optimizer_config_carries_the_fp16_settings():
    # built on CPU to check field names and values; the optimizer itself needs CUDA (tests/special_gpu)
    from verl.workers.actor.megatron_builder import megatron_optimizer_config

    optim = actor_config(optim={"initial_loss_scale": 2.0**16, "loss_scale_window": 50, "hysteresis": 3}).optim
    config = megatron_optimizer_config(optim, torch.float16)
    assert (config.optimizer, config.fp16, config.bf16, config.params_dtype) == ("adam", True, False, torch.float16)
    assert (config.initial_loss_scale, config.min_loss_scale, config.loss_scale_window, config.hysteresis) == (
        2.0**16,
        1.0,
        50,
        3,
    )
    assert (config.lr, config.weight_decay, config.clip_grad, config.use_distributed_optimizer) == (
        1e-2,
        0.0,
        1.0,
        False,
    )
    assert megatron_optimizer_config(optim, torch.bfloat16).bf16
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.optim\.lr must be a number > 0"):
        actor_config(optim={"lr": 0.0})  # a bad value never reaches an optimizer: the config refuses it


class CountingOptimizer:
    """Stands in for megatron-core's bf16 optimizer, which applies whatever gradients it gets and reports success."""

    def __init__(self):
        self.num_steps = 0

    def step(self):
        self.num_steps += 1
        return True, 1.0, 0

    def get_loss_scale(self):
        return torch.tensor(1.0)

    def zero_grad(self):
        pass


@pytest.mark.parametrize("poison", [False, True])
def test_bf16_megatron_core_path_refuses_non_finite_gradients(poison):
    from verl.workers.actor.megatron_actor import MegatronPPOActor

    model = make_megatron_actor().model
    optimizer = CountingOptimizer()
    config = megatron_config(dtype="bfloat16", update_failure_policy="fp16_warn_and_count")
    actor = MegatronPPOActor(
        config,
        model,
        optimizer,
        use_megatron_schedule=True,  # the GPU path's step logic, driven here without CUDA
        **build_loop_parts(config, rank=0),
    )
    for param in model.parameters():
        param.main_grad = torch.ones_like(param)  # where megatron-core's DDP leaves the reduced gradients
    if poison:
        next(iter(model.parameters())).main_grad[0] = float("nan")
    outcome = actor._optimizer_step()
    # A finite bf16 step goes through to the optimizer; a NaN one never reaches it and reports a NaN norm.
    assert optimizer.num_steps == (0 if poison else 1)
    assert outcome.successful is not poison
    assert outcome.loss_scale is None
    if poison:
        assert outcome.grad_norm != outcome.grad_norm and outcome.failure_reason.startswith("non-finite")


def test_fused_kernels_give_the_plain_log_probs_and_update():
    # the fused output layer computes the same float32 products, only a chunk of tokens at a time
    plain, fused = (
        make_megatron_actor(entropy_coeff=0.01),
        make_megatron_actor(entropy_coeff=0.01, use_fused_kernels=True),
    )
    batch = ppo_batch()
    want, want_entropy = plain.compute_log_prob(batch, calculate_entropy=True)
    got, got_entropy = fused.compute_log_prob(batch, calculate_entropy=True)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(got_entropy, want_entropy, atol=1e-5, rtol=0)
    batch.batch["old_log_probs"] = want
    plain_metrics, fused_metrics = plain.update_policy(batch).metrics, fused.update_policy(batch).metrics
    assert fused_metrics["actor/grad_norm"] == pytest.approx(plain_metrics["actor/grad_norm"], rel=1e-5)
    torch.testing.assert_close(fused.compute_log_prob(batch)[0], plain.compute_log_prob(batch)[0], atol=1e-5, rtol=0)


def test_the_fused_layer_is_plain_outside_a_request():
    # the rollout decodes through the same model: without a request the layer returns the whole logits
    from verl.models.mcore import forward_logits

    plain, fused = make_megatron_actor(), make_megatron_actor(use_fused_kernels=True)
    batch = ppo_batch()
    args = (batch.batch["input_ids"], batch.batch["attention_mask"], batch.batch["position_ids"])
    assert type(fused.model_module().output_layer).__name__ == "FusedHeadOutputLayer"
    torch.testing.assert_close(forward_logits(fused.model, *args), forward_logits(plain.model, *args))


def test_use_torch_compile_compiles_the_entropy_and_changes_no_number(monkeypatch):
    # what verl compiles on megatron: the entropy of the logits, not megatron-core's forward. The "eager" backend
    # traces and guards as inductor does, without its code generation (minutes on this CPU; inductor fuses the same
    # operations)
    import torch._dynamo.testing

    from verl.utils import torch_functional

    counter = torch._dynamo.testing.CompileCounterWithBackend("eager")
    monkeypatch.setattr(torch_functional, "ENTROPY_COMPILE_BACKEND", counter)
    torch._dynamo.reset()
    plain, compiled = (
        make_megatron_actor(entropy_coeff=0.01),
        make_megatron_actor(entropy_coeff=0.01, use_torch_compile=True),
    )
    batch = ppo_batch()
    want, want_entropy = plain.compute_log_prob(batch, calculate_entropy=True)
    got, got_entropy = compiled.compute_log_prob(batch, calculate_entropy=True)
    assert counter.frame_count == 1  # the entropy's graph; the model ran eagerly
    torch.testing.assert_close(got, want, atol=0, rtol=0)  # the log-probs are not compiled
    torch.testing.assert_close(got_entropy, want_entropy, atol=1e-6, rtol=0)
    batch.batch["old_log_probs"] = want
    plain_metrics, compiled_metrics = plain.update_policy(batch).metrics, compiled.update_policy(batch).metrics
    assert compiled_metrics["actor/entropy"] == pytest.approx(plain_metrics["actor/entropy"], rel=1e-6)
    assert compiled_metrics["actor/grad_norm"] == pytest.approx(plain_metrics["actor/grad_norm"], rel=1e-5)
    assert counter.frame_count == 2  # one graph per grad mode: the log-prob pass runs without gradients
    torch.testing.assert_close(compiled.compute_log_prob(batch)[0], plain.compute_log_prob(batch)[0], atol=1e-6, rtol=0)
    # other batch sizes reuse the two graphs (dynamic shapes)
    compiled.compute_log_prob(ppo_batch(num_samples=6, seed=1), calculate_entropy=True)
    assert counter.frame_count == 2


class _ShardedOptimizerState:
    """Stands in for megatron-core's distributed optimizer (CUDA only): its gathered state, and what it was given."""

    def __init__(self, value):
        self.state = {0: {torch.float32: {"param": torch.full((3,), value), "numel_unpadded": 3}}}
        self.loaded = None

    def get_parameter_state_dp_zero(self):
        return self.state

    def load_parameter_state_from_dp_zero(self, state):
        self.loaded = state


def test_a_distributed_optimizers_state_travels_with_the_checkpoint(tmp_path):
    # megatron-core's distributed optimizer keeps its fp32 main weights and moments out of state_dict(): the
    # checkpoint writes what get_parameter_state_dp_zero gathers (data-parallel rank 0: this one) and hands it back
    # to load_parameter_state_from_dp_zero; under a chain of one sub-optimizer (get_megatron_optimizer's) too
    from types import SimpleNamespace

    from verl.models.mcore.parallel import ensure_model_parallel_initialized
    from verl.workers.actor.megatron_checkpoint import (
        DISTRIBUTED_OPTIMIZER_FILE,
        distributed_optimizer,
        load_distributed_optimizer_state,
        save_distributed_optimizer_state,
    )

    ensure_model_parallel_initialized()  # one rank: data-parallel rank 0

    saved, fresh = _ShardedOptimizerState(7.0), _ShardedOptimizerState(0.0)
    chained = distributed_optimizer(SimpleNamespace(chained_optimizers=[saved]), True)
    assert chained is saved  # the one sub-optimizer of get_megatron_optimizer's chain
    assert save_distributed_optimizer_state(chained, tmp_path, split=False)
    assert (tmp_path / DISTRIBUTED_OPTIMIZER_FILE).is_file()
    load_distributed_optimizer_state(distributed_optimizer(fresh, True), tmp_path, split=False)
    torch.testing.assert_close(fresh.loaded[0][torch.float32]["param"], torch.full((3,), 7.0))
    # without the distributed optimizer: no file, nothing loaded, and this rank writes the rest as before
    assert distributed_optimizer(saved, False) is None and distributed_optimizer(None, True) is None
    assert save_distributed_optimizer_state(distributed_optimizer(saved, False), tmp_path / "plain", split=False)
    assert not (tmp_path / "plain").exists()
