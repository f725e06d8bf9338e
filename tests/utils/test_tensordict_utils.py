"""Tests for verl.utils.tensordict_utils: building TensorDicts with per-row and batch-wide non-tensor values."""

import pytest
import torch
from tensordict import TensorDict
from tensordict.tensorclass import NonTensorData, NonTensorStack

from verl.utils import tensordict_utils as tu


def test_get_tensordict_mixes_tensors_lists_and_meta():
    td = tu.get_tensordict(
        tensor_dict={"obs": torch.arange(6).view(3, 2), "turn_scores": [[], [0.5, 0.8], [0.9]], "uid": ["a", "b", "c"]},
        non_tensor_dict={"experiment": "test", "cfg": {"lr": 0.1}},
    )
    assert list(td.batch_size) == [3]
    assert isinstance(td.get("turn_scores"), NonTensorStack) and isinstance(td.get("experiment"), NonTensorData)
    # nested lists stay one object per row instead of being stacked into a tensor
    assert tu.get(td, "turn_scores") == [[], [0.5, 0.8], [0.9]]
    assert tu.get(td, "uid") == ["a", "b", "c"]
    assert tu.get(td, "cfg") == {"lr": 0.1}
    assert torch.equal(tu.get(td, "obs"), torch.arange(6).view(3, 2))
    assert tu.get(td, "missing", "fallback") == "fallback"
    # slicing the rows slices the per-row lists too; batch-wide values stay whole
    assert tu.get(td[1:], "uid") == ["b", "c"] and tu.get(td[1:], "experiment") == "test"


def test_get_tensordict_only_meta_has_empty_batch_size():
    td = tu.get_tensordict({}, {"step": 3})
    assert list(td.batch_size) == [] and tu.get(td, "step") == 3


def test_get_tensordict_errors():
    with pytest.raises(ValueError, match="different numbers of rows"):
        tu.get_tensordict({"a": torch.zeros(2), "b": ["x", "y", "z"]})
    with pytest.raises(ValueError, match="holds tensors"):
        tu.get_tensordict({"a": [torch.zeros(1), torch.zeros(1)]})
    with pytest.raises(ValueError, match="both a per-row value and a batch-wide value"):
        tu.get_tensordict({"a": torch.zeros(2)}, {"a": 1})
    with pytest.raises(ValueError, match="has type int"):
        tu.get_tensordict({"a": 3})
    with pytest.raises(ValueError, match="jagged"):
        strided = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
        tu.get_tensordict({"a": strided})


def test_get_tensordict_accepts_jagged_nested_tensor():
    jagged = torch.nested.as_nested_tensor([torch.arange(2), torch.arange(3)], layout=torch.jagged)
    td = tu.get_tensordict({"ragged": jagged, "uid": ["a", "b"]})
    assert list(td.batch_size) == [2] and [t.tolist() for t in td["ragged"].unbind()] == [[0, 1], [0, 1, 2]]


def test_assign_helpers_and_unwrap():
    td = TensorDict({"obs": torch.zeros(2, 1)}, batch_size=[2])
    out = tu.assign_non_tensor(td, name="run", labels=["x", "y"], ready=NonTensorData(7))
    assert out is td
    assert tu.get(td, "name") == "run" and tu.get(td, "labels") == ["x", "y"] and tu.get(td, "ready") == 7
    tu.assign_non_tensor_data(td, "cfg", {"a": 1})
    tu.assign_non_tensor_stack(td, "nested", [[1], [2, 3]])
    assert tu.get_non_tensor_data(td, "cfg", None) == {"a": 1}
    assert tu.get_non_tensor_data(td, "absent", "d") == "d"
    assert tu.get(td, "nested") == [[1], [2, 3]]
    assert tu.unwrap_non_tensor_data(NonTensorData("hello")) == "hello" and tu.unwrap_non_tensor_data(5) == 5
    with pytest.raises(ValueError, match="TensorDict"):
        tu.assign_non_tensor({"a": 1}, x=1)


def _jagged(*lengths: int, start: int = 0) -> torch.Tensor:
    # rows 0..n-1 of consecutive integers: lengths (2, 3) from 0 give [0, 1] and [2, 3, 4]
    rows, value = [], start
    for length in lengths:
        rows.append(torch.arange(value, value + length))
        value += length
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def test_verl_helper_names_are_importable():
    for name in (
        "get_keys",
        "pop",
        "pop_keys",
        "index_select_tensor_dict",
        "union_tensor_dict",
        "concat_tensordict",
        "chunk_tensordict",
        "pad_to_divisor",
        "unpad",
        "contiguous",
        "make_iterator",
        "assert_tensordict_eq",
        "nested_tensor_from_tensor_list",
        "concat_nested_tensors",
        "list_of_dict_to_tensordict",
    ):
        assert callable(getattr(tu, name)), name


def test_get_keys_pop_and_pop_keys():
    td = tu.get_tensordict({"a": torch.tensor([1, 2]), "b": ["x", "y"], "c": torch.tensor([5, 6])}, {"step": 7})
    subset = tu.get_keys(td, ["b", "step"])
    assert tu.get(subset, "b") == ["x", "y"] and tu.get(subset, "step") == 7 and "a" not in subset.keys()
    with pytest.raises(KeyError):
        tu.get_keys(td, ["nope"])
    assert torch.equal(tu.pop(td, "a"), torch.tensor([1, 2])) and "a" not in td.keys()
    assert tu.pop(td, "a", "gone") == "gone"
    popped = tu.pop_keys(td, ["c", "step"])
    assert sorted(td.keys()) == ["b"] and tu.get(popped, "step") == 7
    assert torch.equal(tu.get(popped, "c"), torch.tensor([5, 6]))


