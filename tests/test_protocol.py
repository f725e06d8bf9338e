"""Tests for verl.protocol: DataProto construction, row and key operations, union, chunk / concat, repeating and
reshaping rows, auto padding, errors and pickling. The helpers of verl.protocol_ops and the conversions of
verl.protocol_io have their own test files."""

import math
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from verl.protocol import DataProto, DataProtoConfig, DataProtoItem
from verl.utils.errors import ValidationError


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


def test_from_dict_converts_lists_as_verl_does():
    # np.array(value, dtype=object): equal-length inner lists give a (rows, columns) array ...
    data = DataProto.from_dict(non_tensors={"x": [[1, 2], [3, 4]]})
    assert data.non_tensor_batch["x"].shape == (2, 2) and data.non_tensor_batch["x"].dtype == object
    assert data.non_tensor_batch["x"][1].tolist() == [3, 4]
    assert data.batch is None and len(data) == 2
    # ... ragged lists and dicts one element per row
    ragged = DataProto.from_dict(non_tensors={"x": [[1, 2], [3]], "d": [{"a": 1}, {"a": 2}]})
    assert ragged.non_tensor_batch["x"].shape == (2,) and ragged.non_tensor_batch["x"][1] == [3]
    assert ragged.non_tensor_batch["d"].shape == (2,) and ragged.non_tensor_batch["d"][0] == {"a": 1}
    # arrays numpy cannot line up (unequal inner shapes) still give one element per row
    arrays = DataProto.from_dict(non_tensors={"x": [np.zeros((2, 2)), np.zeros((2, 3))]})
    assert arrays.non_tensor_batch["x"].shape == (2,) and arrays.non_tensor_batch["x"][1].shape == (2, 3)


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


def test_none_parts_are_taken_as_empty_dicts():
    # verl accepts non_tensor_batch=None (and meta_info=None); here they become {} so every method works
    data = DataProto(batch=None, non_tensor_batch=None, meta_info=None)
    assert len(data) == 0 and data.non_tensor_batch == {} and data.meta_info == {}
    rows = DataProto(batch=TensorDict({"a": torch.zeros(3)}, batch_size=[3]), non_tensor_batch=None)
    assert len(rows) == 3 and len(rows.chunk(3)) == 3


def test_bad_input_is_both_value_error_and_assertion_error():
    # verl asserts where this package raises ValidationError: both kinds of handler must catch it
    assert issubclass(ValidationError, ValueError) and issubclass(ValidationError, AssertionError)
    with pytest.raises(AssertionError, match="not divisible"):
        make_data(6).chunk(5)
    with pytest.raises(AssertionError, match="num_batch_dims=3"):
        DataProto.from_dict(tensors={"a": torch.zeros(4, 2, 3)}, num_batch_dims=3)
    with pytest.raises(AssertionError, match="different numbers of rows"):
        DataProto(batch=TensorDict({"a": torch.zeros(3)}, batch_size=[3]), non_tensor_batch={"b": np.zeros(2)})


def test_from_single_dict_keeps_the_subclass_and_takes_auto_padding():
    class MyProto(DataProto):
        pass

    data = MyProto.from_single_dict({"x": torch.tensor([0, 1, 2])}, auto_padding=True)
    assert type(data) is MyProto
    assert data.meta_info == {DataProtoConfig.auto_padding_key: True} and data.is_padding_enabled()
    assert type(data.chunk(2)[1]) is MyProto


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
    # a negative step, as for a list: rows 5, 4, ..., 0, and 4, 2 (from 4 down to, not including, 0, step 2)
    assert acts(data[::-1]) == [5, 4, 3, 2, 1, 0]
    assert data.slice(4, 0, -2).non_tensor_batch["uid"].tolist() == ["u4", "u2"]


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
        (DataProto.from_dict(tensors={"act": torch.tensor([0, 1, 2, 9])}), "`act`"),
        (DataProto.from_dict(non_tensors={"uid": ["u0", "u1", "u2", "x"]}), "`uid`"),
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
    with pytest.raises(ValueError, match="union conflict.*`score`"):
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


# ---------------------------------------------------------------- chunk / split / concat / repeat / reorder


def test_chunk_equal_parts():
    parts = make_data(6).chunk(3)
    assert [acts(p) for p in parts] == [[0, 1], [2, 3], [4, 5]]
    assert [p.non_tensor_batch["uid"].tolist() for p in parts][2] == ["u4", "u5"]
    with pytest.raises(ValueError, match="not divisible"):
        make_data(5).chunk(2)
    with pytest.raises(ValueError):
        make_data(4).chunk(0)


@pytest.fixture
def auto_padding_off(monkeypatch):
    """Process-wide auto padding off (config and environment), restored after the test."""
    monkeypatch.delenv("VERL_AUTO_PADDING", raising=False)
    monkeypatch.setattr(DataProtoConfig, "_auto_padding", False)


def test_chunk_unequal_parts_with_auto_padding(auto_padding_off):
    data = DataProto.from_dict(
        tensors={"act": torch.arange(7)}, non_tensors={"uid": [f"u{i}" for i in range(7)]}, auto_padding=True
    )
    # 7 rows in 3 parts: 7 = 3 + 2 + 2, the longer part first
    parts = data.chunk(3)
    assert [acts(p) for p in parts] == [[0, 1, 2], [3, 4], [5, 6]]
    assert parts[2].non_tensor_batch["uid"].tolist() == ["u5", "u6"]
    assert all(p.meta_info == data.meta_info for p in parts)
    # 7 rows in 4 parts: 2 + 2 + 2 + 1; in 9 parts: seven single rows, then two empty parts
    assert [len(p) for p in data.chunk(4)] == [2, 2, 2, 1]
    assert [len(p) for p in data.chunk(9)] == [1] * 7 + [0, 0]


