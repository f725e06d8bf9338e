"""Weight sync of the actor worker into a rollout that holds its own weights, on both backends, without vLLM.

A recording stand-in for such a rollout (``holds_weights``, ``load_weights``) takes the place of the ``vllm``
engine, so the worker's side of the contract is checked here in seconds: nothing is sent after a step whose only
update was skipped, the weights are sent after a step with a successful update and after a checkpoint load, with
Hugging Face names and the actor's current values, and the metrics say so.
"""

import copy

import pytest
import torch

from tests.workers.actor.conftest import megatron_world_of_one  # noqa: F401  (megatron-core's groups)
from tests.workers.built import built_worker
from verl.trainer.data_setup import build_data
from verl.trainer.main_ppo import worker_classes
from verl.workers.config import compose_ppo_config

SMALL = [
    "data.train_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # one update per step: 4 prompts x 2 samples
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.actor.dtype=float16",
    "actor_rollout_ref.actor.optim.initial_loss_scale=1024",
    "actor_rollout_ref.actor.fault_injection.nonfinite_grad_steps=[1]",  # the first update is skipped
]


class RecordingRollout:
    """Samples with the worker's own naive rollout; records every weight load as {name: copy of the tensor}."""

    holds_weights = True

    def __init__(self, inner):
        self.inner = inner
        self.loads: list[dict[str, torch.Tensor]] = []

    def generate_sequences(self, prompts):
        return self.inner.generate_sequences(prompts)

    def state_dict(self):
        return self.inner.state_dict()

    def load_state_dict(self, state):
        self.inner.load_state_dict(state)

    def load_weights(self, weights):
        self.loads.append({name: tensor.detach().clone() for name, tensor in weights})


def recording(role):
    """The rollout role with its engine wrapped in a :class:`RecordingRollout`."""
    role.engine = RecordingRollout(role.engine)
    return role


@pytest.fixture(params=["dp", "megatron"])
def worker(request):
    if request.param == "megatron":
        request.getfixturevalue("megatron_world_of_one")
    config = compose_ppo_config([f"actor_rollout_ref.actor.strategy={request.param}", *SMALL])
    built = built_worker(worker_classes(request.param)[0], config, 4)
    built.init_model()
    built.rollout = RecordingRollout(built.rollout)
    return built


def update_batch(worker):
    """One step's batch: 4 prompts x 2 samples with old log-probs, advantages +1 / -1 on alternate rows."""
    samples = worker.generate_sequences(next(build_data(worker.run_config, 1).train_loader))
    samples.meta_info["temperature"] = 1.0
    samples = samples.union(worker.compute_log_prob(samples))
    mask = samples.batch["response_mask"].float()
    sign = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(len(samples))])
    samples.batch["advantages"] = sign[:, None] * mask
    return samples


def hf_weights_of(worker) -> dict[str, torch.Tensor]:
    """The actor's weights under Hugging Face names, computed independently of the worker's sync path."""
    module = worker.actor.model_module()
    if worker.config.actor.strategy == "megatron":
        from verl.models.loading import load_hf_config
        from verl.models.mcore import export_mcore_to_hf

        return export_mcore_to_hf(module, load_hf_config(worker.config.model.path))
    return {name: tensor.clone() for name, tensor in module.state_dict().items()}


def test_weights_are_sent_after_successful_updates_only(worker, tmp_path):
    result = worker.update_actor(update_batch(worker))
    skipped = result.metrics
    # update 1 is poisoned: no update succeeded, so nothing is sent and the step says so
    assert not result.updated and (result.num_attempted_total, result.num_failed_total) == (1, 1)
    assert skipped["actor/num_updates_successful"] == 0.0
    assert worker.rollout.loads == []
    assert skipped["timing_s/weight_sync"] == 0.0 and skipped["rollout/weight_syncs"] == 0.0

    result = worker.update_actor(update_batch(worker))
    applied = result.metrics
    assert result.updated and result.num_applied_total == 1
    assert applied["actor/num_updates_successful"] == 1.0
    assert applied["rollout/weight_syncs"] == 1.0 and applied["timing_s/weight_sync"] > 0.0
    assert len(worker.rollout.loads) == 1
    sent, expected = worker.rollout.loads[0], hf_weights_of(worker)
    # every Hugging Face weight, once, with the actor's values after the update
    assert sorted(sent) == sorted(expected)
    assert all(torch.equal(sent[name], expected[name]) for name in expected)

    # a loaded checkpoint reaches the rollout too (its weights may differ from what the engine holds); the count
    # of the steps' syncs comes back from the checkpoint and the load's own send is not one of them
    worker.save_checkpoint(str(tmp_path / "ckpt"))
    worker.num_weight_syncs = 7
    worker.load_checkpoint(str(tmp_path / "ckpt"))
    assert len(worker.rollout.loads) == 2 and worker.num_weight_syncs == 1
    assert all(torch.equal(worker.rollout.loads[1][name], expected[name]) for name in expected)


def test_rollouts_without_their_own_weights_report_no_sync(worker):
    worker.rollout = worker.rollout.inner  # the naive rollout samples from the actor itself
    metrics = worker.update_actor(update_batch(worker)).metrics
    assert "rollout/weight_syncs" not in metrics and "timing_s/weight_sync" not in metrics


def test_a_rollout_with_weights_of_its_own_gets_the_actors_at_start_up(monkeypatch):
    # the engine loads model.path, but the actor may start from other weights (an adapter of model.lora_adapter_path,
    # a megatron LoRA B init that is not zero, a megatron dist checkpoint): init_model sends the actor's weights,
    # LoRA merged under the plain model's names, before any rollout
    cls = worker_classes("dp")[0]
    build_rollout = cls._build_rollout
    monkeypatch.setattr(cls, "_build_rollout", lambda self: recording(build_rollout(self)))
    config = compose_ppo_config(["actor_rollout_ref.actor.strategy=dp", *SMALL, "actor_rollout_ref.model.lora_rank=4"])
    built = built_worker(cls, config, 4)
    built.init_model()
    assert len(built.rollout.loads) == 1
    sent = built.rollout.loads[0]
    assert "model.layers.0.self_attn.q_proj.weight" in sent and not any("lora_" in name for name in sent)
    # peft's own merge of a copy says what the merged weights are
    expected = copy.deepcopy(built.actor.peft_model).merge_and_unload().state_dict()
    assert sorted(sent) == sorted(expected) and all(torch.equal(sent[n], expected[n]) for n in expected)
