"""Functions on the parts of a DataProto: selecting, renaming, merging, comparing and folding.

:mod:`verl.protocol` re-exports the public ones under verl's names, so ``from verl.protocol import
union_numpy_dict`` works as in verl; import them from there. They take and return tensors, numpy arrays,
TensorDicts and dicts, never a DataProto (this module never imports it): the functions verl offers on a whole
DataProto (``pad_dataproto_to_divisor``, ``fold_batch_dim``, ...) live in :mod:`verl.protocol` and call these. Bad
input raises :class:`verl.utils.errors.ValidationError` (a ``ValueError`` that is also an
``AssertionError``, for code written against verl's asserts).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from verl.utils.errors import ValidationError

__all__ = [
    "fold_parts",
    "list_of_dict_to_dict_of_list",
    "rename_keys",
    "select_parts",
    "unfold_parts",
    "union_numpy_dict",
    "union_parts",
    "union_tensor_dict",
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


# ---------------------------------------------------------------------------------------------- fold / unfold


def fold_parts(
    batch: TensorDict | None, non_tensor: Mapping[str, np.ndarray], new_batch_size: int
) -> tuple[TensorDict | None, dict[str, np.ndarray]]:
    """Group ``B`` rows into ``new_batch_size`` rows of ``k = B // new_batch_size`` consecutive old rows each.

    Every tensor (B, ...) becomes (new_batch_size, k, ...), every non-tensor array likewise; the inputs are left
    unchanged. :func:`unfold_parts` undoes it.

    Raises:
        ValidationError: when ``new_batch_size`` is not a positive divisor of ``B``.
    """
    length = int(batch.batch_size[0]) if batch is not None else len(next(iter(non_tensor.values()), []))
    if new_batch_size <= 0 or length % new_batch_size != 0:
        raise ValidationError(
            f"fold_batch_dim: new_batch_size={new_batch_size} must be a positive divisor of the {length} rows."
        )
    folded = None
    if batch is not None:
        tensors = {
            key: value.reshape(new_batch_size, length // new_batch_size, *value.shape[1:])
            for key, value in batch.items()
        }
        folded = TensorDict(tensors, batch_size=[new_batch_size], device=batch.device)
    arrays = {
        key: np.reshape(value, (new_batch_size, length // new_batch_size, *value.shape[1:]))
        for key, value in non_tensor.items()
    }
    return folded, arrays


def unfold_parts(
    batch: TensorDict | None, non_tensor: Mapping[str, np.ndarray], batch_dims: int = 2
) -> tuple[TensorDict | None, dict[str, np.ndarray]]:
    """Merge the first ``batch_dims`` dimensions of every tensor and array into one row dimension (row-major).

    A tensor (N, K, ...) becomes (N * K, ...) for ``batch_dims=2``, so ``unfold_parts(*fold_parts(b, a, n))`` gives
    the parts back. The inputs are left unchanged.

    Raises:
        ValidationError: when ``batch_dims < 1`` or the values disagree on their first ``batch_dims`` sizes.
    """
    if batch_dims < 1:
        raise ValidationError(f"unfold_batch_dim: batch_dims must be >= 1, got {batch_dims}.")
    leading: dict[str, tuple[int, ...]] = {}
    values: list[tuple[str, Any]] = list(batch.items()) if batch is not None else []
    values += list(non_tensor.items())
    for key, value in values:
        if value.ndim < batch_dims:
            raise ValidationError(
                f"unfold_batch_dim: {key!r} has shape {tuple(value.shape)}, fewer than {batch_dims} dims."
            )
        leading[key] = tuple(value.shape[:batch_dims])
    if len(set(leading.values())) > 1:
        raise ValidationError(f"unfold_batch_dim: the leading {batch_dims} dims differ between keys: {leading}.")
    rows = math.prod(next(iter(leading.values()))) if leading else 0
    unfolded = None
    if batch is not None:
        tensors = {key: value.reshape(rows, *value.shape[batch_dims:]) for key, value in batch.items()}
        unfolded = TensorDict(tensors, batch_size=[rows], device=batch.device)
    arrays = {key: np.reshape(value, (rows, *value.shape[batch_dims:])) for key, value in non_tensor.items()}
    return unfolded, arrays


def split_columns(key: str, value: Any, n_split: int) -> Any:
    """Cut a (B, C, ...) tensor or array into (B * n_split, C // n_split, ...): row i's column chunk j becomes row
    ``i * n_split + j``. Used by :meth:`DataProto.unfold_column_chunks`."""
    if value.ndim < 2 or value.shape[1] % n_split != 0:
        raise ValidationError(
            f"unfold_column_chunks: {key!r} has shape {tuple(value.shape)}; a split key needs a second dimension "
            f"divisible by n_split={n_split}. Leave it out of split_keys to repeat it instead."
        )
    return value.reshape(value.shape[0] * n_split, value.shape[1] // n_split, *value.shape[2:])


def rename_keys(batch: TensorDict | None, non_tensor: dict[str, Any], old: list[str], new: list[str]) -> None:
    """Rename tensor or non-tensor keys ``old[i]`` to ``new[i]``, in place.

    Raises:
        ValidationError: when the key lists differ in length, an old key is missing, or a new key is taken.
    """
    if len(old) != len(new):
        raise ValidationError(f"rename needs as many new keys as old keys, got {old} -> {new}.")
    batch_keys = list(batch.keys()) if batch is not None else []
    check_keys_exist("batch or non_tensor_batch", old, batch_keys + list(non_tensor))
    for old_key, new_key in zip(old, new):
        if old_key == new_key:
            continue
        if new_key in batch_keys or new_key in non_tensor:
            raise ValidationError(f"Cannot rename {old_key!r} to {new_key!r}: {new_key!r} already exists.")
        if old_key in batch_keys:
            batch.rename_key_(old_key, new_key)
            batch_keys = list(batch.keys())
        else:
            non_tensor[new_key] = non_tensor.pop(old_key)


def select_parts(
    batch: TensorDict | None,
    non_tensor: Mapping[str, np.ndarray],
    meta_info: Mapping[str, Any],
    batch_keys: str | Iterable[str] | None,
    non_tensor_keys: str | Iterable[str] | None,
    meta_keys: str | Iterable[str] | None,
) -> tuple[TensorDict | None, dict[str, np.ndarray], dict[str, Any]]:
    """The named keys of each part (None keeps the whole part); tensors are shared, not copied.

    As in verl, ``non_tensor_keys`` and ``meta_keys`` act as filters: names that are absent are skipped.

    Raises:
        ValidationError: naming any batch (tensor) key that does not exist, with the available keys.
    """
    if batch_keys is not None:
        keys = as_key_list(batch_keys)
        check_keys_exist("batch", keys, batch.keys() if batch is not None else [])
        if batch is not None:
            batch = batch.select(*keys)
    arrays = dict(non_tensor)
    if non_tensor_keys is not None:
        wanted = set(as_key_list(non_tensor_keys))
        arrays = {key: value for key, value in arrays.items() if key in wanted}
    meta = dict(meta_info)
    if meta_keys is not None:
        wanted = set(as_key_list(meta_keys))
        meta = {key: value for key, value in meta.items() if key in wanted}
    return batch, arrays, meta


def union_parts(
    mine: tuple[TensorDict | None, Mapping[str, np.ndarray], Mapping[str, Any]],
    other: tuple[TensorDict | None, Mapping[str, np.ndarray], Mapping[str, Any]],
) -> tuple[TensorDict | None, dict[str, np.ndarray], dict[str, Any]]:
    """Merged copies of two batches' parts ``(batch, non_tensor_batch, meta_info)``; neither input changes.

    The merged batch is None when either side has no tensors. Keys in both must hold equal values.

    Raises:
        ValidationError: when a key present in both holds different values (the key is named).
    """
    merged_batch = None
    if mine[0] is not None and other[0] is not None:
        merged_batch = union_tensor_dict(mine[0].copy(), other[0])
    non_tensor = union_numpy_dict(dict(mine[1]), other[1])
    meta = union_meta_info(dict(mine[2]), other[2])
    return merged_batch, non_tensor, meta
