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
