"""The fsdp2 workers outside a worker group (rank 0 of 1): what init_model builds, the refused hf rollout, the
sampler's stop agreement over the actor's group, and a checkpoint written and read back by every rank (here the
one)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.workers.actor.conftest import world_of_one  # noqa: F401  (FSDP2 needs a process group)
from verl.trainer.main_ppo import worker_classes
from verl.workers.config import compose_ppo_config
from verl.workers.fsdp_workers import FSDPActorRolloutRefWorker, FSDPCriticWorker

pytestmark = pytest.mark.usefixtures("world_of_one")


def make_worker(*overrides: str, role: int = 0):
    config = compose_ppo_config(["actor_rollout_ref.actor.strategy=fsdp", *overrides])
    worker = worker_classes("fsdp")[role](config, total_training_steps=4)
    worker.init_model()
    return worker


def test_both_names_choose_the_fsdp2_workers():
    assert worker_classes("fsdp") == worker_classes("fsdp2") == (FSDPActorRolloutRefWorker, FSDPCriticWorker)


def test_the_hf_rollout_is_refused_by_the_config():
    # transformers' generate needs the whole model, and would stop each rank at its own eos
    with pytest.raises(ValueError, match=r"rollout.name=hf needs a Hugging Face actor \(strategy=dp\); use naive"):
        compose_ppo_config(["actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.rollout.name=hf"])


def test_fp16_reference_equals_the_untrained_actor():
    from verl.trainer.data_setup import build_data

    worker = make_worker("actor_rollout_ref.actor.use_kl_loss=true")
    assert worker.ref.optimizer is None and not any(p.requires_grad for p in worker.ref.model_module().parameters())
    prompts = next(build_data(worker.config, 1).train_loader)
    samples = worker.generate_sequences(prompts)
    ref = worker.compute_ref_log_prob(samples).batch["ref_log_prob"]
    actor = worker.compute_log_prob(samples).batch["old_log_probs"]
    assert ref.shape == samples.batch["responses"].shape and torch.equal(ref, actor)


def test_the_rollout_agrees_on_stopping_over_the_actors_group(monkeypatch):
    # The worker wires the sampler to the group that shards the actor: every generated token ends with one MIN
    # all-reduce over that group (what two ranks do with it is tests/special_distributed's _rollout_stop).
    from verl.trainer.data_setup import build_data
    from verl.workers.rollout import naive_rollout

    worker = make_worker()
    actor_group = worker._device_mesh(worker._compute_device).get_group()
    reductions = []
    real_all_reduce = naive_rollout.dist.all_reduce

    def recording_all_reduce(tensor, op=None, group=None):
        reductions.append((op, group))
        return real_all_reduce(tensor, op=op, group=group)

    monkeypatch.setattr(naive_rollout.dist, "all_reduce", recording_all_reduce)
    prompts = next(build_data(worker.config, 1).train_loader)
    samples = worker.generate_sequences(prompts)
    assert reductions, "the sampler never asked the other ranks whether they were done"
    assert all(op == naive_rollout.dist.ReduceOp.MIN and group is actor_group for op, group in reductions)
    # one agreement after every generated token but the response length's last (which ends the loop anyway): at
    # least as many as the longest response's tokens less one, at most response_length - 1
    longest, response_length = int(samples.batch["response_mask"].sum(-1).max()), samples.batch["responses"].shape[1]
    assert longest - 1 <= len(reductions) <= response_length - 1


def test_a_checkpoint_holds_shards_full_weights_and_an_export_with_the_tokenizer(tmp_path):
    worker = make_worker("actor_rollout_ref.actor.dtype=float32")
    worker.save_checkpoint(str(tmp_path / "actor"))
    names = {p.relative_to(tmp_path / "actor").as_posix() for p in (tmp_path / "actor").rglob("*") if p.is_file()}
    assert {"sharded/.metadata", "sharded/__0_0.distcp", "model.safetensors", "train_state.pt"} <= names
    assert {"huggingface/config.json", "huggingface/model.safetensors", "huggingface/tokenizer.json"} <= names
    assert "rng_state_rank0.pt" in names
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "actor" / "huggingface", dtype=torch.float32)
    assert exported.config.vocab_size == worker.actor.model_module().config.vocab_size
    # the checkpoint restores what it saved: weights, optimizer moments, loss scale and step count, after the
    # worker's state has been changed by a training step in between
    before = {k: v.full_tensor().clone() for k, v in worker.actor.model_module().state_dict().items()}
    before_state = worker.actor.training_state_dict()
    with torch.no_grad():
        for param in worker.actor.model_module().parameters():
            param.add_(1.0)
    worker.actor.num_update_steps += 3
    worker.load_checkpoint(str(tmp_path / "actor"))  # every rank reads its shards back
    after = {k: v.full_tensor() for k, v in worker.actor.model_module().state_dict().items()}
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert worker.actor.num_update_steps == before_state["num_update_steps"]


def test_weights_for_a_rollout_with_its_own_copy_are_whole_tensors_with_hugging_face_names():
    from safetensors.torch import load_file

    from verl.models.loading import resolve_model_path

    worker = make_worker("actor_rollout_ref.actor.dtype=float32")
    weights = dict(worker._iter_hf_weights())
    # untrained: exactly the checkpoint's tensors, whole (not DTensor shards), under its names
    expected = load_file(f"{resolve_model_path('default')}/model.safetensors")
    assert set(expected) <= set(weights)
    for name, tensor in expected.items():
        assert type(weights[name]) is torch.Tensor and torch.equal(weights[name], tensor), name


def test_padding_free_passes_reach_actor_and_reference():
    worker = make_worker("actor_rollout_ref.model.use_remove_padding=true", "actor_rollout_ref.actor.use_kl_loss=true")
    assert worker.actor.use_remove_padding and worker.ref.use_remove_padding


def test_the_critic_worker_builds_a_sharded_value_model():
    worker = make_worker("algorithm.adv_estimator=gae", "critic.model.use_remove_padding=true", role=1)
    assert type(worker.critic).__name__ == "FSDPPPOCritic"
    assert worker.critic.optimizer.get_loss_scale() == 2.0**32  # fp16 by default, with its own scaler
    assert worker.critic.critic_module.use_remove_padding


def test_cpu_linear_layers_run_on_onednn_unless_switched_off():
    from verl.utils.cpu_linear import OneDNNLinear

    def linear_types(module):
        return {type(m) for m in module.modules() if isinstance(m, torch.nn.Linear)}

    # by default every linear layer of actor, reference and critic is switched before sharding
    worker = make_worker("actor_rollout_ref.actor.use_kl_loss=true")
    assert linear_types(worker.actor.model_module()) == linear_types(worker.ref.model_module()) == {OneDNNLinear}
    critic = make_worker("algorithm.adv_estimator=gae", role=1)
    assert linear_types(critic.critic.critic_module) == {OneDNNLinear}
    off = make_worker("actor_rollout_ref.model.use_onednn_linear=false")
    assert linear_types(off.actor.model_module()) == {torch.nn.Linear}
    critic_off = make_worker("algorithm.adv_estimator=gae", "critic.model.use_onednn_linear=false", role=1)
    assert linear_types(critic_off.critic.critic_module) == {torch.nn.Linear}
