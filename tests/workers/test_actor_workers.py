"""The actor workers outside a worker group (rank 0 of 1): what init_model builds from the trainer config.

The same checks run for both backends: a frozen reference has no optimizer and no update-outcome handler, uses its
own micro-batch size, and before any update gives the actor's own log-probs.
"""

import pytest
import torch

from tests.workers.actor.conftest import megatron_world_of_one  # noqa: F401  (megatron-core's groups)
from tests.workers.built import built_worker
from verl.trainer.main_ppo import worker_classes
from verl.workers.config import compose_ppo_config


@pytest.fixture(params=["dp", "megatron"])
def strategy(request):
    if request.param == "megatron":
        request.getfixturevalue("megatron_world_of_one")
    return request.param


@pytest.fixture
def make_worker(strategy):
    def build(*overrides: str):
        config = compose_ppo_config(
            [f"actor_rollout_ref.actor.strategy={strategy}", "actor_rollout_ref.actor.dtype=float32", *overrides]
        )
        worker = built_worker(worker_classes(strategy)[0], config, 4)
        worker.init_model()
        return worker

    return build


def test_reference_uses_its_own_micro_batch_and_has_no_optimizer(make_worker):
    worker = make_worker(
        "actor_rollout_ref.ref.enable=true",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
    )
    assert worker.ref is not None and worker.ref.optimizer is None and worker.ref.lr_scheduler is None
    # a model that never trains gets no update-failure policy and no gradients either
    assert worker.ref.update_outcome_handler is None
    assert not any(p.requires_grad for p in worker.ref.model_module().parameters())
    # verl's keys: the old-log-prob pass reads actor_rollout_ref.rollout's micro-batch size, the reference its own
    assert worker.config.ref.log_prob_micro_batching().size == 8
    assert worker.config.rollout.log_prob_micro_batching().size == 16
    # The per-rank config turns 16 prompts x 4 samples into 64 samples per mini-batch on the single rank.
    assert worker.actor.config.ppo_mini_batch_size == 64


def test_reference_is_built_only_when_asked_or_needed(make_worker):
    assert make_worker().ref is None  # auto, and the default has no KL loss
    assert make_worker("actor_rollout_ref.actor.use_kl_loss=true").ref is not None


def test_fp16_reference_log_probs_equal_the_untrained_actor(make_worker):
    # The frozen reference (no trainable parameters) must still run under fp16 autocast, and before any update
    # it holds the actor's own weights, so both give the same log-probs.
    from verl.trainer.data_setup import build_data

    worker = make_worker("actor_rollout_ref.actor.dtype=float16", "actor_rollout_ref.actor.use_kl_loss=true")
    prompts = next(build_data(worker.run_config, 1).train_loader)
    samples = worker.generate_sequences(prompts)
    ref = worker.compute_ref_log_prob(samples).batch["ref_log_prob"]
    actor = worker.compute_log_prob(samples).batch["old_log_probs"]
    assert ref.shape == samples.batch["responses"].shape
    assert torch.equal(ref, actor)


def test_worker_log_probs_are_at_the_configured_temperature(make_worker):
    # The worker API alone (generate, then compute_log_prob), no trainer: the temperature comes from the config.
    from verl.trainer.data_setup import build_data

    worker = make_worker("actor_rollout_ref.rollout.temperature=0.7")
    samples = worker.generate_sequences(next(build_data(worker.run_config, 1).train_loader))
    assert samples.meta_info["temperature"] == 0.7
    samples.meta_info.pop("temperature")  # the worker does not depend on the caller passing it on
    got = worker.compute_log_prob(samples).batch["old_log_probs"]
    batch = samples.batch
    num_responses = batch["responses"].shape[-1]
    with torch.no_grad():
        logits = worker.actor.forward_logits(batch["input_ids"], batch["attention_mask"], batch["position_ids"])
    # by hand: response token t is predicted at position P + t - 1; log-prob = log_softmax(logits / 0.7) there
    logits = logits[:, -num_responses - 1 : -1].float()
    responses = batch["responses"][..., None]
    want = torch.log_softmax(logits / 0.7, -1).gather(-1, responses)[..., 0]
    at_one = torch.log_softmax(logits, -1).gather(-1, responses)[..., 0]
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(got[mask], want[mask], atol=1e-4, rtol=1e-4)
    assert (got[mask] - at_one[mask]).abs().max() > 1e-3


