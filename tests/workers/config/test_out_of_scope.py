"""verl's out-of-scope features are refused by name with the reason (verl/workers/config/out_of_scope.py), and the
off switches verl's scripts set start."""

import pytest

from verl.workers.config.out_of_scope import (
    DistillationConfig,
    TransferQueueConfig,
    command_line_refusals,
    model_engine_message,
    out_of_scope_message,
    override_message,
)
from verl.workers.config.schema import build_config


@pytest.mark.parametrize("cls, switch", [(TransferQueueConfig, "enable"), (DistillationConfig, "enabled")])
def test_the_off_switch_starts_and_on_is_refused_by_the_features_name(cls, switch):
    assert getattr(build_config(cls, {switch: False}), switch) is False
    feature = "TransferQueue" if cls is TransferQueueConfig else "the distillation trainers"
    with pytest.raises(ValueError, match=rf"^{cls.KEY}\.{switch}=true asks for {feature}, which is out of scope"):
        build_config(cls, {switch: True})


def test_any_other_key_of_an_out_of_scope_section_is_refused_by_name_not_as_unknown():
    with pytest.raises(ValueError, match=r"^transfer_queue\.backend asks for TransferQueue.*Remove it\.$"):
        build_config(TransferQueueConfig, {"enable": False, "backend": {"storage_backend": "SimpleStorage"}})
    with pytest.raises(ValueError, match=r"^distillation\.teacher_models asks for the distillation trainers"):
        build_config(DistillationConfig, {"enabled": False, "teacher_models": {}})


@pytest.mark.parametrize(
    "key, feature",
    [
        ("transfer_queue.metrics.enabled", "TransferQueue"),
        ("distillation.distillation_loss.topk", "the distillation trainers"),
        ("actor_rollout_ref.actor.veomni.param_offload", "the VeOmni training engine"),
        ("actor_rollout_ref.ref.veomni.expert_parallel_size", "the VeOmni training engine"),
        ("actor_rollout_ref.actor.engine.tp", "Megatron Lite"),
        ("actor_rollout_ref.actor.fsdp_config.turbo_config.distributed.fully_shard_parallel_size", "FSDP Turbo"),
        ("critic.fsdp.turbo_config.memory.recompute", "FSDP Turbo"),
    ],
)
def test_keys_of_out_of_scope_features_name_the_feature(key, feature):
    message = out_of_scope_message(key)
    assert message.startswith(f"{key} asks for {feature}")
    assert "out of scope here" in message and message.endswith("Remove it from the command line (or the config file).")


@pytest.mark.parametrize(
    "key",
    ["transfer_queue.enable", "distillation.enabled", "actor_rollout_ref.actor.fsdp_config.param_offload", "trainer"],
)
def test_the_off_switches_and_every_other_key_are_not_refused_here(key):
    assert out_of_scope_message(key) is None


@pytest.mark.parametrize("engine", ["veomni", "torchtitan", "automodel"])
def test_out_of_scope_model_engines_are_refused_with_the_two_that_exist(engine):
    message = model_engine_message(engine)
    assert message.startswith(f"model_engine={engine} asks for the ")
    assert message.endswith("Use model_engine=dp or model_engine=megatron.")
    assert model_engine_message("dp") is None and model_engine_message("megatron") is None


@pytest.mark.parametrize(
    "override, start",
    [
        ("model_engine=veomni", "model_engine=veomni asks for the VeOmni training engine"),
        (
            "actor@actor_rollout_ref.actor=mlite_actor",
            "actor@actor_rollout_ref.actor=mlite_actor asks for Megatron Lite",
        ),
        ("critic@critic=torchtitan_critic", "critic@critic=torchtitan_critic asks for the TorchTitan training engine"),
        ("+actor_rollout_ref.actor.fsdp_config.turbo_config.memory.recompute=True", "actor_rollout_ref.actor.fsdp_"),
        ("trainer.device=npu", "trainer.device=npu asks for Ascend NPUs"),
    ],
)
def test_command_line_overrides_of_out_of_scope_features_are_explained(override, start):
    assert override_message(override).startswith(start)


@pytest.mark.parametrize(
    "override",
    ["model_engine=megatron", "actor@actor_rollout_ref.actor=megatron_actor", "trainer.device=cuda", "data.x=1"],
)
def test_overrides_of_what_exists_here_are_left_to_the_other_checks(override):
    assert override_message(override) is None


def test_a_command_line_hears_every_out_of_scope_feature_it_uses_in_its_own_order():
    overrides = [
        "actor_rollout_ref.model.mtp.enable=true",  # not built, but not out of scope: left to the other checks
        "actor_rollout_ref.rollout.name=sglang",
        "+actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=fa3",
        "transfer_queue.enable=true",
        "data.train_batch_size=8",
    ]
    refusals = command_line_refusals(overrides)
    assert len(refusals) == 3
    assert refusals[0].startswith("actor_rollout_ref.rollout.name=sglang: SGLang rollouts are out of scope")
    assert refusals[1].startswith("actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend is set, but SGL")
    assert refusals[2].startswith("transfer_queue.enable=true asks for TransferQueue")


@pytest.mark.parametrize(
    "override",
    [
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=null",  # verl's own default entry
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.max_model_len=4096",
        "transfer_queue.enable=false",
    ],
)
def test_what_runs_here_and_verls_null_defaults_are_not_refused_on_the_command_line(override):
    assert command_line_refusals([override]) == []
