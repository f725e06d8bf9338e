"""Which models the lean decode step takes: only those whose bypassed modules compute nothing beyond its arithmetic.

The step reads each projection's weight and runs ``F.linear`` on it, and RMSNorm on each norm's weight, instead of
calling those modules. A projection with a forward of its own (an adapter, a quantised or otherwise replaced layer)
or a forward hook on any module the step bypasses would be skipped silently, so such a model must stay with the HF
decoder, which calls every module; the logits then match transformers' own forward pass, hooks and adapters
included.
"""

import logging

import pytest
import torch

from tests.tolerances import logits_tolerance
from tests.workers.rollout.conftest import VOCAB_SIZE, build_tiny_model, decoding_prompts, hf_logits_fn, step_logits
from verl.models.llama_decode import LlamaFamilyDecoder, lean_decode_refusal, supports_llama_decode
from verl.utils.cpu_linear import use_onednn_linear
from verl.workers.rollout.decoding import HFCachedDecoder, RecomputeDecoder

NUM_STEPS = 4


def build(model_type: str = "llama", **overrides):
    model = build_tiny_model(model_type, **overrides)
    model.config._attn_implementation = "sdpa"
    return model


def transformers_logits(model):
    """Each step's logits from transformers' forward pass over the whole sequence (hooks and adapters run)."""
    with torch.no_grad():
        return step_logits(RecomputeDecoder(hf_logits_fn(model)), decoding_prompts(), NUM_STEPS, drop_after=1)


def assert_matches_transformers(decoder, model):
    with torch.no_grad():
        got = step_logits(decoder, decoding_prompts(), NUM_STEPS, drop_after=1)
    for step, (a, b) in enumerate(zip(got, transformers_logits(model), strict=True)):
        tol = logits_tolerance(b, model.config, 5 + step)
        assert torch.allclose(a, b, atol=tol, rtol=0), f"step {step}: {(a - b).abs().max().item()} > {tol}"


class _LoRA(torch.nn.Module):
    """An adapter around a projection, shaped like peft's LoRA layer: ``base(x) + B(A(x))``, and the base's
    ``weight`` and ``bias`` in reach, as a reader of ``.weight`` would find them."""

    def __init__(self, base: torch.nn.Linear, rank: int = 2):
        super().__init__()
        self.base_layer = base
        self.lora_A = torch.nn.Linear(base.in_features, rank, bias=False)
        self.lora_B = torch.nn.Linear(rank, base.out_features, bias=False)
        torch.nn.init.normal_(self.lora_B.weight, std=1.0)  # peft starts B at zero; a trained adapter is not

    @property
    def weight(self):
        return self.base_layer.weight

    @property
    def bias(self):
        return self.base_layer.bias

    def forward(self, x):
        return self.base_layer(x) + self.lora_B(self.lora_A(x))


class _Doubled(torch.nn.Linear):
    """A Linear subclass with a forward of its own (as quantised layers have)."""

    def forward(self, x):
        return 2 * super().forward(x)


def _lora(model):
    mlp = model.model.layers[0].mlp
    mlp.up_proj = _LoRA(mlp.up_proj)
    return "model.layers.0.mlp.up_proj"


def _linear_subclass(model):
    model.model.layers[0].mlp.up_proj.__class__ = _Doubled
    return "model.layers.0.mlp.up_proj"


def _forward_hook(model):
    model.model.layers[0].mlp.up_proj.register_forward_hook(lambda module, args, out: 2 * out)
    return "model.layers.0.mlp.up_proj"


def _forward_pre_hook(model):
    model.model.layers[1].self_attn.v_proj.register_forward_pre_hook(lambda module, args: (3 * args[0],))
    return "model.layers.1.self_attn.v_proj"


def _hook_on_the_final_norm(model):
    model.model.norm.register_forward_hook(lambda module, args, out: -out)
    return "model.norm"


def _forward_on_the_instance(model):
    up = model.model.layers[0].mlp.up_proj
    up.forward = lambda x: 2 * torch.nn.functional.linear(x, up.weight, up.bias)
    return "model.layers.0.mlp.up_proj"


