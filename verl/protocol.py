"""DataProto: the one batch container that travels between the driver and the Ray workers.

A ``DataProto`` holds three parts that always describe the same ``B`` rows: ``batch``, a
``tensordict.TensorDict`` of tensors whose first dimension is ``B`` (or ``None``); ``non_tensor_batch``, a dict of
numpy arrays of length ``B`` (strings and other Python objects live in ``dtype=object`` arrays); and ``meta_info``,
a plain dict of batch-wide values (temperature, global step, ...). Row operations (indexing, slicing, chunking,
concatenation, repetition, shuffled mini-batch iteration) act on the tensors and the numpy arrays together so that
the two can never drift apart, and every constructor checks that their lengths agree.

The API follows the open-source verl project (same class, method, function and argument names and the same
results), so code written against ``verl.protocol`` runs here unchanged; the docstrings note where this
implementation is stricter (a ``ValueError`` naming the problem instead of an ``assert``) or broader.

Besides the class, the module offers: padding a batch to a multiple of a divisor and removing it again
(:func:`pad_dataproto_to_divisor` / :func:`unpad_dataproto`), folding the rows into groups and back
(:func:`fold_batch_dim` / :func:`unfold_batch_dim`), merging the parts of two batches (:func:`union_tensor_dict`,
:func:`union_numpy_dict`), and a byte-level encoding of tensors and TensorDicts (:func:`serialize_single_tensor`,
:func:`serialize_tensordict` and their inverses). The object pickles cleanly, which is how Ray ships it between
processes; :meth:`DataProto.save_to_disk` writes a file that loads without unpickling arbitrary objects.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from torch.utils.data import DataLoader

__all__ = [
    "DataProto",
    "DataProtoItem",
    "deserialize_single_tensor",
    "deserialize_tensordict",
    "fold_batch_dim",
    "list_of_dict_to_dict_of_list",
    "pad_dataproto_to_divisor",
    "serialize_single_tensor",
    "serialize_tensordict",
    "unfold_batch_dim",
    "union_numpy_dict",
    "union_tensor_dict",
    "unpad_dataproto",
]

# make_iterator owns these DataLoader arguments; letting callers override them would break its contract.
_RESERVED_DATALOADER_KWARGS = ("batch_size", "sampler", "batch_sampler", "generator", "collate_fn")

# save_to_disk's file layout; bump the version when the layout changes so old readers fail loudly.
_DISK_FORMAT = "verl.DataProto"
_DISK_FORMAT_VERSION = 1
# numpy dtype kinds whose arrays are plain bytes (bool, ints, floats, complex, fixed-width strings, datetimes)
_RAW_NUMPY_KINDS = "biufcUSMm"


# ---------------------------------------------------------------------------------------------- small helpers


def _to_object_array(values: Sequence[Any]) -> np.ndarray:
    """Build a 1-D object array of ``len(values)``; ``np.array`` would turn a list of lists into a 2-D array."""
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


def _collate_row_ids(ids: list[int]) -> np.ndarray:
    # module level (not a lambda) so DataLoader worker processes can pickle it
    return np.asarray(ids, dtype=np.int64)


def _as_key_list(keys: str | Iterable[str] | None) -> list[str]:
    if keys is None:
        return []
    if isinstance(keys, str):
        return [keys]
    return list(keys)


def _is_nan(value: Any) -> bool:
    return isinstance(value, (float, np.floating)) and math.isnan(value)


def _deep_equal(a: Any, b: Any) -> bool:
    """Structural equality that treats NaN as equal to NaN and compares numpy arrays by dtype, shape and values.

    Object arrays, lists, tuples and dicts are compared element by element, so arrays nested inside them work.
    """
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and torch.equal(a.cpu(), b.cpu())
        )
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype.hasobject:
            return all(_deep_equal(x, y) for x, y in zip(a.ravel().tolist(), b.ravel().tolist()))
        # equal_nan only exists for numeric kinds; strings would raise on isnan
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if _is_nan(a) or _is_nan(b):
        return _is_nan(a) and _is_nan(b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_deep_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_deep_equal(a[key], b[key]) for key in a)
    try:
        return bool(a == b)
    except (ValueError, TypeError):
        return False


def _check_keys_exist(kind: str, requested: list[str], available: Iterable[str]) -> None:
    available = list(available)
    missing = [k for k in requested if k not in available]
    if missing:
        raise ValueError(
            f"DataProto has no {kind} key(s) {missing}; available {kind} keys: {sorted(available)}. "
            "Check the key names or add the data before selecting it."
        )


def _normalize_index(index: Any, length: int) -> np.ndarray:
    """Turn a list / ndarray / tensor row index (int or bool mask) into a 1-D int64 numpy array."""
    if isinstance(index, torch.Tensor):
        index = index.detach().cpu().numpy()
    index = np.asarray(index)
    if index.ndim != 1:
        raise ValueError(f"DataProto row index must be 1-D, got shape {index.shape}; pass a flat list of row ids.")
    if index.dtype == bool:
        if index.shape[0] != length:
            raise ValueError(f"Boolean row mask has length {index.shape[0]} but DataProto has {length} rows.")
        return np.nonzero(index)[0].astype(np.int64)
    if index.size == 0:
        return index.astype(np.int64)
    if not np.issubdtype(index.dtype, np.integer):
        raise ValueError(f"DataProto row index must hold integers or bools, got dtype {index.dtype}.")
    return index.astype(np.int64)


def list_of_dict_to_dict_of_list(list_of_dict: list[dict]) -> dict[str, list]:
    """Turn ``[{"a": 1, "b": 2}, {"a": 3, "b": 4}]`` into ``{"a": [1, 3], "b": [2, 4]}``.

    The keys of the first dict decide the output keys.

    Raises:
        ValueError: when a later dict has a key the first one lacks.
    """
    if not list_of_dict:
        return {}
    output: dict[str, list] = {key: [] for key in list_of_dict[0]}
    for i, item in enumerate(list_of_dict):
        for key, value in item.items():
            if key not in output:
                raise ValueError(
                    f"list_of_dict_to_dict_of_list: dict {i} has key {key!r}, which dict 0 lacks "
                    f"(its keys: {sorted(output)}); all dicts must share the first one's keys."
                )
            output[key].append(value)
    return output


# ---------------------------------------------------------------------------------------------- merging


def union_tensor_dict(tensor_dict1: TensorDict | None, tensor_dict2: TensorDict | None) -> TensorDict | None:
    """Add the keys of ``tensor_dict2`` to ``tensor_dict1`` in place and return ``tensor_dict1``.

    A key present in both must hold equal tensors (same shape, dtype and values). ``None`` on either side stands
    for "no tensors": the other argument is returned.

    Raises:
        ValueError: when the batch sizes differ, or a shared key holds different tensors (the key is named).
    """
    if tensor_dict2 is None:
        return tensor_dict1
    if tensor_dict1 is None:
        return tensor_dict2
    if tensor_dict1.batch_size != tensor_dict2.batch_size:
        raise ValueError(
            f"union conflict: the TensorDicts have batch sizes {list(tensor_dict1.batch_size)} and "
            f"{list(tensor_dict2.batch_size)}; they must be identical."
        )
    for key in tensor_dict2.keys():
        value = tensor_dict2.get(key)
        if key not in tensor_dict1.keys():
            tensor_dict1[key] = value
        elif not _deep_equal(tensor_dict1.get(key), value):
            raise ValueError(f"union conflict: batch key {key!r} holds different tensors in the two TensorDicts.")
    return tensor_dict1


def union_numpy_dict(
    tensor_dict1: dict[str, np.ndarray], tensor_dict2: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Add the arrays of ``tensor_dict2`` to ``tensor_dict1`` in place and return ``tensor_dict1``.

    A key present in both must hold equal arrays: same dtype and shape, equal elements, NaN counting as equal to
    NaN (object arrays are compared element by element).

    Raises:
        ValueError: when a value is not a numpy array, or a shared key holds different arrays (the key is named).
    """
    for key, value in tensor_dict2.items():
        if not isinstance(value, np.ndarray):
            raise ValueError(f"union_numpy_dict: value for {key!r} is a {type(value).__name__}, not a numpy array.")
        if key in tensor_dict1:
            mine = tensor_dict1[key]
            if not isinstance(mine, np.ndarray):
                raise ValueError(f"union_numpy_dict: value for {key!r} is a {type(mine).__name__}, not a numpy array.")
            if not _deep_equal(mine, value):
                raise ValueError(
                    f"union conflict: non_tensor_batch key {key!r} differs between the two dicts "
                    f"(dtype {mine.dtype} vs {value.dtype}, shape {mine.shape} vs {value.shape}, or the values)."
                )
        tensor_dict1[key] = value
    return tensor_dict1


