"""The per-role engine keys of verl's current scripts (verl 1dda039): each has verl's default here, does what it does
in verl where this project has the feature, and is refused by its full key when it asks for one it lacks.

Most cases change the composed default config in memory (as a Hydra override does) and validate it against the
defaults, so that the YAML composes once per module; the open-mapping spellings go through Hydra.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from verl.workers.config import PPOConfig, compose_omegaconf, compose_with_defaults
from verl.workers.config.loading import CONFIG_DIR

A = "actor_rollout_ref.actor"
R = "actor_rollout_ref.ref"
RO = "actor_rollout_ref.rollout"


@pytest.fixture(scope="module")
def default():
    return compose_with_defaults()


@pytest.fixture(scope="module")
def megatron_default():
    # trainer.device=cuda: the driver leaves the CUDA-only checks to the workers, as in test_megatron_config
    return compose_with_defaults(["trainer.device=cuda"], config_name="ppo_megatron_trainer")


def validate(composed, changes: dict[str, Any]) -> PPOConfig:
    """``composed``'s config with ``changes`` (dotted key -> value) set, validated against its defaults."""
    config = copy.deepcopy(composed.config)
    for key, value in changes.items():
        OmegaConf.update(config, key, value, merge=False)
    return PPOConfig.from_omegaconf(config, defaults=composed.defaults)


# ---------------------------------------------------------------------------------------------- defaults


def test_the_new_keys_have_verls_defaults(default):
    cfg = validate(default, {})
    actor, ref, critic = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.ref, cfg.critic
    # verl's engine/fsdp.yaml: fsdp_size -1, offload_policy false, ulysses 1, entropy_checkpointing false, fsdp
    for fsdp in (actor.fsdp_config, ref.fsdp_config, critic.model.fsdp_config):
        assert (fsdp.fsdp_size, fsdp.offload_policy, fsdp.ulysses_sequence_parallel_size) == (-1, False, 1)
        assert (fsdp.entropy_checkpointing, fsdp.strategy) == (False, "fsdp")
    assert ref.fsdp_config.optimizer_offload is False and ref.entropy_checkpointing is False
    assert (critic.fsdp.param_offload, critic.fsdp.optimizer_offload) == (False, False)
    # verl's engine/megatron.yaml: packed sequences on, engine dtype null (the role's), Megatron-FSDP off
    for megatron in (actor.megatron, ref.megatron, critic.megatron):
        assert (megatron.use_remove_padding, megatron.dtype, megatron.use_megatron_fsdp) == (True, None, False)
    # verl's optim/fsdp.yaml: AdamW; min_lr 0 (no floor beyond min_lr_ratio's)
    for optim in (actor.optim, critic.optim):
        assert (optim.optimizer, optim.min_lr) == ("AdamW", 0.0)
    assert actor.checkpoint.strict is True and actor.calculate_sum_pi_squared is False
    # grad_clip follows optim.clip_grad in the YAML and is folded into it (then null)
    assert actor.grad_clip is None and actor.optim.clip_grad == 1.0
    assert (actor.policy_loss.tau_pos, actor.policy_loss.tau_neg) == (None, None)
    assert cfg.actor_rollout_ref.rollout.moe_tensor_parallel_size == 1
    assert cfg.actor_rollout_ref.model.enable_activation_offload is False
    assert (cfg.data.filter_overlong_prompts_workers, cfg.data.image_patch_size) == (1, 14)
    # verl's engine/fsdp.yaml: use_torch_compile true, model_dtype fp32 (every role); rollout: vLLM's sleep mode on
    # (verl's RolloutConfig default); data: 8 loader workers (verl's), 0 in the embedded layer the fixture runs
    for fsdp in (actor.fsdp_config, ref.fsdp_config, critic.model.fsdp_config):
        assert (fsdp.use_torch_compile, fsdp.model_dtype) == (True, "fp32")
    assert cfg.actor_rollout_ref.rollout.enable_sleep_mode is True and cfg.data.dataloader_num_workers == 0
    assert OmegaConf.select(default.defaults, "data.dataloader_num_workers") == 0
    verl_data = OmegaConf.load(CONFIG_DIR / "data" / "legacy_data.yaml")
    assert verl_data.dataloader_num_workers == 8


