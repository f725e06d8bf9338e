"""LoRA actors (peft adapters, ``verl.utils.lora``) on the dp and fsdp2 backends: only the adapters train, a failed
fp16 update leaves them and their Adam state untouched, the reference is the base model, checkpoints round-trip
bit for bit, and the exported adapter directory is one peft loads."""

import pytest
import torch
from peft import PeftModel
from torch.distributed.tensor import DTensor

from tests.workers.actor.conftest import actor_config, ppo_batch, tiny_qwen2
from verl.utils.fsdp_utils import device_mesh
from verl.utils.lora import LORA_ADAPTER_DIR, AdaptersOffReference, add_lora_adapters
from verl.workers.actor.dp_actor import build_dp_actor
from verl.workers.actor.fsdp_actor import build_fsdp_actor
from verl.workers.config import ModelConfig, load_section

RANK = 4
# tiny_qwen2: hidden 32, 4 heads of 8 (k/v: 2 heads -> 16 wide), MLP 64, 2 layers. LoRA adds rank*(in+out) per
# targeted linear (A: rank x in, B: out x rank). Per layer with rank 4:
#   q 32->32: 4*64 = 256, k 32->16: 4*48 = 192, v: 192, o 32->32: 256,
#   gate 32->64: 4*96 = 384, up: 384, down 64->32: 384            -> 2048; two layers -> 4096.
NUM_ADAPTER_PARAMS = 4096
NUM_ADAPTER_TENSORS = 2 * 7 * 2  # A and B of 7 linear layers in each of 2 layers


pytestmark = pytest.mark.usefixtures("world_of_one")  # FSDP2 needs a process group (conftest)


def lora_model_config(**overrides):
    return load_section(ModelConfig, {"lora_rank": RANK, "lora_alpha": 8, **overrides})


def make_lora_actor(backend, seed=0, model_config=None, **overrides):
    """An actor over tiny_qwen2(seed) with adapters, as the dp/fsdp workers build it (adapters before sharding)."""
    module = tiny_qwen2(seed)
    peft_model = add_lora_adapters(module, model_config or lora_model_config())
    config = actor_config(**overrides)
    if backend == "dp":
        actor = build_dp_actor(config, module, total_training_steps=100)
    else:
        actor = build_fsdp_actor(config, module, mesh=device_mesh("cpu"), total_training_steps=100)
    actor.peft_model = peft_model
    return actor


def full(tensor):
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().clone()


def weights(actor, adapters):
    """The adapters' (``adapters=True``) or the base weights' full tensors, by name."""
    return {k: full(v) for k, v in actor.actor_module.state_dict().items() if ("lora_" in k) == adapters}


def adam_state(actor):
    """Every tensor of the optimizer state, keyed (parameter name, state key)."""
    names = {p: n for n, p in actor.actor_module.named_parameters()}
    state = actor.optimizer.optimizer.state
    return {(names[p], k): full(v) for p, entries in state.items() for k, v in entries.items()}


def with_old_log_probs(actor, seed=0):
    batch = ppo_batch(seed=seed)
    batch.batch["old_log_probs"], _ = actor.compute_log_prob(batch)
    return batch


def assert_same(before, after):
    assert before.keys() == after.keys()
    for key in before:
        assert torch.equal(before[key], after[key]), key


BACKENDS = ["dp", "fsdp2"]
FITTING_SCALE = {"initial_loss_scale": 1024.0}  # fits the tiny model's fp16 gradients (see test_fsdp_actor)


