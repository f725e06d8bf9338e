"""Tests for verl.protocol: DataProto row/key operations, errors, pickling, iteration and padding helpers."""

import pickle

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from verl.protocol import DataProto, DataProtoItem, pad_dataproto_to_divisor, unpad_dataproto


def make_data(num_rows: int = 4) -> DataProto:
    """Rows are identifiable: obs[i] = [2i, 2i+1], act[i] = i, uid[i] = "u{i}"."""
    return DataProto.from_dict(
        tensors={"obs": torch.arange(2 * num_rows).view(num_rows, 2), "act": torch.arange(num_rows)},
        non_tensors={"uid": [f"u{i}" for i in range(num_rows)]},
        meta_info={"temperature": 1.0},
    )


def acts(data: DataProto) -> list[int]:
    return data.batch["act"].tolist()


# ---------------------------------------------------------------- construction


def test_from_dict_builds_parts():
    data = make_data(3)
    assert len(data) == 3
    assert list(data.batch.batch_size) == [3]
    assert data.non_tensor_batch["uid"].dtype == object
    assert data.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u2"]
    assert data.meta_info == {"temperature": 1.0}


def test_from_dict_list_of_lists_stays_one_dimensional():
    data = DataProto.from_dict(non_tensors={"x": [[1, 2], [3, 4]]})
    assert data.non_tensor_batch["x"].shape == (2,)
    assert data.non_tensor_batch["x"][1] == [3, 4]
    assert data.batch is None and len(data) == 2


def test_from_single_dict_splits_values():
    data = DataProto.from_single_dict(
        {"ids": torch.zeros(2, 3), "score": np.array([0.5, 1.0]), "gt": ["a", "b"]}, meta_info={"step": 7}
    )
    assert list(data.batch.keys()) == ["ids"]
    assert sorted(data.non_tensor_batch) == ["gt", "score"]
    assert data.non_tensor_batch["gt"].dtype == object
    assert data.meta_info == {"step": 7}


def test_from_single_dict_rejects_scalar():
    with pytest.raises(ValueError, match="'lr'.*meta_info"):
        DataProto.from_single_dict({"ids": torch.zeros(2), "lr": 0.1})


def test_from_dict_tensor_length_mismatch():
    with pytest.raises(ValueError, match="different numbers of rows"):
        DataProto.from_dict(tensors={"a": torch.zeros(2), "b": torch.zeros(3)})


def test_check_consistency_names_keys_and_lengths():
    with pytest.raises(ValueError) as err:
        DataProto.from_dict(tensors={"a": torch.zeros(2)}, non_tensors={"uid": ["x", "y", "z"]})
    assert "'batch': 2" in str(err.value) and "'uid': 3" in str(err.value)


def test_check_consistency_rejects_list_and_2d_batch():
    with pytest.raises(ValueError, match="numpy array"):
        DataProto(non_tensor_batch={"uid": ["a"]})
    with pytest.raises(ValueError, match="one batch dimension"):
        DataProto(batch=TensorDict({"a": torch.zeros(2, 3)}, batch_size=[2, 3]))


def test_empty_dataproto_has_length_zero():
    assert len(DataProto()) == 0


# ---------------------------------------------------------------- indexing


def test_getitem_int_returns_item():
    item = make_data()[2]
    assert isinstance(item, DataProtoItem)
    assert item.batch["obs"].tolist() == [4, 5]  # obs[2] = [2*2, 2*2+1]
    assert item.non_tensor_batch["uid"] == "u2"
    assert make_data()[-1].non_tensor_batch["uid"] == "u3"
    with pytest.raises(IndexError):
        make_data()[4]


def test_getitem_slice_and_index_forms():
    data = make_data()
    assert acts(data[1:3]) == [1, 2]
    assert data[1:3].non_tensor_batch["uid"].tolist() == ["u1", "u2"]
    assert data[1:3].meta_info == {"temperature": 1.0}
    assert acts(data[[3, 0, 0]]) == [3, 0, 0]
    assert acts(data[np.array([2, 1])]) == [2, 1]
    assert data[torch.tensor([1, 3])].non_tensor_batch["uid"].tolist() == ["u1", "u3"]
    assert acts(data[np.array([True, False, False, True])]) == [0, 3]


def test_getitem_empty_index_gives_empty_dataproto():
    empty = make_data()[[]]
    assert len(empty) == 0 and empty.non_tensor_batch["uid"].shape == (0,)


def test_getitem_bad_index():
    with pytest.raises(ValueError, match="1-D"):
        make_data()[np.array([[0, 1]])]
    with pytest.raises(ValueError, match="not supported"):
        make_data()["obs"]


def test_slice_method():
    data = make_data(5).slice(1, 4)
    assert acts(data) == [1, 2, 3]
    assert data.batch["obs"].tolist() == [[2, 3], [4, 5], [6, 7]]