def test_a_per_call_temperature_is_kept_for_the_log_probs_of_its_samples(make_worker):
    # Sampling at 0.7 through a prompt batch's meta_info (a per-call override, as validation uses) on a worker
    # configured at 1.0: the output says 0.7, and the log-probs of those samples are taken at 0.7, not at 1.0.
    from verl.trainer.data_setup import build_data

    worker = make_worker()
    prompts = next(build_data(worker.run_config, 1).train_loader)
    prompts.meta_info["temperature"] = 0.7
    samples = worker.generate_sequences(prompts)
    assert worker.config.rollout.temperature == 1.0 and samples.meta_info["temperature"] == 0.7
    at_07 = worker.compute_log_prob(samples).batch["old_log_probs"]
    samples.meta_info["temperature"] = 1.0
    at_one = worker.compute_log_prob(samples).batch["old_log_probs"]
    mask = samples.batch["response_mask"].bool()
    # log_softmax(z / 0.7) differs from log_softmax(z) wherever the logits are not all equal
    assert (at_07[mask] - at_one[mask]).abs().max() > 1e-3


def test_the_dp_models_run_their_cpu_linear_layers_on_onednn_unless_switched_off():
    from verl.utils.cpu_linear import OneDNNLinear
    from verl.workers.dp_workers import DPActorRolloutRefWorker, DPCriticWorker

    def linear_types(module):
        return {type(m) for m in module.modules() if isinstance(m, torch.nn.Linear)}

    def build(role_class, *overrides):
        config = compose_ppo_config(["actor_rollout_ref.actor.dtype=float32", *overrides])
        worker = built_worker(role_class, config, 4)
        worker.init_model()
        return worker

    worker = build(DPActorRolloutRefWorker, "actor_rollout_ref.actor.use_kl_loss=true")
    assert linear_types(worker.actor.model_module()) == linear_types(worker.ref.model_module()) == {OneDNNLinear}
    assert linear_types(build(DPCriticWorker, "algorithm.adv_estimator=gae").critic.critic_module) == {OneDNNLinear}
    off = build(DPActorRolloutRefWorker, "actor_rollout_ref.model.use_onednn_linear=false")
    assert linear_types(off.actor.model_module()) == {torch.nn.Linear}
    critic_off = build(DPCriticWorker, "algorithm.adv_estimator=gae", "critic.model.use_onednn_linear=false")
    assert linear_types(critic_off.critic.critic_module) == {torch.nn.Linear}


@pytest.mark.parametrize(("actor_compile", "ref_compile"), [("true", "false"), ("false", "true")])
def test_the_reference_compiles_as_ref_use_torch_compile_says(monkeypatch, actor_compile, ref_compile):
    import verl.workers.actor.dp_actor as dp_actor

    monkeypatch.setattr(dp_actor, "COMPILE_BACKEND", "eager")  # the wrapping is the point, not inductor's code
    config = compose_ppo_config(
        [
            "actor_rollout_ref.actor.strategy=dp",
            "actor_rollout_ref.ref.enable=true",
            f"actor_rollout_ref.actor.use_torch_compile={actor_compile}",
            f"actor_rollout_ref.ref.use_torch_compile={ref_compile}",
        ]
    )
    worker = built_worker(worker_classes("dp")[0], config, 4)
    worker.init_model()
    # verl's key of its own for the reference: set apart from the actor's, each model gets what its key says
    assert isinstance(worker.actor._call_module, dp_actor.CompiledModuleCall) == (actor_compile == "true")
    assert isinstance(worker.ref._call_module, dp_actor.CompiledModuleCall) == (ref_compile == "true")


def test_ref_use_torch_compile_follows_the_actors_unless_set():
    config = compose_ppo_config(["actor_rollout_ref.actor.use_torch_compile=true"])
    assert config.actor_rollout_ref.ref.use_torch_compile


def test_override_config_builds_the_actor_and_the_reference_from_the_overridden_config(make_worker, strategy):
    # verl's +actor_rollout_ref.model.override_config.<attr>: the tiny model's rms_norm_eps is 1e-6 otherwise
    worker = make_worker(
        "+actor_rollout_ref.model.override_config.rms_norm_eps=0.001", "actor_rollout_ref.ref.enable=true"
    )
    for model in (worker.actor, worker.ref):
        config = model.model_module().config
        eps = config.rms_norm_eps if strategy == "dp" else config.layernorm_epsilon  # megatron's TransformerConfig
        assert eps == 1e-3, (strategy, eps)


def dp_critic_worker(*overrides: str):
    """A GAE run's dp critic worker (fp32), built by init_model."""
    config = compose_ppo_config(
        [
            "algorithm.adv_estimator=gae",
            "actor_rollout_ref.actor.strategy=dp",
            "actor_rollout_ref.actor.dtype=float32",
            *overrides,
        ]
    )
    critic = built_worker(worker_classes("dp")[1], config, 4)
    critic.init_model()
    return critic


def test_the_critic_builds_its_value_model_from_its_own_overridden_config():
    critic = dp_critic_worker("+critic.model.override_config.rms_norm_eps=0.001")
    assert critic.critic.model_module().backbone.config.rms_norm_eps == 1e-3


