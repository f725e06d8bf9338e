"""The fsdp2 actor and critic on a world of one rank (gloo): same updates as dp, the fp16 step contract, the
wrap policy, the frozen reference, activation checkpointing, padding-free passes, offload on CPU, a refused
checkpoint metadata, and verl's engine keys model_dtype, enable_activation_offload and use_torch_compile.

The two-rank behaviour (shards, agreed overflow, strict stop, resume) is in tests/special_distributed."""

import logging
import pickle

import pytest
import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from tests.workers.actor.conftest import actor_config, ppo_batch, tiny_qwen2
from tests.workers.critic.conftest import critic_config, value_batch
from verl.utils.checkpoint import CheckpointError
from verl.utils.fsdp_checkpoint import SHARDED_DIR
from verl.utils.fsdp_utils import device_mesh
from verl.workers.actor.dp_actor import build_dp_actor
from verl.workers.actor.fsdp_actor import build_fsdp_actor
from verl.workers.critic.dp_critic import ValueModel, build_dp_critic
from verl.workers.critic.fsdp_critic import build_fsdp_critic

pytestmark = pytest.mark.usefixtures("world_of_one")  # FSDP2 needs a process group (conftest)


def make_fsdp_actor(
    seed=0, trainable=True, checkpointing=False, use_remove_padding=False, activation_offload=False, **overrides
):
    return build_fsdp_actor(
        actor_config(**overrides),
        tiny_qwen2(seed),
        mesh=device_mesh("cpu"),
        total_training_steps=100,
        trainable=trainable,
        enable_gradient_checkpointing=checkpointing,
        use_remove_padding=use_remove_padding,
        enable_activation_offload=activation_offload,
    )


def full_weights(module):
    return {
        k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone() for k, v in module.state_dict().items()
    }


def with_old_log_probs(actor, seed=0):
    batch = ppo_batch(seed=seed)
    batch.batch["old_log_probs"], _ = actor.compute_log_prob(batch)
    return batch


def test_fp32_update_matches_the_dp_backend():
    # One rank, fp32: the all-gather and the reduce-scatter are copies, so FSDP2 computes what dp computes; only
    # the order of the norm's sums differs (the grad norm within float rounding, the weights within 1e-6).
    dp = build_dp_actor(actor_config(), tiny_qwen2(0), total_training_steps=100)
    fsdp = make_fsdp_actor()
    batch = with_old_log_probs(dp)
    torch.testing.assert_close(with_old_log_probs(fsdp).batch["old_log_probs"], batch.batch["old_log_probs"])
    dp_metrics, fsdp_metrics = dp.update_policy(batch).metrics, fsdp.update_policy(batch).metrics
    assert fsdp_metrics["actor/update_failed"] == 0.0
    assert fsdp_metrics["actor/pg_loss"] == pytest.approx(dp_metrics["actor/pg_loss"], abs=1e-6)
    assert fsdp_metrics["actor/grad_norm"] == pytest.approx(dp_metrics["actor/grad_norm"], rel=1e-5)
    want, got = dp.actor_module.state_dict(), full_weights(fsdp.actor_module)
    assert want.keys() == got.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], atol=1e-6, rtol=0)
    # the update moved the weights (lr 1e-2): the comparison above is not between two untouched models
    assert not torch.equal(got["model.norm.weight"], tiny_qwen2(0).state_dict()["model.norm.weight"])


def test_each_decoder_layer_is_an_fsdp_unit_with_dtensor_params():
    actor = make_fsdp_actor()
    module = actor.actor_module
    assert isinstance(module, FSDPModule)
    assert all(isinstance(layer, FSDPModule) for layer in module.model.layers)  # 2 layers, each its own unit
    assert all(isinstance(p, DTensor) for p in module.parameters())
    assert actor.training_path == "fsdp2"


def test_forward_prefetch_chains_each_layer_to_the_next_and_changes_no_number():
    plain = make_fsdp_actor()
    prefetching = make_fsdp_actor(fsdp_config={"forward_prefetch": True})
    layers = prefetching.actor_module.model.layers
    # FSDP2's explicit prefetch: layer 0 gathers layer 1 before it runs; the last layer has nothing after it
    prefetched = [layer._get_fsdp_state()._states_to_forward_prefetch for layer in layers]
    assert prefetched[0] == [layers[1]._get_fsdp_state()] and prefetched[1] == []
    assert all(layer._get_fsdp_state()._states_to_forward_prefetch == [] for layer in plain.actor_module.model.layers)
    # the gather only moves earlier: log-probs are bit-identical
    batch = ppo_batch(seed=0)
    assert torch.equal(prefetching.compute_log_prob(batch)[0], plain.compute_log_prob(batch)[0])


