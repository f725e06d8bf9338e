"""Tests for verl.protocol_ops (imported from verl.protocol, where verl users find them): merging and comparing
the parts of a DataProto, padding, folding and byte encoding."""

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tests.test_protocol import acts, make_data
from verl.protocol import (
    deserialize_single_tensor,
    deserialize_tensordict,
    fold_batch_dim,
    list_of_dict_to_dict_of_list,
    pad_dataproto_to_divisor,
    serialize_single_tensor,
    serialize_tensordict,
    unfold_batch_dim,
    union_numpy_dict,
    union_tensor_dict,
    unpad_dataproto,
)

# ---------------------------------------------------------------- merging


def test_union_tensor_dict_function():
    left = TensorDict({"a": torch.arange(3)}, batch_size=[3])
    out = union_tensor_dict(left, TensorDict({"a": torch.arange(3), "b": torch.ones(3)}, batch_size=[3]))
    assert out is left and sorted(left.keys()) == ["a", "b"]
    with pytest.raises(ValueError, match="union conflict.*`a`"):
        union_tensor_dict(left, TensorDict({"a": torch.tensor([0, 1, 5])}, batch_size=[3]))
    with pytest.raises(ValueError, match="batch sizes"):
        union_tensor_dict(left, TensorDict({}, batch_size=[2]))


def test_union_numpy_dict_function():
    left = {"a": np.array(["x", "y"], dtype=object)}
    out = union_numpy_dict(left, {"a": np.array(["x", "y"], dtype=object), "b": np.array([1, 2])})
    assert out is left and left["b"].tolist() == [1, 2]
    with pytest.raises(ValueError, match="union conflict.*`a`"):
        union_numpy_dict(left, {"a": np.array(["x", "z"], dtype=object)})
    with pytest.raises(ValueError, match="not a numpy array"):
        union_numpy_dict(left, {"c": [1, 2]})


def test_union_accepts_equal_copies_and_refuses_different_values_as_assertion_errors():
    obs = torch.arange(6).view(3, 2)
    left = TensorDict({"obs": obs}, batch_size=[3])
    union_tensor_dict(left, TensorDict({"obs": obs.clone(), "rew": torch.ones(3)}, batch_size=[3]))
    assert sorted(left.keys()) == ["obs", "rew"]
    with pytest.raises(AssertionError, match="`rew`"):
        union_tensor_dict(left, TensorDict({"rew": torch.zeros(3)}, batch_size=[3]))
    grid = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    union_numpy_dict({"grid": grid}, {"grid": grid.copy()})
    # verl's message, which verl users' code may match, is part of ours
    with pytest.raises(AssertionError, match="`grid` in tensor_dict1 and tensor_dict2 are not the same object."):
        union_numpy_dict({"grid": grid}, {"grid": grid + 1})


def test_union_numpy_dict_compares_object_arrays_deeply():
    mixed = np.array([1, "hello", np.array([2, 3])], dtype=object)
    union_numpy_dict({"a": mixed}, {"a": np.array([1, "hello", np.array([2, 3])], dtype=object)})
    nested = np.array([[np.array([1, 2]), "text"], [np.array([3.0, 4.0]), None]], dtype=object)
    union_numpy_dict({"a": nested}, {"a": nested.copy()})
    changed = nested.copy()
    changed[1, 1] = "other"
    with pytest.raises(AssertionError):
        union_numpy_dict({"a": nested}, {"a": changed})
    # NaN equals NaN in the same place, but not a number elsewhere, nor the string "nan"
    union_numpy_dict({"a": np.array([1.0, np.nan])}, {"a": np.array([1.0, np.nan])})
    for other in (np.array([np.nan, 1.0]), np.array([1.0, 2.0])):
        with pytest.raises(AssertionError):
            union_numpy_dict({"a": np.array([1.0, np.nan])}, {"a": other})
    with pytest.raises(AssertionError):
        union_numpy_dict({"a": np.array([np.nan], dtype=object)}, {"a": np.array(["nan"], dtype=object)})


def test_union_numpy_dict_handles_reference_cycles():
    def self_referencing() -> np.ndarray:
        array = np.array([None], dtype=object)
        array[0] = array
        return array

    # two distinct arrays of the same cyclic shape are equal (no RecursionError) ...
    union_numpy_dict({"a": self_referencing()}, {"a": self_referencing()})
    # ... and differ from an array without the cycle
    with pytest.raises(AssertionError):
        union_numpy_dict({"a": self_referencing()}, {"a": np.array([None], dtype=object)})


def test_list_of_dict_to_dict_of_list():
    assert list_of_dict_to_dict_of_list([{"a": 1, "b": 2}, {"a": 3, "b": 4}]) == {"a": [1, 3], "b": [2, 4]}
    assert list_of_dict_to_dict_of_list([]) == {}
    with pytest.raises(ValueError, match="'c'"):
        list_of_dict_to_dict_of_list([{"a": 1}, {"c": 2}])