@pytest.mark.parametrize("backend", BACKENDS)
def test_only_the_adapters_train_and_the_optimizer_holds_only_them(backend):
    actor = make_lora_actor(backend, dtype="float16", optim=FITTING_SCALE)
    trainable = [p for p in actor.actor_module.parameters() if p.requires_grad]
    assert sum(p.numel() for p in trainable) == NUM_ADAPTER_PARAMS
    base_before, adapters_before = weights(actor, adapters=False), weights(actor, adapters=True)
    metrics = actor.update_policy(with_old_log_probs(actor)).metrics
    assert metrics["actor/update_failed"] == 0.0
    # AdamW state exists for the adapter tensors only: the frozen base weights have none
    assert len(actor.optimizer.optimizer.state) == NUM_ADAPTER_TENSORS
    assert_same(base_before, weights(actor, adapters=False))
    adapters_after = weights(actor, adapters=True)
    # B starts at zero (peft's init) and the update moved it
    assert any(not torch.equal(adapters_before[k], adapters_after[k]) for k in adapters_before if "lora_B" in k)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failed_fp16_update_leaves_adapters_and_adam_state_bit_for_bit(backend):
    # Update 1 applies (scale 1024 fits); the fire drill makes update 2's gradients NaN, so it is skipped.
    actor = make_lora_actor(
        backend, dtype="float16", optim=FITTING_SCALE, fault_injection={"nonfinite_grad_steps": [2]}
    )
    batch = with_old_log_probs(actor)
    assert actor.update_policy(batch).metrics["actor/update_failed"] == 0.0
    adapters, state, lr_steps = weights(actor, adapters=True), adam_state(actor), actor.lr_scheduler.last_epoch
    assert len(state) == NUM_ADAPTER_TENSORS * 3  # step, exp_avg, exp_avg_sq of each adapter tensor
    assert actor.update_policy(batch).metrics["actor/update_failed"] == 1.0
    assert_same(adapters, weights(actor, adapters=True))
    assert_same(state, adam_state(actor))
    assert actor.lr_scheduler.last_epoch == lr_steps


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_reference_is_the_base_model_with_the_adapters_off(backend):
    actor = make_lora_actor(backend, optim={"lr": 5e-2})
    batch = with_old_log_probs(actor)
    for _ in range(2):
        actor.update_policy(batch)
    base = build_dp_actor(actor_config(), tiny_qwen2(0), total_training_steps=100, trainable=False)
    expected, _ = base.compute_log_prob(batch)
    got, _ = AdaptersOffReference(actor).compute_log_prob(batch)
    trained, _ = actor.compute_log_prob(batch)
    # fp32: the adapters-off forward runs each base layer alone, the very products of the plain model
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    assert not torch.allclose(trained, expected, atol=1e-4)  # the adapters did change the policy
    # and they are trainable again afterwards (peft's context switches them back on)
    assert sum(p.numel() for p in actor.actor_module.parameters() if p.requires_grad) == NUM_ADAPTER_PARAMS


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_checkpoint_resumes_bit_for_bit(backend, tmp_path):
    # run A: update, save, update; run B: the saved state loaded into a fresh actor, then the same update
    actor = make_lora_actor(backend, dtype="float16", optim=FITTING_SCALE)
    batch = with_old_log_probs(actor)
    actor.update_policy(batch)
    actor.save_checkpoint(tmp_path / "ckpt")
    actor.update_policy(batch)
    resumed = make_lora_actor(backend, seed=1, dtype="float16", optim=FITTING_SCALE)  # other base weights
    resumed.load_checkpoint(tmp_path / "ckpt")
    resumed.update_policy(batch)
    assert_same(weights(actor, adapters=True), weights(resumed, adapters=True))
    assert_same(weights(actor, adapters=False), weights(resumed, adapters=False))
    assert_same(adam_state(actor), adam_state(resumed))
    assert actor.optimizer.get_loss_scale() == resumed.optimizer.get_loss_scale()


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_exported_adapter_loads_in_peft_and_gives_the_same_log_probs(backend, tmp_path):
    actor = make_lora_actor(backend, optim={"lr": 5e-2})
    batch = with_old_log_probs(actor)
    actor.update_policy(batch)
    actor.save_checkpoint(tmp_path / "ckpt")
    adapter_dir = tmp_path / "ckpt" / LORA_ADAPTER_DIR
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in adapter_dir.iterdir()}
    loaded = PeftModel.from_pretrained(tiny_qwen2(0), adapter_dir).eval()
    base_actor = build_dp_actor(actor_config(), loaded.base_model.model, total_training_steps=1, trainable=False)
    expected, _ = actor.compute_log_prob(batch)
    got, _ = base_actor.compute_log_prob(batch)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


HF_MODEL = {"save_contents": ["model", "optimizer", "extra", "hf_model"]}


