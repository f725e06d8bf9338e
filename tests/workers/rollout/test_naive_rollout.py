"""Tests for the naive rollout: exact layout with a scripted model, repetition, seeding and greedy paths."""

import pytest
import torch

from verl.workers.rollout import NaiveRollout, naive_rollout
from verl.workers.rollout.naive_rollout import ROW_BUCKET, rows_to_keep

from .conftest import PAD_ID, VOCAB_SIZE, hf_logits_fn, make_prompts, sampling_options

EOS = 2


class ScriptedLogits:
    """A logits_fn whose argmax at generation step t of prompt row b is ``script[b][t]``; records what it was fed.

    Rows are told apart by their prompt (the prompts of a test are distinct), so the script follows each row when
    finished rows leave the batch.
    """

    def __init__(self, script, num_prompt_tokens):
        self.script = torch.tensor(script)
        self.num_prompt_tokens = num_prompt_tokens
        self.prompts = None
        self.calls = []

    def __call__(self, input_ids, attention_mask, position_ids):
        self.calls.append((input_ids.clone(), attention_mask.clone(), position_ids.clone()))
        prompt = input_ids[:, : self.num_prompt_tokens]
        if input_ids.shape[1] == self.num_prompt_tokens:
            self.prompts = prompt.clone()
        rows = [int((self.prompts == p).all(-1).nonzero()[0]) for p in prompt]
        step = input_ids.shape[1] - self.num_prompt_tokens
        logits = torch.zeros(*input_ids.shape, VOCAB_SIZE)
        logits[torch.arange(input_ids.shape[0]), -1, self.script[rows, step]] = 10.0
        return logits


def test_layout_with_eos_at_chosen_step(monkeypatch):
    # rows leave the batch one by one here (the default lets a few ride along: see the row-bucket tests)
    monkeypatch.setattr(naive_rollout, "ROW_BUCKET", 1)
    prompts = make_prompts([[5, 6], [7, 8, 9, 10]], num_prompt_tokens=4, non_tensors={"uid": ["a", "b"]})
    # row 0 emits eos at step 1; row 1 never does
    script = ScriptedLogits([[11, EOS, 13, 14, 15], [12, 13, 14, 15, 16]], num_prompt_tokens=4)
    rollout = NaiveRollout(script, sampling_options(n=1, response_length=5, do_sample=False), PAD_ID, EOS)
    out = rollout.generate_sequences(prompts)
    batch = out.batch
    assert torch.equal(batch["responses"], torch.tensor([[11, EOS, 0, 0, 0], [12, 13, 14, 15, 16]]))
    assert torch.equal(batch["response_mask"], torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]))
    assert torch.equal(batch["prompts"], prompts.batch["input_ids"])
    assert torch.equal(batch["input_ids"], torch.cat([batch["prompts"], batch["responses"]], dim=-1))
    expected_mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0, 0, 0], [1] * 9])
    assert torch.equal(batch["attention_mask"], expected_mask)
    # row 0: cumsum - 1 = [-1,-1,0,1,2,3,3,3,3] -> clamp -> [0,0,0,1,2,3,3,3,3]
    assert torch.equal(batch["position_ids"], torch.tensor([[0, 0, 0, 1, 2, 3, 3, 3, 3], list(range(9))]))
    assert batch["responses"].dtype == torch.int64 and batch["response_mask"].dtype == torch.int64
    # row 1 keeps going, so the model ran once per response token; row 0 left the batch after its eos (step 1)
    assert [call[0].shape[0] for call in script.calls] == [2, 2, 1, 1, 1]
    # first call sees the prompts with the layout's positions; later calls see row 1 only, with its positions
    assert torch.equal(script.calls[0][2], prompts.batch["position_ids"])
    ids, mask, positions = script.calls[3]
    assert torch.equal(ids, torch.tensor([[7, 8, 9, 10, 12, 13, 14]]))
    assert torch.equal(mask, torch.ones(1, 7, dtype=torch.long)) and torch.equal(positions[0], torch.arange(7))


