"""The fsdp2 workers outside a worker group (rank 0 of 1): what init_model builds, the refused hf rollout, the
sampler's stop agreement over the actor's group, a checkpoint written and read back by every rank (here the one),
verl's fsdp_config precision keys (model_dtype, mixed_precision), its activation offload and its shared-memory model
copy (model.use_shm)."""

import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.workers.actor.conftest import world_of_one  # noqa: F401  (FSDP2 needs a process group)
from tests.workers.built import built_worker
from verl.trainer.main_ppo import worker_classes
from verl.workers.config import compose_ppo_config
from verl.workers.fsdp_workers import FSDPActorRolloutRefWorker, FSDPCriticWorker

pytestmark = pytest.mark.usefixtures("world_of_one")


def make_worker(*overrides: str, role: int = 0):
    config = compose_ppo_config(["actor_rollout_ref.actor.strategy=fsdp", *overrides])
    worker = built_worker(worker_classes("fsdp")[role], config, 4)
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
    prompts = next(build_data(worker.run_config, 1).train_loader)
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
    prompts = next(build_data(worker.run_config, 1).train_loader)
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


# ------------------------------------------------------------------ verl's fsdp_config.model_dtype / mixed_precision

ACTOR_FSDP, REF_FSDP = "actor_rollout_ref.actor.fsdp_config", "actor_rollout_ref.ref.fsdp_config"


def local_dtypes(module):
    return {p.to_local().dtype if hasattr(p, "to_local") else p.dtype for p in module.parameters()}


def test_model_dtype_loads_and_shards_each_model_in_its_dtype():
    worker = make_worker(
        "actor_rollout_ref.actor.dtype=bfloat16",
        f"{ACTOR_FSDP}.model_dtype=bf16",
        "actor_rollout_ref.actor.use_kl_loss=true",
        f"{REF_FSDP}.model_dtype=float16",
    )
    # bf16 master shards for the bf16 actor, fp16 ones for the frozen reference; the rotary frequencies (buffers)
    # stay fp32, buffer_dtype's default
    assert local_dtypes(worker.actor.model_module()) == {torch.bfloat16}
    assert local_dtypes(worker.ref.model_module()) == {torch.float16}
    for module in (worker.actor.model_module(), worker.ref.model_module()):
        assert {b.dtype for b in module.buffers()} == {torch.float32}
    assert worker.actor.optimizer.get_loss_scale() is None  # bf16 training: no loss scale


def test_verls_qwen3_next_keys_on_the_fp16_default_load_bf16_shards_and_offload_the_update_activations():
    # run_qwen3_next_80b_a3b_fsdp.sh's keys, with actor.dtype at this project's float16: the actor's weights load
    # and stay in bf16 (the fp16 compute keeps its loss scale), the reference's null model_dtype is verl's bf16 for a
    # forward-only model, and the actor's backend offloads its update's activations (the reference trains nothing)
    worker = make_worker(
        f"{ACTOR_FSDP}.model_dtype=bfloat16",
        f"+{ACTOR_FSDP}.mixed_precision.reduce_dtype=bf16",
        "actor_rollout_ref.model.enable_activation_offload=True",
        "actor_rollout_ref.actor.use_kl_loss=true",
        f"{REF_FSDP}.model_dtype=null",
    )
    assert local_dtypes(worker.actor.model_module()) == local_dtypes(worker.ref.model_module()) == {torch.bfloat16}
    assert worker.actor.optimizer.get_loss_scale() is not None  # fp16 compute: the dynamic loss scale
    assert worker.actor.backend.offload_activations and not worker.ref.backend.offload_activations


def test_an_fp16_kept_reference_gives_the_untrained_fp16_actors_log_probs_and_a_bf16_kept_one_does_not():
    # dtype float16 (the default): the actor gathers its fp32 shards as fp16 for every forward; a reference kept in
    # fp16 holds exactly those fp16 values, so its forward is the same computation, bit for bit. Kept in bf16, its
    # weights are rounded to 8 bits of mantissa first (then cast to fp16 for the gather): other numbers.
    from verl.trainer.data_setup import build_data

    for model_dtype, equal in (("fp16", True), ("bf16", False)):
        worker = make_worker("actor_rollout_ref.actor.use_kl_loss=true", f"{REF_FSDP}.model_dtype={model_dtype}")
        samples = worker.generate_sequences(next(build_data(worker.run_config, 1).train_loader))
        ref = worker.compute_ref_log_prob(samples).batch["ref_log_prob"]
        actor = worker.compute_log_prob(samples).batch["old_log_probs"]
        assert torch.equal(ref, actor) is equal, model_dtype