def _union_meta_info(meta1: dict[str, Any], meta2: Mapping[str, Any]) -> dict[str, Any]:
    for key, value in meta2.items():
        if key in meta1 and not _deep_equal(meta1[key], value):
            raise ValueError(
                f"union conflict: meta_info key {key!r} is {meta1[key]!r} in one DataProto and {value!r} in the other."
            )
        meta1[key] = value
    return meta1


# ---------------------------------------------------------------------------------------------- fold / unfold


def fold_batch_dim(data: DataProto, new_batch_size: int) -> DataProto:
    """Group the ``B`` rows into ``new_batch_size`` rows of ``B // new_batch_size`` consecutive old rows each.

    Every tensor (B, ...) becomes (new_batch_size, B // new_batch_size, ...), every non-tensor array likewise;
    row ``i`` of the result holds old rows ``i * k .. i * k + k - 1`` with ``k = B // new_batch_size``. The input
    is left unchanged; meta_info is shallow-copied. :func:`unfold_batch_dim` undoes it.

    Raises:
        ValueError: when ``new_batch_size`` is not a positive divisor of ``len(data)``.
    """
    length = len(data)
    if new_batch_size <= 0 or length % new_batch_size != 0:
        raise ValueError(
            f"fold_batch_dim: new_batch_size={new_batch_size} must be a positive divisor of the {length} rows."
        )
    batch = None
    if data.batch is not None:
        tensors = {
            key: value.reshape(new_batch_size, length // new_batch_size, *value.shape[1:])
            for key, value in data.batch.items()
        }
        batch = TensorDict(tensors, batch_size=[new_batch_size], device=data.batch.device)
    non_tensor = {
        key: np.reshape(value, (new_batch_size, length // new_batch_size, *value.shape[1:]))
        for key, value in data.non_tensor_batch.items()
    }
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(data.meta_info))


def unfold_batch_dim(data: DataProto, batch_dims: int = 2) -> DataProto:
    """Merge the first ``batch_dims`` dimensions of every tensor and non-tensor array into one row dimension.

    A tensor (N, K, ...) becomes (N * K, ...) for ``batch_dims=2``, in row-major order, so
    ``unfold_batch_dim(fold_batch_dim(data, n))`` gives ``data`` back. The input is left unchanged.

    Raises:
        ValueError: when ``batch_dims < 1`` or the values disagree on their first ``batch_dims`` sizes.
    """
    if batch_dims < 1:
        raise ValueError(f"unfold_batch_dim: batch_dims must be >= 1, got {batch_dims}.")
    leading: dict[str, tuple[int, ...]] = {}
    values: list[tuple[str, Any]] = list(data.batch.items()) if data.batch is not None else []
    values += list(data.non_tensor_batch.items())
    for key, value in values:
        if value.ndim < batch_dims:
            raise ValueError(f"unfold_batch_dim: {key!r} has shape {tuple(value.shape)}, fewer than {batch_dims} dims.")
        leading[key] = tuple(value.shape[:batch_dims])
    if len(set(leading.values())) > 1:
        raise ValueError(f"unfold_batch_dim: the leading {batch_dims} dims differ between keys: {leading}.")
    rows = math.prod(next(iter(leading.values()))) if leading else 0
    batch = None
    if data.batch is not None:
        tensors = {key: value.reshape(rows, *value.shape[batch_dims:]) for key, value in data.batch.items()}
        batch = TensorDict(tensors, batch_size=[rows], device=data.batch.device)
    non_tensor = {
        key: np.reshape(value, (rows, *value.shape[batch_dims:])) for key, value in data.non_tensor_batch.items()
    }
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(data.meta_info))


# ---------------------------------------------------------------------------------------------- byte encoding


def serialize_single_tensor(obj: torch.Tensor) -> tuple[str, tuple[int, ...], np.ndarray]:
    """Encode a CPU tensor as ``(dtype name, shape, raw bytes)``.

    Args:
        obj: any dense CPU tensor, e.g. (B, S) int64.

    Returns:
        ``(dtype, shape, data)``: the dtype without its ``torch.`` prefix (``"bfloat16"``), the shape as a tuple,
        and a 1-D uint8 numpy array holding the contiguous bytes (it may share memory with ``obj``).
    """
    data = obj.detach().flatten().contiguous().view(torch.uint8).numpy()
    return str(obj.dtype).removeprefix("torch."), tuple(obj.shape), data


def deserialize_single_tensor(arr: tuple[str, Sequence[int], Any]) -> torch.Tensor:
    """Inverse of :func:`serialize_single_tensor`: a tensor of that dtype and shape (a fresh copy of the bytes).

    Raises:
        ValueError: when the triple is malformed or names an unknown dtype.
    """
    if not isinstance(arr, (tuple, list)) or len(arr) != 3:
        raise ValueError(f"deserialize_single_tensor expects (dtype, shape, data), got {type(arr).__name__}.")
    dtype_name, shape, data = arr
    torch_dtype = getattr(torch, str(dtype_name), None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"deserialize_single_tensor: {dtype_name!r} is not a torch dtype name (e.g. 'float32').")
    buffer = bytearray(data)
    if not buffer:  # torch.frombuffer rejects empty buffers
        return torch.empty(tuple(shape), dtype=torch_dtype)
    return torch.frombuffer(buffer, dtype=torch.uint8).view(torch_dtype).view(tuple(shape))


def serialize_tensordict(batch: TensorDict) -> tuple[tuple[int, ...], str | None, dict[str, tuple]]:
    """Encode a TensorDict of CPU tensors as ``(batch_size, device, {key: encoding})``.

    A dense tensor's encoding is :func:`serialize_single_tensor`'s triple; a nested (jagged) tensor's is the pair
    ``(layout name, [triple of each component])``.

    Raises:
        ValueError: when a value is not a tensor (e.g. non-tensor data or a nested TensorDict).
    """
    encoded: dict[str, tuple] = {}
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"serialize_tensordict: {key!r} is a {type(value).__name__}; only tensors can be encoded.")
        if value.is_nested:
            layout = str(value.layout).removeprefix("torch.")
            encoded[key] = (layout, [serialize_single_tensor(part) for part in value.unbind()])
        else:
            encoded[key] = serialize_single_tensor(value)
    device = str(batch.device) if batch.device is not None else None
    return tuple(batch.batch_size), device, encoded