def test_auto_padding_process_wide(auto_padding_off, monkeypatch):
    data = make_data(5)
    assert not data.is_padding_enabled()
    DataProtoConfig.auto_padding = True
    assert DataProtoConfig.auto_padding and data.is_padding_enabled()
    assert [acts(p) for p in data.chunk(2)] == [[0, 1, 2], [3, 4]]
    DataProtoConfig.auto_padding = False
    monkeypatch.setenv("VERL_AUTO_PADDING", "1")  # verl's environment switch
    assert data.is_padding_enabled() and [len(p) for p in data.chunk(3)] == [2, 2, 1]
    with pytest.raises(ValueError, match="True or False"):
        DataProtoConfig.auto_padding = "yes"


def test_padding_appends_copies_of_the_last_or_first_row():
    data = make_data(3)
    data.padding(2)  # verl's default candidate "" means the last row
    assert acts(data) == [0, 1, 2, 2, 2]
    assert data.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u2", "u2", "u2"]
    data.padding(1, padding_candidate="first")
    assert acts(data) == [0, 1, 2, 2, 2, 0] and data.meta_info == {"temperature": 1.0}
    data.padding(0)
    assert len(data) == 6
    with pytest.raises(ValueError, match="'first' or 'last'"):
        data.padding(1, padding_candidate="middle")
    with pytest.raises(ValueError, match="empty"):
        DataProto().padding(1)


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
    with pytest.raises(AssertionError, match="Conflicting values for meta_info key 'temperature'.*part 1"):
        DataProto.concat(parts)
    parts = make_data(6).split(2)
    parts[0].meta_info["metrics"] = {"loss": 1.0}
    parts[1].meta_info["metrics"] = [{"loss": 2.0}, {"loss": 3.0}]  # a part may carry a list of metric dicts
    parts[2].meta_info["metrics"] = {"loss": 4.0}
    # per-part metrics are gathered into one dict of lists, in part order
    assert DataProto.concat(parts).meta_info["metrics"] == {"loss": [1.0, 2.0, 3.0, 4.0]}


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


@pytest.mark.parametrize(
    "counts",
    [[2, 0, 1], (2, 0, 1), np.array([2, 0, 1]), torch.tensor([2, 0, 1])],
    ids=["list", "tuple", "ndarray", "tensor"],
)
def test_sample_level_repeat(counts):
    out = make_data(3).sample_level_repeat(counts)
    # row 0 twice, row 1 dropped, row 2 once, in row order
    assert acts(out) == [0, 0, 2]
    assert out.batch["obs"].tolist() == [[0, 1], [0, 1], [4, 5]]
    assert out.non_tensor_batch["uid"].tolist() == ["u0", "u0", "u2"]
    assert out.meta_info == {"temperature": 1.0}


@pytest.mark.parametrize("counts", [[1, 1], [1, -1, 1], [1.0, 1.0, 1.0], [[1, 1, 1]], 2])
def test_sample_level_repeat_needs_one_count_per_row(counts):
    with pytest.raises(AssertionError, match="one non-negative integer per row"):
        make_data(3).sample_level_repeat(counts)


def test_unfold_column_chunks_splits_named_keys_and_repeats_the_rest():
    data = make_data(2)  # obs = [[0, 1], [2, 3]], act = [0, 1], uid = [u0, u1]
    data.batch["cube"] = torch.arange(16).view(2, 4, 2)
    data.non_tensor_batch["pairs"] = np.array([["a1", "a2"], ["b1", "b2"]], dtype=object)
    out = data.unfold_column_chunks(2, split_keys=["obs", "cube", "pairs"])
    # each row's 2 columns become 2 rows: obs row 0 [0, 1] -> [0], [1]
    assert out.batch["obs"].tolist() == [[0], [1], [2], [3]]
    # cube row 0 is [[0,1],[2,3],[4,5],[6,7]]: its two column chunks are its first and last two inner rows
    assert out.batch["cube"][1].tolist() == [[4, 5], [6, 7]] and out.batch["cube"].shape == (4, 2, 2)
    assert out.non_tensor_batch["pairs"].tolist() == [["a1"], ["a2"], ["b1"], ["b2"]]
    # keys not split are repeated, interleaved
    assert acts(out) == [0, 0, 1, 1] and out.non_tensor_batch["uid"].tolist() == ["u0", "u0", "u1", "u1"]
    assert out.meta_info == {"temperature": 1.0}
    # without split keys every key is repeated
    assert make_data(2).unfold_column_chunks(3).batch["obs"].tolist() == [[0, 1]] * 3 + [[2, 3]] * 3


def test_unfold_column_chunks_errors():
    with pytest.raises(AssertionError, match="positive"):
        make_data(2).unfold_column_chunks(0)
    with pytest.raises(AssertionError, match=r"\['nope'\]"):
        make_data(2).unfold_column_chunks(2, split_keys=["nope"])
    with pytest.raises(AssertionError, match="divisible by n_split=3"):
        make_data(2).unfold_column_chunks(3, split_keys=["obs"])  # 2 columns
    with pytest.raises(AssertionError, match="second dimension"):
        make_data(2).unfold_column_chunks(2, split_keys=["act"])  # 1-D


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
    with pytest.raises(AssertionError, match="num_batch_dims=2"):
        DataProto.from_dict(tensors={"a": torch.zeros(2, 3)}, num_batch_dims=2)
    assert len(DataProto.from_dict(tensors={"a": torch.zeros(2, 3)}, num_batch_dims=1)) == 2
