"""Tests for the reward-manager registry, the custom-scorer loaders and the naive reward manager."""

import sys

import pytest
import torch

from verl.models.loading import load_tokenizer
from verl.protocol import DataProto
from verl.workers.reward_manager import (
    NaiveRewardManager,
    get_reward_manager_cls,
    list_reward_managers,
    load_custom_reward_function,
    load_custom_score_fn,
    place_scores_on_last_token,
    register,
    register_reward_manager,
)
from verl.workers.reward_manager.registry import REWARD_MANAGER_REGISTRY

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


def test_verl_register_decorator():
    with REWARD_MANAGER_REGISTRY.scoped():  # the test's manager must not leak into other tests
        _check_verl_register_decorator()


def _check_verl_register_decorator():
    assert register_reward_manager is register  # the old name is an alias of verl's

    @register("test_constant")
    class ConstantRewardManager:
        def __init__(self, tokenizer, num_examine=0, compute_score=None, reward_fn_key="data_source"):
            self.tokenizer = tokenizer

        def __call__(self, data, return_dict=False):
            return torch.ones(len(data), data.batch["responses"].shape[1])

    assert get_reward_manager_cls("test_constant") is ConstantRewardManager
    assert "test_constant" in REWARD_MANAGER_REGISTRY.names() and "test_constant" in list_reward_managers()
    manager = get_reward_manager_cls("test_constant")(tokenizer=None)
    assert manager(_batch([([4], "x", "d")])).shape == (1, 5)
    with pytest.raises(ValueError, match="taken"):
        register("test_constant")(NaiveRewardManager)


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
    from verl.workers.reward_manager import SampleScoringError

    data = _batch([(_digits("1"), "1", "tiny_task"), (_digits("1"), "1", "mystery")])
    # the scorer's own error, under the sample it failed on (what the trainer turns into the data row)
    match = r"sample 1 of the batch \(data_source 'mystery'\): ValueError: No built-in reward scorer for data_source"
    with pytest.raises(SampleScoringError, match=match) as failed:
        NaiveRewardManager(tokenizer)(data)
    assert (failed.value.position, failed.value.data_source) == (1, "mystery")
    assert isinstance(failed.value.__cause__, ValueError)
    data = _batch([(_digits("1"), "1", "mystery")])
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

    # every error names the config key, reward_model.custom_score_fn, and what to fix
    key = r"reward_model\.custom_score_fn="
    for bad in ("my_scores.exact", "a:b:c", ":exact", "my_scores:"):
        with pytest.raises(ValueError, match=key + ".*'module.path:function'"):
            load_custom_score_fn(bad)
    with pytest.raises(ValueError, match=key + ".*importing 'no_such_module_xyz' failed.*PYTHONPATH"):
        load_custom_score_fn("no_such_module_xyz:fn")
    with pytest.raises(ValueError, match=key + ".*has no attribute 'missing'.*'exact'"):
        load_custom_score_fn("my_scores:missing")
    with pytest.raises(ValueError, match=key + ".*'NOT_A_FUNCTION' is a int, not a function"):
        load_custom_score_fn("my_scores:NOT_A_FUNCTION")
    with pytest.raises(ValueError, match=key + ".*does not exist"):
        load_custom_score_fn(f"{tmp_path / 'nope.py'}:exact")
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ValueError, match=key + ".*RuntimeError: boom"):
        load_custom_score_fn(f"{broken}:exact")


SCORER_FILE = """
from dataclasses import dataclass

THRESHOLD = 0.5


@dataclass
class Result:  # a dataclass needs its module in sys.modules while the file executes
    score: float


def my_reward(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    return Result(float(solution_str == ground_truth) + bonus).score
"""


def test_load_custom_reward_function_from_file(tmp_path, monkeypatch):
    path = tmp_path / "my_reward.py"
    path.write_text(SCORER_FILE)
    fn = load_custom_reward_function(str(path), "my_reward")
    assert fn(data_source="d", solution_str="42", ground_truth="42", extra_info=None) == 1.0
    assert fn(data_source="d", solution_str="41", ground_truth="42", extra_info=None) == 0.0
    # verl's file:// prefix and a path relative to the working directory load the same function
    monkeypatch.chdir(tmp_path)
    assert (
        load_custom_reward_function(f"file://{path}", "my_reward")(data_source="d", solution_str="a", ground_truth="a")
        == 1.0
    )
    assert (
        load_custom_reward_function("my_reward.py", "my_reward")(data_source="d", solution_str="a", ground_truth="b")
        == 0.0
    )
    # reward_kwargs are added to every call and win over the call's own (verl's rule): 1 + 0.25
    boosted = load_custom_reward_function(path, "my_reward", reward_kwargs={"bonus": 0.25})
    assert boosted(data_source="d", solution_str="a", ground_truth="a", bonus=9.0) == 1.25
    # the executed file is not left in sys.modules (Ray then ships the function by value)
    assert not [name for name in sys.modules if name.startswith("verl_custom_reward_my_reward")]


def test_load_custom_reward_function_from_package(tmp_path, monkeypatch):
    (tmp_path / "pkg_scores.py").write_text(SCORER_FILE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "pkg_scores", raising=False)
    fn = load_custom_reward_function("pkg://pkg_scores", "my_reward")
    assert fn(data_source="d", solution_str="x", ground_truth="x") == 1.0


def test_naive_manager_with_loaded_custom_reward_function(tokenizer, tmp_path):
    path = tmp_path / "exact.py"
    path.write_text(SCORER_FILE)
    manager = NaiveRewardManager(tokenizer, compute_score=load_custom_reward_function(path, "my_reward"))
    # "21" decoded against ground truth "21": exact -> 1.0 on the last valid token (index 1)
    scores = manager(_batch([(_digits("21"), "21", "any_source")]))
    assert scores[0, 1].item() == 1.0 and scores.sum().item() == 1.0


def test_load_custom_reward_function_errors(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(SCORER_FILE)
    with pytest.raises(ValueError, match=r"custom_reward_function\.path is empty"):
        load_custom_reward_function("", "my_reward")
    with pytest.raises(ValueError, match=r"custom_reward_function\.name is None"):
        load_custom_reward_function(str(path), None)
    with pytest.raises(ValueError, match=r"custom_reward_function\.path=.*does not exist"):
        load_custom_reward_function(str(tmp_path / "missing.py"), "my_reward")
    with pytest.raises(ValueError, match=r"custom_reward_function\.name='nope' is not defined.*'my_reward'"):
        load_custom_reward_function(str(path), "nope")
    with pytest.raises(ValueError, match=r"custom_reward_function\.name='THRESHOLD'.*is a float, not a function"):
        load_custom_reward_function(str(path), "THRESHOLD")
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_module_for_reward\n")
    with pytest.raises(ValueError, match=r"custom_reward_function\.path=.*ModuleNotFoundError"):
        load_custom_reward_function(str(broken), "my_reward")
    with pytest.raises(ValueError, match=r"custom_reward_function\.path='pkg://no_such_pkg_xyz'"):
        load_custom_reward_function("pkg://no_such_pkg_xyz", "my_reward")