# ---------------------------------------------------------------------------------------------- fsdp_config


@pytest.mark.parametrize("size", [-1, 1])
def test_fsdp_size_of_every_rank_is_accepted(default, size):
    # the default run has one rank (trainer.n_gpus_per_node=1, nnodes=1): -1 and 1 both mean "all ranks"
    cfg = validate(default, {f"{A}.fsdp_config.fsdp_size": size, f"{R}.fsdp_config.fsdp_size": size})
    assert cfg.world_size == 1 and cfg.actor_rollout_ref.actor.fsdp_config.fsdp_size == size


@pytest.mark.parametrize("prefix", [f"{A}.fsdp_config", f"{R}.fsdp_config"])
def test_fsdp_size_that_asks_for_hybrid_sharding_is_refused(default, prefix):
    changes = {f"{A}.use_kl_loss": True, f"{prefix}.fsdp_size": 8}  # the KL loss builds the reference
    with pytest.raises(ValueError, match=rf"^{prefix}\.fsdp_size=8 with 1 rank\(s\) asks for hybrid sharding"):
        validate(default, changes)


def test_fsdp_size_zero_is_not_a_size(default):
    with pytest.raises(ValueError, match=r"fsdp_config\.fsdp_size=0 is not a group size"):
        validate(default, {f"{A}.fsdp_config.fsdp_size": 0})


def test_fsdp_strategy_fsdp2_is_accepted_and_turbo_or_other_names_refused(default):
    assert validate(default, {f"{A}.fsdp_config.strategy": "fsdp2"}).actor_rollout_ref.actor.fsdp_config.strategy
    with pytest.raises(ValueError, match=rf"{A}\.fsdp_config\.strategy=fsdp_turbo"):
        validate(default, {f"{A}.fsdp_config.strategy": "fsdp_turbo"})
    with pytest.raises(ValueError, match=rf"{R}\.fsdp_config\.strategy='fsdp3'"):
        validate(default, {f"{R}.fsdp_config.strategy": "fsdp3"})


def test_ulysses_inside_fsdp_config_is_refused_as_the_role_key_is(default):
    with pytest.raises(ValueError, match=rf"{A}\.fsdp_config\.ulysses_sequence_parallel_size"):
        validate(default, {f"{A}.fsdp_config.ulysses_sequence_parallel_size": 2})


def test_entropy_checkpointing_in_fsdp_config_recomputes_the_entropy(default):
    plain = validate(default, {}).actor_rollout_ref.actor
    either = [
        validate(default, {f"{A}.fsdp_config.entropy_checkpointing": True}).actor_rollout_ref.actor,
        validate(default, {f"{A}.entropy_checkpointing": True}).actor_rollout_ref.actor,
    ]
    assert not plain.checkpoints_entropy
    assert all(actor.checkpoints_entropy for actor in either)
    # the reference's keys are accepted (nothing to recompute without gradients)
    assert validate(default, {f"{R}.entropy_checkpointing": True, f"{R}.fsdp_config.entropy_checkpointing": True})


def test_offload_policy_offloads_as_param_offload_does(default, monkeypatch):
    """offload_policy=true reaches the FSDP2 sharding as a CPU offload, for the actor and the frozen reference."""
    from verl.workers.actor import fsdp_actor

    seen = []
    monkeypatch.setattr(fsdp_actor, "shard_model", lambda module, **kwargs: seen.append(kwargs["param_offload"]))
    changes = {f"{A}.dtype": "float32", f"{R}.fsdp_config.offload_policy": True}
    cfg = validate(default, changes)
    actor, ref_fsdp = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.ref.fsdp_config
    for fsdp_config in (actor.fsdp_config, ref_fsdp):
        fsdp_actor.shard_for_training(
            torch.nn.Linear(2, 2),
            actor,
            fsdp_config,
            mesh=None,
            total_training_steps=1,
            wrap_class_names=None,
            key="k",
            trainable=False,
        )
    assert seen == [False, True]  # the actor's default section, then the reference's with offload_policy