@pytest.mark.parametrize("backend", BACKENDS)
def test_hf_model_in_save_contents_exports_the_merged_model_transformers_loads(backend, tmp_path):
    # checkpoint.save_contents += [hf_model]: huggingface/ holds W + (alpha / r) B A under the plain model's names,
    # which transformers loads as the plain Qwen2 model; its log-probs must be the LoRA actor's own
    from transformers import AutoModelForCausalLM

    actor = make_lora_actor(backend, optim={"lr": 5e-2}, checkpoint=HF_MODEL)
    batch = with_old_log_probs(actor)
    actor.update_policy(batch)  # B is no longer zero: the merge matters
    actor.save_checkpoint(tmp_path / "ckpt")
    export = tmp_path / "ckpt" / "huggingface"
    loaded = AutoModelForCausalLM.from_pretrained(export, attn_implementation="eager").float().eval()
    assert not any("lora_" in name for name in loaded.state_dict())
    plain = build_dp_actor(actor_config(), loaded, total_training_steps=1, trainable=False)
    expected, _ = actor.compute_log_prob(batch)
    torch.testing.assert_close(plain.compute_log_prob(batch)[0], expected, rtol=0, atol=1e-5)
    assert not torch.allclose(expected, batch.batch["old_log_probs"], atol=1e-5)  # the adapters moved them
    assert (tmp_path / "ckpt" / LORA_ADAPTER_DIR / "adapter_config.json").is_file()  # the adapter is still written


@pytest.mark.parametrize("backend", BACKENDS)
def test_without_hf_model_a_lora_checkpoint_writes_no_second_copy_of_the_weights(backend, tmp_path):
    actor = make_lora_actor(backend)
    actor.save_checkpoint(tmp_path / "ckpt")
    assert not (tmp_path / "ckpt" / "huggingface").exists()
    assert (tmp_path / "ckpt" / LORA_ADAPTER_DIR / "adapter_model.safetensors").is_file()


def test_hf_model_on_the_dp_backend_exports_the_full_model(tmp_path):
    # full fine-tuning on dp writes no export unless asked (fsdp2 always links one: see test_fsdp_actor)
    from transformers import AutoModelForCausalLM

    for contents, exported in ((None, False), (HF_MODEL, True)):
        overrides = {} if contents is None else {"checkpoint": contents}
        actor = build_dp_actor(actor_config(**overrides), tiny_qwen2(0), total_training_steps=1)
        actor.save_checkpoint(tmp_path / str(exported))
        assert (tmp_path / str(exported) / "huggingface").is_dir() == exported
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "True" / "huggingface").float()
    expected = tiny_qwen2(0).state_dict()
    assert all(torch.equal(tensor, expected[name]) for name, tensor in loaded.state_dict().items())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rank_in_config", [RANK, 0], ids=["rank-set", "rank-0"])
