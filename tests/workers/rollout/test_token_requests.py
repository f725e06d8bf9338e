"""Tests for the token-id requests of agent loops: one batched generation answers requests of different lengths,
each cut to its own budget and stop ids, on the naive and hf rollouts."""

import pytest
import torch

from verl.workers.roles.rollout import RolloutRole
from verl.workers.rollout import HFRollout, NaiveRollout
from verl.workers.rollout.token_requests import generate_for_requests, left_padded_prompts, make_request_batch

from .conftest import PAD_ID, build_tiny_model, hf_logits_fn, sampling_options

UNUSED_EOS = 31
GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": -1}
PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [14]]


def _naive(model, eos=UNUSED_EOS):
    # the rollout's own settings (sampled, response_length 8) are replaced by each call's
    return NaiveRollout(hf_logits_fn(model), sampling_options(response_length=8, seed=0), PAD_ID, eos)


def _answer(rollout, prompts, budgets, stop=()):
    out = generate_for_requests(rollout, make_request_batch(prompts, budgets, GREEDY, stop))
    return out.non_tensor_batch


def test_left_padding_of_requests_of_different_lengths():
    batch = left_padded_prompts([[4, 5], [6, 7, 8]], pad_token_id=0).batch
    # width 3 (the longest); row 0 gets one pad on the left
    assert batch["input_ids"].tolist() == [[0, 4, 5], [6, 7, 8]]
    assert batch["attention_mask"].tolist() == [[0, 1, 1], [1, 1, 1]]
    assert batch["position_ids"].tolist() == [[0, 0, 1], [0, 1, 2]]


def test_batched_requests_answer_as_each_alone_and_keep_their_budgets(tiny_model):
    rollout = _naive(tiny_model)
    own = rollout.params
    batched = _answer(rollout, PROMPTS, [5, 2, 5])
    for row, prompt in enumerate(PROMPTS):
        alone = _answer(rollout, [prompt], [5])
        expected = alone["token_ids"][0][: [5, 2, 5][row]]
        assert batched["token_ids"][row] == expected, row
    # no eos is ever emitted (31 unused): every request runs out of its budget
    assert [len(ids) for ids in batched["token_ids"]] == [5, 2, 5]
    assert list(batched["finish_reason"]) == ["length"] * 3
    # the rollout's own settings are back after the call
    assert rollout.params is own and rollout.eos_ids == [UNUSED_EOS]


def test_log_probs_are_the_models_at_each_sampled_token(tiny_model):
    out = _answer(_naive(tiny_model), [PROMPTS[0]], [4])
    ids = PROMPTS[0] + out["token_ids"][0]
    logits = tiny_model(input_ids=torch.tensor([ids])).logits[0].float()
    # token t of the response is predicted at position len(prompt) - 1 + t; greedy log-probs at temperature 1
    expected = [
        torch.log_softmax(logits[len(PROMPTS[0]) - 1 + t], -1)[token].item()
        for t, token in enumerate(out["token_ids"][0])
    ]
    assert out["log_probs"][0] == pytest.approx(expected, abs=1e-4)


def test_a_stop_id_ends_its_request_and_is_kept(tiny_model):
    rollout = _naive(tiny_model)
    probe = _answer(rollout, [PROMPTS[1]], [6])["token_ids"][0]
    stop = probe[1]  # the second token greedy decoding emits
    first = probe.index(stop)
    out = _answer(rollout, [PROMPTS[1]], [6], stop=[stop])
    assert out["token_ids"][0] == probe[: first + 1]
    assert list(out["finish_reason"]) == ["stop"]
    assert rollout.eos_ids == [UNUSED_EOS]  # the call's stop ids were for that call only


def test_hf_rollout_answers_the_requests_as_the_naive_one(tiny_model):
    hf = HFRollout(tiny_model, sampling_options(response_length=8, seed=0), PAD_ID, UNUSED_EOS)
    assert (
        _answer(hf, PROMPTS, [4, 3, 4])["token_ids"].tolist()
        == _answer(_naive(tiny_model), PROMPTS, [4, 3, 4])["token_ids"].tolist()
    )


def test_bad_requests_are_refused():
    with pytest.raises(ValueError, match="max_tokens >= 1"):
        make_request_batch([[1, 2]], [0], GREEDY)
    with pytest.raises(ValueError, match="one max_tokens per request"):
        make_request_batch([[1, 2]], [1, 2], GREEDY)


class _SleepyEngine:
    """A stand-in engine that sleeps after each generation unless told not to; records its sleeps."""

    def __init__(self, model):
        self.inner = _naive(model)
        self.can_sleep, self.sleeps = True, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def generate_sequences(self, prompts):
        out = self.inner.generate_sequences(prompts)
        if self.can_sleep:
            self.sleeps += 1
        return out

    def sleep(self):
        self.sleeps += 1


def test_the_engine_stays_awake_between_turns_until_released():
    model = build_tiny_model()
    engine = _SleepyEngine(model)
    role = RolloutRole(sampling_options(), engine, model, "cpu")
    requests = make_request_batch([PROMPTS[0]], [2], GREEDY)
    requests.meta_info["keep_awake"] = True
    for _ in range(3):  # three turns: no sleep in between
        role.generate_tokens(requests)
    assert engine.sleeps == 0
    role.release()  # one sleep at the end, and sleeping between generations is back on
    assert (engine.sleeps, engine.can_sleep) == (1, True)