def deserialize_tensordict(arr: tuple[Sequence[int], str | None, Mapping[str, tuple]]) -> TensorDict:
    """Inverse of :func:`serialize_tensordict`.

    Raises:
        ValueError: when an encoding is neither a dense triple nor a nested ``(layout, parts)`` pair.
    """
    batch_size, device, encoded = arr
    decoded: dict[str, torch.Tensor] = {}
    for key, value in encoded.items():
        if len(value) == 3:
            decoded[key] = deserialize_single_tensor(value)
        elif len(value) == 2:
            layout, parts = value
            decoded[key] = torch.nested.as_nested_tensor(
                [deserialize_single_tensor(part) for part in parts], layout=getattr(torch, layout)
            )
        else:
            raise ValueError(
                f"deserialize_tensordict: encoding of {key!r} has {len(value)} fields; expected 3 (dense tensor) "
                "or 2 (nested tensor)."
            )
    return TensorDict(decoded, batch_size=list(batch_size), device=device)


# ---------------------------------------------------------------------------------------------- safe disk format
#
# save_to_disk writes a torch.save archive that torch.load(weights_only=True) can read: only tensors, str, int,
# float, bool, None, lists, tuples and dicts. numpy arrays and other Python values are therefore rewritten into
# tagged tuples of those types; anything else is refused at save time rather than pickled.


def _encode_array(array: np.ndarray, where: str) -> tuple:
    if array.dtype.hasobject:
        return ("object_array", list(array.shape), [_encode_value(item, where) for item in array.ravel().tolist()])
    if array.dtype.kind in _RAW_NUMPY_KINDS and array.dtype.fields is None:
        raw = np.ascontiguousarray(array).tobytes()
        data = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        return ("array", array.dtype.str, list(array.shape), data)
    raise ValueError(
        f"save_to_disk: {where} holds a numpy array of dtype {array.dtype}, which cannot be stored safely; "
        "convert it to a plain numeric, string or object dtype."
    )


def _encode_value(value: Any, where: str) -> Any:
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, torch.Tensor):
        return ("tensor", value.detach().cpu())
    if isinstance(value, np.ndarray):
        return ("ndarray", _encode_array(value, where))
    if isinstance(value, np.generic):
        return ("npscalar", _encode_array(np.asarray(value), where))
    if isinstance(value, (list, tuple, set, frozenset)):
        return (type(value).__name__, [_encode_value(item, where) for item in value])
    if isinstance(value, dict):
        return ("dict", [(_encode_value(k, where), _encode_value(v, where)) for k, v in value.items()])
    if isinstance(value, complex):
        return ("complex", value.real, value.imag)
    if isinstance(value, (bytes, bytearray)):
        return (type(value).__name__, torch.tensor(list(value), dtype=torch.uint8))
    # subclasses (str/int enums, ...) would be pickled by class and refused at load: keep their plain value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str.__str__(value)
    raise ValueError(
        f"save_to_disk: {where} holds a {type(value).__module__}.{type(value).__qualname__}, which cannot be stored "
        "safely. Supported: tensors, numpy arrays and scalars, str, int, float, complex, bool, None, bytes, and "
        "lists, tuples, sets and dicts of these; convert other objects (e.g. to a tensor or a dict) first."
    )


