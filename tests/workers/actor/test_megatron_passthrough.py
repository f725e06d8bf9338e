"""The megatron section's keys reaching the built actor: TransformerConfig overrides, seed, offload on CPU."""

import pytest
import torch

from tests.workers.actor.conftest import actor_config, ppo_batch, tiny_qwen2
from verl.utils.megatron_offload import attach_offloader, offload_phase
from verl.workers.actor.megatron_builder import build_megatron_actor

pytestmark = pytest.mark.usefixtures("megatron_world_of_one")


def build(megatron):
    hf_model = tiny_qwen2(seed=0)
    config = actor_config(strategy="megatron", megatron=megatron, seed=1)
    actor = build_megatron_actor(
        hf_model.config, config, device="cpu", total_training_steps=10, hf_state_dict=hf_model.state_dict()
    )
    return actor, config


def test_override_transformer_config_reaches_megatron_core():
    # (attention_backend is left alone: megatron-core records a non-auto choice in process-wide NVTE_* variables)
    actor, _ = build({"override_transformer_config": {"hidden_dropout": 0.25, "recompute_modules": ["core_attn"]}})
    assert actor.model.config.hidden_dropout == 0.25  # the converter's own value is 0.0
    assert actor.model.config.sequence_parallel is False  # tensor-parallel size 1: megatron-core allows no SP


@pytest.mark.parametrize(
    "recompute",
    [
        # verl's megatron scripts: whole layers, uniform groups of 1
        {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1},
        {"recompute_granularity": "selective", "recompute_modules": ["core_attn", "mlp"]},
    ],
)
def test_recomputation_trains_on_cpu_as_the_stored_run_does(recompute):
    plain, _ = build({})
    recomputed, _ = build({"override_transformer_config": recompute})
    # the section's recompute_* keys are megatron-core's TransformerConfig fields of the built model
    assert {name: getattr(recomputed.model.config, name) for name in recompute} == recompute
    assert plain.model.config.recompute_granularity is None
    results = []
    for actor in (plain, recomputed):
        batch = ppo_batch()
        batch.batch["old_log_probs"], _ = actor.compute_log_prob(batch)
        metrics = actor.update_policy(batch).metrics
        results.append((metrics["actor/grad_norm"], actor.compute_log_prob(batch)[0]))
    # the backward runs the recomputed parts' forward again: the same operations, the same numbers
    assert results[1][0] == results[0][0]
    assert torch.equal(results[1][1], results[0][1])


def test_offloaded_actor_computes_the_same_log_probs_between_phases():
    actor, config = build({"param_offload": True, "grad_offload": True, "optimizer_offload": True})
    batch = ppo_batch()
    expected, _ = actor.compute_log_prob(batch)
    attach_offloader(actor, config.megatron, skip_cpu=False)  # move host storages too: the CUDA code path
    weight = next(actor.model.parameters())
    assert weight.untyped_storage().nbytes() == 0
    with offload_phase(actor, training=False):
        got, _ = actor.compute_log_prob(batch)
    assert torch.equal(got, expected)
    assert weight.untyped_storage().nbytes() == 0
