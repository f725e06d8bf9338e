"""The LoRA keys at start-up: accepted with verl's meaning, bad values refused with the key named."""

import json

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
        ([LORA, "actor_rollout_ref.actor.strategy=megatron"], r"lora_rank=8 is the dp/fsdp form .* set .*lora.rank"),
        (["actor_rollout_ref.model.lora.rank=8"], r"model.lora.rank=8 is verl's megatron form"),
        (["actor_rollout_ref.model.lora_adapter_path=/tmp"], "not a peft adapter directory"),
        ([LORA, "actor_rollout_ref.model.lora_adapter_path=/nonexistent"], "not a peft adapter directory"),
        # the tiny model ties lm_head to the embedding: an adapter there needs a matrix the model does not have
        ([LORA, "actor_rollout_ref.model.target_modules=[q_proj,lm_head]"], r"adapter on lm_head, whose weight is"),
        # an embedding's adapter (peft's lora_embedding_A/B) is not merged into the rollout's weights
        ([LORA, "actor_rollout_ref.model.target_modules=[embed_tokens]"], r"on model.embed_tokens, a Embedding"),
    ],
)
def test_bad_lora_settings_fail_at_start_up_naming_the_key(overrides, match):
    with pytest.raises(ValueError, match=match):
        compose_ppo_config(overrides)


def test_an_adapter_path_alone_turns_lora_on_with_the_adapters_own_rank(tmp_path):
    # verl's rule: lora_adapter_path set means LoRA, whatever lora_rank says (the adapter brings its rank)
    (tmp_path / "adapter_config.json").write_text("{}")
    config = compose_ppo_config([f"actor_rollout_ref.model.lora_adapter_path={tmp_path}"])
    assert config.actor_rollout_ref.model.lora_rank == 0 and config.actor_rollout_ref.model.uses_lora
    with pytest.raises(ValueError, match="lora_adapter_path=.* is the dp/fsdp form of LoRA"):
        compose_ppo_config(
            [f"actor_rollout_ref.model.lora_adapter_path={tmp_path}", "actor_rollout_ref.actor.strategy=megatron"]
        )


@pytest.mark.parametrize(
    ("saved", "match"),
    [({"use_dora": True}, "use_dora=True means DoRA"), ({"modules_to_save": ["lm_head"]}, "modules_to_save")],
)
def test_a_saved_adapter_the_rollout_cannot_merge_is_refused_at_start_up(tmp_path, saved, match):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 4, **saved}))
    with pytest.raises(ValueError, match=match):
        compose_ppo_config([f"actor_rollout_ref.model.lora_adapter_path={tmp_path}"])


MEGATRON = ["actor_rollout_ref.actor.strategy=megatron", "trainer.device=cpu"]
M_LORA = "actor_rollout_ref.model.lora"


def test_verl_megatron_lora_lines_start():
    # run_qwen2-7b_math_megatron_lora.sh's LoRA keys, the rank cut to what the tiny model takes
    config = compose_ppo_config(
        [*MEGATRON, f"{M_LORA}.rank=16", f"{M_LORA}.alpha=32", f"{M_LORA}.lora_A_init_method=kaiming"]
    )
    lora = config.actor_rollout_ref.model.lora
    assert (lora.rank, lora.alpha, lora.lora_A_init_method) == (16, 32, "kaiming")
    assert list(lora.target_modules) == ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        # the tiny model: hidden 64, 4 heads of 16 (qkv 64 -> 128), intermediate 128: every layer takes rank 64
        ([f"{M_LORA}.rank=65"], r"lora.rank=65 is wider than linear_qkv takes \(64"),
        ([f"{M_LORA}.rank=8", f"{M_LORA}.type=dora"], r"lora.type='dora': weight-decomposed adapters"),
        ([f"{M_LORA}.rank=8", f"{M_LORA}.target_modules=[q_proj]"], r"target_modules=\['q_proj'\]: take megatron"),
        ([f"{M_LORA}.rank=8", f"{M_LORA}.lora_A_init_method=orthogonal"], r"lora_A_init_method"),
        ([f"{M_LORA}.rank=8", f"{M_LORA}.adapter_path=/a"], r"adapter_path='/a': megatron adapters are saved"),
        ([f"{M_LORA}.rank=8", f"{M_LORA}.freeze_language_model=false"], r"would train the base weights"),
        (
            [f"{M_LORA}.rank=8", "critic.strategy=megatron", "critic.model.lora_rank=8", "algorithm.adv_estimator=gae"],
            r"critic.model.lora_rank=8 is the dp/fsdp form .* set critic.model.lora.rank",
        ),
        (
            ["critic.strategy=megatron", "critic.model.lora.rank=65", "algorithm.adv_estimator=gae"],
            r"critic.model.lora.rank=65 is wider than linear_qkv takes \(64",
        ),
        (
            ["critic.strategy=dp", "critic.model.lora.rank=8", "algorithm.adv_estimator=gae"],
            r"critic.model.lora.rank=8 is verl's megatron form .* strategy=dp; set critic.model.lora_rank",
        ),
        (
            ["critic.model.lora.rank=8", "critic.model.lora.type=dora", "algorithm.adv_estimator=gae"],
            r"lora.type='dora'",
        ),
    ],
)
def test_bad_megatron_lora_settings_fail_at_start_up(overrides, match):
    with pytest.raises(ValueError, match=match):
        compose_ppo_config([*MEGATRON, *overrides])


