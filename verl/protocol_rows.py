"""Row arithmetic behind DataProto's rearrangements, and verl's auto-padding switch.

The functions here work on the parts of a batch (a ``TensorDict`` or None, and a dict of numpy arrays) or on row
counts, and return parts, row-id arrays or ``(start, end)`` bounds; :class:`verl.protocol.DataProto`'s methods
(``chunk``, ``split``, ``concat``, ``repeat``, ``sample_level_repeat``, ``unfold_column_chunks``, ``reorder``,
``padding``) call them and wrap the result, so this module never imports DataProto. Every function moves the
tensors and the non-tensor arrays together. :class:`DataProtoConfig` is verl's process-wide auto-padding switch,
which lets ``chunk`` split into parts one row apart.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from verl.protocol_ops import as_key_list, as_non_tensor_array, check_keys_exist, concat_meta_info, split_columns
from verl.utils.errors import ValidationError

__all__ = [
    "DataProtoConfig",
    "check_part_lengths",
    "chunk_bounds",
    "concat_parts",
    "pad_to_divisor_rows",
    "padding_rows",
    "parts_from_dicts",
    "split_single_dict",
    "repeat_rows",
    "sample_repeat_rows",
    "take_rows",
    "unfold_column_parts",
]

# the environment variable that turns auto padding on for every DataProto in the process, as in verl
_AUTO_PADDING_ENV = "VERL_AUTO_PADDING"

Parts = tuple[TensorDict | None, dict[str, np.ndarray]]


class _DataProtoConfigMeta(type):
    @property
    def auto_padding(cls) -> bool:
        from_env = os.getenv(_AUTO_PADDING_ENV, "FALSE").upper() in ("TRUE", "1")
        return from_env or cls._auto_padding

    @auto_padding.setter
    def auto_padding(cls, enabled: bool) -> None:
        if not isinstance(enabled, bool):
            raise ValidationError(f"DataProtoConfig.auto_padding must be True or False, got {enabled!r}.")
        cls._auto_padding = enabled


class DataProtoConfig(metaclass=_DataProtoConfigMeta):
    """Process-wide DataProto settings, as in verl.

    ``DataProtoConfig.auto_padding = True`` (or the environment variable ``VERL_AUTO_PADDING=1``/``TRUE``) lets
    every DataProto :meth:`~verl.protocol.DataProto.chunk` into unequal parts; ``auto_padding_key`` is the
    meta_info key that turns it on for one DataProto (set by ``DataProto.from_dict(..., auto_padding=True)``).
    """

    auto_padding_key = "_verl_auto_padding"
    _auto_padding = False


def take_rows(batch: TensorDict | None, non_tensor: Mapping[str, np.ndarray], index: np.ndarray | slice) -> Parts:
    """The rows ``index`` (1-D int64 row ids or a slice) of both parts."""
    if batch is not None:
        batch = batch[index] if isinstance(index, slice) else batch[torch.from_numpy(index)]
    return batch, {key: value[index] for key, value in non_tensor.items()}


def padding_rows(num_rows: int, padding_size: int, padding_candidate: str) -> np.ndarray:
    """Row ids to append for ``padding(padding_size, padding_candidate)``: copies of the first or last row.

    Raises:
        ValidationError: for a negative size, another candidate name, or padding an empty batch.
    """
    if padding_size < 0 or padding_candidate not in ("", "first", "last"):
        raise ValidationError(
            f"padding(padding_size={padding_size}, padding_candidate={padding_candidate!r}): the size must be "
            "a non-negative integer and the candidate 'first' or 'last' (or '' for the last row)."
        )
    if padding_size and num_rows == 0:
        raise ValidationError("Cannot pad an empty DataProto: there is no row to repeat.")
    row = 0 if padding_candidate == "first" else num_rows - 1
    return np.full(padding_size, row, dtype=np.int64)


def chunk_bounds(num_rows: int, chunks: int, allow_unequal: bool) -> list[tuple[int, int]]:
    """``(start, end)`` of ``chunks`` consecutive parts: equal, or (``allow_unequal``) one row apart, the longer
    ones first (7 rows in 3 parts: 3, 2, 2).

    Raises:
        ValidationError: when ``chunks`` is not positive, or does not divide ``num_rows`` and unequal parts are not
            allowed.
    """
    if chunks <= 0:
        raise ValidationError(f"chunk: chunks must be a positive integer, got {chunks}.")
    if num_rows % chunks != 0 and not allow_unequal:
        raise ValidationError(
            f"chunk({chunks}): the DataProto has {num_rows} rows, which is not divisible into {chunks} equal "
            "chunks. Pad it first with pad_dataproto_to_divisor, pick a divisor of the length, or enable auto "
            "padding (DataProto.from_dict(..., auto_padding=True)) to accept parts one row apart."
        )
    size, num_longer = divmod(num_rows, chunks)
    bounds = np.cumsum([0] + [size + (i < num_longer) for i in range(chunks)])
    return [(int(bounds[i]), int(bounds[i + 1])) for i in range(chunks)]


def concat_parts(
    batches: Sequence[TensorDict | None], non_tensors: Sequence[Mapping[str, np.ndarray]], metas: Sequence[Mapping]
) -> tuple[TensorDict | None, dict[str, np.ndarray], dict[str, Any]]:
    """The parts of a row-wise concatenation; meta_info merged by :func:`~verl.protocol_ops.concat_meta_info`.

    Raises:
        ValidationError: for no parts at all, or parts whose tensor / non-tensor keys differ.
    """
    if not batches:
        raise ValidationError("DataProto.concat needs at least one DataProto, got an empty list.")
    first_keys = set(batches[0].keys()) if batches[0] is not None else None
    for i, (batch, non_tensor) in enumerate(zip(batches[1:], non_tensors[1:]), start=1):
        part_keys = set(batch.keys()) if batch is not None else None
        if first_keys != part_keys or set(non_tensors[0]) != set(non_tensor):
            raise ValidationError(
                f"DataProto.concat: part {i} has keys batch={part_keys}, non_tensor={sorted(non_tensor)}"
                f" but part 0 has batch={first_keys}, non_tensor={sorted(non_tensors[0])}."
            )
    batch = torch.cat(list(batches), dim=0) if batches[0] is not None else None
    non_tensor = {key: np.concatenate([part[key] for part in non_tensors], axis=0) for key in non_tensors[0]}
    return batch, non_tensor, concat_meta_info(metas)


def repeat_rows(num_rows: int, repeat_times: int, interleave: bool) -> np.ndarray:
    """Row ids repeating every row ``repeat_times`` times: interleaved ``[a, a, b, b]`` or tiled ``[a, b, a, b]``."""
    if repeat_times <= 0:
        raise ValidationError(f"repeat_times must be a positive integer, got {repeat_times}.")
    rows = np.arange(num_rows, dtype=np.int64)
    return np.repeat(rows, repeat_times) if interleave else np.tile(rows, repeat_times)


def sample_repeat_rows(num_rows: int, repeat_times: Sequence[int] | np.ndarray | torch.Tensor) -> np.ndarray:
    """Row ids repeating row ``i`` ``repeat_times[i]`` times, in order (``[2, 0, 1]`` gives ``[0, 0, 2]``).

    Raises:
        ValidationError: when ``repeat_times`` is not ``num_rows`` non-negative integers.
    """
    if isinstance(repeat_times, torch.Tensor):
        repeat_times = repeat_times.detach().cpu().numpy()
    counts = np.asarray(repeat_times)
    valid = counts.ndim == 1 and len(counts) == num_rows
    if valid and counts.size:
        valid = np.issubdtype(counts.dtype, np.integer) and bool((counts >= 0).all())
    if not valid:
        raise ValidationError(
            f"sample_level_repeat: repeat_times must hold one non-negative integer per row ({num_rows}), got "
            f"{counts.tolist()!r:.120}."
        )
    return np.repeat(np.arange(num_rows, dtype=np.int64), counts.astype(np.int64))


def unfold_column_parts(
    batch: TensorDict | None, non_tensor: Mapping[str, np.ndarray], n_split: int, split_keys: Sequence[str] | None
) -> Parts:
    """The parts of ``unfold_column_chunks``: split keys (B, C, ...) -> (B * n_split, C // n_split, ...), row ``i``'s
    column chunk ``j`` landing in row ``i * n_split + j``; every other value repeated ``n_split`` times, interleaved.

    Raises:
        ValidationError: for ``n_split < 1``, an unknown split key, or a split key whose dim 1 is missing or not
            divisible by ``n_split``.
    """
    if n_split < 1:
        raise ValidationError(f"unfold_column_chunks: n_split must be a positive integer, got {n_split}.")
    keys = as_key_list(split_keys)
    tensor_keys = list(batch.keys()) if batch is not None else []
    check_keys_exist("batch or non_tensor_batch", keys, tensor_keys + list(non_tensor))
    num_rows = int(batch.batch_size[0]) if batch is not None else len(next(iter(non_tensor.values()), []))
    unfolded = None
    if batch is not None:
        tensors = {
            key: split_columns(key, value, n_split) if key in keys else value.repeat_interleave(n_split, dim=0)
            for key, value in batch.items()
        }
        unfolded = TensorDict(tensors, batch_size=[num_rows * n_split], device=batch.device)
    arrays = {
        key: split_columns(key, value, n_split) if key in keys else np.repeat(value, n_split, axis=0)
        for key, value in non_tensor.items()
    }
    return unfolded, arrays


def check_part_lengths(batch: TensorDict | None, non_tensor: Mapping[str, Any]) -> None:
    """Check that every tensor and non-tensor array of a batch has the same number of rows.

    Raises:
        ValidationError: when the batch is not 1-D, a non-tensor value is not a numpy array, or lengths differ.
    """
    lengths: dict[str, int] = {}
    if batch is not None:
        if len(batch.batch_size) != 1:
            shape = list(batch.batch_size)
            raise ValidationError(f"DataProto.batch must have exactly one batch dimension, got batch_size={shape}.")
        lengths["batch"] = int(batch.batch_size[0])
    for key, value in non_tensor.items():
        if not isinstance(value, np.ndarray):
            raise ValidationError(
                f"non_tensor_batch[{key!r}] must be a numpy array, got {type(value).__name__}; "
                "wrap lists with DataProto.from_dict / from_single_dict, which convert them to object arrays."
            )
        if value.ndim == 0:
            raise ValidationError(f"non_tensor_batch[{key!r}] is a 0-d array; it needs one entry per row.")
        lengths[key] = len(value)
    if len(set(lengths.values())) > 1:
        raise ValidationError(
            f"DataProto parts have different numbers of rows: {lengths}. "
            "Every tensor and non-tensor array must have the same length along dim 0."
        )


def parts_from_dicts(tensors: Mapping[str, torch.Tensor] | None, non_tensors: Any, num_batch_dims: int = 1) -> Parts:
    """The parts of ``DataProto.from_dict``: a TensorDict of the tensors (each (B, ...)), and the non-tensors with
    lists and tuples converted as verl converts them (:func:`~verl.protocol_ops.as_non_tensor_array`).

    Raises:
        ValidationError: when ``num_batch_dims != 1`` (a DataProto has one batch dimension), ``non_tensors`` is not
            a mapping, a tensor has no row dimension, or the tensors disagree on B.
    """
    if num_batch_dims != 1:
        raise ValidationError(
            f"from_dict: num_batch_dims={num_batch_dims} is not supported; a DataProto has exactly one batch "
            "dimension. Build it with num_batch_dims=1 and use fold_batch_dim to group rows."
        )
    if non_tensors is not None and not isinstance(non_tensors, Mapping):
        raise ValidationError(f"from_dict: non_tensors must be a dict, got {type(non_tensors).__name__}.")
    tensors = dict(tensors or {})
    batch = None
    if tensors:
        for key, value in tensors.items():
            if not isinstance(value, torch.Tensor) or value.dim() == 0:
                raise ValidationError(f"tensors[{key!r}] must be a tensor with a row dimension, got {value!r:.80}.")
        sizes = {key: int(value.shape[0]) for key, value in tensors.items()}
        if len(set(sizes.values())) > 1:
            raise ValidationError(f"Tensors have different numbers of rows (dim 0): {sizes}; they must all match.")
        batch = TensorDict(tensors, batch_size=[next(iter(sizes.values()))])
    converted = {
        key: as_non_tensor_array(value) if isinstance(value, (list, tuple)) else value
        for key, value in (non_tensors or {}).items()
    }
    return batch, converted


def split_single_dict(data: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``DataProto.from_single_dict``'s split of one dict into tensors and non-tensors (arrays, lists, tuples).

    Raises:
        ValidationError: for a value that is neither a tensor, a numpy array nor a list/tuple.
    """
    tensors, non_tensors = {}, {}
    for key, value in data.items():
        if isinstance(value, torch.Tensor):
            tensors[key] = value
        elif isinstance(value, (np.ndarray, list, tuple)):
            non_tensors[key] = value
        else:
            raise ValidationError(
                f"from_single_dict: value for {key!r} has type {type(value).__name__}; accepted are "
                "torch.Tensor, np.ndarray, list and tuple. Put batch-wide scalars into meta_info instead."
            )
    return tensors, non_tensors


def pad_to_divisor_rows(num_rows: int, size_divisor: int) -> np.ndarray:
    """Row ids to append so that ``num_rows`` becomes a multiple of ``size_divisor``: the first rows, cyclically
    (3 rows to a multiple of 7: ``0 1 2 0``); empty when no padding is needed.

    Raises:
        ValidationError: when ``size_divisor`` is not positive, or padding is needed but there are no rows.
    """
    if size_divisor <= 0:
        raise ValidationError(f"size_divisor must be a positive integer, got {size_divisor}.")
    pad_size = (size_divisor - num_rows % size_divisor) % size_divisor
    if pad_size and num_rows == 0:
        raise ValidationError("Cannot pad an empty DataProto: there are no rows to repeat.")
    return np.arange(pad_size, dtype=np.int64) % max(num_rows, 1)
