"""Tests for verl.protocol: DataProto row/key operations, errors, pickling, disk and TensorDict round trips,
iteration, padding, folding, merging and byte-encoding helpers."""

import math
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from verl.protocol import (
    DataProto,
    DataProtoItem,
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
    # verl raises TypeError for an index type it does not know
    with pytest.raises(TypeError, match="not supported"):
        make_data()["obs"]


def test_select_idxs_and_step_slices():
    data = make_data(6)
    assert acts(data.select_idxs([5, 1])) == [5, 1]
    assert data.select_idxs(np.array([5, 1])).non_tensor_batch["uid"].tolist() == ["u5", "u1"]
    assert acts(data.select_idxs(torch.tensor([True, False, True, False, False, False]))) == [0, 2]
    # rows 0, 2, 4 (start 0, step 2) and 1, 4 (start 1, step 3)
    assert acts(data[::2]) == [0, 2, 4]
    assert data.slice(1, None, 3).non_tensor_batch["uid"].tolist() == ["u1", "u4"]


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


def test_select_non_tensor_and_meta_keys_filter_like_verl():
    # verl filters non-tensor and meta keys: absent names are skipped, present ones kept
    sub = make_data().select(non_tensor_batch_keys=["uid", "nope"], meta_info_keys=["nope"])
    assert sub.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u2", "u3"]
    assert list(sub.non_tensor_batch) == ["uid"]
    assert sub.meta_info == {}
    assert sorted(sub.batch.keys()) == ["act", "obs"]


def test_pop_removes_and_returns():
    data = make_data()
    popped = data.pop(batch_keys=["obs"], non_tensor_batch_keys=["uid"], meta_info_keys=["temperature"])
    assert list(data.batch.keys()) == ["act"]
    assert data.non_tensor_batch == {} and data.meta_info == {}
    assert popped.batch["obs"].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert popped.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u2", "u3"]
    assert popped.meta_info == {"temperature": 1.0}
    assert len(popped) == 4 and len(data) == 4


def test_pop_without_tensor_keys_has_no_batch():
    # as in verl (built with from_dict): popping only non-tensor keys gives batch=None
    data = make_data()
    popped = data.pop(non_tensor_batch_keys="uid")
    assert popped.batch is None
    assert popped.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u2", "u3"] and len(popped) == 4
    assert "uid" not in data.non_tensor_batch


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


def test_union_treats_nan_as_equal_and_requires_same_dtype():
    left = DataProto.from_dict(non_tensors={"score": np.array([1.0, np.nan])}, meta_info={"lr": float("nan")})
    left.union(DataProto.from_dict(non_tensors={"score": np.array([1.0, np.nan])}, meta_info={"lr": float("nan")}))
    assert np.isnan(left.non_tensor_batch["score"][1]) and math.isnan(left.meta_info["lr"])
    # same values, different dtype (float32 vs float64): a conflict, as in verl
    with pytest.raises(ValueError, match="union conflict.*'score'"):
        left.union(DataProto.from_dict(non_tensors={"score": np.array([1.0, np.nan], dtype=np.float32)}))


def test_union_conflict_leaves_self_untouched():
    data = make_data()
    other = DataProto.from_dict(tensors={"new": torch.ones(4)}, meta_info={"temperature": 0.5})
    with pytest.raises(ValueError, match="'temperature'"):
        data.union(other)
    # the conflict is found in meta_info, after the batch part: the new tensor key must not have been added
    assert sorted(data.batch.keys()) == ["act", "obs"]


def test_union_keeps_batch_object_identity():
    data = make_data()
    batch = data.batch
    data.union(DataProto.from_dict(tensors={"rew": torch.ones(4)}))
    assert data.batch is batch and batch["rew"].tolist() == [1.0] * 4


def test_union_tensor_dict_function():
    left = TensorDict({"a": torch.arange(3)}, batch_size=[3])
    out = union_tensor_dict(left, TensorDict({"a": torch.arange(3), "b": torch.ones(3)}, batch_size=[3]))
    assert out is left and sorted(left.keys()) == ["a", "b"]
    with pytest.raises(ValueError, match="union conflict.*'a'"):
        union_tensor_dict(left, TensorDict({"a": torch.tensor([0, 1, 5])}, batch_size=[3]))
    with pytest.raises(ValueError, match="batch sizes"):
        union_tensor_dict(left, TensorDict({}, batch_size=[2]))


def test_union_numpy_dict_function():
    left = {"a": np.array(["x", "y"], dtype=object)}
    out = union_numpy_dict(left, {"a": np.array(["x", "y"], dtype=object), "b": np.array([1, 2])})
    assert out is left and left["b"].tolist() == [1, 2]
    with pytest.raises(ValueError, match="union conflict.*'a'"):
        union_numpy_dict(left, {"a": np.array(["x", "z"], dtype=object)})
    with pytest.raises(ValueError, match="not a numpy array"):
        union_numpy_dict(left, {"c": [1, 2]})


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


def test_concat_roundtrip_and_meta_merge():
    parts = make_data(5).split(2)
    parts[1].meta_info["step"] = 3  # a key only one part has is kept
    out = DataProto.concat(parts)
    assert acts(out) == [0, 1, 2, 3, 4]
    assert out.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u2", "u3", "u4"]
    assert out.meta_info == {"temperature": 1.0, "step": 3}


def test_concat_meta_conflict_and_metrics_gathering():
    parts = make_data(4).split(2)
    parts[1].meta_info["temperature"] = 9.0
    with pytest.raises(ValueError, match="'temperature'.*part 1"):
        DataProto.concat(parts)
    parts = make_data(6).split(2)
    parts[0].meta_info["metrics"] = {"loss": 1.0}
    parts[1].meta_info["metrics"] = [{"loss": 2.0}, {"loss": 3.0}]  # a part may carry a list of metric dicts
    parts[2].meta_info["metrics"] = {"loss": 4.0}
    # per-part metrics are gathered into one dict of lists, in part order
    assert DataProto.concat(parts).meta_info["metrics"] == {"loss": [1.0, 2.0, 3.0, 4.0]}


def test_list_of_dict_to_dict_of_list():
    assert list_of_dict_to_dict_of_list([{"a": 1, "b": 2}, {"a": 3, "b": 4}]) == {"a": [1, 3], "b": [2, 4]}
    assert list_of_dict_to_dict_of_list([]) == {}
    with pytest.raises(ValueError, match="'c'"):
        list_of_dict_to_dict_of_list([{"a": 1}, {"c": 2}])


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


def test_make_iterator_shuffle_kwarg_wins_over_seed():
    data = make_data(8)
    # verl's form: the seed only seeds the generator, shuffle comes from dataloader_kwargs
    unshuffled = collect(data, mini_batch_size=4, epochs=1, seed=3, dataloader_kwargs={"shuffle": False})
    assert unshuffled == [[0, 1, 2, 3], [4, 5, 6, 7]]
    shuffled = collect(data, mini_batch_size=4, epochs=1, seed=3, dataloader_kwargs={"shuffle": True})
    assert shuffled == collect(data, mini_batch_size=4, epochs=1, seed=3)  # seed alone shuffles the same way
    assert sorted(sum(shuffled, [])) == list(range(8)) and shuffled != unshuffled


def test_make_iterator_errors():
    with pytest.raises(ValueError, match="not divisible"):
        make_data(5).make_iterator(mini_batch_size=2, epochs=1)
    with pytest.raises(ValueError, match="batch_size"):
        make_data(4).make_iterator(mini_batch_size=2, epochs=1, dataloader_kwargs={"batch_size": 3})
    with pytest.raises(ValueError, match="collate_fn"):
        make_data(4).make_iterator(mini_batch_size=2, epochs=1, dataloader_kwargs={"collate_fn": list})
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


# ---------------------------------------------------------------- package import


def test_from_verl_import_dataproto():
    from verl import DataProto as TopLevel
    from verl import DataProtoItem as TopLevelItem

    assert TopLevel is DataProto and TopLevelItem is DataProtoItem


def test_import_verl_stays_light():
    # `import verl` must not pull in torch; the protocol is loaded on first use of verl.DataProto
    code = "import sys, verl; assert 'torch' not in sys.modules; verl.DataProto; assert 'torch' in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_from_dict_only_one_batch_dim():
    with pytest.raises(ValueError, match="num_batch_dims=2"):
        DataProto.from_dict(tensors={"a": torch.zeros(2, 3)}, num_batch_dims=2)
    assert len(DataProto.from_dict(tensors={"a": torch.zeros(2, 3)}, num_batch_dims=1)) == 2


# ---------------------------------------------------------------- disk


def rich_data() -> DataProto:
    """Every kind of value save_to_disk must keep: tensors of several dtypes, typed and object numpy arrays
    (strings, nested lists, dicts, numpy scalars, NaN) and a nested meta_info."""
    return DataProto.from_dict(
        tensors={
            "ids": torch.arange(6).view(3, 2),
            "logp": torch.tensor([0.5, -1.0, float("nan")], dtype=torch.bfloat16),
            "mask": torch.tensor([True, False, True]),
        },
        non_tensors={
            "uid": ["a", "b", "c"],
            "turns": [[], [0.5, 0.8], {"acc": np.float32(1.5), "tags": ("x", None)}],
            "score": np.array([1.0, np.nan, -2.5]),
            "label": np.array(["yes", "no", "maybe"]),
            "step": np.array([1, 2, 3], dtype=np.int16),
        },
        meta_info={"temperature": 0.7, "global_steps": 4, "cfg": {"n": (1, 2), "name": "run", "none": None}},
    )


def test_save_load_roundtrip(tmp_path):
    data = rich_data()
    path = tmp_path / "batch.pt"
    data.save_to_disk(path)
    back = DataProto.load_from_disk(path)
    assert sorted(back.batch.keys()) == ["ids", "logp", "mask"]
    assert torch.equal(back.batch["ids"], data.batch["ids"])
    assert back.batch["logp"].dtype == torch.bfloat16 and back.batch["mask"].dtype == torch.bool
    assert torch.equal(back.batch["logp"][:2], data.batch["logp"][:2]) and torch.isnan(back.batch["logp"][2])
    # typed arrays keep their dtype; object arrays keep their Python objects (nested containers included)
    assert back.non_tensor_batch["step"].dtype == np.int16 and back.non_tensor_batch["step"].tolist() == [1, 2, 3]
    assert back.non_tensor_batch["label"].dtype == data.non_tensor_batch["label"].dtype
    assert back.non_tensor_batch["label"].tolist() == ["yes", "no", "maybe"]
    assert back.non_tensor_batch["score"][0] == 1.0 and np.isnan(back.non_tensor_batch["score"][1])
    assert back.non_tensor_batch["uid"].dtype == object and back.non_tensor_batch["uid"].tolist() == ["a", "b", "c"]
    turns = back.non_tensor_batch["turns"]
    assert turns.shape == (3,) and turns[0] == [] and turns[1] == [0.5, 0.8]
    assert turns[2]["tags"] == ("x", None)
    assert type(turns[2]["acc"]) is np.float32 and turns[2]["acc"] == np.float32(1.5)
    assert back.meta_info == {"temperature": 0.7, "global_steps": 4, "cfg": {"n": (1, 2), "name": "run", "none": None}}


def test_save_load_without_tensors_and_with_empty_batch(tmp_path):
    only_strings = DataProto.from_dict(non_tensors={"uid": ["a", "b"]})
    only_strings.save_to_disk(tmp_path / "a.pt")
    back = DataProto.load_from_disk(tmp_path / "a.pt")
    assert back.batch is None and back.non_tensor_batch["uid"].tolist() == ["a", "b"]
    no_keys = DataProto(batch=TensorDict({}, batch_size=[3]))
    no_keys.save_to_disk(tmp_path / "b.pt")
    assert len(DataProto.load_from_disk(tmp_path / "b.pt")) == 3  # a key-less batch keeps its row count


class _Opaque:
    pass


def test_save_refuses_objects_it_cannot_store_safely(tmp_path):
    data = DataProto.from_dict(non_tensors={"obj": [_Opaque(), _Opaque()]})
    with pytest.raises(ValueError, match=r"non_tensor_batch\['obj'\].*_Opaque"):
        data.save_to_disk(tmp_path / "x.pt")
    with pytest.raises(ValueError, match=r"meta_info\['thing'\]"):
        DataProto(meta_info={"thing": _Opaque()}).save_to_disk(tmp_path / "y.pt")


def test_load_refuses_pickles(tmp_path):
    # a pickled DataProto (upstream verl's format) could run code when loaded, so it is refused
    path = tmp_path / "pickled.pkl"
    path.write_bytes(pickle.dumps(make_data()))
    with pytest.raises(ValueError, match="not a DataProto file written by save_to_disk"):
        DataProto.load_from_disk(path)
    torch.save({"format": "something else"}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="does not hold"):
        DataProto.load_from_disk(tmp_path / "other.pt")


# ---------------------------------------------------------------- TensorDict round trip


def test_to_tensordict_and_back():
    data = make_data(3)
    data.union(DataProto.from_dict(non_tensors={"turns": [[], [0.5, 0.8], [0.9]]}))
    td = data.to_tensordict()
    assert list(td.batch_size) == [3]
    assert torch.equal(td["obs"], data.batch["obs"])
    back = DataProto.from_tensordict(td)
    assert sorted(back.batch.keys()) == ["act", "obs"]
    assert torch.equal(back.batch["act"], torch.arange(3))
    assert back.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u2"]
    # nested lists stay one object per row
    assert back.non_tensor_batch["turns"].shape == (3,) and back.non_tensor_batch["turns"][1] == [0.5, 0.8]
    assert back.meta_info == {"temperature": 1.0}
    # the rows of the TensorDict follow slicing, non-tensor columns included
    assert DataProto.from_tensordict(td[1:]).non_tensor_batch["uid"].tolist() == ["u1", "u2"]


def test_from_tensordict_merges_meta_info_argument():
    td = make_data(2).to_tensordict()
    back = DataProto.from_tensordict(td, meta_info={"extra": 1})
    assert back.meta_info == {"extra": 1, "temperature": 1.0}
    assert len(DataProto.from_tensordict(None)) == 0
    with pytest.raises(ValueError, match="num_batch_dims"):
        DataProto.from_tensordict(td, num_batch_dims=2)


def test_to_tensordict_rejects_key_clash():
    data = DataProto.from_dict(tensors={"x": torch.zeros(2)}, meta_info={"x": 1})
    with pytest.raises(ValueError, match=r"\['x'\]"):
        data.to_tensordict()


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
