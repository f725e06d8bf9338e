"""verl's config class names (``verl.workers.config.ActorConfig``...): keyword construction over the YAML defaults,
mapping access, verl's start-up rules, and what a section built from the YAML counts as."""

import dataclasses

import pytest

from verl.base_config import BaseConfig
from verl.workers.config import (
    ActorConfig,
    CriticConfig,
    FSDPActorConfig,
    FSDPCriticConfig,
    FSDPEngineConfig,
    FSDPOptimizerConfig,
    HFModelConfig,
    McoreActorConfig,
    McoreCriticConfig,
    McoreEngineConfig,
    McoreOptimizerConfig,
    OptimizerConfig,
    RolloutConfig,
    actor,
    compose_ppo_config,
    critic,
    engine,
    model,
    optimizer,
)
from verl.workers.config.verl_named import section_defaults


def test_verl_module_paths_hold_the_classes():
    assert actor.ActorConfig is ActorConfig and actor.FSDPActorConfig is FSDPActorConfig
    assert actor.McoreActorConfig is McoreActorConfig and critic.CriticConfig is CriticConfig
    assert critic.FSDPCriticConfig is FSDPCriticConfig and critic.McoreCriticConfig is McoreCriticConfig
    assert engine.FSDPEngineConfig is FSDPEngineConfig and engine.McoreEngineConfig is McoreEngineConfig
    assert optimizer.OptimizerConfig is OptimizerConfig and optimizer.FSDPOptimizerConfig is FSDPOptimizerConfig
    assert optimizer.McoreOptimizerConfig is McoreOptimizerConfig and model.HFModelConfig is HFModelConfig


def test_missing_keys_come_from_the_yaml():
    config = ActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=4, optim=OptimizerConfig(lr=0.25), rollout_n=3)
    assert config.ppo_micro_batch_size_per_gpu == 4 and config.optim.lr == 0.25 and config.rollout_n == 3
    # every key not given is the YAML's: one source of defaults
    assert config.clip_ratio == section_defaults("actor_rollout_ref.actor.clip_ratio")
    assert config.optim.weight_decay == section_defaults("actor_rollout_ref.actor.optim.weight_decay")
    assert FSDPActorConfig(ppo_micro_batch_size_per_gpu=1).rollout_n == section_defaults("actor_rollout_ref.rollout.n")
    assert OptimizerConfig().lr == section_defaults("actor_rollout_ref.actor.optim.lr")


def test_variants_fix_the_strategy_and_take_their_files_defaults():
    assert FSDPActorConfig(ppo_micro_batch_size_per_gpu=1).strategy == "fsdp"
    assert McoreActorConfig(ppo_micro_batch_size_per_gpu=1).strategy == "megatron"
    assert McoreCriticConfig(ppo_micro_batch_size_per_gpu=1).strategy == "megatron"
    assert FSDPActorConfig(strategy="fsdp2", ppo_micro_batch_size_per_gpu=1).strategy == "fsdp2"
    # one tensor-parallel rank: nothing to split, sequence_parallel reads false as in verl
    assert McoreEngineConfig(tensor_model_parallel_size=1, sequence_parallel=True).sequence_parallel is False
    assert FSDPEngineConfig(param_offload=True).param_offload is True
    assert HFModelConfig(path="some/model").path == "some/model"
    rollout = RolloutConfig(n=4, temperature=0.7)
    assert rollout.n == 4 and rollout.temperature == 0.7
    assert rollout.top_p == section_defaults("actor_rollout_ref.rollout.top_p")


def test_mapping_access_and_base_config():
    config = FSDPOptimizerConfig(lr=0.5)
    assert isinstance(config, BaseConfig)
    assert config["lr"] == 0.5 and config.get("lr") == 0.5 and config.get("absent", 7) == 7
    assert "lr" in config and "absent" not in config
    assert len(config) == len(list(config)) == len(dataclasses.fields(config))


def test_only_batch_sizes_are_assignable():
    config = ActorConfig(ppo_micro_batch_size_per_gpu=2)
    config.ppo_mini_batch_size = 8
    assert config.ppo_mini_batch_size == 8
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.clip_ratio = 0.5


def test_verls_micro_batch_rules():
    with pytest.raises(ValueError, match="both"):
        ActorConfig(ppo_micro_batch_size=4, ppo_micro_batch_size_per_gpu=2)
    with pytest.raises(ValueError, match="at least one"):
        ActorConfig(ppo_micro_batch_size_per_gpu=None)
    assert ActorConfig(ppo_micro_batch_size_per_gpu=None, use_dynamic_bsz=True).use_dynamic_bsz is True
    with pytest.raises(ValueError, match="divisible"):  # 8 % 3 = 2
        CriticConfig(ppo_micro_batch_size=3, ppo_mini_batch_size=8)
    with pytest.raises(ValueError, match="Invalid loss_agg_mode"):
        ActorConfig(ppo_micro_batch_size_per_gpu=1, loss_agg_mode="per-sequence")
    with pytest.raises(TypeError, match="bogus"):
        ActorConfig(bogus=1)