def test_stops_early_when_all_rows_ended_and_pads_to_length():
    prompts = make_prompts([[5], [6, 7]], num_prompt_tokens=2)
    script = ScriptedLogits([[EOS, 9, 9, 9], [9, EOS, 9, 9]], num_prompt_tokens=2)
    out = NaiveRollout(
        script, sampling_options(n=1, response_length=4, temperature=0), PAD_ID, [EOS, 31]
    ).generate_sequences(prompts)
    assert len(script.calls) == 2
    assert torch.equal(out.batch["responses"], torch.tensor([[EOS, 0, 0, 0], [9, EOS, 0, 0]]))
    assert torch.equal(out.batch["response_mask"], torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0]]))


def test_n_repeats_prompts_and_non_tensors_interleaved(tiny_model, prompts):
    config = sampling_options(response_length=3, n=2, seed=0)
    out = NaiveRollout(hf_logits_fn(tiny_model), config, PAD_ID, EOS).generate_sequences(prompts)
    assert len(out) == 6
    assert out.batch["responses"].shape == (6, 3) and out.batch["input_ids"].shape == (6, 8)
    assert torch.equal(out.batch["prompts"], prompts.batch["input_ids"].repeat_interleave(2, dim=0))
    assert list(out.non_tensor_batch["uid"]) == ["a", "a", "b", "b", "c", "c"]
    assert list(out.non_tensor_batch["ground_truth"]) == ["1", "1", "2", "2", "3", "3"]
    assert out.meta_info == {"global_step": 7}


def _sample(model, prompts, **config):
    rollout = NaiveRollout(
        hf_logits_fn(model), sampling_options(**{"n": 1, "response_length": 6, **config}), PAD_ID, EOS
    )
    return rollout, rollout.generate_sequences(prompts).batch["responses"]


def test_seed_makes_sampling_reproducible(tiny_model, prompts):
    config = {"n": 2, "temperature": 1.5}
    rollout, first = _sample(tiny_model, prompts, seed=1, **config)
    _, again = _sample(tiny_model, prompts, seed=1, **config)
    _, other_seed = _sample(tiny_model, prompts, seed=2, **config)
    second_call = rollout.generate_sequences(prompts).batch["responses"]
    assert torch.equal(first, again)
    # 36 draws over 32 tokens at temperature 1.5: identical streams from different seeds are practically impossible
    assert not torch.equal(first, other_seed)
    # the generator advances: determinism is per call order, not per call
    assert not torch.equal(first, second_call)


def test_greedy_follows_argmax_of_the_model(tiny_model, prompts):
    _, responses = _sample(tiny_model, prompts, do_sample=False)
    out = NaiveRollout(hf_logits_fn(tiny_model), sampling_options(n=1, response_length=6, do_sample=False), PAD_ID, EOS)
    batch = out.generate_sequences(prompts).batch
    # one forward over the finished layout: response token t is the argmax of logits at position P + t - 1
    with torch.no_grad():
        logits = hf_logits_fn(tiny_model)(batch["input_ids"], batch["attention_mask"], batch["position_ids"])
    num_prompt_tokens = batch["prompts"].shape[1]
    argmax = logits[:, num_prompt_tokens - 1 : -1].argmax(-1)
    real = batch["response_mask"].bool()
    assert torch.equal(argmax[real], batch["responses"][real])
    assert torch.equal(responses, batch["responses"])
    # the greedy path is not a constant token (the check above would be weak otherwise)
    assert batch["responses"].unique().numel() > 3


@pytest.mark.parametrize("filters", [{"top_k": 1}, {"top_p": 1e-6}, {"temperature": 0.0}])
def test_degenerate_filters_equal_greedy(tiny_model, prompts, filters):
    _, greedy = _sample(tiny_model, prompts, do_sample=False)
    _, filtered = _sample(tiny_model, prompts, do_sample=True, seed=3, **filters)
    assert torch.equal(filtered, greedy)