def test_the_passes_that_do_not_train_run_without_dropout_and_leave_the_actor_training(make_worker, strategy):
    # a model with dropout on (0.5 everywhere it applies): the old log-probs and the reference's are those of the
    # model in eval mode, as the rollout that sampled the responses ran it, so two passes agree to the bit; the
    # actor goes back to train mode for its update (whose forward passes keep their dropout)
    from verl.trainer.data_setup import build_data

    dropout = (
        "+actor_rollout_ref.model.override_config.attention_dropout=0.5"
        if strategy == "dp"
        else "+actor_rollout_ref.actor.megatron.override_transformer_config.hidden_dropout=0.5"
    )
    worker = make_worker(dropout, "actor_rollout_ref.actor.use_kl_loss=true")
    samples = worker.generate_sequences(next(build_data(worker.run_config, 1).train_loader))
    first = worker.compute_log_prob(samples).batch["old_log_probs"]
    again = worker.compute_log_prob(samples).batch["old_log_probs"]
    assert torch.equal(first, again)
    ref = worker.compute_ref_log_prob(samples).batch["ref_log_prob"]
    assert torch.equal(ref, first)  # before any update the reference is the actor
    assert worker.actor.model_module().training


def test_the_critics_values_run_without_dropout_and_leave_it_training():
    # as the actor's passes above: the values GAE reads are the critic's in eval mode, equal from pass to pass
    from verl.trainer.data_setup import build_data

    actor = built_worker(worker_classes("dp")[0], compose_ppo_config(["actor_rollout_ref.actor.strategy=dp"]), 4)
    actor.init_model()
    samples = actor.generate_sequences(next(build_data(actor.run_config, 1).train_loader))
    critic = dp_critic_worker("+critic.model.override_config.attention_dropout=0.5")
    first = critic.compute_values(samples).batch["values"]
    assert torch.equal(first, critic.compute_values(samples).batch["values"])
    assert critic.critic.model_module().training


def test_the_worker_follows_the_run_plan_it_is_given():
    import dataclasses

    from verl.workers.config.plan import build_run_plan

    config = compose_ppo_config(["actor_rollout_ref.actor.strategy=dp", "actor_rollout_ref.actor.use_kl_loss=true"])
    # built by hand: the plan comes from the config, with the step count given
    assert built_worker(worker_classes("dp")[0], config, 7).plan.total_training_steps == 7
    plan = dataclasses.replace(build_run_plan(config), total_training_steps=4)
    assert plan.needs_reference  # the KL loss needs one
    # the driver's plan decides, not the config's properties: a plan without a reference builds none
    worker = worker_classes("dp")[0](config.actor_rollout_ref, dataclasses.replace(plan, needs_reference=False))
    worker.init_model()
    assert worker.ref is None


def test_the_worker_profiles_generation_in_a_token_window_and_runs_the_finish_hook_after_the_last_window(tmp_path):
    # verl's profile script's shape on one rank: the actor's window trace, the rollout's own trace of generation
    # (discrete) narrowed to response tokens [1, 3), and a finish hook after the last window
    import json

    from verl.trainer.data_setup import build_data

    R = "actor_rollout_ref.rollout.profiler"
    config = compose_ppo_config(
        [
            "actor_rollout_ref.actor.strategy=dp",
            "global_profiler.tool=torch",
            "global_profiler.steps=[1]",
            f"global_profiler.save_path={tmp_path}",
            f"global_profiler.finish_hook_cmd='echo $VERL_PROFILE_ROLE $VERL_PROFILE_RANK > {tmp_path}/hook'",
            "actor_rollout_ref.actor.profiler.enable=true",
            "actor_rollout_ref.actor.profiler.ranks=[0]",
            f"{R}.tool_config.torch.discrete=true",
            f"{R}.tool_config.torch.profile_token_start=1",
            f"{R}.tool_config.torch.profile_token_end=3",
        ]
    )
    worker = built_worker(worker_classes("dp")[0], config, 4)
    worker.init_model()
    prompts = next(build_data(config, 1).train_loader)
    worker.start_profile(1)
    samples = worker.generate_sequences(prompts)
    worker.compute_log_prob(samples)
    written = [path.rsplit("/", 1)[-1] for path in worker.stop_profile(True)]
    assert written == ["actor_rollout_ref_rank0_step1_gen.json", "actor_rollout_ref_rank0_step1.json"]
    assert (tmp_path / "hook").read_text().split() == ["actor_rollout_ref", "0"]
    # generation is the rollout's (its token window opened by the naive rollout's loop), out of the window's trace
    gen = {event.get("name") for event in json.loads((tmp_path / written[0]).read_text())["traceEvents"]}
    window = {event.get("name") for event in json.loads((tmp_path / written[1]).read_text())["traceEvents"]}
    assert "aten::softmax" in gen or "aten::_softmax" in gen  # the sampler's, token by token
    assert "old_log_prob" in window and "gen" not in window
