"""MegatronPPOCritic on CPU: a GPTModel with a value head, its values, training steps, fp16, the unsupported paths."""

import pytest
import torch

from tests.workers.actor.conftest import tiny_qwen2
from tests.workers.critic.conftest import critic_config, value_batch
from verl.models.mcore import build_gpt_model, load_hf_weights_into_mcore
from verl.utils.amp_optimizer import AmpOptimizer
from verl.workers.actor.update_loop import build_loop_parts
from verl.workers.critic import DataParallelPPOCritic, ValueModel
from verl.workers.critic.megatron_critic import (
    MegatronPPOCritic,
    MegatronValueHead,
    attach_value_head,
    build_megatron_critic,
)
from verl.workers.update_outcome import FP16WarnAndCountHandler, UpdateFailedError


def make_critic(**overrides):
    lm = tiny_qwen2()
    return build_megatron_critic(
        lm.config,
        critic_config(strategy="megatron", **overrides),
        total_training_steps=100,
        hf_state_dict=lm.state_dict(),
    )


def test_values_have_the_response_shape_and_the_head_replaces_the_vocabulary():
    critic = make_critic()
    batch = value_batch()
    values = critic.compute_values(batch)
    assert values.shape == (8, 4) and values.dtype == torch.float32
    assert torch.all(values[batch.batch["response_mask"] == 0] == 0)
    assert isinstance(critic.model.output_layer, MegatronValueHead)
    # the output is one column wide (hidden 32 -> 1), and the embedding is no longer passed to it
    output = {name: tuple(p.shape) for name, p in critic.model.named_parameters() if name.startswith("output_layer")}
    assert output == {"output_layer.value.weight": (1, 32), "output_layer.value.bias": (1,)}
    assert not critic.model.share_embeddings_and_output_weights
    assert {id(p) for p in critic.optimizer.params} == {id(p) for p in critic.model.parameters()}


def test_values_match_the_dp_value_model_on_the_same_lm_and_head():
    # Same LM weights and the same seeded head (std 1, so the values are O(1)): the HF and megatron backbones
    # compute the same hidden states at real tokens, so the response values agree.
    lm = tiny_qwen2()
    dp_model = ValueModel.from_pretrained_lm(lm, head_init_std=1.0, seed=3)
    mc_model = build_gpt_model(lm.config, torch.float32, "cpu", seed=0)
    load_hf_weights_into_mcore(mc_model, lm)
    attach_value_head(mc_model, head_init_std=1.0, seed=3)
    cfg = critic_config()
    batch = value_batch()
    parts = build_loop_parts(cfg, rank=0)
    dp = DataParallelPPOCritic(cfg, dp_model, AmpOptimizer(torch.optim.SGD(dp_model.parameters(), lr=0.0)), **parts)
    mc = MegatronPPOCritic(cfg, mc_model, AmpOptimizer(torch.optim.SGD(mc_model.parameters(), lr=0.0)), **parts)
    dp_values, mc_values = dp.compute_values(batch), mc.compute_values(batch)
    assert dp_values.abs().max() > 0.5
    torch.testing.assert_close(mc_values, dp_values, atol=1e-4, rtol=1e-4)


def test_a_training_step_on_cpu_lowers_the_value_loss():
    critic = make_critic(optim={"lr": 1e-2})
    batch = value_batch()
    losses = []
    for _ in range(8):
        batch.batch["values"] = critic.compute_values(batch)
        metrics = critic.update_critic(batch).metrics
        losses.append(metrics["critic/vf_loss"])
    assert all(key.startswith("critic/") for key in metrics)
    assert metrics["critic/update_failures_total"] == 0.0 and metrics["critic/num_updates_successful"] == 1.0
    # returns +-1, values start near 0: ~0.5, and it falls
    assert losses[0] == pytest.approx(0.5, abs=0.05) and losses[-1] < 0.5 * losses[0]