def test_meta_info_can_switch_to_greedy(tiny_model, prompts):
    _, greedy = _sample(tiny_model, prompts, do_sample=False)
    rollout = NaiveRollout(hf_logits_fn(tiny_model), sampling_options(response_length=6, n=4, seed=0), PAD_ID, EOS)
    prompts.meta_info.update(do_sample=False, n=1)
    out = rollout.generate_sequences(prompts)
    assert torch.equal(out.batch["responses"], greedy)
    assert out.meta_info["do_sample"] is False


def test_bad_logits_shape_is_reported(prompts):
    rollout = NaiveRollout(
        lambda ids, mask, pos: torch.zeros(ids.shape[0], VOCAB_SIZE), sampling_options(n=1, response_length=2), 0, 2
    )
    with pytest.raises(ValueError, match=r"\(B, S, V\)"):
        rollout.generate_sequences(prompts)


@pytest.mark.parametrize(
    "num_finished, expected",
    [
        (0, None),  # nothing ended
        (3, None),  # 17 running rows need 24 > 20: the batch stays
        (13, [0, 1, 2, 3, 4, 5, 6, 7]),  # 7 running (rows 0-6) + the first finished row ride on as 8
        (20, [0]),  # all ended: one row keeps the rank in step with its peers
    ],
)
def test_the_batch_shrinks_in_steps_of_eight_rows(num_finished, expected):
    assert ROW_BUCKET == 8
    finished = torch.zeros(20, dtype=torch.bool)
    finished[20 - num_finished :] = True  # the last rows ended
    keep = rows_to_keep(finished)
    assert (keep is None and expected is None) or keep.tolist() == expected


def test_a_rollout_decodes_on_multiples_of_eight_rows_and_discards_the_riders_tokens():
    # 12 rows; row b emits eos at step b (rows 0..11), after which its script goes on with token 9
    num_rows, length = 12, 12
    script = [[9] * length for _ in range(num_rows)]
    for row in range(num_rows):
        script[row][row] = EOS
    prompts = make_prompts([[3 + row] for row in range(num_rows)], num_prompt_tokens=1)
    model = ScriptedLogits(script, num_prompt_tokens=1)
    out = NaiveRollout(
        model, sampling_options(n=1, response_length=length, do_sample=False), PAD_ID, EOS
    ).generate_sequences(prompts)
    sizes = [call[0].shape[0] for call in model.calls]
    # after step s rows 0..s have ended and 11 - s run; the batch is cut when they fit a smaller multiple of 8:
    # after step 3 (8 running: 12 -> 8), and never to fewer than 8 while one row still runs; the last eos
    # comes at step 11, so the model ran once per step: prefill + 11 decode steps
    assert sizes == [12] * 4 + [8] * 8
    # each row's response is its script up to its eos, then padding: the riders' later tokens are gone
    for row in range(num_rows):
        expected = [9] * row + [EOS] + [PAD_ID] * (length - row - 1)
        assert out.batch["responses"][row].tolist() == expected
        assert out.batch["response_mask"][row].sum() == row + 1


def test_the_token_observer_hears_each_response_token_before_the_model_produces_it():
    # what the profiler's token window listens to: index t right before the model call that yields token t
    prompts = make_prompts([[5], [6, 7]], num_prompt_tokens=2)
    script = ScriptedLogits([[EOS, 9, 9, 9], [9, EOS, 9, 9]], num_prompt_tokens=2)
    rollout = NaiveRollout(script, sampling_options(n=1, response_length=4, temperature=0), PAD_ID, EOS)
    heard = []
    rollout.token_observer = lambda index: heard.append((index, len(script.calls)))
    rollout.generate_sequences(prompts)
    # both rows end at token 1: tokens 0 and 1 are produced, by model calls 1 and 2
    assert heard == [(0, 0), (1, 1)] and len(script.calls) == 2