# ---------------------------------------------------------------- padding


def test_pad_repeats_rows_from_start_and_unpad_inverts():
    data = make_data(5)
    padded, pad_size = pad_dataproto_to_divisor(data, 4)
    assert pad_size == 3  # 5 -> 8
    assert acts(padded) == [0, 1, 2, 3, 4, 0, 1, 2]
    assert padded.non_tensor_batch["uid"].tolist()[5:] == ["u0", "u1", "u2"]
    restored = unpad_dataproto(padded, pad_size)
    assert torch.equal(restored.batch["obs"], data.batch["obs"])
    assert restored.non_tensor_batch["uid"].tolist() == data.non_tensor_batch["uid"].tolist()


def test_pad_cycles_when_padding_exceeds_length():
    padded, pad_size = pad_dataproto_to_divisor(make_data(2), 5)
    assert pad_size == 3 and acts(padded) == [0, 1, 0, 1, 0]


def test_pad_noop_when_divisible():
    data = make_data(4)
    padded, pad_size = pad_dataproto_to_divisor(data, 2)
    assert pad_size == 0 and acts(padded) == [0, 1, 2, 3]
    assert acts(unpad_dataproto(padded, 0)) == [0, 1, 2, 3]


def test_pad_errors():
    with pytest.raises(ValueError, match="positive"):
        pad_dataproto_to_divisor(make_data(), 0)
    with pytest.raises(ValueError, match="pad_size"):
        unpad_dataproto(make_data(2), 3)


# ---------------------------------------------------------------- fold / unfold


def test_fold_and_unfold_batch_dim():
    data = make_data(6)  # obs (6, 2), act (6,), uid (6,)
    folded = fold_batch_dim(data, 2)
    # 6 rows into 2 groups of 3 consecutive rows: group 1 holds rows 3, 4, 5
    assert len(folded) == 2
    assert folded.batch["act"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert folded.batch["obs"].shape == (2, 3, 2) and folded.batch["obs"][1, 0].tolist() == [6, 7]
    assert folded.non_tensor_batch["uid"][1].tolist() == ["u3", "u4", "u5"]
    assert len(data) == 6 and data.non_tensor_batch["uid"].shape == (6,)  # the input is unchanged
    back = unfold_batch_dim(folded, batch_dims=2)
    assert torch.equal(back.batch["obs"], data.batch["obs"]) and acts(back) == list(range(6))
    assert back.non_tensor_batch["uid"].tolist() == data.non_tensor_batch["uid"].tolist()
    assert back.meta_info == {"temperature": 1.0}


def test_fold_errors():
    with pytest.raises(ValueError, match="divisor of the 5 rows"):
        fold_batch_dim(make_data(5), 2)
    with pytest.raises(ValueError, match="batch_dims"):
        unfold_batch_dim(make_data(4), batch_dims=0)
    with pytest.raises(ValueError, match="fewer than 2 dims"):
        unfold_batch_dim(make_data(4), batch_dims=2)  # act is (4,): nothing to unfold


# ---------------------------------------------------------------- byte encoding


def test_serialize_single_tensor_roundtrip():
    tensor = torch.tensor([[1.5, -2.0], [0.25, 3.0]], dtype=torch.bfloat16)
    dtype, shape, data = serialize_single_tensor(tensor)
    # 4 bfloat16 values = 8 bytes
    assert dtype == "bfloat16" and shape == (2, 2) and data.dtype == np.uint8 and data.shape == (8,)
    back = deserialize_single_tensor((dtype, shape, data))
    assert back.dtype == torch.bfloat16 and torch.equal(back, tensor)
    empty = deserialize_single_tensor(serialize_single_tensor(torch.zeros(0, 3)))
    assert empty.shape == (0, 3)
    with pytest.raises(ValueError, match="not a torch dtype"):
        deserialize_single_tensor(("float99", (1,), data))


def test_serialize_tensordict_roundtrip_with_nested_tensor():
    jagged = torch.nested.as_nested_tensor([torch.arange(2), torch.arange(3)], layout=torch.jagged)
    batch = TensorDict({"ids": torch.arange(4).view(2, 2), "ragged": jagged}, batch_size=[2])
    batch_size, device, encoded = serialize_tensordict(batch)
    assert batch_size == (2,) and device is None and len(encoded["ids"]) == 3 and len(encoded["ragged"]) == 2
    back = deserialize_tensordict((batch_size, device, encoded))
    assert torch.equal(back["ids"], batch["ids"])
    assert [t.tolist() for t in back["ragged"].unbind()] == [[0, 1], [0, 1, 2]]
    with pytest.raises(ValueError, match="expected 3"):
        deserialize_tensordict(((1,), None, {"x": ("a",)}))
