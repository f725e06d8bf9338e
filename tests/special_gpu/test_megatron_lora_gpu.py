"""GPU check of LoRA on the megatron actor (verl's megatron form) with megatron-core's own DDP and optimizer.

The adapters are the only trained parameters of megatron-core's DDP buffers and optimizer; fp16 from 2**32 passes
its warm-up and then trains; the base weights and the adapters-off reference stay bit for bit; the merged weights
(what vLLM and the Hugging Face export get) give the adapted model's logits. Run by tests/special_gpu/run_all.sh on
a machine with a CUDA device; skipped elsewhere.
"""

import pytest
import torch

from tests.workers.actor.conftest import (  # noqa: F401
    actor_config,
    megatron_lora,
    megatron_world_of_one,
    ppo_batch,
    tiny_qwen2,
)
from verl.workers.actor.megatron_backend import MegatronScheduleBackend

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.usefixtures("megatron_world_of_one"),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_lora_trains_on_megatron_cores_path_with_the_base_frozen(figure):
    from verl.models.mcore import build_gpt_model, forward_logits
    from verl.models.mcore.lora import merge_lora_state_dict
    from verl.workers.actor.megatron_builder import build_megatron_actor

    hf_model = tiny_qwen2(seed=0)
    megatron = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "use_megatron_optimizer": True}
    config = actor_config(strategy="megatron", dtype="float16", megatron=megatron, seed=1)
    actor = build_megatron_actor(
        hf_model.config,
        config,
        device="cuda",
        total_training_steps=100,
        hf_state_dict=hf_model.state_dict(),
        lora=megatron_lora(rank=8, alpha=16),
    )
    assert isinstance(actor.backend, MegatronScheduleBackend) and "LoRA rank 8" in actor.training_path
    module = actor.model_module()
    trained = [name for name, param in module.named_parameters() if param.requires_grad]
    assert trained and all(".adapter.lora_" in name for name in trained)
    frozen = {name: p.detach().clone() for name, p in module.named_parameters() if not p.requires_grad}
    batch = ppo_batch().to("cuda")
    batch.batch["old_log_probs"], _ = actor.compute_log_prob(batch)
    with actor.adapters_off()():
        reference_before, _ = actor.compute_log_prob(batch)
    failed = [actor.update_policy(batch).metrics["actor/update_failed"] for _ in range(40)]
    figure("megatron_lora_fp16_warm_up_num_skipped_updates", failed.index(0.0))
    assert failed[-5:] == [0.0] * 5
    for name, param in module.named_parameters():
        if name in frozen:
            assert torch.equal(param, frozen[name]), name
    with actor.adapters_off()():
        assert torch.equal(actor.compute_log_prob(batch)[0], reference_before)
    adapted, _ = actor.compute_log_prob(batch)
    assert (adapted - reference_before).abs().max() > 1e-3  # the adapters moved the policy
    # the plain model holding the merged weights computes the adapted model's logits (to fp16 rounding)
    plain = build_gpt_model(hf_model.config, torch.float16, "cuda", seed=2)
    missing, unexpected = plain.load_state_dict(merge_lora_state_dict(module.state_dict()), strict=False)
    assert [k for k in missing if not k.endswith("_extra_state")] == [] and unexpected == []
    inputs = (batch.batch["input_ids"], batch.batch["attention_mask"], batch.batch["position_ids"])
    with torch.no_grad():
        gap = (forward_logits(plain, *inputs) - forward_logits(module, *inputs)).abs().max().item()
    figure("megatron_lora_merged_logit_gap", gap)
    assert gap < 5e-2