def test_validate_checks_sizes_against_the_run():
    config = FSDPActorConfig(ppo_micro_batch_size=2, ppo_mini_batch_size=8)
    config.validate(n_gpus=2, train_batch_size=8)  # 8 >= 8, 8 % 2 == 0, 2 * 1 >= 2: fine
    with pytest.raises(ValueError, match="train_batch_size"):
        config.validate(n_gpus=2, train_batch_size=4)
    with pytest.raises(ValueError, match="n_gpus"):  # 2 micro-batch rows for 4 GPUs
        config.validate(n_gpus=4, train_batch_size=8)


def test_optimizer_schedule_names_are_one_setting():
    config = OptimizerConfig(lr_scheduler_type="cosine")
    assert config.lr_scheduler == config.lr_scheduler_type == "cosine"
    with pytest.raises(ValueError, match="one schedule"):
        OptimizerConfig(lr_scheduler_type="cosine", lr_scheduler="constant")


def test_sections_built_from_the_yaml_count_as_verl_classes():
    config = compose_ppo_config(["actor_rollout_ref.actor.strategy=fsdp"])
    built = config.actor_rollout_ref.actor
    assert isinstance(built, ActorConfig) and isinstance(built, FSDPActorConfig)
    assert not isinstance(built, McoreActorConfig)
    assert isinstance(config.actor_rollout_ref.rollout, RolloutConfig)


def test_nested_sections_are_verl_classes_with_their_roles_defaults():
    config = ActorConfig(ppo_micro_batch_size_per_gpu=1, optim={"lr_scheduler_type": "cosine"})
    assert isinstance(config.optim, OptimizerConfig) and config.optim["lr_scheduler"] == "cosine"
    assert isinstance(config.fsdp_config, FSDPEngineConfig) and isinstance(config.megatron, McoreEngineConfig)
    # the critic's optimizer takes the critic's defaults, not the actor's
    assert CriticConfig(ppo_micro_batch_size_per_gpu=1).optim.lr == section_defaults("critic.optim.lr")


def test_verls_class_defaults_where_verls_yaml_differs():
    # verl's FSDPOptimizerConfig leaves min_lr_ratio None (its YAML: 0.0); McoreOptimizerConfig names megatron's adam
    assert FSDPOptimizerConfig(lr=0.1).min_lr_ratio is None
    assert OptimizerConfig(lr=0.1).min_lr_ratio == section_defaults("actor_rollout_ref.actor.optim.min_lr_ratio")
    assert FSDPOptimizerConfig(lr=0.1, min_lr_ratio=0.1).min_lr_ratio == 0.1
    assert McoreOptimizerConfig(lr=0.1).optimizer == "adam"
    assert FSDPOptimizerConfig(lr=0.1).optimizer == section_defaults("actor_rollout_ref.actor.optim.optimizer")
    # the cosine schedule's waves: verl's 0.5 from the YAML, any number > 0 given
    assert FSDPOptimizerConfig(lr=0.1).num_cycles == 0.5
    assert FSDPOptimizerConfig(lr=0.1, num_cycles=2.5).num_cycles == 2.5
    with pytest.raises(ValueError, match="num_cycles"):
        FSDPOptimizerConfig(lr=0.1, num_cycles=-1.0)


def test_model_target_modules_merge_through_omegaconf_and_are_type_checked():
    from omegaconf import OmegaConf

    # the defaults live in the YAML, so the structured class has every key missing; a list or a name merges over it
    structured = OmegaConf.structured(HFModelConfig)
    assert OmegaConf.is_missing(structured, "lora_rank")
    merged = OmegaConf.merge(structured, {"path": "some/model", "target_modules": ["q_proj", "v_proj"]})
    assert list(merged.target_modules) == ["q_proj", "v_proj"]
    assert HFModelConfig(path="some/model", target_modules=["q_proj"]).target_modules == ["q_proj"]
    assert HFModelConfig(path="some/model", exclude_modules=None).exclude_modules is None
    with pytest.raises(TypeError, match="target_modules must be a string or a list of strings"):
        HFModelConfig(path="some/model", target_modules=[1, 2])
    with pytest.raises(TypeError, match="exclude_modules"):
        HFModelConfig(path="some/model", exclude_modules=3)


def test_verls_profiler_config_import_path_is_the_config_sections_class():
    # verl's code imports it from verl.utils.profiler; it lives a layer below the config package so that verl.utils
    # may hold it, and is the very class a role's profiler section is built as
    from verl.utils.profiler import ProfilerConfig
    from verl.workers.config import load_section
    from verl.workers.config.roles import ActorConfig

    assert isinstance(load_section(ActorConfig).profiler, ProfilerConfig)
