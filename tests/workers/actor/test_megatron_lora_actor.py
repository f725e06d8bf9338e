"""LoRA on the megatron actor (CPU path): checkpoints resume the adapters, and the Hugging Face export of a whole
model holds the merged weights ``transformers`` loads as the plain model, with the LoRA actor's log-probs."""

import pytest
import torch

from tests.workers.actor.conftest import actor_config, megatron_lora, ppo_batch, tiny_qwen2
from verl.workers.actor.dp_actor import build_dp_actor
from verl.workers.actor.megatron_builder import build_megatron_actor

pytestmark = pytest.mark.usefixtures("megatron_world_of_one")

HF_MODEL = {"save_contents": ["model", "optimizer", "extra", "hf_model"]}


def lora_actor(**overrides):
    hf_model = tiny_qwen2(seed=0)
    config = actor_config(strategy="megatron", megatron={"seed": 1}, optim={"lr": 5e-2}, **overrides)
    actor = build_megatron_actor(
        hf_model.config,
        config,
        device="cpu",
        total_training_steps=10,
        hf_state_dict=hf_model.state_dict(),
        lora=megatron_lora(),
    )
    return actor, hf_model


def updated(actor):
    batch = ppo_batch()
    batch.batch["old_log_probs"], _ = actor.compute_log_prob(batch)
    actor.update_policy(batch)  # B is no longer zero: the adapters matter from here on
    return batch


def test_the_hf_export_holds_the_merged_model_and_a_resume_restores_the_adapters(tmp_path):
    from transformers import AutoModelForCausalLM

    actor, _ = lora_actor(checkpoint=HF_MODEL)
    assert "LoRA rank 4 on 8 layers" in actor.training_path
    batch = updated(actor)
    expected, _ = actor.compute_log_prob(batch)
    assert not torch.allclose(expected, batch.batch["old_log_probs"], atol=1e-5)
    actor.save_checkpoint(tmp_path / "ckpt")
    export = tmp_path / "ckpt" / "huggingface"
    loaded = AutoModelForCausalLM.from_pretrained(export, attn_implementation="eager").float().eval()
    assert not any("adapter" in name for name in loaded.state_dict())
    plain = build_dp_actor(actor_config(), loaded, total_training_steps=1, trainable=False)
    torch.testing.assert_close(plain.compute_log_prob(batch)[0], expected, rtol=0, atol=1e-5)
    resumed, _ = lora_actor(checkpoint=HF_MODEL)
    resumed.load_checkpoint(tmp_path / "ckpt")
    assert torch.equal(resumed.compute_log_prob(batch)[0], expected)
    assert resumed.num_update_steps == 1


def test_without_hf_model_no_export_is_written(tmp_path):
    actor, _ = lora_actor()
    actor.save_checkpoint(tmp_path / "ckpt")
    assert not (tmp_path / "ckpt" / "huggingface").exists()
