"""The megatron sections (actor, ref, critic), ``optim.override_optimizer_config`` and their start-up checks."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from verl.workers.config import compose_omegaconf, compose_ppo_config
from verl.workers.config.megatron import MegatronConfig, check_optimizer_overrides, check_recompute
from verl.workers.config.schema import FieldError, build_config

A = "actor_rollout_ref.actor"
ROOT = Path(__file__).resolve().parents[3]


def compose(overrides=(), device="cuda"):
    """The megatron trainer config; device cuda by default, so the driver leaves the CUDA-only checks to workers."""
    return compose_ppo_config([f"trainer.device={device}", *overrides], config_name="ppo_megatron_trainer")


def section(changes=None, key=f"{A}.megatron"):
    """The actor's megatron section of the YAML with ``changes`` merged, built as the schema builds it and checked
    as a megatron role's section is (its pass-through keys against megatron-core's dataclasses)."""
    values = OmegaConf.to_container(OmegaConf.select(compose_omegaconf(), key), resolve=True)
    built = build_config(MegatronConfig, {**values, **(changes or {})}, key)
    built.check_passthroughs(key)
    return built


def test_megatron_config_lives_in_its_own_module_and_is_re_exported():
    from verl.workers.config import MegatronConfig as exported
    from verl.workers.config.roles import MegatronConfig as from_roles

    assert exported is MegatronConfig and from_roles is MegatronConfig


def test_verl_keys_and_defaults_of_the_three_sections():
    cfg = compose()
    actor, ref, critic = cfg.actor_rollout_ref.actor.megatron, cfg.actor_rollout_ref.ref.megatron, cfg.critic.megatron
    for megatron in (actor, ref, critic):
        # verl's defaults for the keys its scripts set
        assert (megatron.tensor_model_parallel_size, megatron.pipeline_model_parallel_size) == (1, 1)
        assert (megatron.expert_model_parallel_size, megatron.expert_tensor_parallel_size) == (1, None)
        assert (megatron.context_parallel_size, megatron.virtual_pipeline_model_parallel_size) == (1, None)
        assert (megatron.param_offload, megatron.grad_offload, megatron.optimizer_offload) == (False, False, False)
        assert (megatron.use_dist_checkpointing, megatron.dist_checkpointing_path) == (False, None)
        assert megatron.sequence_parallel is True and megatron.seed == 42 and megatron.use_mbridge is True
    assert cfg.actor_rollout_ref.actor.optim.override_optimizer_config == {}
    assert actor.override_transformer_config["recompute_modules"] == ["core_attn"]


def test_the_reference_follows_the_actor_layout():
    composed = compose_omegaconf(
        [
            f"{A}.megatron.tensor_model_parallel_size=2",
            f"{A}.megatron.seed=7",
            f"{A}.megatron.param_offload=true",
            f"{A}.megatron.override_transformer_config.attention_backend=unfused",
        ],
        "ppo_megatron_trainer",
    )
    ref = OmegaConf.to_container(composed.actor_rollout_ref.ref.megatron, resolve=True)
    assert (ref["tensor_model_parallel_size"], ref["seed"], ref["param_offload"]) == (2, 7, True)
    assert ref["override_transformer_config"]["attention_backend"] == "unfused"
    # what a frozen model has no use for does not follow
    assert (ref["grad_offload"], ref["optimizer_offload"], ref["use_distributed_optimizer"]) == (False, False, False)


def test_a_reference_laid_out_differently_is_refused():
    with pytest.raises(ValueError, match=r"ref.megatron's tensor/pipeline/context parallel sizes differ"):
        compose([f"{A}.use_kl_loss=true", "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2"])


def test_the_reference_has_nothing_but_parameters_to_offload():
    with pytest.raises(ValueError, match=r"ref.megatron.grad_offload=true: the reference model is frozen"):
        compose([f"{A}.use_kl_loss=true", "actor_rollout_ref.ref.megatron.grad_offload=true"])


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"expert_model_parallel_size": 2}, r"expert_model_parallel_size=2: expert parallelism .* dense"),
        ({"expert_tensor_parallel_size": 4}, r"expert_tensor_parallel_size=4: .* dense models only"),
        ({"context_parallel_size": 2}, r"context_parallel_size=2: context parallelism .* not built here"),
        ({"virtual_pipeline_model_parallel_size": 2}, r"virtual_pipeline_model_parallel_size=2: the interleaved"),
        ({"use_dist_checkpointing": True}, r"dist_checkpointing_path is empty, and use_dist_checkpointing=true"),
        ({"override_ddp_config": {"bucket_sise": 1}}, r"override_ddp_config.bucket_sise is not a field .*bucket_size"),
    ],
)
def test_layouts_and_settings_this_backend_cannot_run_are_refused_by_key(changes, message):
    with pytest.raises(ValueError, match=rf"actor_rollout_ref.actor.megatron.{message}"):
        section(changes)


def test_expert_tensor_parallel_size_equal_to_the_tensor_parallel_size_changes_nothing():
    # null means "as tensor_model_parallel_size" in verl; with no experts, 1 or that size say the same
    assert section({"tensor_model_parallel_size": 2, "expert_tensor_parallel_size": 2}).expert_tensor_parallel_size == 2


def test_transformer_overrides_are_checked_against_megatron_core_fields():
    typo = {"override_transformer_config": {"recompute_granulrity": "full"}}
    with pytest.raises(ValueError, match=r"recompute_granulrity is not a field of megatron-core's TransformerConfig"):
        section(typo)
    with pytest.raises(ValueError, match=r"did you mean recompute_granularity"):
        section(typo)
    with pytest.raises(ValueError, match=r"override_transformer_config.num_layers is decided by the Hugging Face"):
        section({"override_transformer_config": {"num_layers": 3}})
    with pytest.raises(ValueError, match=r"override_transformer_config.fp16 is decided by dtype"):
        section({"override_transformer_config": {"fp16": True}})
    with pytest.raises(ValueError, match=r"moe_router_dtyp is not a field .* did you mean moe_router_dtype"):
        section({"override_transformer_config": {"moe_router_dtyp": "fp32"}})


def test_moe_options_are_accepted_and_not_passed_to_a_dense_model(caplog):
    # verl's MoE scripts set these; the megatron backend builds dense models, where they have nothing to act on
    # (moe_permute_fusion=True would make TransformerConfig ask for Transformer Engine even without experts)
    options = {"moe_router_dtype": "fp32", "moe_enable_deepep": True, "moe_permute_fusion": True}
    with caplog.at_level(logging.INFO, logger="verl.workers.config.megatron"):
        megatron = section({"override_transformer_config": {**options, "hidden_dropout": 0.1}})
    assert "moe_enable_deepep, moe_permute_fusion, moe_router_dtype have no effect" in caplog.text
    assert megatron.transformer_overrides("cpu") == {"sequence_parallel": False, "hidden_dropout": 0.1}


def test_without_megatron_core_a_dp_run_starts_and_the_megatron_strategy_is_refused(monkeypatch):
    # verl's default YAML sets override_transformer_config keys (recompute_*, attention_backend) in every megatron
    # section; a dp run must not need megatron-core to check names only the megatron backend reads.
    from verl.workers.config import megatron as megatron_module

    monkeypatch.setattr(megatron_module, "megatron_core_installed", lambda: False)
    monkeypatch.setattr(
        megatron_module, "_dataclass_fields", lambda kind: pytest.fail("megatron-core's fields were looked up")
    )
    cfg = compose_ppo_config(["trainer.device=cpu"])
    assert cfg.actor_rollout_ref.actor.strategy != "megatron"
    assert cfg.actor_rollout_ref.actor.megatron.override_transformer_config  # verl's defaults, unchecked but kept
    with pytest.raises(ValueError, match=r"actor_rollout_ref.actor.strategy=megatron needs megatron-core"):
        compose()


def test_transformer_overrides_reach_the_builder_with_sequence_parallel_where_it_runs():
    megatron = section({"override_transformer_config": {"attention_backend": "unfused", "hidden_dropout": 0.1}})
    from megatron.core.transformer.enums import AttnBackend

    cpu = megatron.transformer_overrides("cpu")
    assert cpu == {"sequence_parallel": False, "attention_backend": AttnBackend.unfused, "hidden_dropout": 0.1}
    # sequence parallel: verl's default true, on only with tensor parallelism (megatron-core's rule) on CUDA
    assert megatron.transformer_overrides("cuda")["sequence_parallel"] is False  # tp 1
    split = megatron.replace(tensor_model_parallel_size=2)
    assert split.transformer_overrides("cuda")["sequence_parallel"] is True
    assert split.transformer_overrides("cpu")["sequence_parallel"] is False
    assert split.replace(sequence_parallel=False).transformer_overrides("cuda")["sequence_parallel"] is False


def test_what_needs_cuda_is_refused_on_cpu_naming_the_key():
    overrides = [f"{A}.megatron.use_distributed_optimizer=true", f"{A}.megatron.dist_checkpointing_path=/ckpt"]
    with pytest.raises(ValueError, match=rf"{A}.megatron.use_distributed_optimizer=true shards .* torch.optim"):
        compose(overrides, device="cpu")
    compose(overrides, device="cuda")  # accepted where the worker can run it (it checks again there)


RECOMPUTE = f"{A}.megatron.override_transformer_config.recompute"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_verls_recompute_keys_with_gradient_checkpointing_start_and_reach_the_transformer_config(device, caplog):
    # run_hy_v3_megatron.sh's lines: verl's megatron engine never reads enable_gradient_checkpointing (accepted and
    # logged); the recompute_* keys go to TransformerConfig (on CPU too: verl.models.mcore.recompute)
    full = [f"+{RECOMPUTE}_method=uniform", f"+{RECOMPUTE}_granularity=full", f"+{RECOMPUTE}_num_layers=1"]
    with caplog.at_level(logging.INFO, logger="verl.workers.config.ppo"):
        cfg = compose(["actor_rollout_ref.model.enable_gradient_checkpointing=True", *full], device=device)
    assert "megatron-core model does not read it" in caplog.text and "recompute_granularity=full" in caplog.text
    overrides = cfg.actor_rollout_ref.actor.megatron.transformer_overrides(device)
    assert {
        name: overrides[name] for name in ("recompute_granularity", "recompute_method", "recompute_num_layers")
    } == {
        "recompute_granularity": "full",
        "recompute_method": "uniform",
        "recompute_num_layers": 1,
    }
    # selective (megatron-core's default module, core_attn) starts on both devices too
    compose([f"{RECOMPUTE}_granularity=selective", f"{RECOMPUTE}_modules=[core_attn,mlp]"], device=device)


def test_gradient_checkpointing_without_recompute_keys_warns_that_nothing_is_recomputed(caplog):
    with caplog.at_level(logging.WARNING, logger="verl.workers.config.ppo"):
        compose(["actor_rollout_ref.model.enable_gradient_checkpointing=True"], device="cpu")
    assert "recompute_granularity=None (nothing recomputed; set full or selective" in caplog.text


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"recompute_granularity": "full"}, r"granularity=full recomputes groups .* \(got None\)"),
        (
            {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 0},
            r"granularity=full .* recompute_num_layers to an integer >= 1 \(got 0\)",
        ),
        ({"recompute_granularity": "layer"}, r"granularity='layer' is not supported; use null, full or selective"),
        (
            {"recompute_granularity": "selective", "recompute_num_layers": 1},
            r"num_layers=1 must be null with recompute_granularity=selective",
        ),
        (
            {"recompute_granularity": "selective", "recompute_modules": ["core_attn", "moe_act"]},
            r"modules=\['core_attn', 'moe_act'\]: .* mixture-of-experts",
        ),
    ],
)
def test_recompute_values_megatron_core_refuses_are_refused(given, message):
    with pytest.raises(FieldError, match=rf"override_transformer_config.recompute_{message}"):
        check_recompute(given)


def test_a_refused_recompute_value_names_the_full_key_at_start_up():
    with pytest.raises(ValueError, match=rf"{RECOMPUTE}_granularity=full recomputes groups of whole layers"):
        compose([f"{RECOMPUTE}_granularity=full"])


def test_kernel_fusions_on_cpu_are_logged_and_left_to_the_unfused_path(caplog):
    fusions = {"gradient_accumulation_fusion": True, "apply_rope_fusion": True, "masked_softmax_fusion": False}
    megatron = section({"override_transformer_config": fusions})
    with caplog.at_level(logging.INFO, logger="verl.workers.config.megatron"):
        megatron.check_device("cpu", f"{A}.megatron")
    assert "gradient_accumulation_fusion=true, apply_rope_fusion=true ask for apex" in caplog.text
    assert megatron.transformer_overrides("cpu") == {"sequence_parallel": False}
    assert megatron.transformer_overrides("cuda") == {"sequence_parallel": False, **fusions}


def test_offload_on_cpu_is_accepted_and_says_what_it_means(caplog):
    with caplog.at_level(logging.INFO, logger="verl.workers.config.megatron"):
        compose([f"{A}.megatron.param_offload=true", f"{A}.megatron.optimizer_offload=true"], device="cpu")
    assert any("already live in host memory" in record.getMessage() for record in caplog.records)


def test_verl_script_lines_start():
    # as verl's examples write them (run_qwen2-7b_math_megatron.sh and the like), sizes set to one machine
    cfg = compose(
        [
            f"{A}.megatron.use_mbridge=True",
            f"{A}.megatron.vanilla_mbridge=False",
            f"{A}.megatron.param_offload=True",
            f"{A}.megatron.grad_offload=True",
            f"{A}.megatron.optimizer_offload=True",
            f"+{A}.megatron.override_transformer_config.recompute_method=uniform",
            f"{A}.megatron.override_transformer_config.recompute_granularity=full",
            f"{A}.megatron.override_transformer_config.recompute_num_layers=1",
            f"+{A}.megatron.override_transformer_config.apply_rope_fusion=True",
            f"+{A}.megatron.override_transformer_config.account_for_loss_in_pipeline_split=True",
            f"+{A}.optim.override_optimizer_config.optimizer_cpu_offload=True",
            f"+{A}.optim.override_optimizer_config.overlap_cpu_optimizer_d2h_h2d=True",
            "actor_rollout_ref.ref.megatron.param_offload=True",
            f"{A}.megatron.expert_model_parallel_size=1",
            f"{A}.megatron.context_parallel_size=1",
        ]
    )
    actor = cfg.actor_rollout_ref.actor
    assert actor.megatron.override_transformer_config["recompute_method"] == "uniform"
    assert actor.optim.override_optimizer_config == {
        "optimizer_cpu_offload": True,
        "overlap_cpu_optimizer_d2h_h2d": True,
    }


def test_optimizer_overrides_are_checked_against_megatron_core_fields():
    key = f"{A}.optim.override_optimizer_config"
    assert check_optimizer_overrides({"optimizer_offload_fraction": 1.0}, key, uses_megatron_optimizer=True) == {
        "optimizer_offload_fraction": 1.0
    }
    with pytest.raises(ValueError, match=r"optimizer_cpu_ofload is not a field .* did you mean optimizer_cpu_offload"):
        check_optimizer_overrides({"optimizer_cpu_ofload": True}, key, uses_megatron_optimizer=True)
    with pytest.raises(ValueError, match=r"override_optimizer_config.lr is decided by optim.lr"):
        check_optimizer_overrides({"lr": 1.0}, key, uses_megatron_optimizer=True)
    with pytest.raises(ValueError, match=r"sets \['pin_cpu_grads'\]: .* the torch.optim adapter"):
        check_optimizer_overrides({"pin_cpu_grads": True}, key, uses_megatron_optimizer=False)


def test_optimizer_overrides_on_the_cpu_adapter_or_another_strategy_are_refused():
    line = f"+{A}.optim.override_optimizer_config.sgd_momentum=0.5"
    with pytest.raises(ValueError, match=r"override_optimizer_config sets \['sgd_momentum'\]"):
        compose([line], device="cpu")
    with pytest.raises(ValueError, match=r"nothing reads it: .* apply with actor_rollout_ref.actor.strategy=megatron"):
        compose_ppo_config([line, f"{A}.strategy=fsdp"])


def test_optimizer_options_the_cpu_adapter_already_meets_are_accepted(caplog):
    # verl's MoE scripts: CPU offload of the optimizer (its state is in host memory on CPU) and the precision-aware
    # optimizer with float32 states (the adapter's float32 master weights and moments)
    key = f"{A}.optim.override_optimizer_config"
    held = {
        "optimizer_cpu_offload": True,
        "optimizer_offload_fraction": 1.0,
        "overlap_cpu_optimizer_d2h_h2d": True,
        "use_precision_aware_optimizer": True,
    }
    with caplog.at_level(logging.INFO, logger="verl.workers.config.megatron"):
        assert check_optimizer_overrides(held, key, uses_megatron_optimizer=False, device_type="cpu") == held
    assert "already hold on the torch.optim adapter" in caplog.text
    compose([f"+{key}.{name}={value}" for name, value in held.items()], device="cpu")
    # offload asks for something on a GPU adapter; bf16 moments change the numbers
    with pytest.raises(ValueError, match=r"sets \['optimizer_cpu_offload', 'optimizer_offload_fraction', 'overlap_cpu"):
        check_optimizer_overrides(held, key, uses_megatron_optimizer=False, device_type="cuda")
    bf16_moments = {"use_precision_aware_optimizer": True, "exp_avg_dtype": "bfloat16"}
    with pytest.raises(ValueError, match=r"sets \['exp_avg_dtype', 'use_precision_aware_optimizer'\]"):
        check_optimizer_overrides(bf16_moments, key, uses_megatron_optimizer=False, device_type="cpu")


def test_pipeline_split_fields_are_left_out_at_pipeline_size_1(caplog):
    # run_deepseek671b_math_megatron_96gb.sh at one pipeline stage: megatron-core would build only the last stage's
    # count of layers; there is one stage, so there is nothing to split
    split = {"num_layers_in_last_pipeline_stage": 6, "account_for_loss_in_pipeline_split": False}
    with caplog.at_level(logging.INFO, logger="verl.workers.config.megatron"):
        megatron = section({"override_transformer_config": split})
    assert "account_for_loss_in_pipeline_split, num_layers_in_last_pipeline_stage share layers out" in caplog.text
    assert megatron.transformer_overrides("cuda") == {"sequence_parallel": False}
    staged = megatron.replace(pipeline_model_parallel_size=2)
    assert staged.transformer_overrides("cuda") == {"sequence_parallel": False, **split}


def test_a_run_on_another_backend_validates_without_importing_megatron_core():
    # the pass-through keys of the megatron sections are checked against megatron-core's dataclasses only for a role
    # that runs on megatron: the default (fsdp) run's driver does not pay for the import (about 1.3 s here)
    code = (
        "import sys\n"
        "from verl.workers.config import compose_ppo_config\n"
        "compose_ppo_config([])\n"
        "print(sorted(name for name in sys.modules if name.startswith('megatron.core')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
