"""Partial rollouts: a response cut by a weight switch goes on with the new weights, each token tagged by version.

Two tiny random models stand for two weight versions (A = version 0, B = version 1). The switch is staged after a
chosen number of generated tokens (as the weights thread would stage it), greedy decoding makes every token the
argmax of the model that produced it, and one forward pass of each model over the finished layout says which model
chose which token.
"""

import copy

import pytest
import torch

from verl.models.llama_decode import LlamaFamilyDecoder
from verl.workers.rollout import NaiveRollout
from verl.workers.rollout.partial import WEIGHT_VERSION_KEY, WeightSwitch

from .conftest import PAD_ID, build_tiny_model, hf_logits_fn, make_prompts, sampling_options

EOS = 2
RESPONSE_LENGTH = 8


class _StagedAfter(WeightSwitch):
    """A switch whose new weights arrive after the rollout has asked ``tokens`` times (once per generated token)."""

    def __init__(self, apply, weights, tokens: int):
        super().__init__(apply)
        self.asks, self.weights, self.tokens = 0, weights, tokens

    def requested(self) -> bool:
        self.asks += 1
        if self.asks == self.tokens:
            self.stage(self.weights, 1)
        return super().requested()


@pytest.fixture
def models():
    return two_models("cpu")


def two_models(device: str):
    """Two tiny random models of one shape (A = version 0, B = version 1), in fp32 on ``device``."""
    first = build_tiny_model("qwen2").to(device)
    torch.manual_seed(1)
    second = build_tiny_model("qwen2").to(device)
    for param in second.parameters():  # other weights: another random draw of the same shapes
        param.data.normal_(0.0, 0.5)
    return first, second


def _rollout(models, switch_after: int | None):
    """A greedy naive rollout on the lean key/value-cached decoder (the rollout workers' own) over a model that
    starts as a copy of A; the switch loads B's weights into that same module, as a rollout worker does, after
    ``switch_after`` tokens (None: a switch that never fires)."""
    module = copy.deepcopy(models[0])
    rollout = NaiveRollout(
        LlamaFamilyDecoder(module), sampling_options(n=1, response_length=RESPONSE_LENGTH, do_sample=False), PAD_ID, EOS
    )
    tokens = switch_after if switch_after is not None else 10**9
    rollout.weight_switch = _StagedAfter(module.load_state_dict, models[1].state_dict(), tokens)
    return rollout


def _prompts(device: str = "cpu"):
    prompts = make_prompts([[5, 6], [7, 8, 9, 10], [11, 12, 13, 14, 15], [16, 17, 18]], num_prompt_tokens=5)
    return prompts.to(device)


def _argmax_of(model, batch):
    """Each response position's argmax under ``model``, from one forward pass over the finished layout."""
    with torch.no_grad():
        logits = hf_logits_fn(model)(batch["input_ids"], batch["attention_mask"], batch["position_ids"])
    num_prompt_tokens = batch["prompts"].shape[1]
    return logits[:, num_prompt_tokens - 1 : -1].argmax(-1)


def check_a_switch_after_3_tokens(models, device: str) -> None:
    """The checks of a switch after 3 tokens (shared with the CUDA variant in tests/special_gpu)."""
    rollout = _rollout(models, switch_after=3)
    batch = rollout.generate_sequences(_prompts(device)).batch
    versions, real = batch[WEIGHT_VERSION_KEY], batch["response_mask"].bool()
    assert versions.shape == batch["responses"].shape == (4, RESPONSE_LENGTH)
    # tokens 0-2 came from version 0, the rest from version 1
    assert torch.equal(versions[:, :3].cpu(), torch.zeros(4, 3, dtype=torch.long))
    assert torch.equal(versions[:, 3:].cpu(), torch.ones(4, RESPONSE_LENGTH - 3, dtype=torch.long))
    assert rollout.weight_switch.version == 1
    # greedy: token t is the argmax, at its position, of the model that produced it (A before the cut, B after,
    # B seeing the prompt and A's tokens as its prompt)
    by_first, by_second = _argmax_of(models[0], batch), _argmax_of(models[1], batch)
    early, late = real.clone(), real.clone()
    early[:, 3:], late[:, :3] = False, False
    assert late.any(), "no response went past the cut: the test would check nothing after it"
    assert torch.equal(by_first[early], batch["responses"][early])
    assert torch.equal(by_second[late], batch["responses"][late])
    # and the two models disagree somewhere after the cut, so the check above tells them apart
    assert not torch.equal(by_first[late], by_second[late])
    # the rollout's log-probs of each token are those of the model that produced it (greedy, temperature 1)
    with torch.no_grad():
        logits = hf_logits_fn(models[1])(batch["input_ids"], batch["attention_mask"], batch["position_ids"])
    num_prompt_tokens = batch["prompts"].shape[1]
    second_log_probs = torch.log_softmax(logits[:, num_prompt_tokens - 1 : -1].float(), -1)
    chosen = second_log_probs.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(batch["rollout_log_probs"][late], chosen[late], atol=1e-4)


def test_without_a_switch_every_token_is_version_0_and_the_output_is_the_plain_rollout(models):
    batch = _rollout(models, switch_after=None).generate_sequences(_prompts()).batch
    plain = NaiveRollout(
        hf_logits_fn(models[0]), sampling_options(n=1, response_length=RESPONSE_LENGTH, do_sample=False), PAD_ID, EOS
    )
    expected = plain.generate_sequences(_prompts()).batch
    assert torch.equal(batch["responses"], expected["responses"])
    assert torch.allclose(batch["rollout_log_probs"], expected["rollout_log_probs"], atol=1e-5)
    assert torch.equal(batch[WEIGHT_VERSION_KEY], torch.zeros_like(batch["responses"]))


def test_a_switch_after_3_tokens_continues_each_unfinished_response_with_the_new_weights(models):
    check_a_switch_after_3_tokens(models, "cpu")


def test_staged_weights_are_applied_before_a_generation_starts(models):
    rollout = _rollout(models, switch_after=None)
    rollout.weight_switch.stage(models[1].state_dict(), 1)  # arrived between two calls
    batch = rollout.generate_sequences(_prompts()).batch
    assert torch.equal(batch[WEIGHT_VERSION_KEY], torch.ones_like(batch["responses"]))
    real = batch["response_mask"].bool()
    assert torch.equal(_argmax_of(models[1], batch)[real], batch["responses"][real])


def test_a_newer_stage_replaces_one_never_applied():
    applied = []
    switch = WeightSwitch(applied.append)
    switch.stage("v1", 1)
    switch.stage("v2", 2)
    assert switch.requested()
    assert switch.apply_staged() == 2
    assert applied == ["v2"] and not switch.requested()
    assert switch.apply_staged() == 2  # nothing staged: the version stays
