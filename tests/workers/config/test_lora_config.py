"""The LoRA keys at start-up: accepted with verl's meaning, bad values refused with the key named."""

import pytest

from verl.workers.config import compose_ppo_config

LORA = "actor_rollout_ref.model.lora_rank=8"


def test_lora_rank_0_is_the_default_and_8_is_accepted():
    assert compose_ppo_config().actor_rollout_ref.model.lora_rank == 0
    assert compose_ppo_config([LORA]).actor_rollout_ref.model.uses_lora


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        # the tiny model's k_proj is 64 -> 32 (2 kv heads of 16), so rank 64 is wider than it
        (["actor_rollout_ref.model.lora_rank=64"], r"lora_rank=64 is larger than the width of .*k_proj"),
        ([LORA, "actor_rollout_ref.model.target_modules=[nothing]"], r"model.target_modules=.*selects no linear"),
        ([LORA, "actor_rollout_ref.actor.strategy=megatron"], "LoRA is not supported on the megatron backend yet"),
        (["actor_rollout_ref.model.lora.rank=8"], r"model.lora.rank=8 is verl's megatron form"),
        (["actor_rollout_ref.model.lora_adapter_path=/tmp"], r"lora_adapter_path=.* lora_rank is 0"),
        ([LORA, "actor_rollout_ref.model.lora_adapter_path=/nonexistent"], "not a peft adapter directory"),
    ],
)
def test_bad_lora_settings_fail_at_start_up_naming_the_key(overrides, match):
    with pytest.raises(ValueError, match=match):
        compose_ppo_config(overrides)


def test_lora_with_the_vllm_rollout_is_accepted():
    # vLLM gets the merged weights after each update (verl.utils.lora.merged_lora_weights)
    config = compose_ppo_config([LORA, "actor_rollout_ref.rollout.name=vllm"])
    assert config.actor_rollout_ref.model.lora_rank == 8 and config.actor_rollout_ref.rollout.name == "vllm"