def test_ref_optimizer_offload_is_accepted_and_says_it_moves_nothing(default, caplog):
    with caplog.at_level(logging.INFO, logger="verl.workers.config.roles"):
        cfg = validate(default, {f"{R}.fsdp_config.optimizer_offload": True})
    assert cfg.actor_rollout_ref.ref.fsdp_config.optimizer_offload is True
    assert "the frozen reference has no optimizer state to move" in caplog.text


def test_critic_fsdp_section_sets_the_critics_offload(default):
    changes = {"algorithm.adv_estimator": "gae", "critic.fsdp.param_offload": True}
    fsdp = validate(default, changes).critic.model.fsdp_config
    assert (fsdp.param_offload, fsdp.optimizer_offload) == (True, False)
    fsdp = validate(default, changes | {"critic.fsdp.optimizer_offload": True}).critic.model.fsdp_config
    assert (fsdp.param_offload, fsdp.optimizer_offload) == (True, True)


# ---------------------------------------------------------------------------------------------- role keys


def test_grad_clip_is_the_clip_applied(default):
    # grad_clip follows optim.clip_grad (1.0); set to 0.5 it is what optim.clip_grad becomes
    assert validate(default, {f"{A}.grad_clip": 0.5}).actor_rollout_ref.actor.optim.clip_grad == 0.5
    assert validate(default, {f"{A}.optim.clip_grad": 0.25}).actor_rollout_ref.actor.optim.clip_grad == 0.25
    assert validate(default, {"critic.grad_clip": 2.0}).critic.optim.clip_grad == 2.0


def test_policy_loss_taus_are_the_actors_taus(default):
    actor = validate(default, {f"{A}.policy_loss.tau_pos": 2.0, f"{A}.policy_loss.tau_neg": 3.0}).actor_rollout_ref
    assert (actor.actor.tau_pos, actor.actor.tau_neg) == (2.0, 3.0)
    # the actor's own keys keep their defaults (1.0, 1.05) when the policy_loss spelling is unset
    actor = validate(default, {}).actor_rollout_ref.actor
    assert (actor.tau_pos, actor.tau_neg) == (1.0, 1.05)


def test_checkpoint_strict_either_value_is_accepted(default):
    assert validate(default, {f"{A}.checkpoint.strict": False}).actor_rollout_ref.actor.checkpoint.strict is False


@pytest.mark.parametrize(
    "changes, match",
    [
        ({f"{A}.calculate_sum_pi_squared": True}, rf"{A}\.calculate_sum_pi_squared=true .*sum_pi_squared"),
        ({f"{RO}.moe_tensor_parallel_size": 2}, rf"{RO}\.moe_tensor_parallel_size"),
        ({"data.image_patch_size": 16}, r"data\.image_patch_size=16 sets the vision patch size"),
        ({f"{A}.optim.optimizer": "SGD"}, rf"{A}\.optim\.optimizer='SGD': this project trains with AdamW only"),
        ({f"{RO}.enable_rollout_routing_replay": True}, rf"{RO}\.enable_rollout_routing_replay=true .*router replay"),
        ({"actor_rollout_ref.model.mtp.enable": True}, r"model\.mtp\.enable=true .*multi-token prediction"),
        ({"actor_rollout_ref.model.mtp.enable_train": True}, r"model\.mtp\.enable_train=true"),
        # a key read only with MTP on, changed while it is off: nothing reads it
        ({"actor_rollout_ref.model.mtp.speculative_num_steps": 5}, r"model\.mtp is set, but nothing reads it"),
    ],
)
def test_what_asks_for_a_missing_feature_is_refused_by_its_key(default, changes, match):
    with pytest.raises(ValueError, match=match):
        validate(default, changes)