def test_megatron_critic_lora_in_verls_megatron_form_starts():
    config = compose_ppo_config(
        [*MEGATRON, "critic.strategy=megatron", "algorithm.adv_estimator=gae", "critic.model.lora.rank=16"]
    )
    assert config.critic.model.lora.rank == 16 and config.critic.model.lora_rank == 0


def test_lora_with_the_vllm_rollout_is_accepted():
    # vLLM gets the merged weights after each update (verl.utils.lora.merged_lora_weights)
    config = compose_ppo_config([LORA, "actor_rollout_ref.rollout.name=vllm"])
    assert config.actor_rollout_ref.model.lora_rank == 8 and config.actor_rollout_ref.rollout.name == "vllm"


SAVE = "actor_rollout_ref.actor.checkpoint.save_contents"


def test_checkpoint_contents_take_verls_lists_and_hf_model_switches_the_export_on():
    assert not compose_ppo_config().actor_rollout_ref.actor.checkpoint.hf_model
    config = compose_ppo_config([LORA, f"{SAVE}=[model,optimizer,extra,hf_model]"])
    assert config.actor_rollout_ref.actor.checkpoint.hf_model
    # load_contents follows save_contents, as in verl's YAML
    assert "hf_model" in config.actor_rollout_ref.actor.checkpoint.load_contents


@pytest.mark.parametrize(
    ("save", "saved_parts"),
    # verl's scripts' lists: the training state's parts each checkpoint writes (the weights always)
    [
        ("[model]", ()),
        ("[model,hf_model,extra]", ("extra",)),
        ("['model', 'extra', 'optimizer']", ("optimizer", "extra")),
    ],
)
def test_checkpoint_contents_are_verls_lists(save, saved_parts):
    checkpoint = compose_ppo_config([f"{SAVE}={save}"]).actor_rollout_ref.actor.checkpoint
    # load_contents follows save_contents, as in verl's YAML
    assert (checkpoint.saved_parts, checkpoint.loaded_parts) == (saved_parts, saved_parts)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ([f"{SAVE}=[optimizer,extra]"], rf"{SAVE}=\['optimizer', 'extra'\] leaves out 'model'"),
        ([f"{SAVE}=[model,optimizer,extra,weights]"], rf"{SAVE} holds 'weights'"),
        (
            ["actor_rollout_ref.actor.checkpoint.load_contents=[optimizer]"],
            r"actor.checkpoint.load_contents=.* 'model'",
        ),
        (["actor_rollout_ref.actor.checkpoint.async_save=true"], r"checkpoint.async_save=true asks for .*background"),
        (
            ["critic.checkpoint.save_contents=[model,optimizer,extra,hf_model]"],
            r"critic.checkpoint.save_contents holds",
        ),
    ],
)
def test_checkpoint_contents_that_could_not_resume_are_refused(overrides, match):
    with pytest.raises(ValueError, match=match):
        compose_ppo_config(overrides)
