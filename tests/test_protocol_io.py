"""Tests for verl.protocol_io, through DataProto's methods: mini-batch iteration, the safe disk format, and the
TensorDict round trip."""

import pickle

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tests.test_protocol import acts, make_data
from verl.protocol import DataProto

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


def test_load_from_disk_keeps_the_subclass(tmp_path):
    class MyProto(DataProto):
        pass

    make_data(2).save_to_disk(tmp_path / "rows.pt")
    loaded = MyProto.load_from_disk(tmp_path / "rows.pt")
    assert type(loaded) is MyProto and acts(loaded) == [0, 1]