def test_lora_adapter_path_starts_from_the_saved_adapter(backend, rank_in_config, tmp_path):
    # with lora_rank 0 too (verl's rule: the adapter path alone turns LoRA on, with the adapter's own rank)
    actor = make_lora_actor(backend, optim={"lr": 5e-2})
    actor.update_policy(with_old_log_probs(actor))
    actor.save_checkpoint(tmp_path / "ckpt")
    adapter = str(tmp_path / "ckpt" / LORA_ADAPTER_DIR)
    config = lora_model_config(lora_adapter_path=adapter, lora_rank=rank_in_config)
    assert config.uses_lora
    started = make_lora_actor(backend, model_config=config)
    assert_same(weights(actor, adapters=True), weights(started, adapters=True))
    # loaded trainable: it goes on training from there
    assert sum(p.numel() for p in started.actor_module.parameters() if p.requires_grad) == NUM_ADAPTER_PARAMS


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_merged_weights_a_rollout_engine_gets_give_the_trainers_log_probs(backend):
    # what vLLM receives after an update (verl.utils.lora.merged_lora_weights): the plain model's names, each adapted
    # layer as W + (alpha / r) B A; loaded into a plain model, they must give the LoRA actor's own log-probs
    from verl.utils.lora import lora_scalings, merged_lora_weights

    actor = make_lora_actor(backend, optim={"lr": 5e-2})
    batch = with_old_log_probs(actor)
    actor.update_policy(batch)  # B is no longer zero: the merge matters
    module = actor.actor_module
    state = ((name, full(tensor)) for name, tensor in module.state_dict().items())
    merged = dict(merged_lora_weights(state, lora_scalings(module)))
    plain = tiny_qwen2(1)  # other weights: every one must come from the sync
    assert set(merged) == set(plain.state_dict())
    assert all(scale == 8 / RANK for scale in lora_scalings(module).values())
    plain.load_state_dict(merged)
    engine = build_dp_actor(actor_config(), plain, total_training_steps=1, trainable=False)
    expected, _ = actor.compute_log_prob(batch)
    torch.testing.assert_close(engine.compute_log_prob(batch)[0], expected, rtol=0, atol=1e-5)
    # the base weight alone would not do: the adapters moved the log-probs
    assert not torch.allclose(expected, batch.batch["old_log_probs"], atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_reference_pass_first_leaves_the_adapters_trainable(backend):
    # the worker's first forward can be the reference's (adapters off, no old-log-prob pass): peft's switch marks
    # the adapters frozen, and FSDP2 fixes a unit's gradient dtypes at its first forward from the parameters that
    # require gradients then; the fp16 update after it must still work and move the adapters only
    actor = make_lora_actor(backend, dtype="float16", use_kl_loss=True, optim={"lr": 1e-2, "initial_loss_scale": 1024})
    batch = ppo_batch()
    batch.batch["ref_log_prob"], _ = AdaptersOffReference(actor).compute_log_prob(batch)  # the first forward
    assert all(p.requires_grad for name, p in actor.actor_module.named_parameters() if "lora_" in name)
    batch.batch["old_log_probs"], _ = actor.compute_log_prob(batch)
    before = weights(actor, adapters=True)
    assert actor.update_policy(batch).metrics["actor/update_failed"] == 0.0
    after = weights(actor, adapters=True)
    assert any(not torch.equal(before[k], after[k]) for k in before)


# ---------------------------------------------------------------------------------------------- the critic


def make_lora_critic(backend, **overrides):
    from tests.workers.critic.conftest import critic_config
    from verl.workers.critic.dp_critic import build_dp_critic
    from verl.workers.critic.fsdp_critic import build_fsdp_critic

    config = critic_config(model={"lora_rank": RANK, "lora_alpha": 8}, **overrides)
    if backend == "dp":
        return build_dp_critic(tiny_qwen2(0), config, total_training_steps=100)
    return build_fsdp_critic(tiny_qwen2(0), config, mesh=device_mesh("cpu"), total_training_steps=100)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_lora_critic_trains_its_adapters_and_value_head_only(backend):
    from tests.workers.critic.conftest import value_batch

    critic = make_lora_critic(backend)
    module = critic.model_module()
    trainable = {name for name, p in module.named_parameters() if p.requires_grad}
    # the actor's adapters on the same backbone (the LM head is not in the backbone: all-linear never targets it)
    # plus the value head's weight (32) and bias (1)
    assert {n for n in trainable if "lora_" not in n} == {"value_head.weight", "value_head.bias"}
    numel = sum(p.numel() for n, p in module.named_parameters() if n in trainable)
    assert numel == NUM_ADAPTER_PARAMS + 33
    held = [p for group in critic.optimizer.param_groups for p in group["params"]]
    assert sum(p.numel() for p in held) == numel  # the optimizer holds the trainable parameters only
    before = {k: full(v) for k, v in module.state_dict().items()}
    metrics = critic.update_critic(value_batch()).metrics
    assert metrics["critic/update_failed"] == 0.0
    after = {k: full(v) for k, v in module.state_dict().items()}
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert "value_head.weight" in changed and any("lora_B" in k for k in changed)
    assert all("lora_" in k or k.startswith("value_head") for k in changed)  # the base weights never move


def test_critic_lora_takes_its_backends_form_and_is_checked_against_the_model():
    from verl.workers.config import compose_ppo_config

    gae = ["algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=8"]
    with pytest.raises(ValueError, match=r"critic.model.lora_rank=8 is the dp/fsdp form of LoRA"):
        compose_ppo_config([*gae, "critic.strategy=megatron", "critic.model.lora_rank=8"])
    with pytest.raises(ValueError, match=r"critic.model.lora_rank=64 is larger than the width of .*k_proj"):
        compose_ppo_config([*gae, "critic.model.lora_rank=64"])
    assert compose_ppo_config([*gae, "critic.model.lora_rank=8"]).critic.model.lora_rank == 8


def test_critic_targets_that_name_no_layer_are_named_in_the_error():
    # the critic's model section has no exclude_modules: the error about its targets must still be the ValueError
    from verl.workers.config import CriticConfig

    critic_model = load_section(CriticConfig, {"model": {"lora_rank": 4, "target_modules": ["no_such_proj"]}}).model
    assert not hasattr(critic_model, "exclude_modules")
    with pytest.raises(ValueError, match=r"critic.model.target_modules=\['no_such_proj'\] \(with exclude_modules=None"):
        add_lora_adapters(tiny_qwen2(0), critic_model, key="critic.model")