@pytest.mark.parametrize("key", ["actor_rollout_ref.model", "critic.model"])
def test_activation_offload_is_accepted_on_fsdp2_and_refused_on_the_other_backends(default, key):
    changes = {f"{key}.enable_activation_offload": True, "algorithm.adv_estimator": "gae"}  # gae: the critic trains
    cfg = validate(default, changes)
    model = cfg.actor_rollout_ref.model if key.startswith("actor") else cfg.critic.model
    assert model.enable_activation_offload is True
    section = A if key.startswith("actor") else "critic"
    with pytest.raises(
        ValueError,
        match=rf"^{key}\.enable_activation_offload=true with {section}\.strategy=dp: .*"
        r"fsdp2 backend.*enable_gradient_checkpointing=true",
    ):
        validate(default, {**changes, f"{section}.strategy": "dp"})


def test_activation_offload_on_megatron_points_at_megatrons_recompute(megatron_default):
    with pytest.raises(ValueError, match=r"strategy=megatron: .*recompute_granularity"):
        validate(megatron_default, {"actor_rollout_ref.model.enable_activation_offload": True})


def test_sleep_mode_off_is_a_vllm_key(default):
    # verl's fully async scripts add +actor_rollout_ref.rollout.enable_sleep_mode=False with rollout.name=vllm; on
    # another rollout nothing reads it
    assert (
        validate(default, {f"{RO}.name": "vllm", f"{RO}.enable_sleep_mode": False}).actor_rollout_ref.rollout.sleeps
        is False
    )
    assert validate(default, {f"{RO}.name": "vllm"}).actor_rollout_ref.rollout.sleeps is True
    with pytest.raises(ValueError, match=rf"{RO}\.enable_sleep_mode is set, but nothing reads it"):
        validate(default, {f"{RO}.enable_sleep_mode": False})


def test_dataloader_workers_take_zero_or_more(default):
    assert validate(default, {"data.dataloader_num_workers": 0}).data.dataloader_num_workers == 0
    with pytest.raises(ValueError, match=r"data\.dataloader_num_workers"):
        validate(default, {"data.dataloader_num_workers": -1})


def test_data_filter_workers_is_accepted(default):
    assert validate(default, {"data.filter_overlong_prompts_workers": 8}).data.filter_overlong_prompts_workers == 8


# ---------------------------------------------------------------------------------------------- optim


@pytest.mark.parametrize("name", ["AdamW", "adamw", "adam"])
def test_verls_adamw_names_are_accepted(default, name):
    assert validate(default, {f"{A}.optim.optimizer": name}).actor_rollout_ref.actor.optim.optimizer == name


def test_min_lr_is_the_floor_of_the_cosine_schedule(default):
    from verl.utils.amp_optimizer import build_scheduler

    changes = {f"{A}.optim.lr": 1e-3, f"{A}.optim.min_lr": 1e-4, f"{A}.optim.lr_scheduler": "cosine"}
    optim = validate(default, changes).actor_rollout_ref.actor.optim
    assert optim.floor_ratio() == pytest.approx(0.1)  # 1e-4 / 1e-3
    param = torch.nn.Parameter(torch.zeros(1))
    torch_optim = torch.optim.AdamW([param], lr=1e-3)
    scheduler = build_scheduler(torch_optim, optim, total_training_steps=10)
    for _ in range(10):
        torch_optim.step()
        scheduler.step()
    # after the whole schedule the cosine has come down to min_lr = 0.1 x 1e-3
    assert torch_optim.param_groups[0]["lr"] == pytest.approx(1e-4)


def test_lr_decay_steps_is_the_length_of_the_cosine_decay(default):
    from verl.utils.amp_optimizer import build_scheduler

    changes = {f"{A}.optim.lr": 1e-3, f"{A}.optim.lr_scheduler": "cosine", f"{A}.optim.lr_decay_steps": 4}
    optim = validate(default, changes).actor_rollout_ref.actor.optim
    assert (optim.decay_steps(10), validate(default, {}).actor_rollout_ref.actor.optim.decay_steps(10)) == (4, 10)
    param = torch.nn.Parameter(torch.zeros(1))
    torch_optim = torch.optim.AdamW([param], lr=1e-3)
    scheduler = build_scheduler(torch_optim, optim, total_training_steps=10)
    lrs = []
    for _ in range(6):
        torch_optim.step()
        scheduler.step()
        lrs.append(torch_optim.param_groups[0]["lr"])
    # cosine over 4 steps, no warm-up, no floor: lr x (1 + cos(pi x k / 4)) / 2 after step k = 1..4, then it stays 0
    # k=1: 1e-3 x (1 + 0.7071) / 2 = 8.536e-4; k=2: 5e-4; k=3: 1.464e-4; k=4..6: 0
    assert lrs == pytest.approx([8.5355e-4, 5e-4, 1.4645e-4, 0.0, 0.0, 0.0], abs=1e-7)
    with pytest.raises(ValueError, match=rf"{A}\.optim\.lr_decay_steps must be an integer >= 1"):
        validate(default, {f"{A}.optim.lr_decay_steps": 0})


