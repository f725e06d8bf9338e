"""Tests for verl.models.mcore.recompute: megatron-core's full and selective recomputation on CPU, by torch's
checkpoint."""

from __future__ import annotations

import pytest
import torch

from verl.models.mcore import build_gpt_model, forward_logits
from verl.models.mcore.config import check_supported
from verl.models.mcore.recompute import recompute_spans


def test_spans_by_hand():
    # uniform, groups of 2 over 5 layers: [0,2) [2,4) [4,5), each recomputed as a unit
    assert recompute_spans("uniform", 2, 5) == [(0, 2, True), (2, 4, True), (4, 5, True)]
    # block 2 over 4 layers: layers 0 and 1 alone, recomputed; 2 and 3 stored as usual
    assert recompute_spans("block", 2, 4) == [(0, 1, True), (1, 2, True), (2, 3, False), (3, 4, False)]
    with pytest.raises(ValueError, match=r"recompute_method must be 'uniform' or 'block'"):
        recompute_spans("selective", 1, 2)
    with pytest.raises(ValueError, match=r"recompute_num_layers must be >= 1"):
        recompute_spans("uniform", 0, 2)


def _loss_grads_and_saved_bytes(model):
    """One training forward/backward of a fixed batch: the loss, every gradient, and the bytes autograd saved."""
    torch.manual_seed(3)
    input_ids = torch.randint(0, 64, (2, 12))
    attention_mask = torch.ones_like(input_ids)
    position_ids = torch.arange(12).expand(2, 12)
    saved = []

    def pack(tensor):
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logits = forward_logits(model, input_ids, attention_mask, position_ids)
        loss = torch.log_softmax(logits, -1).gather(-1, input_ids[..., None]).mean().neg()
    loss.backward()
    grads = {name: param.grad.clone() for name, param in model.named_parameters()}
    return loss.detach(), grads, sum(saved)


@pytest.mark.parametrize(("method", "group"), [("uniform", 1), ("uniform", 2), ("block", 1)])
def test_recomputed_step_equals_the_stored_one_and_saves_less(make_config, method, group):
    config = make_config("qwen2", num_hidden_layers=4)
    plain = build_gpt_model(config, seed=1)
    recomputed = build_gpt_model(
        config, seed=1, recompute_granularity="full", recompute_method=method, recompute_num_layers=group
    )
    want_loss, want_grads, stored_bytes = _loss_grads_and_saved_bytes(plain)
    loss, grads, recomputed_bytes = _loss_grads_and_saved_bytes(recomputed)
    # the same operations run again in the backward: equal numbers (fp32 on CPU)
    assert torch.equal(loss, want_loss)
    for name, want in want_grads.items():
        torch.testing.assert_close(grads[name], want, rtol=0, atol=1e-7, msg=name)
    # the saved-tensor hooks see each group's input (checkpoint keeps it) instead of every layer's activations
    assert recomputed_bytes < stored_bytes


def test_an_eval_forward_does_not_recompute(make_config):
    model = build_gpt_model(
        make_config("qwen2"), seed=1, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1
    )
    model.eval()
    calls = []
    model.decoder._checkpointed_forward = lambda **kwargs: calls.append(kwargs)
    with torch.no_grad():
        forward_logits(model, torch.ones(1, 4, dtype=torch.long), torch.ones(1, 4), torch.arange(4)[None])
    assert calls == []


# megatron-core's selective names -> (the class whose forward it recomputes, how to reach its instance in a layer)
SELECTIVE = {
    "core_attn": lambda layer: layer.self_attention.core_attention,
    "mlp": lambda layer: layer.mlp,
    "layernorm": lambda layer: layer.input_layernorm,
}


def _count_forwards(monkeypatch, modules: list[torch.nn.Module]) -> list[int]:
    """Every run of one of ``modules``' own forward (whether its ``__call__`` or torch's checkpoint runs it) appends 1
    to the returned list (its class's forward is wrapped; other instances of the class are not counted)."""
    calls, ids = [], {id(module) for module in modules}
    for module_class in {type(module) for module in modules}:
        forward = module_class.forward

        def counted(self, *args, _forward=forward, **kwargs):
            if id(self) in ids:
                calls.append(1)
            return _forward(self, *args, **kwargs)

        monkeypatch.setattr(module_class, "forward", counted)
    return calls


@pytest.mark.parametrize("modules", [["core_attn"], ["mlp"], ["layernorm"], ["core_attn", "mlp", "layernorm"]])
def test_selective_recomputation_gives_the_stored_gradients_and_runs_each_module_again(
    make_config, monkeypatch, modules
):
    config = make_config("qwen2")  # two layers
    plain = build_gpt_model(config, seed=1)
    recomputed = build_gpt_model(config, seed=1, recompute_granularity="selective", recompute_modules=modules)
    # megatron-core's own fields on the TransformerConfig; its CUDA-RNG path off, torch's checkpoint on instead
    assert (recomputed.config.recompute_granularity, recomputed.config.recompute_modules) == ("selective", modules)
    assert not recomputed.decoder.layers[0].recompute_mlp
    assert not recomputed.decoder.layers[0].self_attention.checkpoint_core_attention
    models = (plain, recomputed)
    calls = {
        name: _count_forwards(monkeypatch, [find(layer) for model in models for layer in model.decoder.layers])
        for name, find in SELECTIVE.items()
    }
    want_loss, want_grads, stored_bytes = _loss_grads_and_saved_bytes(plain)
    # without recomputation each module runs once per layer: 2 calls
    assert {name: len(made) for name, made in calls.items()} == dict.fromkeys(SELECTIVE, 2)
    for made in calls.values():
        made.clear()
    loss, grads, recomputed_bytes = _loss_grads_and_saved_bytes(recomputed)
    # a recomputed module runs again in the backward: 2 layers x (forward + backward) = 4 calls; the others 2
    assert {name: len(made) for name, made in calls.items()} == {n: 4 if n in modules else 2 for n in SELECTIVE}
    # the same operations on the same inputs: equal numbers (fp32 on CPU); less kept for the backward
    assert torch.equal(loss, want_loss)
    for name, want in want_grads.items():
        torch.testing.assert_close(grads[name], want, rtol=0, atol=0, msg=name)
    assert recomputed_bytes < stored_bytes


def test_selective_recomputation_stores_as_usual_without_gradients(make_config, monkeypatch):
    model = build_gpt_model(make_config("qwen2"), seed=1, recompute_granularity="selective", recompute_modules=["mlp"])
    calls = _count_forwards(monkeypatch, [layer.mlp for layer in model.decoder.layers])
    saved = []
    with torch.no_grad(), torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        forward_logits(model, torch.ones(1, 4, dtype=torch.long), torch.ones(1, 4), torch.arange(4)[None])
    assert len(calls) == 2 and saved == []  # one call per layer, nothing checkpointed


def test_a_mixture_of_experts_config_is_named(make_config):
    config = make_config("qwen2")
    config.num_experts = 8
    with pytest.raises(ValueError, match=r"mixture-of-experts model \(num_experts=8\): MoE models are out of scope"):
        check_supported(config)