CHANGES = {
    "lora-adapter": _lora,
    "linear-subclass": _linear_subclass,
    "forward-hook": _forward_hook,
    "forward-pre-hook": _forward_pre_hook,
    "hook-on-the-final-norm": _hook_on_the_final_norm,
    "forward-on-the-instance": _forward_on_the_instance,
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_module_that_computes_more_keeps_the_model_on_transformers(change):
    from tests.workers.actor.conftest import actor_config
    from verl.workers.actor.dp_actor import build_dp_actor

    model = build()
    plain = transformers_logits(model)
    name = CHANGES[change](model)
    changed = transformers_logits(model)
    assert (changed[-1] - plain[-1]).abs().max() > 1  # the change does change the logits

    assert not supports_llama_decode(model)
    assert name in lean_decode_refusal(model)
    with pytest.raises(ValueError, match=f"cannot decode .*{name}.*use HFCachedDecoder"):
        LlamaFamilyDecoder(model)
    # the dp actor (the code that picks a decoder) gives it the HF decoder, which runs the change
    decoder = build_dp_actor(actor_config(), model, total_training_steps=1).incremental_decoder()
    assert type(decoder) is HFCachedDecoder
    model.eval()
    assert_matches_transformers(decoder, model)


def test_a_hook_added_after_the_decoder_was_built_is_honoured_from_the_next_call(caplog):
    model = build()
    decoder = LlamaFamilyDecoder(model)
    with torch.no_grad():
        step_logits(decoder, decoding_prompts(), num_steps=1, drop_after=-1)
    decoder.release()
    handle = model.model.layers[0].mlp.up_proj.register_forward_hook(lambda module, args, out: 2 * out)
    with caplog.at_level(logging.WARNING, logger="verl.models.llama_decode"):
        assert_matches_transformers(decoder, model)
    assert "lean decode step is off" in caplog.text and "model.layers.0.mlp.up_proj" in caplog.text
    handle.remove()
    batch = decoding_prompts().batch
    with torch.no_grad():
        decoder.prefill(batch["input_ids"], batch["attention_mask"], batch["position_ids"], max_new_tokens=1)
    assert decoder._layers is not None  # the lean step is back
    decoder.release()


def test_a_global_module_hook_keeps_every_model_on_transformers():
    model = build()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda module, args, out: None)
    try:
        assert "global module forward hook" in lean_decode_refusal(model)
    finally:
        handle.remove()
    assert supports_llama_decode(model)


def test_onednn_projections_and_gradient_checkpointing_keep_the_lean_step():
    model = build("qwen2")
    assert use_onednn_linear(model) == 15  # 2 layers x (q, k, v, o, gate, up, down) + lm_head
    # transformers' checkpointing hooks the embedding, which the lean step calls: its hook runs
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert model.model.embed_tokens._forward_hooks
    assert lean_decode_refusal(model) is None
    model.eval()
    assert_matches_transformers(LlamaFamilyDecoder(model), model)


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB_SIZE, n_embd=32, n_layer=2, n_head=4, n_positions=64))


@pytest.mark.parametrize(
    "make_model, why",
    [
        (lambda: build("mistral", sliding_window=4), "sliding-window attention"),
        (lambda: build("llama", hidden_act="gelu"), "activation 'gelu' is not silu"),
        (_gpt2, "model type 'gpt2'"),
    ],
    ids=["sliding-window", "gelu", "gpt2"],
)
def test_models_it_cannot_decode_stay_with_transformers(make_model, why):
    model = make_model()
    assert not supports_llama_decode(model)
    assert why in lean_decode_refusal(model)
    with pytest.raises(ValueError, match="use HFCachedDecoder"):
        LlamaFamilyDecoder(model)


def test_the_dp_actor_decodes_llama_family_models_on_the_lean_step():
    from tests.workers.actor.conftest import actor_config
    from verl.workers.actor.dp_actor import build_dp_actor

    lean = build_dp_actor(actor_config(), build("qwen2"), total_training_steps=1)
    other = build_dp_actor(actor_config(), _gpt2(), total_training_steps=1)
    assert type(lean.incremental_decoder()) is LlamaFamilyDecoder
    assert type(other.incremental_decoder()) is HFCachedDecoder
