"""Functions on the parts of a DataProto: merging, comparing, padding, folding and byte-encoding.

:mod:`verl.protocol` re-exports the public ones under verl's names, so ``from verl.protocol import
union_numpy_dict`` works as in verl; import them from there. They take a DataProto (or its TensorDict / numpy
parts) and build results with ``type(data)``, so subclasses of DataProto stay subclasses and this module needs no
import of the class. Bad input raises :class:`verl.utils.errors.ValidationError` (a ``ValueError`` that is also an
``AssertionError``, for code written against verl's asserts).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tensordict import TensorDict

from verl.utils.errors import ValidationError

if TYPE_CHECKING:
    from verl.protocol import DataProto

__all__ = [
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


# ---------------------------------------------------------------------------------------------- small helpers


def to_object_array(values: Sequence[Any]) -> np.ndarray:
    """A 1-D object array of ``len(values)``, one element per item even when the items are lists."""
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


def as_non_tensor_array(values: Sequence[Any]) -> np.ndarray:
    """A list or tuple as verl's ``from_dict`` converts it: ``np.array(values, dtype=object)``.

    A list of equal-length lists therefore becomes a 2-D object array (rows x columns), which
    :meth:`DataProto.unfold_column_chunks` splits along the columns; ragged lists, dicts and strings give one
    element per row. Items numpy cannot line up (arrays of unequal shapes) fall back to one element per row.
    """
    try:
        return np.array(values, dtype=object)
    except ValueError:
        return to_object_array(values)


def as_key_list(keys: str | Iterable[str] | None) -> list[str]:
    if keys is None:
        return []
    if isinstance(keys, str):
        return [keys]
    return list(keys)


def check_keys_exist(kind: str, requested: list[str], available: Iterable[str]) -> None:
    available = list(available)
    missing = [k for k in requested if k not in available]
    if missing:
        raise ValidationError(
            f"DataProto has no {kind} key(s) {missing}; available {kind} keys: {sorted(available)}. "
            "Check the key names or add the data before selecting it."
        )


def normalize_index(index: Any, length: int) -> np.ndarray:
    """Turn a list / ndarray / tensor row index (int or bool mask) into a 1-D int64 numpy array."""
    if isinstance(index, torch.Tensor):
        index = index.detach().cpu().numpy()
    index = np.asarray(index)
    if index.ndim != 1:
        raise ValidationError(f"DataProto row index must be 1-D, got shape {index.shape}; pass a flat list of row ids.")
    if index.dtype == bool:
        if index.shape[0] != length:
            raise ValidationError(f"Boolean row mask has length {index.shape[0]} but DataProto has {length} rows.")
        return np.nonzero(index)[0].astype(np.int64)
    if index.size == 0:
        return index.astype(np.int64)
    if not np.issubdtype(index.dtype, np.integer):
        raise ValidationError(f"DataProto row index must hold integers or bools, got dtype {index.dtype}.")
    return index.astype(np.int64)


def _is_nan(value: Any) -> bool:
    return isinstance(value, (float, np.floating)) and math.isnan(value)


def deep_equal(a: Any, b: Any, _active: set[tuple[int, int]] | None = None) -> bool:
    """Structural equality: NaN equals NaN, numpy arrays compare by dtype, shape and values, tensors likewise.

    Object arrays, lists, tuples and dicts are compared element by element. A pair of containers met again while
    it is still being compared is a reference cycle; it counts as equal, so self-referencing structures compare
    without endless recursion.
    """
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and torch.equal(a.cpu(), b.cpu())
        )
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and not a.dtype.hasobject:
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        # equal_nan only exists for numeric kinds; strings would raise on isnan
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if _is_nan(a) or _is_nan(b):
        return _is_nan(a) and _is_nan(b)
    if not isinstance(a, (np.ndarray, list, tuple, dict)):
        if isinstance(b, np.ndarray):
            return False
        try:
            return bool(a == b)
        except (ValueError, TypeError):
            return False
    active = set() if _active is None else _active
    pair = (id(a), id(b))
    if pair in active:
        return True
    active.add(pair)
    try:
        return _containers_equal(a, b, active)
    finally:
        active.discard(pair)


def _containers_equal(a: Any, b: Any, active: set[tuple[int, int]]) -> bool:
    if isinstance(a, np.ndarray):  # an object array (plain dtypes returned earlier)
        if not isinstance(b, np.ndarray) or a.dtype != b.dtype or a.shape != b.shape:
            return False
        return all(deep_equal(x, y, active) for x, y in zip(a.flat, b.flat))
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(deep_equal(x, y, active) for x, y in zip(a, b))
    return isinstance(b, dict) and a.keys() == b.keys() and all(deep_equal(a[k], b[k], active) for k in a)


def list_of_dict_to_dict_of_list(list_of_dict: list[dict]) -> dict[str, list]:
    """Turn ``[{"a": 1, "b": 2}, {"a": 3, "b": 4}]`` into ``{"a": [1, 3], "b": [2, 4]}``.

    The keys of the first dict decide the output keys.

    Raises:
        ValidationError: when a later dict has a key the first one lacks.
    """
    if not list_of_dict:
        return {}
    output: dict[str, list] = {key: [] for key in list_of_dict[0]}
    for i, item in enumerate(list_of_dict):
        for key, value in item.items():
            if key not in output:
                raise ValidationError(
                    f"list_of_dict_to_dict_of_list: dict {i} has key {key!r}, which dict 0 lacks "
                    f"(its keys: {sorted(output)}); all dicts must share the first one's keys."
                )
            output[key].append(value)
    return output


# ---------------------------------------------------------------------------------------------- merging


def union_tensor_dict(tensor_dict1: TensorDict | None, tensor_dict2: TensorDict | None) -> TensorDict | None:
    """Add the keys of ``tensor_dict2`` to ``tensor_dict1`` in place and return ``tensor_dict1``.

    A key present in both must hold equal tensors (same shape, dtype and values; copies are fine). ``None`` on
    either side stands for "no tensors": the other argument is returned.

    Raises:
        ValidationError: when the batch sizes differ, or a shared key holds different tensors (the key is named).
    """
    if tensor_dict2 is None:
        return tensor_dict1
    if tensor_dict1 is None:
        return tensor_dict2
    if tensor_dict1.batch_size != tensor_dict2.batch_size:
        raise ValidationError(
            f"union conflict: the TensorDicts have batch sizes {list(tensor_dict1.batch_size)} and "
            f"{list(tensor_dict2.batch_size)}; they must be identical."
        )
    for key in tensor_dict2.keys():
        value = tensor_dict2.get(key)
        if key not in tensor_dict1.keys():
            tensor_dict1[key] = value
        elif not deep_equal(tensor_dict1.get(key), value):
            raise ValidationError(
                f"union conflict: batch key `{key}` holds different tensors in the two TensorDicts (shape, dtype or "
                "values); equal tensors are required. Rename or drop one of them first."
            )
    return tensor_dict1


def union_numpy_dict(
    tensor_dict1: dict[str, np.ndarray], tensor_dict2: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Add the arrays of ``tensor_dict2`` to ``tensor_dict1`` in place and return ``tensor_dict1``.

    A key present in both must hold equal arrays: same dtype and shape, equal elements, NaN counting as equal to
    NaN (object arrays are compared element by element, nested arrays and reference cycles included).

    Raises:
        ValidationError: when a value is not a numpy array, or a shared key holds different arrays (the key is
            named).
    """
    for key, value in tensor_dict2.items():
        if not isinstance(value, np.ndarray):
            raise ValidationError(
                f"union_numpy_dict: value for {key!r} is a {type(value).__name__}, not a numpy array."
            )
        if key in tensor_dict1:
            mine = tensor_dict1[key]
            if not isinstance(mine, np.ndarray):
                raise ValidationError(
                    f"union_numpy_dict: value for {key!r} is a {type(mine).__name__}, not a numpy array."
                )
            if not deep_equal(mine, value):
                # the sentence in backticks is verl's message, which code written against verl may match
                raise ValidationError(
                    f"union conflict: `{key}` in tensor_dict1 and tensor_dict2 are not the same object. The "
                    f"non_tensor_batch arrays differ (dtype {mine.dtype} vs {value.dtype}, shape {mine.shape} vs "
                    f"{value.shape}, or the values); equal arrays are required. Rename or drop one of them first."
                )
        tensor_dict1[key] = value
    return tensor_dict1