def test_index_select_keeps_rows_lists_nested_and_meta():
    td = tu.get_tensordict(
        {"x": torch.tensor([10, 11, 12]), "ids": _jagged(1, 2, 3), "tag": ["p", "q", "r"]}, {"temp": 0.7}
    )
    picked = tu.index_select_tensor_dict(td, [2, 0])
    assert torch.equal(picked["x"], torch.tensor([12, 10])) and tu.get(picked, "tag") == ["r", "p"]
    # row 2 of lengths (1, 2, 3) from 0 is [3, 4, 5]; row 0 is [0]
    assert [r.tolist() for r in picked["ids"].unbind()] == [[3, 4, 5], [0]]
    assert tu.get(picked, "temp") == 0.7
    assert tu.index_select_tensor_dict(None, [0]) is None
    with pytest.raises(ValueError, match="1-D"):
        tu.index_select_tensor_dict(td, torch.zeros(1, 1, dtype=torch.long))


def test_union_adds_new_keys_and_refuses_conflicts():
    base = tu.get_tensordict({"a": torch.tensor([1, 2])})
    tu.union_tensor_dict(base, tu.get_tensordict({"a": torch.tensor([1, 2]), "b": torch.tensor([3, 4])}))
    assert torch.equal(base["b"], torch.tensor([3, 4]))
    with pytest.raises(tu.TensorDictConflict):
        tu.union_tensor_dict(base, tu.get_tensordict({"a": torch.tensor([9, 9])}))
    # verl's callers catch AssertionError: the same error is one
    with pytest.raises(AssertionError):
        tu.union_tensor_dict(base, tu.get_tensordict({"a": torch.tensor([1])}))


def test_concat_and_chunk_round_trip_with_nested_tensors():
    first = tu.get_tensordict({"ids": _jagged(2, 1), "tag": ["a", "b"]}, {"temp": 1.0})
    second = tu.get_tensordict({"ids": _jagged(3, 4, start=3), "tag": ["c", "d"]}, {"temp": 2.0})
    whole = tu.concat_tensordict([first, second])
    # rows [0,1], [2], [3,4,5], [6,7,8,9]: the values run 0..9 in order
    assert whole["ids"].values().tolist() == list(range(10))
    assert tu.get(whole, "tag") == ["a", "b", "c", "d"]
    assert tu.get(whole, "temp") == 1.0  # the first batch-wide value is kept
    halves = tu.chunk_tensordict(whole, 2)
    tu.assert_tensordict_eq(halves[0], tu.index_select_tensor_dict(whole, [0, 1]))
    assert [r.tolist() for r in halves[1]["ids"].unbind()] == [[3, 4, 5], [6, 7, 8, 9]]
    with pytest.raises(ValueError, match="equal chunks"):
        tu.chunk_tensordict(whole, 3)


def test_pad_to_divisor_and_unpad():
    td = tu.get_tensordict({"x": torch.arange(5)})
    padded, pad_size = tu.pad_to_divisor(td, 4)
    # 5 rows to the next multiple of 4 (8): 3 rows added, taken from the start
    assert pad_size == 3 and padded["x"].tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    assert tu.unpad(padded, pad_size)["x"].tolist() == [0, 1, 2, 3, 4]
    same, none_added = tu.pad_to_divisor(td, 5)
    assert same is td and none_added == 0
    # a divisor larger than the batch repeats the rows more than once: 2 rows to 5 adds 3 = [0, 1, 0]
    small, added = tu.pad_to_divisor(tu.get_tensordict({"x": torch.arange(2)}), 5)
    assert added == 3 and small["x"].tolist() == [0, 1, 0, 1, 0]


def test_make_iterator_yields_epochs_of_mini_batches():
    td = tu.get_tensordict({"x": torch.arange(6)})
    batches = list(tu.make_iterator(td, mini_batch_size=2, epochs=2))
    # 6 rows / 2 = 3 mini-batches per epoch, 2 epochs, in order without shuffle
    assert [b["x"].tolist() for b in batches] == [[0, 1], [2, 3], [4, 5]] * 2
    shuffled = [b["x"].tolist() for b in tu.make_iterator(td, 3, 1, seed=4, dataloader_kwargs={"shuffle": True})]
    again = [b["x"].tolist() for b in tu.make_iterator(td, 3, 1, seed=4, dataloader_kwargs={"shuffle": True})]
    assert shuffled == again and sorted(sum(shuffled, [])) == list(range(6))
    with pytest.raises(ValueError, match="mini-batches of 4"):
        tu.make_iterator(td, 4, 1)


def test_contiguous_and_list_of_dict():
    strided = torch.arange(12).view(3, 4)[:, :2]
    td = tu.get_tensordict({"x": strided, "tag": ["a", "b", "c"]}, {"step": 1})
    made = tu.contiguous(td)
    assert made["x"].is_contiguous() and torch.equal(made["x"], strided) and tu.get(made, "step") == 1
    items = [
        {"t": torch.zeros(2), "ids": torch.arange(1), "s": "a"},
        {"t": torch.ones(2), "ids": torch.arange(3), "s": "b"},
    ]
    built = tu.list_of_dict_to_tensordict(items)
    assert built["t"].shape == (2, 2) and built["ids"].is_nested and tu.get(built, "s") == ["a", "b"]
    with pytest.raises(AssertionError):
        tu.assert_tensordict_eq(built, tu.get_keys(built, ["t", "s"]))
