"""DataProto packing for the driver-worker trip: everything comes back equal, dtypes and metadata included."""

import numpy as np
import torch

from verl.protocol import DataProto
from verl.single_controller.transport import PackedDataProto, pack, unpack


def test_a_dataproto_comes_back_equal_with_every_dtype():
    data = DataProto.from_dict(
        tensors={
            "ids": torch.arange(12).reshape(3, 4),
            "mask": torch.tensor([[True, False], [False, True], [True, True]]),
            "logp": torch.randn(3, 4, dtype=torch.float64).float(),
            "half": torch.randn(3, 2).half(),
            "bf16": torch.randn(3, 2).bfloat16(),  # no numpy twin: travels as bytes
            "scores": torch.randn(3, 5, 2)[:, ::2],  # not contiguous
        },
        non_tensors={"uid": ["a", "b", "c"]},
        meta_info={"temperature": 0.7, "metrics": {"x": [1.0]}},
    )
    packed = pack(data)
    assert isinstance(packed, PackedDataProto) and isinstance(packed.payload, bytes)
    back = unpack(packed)
    assert sorted(back.batch.keys()) == sorted(data.batch.keys())
    for key in data.batch.keys():
        assert back.batch[key].dtype == data.batch[key].dtype and torch.equal(back.batch[key], data.batch[key]), key
    assert list(back.non_tensor_batch["uid"]) == ["a", "b", "c"] and back.meta_info == data.meta_info
    back.batch["ids"][0, 0] = -1  # the restored tensors are writable and independent of the original
    assert data.batch["ids"][0, 0] == 0


def test_other_values_and_tensorless_batches_pass():
    assert unpack(pack({"a": 1})) == {"a": 1} and unpack(pack(None)) is None
    only_text = DataProto(non_tensor_batch={"uid": np.array(["x", "y"], dtype=object)})
    back = unpack(pack(only_text))
    assert back.batch is None and list(back.non_tensor_batch["uid"]) == ["x", "y"]
