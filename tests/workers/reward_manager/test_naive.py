"""Tests for the reward-manager registry, the custom-scorer loader and the naive reward manager."""

import sys

import pytest
import torch

from verl.models.loading import load_tokenizer
from verl.protocol import DataProto
from verl.workers.reward_manager import (
    NaiveRewardManager,
    get_reward_manager_cls,
    list_reward_managers,
    load_custom_score_fn,
    place_scores_on_last_token,
    register_reward_manager,
)

PAD, EOS = 0, 2


def _digits(text):
    return [4 + int(c) for c in text]  # '0'..'9' are ids 4..13 in the tiny vocabulary


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def _batch(rows, response_length=5, prompt_length=3):
    """rows: (response token ids, ground truth, data source); responses right-padded with pad."""
    responses = torch.full((len(rows), response_length), PAD, dtype=torch.long)
    for i, (ids, _, _) in enumerate(rows):
        responses[i, : len(ids)] = torch.tensor(ids)
    response_mask = torch.zeros_like(responses)
    for i, (ids, _, _) in enumerate(rows):
        response_mask[i, : len(ids)] = 1
    prompts = torch.ones((len(rows), prompt_length), dtype=torch.long)
    attention_mask = torch.cat([torch.ones_like(prompts), response_mask], dim=1)
    return DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "attention_mask": attention_mask},
        non_tensors={"ground_truth": [r[1] for r in rows], "data_source": [r[2] for r in rows]},
    )


def test_registry():
    assert get_reward_manager_cls("naive") is NaiveRewardManager
    assert "naive" in list_reward_managers()
    with pytest.raises(ValueError, match=r"reward_model.reward_manager.*Registered: .*naive"):
        get_reward_manager_cls("nope")

    class Other:
        pass

    with pytest.raises(ValueError, match="taken"):
        register_reward_manager("naive")(Other)
    assert register_reward_manager("naive")(NaiveRewardManager) is NaiveRewardManager  # same class: no-op


def test_place_scores_on_last_token():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    out = place_scores_on_last_token(torch.tensor([0.5, 1.0, 0.25]), mask)
    assert out.dtype == torch.float32
    # Last valid positions: 2, 0, and 0 for the empty row (its score is not dropped).
    assert out.tolist() == [[0, 0, 0.5, 0], [1.0, 0, 0, 0], [0.25, 0, 0, 0]]


def test_naive_scores_tiny_task_and_gsm8k(tokenizer):
    rows = [
        (_digits("213") + [EOS], "213", "tiny_task"),  # exact: 1.0, eos at position 3
        (_digits("21") + [EOS], "213", "tiny_task"),  # 2 of 3 positions
        (_digits("2134") + [EOS], "213", "tiny_task"),  # 3 of max(3, 4): 0.75, eos at position 4
        (_digits("21"), "213", "tiny_task"),  # cut at the length limit, no eos: last token at 1
    ]
    manager = NaiveRewardManager(tokenizer)
    scores = manager(_batch(rows))
    assert scores.shape == (4, 5) and scores.dtype == torch.float32
    expected = torch.zeros(4, 5)
    expected[0, 3], expected[1, 2], expected[2, 4], expected[3, 1] = 1.0, 2 / 3, 0.75, 2 / 3
    assert torch.allclose(scores, expected)

    gsm = [(tokenizer("#### 42", add_special_tokens=False)["input_ids"] + [EOS], "42", "openai/gsm8k")]
    out = manager(_batch(gsm, response_length=10), return_dict=True)
    # "#### 42" is 7 characters (' ' included) plus eos: the score sits at index 7.
    assert out["reward_tensor"][0, 7] == 1.0 and out["reward_tensor"].sum() == 1.0
    assert out["reward_extra_info"]["score"] == [1.0]


def test_naive_uses_response_mask_when_present(tokenizer):
    data = _batch([(_digits("21") + [EOS], "21", "tiny_task")])
    # A response_mask that ends earlier than the attention mask wins: only "2" is decoded -> 1 of 2 right.
    data.batch["response_mask"] = torch.tensor([[1, 0, 0, 0, 0]])
    assert NaiveRewardManager(tokenizer)(data)[0, 0].item() == pytest.approx(0.5)


def test_naive_custom_score_with_extra_info(tokenizer):
    def length_score(data_source, solution_str, ground_truth, extra_info=None):
        return {"score": len(solution_str) / 10, "length": len(solution_str)}

    manager = NaiveRewardManager(tokenizer, compute_score=length_score)
    out = manager(_batch([(_digits("123") + [EOS], "x", "anything")]), return_dict=True)
    assert out["reward_tensor"][0, 3].item() == pytest.approx(0.3)
    assert out["reward_extra_info"] == {"score": [pytest.approx(0.3)], "length": [3]}


def test_naive_errors(tokenizer):
    data = _batch([(_digits("1"), "1", "mystery")])
    with pytest.raises(ValueError, match="No built-in reward scorer for data_source 'mystery'"):
        NaiveRewardManager(tokenizer)(data)
    data.non_tensor_batch.pop("ground_truth")
    with pytest.raises(ValueError, match="needs non-tensor key 'ground_truth'"):
        NaiveRewardManager(tokenizer)(data)


def test_load_custom_score_fn(tmp_path, monkeypatch):
    module_file = tmp_path / "my_scores.py"
    module_file.write_text(
        "NOT_A_FUNCTION = 3\n\ndef exact(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(solution_str == ground_truth)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_scores", raising=False)
    fn = load_custom_score_fn("my_scores:exact")
    assert fn(data_source="d", solution_str="a", ground_truth="a") == 1.0
    from_file = load_custom_score_fn(f"{module_file}:exact")
    assert from_file(data_source="d", solution_str="a", ground_truth="b") == 0.0

    for bad in ("my_scores.exact", "a:b:c", ":exact", "my_scores:"):
        with pytest.raises(ValueError, match="'module.path:function'"):
            load_custom_score_fn(bad)
    with pytest.raises(ValueError, match="importing 'no_such_module_xyz' failed.*PYTHONPATH"):
        load_custom_score_fn("no_such_module_xyz:fn")
    with pytest.raises(ValueError, match="has no attribute 'missing'"):
        load_custom_score_fn("my_scores:missing")
    with pytest.raises(ValueError, match="'NOT_A_FUNCTION' is a int, not a function"):
        load_custom_score_fn("my_scores:NOT_A_FUNCTION")
    with pytest.raises(ValueError, match="does not exist"):
        load_custom_score_fn(f"{tmp_path / 'nope.py'}:exact")