def test_min_lr_and_min_lr_ratio_that_disagree_are_refused(default):
    changes = {f"{A}.optim.lr": 1e-3, f"{A}.optim.min_lr": 1e-4, f"{A}.optim.min_lr_ratio": 0.5}
    with pytest.raises(ValueError, match=rf"{A}\.optim\.min_lr=0\.0001 \(a floor of 0\.1 x lr\) disagrees"):
        validate(default, changes)
    # the same floor in both spellings agrees: 0.1 x 1e-3 = 1e-4
    assert validate(default, changes | {f"{A}.optim.min_lr_ratio": 0.1}).actor_rollout_ref.actor.optim.min_lr


# ---------------------------------------------------------------------------------------------- megatron


def test_megatron_engine_keys(megatron_default):
    cfg = validate(megatron_default, {f"{A}.megatron.use_remove_padding": False, f"{A}.megatron.dtype": "bfloat16"})
    actor = cfg.actor_rollout_ref.actor
    # verl's engine dtype becomes the role's dtype (then the engine key is folded to null)
    assert (actor.dtype, actor.megatron.dtype, actor.megatron.use_remove_padding) == ("bfloat16", None, False)
    with pytest.raises(ValueError, match=rf"{A}\.megatron\.use_megatron_fsdp=true asks for a verl feature"):
        validate(megatron_default, {f"{A}.megatron.use_megatron_fsdp": True})


def test_router_replay_is_disabled_only(megatron_default):
    assert validate(megatron_default, {}).actor_rollout_ref.actor.megatron.router_replay.mode == "disabled"
    with pytest.raises(ValueError, match=rf"{A}\.megatron\.router_replay\.mode=R3: router replay"):
        validate(megatron_default, {f"{A}.megatron.router_replay.mode": "R3"})
    with pytest.raises(ValueError, match=r"critic\.megatron\.router_replay\.record_file is read with"):
        validate(megatron_default, {"critic.megatron.router_replay.record_file": "/r.pt"})


def test_use_remove_padding_on_megatron_is_accepted_and_says_what_runs(megatron_default, caplog):
    # verl's megatron scripts set model.use_remove_padding=true (packed sequences); the same numbers on padded rows
    with caplog.at_level(logging.INFO, logger="verl.workers.config.ppo"):
        cfg = validate(megatron_default, {"actor_rollout_ref.model.use_remove_padding": True})
    assert cfg.actor_rollout_ref.model.use_remove_padding is True
    assert "actor_rollout_ref.model.use_remove_padding=true on megatron: the megatron backend here runs padded" in (
        caplog.text
    )


def test_a_reference_engine_dtype_other_than_the_actors_is_refused(megatron_default):
    changes = {f"{A}.use_kl_loss": True, f"{R}.megatron.dtype": "float32"}
    with pytest.raises(ValueError, match=rf"{R}\.megatron\.dtype=float32 differs from {A}\.dtype"):
        validate(megatron_default, changes)