# ---------------------------------------------------------------- select / pop / rename


def test_select_keeps_named_keys_and_shares_tensors():
    data = make_data()
    sub = data.select(batch_keys=["obs"], non_tensor_batch_keys=[], meta_info_keys=["temperature"])
    assert list(sub.batch.keys()) == ["obs"]
    assert sub.non_tensor_batch == {}
    assert sub.meta_info == {"temperature": 1.0}
    sub.batch["obs"][0, 0] = 100  # shared storage without deepcopy
    assert data.batch["obs"][0, 0].item() == 100


def test_select_deepcopy_is_independent():
    data = make_data()
    sub = data.select(deepcopy=True)
    sub.batch["obs"][0, 0] = 100
    sub.non_tensor_batch["uid"][0] = "changed"
    assert data.batch["obs"][0, 0].item() == 0
    assert data.non_tensor_batch["uid"][0] == "u0"


def test_select_unknown_key_lists_available():
    with pytest.raises(ValueError, match=r"\['missing'\].*\['act', 'obs'\]"):
        make_data().select(batch_keys=["missing"])
    with pytest.raises(ValueError, match="non_tensor_batch.*'nope'"):
        make_data().select(non_tensor_batch_keys=["nope"])
    with pytest.raises(ValueError, match="meta_info"):
        make_data().select(meta_info_keys="nope")


def test_pop_removes_and_returns():
    data = make_data()
    popped = data.pop(batch_keys=["obs"], non_tensor_batch_keys=["uid"], meta_info_keys=["temperature"])
    assert list(data.batch.keys()) == ["act"]
    assert data.non_tensor_batch == {} and data.meta_info == {}
    assert popped.batch["obs"].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert popped.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u2", "u3"]
    assert popped.meta_info == {"temperature": 1.0}
    assert len(popped) == 4 and len(data) == 4


def test_pop_unknown_key_leaves_self_untouched():
    data = make_data()
    with pytest.raises(ValueError, match="'nope'"):
        data.pop(batch_keys=["obs"], non_tensor_batch_keys=["nope"])
    assert sorted(data.batch.keys()) == ["act", "obs"]


def test_rename_batch_and_non_tensor():
    data = make_data().rename(["obs", "uid"], ["observation", "id"])
    assert sorted(data.batch.keys()) == ["act", "observation"]
    assert data.non_tensor_batch["id"].tolist() == ["u0", "u1", "u2", "u3"]
    with pytest.raises(ValueError, match="'ghost'"):
        make_data().rename("ghost", "x")
    with pytest.raises(ValueError, match="already exists"):
        make_data().rename("obs", "act")
    with pytest.raises(ValueError, match="as many"):
        make_data().rename(["obs"], ["a", "b"])


# ---------------------------------------------------------------- union


def test_union_merges_and_accepts_equal_values():
    left = make_data()
    right = DataProto.from_dict(
        tensors={"act": torch.arange(4), "rew": torch.ones(4)},
        non_tensors={"uid": [f"u{i}" for i in range(4)], "gt": list("abcd")},
        meta_info={"temperature": 1.0, "step": 3},
    )
    out = left.union(right)
    assert out is left
    assert sorted(out.batch.keys()) == ["act", "obs", "rew"]
    assert sorted(out.non_tensor_batch) == ["gt", "uid"]
    assert out.meta_info == {"temperature": 1.0, "step": 3}


def test_union_into_tensorless_dataproto():
    left = DataProto.from_dict(non_tensors={"uid": ["a", "b"]})
    left.union(DataProto.from_dict(tensors={"x": torch.tensor([1, 2])}))
    assert left.batch["x"].tolist() == [1, 2]


@pytest.mark.parametrize(
    "other, key",
    [
        (DataProto.from_dict(tensors={"act": torch.tensor([0, 1, 2, 9])}), "'act'"),
        (DataProto.from_dict(non_tensors={"uid": ["u0", "u1", "u2", "x"]}), "'uid'"),
        (DataProto.from_dict(tensors={"act": torch.arange(4)}, meta_info={"temperature": 0.5}), "'temperature'"),
    ],
)
def test_union_conflict_names_key(other, key):
    with pytest.raises(ValueError, match=f"union conflict.*{key}"):
        make_data().union(other)


def test_union_length_mismatch():
    with pytest.raises(ValueError, match="4 vs 2"):
        make_data().union(make_data(2))


# ---------------------------------------------------------------- chunk / split / concat / repeat / reorder


def test_chunk_equal_parts():
    parts = make_data(6).chunk(3)
    assert [acts(p) for p in parts] == [[0, 1], [2, 3], [4, 5]]
    assert [p.non_tensor_batch["uid"].tolist() for p in parts][2] == ["u4", "u5"]
    with pytest.raises(ValueError, match="not divisible"):
        make_data(5).chunk(2)
    with pytest.raises(ValueError):
        make_data(4).chunk(0)