def union_meta_info(meta1: dict[str, Any], meta2: Mapping[str, Any]) -> dict[str, Any]:
    """Add ``meta2`` to ``meta1`` in place; a key in both must hold equal values."""
    for key, value in meta2.items():
        if key in meta1 and not deep_equal(meta1[key], value):
            raise ValidationError(
                f"union conflict: meta_info key {key!r} is {meta1[key]!r} in one DataProto and {value!r} in the other."
            )
        meta1[key] = value
    return meta1


def concat_meta_info(metas: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The meta_info of a concatenation: shared keys must agree; every part's ``metrics`` are gathered.

    ``metrics`` (a dict, or a list of dicts, per part, e.g. one per worker) become one dict of lists,
    ``{"loss": [loss_part0, loss_part1, ...]}``; parts without metrics add nothing.
    """
    meta: dict[str, Any] = {}
    metrics: list[dict] = []
    for i, part in enumerate(metas):
        for key, value in part.items():
            if key == "metrics":
                if value is not None:
                    metrics.extend(value if isinstance(value, list) else [value])
            elif key in meta and not deep_equal(meta[key], value):
                raise ValidationError(
                    f"DataProto.concat: Conflicting values for meta_info key {key!r}: {meta[key]!r} in an earlier "
                    f"part, {value!r} in part {i}. Parts must agree on meta_info; per-part values belong in 'metrics'."
                )
            else:
                meta[key] = value
    if metrics:
        meta["metrics"] = list_of_dict_to_dict_of_list(metrics)
    return meta


# ---------------------------------------------------------------------------------------------- padding


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Pad ``data`` to a multiple of ``size_divisor`` rows by appending copies of its first rows.

    Rows are taken cyclically from the start, so a batch shorter than the padding still works: 3 rows padded to a
    multiple of 7 become rows ``0 1 2 0 1 2 0``.

    Returns:
        ``(padded, pad_size)`` where ``len(padded) == len(data) + pad_size`` and ``pad_size < size_divisor``;
        ``data`` itself when no padding is needed.

    Raises:
        ValidationError: when ``size_divisor`` is not positive, or padding is needed but ``data`` is empty.
    """
    if size_divisor <= 0:
        raise ValidationError(f"size_divisor must be a positive integer, got {size_divisor}.")
    length = len(data)
    pad_size = (size_divisor - length % size_divisor) % size_divisor
    if pad_size == 0:
        return data, 0
    if length == 0:
        raise ValidationError("Cannot pad an empty DataProto: there are no rows to repeat.")
    padding = data[np.arange(pad_size, dtype=np.int64) % length]
    return type(data).concat([data, padding]), pad_size


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Drop the last ``pad_size`` rows added by :func:`pad_dataproto_to_divisor` (``data`` itself for 0)."""
    if pad_size < 0 or pad_size > len(data):
        raise ValidationError(f"pad_size must be in [0, {len(data)}], got {pad_size}.")
    if pad_size == 0:
        return data
    return data.slice(0, len(data) - pad_size)


# ---------------------------------------------------------------------------------------------- fold / unfold


def fold_batch_dim(data: DataProto, new_batch_size: int) -> DataProto:
    """Group the ``B`` rows into ``new_batch_size`` rows of ``B // new_batch_size`` consecutive old rows each.

    Every tensor (B, ...) becomes (new_batch_size, B // new_batch_size, ...), every non-tensor array likewise;
    row ``i`` of the result holds old rows ``i * k .. i * k + k - 1`` with ``k = B // new_batch_size``. The input
    is left unchanged; meta_info is shallow-copied. :func:`unfold_batch_dim` undoes it.

    Raises:
        ValidationError: when ``new_batch_size`` is not a positive divisor of ``len(data)``.
    """
    length = len(data)
    if new_batch_size <= 0 or length % new_batch_size != 0:
        raise ValidationError(
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
        ValidationError: when ``batch_dims < 1`` or the values disagree on their first ``batch_dims`` sizes.
    """
    if batch_dims < 1:
        raise ValidationError(f"unfold_batch_dim: batch_dims must be >= 1, got {batch_dims}.")
    leading: dict[str, tuple[int, ...]] = {}
    values: list[tuple[str, Any]] = list(data.batch.items()) if data.batch is not None else []
    values += list(data.non_tensor_batch.items())
    for key, value in values:
        if value.ndim < batch_dims:
            raise ValidationError(
                f"unfold_batch_dim: {key!r} has shape {tuple(value.shape)}, fewer than {batch_dims} dims."
            )
        leading[key] = tuple(value.shape[:batch_dims])
    if len(set(leading.values())) > 1:
        raise ValidationError(f"unfold_batch_dim: the leading {batch_dims} dims differ between keys: {leading}.")
    rows = math.prod(next(iter(leading.values()))) if leading else 0
    batch = None
    if data.batch is not None:
        tensors = {key: value.reshape(rows, *value.shape[batch_dims:]) for key, value in data.batch.items()}
        batch = TensorDict(tensors, batch_size=[rows], device=data.batch.device)
    non_tensor = {
        key: np.reshape(value, (rows, *value.shape[batch_dims:])) for key, value in data.non_tensor_batch.items()
    }
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(data.meta_info))


def split_columns(key: str, value: Any, n_split: int) -> Any:
    """Cut a (B, C, ...) tensor or array into (B * n_split, C // n_split, ...): row i's column chunk j becomes row
    ``i * n_split + j``. Used by :meth:`DataProto.unfold_column_chunks`."""
    if value.ndim < 2 or value.shape[1] % n_split != 0:
        raise ValidationError(
            f"unfold_column_chunks: {key!r} has shape {tuple(value.shape)}; a split key needs a second dimension "
            f"divisible by n_split={n_split}. Leave it out of split_keys to repeat it instead."
        )
    return value.reshape(value.shape[0] * n_split, value.shape[1] // n_split, *value.shape[2:])


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
        ValidationError: when the triple is malformed or names an unknown dtype.
    """
    if not isinstance(arr, (tuple, list)) or len(arr) != 3:
        raise ValidationError(f"deserialize_single_tensor expects (dtype, shape, data), got {type(arr).__name__}.")
    dtype_name, shape, data = arr
    torch_dtype = getattr(torch, str(dtype_name), None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ValidationError(f"deserialize_single_tensor: {dtype_name!r} is not a torch dtype name (e.g. 'float32').")
    buffer = bytearray(data)
    if not buffer:  # torch.frombuffer rejects empty buffers
        return torch.empty(tuple(shape), dtype=torch_dtype)
    return torch.frombuffer(buffer, dtype=torch.uint8).view(torch_dtype).view(tuple(shape))


def serialize_tensordict(batch: TensorDict) -> tuple[tuple[int, ...], str | None, dict[str, tuple]]:
    """Encode a TensorDict of CPU tensors as ``(batch_size, device, {key: encoding})``.

    A dense tensor's encoding is :func:`serialize_single_tensor`'s triple; a nested (jagged) tensor's is the pair
    ``(layout name, [triple of each component])``.

    Raises:
        ValidationError: when a value is not a tensor (e.g. non-tensor data or a nested TensorDict).
    """
    encoded: dict[str, tuple] = {}
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor):
            raise ValidationError(
                f"serialize_tensordict: {key!r} is a {type(value).__name__}; only tensors can be encoded."
            )
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
        ValidationError: when an encoding is neither a dense triple nor a nested ``(layout, parts)`` pair.
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
            raise ValidationError(
                f"deserialize_tensordict: encoding of {key!r} has {len(value)} fields; expected 3 (dense tensor) "
                "or 2 (nested tensor)."
            )
    return TensorDict(decoded, batch_size=list(batch_size), device=device)
