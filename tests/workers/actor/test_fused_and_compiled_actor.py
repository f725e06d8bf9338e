"""The actor with ``model.use_fused_kernels`` (chunked log-probs and entropy from hidden states) and with
``actor.use_torch_compile`` computes what the plain eager actor computes; what cannot work is refused by name.

Tolerances: both variants run the same float32 model; the fused head only regroups the output product and the
softmax sums by chunk, and the compiled graph only reorders the same operations, so log-probs agree within the
decoder's reordering bound (:func:`tests.tolerances.logits_tolerance`, twice: a log-prob is a logit minus a
log-sum-exp of logits) and gradients within :func:`tests.tolerances.assert_gradients_close`'s.
"""

import pytest
import torch
import torch._dynamo.testing

import verl.workers.actor.dp_actor as dp_actor
from tests.tolerances import assert_gradients_close, logits_tolerance
from tests.workers.actor.conftest import actor_config, ppo_batch, tiny_qwen2
from verl.workers.actor.dp_actor import build_dp_actor
from verl.workers.config import ActorConfig, ModelConfig, load_section


def make_actor(use_remove_padding=False, **overrides):
    config = actor_config(entropy_coeff=0.01, **overrides)
    return build_dp_actor(config, tiny_qwen2(0), total_training_steps=10, use_remove_padding=use_remove_padding)


def log_prob_tolerance(log_probs, module, batch):
    return 2 * logits_tolerance(log_probs, module.config, batch.batch["input_ids"].shape[1])


@pytest.mark.parametrize("use_remove_padding", [False, True])
def test_an_update_with_fused_kernels_equals_one_without(use_remove_padding):
    # temperature 0.7 and an entropy bonus: the fused head's temperature and entropy gradient are both on the path
    batch = ppo_batch(temperature=0.7)
    plain, fused = make_actor(use_remove_padding), make_actor(use_remove_padding, use_fused_kernels=True)
    assert fused.config.use_fused_kernels and not plain.config.use_fused_kernels
    (want_lp, want_ent), (got_lp, got_ent) = (a.compute_log_prob(batch, calculate_entropy=True) for a in (plain, fused))
    mask = batch.batch["response_mask"].bool()
    tol = log_prob_tolerance(want_lp, plain.actor_module, batch)
    torch.testing.assert_close(got_lp[mask], want_lp[mask], atol=tol, rtol=0)
    torch.testing.assert_close(got_ent[mask], want_ent[mask], atol=tol, rtol=0)
    want, got = plain.update_policy(batch).metrics, fused.update_policy(batch).metrics
    assert got["actor/update_failed"] == 0.0
    assert got["actor/entropy"] == pytest.approx(want["actor/entropy"], abs=tol)
    assert got["actor/grad_norm"] == pytest.approx(want["actor/grad_norm"], rel=1e-4)
    assert_gradients_close(plain.actor_module, fused.actor_module, batch.batch["input_ids"].shape[1])


def test_fused_kernels_leave_the_rollout_decoding_untouched():
    # the hook that computes the fused head only acts inside the actor's own log-prob passes
    fused = make_actor(use_fused_kernels=True)
    batch = ppo_batch()
    out = fused.actor_module(input_ids=batch.batch["input_ids"], use_cache=False)
    assert out.logits.shape[-1] == fused.actor_module.config.vocab_size
    assert fused._fused_request is None


def test_fused_kernels_need_a_hugging_face_lm_head():
    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(8, 8)

        def forward(self, input_ids, attention_mask=None, position_ids=None):
            return self.embed(input_ids)

    with pytest.raises(ValueError, match="use_fused_kernels=true needs a Hugging Face causal LM"):
        build_dp_actor(actor_config(use_fused_kernels=True), Logits(), total_training_steps=1)