def test_a_wrap_class_the_model_lacks_is_refused_with_the_key():
    with pytest.raises(ValueError, match=r"wrap_policy.transformer_layer_cls_to_wrap names \['LlamaDecoderLayer'\]"):
        make_fsdp_actor(fsdp_config={"wrap_policy": {"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}})


def test_fp16_overflow_skips_the_update_and_leaves_weights_and_state_untouched():
    # Loss scale 2**32 overflows the fp16 backward. Hysteresis 2: the first overflow only uses up the hysteresis
    # (scale stays 2**32), the second halves it to 2**31. Nothing is applied: weights bit for bit, no Adam state,
    # the LR schedule not advanced.
    actor = make_fsdp_actor(dtype="float16")
    batch = with_old_log_probs(actor)
    before = full_weights(actor.actor_module)
    scales = []
    for _ in range(2):
        metrics = actor.update_policy(batch).metrics
        assert metrics["actor/update_failed"] == 1.0
        scales.append(actor.optimizer.get_loss_scale())
    assert scales == [2.0**32, 2.0**31]
    assert actor.optimizer.local_found_inf  # this rank's own shards overflowed
    after = full_weights(actor.actor_module)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert len(actor.optimizer.optimizer.state) == 0
    assert actor.lr_scheduler.last_epoch == 0


def test_fp16_trains_once_the_scale_fits():
    actor = make_fsdp_actor(dtype="float16", optim={"initial_loss_scale": 1024.0})
    batch = with_old_log_probs(actor)
    first = actor.update_policy(batch).metrics
    second = actor.update_policy(batch).metrics
    # scale 1024 fits the tiny model's fp16 gradients: both updates apply, and the surrogate loss falls
    assert first["actor/update_failed"] == 0.0 and second["actor/update_failed"] == 0.0
    assert second["actor/pg_loss"] < first["actor/pg_loss"]
    assert len(actor.optimizer.optimizer.state) == len(list(actor.actor_module.parameters()))


def test_the_reference_is_frozen_and_starts_equal_to_the_actor():
    actor, ref = make_fsdp_actor(), make_fsdp_actor(trainable=False)
    assert ref.optimizer is None and ref.update_outcome_handler is None
    assert not any(p.requires_grad for p in ref.actor_module.parameters())
    batch = ppo_batch()
    torch.testing.assert_close(ref.compute_log_prob(batch)[0], actor.compute_log_prob(batch)[0], atol=0, rtol=0)
    with pytest.raises(ValueError, match="frozen"):
        ref.update_policy(with_old_log_probs(ref))


def test_activation_checkpointing_recomputes_each_layer_and_changes_no_number():
    calls = {True: 0, False: 0}
    metrics = {}
    for checkpointing in (False, True):
        actor = make_fsdp_actor(checkpointing=checkpointing)

        def count(*_, flag=checkpointing):
            calls[flag] += 1

        batch = with_old_log_probs(actor)
        # inside the layer: its FSDP2 hooks stay outside the checkpoint, what the layer computes is recomputed
        actor.actor_module.model.layers[0].mlp.register_forward_pre_hook(count)
        metrics[checkpointing] = actor.update_policy(batch).metrics
    # one mini-batch of 8 in 2 micro-batches of 4: layer 0's MLP runs forward twice; checkpointing runs it again in
    # each backward (the recompute), 4 times in all
    assert calls == {False: 2, True: 4}
    assert metrics[True]["actor/pg_loss"] == pytest.approx(metrics[False]["actor/pg_loss"], abs=1e-7)
    assert metrics[True]["actor/grad_norm"] == pytest.approx(metrics[False]["actor/grad_norm"], rel=1e-6)


def test_padding_free_passes_give_the_padded_log_probs_and_values():
    # packing drops the pad tokens only: wherever the response mask is 1, log-probs and values are the padded ones
    batch = ppo_batch()
    mask = batch.batch["response_mask"].bool()
    padded, packed = make_fsdp_actor(), make_fsdp_actor(use_remove_padding=True)
    assert packed.use_remove_padding
    want, got = padded.compute_log_prob(batch)[0], packed.compute_log_prob(batch)[0]
    torch.testing.assert_close(got[mask], want[mask], atol=1e-5, rtol=0)
    critics = [
        build_fsdp_critic(
            ValueModel.from_pretrained_lm(tiny_qwen2(0), seed=3),
            critic_config(model={"use_remove_padding": flag}),
            mesh=device_mesh("cpu"),
            total_training_steps=10,
        )
        for flag in (False, True)
    ]
    assert critics[1].critic_module.use_remove_padding and not critics[0].critic_module.use_remove_padding
    values = [c.compute_values(value_batch()) for c in critics]
    torch.testing.assert_close(values[1], values[0], atol=1e-6, rtol=0)


def test_offload_on_the_cpu_is_a_logged_no_op(caplog):
    with caplog.at_level(logging.INFO):
        actor = make_fsdp_actor(fsdp_config={"param_offload": True, "optimizer_offload": True})
    text = caplog.text
    assert "param_offload=true: the model is on the CPU already" in text
    assert "optimizer_offload=true: the optimizer state is in CPU memory already" in text
    assert actor.optimizer.offload_state is False
    assert actor.update_policy(with_old_log_probs(actor)).metrics["actor/update_failed"] == 0.0


def test_critic_fp32_update_matches_the_dp_critic():
    dp = build_dp_critic(ValueModel.from_pretrained_lm(tiny_qwen2(0), seed=3), critic_config(), total_training_steps=10)
    fsdp = build_fsdp_critic(
        ValueModel.from_pretrained_lm(tiny_qwen2(0), seed=3),
        critic_config(),
        mesh=device_mesh("cpu"),
        total_training_steps=10,
    )
    batch = value_batch()
    torch.testing.assert_close(fsdp.compute_values(batch), dp.compute_values(batch))
    dp_metrics, fsdp_metrics = dp.update_critic(batch).metrics, fsdp.update_critic(batch).metrics
    assert fsdp_metrics["critic/vf_loss"] == pytest.approx(dp_metrics["critic/vf_loss"], abs=1e-7)
    torch.testing.assert_close(fsdp.compute_values(batch), dp.compute_values(batch), atol=1e-6, rtol=0)


class _Payload:
    """What a hostile checkpoint would run on load: it creates a file."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def test_checkpoint_metadata_naming_foreign_code_is_refused_unexecuted(tmp_path):
    actor = make_fsdp_actor()
    actor.update_policy(with_old_log_probs(actor))
    actor.save_checkpoint(tmp_path / "actor")
    assert (tmp_path / "actor" / SHARDED_DIR / ".metadata").is_file()
    marker = tmp_path / "pwned"
    (tmp_path / "actor" / SHARDED_DIR / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(CheckpointError, match=r"names io\.open, which DCP metadata never holds"):
        make_fsdp_actor().load_checkpoint(tmp_path / "actor")
    assert not marker.exists()


def test_an_fsdp2_update_on_onednn_layers_matches_dp_on_torch_layers(monkeypatch):
    """The oneDNN linear layers under FSDP2: forward and backward on the gathered weights, gradients reduced as
    usual; one fp32 update agrees with dp's on torch's kernels to float rounding."""
    from verl.utils import cpu_linear

    calls = []
    matmul = cpu_linear._matmul
    monkeypatch.setattr(cpu_linear, "MIN_FLOPS", 0)  # the tiny model's products are below the threshold
    monkeypatch.setattr(cpu_linear, "_matmul", lambda *args: calls.append(1) or matmul(*args))
    dp = build_dp_actor(actor_config(), tiny_qwen2(0), total_training_steps=100)
    module = tiny_qwen2(0)
    assert cpu_linear.use_onednn_linear(module) == 15
    fsdp = build_fsdp_actor(actor_config(), module, mesh=device_mesh("cpu"), total_training_steps=100)
    batch = with_old_log_probs(dp)
    dp_metrics, fsdp_metrics = dp.update_policy(batch).metrics, fsdp.update_policy(batch).metrics
    assert calls  # the sharded model did run its products on oneDNN
    assert fsdp_metrics["actor/pg_loss"] == pytest.approx(dp_metrics["actor/pg_loss"], abs=1e-5)
    assert fsdp_metrics["actor/grad_norm"] == pytest.approx(dp_metrics["actor/grad_norm"], rel=1e-4)


@pytest.mark.parametrize("overrides", [{"use_fused_kernels": True}, {"use_torch_compile": True}])
def test_fused_kernels_and_compile_give_the_plain_update(monkeypatch, overrides):
    # fp32 on one rank: the same numbers as the plain fsdp2 actor up to the order of additions (log-probs within
    # 1e-5, as the padding-free test above; grad norm within rel 1e-5); the fused head's backward must find the
    # root's output projection gathered. The "eager" compile backend keeps Dynamo's tracing without code generation.
    import verl.workers.actor.dp_actor as dp_actor
    from verl.utils import torch_functional

    monkeypatch.setattr(dp_actor, "COMPILE_BACKEND", "eager")
    monkeypatch.setattr(torch_functional, "ENTROPY_COMPILE_BACKEND", "eager")  # fsdp_config.use_torch_compile
    batch = ppo_batch(temperature=0.7)
    plain, other = make_fsdp_actor(entropy_coeff=0.01), make_fsdp_actor(entropy_coeff=0.01, **overrides)
    (want_lp, want_ent), (got_lp, got_ent) = (a.compute_log_prob(batch, calculate_entropy=True) for a in (plain, other))
    torch.testing.assert_close(got_lp, want_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(got_ent, want_ent, atol=1e-5, rtol=0)
    want, got = plain.update_policy(batch).metrics, other.update_policy(batch).metrics
    assert got["actor/update_failed"] == 0.0
    assert got["actor/grad_norm"] == pytest.approx(want["actor/grad_norm"], rel=1e-5)


def test_one_rank_decoding_runs_the_lean_step_on_the_shards_and_matches_dp():
    # on one rank the shards are the whole weights: the rollout decodes on a plain view of them with the dp
    # backend's lean step, so its logits are the dp actor's own, bit for bit (same tensors, same code, same autocast)
    from verl.models.llama_decode import LlamaFamilyDecoder
    from verl.workers.actor.fsdp_actor import OneRankPlainDecoder

    dp = build_dp_actor(actor_config(), tiny_qwen2(0), total_training_steps=100)
    fsdp = make_fsdp_actor()
    decoder = fsdp.incremental_decoder()
    assert isinstance(decoder, OneRankPlainDecoder)
    batch = ppo_batch().batch
    prompt = slice(0, batch["input_ids"].shape[1] - batch["responses"].shape[1])
    args = (batch["input_ids"][:, prompt], batch["attention_mask"][:, prompt], batch["position_ids"][:, prompt])
    reference = dp.incremental_decoder()
    torch.testing.assert_close(decoder.prefill(*args, 3), reference.prefill(*args, 3), rtol=0, atol=0)
    assert isinstance(decoder.inner, LlamaFamilyDecoder) and decoder.inner._layers is not None  # the lean step
    mask, position = args[1], args[2][:, -1]
    for token in (5, 7):
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        position = position + 1
        tokens = torch.full((mask.shape[0],), token)
        torch.testing.assert_close(decoder.decode(tokens, mask, position), reference.decode(tokens, mask, position))
    decoder.release()
    assert all(p.is_meta for p in decoder.plain.parameters())  # the view lets the shards go between calls


def test_bf16_master_weights_train_as_bf16_shards_with_bf16_adam_state():
    # verl's fsdp_config.model_dtype=bf16 with dtype=bfloat16: the shards the optimizer updates are bf16, so are
    # their gradients (reduced in fp32, then cast to the shards' dtype) and AdamW's moments; no loss scale
    actor = make_fsdp_actor(dtype="bfloat16", fsdp_config={"model_dtype": "bf16"})  # an fp32 module, cast
    assert {p.to_local().dtype for p in actor.actor_module.parameters()} == {torch.bfloat16}
    assert {b.dtype for b in actor.actor_module.buffers()} == {torch.float32}  # buffer_dtype's default
    batch = with_old_log_probs(actor)
    before = full_weights(actor.actor_module)
    metrics = actor.update_policy(batch).metrics
    assert metrics["actor/update_failed"] == 0.0 and actor.optimizer.get_loss_scale() is None
    assert {p.to_local().dtype for p in actor.actor_module.parameters()} == {torch.bfloat16}
    assert {p.grad.to_local().dtype for p in actor.actor_module.parameters()} == {torch.bfloat16}
    moments = [s["exp_avg"] for s in actor.optimizer.optimizer.state.values()]
    assert len(moments) == len(list(actor.actor_module.parameters())) and {m.dtype for m in moments} == {torch.bfloat16}
    after = full_weights(actor.actor_module)
    assert not torch.equal(before["model.norm.weight"], after["model.norm.weight"])  # lr 1e-2 moved them


def test_an_fp32_run_computes_a_reference_stored_in_bf16_in_fp32():
    # ref.fsdp_config.model_dtype=bf16 stores the frozen reference's shards in bf16; the run computes in fp32, so
    # FSDP2 must gather them as fp32 (an empty policy would gather bf16 and the log-probs would carry bf16 rounding)
    reference = make_fsdp_actor(trainable=False, fsdp_config={"model_dtype": "bf16"})
    assert {p.to_local().dtype for p in reference.actor_module.parameters()} == {torch.bfloat16}
    seen = []
    reference.actor_module.model.layers[0].mlp.down_proj.register_forward_hook(
        lambda module, args, output: seen.append((module.weight.dtype, output.dtype))
    )
    log_probs, _ = reference.compute_log_prob(ppo_batch())
    assert seen == [(torch.float32, torch.float32)] and log_probs.dtype == torch.float32


def test_bf16_master_weights_under_fp16_compute_gather_in_fp16_and_keep_the_loss_scale(caplog):
    # verl's model_dtype=bf16 on this project's fp16 default (run_qwen3_next_80b_a3b_fsdp.sh): the shards and AdamW's
    # moments are bf16, while FSDP2 still gathers the weights in fp16 for the fp16 compute and the optimizer keeps
    # the dynamic loss scale (1024 here, which the tiny model's fp16 backward fits, as test_fp16_trains_once...)
    with caplog.at_level(logging.WARNING, logger="verl.workers.actor.fsdp_actor"):
        actor = make_fsdp_actor(
            dtype="float16", fsdp_config={"model_dtype": "bf16"}, optim={"initial_loss_scale": 1024.0}
        )
    assert "fsdp_config.model_dtype=bf16 with float16 compute: the master weights and AdamW's moments" in caplog.text
    module = actor.actor_module
    assert {p.to_local().dtype for p in module.parameters()} == {torch.bfloat16}
    seen = []
    module.model.layers[0].mlp.down_proj.register_forward_pre_hook(lambda layer, args: seen.append(layer.weight.dtype))
    batch = with_old_log_probs(actor)
    before = full_weights(module)
    metrics = actor.update_policy(batch).metrics
    assert set(seen) == {torch.float16}  # gathered for the fp16 compute, in the log-prob and the update passes
    assert metrics["actor/update_failed"] == 0.0 and actor.optimizer.get_loss_scale() == 1024.0
    assert {p.grad.to_local().dtype for p in module.parameters()} == {torch.bfloat16}
    assert not torch.equal(before["model.norm.weight"], full_weights(module)["model.norm.weight"])


def test_an_fp16_master_copy_is_refused_where_the_model_is_sharded():
    # the start-up check's rule, also where a model is built without a whole config (load_section)
    with pytest.raises(ValueError, match=r"actor_rollout_ref.actor.fsdp_config.model_dtype=fp16 would keep .*cannot"):
        make_fsdp_actor(dtype="float16", fsdp_config={"model_dtype": "fp16"})
    with pytest.raises(ValueError, match=r"the frozen reference computes no gradients"):
        make_fsdp_actor(trainable=False, fsdp_config={"mixed_precision": {"reduce_dtype": "bf16"}})


# ------------------------------------------------------------------ verl's enable_activation_offload, use_torch_compile


def saved_tensor_hooks_seen_by(module):
    """The saved-tensor hooks in force each time ``module``'s forward runs (None: none)."""
    seen = []
    module.register_forward_hook(lambda *_: seen.append(torch._C._autograd._top_saved_tensors_default_hooks(False)))
    return seen


def test_activation_offload_hooks_each_update_forward_and_change_no_number():
    # model.enable_activation_offload: the update's forward passes run under ActivationOffload's saved-tensor hooks
    # (the log-prob pass computes no gradients and saves nothing: no hooks there); on CPU nothing moves, so the
    # update is the plain one bit for bit
    from verl.utils.activation_offload import ActivationOffload

    plain, offloading = make_fsdp_actor(), make_fsdp_actor(activation_offload=True)
    seen = saved_tensor_hooks_seen_by(offloading.actor_module.model.layers[1])
    batch = with_old_log_probs(offloading)
    assert seen == [None]
    metrics, want = offloading.update_policy(batch).metrics, plain.update_policy(batch).metrics
    assert len(seen) == 1 + 2  # two micro-batches of 4 in the update
    packs = {hooks[0].__qualname__ for hooks in seen[1:]}
    assert packs == {f"{ActivationOffload.__init__.__qualname__}.<locals>.pack"}
    assert metrics["actor/pg_loss"] == want["actor/pg_loss"] and metrics["actor/grad_norm"] == want["actor/grad_norm"]
    got, expected = full_weights(offloading.actor_module), full_weights(plain.actor_module)
    assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_the_critic_offloads_its_update_activations_when_asked():
    def critic(offload):
        config = critic_config(model={"enable_activation_offload": offload})
        module = ValueModel.from_pretrained_lm(tiny_qwen2(0), seed=3)
        return build_fsdp_critic(module, config, mesh=device_mesh("cpu"), total_training_steps=10)

    assert critic(False).backend.offload_activations is False
    offloading = critic(True)
    seen = saved_tensor_hooks_seen_by(offloading.critic_module.backbone.layers[0])
    assert offloading.update_critic(value_batch()).metrics["critic/update_failed"] == 0.0
    assert seen and all(hooks is not None for hooks in seen[-2:])  # the update's two micro-batches


def test_use_torch_compile_computes_the_entropy_with_the_compiled_function(monkeypatch):
    # verl's fsdp_config.use_torch_compile (true by default) compiles the entropy function, not the model: one graph
    # per grad mode. The "eager" backend traces and guards as inductor does, without its code generation (tens of
    # seconds on this CPU; the CPU run with inductor itself is timed in the report of issue 47)
    import torch._dynamo.testing

    from verl.utils import torch_functional

    counter = torch._dynamo.testing.CompileCounterWithBackend("eager")
    monkeypatch.setattr(torch_functional, "ENTROPY_COMPILE_BACKEND", counter)
    torch._dynamo.reset()
    eager = make_fsdp_actor(entropy_coeff=0.01, fsdp_config={"use_torch_compile": False})
    compiled = make_fsdp_actor(entropy_coeff=0.01)
    assert (eager.compile_entropy, compiled.compile_entropy) == (False, True)
    batch = ppo_batch()
    want, want_entropy = eager.compute_log_prob(batch, calculate_entropy=True)
    assert counter.frame_count == 0
    got, got_entropy = compiled.compute_log_prob(batch, calculate_entropy=True)
    assert counter.frame_count == 1  # the entropy's graph; the model ran eagerly
    torch.testing.assert_close(got, want, atol=0, rtol=0)  # the log-probs are not compiled
    torch.testing.assert_close(got_entropy, want_entropy, atol=1e-6, rtol=0)
    batch.batch["old_log_probs"] = want
    want_metrics, got_metrics = eager.update_policy(batch).metrics, compiled.update_policy(batch).metrics
    assert counter.frame_count == 2  # the update's graph, with gradients
    assert got_metrics["actor/entropy"] == pytest.approx(want_metrics["actor/entropy"], rel=1e-6)
    # the frozen reference follows its own section (ref.fsdp_config.use_torch_compile)
    assert make_fsdp_actor(trainable=False, fsdp_config={"use_torch_compile": False}).compile_entropy is False


def test_a_sharded_checkpoint_without_the_optimizer_holds_the_weights_only(tmp_path):
    # checkpoint.save_contents=[model]: the DCP shards hold the weights and no optimizer moments, and a resume with
    # the same list restores the weights and starts the optimizer fresh
    from verl.utils.dcp_metadata import verify_sharded_checkpoint

    only_weights = {"checkpoint": {"save_contents": ["model"]}}
    actor = make_fsdp_actor(**only_weights)
    actor.update_policy(with_old_log_probs(actor))
    actor.save_checkpoint(tmp_path / "actor")
    saved = verify_sharded_checkpoint(tmp_path / "actor" / SHARDED_DIR).state_dict_metadata
    assert any(key.startswith("model.") for key in saved) and not any(key.startswith("optim.") for key in saved)
    resumed = make_fsdp_actor(seed=123, **only_weights)
    resumed.load_checkpoint(tmp_path / "actor")
    want, got = full_weights(actor.actor_module), full_weights(resumed.actor_module)
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    assert resumed.num_update_steps == 0 and resumed.optimizer.optimizer.state_dict()["state"] == {}