def test_fp16_critic_absorbs_real_overflow_then_trains():
    critic = make_critic(dtype="float16", optim={"lr": 1e-2})
    assert isinstance(critic.update_outcome_handler, FP16WarnAndCountHandler)
    batch = value_batch()
    before = {k: v.clone() for k, v in critic.model.state_dict().items() if isinstance(v, torch.Tensor)}
    first = critic.update_critic(batch).metrics
    # the first update runs at loss scale 2**32 and overflows: skipped, counted, weights untouched
    assert first["critic/update_failed"] == 1.0 and first["critic/loss_scale"] == 2.0**32
    for key, value in before.items():
        assert torch.equal(critic.model.state_dict()[key], value), key
    failed, losses = [], []
    for _ in range(30):
        batch.batch["values"] = critic.compute_values(batch)
        metrics = critic.update_critic(batch).metrics
        failed.append(metrics["critic/update_failed"])
        losses.append(metrics["critic/vf_loss"])
    # the scaler backs off until the gradients fit; after that the updates apply and the loss falls
    assert failed[-5:] == [0.0] * 5 and metrics["critic/loss_scale"] < 2.0**20
    assert losses[-1] < 0.5 * losses[0]


def test_fire_drill_under_strict_names_the_critic():
    critic = make_critic(fault_injection={"nonfinite_grad_steps": [1]})
    with pytest.raises(UpdateFailedError, match=r"critic\.update_failure_policy"):
        critic.update_critic(value_batch())


def test_checkpoint_round_trip(tmp_path):
    critic = make_critic(dtype="float16")
    batch = value_batch()
    critic.update_critic(batch)
    critic.save_checkpoint(tmp_path / "critic")
    resumed = make_critic(dtype="float16", seed=7)
    resumed.load_checkpoint(tmp_path / "critic")
    assert resumed.update_outcome_handler.state_dict() == critic.update_outcome_handler.state_dict()
    assert resumed.optimizer.get_loss_scale() == critic.optimizer.get_loss_scale()
    torch.testing.assert_close(resumed.compute_values(batch), critic.compute_values(batch))


def test_a_checkpoint_with_the_flat_head_keys_of_earlier_versions_loads(tmp_path):
    critic = make_critic()
    state = critic.model.state_dict()
    # earlier versions' head was the Linear itself: output_layer.weight / output_layer.bias
    flat = {k.replace("output_layer.value.", "output_layer."): v + 1 for k, v in state.items() if torch.is_tensor(v)}
    other = make_critic(seed=7)
    missing, unexpected = other.model.load_state_dict(flat, strict=False)
    assert not unexpected and all(k.endswith("_extra_state") for k in missing)
    torch.testing.assert_close(other.model.output_layer.value.weight, state["output_layer.value.weight"] + 1)


def test_lora_trains_the_adapters_and_the_head_and_leaves_the_backbone():
    lora = {"rank": 4, "alpha": 8, "lora_B_init_method": "normal"}
    critic = make_critic(model={"lora": lora}, optim={"lr": 1e-2})
    named = dict(critic.model.named_parameters())
    trained = {name for name, p in named.items() if p.requires_grad}
    # 2 layers x 4 adapted linears, an A and a B each, and the value head's weight and bias
    assert len([n for n in trained if ".adapter.lora_" in n]) == 16
    assert trained - {n for n in trained if ".adapter.lora_" in n} == {
        "output_layer.value.weight",
        "output_layer.value.bias",
    }
    assert {id(p) for p in critic.optimizer.params} == {id(named[n]) for n in trained}
    assert "LoRA rank 4 on 8 layers" in critic.training_path
    before = {name: p.detach().clone() for name, p in named.items()}
    batch = value_batch()
    losses = []
    for _ in range(6):
        batch.batch["values"] = critic.compute_values(batch)
        losses.append(critic.update_critic(batch).metrics["critic/vf_loss"])
    moved = {name for name, p in named.items() if not torch.equal(p, before[name])}
    assert moved == trained  # the backbone frozen bit for bit, every adapter and the head moved
    assert losses[-1] < losses[0]


def test_unavailable_paths_fail_with_a_clear_message():
    with pytest.raises(
        ValueError, match=r"critic\.megatron\.use_megatron_optimizer=true: .*no megatron-core optimizer path"
    ):
        make_critic(megatron={"use_megatron_optimizer": True})
    with pytest.raises(ValueError, match=r"critic\.megatron\.pipeline_model_parallel_size=3: the model's 2 layers"):
        make_critic(megatron={"pipeline_model_parallel_size": 3})
    with pytest.raises(ValueError, match=r"critic\.megatron\.use_megatron_optimizer='yes' has the wrong type"):
        make_critic(megatron={"use_megatron_optimizer": "yes"})
    # a parallel size of 0 is refused, not silently turned into 1
    with pytest.raises(ValueError, match=r"critic\.megatron\.tensor_model_parallel_size must be an integer >= 1"):
        make_critic(megatron={"tensor_model_parallel_size": 0})
