"""Tests for verl.workers.config.verl_keys: ``+key=value`` composes here exactly where verl's Hydra composes it."""

from __future__ import annotations

import json

import pytest

from tests.trainer.verl_scripts.harness import CURRENT_SCRIPTS_JSON, load_scripts
from verl.workers.config import compose_omegaconf
from verl.workers.config.compat import command_line_override
from verl.workers.config.verl_keys import defined_in_verl, verl_commit

RO = "actor_rollout_ref.rollout"
OTC = "actor_rollout_ref.actor.megatron.override_transformer_config"


@pytest.mark.parametrize(
    ("key", "config_name", "defined"),
    [
        (f"{RO}.n", "ppo_trainer", True),
        (f"{RO}.engine_kwargs.vllm", "ppo_trainer", True),  # the mapping; its entries are the scripts' to add
        (f"{RO}.engine_kwargs.vllm.max_model_len", "ppo_trainer", False),
        (f"{RO}.moe_tensor_parallel_size", "ppo_trainer", False),
        (f"{RO}.enable_sleep_mode", "ppo_trainer", False),
        # verl's megatron config sets recompute_num_layers in override_transformer_config; its fsdp one has none
        (f"{OTC}.recompute_num_layers", "ppo_megatron_trainer", True),
        (f"{OTC}.recompute_num_layers", "ppo_trainer", False),
        ("async_training.staleness_threshold", "fully_async_ppo_trainer.yaml", True),
        ("async_training.staleness_threshold", "fully_async_ppo_megatron_trainer", True),
        ("async_training.staleness_threshold", "ppo_trainer", False),
        ("rollout.nnodes", "one_step_off_ppo_trainer", True),
        ("algorithm.filter_groups.enable", "fully_async_ppo_trainer", True),
        (f"{RO}.n", "a_recipes_own_trainer", True),  # another file: taken to extend ppo_trainer
    ],
)
def test_which_keys_verls_yaml_defines(key, config_name, defined):
    assert defined_in_verl(key, config_name) is defined


def test_the_key_layout_is_of_the_release_whose_scripts_are_stored():
    assert verl_commit() == json.loads(CURRENT_SCRIPTS_JSON.read_text())["verl_commit"]


@pytest.mark.parametrize(
    ("given", "config_name", "read_as"),
    [
        # a key verl's YAML lacks (ours holds it with its default): add or set
        (f"+{RO}.moe_tensor_parallel_size=2", "ppo_trainer", f"++{RO}.moe_tensor_parallel_size=2"),
        (f"+{OTC}.recompute_num_layers=2", "ppo_trainer", f"++{OTC}.recompute_num_layers=2"),
        # a key verl's YAML defines: Hydra's "+", which refuses it here as in verl
        (f"+{OTC}.recompute_num_layers=2", "ppo_megatron_trainer.yaml", f"+{OTC}.recompute_num_layers=2"),
        (f"+{RO}.n=2", "ppo_trainer", f"+{RO}.n=2"),
    ],
)
def test_a_plus_becomes_add_or_set_only_on_keys_verls_yaml_lacks(given, config_name, read_as):
    assert command_line_override(given, config_name) == read_as


def test_every_plus_of_verls_scripts_on_a_key_verl_lacks_is_read_as_add_or_set():
    # the stored scripts' "+key=value" overrides (172 of them, on 100-odd keys); each one whose key verl's YAML for
    # that script's config lacks composes in verl, and must here: "++" always composes (add, or set our default)
    seen = set()
    for script in load_scripts(CURRENT_SCRIPTS_JSON):
        config_name = script.config_name or script.default_config_name
        for override in script.overrides:
            if not override.startswith("+") or override.startswith("++"):
                continue
            key = override.split("=", 1)[0][1:]
            if not defined_in_verl(key, config_name):
                assert command_line_override(override, config_name) == "+" + override, (script.name, override)
                seen.add(key)
    assert f"{RO}.moe_tensor_parallel_size" in seen and f"{RO}.enable_sleep_mode" in seen and len(seen) > 50


def test_verls_plus_keys_compose_and_those_verl_refuses_are_refused_here():
    config = compose_omegaconf([f"+{RO}.moe_tensor_parallel_size=2", f"+{RO}.enable_sleep_mode=false"])
    assert (
        config.actor_rollout_ref.rollout.moe_tensor_parallel_size,
        config.actor_rollout_ref.rollout.enable_sleep_mode,
    ) == (2, False)
    # run_gpt_oss_20b_fsdp.sh and run_qwen3_8b_merge_fsdp.sh "+" keys verl's YAML defines: verl refuses both
    for key in ("actor_rollout_ref.actor.fsdp_config.model_dtype", "actor_rollout_ref.model.lora.merge"):
        assert defined_in_verl(key)
        with pytest.raises(
            ValueError, match=rf"\+{key}=\.\.\.: .*verl's Hydra refuses this '\+' as well.*{key}=<value>"
        ):
            compose_omegaconf([f"+{key}=true"])