def test_mixed_precision_sets_the_dtypes_fsdp2_gathers_and_reduces_in(caplog):
    # verl's run_qwen3-32b_npu.sh keys on the fp16 default: fp32 shards, gathered in bf16, reduced in bf16 (FSDP2
    # keeps reduce_dtype None when it equals the gather dtype: the gradients are reduced as computed, in bf16)
    import logging

    with caplog.at_level(logging.WARNING, logger="verl.workers.actor.fsdp_actor"):
        worker = make_worker(
            f"+{ACTOR_FSDP}.mixed_precision.param_dtype=bf16",
            f"+{ACTOR_FSDP}.mixed_precision.reduce_dtype=bf16",
            f"+{ACTOR_FSDP}.mixed_precision.buffer_dtype=fp32",
        )
    assert "rounded to bf16 before each fp16 forward" in caplog.text
    module = worker.actor.model_module()
    # the weights a layer computes with are the bf16 gathered ones
    seen = []
    handle = module.model.layers[0].self_attn.q_proj.register_forward_pre_hook(
        lambda layer, args: seen.append(layer.weight.dtype)
    )
    from verl.trainer.data_setup import build_data

    worker.compute_log_prob(worker.generate_sequences(next(build_data(worker.run_config, 1).train_loader)))
    handle.remove()
    assert seen and set(seen) == {torch.bfloat16}
    # FSDP2's own record, set at the first forward
    fsdp_param = module.model.layers[0]._get_fsdp_state()._fsdp_param_group.fsdp_params[0]
    assert (fsdp_param.orig_dtype, fsdp_param.param_dtype, fsdp_param.reduce_dtype) == (
        torch.float32,
        torch.bfloat16,
        None,
    )


def test_buffer_dtype_casts_the_rotary_frequencies():
    worker = make_worker(f"{ACTOR_FSDP}.mixed_precision.buffer_dtype=bf16")
    assert {b.dtype for b in worker.actor.model_module().buffers()} == {torch.bfloat16}


def test_the_critic_keeps_bf16_master_weights_with_its_bf16_dtype():
    worker = make_worker(
        "algorithm.adv_estimator=gae",
        "critic.dtype=bfloat16",
        "critic.model.fsdp_config.model_dtype=bf16",
        role=1,
    )
    # the backbone and the fresh value head alike
    assert local_dtypes(worker.critic.critic_module) == {torch.bfloat16}


# ------------------------------------------------------------------ verl's model.use_shm


@pytest.fixture
def shm_dir(tmp_path, monkeypatch):
    """The workers' /dev/shm, here a directory of the test's own (copies are released after the test)."""
    from verl.utils import fs

    monkeypatch.setattr(fs, "SHM_DIR", str(tmp_path))
    yield tmp_path / fs.COPIES_DIR
    fs.release_shm_copies()


def saved_adapter(directory):
    """A peft adapter (rank 4) for the embedded model, with non-zero B matrices so that it changes the model."""
    from peft import get_peft_model

    from verl.models.loading import load_hf_causal_lm
    from verl.utils.lora import lora_config
    from verl.workers.config import ModelConfig, load_section

    peft_model = get_peft_model(load_hf_causal_lm(None), lora_config(load_section(ModelConfig, {"lora_rank": 4})))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.1)
    peft_model.save_pretrained(directory)
    return {k: v for k, v in peft_model.state_dict().items() if "lora_" in k}


def test_use_shm_loads_model_tokenizer_and_adapter_from_one_copy_per_node(shm_dir, tmp_path):
    from safetensors.torch import load_file

    from verl.models.loading import resolve_model_path
    from verl.utils import fs

    adapter = saved_adapter(tmp_path / "adapter")
    overrides = (
        "actor_rollout_ref.model.use_shm=true",
        "actor_rollout_ref.actor.dtype=float32",
        "actor_rollout_ref.model.lora_rank=4",
        f"actor_rollout_ref.model.lora_adapter_path={tmp_path / 'adapter'}",
    )
    worker = make_worker(*overrides)
    model = worker.config.model
    copies = sorted(p.name for p in shm_dir.iterdir() if p.is_dir())
    # two copies (the model with its tokenizer, the adapter), both where the worker now reads them
    assert len(copies) == 2 and {Path(model.path).name, Path(model.lora_adapter_path).name} == set(copies)
    assert Path(model.path).parent == shm_dir
    assert (
        load_file(Path(model.path) / "model.safetensors").keys()
        == load_file(Path(resolve_model_path("default")) / "model.safetensors").keys()
    )
    # the actor started from the copied adapter: its (non-zero) B matrices are the saved ones
    lora = {k: v.full_tensor() for k, v in worker.actor.model_module().state_dict().items() if "lora_B" in k}
    saved = {k.removeprefix("base_model.model."): v for k, v in adapter.items() if "lora_B" in k}
    assert lora.keys() == saved.keys() and len(lora) == 2 * 7  # B of the 7 linear layers of each of 2 layers
    assert all(torch.equal(lora[k], saved[k]) for k in lora)
    # another worker in this process loads the same copy, not copied again (other processes: tests/utils/test_fs.py)
    inode = (Path(model.path) / "model.safetensors").stat().st_ino
    again = make_worker(*overrides)
    assert again.config.model.path == model.path
    assert (Path(model.path) / "model.safetensors").stat().st_ino == inode
    fs.release_shm_copies()  # the process's end: no one else uses them, so they go (or their removers take them)
    deadline = time.monotonic() + 30
    while list(shm_dir.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(shm_dir.iterdir()) == []