# verl's scripts' override_transformer_config entries (1dda039), with the values they set
VERL_TRANSFORMER_KEYS = {
    "moe_permute_fusion": True,
    "moe_token_dispatcher_type": "flex",
    "gradient_accumulation_fusion": True,
    "moe_router_dtype": "fp32",
    "moe_grouped_gemm": True,
    "apply_rope_fusion": True,
    "moe_aux_loss_coeff": 0.01,
    "moe_z_loss_coeff": 0.001,
    "moe_enable_deepep": True,
    "account_for_loss_in_pipeline_split": True,
    "account_for_embedding_in_pipeline_split": True,
    "num_layers_in_first_pipeline_stage": 2,
    "num_layers_in_last_pipeline_stage": 2,
    "masked_softmax_fusion": True,
    "bias_activation_fusion": True,
    "bias_dropout_fusion": True,
    "deallocate_pipeline_outputs": True,
    "persist_layer_norm": True,
    "moe_shared_expert_overlap": True,
    "moe_router_enable_expert_bias": True,
    "moe_router_bias_update_rate": 0.001,
    "moe_router_load_balancing_type": "none",
    "use_flash_attn": False,
    "use_naive_l2norm": False,
}


def test_verls_transformer_overrides_compose_without_plus_and_validate(caplog):
    """The open mapping takes verl's entries in the plain ``key=value`` spelling too; each is checked against
    megatron-core's TransformerConfig, and the NPU (MindSpeed) fields, off, are left out with a log line."""
    prefix = f"{A}.megatron.override_transformer_config"
    overrides = [f"{prefix}.{key}={str(value).lower()}" for key, value in VERL_TRANSFORMER_KEYS.items()]
    composed = compose_with_defaults(["trainer.device=cuda", *overrides], config_name="ppo_megatron_trainer")
    with caplog.at_level(logging.INFO, logger="verl.workers.config.megatron"):
        cfg = composed.validate()
    given = cfg.actor_rollout_ref.actor.megatron.override_transformer_config
    assert {key: given[key] for key in VERL_TRANSFORMER_KEYS} == VERL_TRANSFORMER_KEYS
    assert "['use_flash_attn', 'use_naive_l2norm'] are off; MindSpeed (NPU) fields" in caplog.text


def test_an_npu_transformer_field_turned_on_is_refused(megatron_default):
    with pytest.raises(ValueError, match=r"override_transformer_config\.use_flash_attn=True is a MindSpeed"):
        validate(megatron_default, {f"{A}.megatron.override_transformer_config.use_flash_attn": True})


# ---------------------------------------------------------------------------------------------- rollout engine


def test_vllm_engine_kwargs_take_new_keys_without_plus():
    composed = compose_omegaconf([f"{RO}.engine_kwargs.vllm.max_model_len=4096"])
    assert composed.actor_rollout_ref.rollout.engine_kwargs.vllm == {"max_model_len": 4096}


def _vllm_arr(default, changes):
    return validate(default, {f"{RO}.name": "vllm", **changes}).actor_rollout_ref


def test_vllm_max_model_len_from_engine_kwargs_is_the_engines_context(default):
    from verl.workers.rollout.vllm_engine import _check_shared_keys, max_model_len

    arr = _vllm_arr(default, {f"{RO}.engine_kwargs.vllm": {"max_model_len": 4096}})
    assert max_model_len(arr) == 4096
    _check_shared_keys(arr.rollout)  # one place: accepted
    # the default context is prompt_length + response_length
    assert max_model_len(_vllm_arr(default, {})) == arr.rollout.prompt_length + arr.rollout.response_length
    both = _vllm_arr(default, {f"{RO}.max_model_len": 2048, f"{RO}.engine_kwargs.vllm": {"max_model_len": 4096}})
    with pytest.raises(ValueError, match=rf"{RO}\.engine_kwargs\.vllm\.max_model_len=4096 disagrees"):
        _check_shared_keys(both.rollout)


def test_vllm_compilation_config_joins_the_capture_sizes(default):
    from verl.workers.rollout.vllm_engine import engine_kwargs

    changes = {
        f"{RO}.cudagraph_capture_sizes": [1, 2, 4],
        f"{RO}.engine_kwargs.vllm": {"compilation_config": {"cudagraph_mode": "FULL_AND_PIECEWISE"}},
    }
    compilation = engine_kwargs(_vllm_arr(default, changes), seed=0, device="cuda")["compilation_config"]
    assert compilation == {"cudagraph_capture_sizes": [1, 2, 4], "cudagraph_mode": "FULL_AND_PIECEWISE"}