def _decode_array(encoded: Any) -> np.ndarray:
    tag = encoded[0]
    if tag == "object_array":
        _, shape, items = encoded
        return _to_object_array([_decode_value(item) for item in items]).reshape(shape)
    if tag == "array":
        _, dtype, shape, data = encoded
        return np.frombuffer(data.numpy().tobytes(), dtype=np.dtype(dtype)).reshape(shape).copy()
    raise ValueError(f"load_from_disk: unknown array encoding {tag!r}; the file is corrupt or from a newer version.")


def _decode_value(value: Any) -> Any:
    if not isinstance(value, tuple):
        return value  # plain str / int / float / bool / None
    tag, *payload = value
    if tag == "tensor":
        return payload[0]
    if tag == "ndarray":
        return _decode_array(payload[0])
    if tag == "npscalar":
        return _decode_array(payload[0])[()]
    if tag in ("list", "tuple", "set", "frozenset"):
        items = [_decode_value(item) for item in payload[0]]
        return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
    if tag == "dict":
        return {_decode_value(k): _decode_value(v) for k, v in payload[0]}
    if tag == "complex":
        return complex(payload[0], payload[1])
    if tag in ("bytes", "bytearray"):
        raw = bytes(payload[0].tolist())
        return raw if tag == "bytes" else bytearray(raw)
    raise ValueError(f"load_from_disk: unknown value encoding {tag!r}; the file is corrupt or from a newer version.")


# ---------------------------------------------------------------------------------------------- the containers


@dataclass
class DataProtoItem:
    """One row of a DataProto, as returned by ``data[i]`` for an integer ``i``.

    Attributes:
        batch: TensorDict with ``batch_size=[]`` (each tensor lost its leading row dimension), or None.
        non_tensor_batch: dict mapping each key to the row's element.
        meta_info: the parent's meta_info (shallow copy).
    """

    batch: TensorDict | None = None
    non_tensor_batch: dict[str, Any] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)