def batch_of(num_samples, seed, leading_pad_columns=0):
    batch = ppo_batch(num_samples, seed)
    if leading_pad_columns:
        mask = batch.batch["attention_mask"]
        mask[:, :leading_pad_columns] = 0
        batch.batch["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)
    return batch


@pytest.mark.parametrize("use_remove_padding", [False, True])
def test_compiled_forward_equals_eager_and_new_shapes_do_not_recompile(monkeypatch, use_remove_padding):
    # the "eager" backend: Dynamo's tracing, guards and recompilation as with inductor, without inductor's C++ code
    # generation (minutes per graph on this CPU; inductor's numbers are compared in benchmarks/bench_fused_compile.py)
    counter = torch._dynamo.testing.CompileCounterWithBackend("eager")
    monkeypatch.setattr(dp_actor, "COMPILE_BACKEND", counter)
    torch._dynamo.reset()
    eager, compiled = make_actor(use_remove_padding), make_actor(use_remove_padding, use_torch_compile=True)
    assert isinstance(compiled._call_module, dp_actor.CompiledModuleCall)
    # warm-up: both grad modes, two batch sizes, a batch whose padding columns are trimmed away
    for batch in (batch_of(8, 0), batch_of(4, 1, leading_pad_columns=2)):
        want, got = (
            eager.compute_log_prob(batch, calculate_entropy=True),
            compiled.compute_log_prob(batch, calculate_entropy=True),
        )
        tol = log_prob_tolerance(want[0], eager.actor_module, batch)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=tol, rtol=0)
    update = batch_of(8, 2)
    want, got = eager.update_policy(update).metrics, compiled.update_policy(update).metrics
    assert got["actor/grad_norm"] == pytest.approx(want["actor/grad_norm"], rel=1e-4)
    assert_gradients_close(eager.actor_module, compiled.actor_module, update.batch["input_ids"].shape[1])
    # new batch sizes and lengths reuse the graphs (dynamic shapes): one graph per grad mode, and with padded rows
    # one more per grad mode for a data-dependent branch of transformers' mask code (packed rows carry their own
    # mask), however many shapes pass
    for batch in (batch_of(6, 3), batch_of(3, 4, leading_pad_columns=1), batch_of(5, 5)):
        compiled.compute_log_prob(batch, calculate_entropy=True)
    compiled.update_policy(batch_of(8, 6, leading_pad_columns=1))
    num_graphs = counter.frame_count
    assert 2 <= num_graphs <= (2 if use_remove_padding else 4)
    for batch in (batch_of(7, 7), batch_of(2, 8, leading_pad_columns=2)):
        compiled.compute_log_prob(batch, calculate_entropy=True)
    compiled.update_policy(batch_of(8, 9, leading_pad_columns=2))
    assert counter.frame_count == num_graphs


def test_the_reference_is_compiled_with_the_actor(monkeypatch):
    monkeypatch.setattr(dp_actor, "COMPILE_BACKEND", "eager")
    ref = build_dp_actor(actor_config(use_torch_compile=True), tiny_qwen2(0), total_training_steps=1, trainable=False)
    assert isinstance(ref._call_module, dp_actor.CompiledModuleCall)


def test_every_backend_takes_compile_and_fused_kernels():
    # megatron compiles the entropy and computes fused log-probs in its output layer (test_megatron_actor.py)
    for strategy in ("dp", "fsdp2", "megatron"):
        config = load_section(ActorConfig, {"strategy": strategy, "use_torch_compile": True, "use_fused_kernels": True})
        assert config.use_torch_compile and config.use_fused_kernels


def test_verls_backend_names_are_accepted_and_others_refused():
    assert load_section(ModelConfig, {"use_fused_kernels": True}).fused_kernel_options.impl_backend == "torch"
    # verl's scripts name its Triton kernel; the chunked PyTorch kernel serves it (the same numbers)
    triton = load_section(ModelConfig, {"use_fused_kernels": True, "fused_kernel_options": {"impl_backend": "triton"}})
    assert triton.use_fused_kernels and triton.fused_kernel_options.impl_backend == "triton"
    with pytest.raises(ValueError, match=r"impl_backend='cuda' is not supported; use one of 'torch', 'triton'"):
        load_section(ModelConfig, {"fused_kernel_options": {"impl_backend": "cuda"}})
