"""The megatron actor worker feeding a rollout worker group of its own (``hybrid_engine=false``), in one process.

The trainer moves the weights through the driver: the actor group's ``export_weights`` (CPU buckets of Hugging Face
names on rank 0, read back with ``named_tensors``), then the rollout group's ``load_weights``. Both workers are
built here from the same config and called directly, so the whole path runs in seconds: after an update, what the
megatron actor exports is its model's weights under Hugging Face names and layouts, and the rollout worker's frozen
Hugging Face copy then computes the actor's own log-probs.
"""

import pytest
import torch

from tests.workers.actor.conftest import megatron_world_of_one  # noqa: F401  (megatron-core's groups)
from tests.workers.built import built_worker
from verl.models.loading import load_hf_config
from verl.models.mcore import export_mcore_to_hf
from verl.trainer.data_setup import build_data
from verl.utils.weight_buckets import named_tensors
from verl.workers.config import compose_ppo_config
from verl.workers.megatron_workers import MegatronActorRolloutRefWorker
from verl.workers.rollout_worker import RolloutWorker

SEPARATE_ROLLOUT = [
    "actor_rollout_ref.actor.strategy=megatron",
    "actor_rollout_ref.hybrid_engine=false",
    "data.train_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # one update per step: 4 prompts x 2 samples
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.actor.dtype=float32",  # the log-probs of both copies compared in fp32
    "actor_rollout_ref.actor.optim.lr=1e-2",  # a step that visibly moves every weight it touches
]


@pytest.fixture
def compose(megatron_world_of_one):  # noqa: F811
    return lambda *overrides: compose_ppo_config([*SEPARATE_ROLLOUT, *overrides])


def actor_worker(config):
    worker = built_worker(MegatronActorRolloutRefWorker, config, 4)
    worker.init_model()
    assert worker.rollout_role is None  # the rollout lives in the group of its own
    return worker


def test_the_rollout_group_gets_the_megatron_actors_updated_weights(compose):
    config = compose()
    actor = actor_worker(config)
    rollout = built_worker(RolloutWorker, config)
    rollout.init_model()
    samples = rollout.generate_sequences(next(build_data(config, 1).train_loader))
    samples = samples.union(actor.compute_log_prob(samples))
    sign = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(len(samples))])
    samples.batch["advantages"] = sign[:, None] * samples.batch["response_mask"].float()
    before = dict(named_tensors(actor.export_weights()))
    assert actor.update_actor(samples).updated

    buckets = actor.export_weights()
    sent = dict(named_tensors(buckets))
    # the model's weights after the update, converted independently of the worker's export (a copy per tensor)
    expected = export_mcore_to_hf(actor.actor.model_module(), load_hf_config(config.actor_rollout_ref.model.path))
    held = rollout.policy.model_module().state_dict()
    # every Hugging Face weight of the rollout's model, lm_head (tied to the embedding) included, and nothing else
    assert sorted(sent) == sorted(expected) == sorted(held)
    assert all(torch.equal(sent[name], expected[name]) for name in expected)
    assert not torch.equal(sent["model.layers.0.mlp.gate_proj.weight"], before["model.layers.0.mlp.gate_proj.weight"])

    rollout.load_weights(buckets, 1)  # as the driver passes them on
    held = rollout.policy.model_module().state_dict()
    assert all(torch.equal(held[name], sent[name]) for name in sent)
    # layouts, not just names: the rollout's copy (q/k/v and gate/up split back out of megatron's fused tensors)
    # gives the updated actor's log-probs, both in fp32 (differences are summation order only)
    samples.meta_info["temperature"] = config.actor_rollout_ref.rollout.temperature
    actor_log_probs = actor.compute_log_prob(samples).batch["old_log_probs"]
    rollout_log_probs = rollout.policy.compute_log_prob(
        samples, config.actor_rollout_ref.rollout.log_prob_micro_batching()
    )[0]
    mask = samples.batch["response_mask"].bool()
    torch.testing.assert_close(rollout_log_probs[mask], actor_log_probs[mask], atol=1e-5, rtol=1e-5)


def test_offloaded_parameters_come_back_for_the_export(compose):
    # megatron.param_offload: between two passes the parameters wait in host memory with their device storage freed
    # (on CPU the move is forced, the same code path as on CUDA); the export brings them back as the passes do
    actor = actor_worker(compose("actor_rollout_ref.actor.megatron.param_offload=true"))
    weights = {name: tensor.clone() for name, tensor in named_tensors(actor.export_weights())}
    actor.actor.offloader.force_host_moves()
    actor.actor.offloader.offload()
    assert actor.actor.offloader.offloaded_bytes > 0
    sent = dict(named_tensors(actor.export_weights()))
    assert sorted(sent) == sorted(weights) and all(torch.equal(sent[name], weights[name]) for name in weights)
    assert actor.actor.offloader.offloaded_bytes > 0  # and they wait in host memory again afterwards