@dataclass
class DataProto:
    """A batch of ``B`` rows: tensors, numpy arrays and batch-wide meta information.

    Attributes:
        batch: TensorDict with ``batch_size=[B]``, e.g. ``input_ids`` (B, S); or None when there are no tensors.
        non_tensor_batch: dict of numpy arrays, each of length ``B`` (strings as ``dtype=object`` arrays).
        meta_info: batch-wide values; row operations copy it unchanged to their results.

    Indexing: ``data[i]`` with an int returns a :class:`DataProtoItem` (a single-row view); a slice returns a
    DataProto; a 1-D list / ndarray / tensor of row ids (or a boolean mask) returns a DataProto of those rows.
    """

    batch: TensorDict | None = None
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.check_consistency()

    def check_consistency(self) -> None:
        """Check that every tensor and non-tensor array has the same number of rows.

        Raises:
            ValueError: when the batch is not 1-D, a non-tensor value is not a numpy array, or lengths differ.
        """
        lengths: dict[str, int] = {}
        if self.batch is not None:
            if len(self.batch.batch_size) != 1:
                shape = list(self.batch.batch_size)
                raise ValueError(f"DataProto.batch must have exactly one batch dimension, got batch_size={shape}.")
            lengths["batch"] = int(self.batch.batch_size[0])
        for key, value in self.non_tensor_batch.items():
            if not isinstance(value, np.ndarray):
                raise ValueError(
                    f"non_tensor_batch[{key!r}] must be a numpy array, got {type(value).__name__}; "
                    "wrap lists with DataProto.from_dict / from_single_dict, which convert them to object arrays."
                )
            if value.ndim == 0:
                raise ValueError(f"non_tensor_batch[{key!r}] is a 0-d array; it needs one entry per row.")
            lengths[key] = len(value)
        if len(set(lengths.values())) > 1:
            raise ValueError(
                f"DataProto parts have different numbers of rows: {lengths}. "
                "Every tensor and non-tensor array must have the same length along dim 0."
            )

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, np.ndarray | list] | None = None,
        meta_info: dict[str, Any] | None = None,
        num_batch_dims: int = 1,
    ) -> DataProto:
        """Build a DataProto from tensors (each (B, ...)) and non-tensor arrays or lists (each of length B).

        Lists and tuples become 1-D object arrays (a list of lists stays one row per inner list).

        Args:
            tensors: per-row tensors sharing dim 0.
            non_tensors: per-row numpy arrays, lists or tuples.
            meta_info: batch-wide values.
            num_batch_dims: how many leading dims are batch dims; a DataProto has exactly one, so only 1 is
                accepted (the argument exists for verl compatibility; use :func:`fold_batch_dim` for groups).

        Raises:
            ValueError: when the tensors disagree on B, a value has the wrong type, lengths differ, or
                ``num_batch_dims != 1``.
        """
        if num_batch_dims != 1:
            raise ValueError(
                f"from_dict: num_batch_dims={num_batch_dims} is not supported; a DataProto has exactly one batch "
                "dimension. Build it with num_batch_dims=1 and use fold_batch_dim to group rows."
            )
        tensors = dict(tensors or {})
        batch = None
        if tensors:
            for key, value in tensors.items():
                if not isinstance(value, torch.Tensor) or value.dim() == 0:
                    raise ValueError(f"tensors[{key!r}] must be a tensor with a row dimension, got {value!r:.80}.")
            sizes = {key: int(value.shape[0]) for key, value in tensors.items()}
            if len(set(sizes.values())) > 1:
                raise ValueError(f"Tensors have different numbers of rows (dim 0): {sizes}; they must all match.")
            batch = TensorDict(tensors, batch_size=[next(iter(sizes.values()))])
        converted = {}
        for key, value in (non_tensors or {}).items():
            if isinstance(value, (list, tuple)):
                value = _to_object_array(value)
            converted[key] = value
        return cls(batch=batch, non_tensor_batch=converted, meta_info=dict(meta_info or {}))

    @classmethod
    def from_single_dict(cls, data: dict[str, Any], meta_info: dict[str, Any] | None = None) -> DataProto:
        """Split one dict into tensors (``torch.Tensor`` values) and non-tensors (numpy arrays, lists).

        Raises:
            ValueError: for a value that is neither a tensor, a numpy array nor a list/tuple.
        """
        tensors, non_tensors = {}, {}
        for key, value in data.items():
            if isinstance(value, torch.Tensor):
                tensors[key] = value
            elif isinstance(value, (np.ndarray, list, tuple)):
                non_tensors[key] = value
            else:
                raise ValueError(
                    f"from_single_dict: value for {key!r} has type {type(value).__name__}; accepted are "
                    "torch.Tensor, np.ndarray, list and tuple. Put batch-wide scalars into meta_info instead."
                )
        return cls.from_dict(tensors, non_tensors, meta_info)

    @classmethod
    def from_tensordict(
        cls,
        tensor_dict: TensorDict | None = None,
        meta_info: dict[str, Any] | None = None,
        num_batch_dims: int = 1,
    ) -> DataProto:
        """Build a DataProto from a TensorDict such as :meth:`to_tensordict` returns.

        Tensors go to ``batch``; ``NonTensorStack`` values (one object per row) become ``dtype=object`` arrays in
        ``non_tensor_batch``; ``NonTensorData`` values (one object for the batch) go to ``meta_info``, on top of
        the ``meta_info`` argument.

        Args:
            tensor_dict: a TensorDict with ``batch_size=[B]`` (None gives an empty DataProto).
            meta_info: extra batch-wide values.
            num_batch_dims: only 1 is accepted, as in :meth:`from_dict`.

        Raises:
            ValueError: for ``num_batch_dims != 1``, a value of another kind (e.g. a nested TensorDict), or parts
                with different numbers of rows.
        """
        from tensordict.tensorclass import NonTensorData, NonTensorStack

        if num_batch_dims != 1:
            raise ValueError(
                f"from_tensordict: num_batch_dims={num_batch_dims} is not supported; a DataProto has exactly one "
                "batch dimension."
            )
        meta = dict(meta_info or {})
        if tensor_dict is None:
            return cls(meta_info=meta)
        tensors: dict[str, torch.Tensor] = {}
        non_tensor: dict[str, np.ndarray] = {}
        for key, value in tensor_dict.items():
            if isinstance(value, torch.Tensor):
                tensors[key] = value
            elif isinstance(value, NonTensorStack):
                non_tensor[key] = _to_object_array(value.tolist())
            elif isinstance(value, NonTensorData):
                meta[key] = value.data
            else:
                raise ValueError(
                    f"from_tensordict: {key!r} is a {type(value).__name__}; accepted are tensors, NonTensorStack "
                    "(per-row objects) and NonTensorData (batch-wide values)."
                )
        batch = None
        if tensors:
            rows = (
                tensor_dict.batch_size[:1] if len(tensor_dict.batch_size) else [next(iter(tensors.values())).shape[0]]
            )
            batch = TensorDict(tensors, batch_size=list(rows), device=tensor_dict.device)
        return cls(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def to_tensordict(self) -> TensorDict:
        """This batch as one TensorDict: tensors as they are, non-tensor arrays as ``NonTensorStack`` (one object
        per row), meta_info entries as ``NonTensorData``; :meth:`from_tensordict` reverses it.

        Non-tensor arrays come back from the round trip as ``dtype=object`` arrays.

        Returns:
            A TensorDict with ``batch_size=[B]`` (``[]`` when the DataProto has no rows at all).

        Raises:
            ValueError: when a key is used by more than one of batch, non_tensor_batch and meta_info.
        """
        from verl.utils import tensordict_utils as tu

        tensors = dict(self.batch.items()) if self.batch is not None else {}
        clashes = (set(tensors) & set(self.non_tensor_batch)) | (
            (set(tensors) | set(self.non_tensor_batch)) & set(self.meta_info)
        )
        if clashes:
            raise ValueError(
                f"to_tensordict: key(s) {sorted(clashes)} appear in more than one of batch, non_tensor_batch and "
                "meta_info; a TensorDict has one namespace. Rename them first (DataProto.rename)."
            )
        per_row: dict[str, Any] = dict(tensors)
        for key, value in self.non_tensor_batch.items():
            per_row[key] = list(value)
        return tu.get_tensordict(tensor_dict=per_row, non_tensor_dict=self.meta_info)

    # ------------------------------------------------------------------ rows

    def __len__(self) -> int:
        if self.batch is not None:
            return int(self.batch.batch_size[0])
        for value in self.non_tensor_batch.values():
            return len(value)
        return 0

    def _take_rows(self, index: np.ndarray | slice) -> DataProto:
        """New DataProto holding the given rows; meta_info is shallow-copied."""
        batch = None
        if self.batch is not None:
            batch = self.batch[index] if isinstance(index, slice) else self.batch[torch.from_numpy(index)]
        non_tensor = {key: value[index] for key, value in self.non_tensor_batch.items()}
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))

    def __getitem__(self, item: int | slice | Sequence[int] | np.ndarray | torch.Tensor) -> DataProto | DataProtoItem:
        """``data[i]`` -> :class:`DataProtoItem`; ``data[a:b:c]`` and ``data[list/ndarray/tensor]`` -> DataProto.

        Raises:
            IndexError: for an int outside ``[-B, B)``.
            TypeError: for any other index type (e.g. a string), as in verl.
        """
        if isinstance(item, (int, np.integer)) and not isinstance(item, bool):
            length = len(self)
            if not -length <= item < length:
                raise IndexError(f"Row {item} is out of range for a DataProto with {length} rows.")
            batch = self.batch[int(item)] if self.batch is not None else None
            non_tensor = {key: value[item] for key, value in self.non_tensor_batch.items()}
            return DataProtoItem(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))
        if isinstance(item, slice):
            return self.slice(item.start, item.stop, item.step)
        if isinstance(item, (list, tuple, np.ndarray, torch.Tensor)):
            return self.select_idxs(item)
        raise TypeError(
            f"DataProto index of type {type(item).__name__} is not supported; use an int, a slice, "
            "or a 1-D list/ndarray/tensor of row ids or a boolean mask."
        )

    def select_idxs(self, idxs: Sequence[int] | np.ndarray | torch.Tensor) -> DataProto:
        """The rows named by ``idxs`` (1-D row ids, repeats allowed, or a boolean mask of length B).

        Raises:
            ValueError: for a multi-dimensional index, a non-integer dtype, or a mask of the wrong length.
        """
        return self._take_rows(_normalize_index(idxs, len(self)))

    def slice(self, start: int | None = None, end: int | None = None, step: int | None = None) -> DataProto:
        """Rows ``start:end:step`` (Python slice semantics) as a new DataProto."""
        return self._take_rows(slice(start, end, step))

    # ------------------------------------------------------------------ keys

    def select(
        self,
        batch_keys: str | Iterable[str] | None = None,
        non_tensor_batch_keys: str | Iterable[str] | None = None,
        meta_info_keys: str | Iterable[str] | None = None,
        deepcopy: bool = False,
    ) -> DataProto:
        """Keep only the named keys (None keeps all keys of that part).

        As in verl, ``non_tensor_batch_keys`` and ``meta_info_keys`` act as filters: names that are absent are
        skipped. Tensors are shared with ``self`` unless ``deepcopy``, which also deep-copies the other parts.

        Raises:
            ValueError: naming any batch (tensor) key that does not exist, with the available keys.
        """
        batch = self.batch
        if batch_keys is not None:
            keys = _as_key_list(batch_keys)
            _check_keys_exist("batch", keys, batch.keys() if batch is not None else [])
            if batch is not None:
                batch = batch.select(*keys)
        non_tensor = dict(self.non_tensor_batch)
        if non_tensor_batch_keys is not None:
            wanted = set(_as_key_list(non_tensor_batch_keys))
            non_tensor = {key: value for key, value in non_tensor.items() if key in wanted}
        meta = dict(self.meta_info)
        if meta_info_keys is not None:
            wanted = set(_as_key_list(meta_info_keys))
            meta = {key: value for key, value in meta.items() if key in wanted}
        if deepcopy:
            batch = batch.clone() if batch is not None else None
            non_tensor, meta = copy.deepcopy(non_tensor), copy.deepcopy(meta)
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def pop(
        self,
        batch_keys: str | Iterable[str] | None = None,
        non_tensor_batch_keys: str | Iterable[str] | None = None,
        meta_info_keys: str | Iterable[str] | None = None,
    ) -> DataProto:
        """Remove the named keys from ``self`` and return them as a new DataProto (None pops nothing).

        The result is built like :meth:`from_dict`, so it has ``batch=None`` when no tensor key is popped. All keys
        are checked before anything is removed, so a bad key leaves ``self`` untouched.

        Raises:
            ValueError: naming any key that does not exist, with the available keys.
        """
        batch_keys = _as_key_list(batch_keys)
        non_tensor_keys = _as_key_list(non_tensor_batch_keys)
        meta_keys = _as_key_list(meta_info_keys)
        _check_keys_exist("batch", batch_keys, self.batch.keys() if self.batch is not None else [])
        _check_keys_exist("non_tensor_batch", non_tensor_keys, self.non_tensor_batch.keys())
        _check_keys_exist("meta_info", meta_keys, self.meta_info.keys())
        tensors = {key: self.batch.pop(key) for key in batch_keys}
        non_tensor = {key: self.non_tensor_batch.pop(key) for key in non_tensor_keys}
        meta = {key: self.meta_info.pop(key) for key in meta_keys}
        popped = type(self).from_dict(tensors=tensors, non_tensors=non_tensor, meta_info=meta)
        if popped.batch is not None and self.batch is not None and self.batch.device is not None:
            popped.batch = popped.batch.to(self.batch.device)
        return popped

    def rename(
        self, old_keys: str | Sequence[str] | None = None, new_keys: str | Sequence[str] | None = None
    ) -> DataProto:
        """Rename keys in place and return ``self``.

        verl renames tensor keys only; here non-tensor keys can be renamed the same way.

        Raises:
            ValueError: when the key lists differ in length, an old key is missing, or a new key is taken.
        """
        old, new = _as_key_list(old_keys), _as_key_list(new_keys)
        if len(old) != len(new):
            raise ValueError(f"rename needs as many new keys as old keys, got {old} -> {new}.")
        batch_keys = list(self.batch.keys()) if self.batch is not None else []
        _check_keys_exist("batch or non_tensor_batch", old, batch_keys + list(self.non_tensor_batch))
        for old_key, new_key in zip(old, new):
            if old_key == new_key:
                continue
            if new_key in batch_keys or new_key in self.non_tensor_batch:
                raise ValueError(f"Cannot rename {old_key!r} to {new_key!r}: {new_key!r} already exists.")
            if old_key in batch_keys:
                self.batch.rename_key_(old_key, new_key)
                batch_keys = list(self.batch.keys())
            else:
                self.non_tensor_batch[new_key] = self.non_tensor_batch.pop(old_key)
        return self

    def union(self, other: DataProto) -> DataProto:
        """Merge ``other`` into ``self`` in place and return ``self``.

        Keys present in both must hold equal values: tensors by :func:`union_tensor_dict`, non-tensor arrays by
        :func:`union_numpy_dict` (same dtype, NaN equal to NaN), meta_info values by equality. Everything is
        checked before ``self`` changes, so a conflict leaves it untouched.

        Raises:
            ValueError: when lengths differ, or a key present in both holds different values (the key is named).
        """
        if len(self) != len(other):
            raise ValueError(f"Cannot union DataProtos of different lengths: {len(self)} vs {len(other)}.")
        # check every part on copies first, then commit in place (callers may hold references to self's parts)
        merged_batch = None
        if self.batch is not None and other.batch is not None:
            merged_batch = union_tensor_dict(self.batch.copy(), other.batch)
        non_tensor = union_numpy_dict(dict(self.non_tensor_batch), other.non_tensor_batch)
        meta = _union_meta_info(dict(self.meta_info), other.meta_info)
        if merged_batch is not None:
            for key in merged_batch.keys():
                if key not in self.batch.keys():
                    self.batch[key] = merged_batch.get(key)
        elif self.batch is None and other.batch is not None:
            self.batch = other.batch.select(*other.batch.keys())
        self.non_tensor_batch.update(non_tensor)
        self.meta_info.update(meta)
        return self

    # ------------------------------------------------------------------ splitting and joining

    def chunk(self, chunks: int) -> list[DataProto]:
        """Split into ``chunks`` equal parts; each carries a copy of meta_info.

        Raises:
            ValueError: when ``chunks`` is not positive or does not divide ``len(self)``.
        """
        length = len(self)
        if chunks <= 0 or length % chunks != 0:
            raise ValueError(
                f"chunk({chunks}): the DataProto has {length} rows, which is not divisible into {chunks} equal "
                "chunks. Pad it first with pad_dataproto_to_divisor, or pick a divisor of the length."
            )
        size = length // chunks
        return [self.slice(i * size, (i + 1) * size) for i in range(chunks)]

    def split(self, split_size: int) -> list[DataProto]:
        """Split into parts of ``split_size`` rows; the last part may be shorter."""
        if split_size <= 0:
            raise ValueError(f"split_size must be a positive integer, got {split_size}.")
        return [self.slice(start, start + split_size) for start in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: Sequence[DataProto]) -> DataProto:
        """Concatenate along rows and merge the parts' meta_info.

        meta_info is merged as verl does: every key except ``"metrics"`` must have the same value in all parts
        that have it; ``"metrics"`` (a dict, or a list of dicts, per part, e.g. one per worker) are gathered into
        one dict of lists, ``{"loss": [loss_part0, loss_part1, ...]}``.

        Raises:
            ValueError: for an empty list, parts whose tensor / non-tensor keys differ, or a meta_info key with
                different values in two parts.
        """
        if not data:
            raise ValueError("DataProto.concat needs at least one DataProto, got an empty list.")
        first = data[0]
        for i, part in enumerate(data[1:], start=1):
            first_keys = set(first.batch.keys()) if first.batch is not None else None
            part_keys = set(part.batch.keys()) if part.batch is not None else None
            if first_keys != part_keys or set(first.non_tensor_batch) != set(part.non_tensor_batch):
                raise ValueError(
                    f"DataProto.concat: part {i} has keys batch={part_keys}, non_tensor={sorted(part.non_tensor_batch)}"
                    f" but part 0 has batch={first_keys}, non_tensor={sorted(first.non_tensor_batch)}."
                )
        batch = torch.cat([part.batch for part in data], dim=0) if first.batch is not None else None
        non_tensor = {
            key: np.concatenate([part.non_tensor_batch[key] for part in data], axis=0) for key in first.non_tensor_batch
        }
        meta: dict[str, Any] = {}
        metrics: list[dict] = []
        for i, part in enumerate(data):
            for key, value in part.meta_info.items():
                if key == "metrics":
                    if value is not None:
                        metrics.extend(value if isinstance(value, list) else [value])
                elif key in meta and not _deep_equal(meta[key], value):
                    raise ValueError(
                        f"DataProto.concat: meta_info key {key!r} is {meta[key]!r} in an earlier part but {value!r} "
                        f"in part {i}; parts must agree on meta_info (per-part values belong in 'metrics')."
                    )
                else:
                    meta[key] = value
        if metrics:
            meta["metrics"] = list_of_dict_to_dict_of_list(metrics)
        return type(first)(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> DataProto:
        """Repeat every row ``repeat_times`` times: interleaved ``[a, a, b, b]`` or tiled ``[a, b, a, b]``."""
        if repeat_times <= 0:
            raise ValueError(f"repeat_times must be a positive integer, got {repeat_times}.")
        rows = np.arange(len(self), dtype=np.int64)
        index = np.repeat(rows, repeat_times) if interleave else np.tile(rows, repeat_times)
        return self._take_rows(index)

    def reorder(self, indices: Sequence[int] | np.ndarray | torch.Tensor) -> DataProto:
        """Permute rows in place (row ``i`` becomes old row ``indices[i]``) and return ``self``."""
        index = _normalize_index(indices, len(self))
        if len(index) != len(self):
            raise ValueError(f"reorder needs {len(self)} indices (one per row), got {len(index)}.")
        reordered = self._take_rows(index)
        self.batch, self.non_tensor_batch = reordered.batch, reordered.non_tensor_batch
        return self

    def to(self, device: str | torch.device) -> DataProto:
        """Move the tensors to ``device`` in place and return ``self``."""
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self

    def make_iterator(
        self,
        mini_batch_size: int,
        epochs: int,
        seed: int | None = None,
        dataloader_kwargs: dict[str, Any] | None = None,
    ) -> Iterator[DataProto]:
        """Yield mini-batches of ``mini_batch_size`` rows for ``epochs`` passes over the data.

        Shuffling follows ``dataloader_kwargs["shuffle"]`` as in verl; when that key is absent, the rows are
        shuffled exactly when a ``seed`` is given (this project's callers rely on that). A ``seed`` seeds one
        ``torch.Generator`` once, so every epoch gets a fresh permutation and the whole sequence is reproducible.
        Every mini-batch carries a copy of ``meta_info``. Other ``dataloader_kwargs`` (e.g. ``num_workers``) go to
        the underlying ``DataLoader``.

        Raises:
            ValueError: when ``len(self)`` is not divisible by ``mini_batch_size``, ``epochs`` is negative, or
                ``dataloader_kwargs`` sets an argument this method controls (batch_size, sampler, batch_sampler,
                generator, collate_fn).
        """
        if mini_batch_size <= 0 or len(self) % mini_batch_size != 0:
            raise ValueError(
                f"make_iterator: {len(self)} rows are not divisible by mini_batch_size={mini_batch_size}; "
                "choose a mini-batch size that divides the batch, or pad the batch first."
            )
        if epochs < 0:
            raise ValueError(f"make_iterator: epochs must be >= 0, got {epochs}.")
        kwargs = dict(dataloader_kwargs or {})
        reserved = sorted(set(kwargs) & set(_RESERVED_DATALOADER_KWARGS))
        if reserved:
            raise ValueError(f"make_iterator sets {reserved} itself; remove them from dataloader_kwargs.")
        shuffle = bool(kwargs.pop("shuffle", seed is not None))
        generator = None
        if seed is not None:
            generator = torch.Generator()
            generator.manual_seed(seed)
        loader = DataLoader(
            list(range(len(self))),
            batch_size=mini_batch_size,
            shuffle=shuffle,
            generator=generator,
            collate_fn=_collate_row_ids,
            **kwargs,
        )

        def _iterate() -> Iterator[DataProto]:
            for _ in range(epochs):
                for index in loader:
                    yield self._take_rows(index)

        return _iterate()

    # ------------------------------------------------------------------ disk

    def save_to_disk(self, filepath: str | os.PathLike) -> None:
        """Write this batch to ``filepath`` in a format that loads without unpickling arbitrary objects.

        verl pickles the whole object, so loading its files runs whatever code the file names: only files from a
        trusted source may be loaded that way. This implementation instead writes a ``torch.save`` archive of
        plain data (tensors moved to CPU, numpy arrays as dtype + shape + raw bytes, object arrays and meta_info
        as nested lists / dicts / tuples of tensors, str, int, float, bool and None; subclasses of str, int and
        float, such as string enums, are stored as their plain value), which
        :meth:`load_from_disk` reads with ``torch.load(weights_only=True)``. Files written by upstream verl are
        pickles and are not readable here; re-save them with this method.

        Raises:
            ValueError: when a non-tensor element or a meta_info value is of a type that cannot be stored safely
                (e.g. a custom class instance); the message names the key.
        """
        batch = None
        if self.batch is not None:
            batch = {
                "batch_size": list(self.batch.batch_size),
                "tensors": {key: value.detach().cpu() for key, value in self.batch.items()},
            }
        payload = {
            "format": _DISK_FORMAT,
            "version": _DISK_FORMAT_VERSION,
            "batch": batch,
            "non_tensor_batch": {
                key: _encode_array(value, f"non_tensor_batch[{key!r}]") for key, value in self.non_tensor_batch.items()
            },
            "meta_info": {key: _encode_value(value, f"meta_info[{key!r}]") for key, value in self.meta_info.items()},
        }
        torch.save(payload, filepath)

    @staticmethod
    def load_from_disk(filepath: str | os.PathLike) -> DataProto:
        """Read a file written by :meth:`save_to_disk`; tensors are loaded onto the CPU.

        Loading uses ``torch.load(weights_only=True)``, which refuses to run code from the file, so files from
        untrusted sources are safe to open.

        Raises:
            ValueError: when the file is not in this format (e.g. a pickle written by upstream verl), or is
                corrupt or from a newer version.
        """
        try:
            payload = torch.load(filepath, weights_only=True, map_location="cpu")
        except Exception as err:  # the unpickler raises several error types for foreign files
            raise ValueError(
                f"load_from_disk: {os.fspath(filepath)!r} is not a DataProto file written by save_to_disk "
                f"({type(err).__name__}: {err}). Pickled DataProtos (upstream verl's format) are refused because "
                "loading them can run arbitrary code; re-save the data with DataProto.save_to_disk."
            ) from err
        if not isinstance(payload, dict) or payload.get("format") != _DISK_FORMAT:
            raise ValueError(f"load_from_disk: {os.fspath(filepath)!r} does not hold a {_DISK_FORMAT} archive.")
        if payload.get("version") != _DISK_FORMAT_VERSION:
            raise ValueError(
                f"load_from_disk: {os.fspath(filepath)!r} has format version {payload.get('version')!r}; this "
                f"version of verl reads version {_DISK_FORMAT_VERSION}."
            )
        batch = None
        if payload["batch"] is not None:
            batch = TensorDict(payload["batch"]["tensors"], batch_size=payload["batch"]["batch_size"])
        non_tensor = {key: _decode_array(value) for key, value in payload["non_tensor_batch"].items()}
        meta = {key: _decode_value(value) for key, value in payload["meta_info"].items()}
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)