def test_split_last_shorter():
    assert [acts(p) for p in make_data(5).split(2)] == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="positive"):
        make_data().split(0)


def test_concat_roundtrip_and_meta_from_first():
    parts = make_data(5).split(2)
    parts[1].meta_info["temperature"] = 9.0
    out = DataProto.concat(parts)
    assert acts(out) == [0, 1, 2, 3, 4]
    assert out.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u2", "u3", "u4"]
    assert out.meta_info == {"temperature": 1.0}


def test_concat_errors():
    with pytest.raises(ValueError, match="empty"):
        DataProto.concat([])
    with pytest.raises(ValueError, match="part 1"):
        DataProto.concat([make_data(2), make_data(2).select(batch_keys=["act"])])


def test_repeat_interleave_and_tile():
    data = make_data(2)
    inter = data.repeat(2, interleave=True)
    assert acts(inter) == [0, 0, 1, 1]
    assert inter.non_tensor_batch["uid"].tolist() == ["u0", "u0", "u1", "u1"]
    tiled = data.repeat(3, interleave=False)
    assert acts(tiled) == [0, 1, 0, 1, 0, 1]
    assert tiled.batch["obs"].tolist() == [[0, 1], [2, 3]] * 3
    with pytest.raises(ValueError):
        data.repeat(0)


def test_reorder_in_place():
    data = make_data()
    assert data.reorder(torch.tensor([3, 1, 0, 2])) is data
    assert acts(data) == [3, 1, 0, 2]
    assert data.non_tensor_batch["uid"].tolist() == ["u3", "u1", "u0", "u2"]
    with pytest.raises(ValueError, match="4 indices"):
        data.reorder([0, 1])


def test_to_device():
    data = make_data().to("cpu")
    assert data.batch.device == torch.device("cpu")
    assert data.batch["obs"].device.type == "cpu"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_to_cuda():
    data = make_data().to("cuda")
    assert data.batch["obs"].is_cuda
    assert data.non_tensor_batch["uid"][0] == "u0"


# ---------------------------------------------------------------- pickle


def test_pickle_roundtrip():
    data = make_data()
    data.union(DataProto.from_dict(non_tensors={"nested": [[1], [2, 3], [], [4]]}))
    back = pickle.loads(pickle.dumps(data))
    assert torch.equal(back.batch["obs"], data.batch["obs"])
    assert back.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u2", "u3"]
    assert back.non_tensor_batch["nested"].tolist() == [[1], [2, 3], [], [4]]
    assert back.meta_info == {"temperature": 1.0}


# ---------------------------------------------------------------- make_iterator


def collect(data: DataProto, **kwargs) -> list[list[int]]:
    return [acts(mb) for mb in data.make_iterator(**kwargs)]


def test_make_iterator_in_order_without_seed():
    batches = collect(make_data(6), mini_batch_size=2, epochs=2)
    # 6 rows / 2 = 3 mini-batches per epoch, 2 epochs, unshuffled
    assert batches == [[0, 1], [2, 3], [4, 5]] * 2


def test_make_iterator_seeded_is_deterministic_and_shuffles_per_epoch():
    data = make_data(16)
    first = collect(data, mini_batch_size=4, epochs=2, seed=1)
    assert first == collect(data, mini_batch_size=4, epochs=2, seed=1)
    assert len(first) == 8  # 16 / 4 per epoch x 2 epochs
    epoch0, epoch1 = sum(first[:4], []), sum(first[4:], [])
    assert sorted(epoch0) == list(range(16)) and sorted(epoch1) == list(range(16))
    assert epoch0 != list(range(16))  # shuffled (probability of identity is 1/16!)
    assert epoch0 != epoch1  # a fresh permutation each epoch
    assert first != collect(data, mini_batch_size=4, epochs=2, seed=2)


def test_make_iterator_keeps_non_tensor_and_meta_aligned():
    for mb in make_data(8).make_iterator(mini_batch_size=4, epochs=1, seed=0):
        assert mb.non_tensor_batch["uid"].tolist() == [f"u{i}" for i in acts(mb)]
        assert mb.meta_info == {"temperature": 1.0}


def test_make_iterator_errors():
    with pytest.raises(ValueError, match="not divisible"):
        make_data(5).make_iterator(mini_batch_size=2, epochs=1)
    with pytest.raises(ValueError, match="batch_size"):
        make_data(4).make_iterator(mini_batch_size=2, epochs=1, dataloader_kwargs={"batch_size": 3})
    assert collect(make_data(4), mini_batch_size=2, epochs=0) == []


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