# ---------------------------------------------------------------------------------------------- padding


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Pad ``data`` to a multiple of ``size_divisor`` rows by appending copies of its first rows.

    Rows are taken cyclically from the start, so a batch shorter than the padding still works.

    Returns:
        ``(padded, pad_size)`` where ``len(padded) == len(data) + pad_size`` and ``pad_size < size_divisor``.

    Raises:
        ValueError: when ``size_divisor`` is not positive, or padding is needed but ``data`` is empty.
    """
    if size_divisor <= 0:
        raise ValueError(f"size_divisor must be a positive integer, got {size_divisor}.")
    length = len(data)
    pad_size = (size_divisor - length % size_divisor) % size_divisor
    if pad_size == 0:
        return data, 0
    if length == 0:
        raise ValueError("Cannot pad an empty DataProto: there are no rows to repeat.")
    padding = data[np.arange(pad_size, dtype=np.int64) % length]
    return DataProto.concat([data, padding]), pad_size


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Drop the last ``pad_size`` rows added by :func:`pad_dataproto_to_divisor`."""
    if pad_size < 0 or pad_size > len(data):
        raise ValueError(f"pad_size must be in [0, {len(data)}], got {pad_size}.")
    if pad_size == 0:
        return data
    return data.slice(0, len(data) - pad_size)
