"""Helpers for TensorDicts that carry non-tensor data next to their tensors.

A ``tensordict.TensorDict`` stores Python objects in two wrappers: ``NonTensorStack`` holds one object per row (a
column of strings, lists, dicts, ...) and follows the rows through indexing and concatenation, while
``NonTensorData`` holds one object for the whole batch. :meth:`verl.protocol.DataProto.to_tensordict` and
:meth:`~verl.protocol.DataProto.from_tensordict` map ``non_tensor_batch`` onto the first and ``meta_info`` onto the
second; the functions here build such TensorDicts and read plain Python values back out of them, and move rows
between them (select, concatenate, split, pad) keeping jagged nested tensors (one variable-length row each) whole,
which TensorDict's own ``cat``/``chunk`` do not handle. These are verl's names, for code that imports them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDict
from tensordict.tensorclass import NonTensorData, NonTensorStack

__all__ = [
    "TensorDictConflict",
    "assert_tensordict_eq",
    "assign_non_tensor",
    "assign_non_tensor_data",
    "assign_non_tensor_stack",
    "chunk_tensordict",
    "concat_nested_tensors",
    "concat_tensordict",
    "contiguous",
    "get",
    "get_keys",
    "get_non_tensor_data",
    "get_tensordict",
    "index_select_tensor_dict",
    "list_of_dict_to_tensordict",
    "make_iterator",
    "nested_tensor_from_tensor_list",
    "pad_to_divisor",
    "pop",
    "pop_keys",
    "union_tensor_dict",
    "unpad",
    "unwrap_non_tensor_data",
]


def _require_tensordict(tensor_dict: Any) -> None:
    if not isinstance(tensor_dict, TensorDict):
        raise ValueError(f"Expected a tensordict.TensorDict, got {type(tensor_dict).__name__}.")


def _to_stack(values: Sequence[Any]) -> NonTensorStack:
    # wrapping every element on its own keeps nested lists and dicts whole instead of letting tensordict try to
    # stack them into tensors or nested TensorDicts
    return NonTensorStack.from_list([NonTensorData(value) for value in values])


def assign_non_tensor_data(tensor_dict: TensorDict, key: str, val: Any) -> None:
    """Store ``val`` under ``key`` as one batch-wide value (``NonTensorData``).

    Raises:
        ValueError: when ``tensor_dict`` is not a TensorDict.
    """
    _require_tensordict(tensor_dict)
    tensor_dict[key] = NonTensorData(val)


def assign_non_tensor_stack(tensor_dict: TensorDict, key: str, val: Sequence[Any]) -> None:
    """Store the list ``val`` under ``key`` as one object per row (``NonTensorStack``).

    Elements may be any Python object, including lists and dicts (e.g. ``[[], [0.5, 0.8], [0.9]]``).

    Raises:
        ValueError: when ``tensor_dict`` is not a TensorDict.
    """
    _require_tensordict(tensor_dict)
    tensor_dict[key] = _to_stack(list(val))


def assign_non_tensor(tensor_dict: TensorDict, **kwargs: Any) -> TensorDict:
    """Store each keyword argument: lists per row (stack), anything else batch-wide; returns ``tensor_dict``.

    Values that already are ``NonTensorData`` / ``NonTensorStack`` are stored as they are.

    Raises:
        ValueError: when ``tensor_dict`` is not a TensorDict.
    """
    _require_tensordict(tensor_dict)
    for key, val in kwargs.items():
        if isinstance(val, (NonTensorData, NonTensorStack)):
            tensor_dict[key] = val
        elif isinstance(val, list):
            assign_non_tensor_stack(tensor_dict, key, val)
        else:
            assign_non_tensor_data(tensor_dict, key, val)
    return tensor_dict


def unwrap_non_tensor_data(data: Any) -> Any:
    """The wrapped object of a ``NonTensorData``; any other value is returned unchanged."""
    if isinstance(data, NonTensorData):
        return data.data
    return data


def get_non_tensor_data(data: TensorDict, key: str, default: Any) -> Any:
    """``data[key]`` with a ``NonTensorData`` unwrapped, or ``default`` when the key is absent."""
    return unwrap_non_tensor_data(data.get(key, default))


def get(tensordict: TensorDict, key: str, default: Any = None) -> Any:
    """Read ``key`` as a plain value: a tensor as is, a per-row stack as a list, a batch-wide value unwrapped.

    Returns ``default`` when the key is absent.
    """
    if key not in tensordict.keys():
        return default
    value = tensordict.get(key)
    if isinstance(value, NonTensorStack):
        return value.tolist()
    if isinstance(value, NonTensorData):
        return value.data
    return value


def get_tensordict(
    tensor_dict: Mapping[str, torch.Tensor | list | NonTensorStack], non_tensor_dict: Mapping[str, Any] | None = None
) -> TensorDict:
    """Build a TensorDict with batch size ``[B]`` from per-row values and batch-wide values.

    Args:
        tensor_dict: per-row values, each with ``B`` rows: tensors (B, ...) (nested tensors must be jagged and
            contiguous), Python lists of length B (stored as ``NonTensorStack``; elements may be nested lists or
            dicts but not tensors), or ready-made ``NonTensorStack`` objects.
        non_tensor_dict: batch-wide values (stored as ``NonTensorData``), e.g. a DataProto's meta_info.

    Returns:
        A TensorDict with ``batch_size=[B]``, or ``[]`` when ``tensor_dict`` is empty.

    Raises:
        ValueError: when the row counts differ, a value has an unsupported type, a list holds tensors, a nested
            tensor is not jagged and contiguous, or a batch-wide key repeats a per-row key.
    """
    source: dict[str, Any] = {}
    rows: dict[str, int] = {}
    for key, val in tensor_dict.items():
        if isinstance(val, torch.Tensor):
            if val.is_nested and (val.layout != torch.jagged or not val.is_contiguous()):
                raise ValueError(
                    f"get_tensordict: nested tensor {key!r} must use layout=torch.jagged and be contiguous, got "
                    f"layout={val.layout}; build it with torch.nested.as_nested_tensor(..., layout=torch.jagged)."
                )
            if val.dim() == 0:
                raise ValueError(f"get_tensordict: tensor {key!r} is 0-d; per-row values need a row dimension.")
            source[key], rows[key] = val, int(val.size(0))
        elif isinstance(val, NonTensorStack):
            source[key], rows[key] = val, len(val)
        elif isinstance(val, list):
            if any(isinstance(item, torch.Tensor) for item in val):
                raise ValueError(
                    f"get_tensordict: list {key!r} holds tensors; a list becomes a NonTensorStack, which cannot hold "
                    "tensors. Stack them into one tensor, or convert them to numpy first."
                )
            source[key], rows[key] = _to_stack(val), len(val)
        else:
            raise ValueError(
                f"get_tensordict: value {key!r} has type {type(val).__name__}; accepted per-row values are "
                "torch.Tensor, list and NonTensorStack. Pass batch-wide values in non_tensor_dict."
            )
    if len(set(rows.values())) > 1:
        raise ValueError(f"get_tensordict: per-row values have different numbers of rows: {rows}.")
    for key, val in (non_tensor_dict or {}).items():
        if key in source:
            raise ValueError(f"get_tensordict: key {key!r} is both a per-row value and a batch-wide value.")
        source[key] = NonTensorData(val)
    batch_size = [next(iter(rows.values()))] if rows else []
    return TensorDict(source, batch_size=batch_size)


def _plain(value: Any) -> Any:
    """A stored value as user code reads it: a tensor as is, a per-row stack as a list, a batch-wide value unwrapped."""
    if isinstance(value, NonTensorStack):
        return value.tolist()
    if isinstance(value, NonTensorData):
        return value.data
    return value


def _split_by_kind(pairs: Iterable[tuple[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per-row values (tensors, stacks as lists) and batch-wide values, ready for :func:`get_tensordict`."""
    per_row: dict[str, Any] = {}
    batch_wide: dict[str, Any] = {}
    for key, value in pairs:
        if isinstance(value, NonTensorData):
            batch_wide[key] = value.data
        else:
            per_row[key] = _plain(value)
    return per_row, batch_wide


def get_keys(tensordict: TensorDict, keys: Iterable[str]) -> TensorDict:
    """A new TensorDict of only ``keys`` (values shared, not copied).

    Raises:
        KeyError: a key that ``tensordict`` lacks.
    """
    missing = [key for key in keys if key not in tensordict.keys()]
    if missing:
        raise KeyError(f"get_keys: {missing} not in the TensorDict (its keys: {sorted(tensordict.keys())}).")
    return get_tensordict(*_split_by_kind((key, tensordict.get(key)) for key in keys))


def pop(tensordict: TensorDict, key: str, default: Any = None) -> Any:
    """Remove ``key`` and return its value as :func:`get` reads it; ``default`` when absent."""
    if key not in tensordict.keys():
        return default
    return _plain(tensordict.pop(key))


def pop_keys(tensordict: TensorDict, keys: Iterable[str]) -> TensorDict:
    """Remove ``keys`` from ``tensordict`` and return them as a new TensorDict.

    Raises:
        KeyError: a key that ``tensordict`` lacks (nothing is removed then).
    """
    keys = list(keys)
    taken = get_keys(tensordict, keys)
    for key in keys:
        tensordict.pop(key)
    return taken


def nested_tensor_from_tensor_list(tensors: Sequence[torch.Tensor], ragged_idx: int | None = None) -> torch.Tensor:
    """One jagged nested tensor whose rows are ``tensors``.

    The rows may differ in length along one dimension, the ragged one: ``ragged_idx`` counts the row dimension as
    0, so 1 is a row's first dimension (default: a row's last dimension).

    Raises:
        ValueError: no tensors, or ``ragged_idx`` outside ``1..row dims``.
    """
    if not tensors:
        raise ValueError("nested_tensor_from_tensor_list needs at least one tensor.")
    row_dims = tensors[0].dim()
    ragged_idx = row_dims if ragged_idx is None else ragged_idx
    if not 1 <= ragged_idx <= row_dims:
        raise ValueError(f"ragged_idx={ragged_idx} must be between 1 and the rows' dimension count {row_dims}.")
    if row_dims == 1:
        return torch.nested.as_nested_tensor(list(tensors), layout=torch.jagged)
    along = ragged_idx - 1
    values = torch.cat(list(tensors), dim=along)
    lengths = torch.tensor([t.shape[along] for t in tensors], dtype=torch.long, device=values.device)
    offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    nested = torch.nested.nested_tensor_from_jagged(values=values, offsets=offsets)
    nested._ragged_idx = ragged_idx
    return nested


def _ragged_idx(nested: torch.Tensor) -> int:
    return getattr(nested, "_ragged_idx", nested.dim() - 1)


def _rows(nested: torch.Tensor) -> list[torch.Tensor]:
    """The rows of a jagged nested tensor, also for those whose ``unbind`` fails (rows of 2+ dimensions)."""
    try:
        return list(nested.unbind(0))
    except RuntimeError:
        padded = nested.to_padded_tensor(0)
        lengths = nested.offsets().diff().tolist()
        along = _ragged_idx(nested) - 1
        return [padded[row].narrow(along, 0, length) for row, length in enumerate(lengths)]


def concat_nested_tensors(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Jagged nested tensors (2+ dimensions, contiguous) as one, their rows in order.

    Raises:
        ValueError: a tensor that is not nested, not contiguous, or has fewer than 2 dimensions.
    """
    for tensor in tensors:
        if not (tensor.is_nested and tensor.is_contiguous() and tensor.dim() >= 2):
            raise ValueError("concat_nested_tensors takes contiguous jagged nested tensors of 2 or more dimensions.")
    rows = [row for tensor in tensors for row in _rows(tensor)]
    return nested_tensor_from_tensor_list(rows, ragged_idx=_ragged_idx(tensors[0]))


def _nested_keys(tensordict: TensorDict) -> set[str]:
    return {key for key, value in tensordict.items() if isinstance(value, torch.Tensor) and value.is_nested}


def _without(tensordict: TensorDict, keys: set[str]) -> TensorDict:
    kept = {key: value for key, value in tensordict.items() if key not in keys}
    return TensorDict(kept, batch_size=tensordict.batch_size, device=tensordict.device)


def concat_tensordict(data: Sequence[TensorDict]) -> TensorDict:
    """TensorDicts with the same keys as one, rows in order; batch-wide values are the first one's.

    TensorDicts without a batch dimension (batch-wide values only) give the first of them.

    Raises:
        ValueError: no TensorDicts, or ones whose nested-tensor keys differ.
    """
    if not data:
        raise ValueError("concat_tensordict needs at least one TensorDict.")
    nested = _nested_keys(data[0])
    if any(_nested_keys(td) != nested for td in data):
        raise ValueError("concat_tensordict: every TensorDict must hold the same nested-tensor keys.")
    if not nested and len(data[0].batch_size) == 0:
        return data[0]
    output = TensorDict.cat([_without(td, nested) for td in data], dim=0)
    for key, value in data[0].items():
        if isinstance(value, NonTensorData):  # newer tensordict versions stack batch-wide values; keep the first
            output.set_non_tensor(key, value.data)
    for key in nested:
        output[key] = concat_nested_tensors([td[key] for td in data])
    return output


def chunk_tensordict(td: TensorDict, chunks: int) -> list[TensorDict]:
    """``td`` split into ``chunks`` TensorDicts of equal row counts, in order (nested tensors included).

    Raises:
        ValueError: ``td`` is not a TensorDict, or its row count is not a multiple of ``chunks``.
    """
    _require_tensordict(td)
    if chunks <= 0 or len(td) % chunks != 0:
        raise ValueError(f"chunk_tensordict: {len(td)} rows do not split into {chunks} equal chunks.")
    size = len(td) // chunks
    nested = _nested_keys(td)
    parts = list(_without(td, nested).chunk(chunks=chunks))
    for key in nested:
        rows = _rows(td[key])
        for number, part in enumerate(parts):
            part[key] = nested_tensor_from_tensor_list(rows[number * size : (number + 1) * size], _ragged_idx(td[key]))
    return parts


def index_select_tensor_dict(batch: TensorDict | None, indices: torch.Tensor | Sequence[int]) -> TensorDict | None:
    """A new TensorDict of the rows at ``indices`` (1-D), in that order; batch-wide values kept; None for None.

    Raises:
        ValueError: ``indices`` is not 1-D.
    """
    indices = torch.as_tensor(indices, dtype=torch.long)
    if indices.dim() != 1:
        raise ValueError(f"index_select_tensor_dict: indices must be 1-D, got shape {tuple(indices.shape)}.")
    if batch is None:
        return None
    selected: dict[str, Any] = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.is_nested:
            rows = _rows(value)
            selected[key] = nested_tensor_from_tensor_list([rows[i] for i in indices.tolist()], _ragged_idx(value))
        elif isinstance(value, NonTensorData) or not getattr(value, "shape", None):
            selected[key] = value
        else:
            selected[key] = value[indices]
    return TensorDict(selected, batch_size=[len(indices)])


class TensorDictConflict(ValueError, AssertionError):
    """Two TensorDicts that cannot be merged; also an AssertionError, which is what verl's callers catch."""


def union_tensor_dict(tensor_dict1: TensorDict, tensor_dict2: TensorDict) -> TensorDict:
    """``tensor_dict2``'s keys added to ``tensor_dict1`` in place (and returned); a key both hold must be equal.

    Raises:
        TensorDictConflict: different batch sizes, or a shared key with different values.
    """
    if tensor_dict1.batch_size != tensor_dict2.batch_size:
        raise TensorDictConflict(
            f"union_tensor_dict: batch sizes differ ({tensor_dict1.batch_size} and {tensor_dict2.batch_size})."
        )
    for key in tensor_dict2.keys():
        value = tensor_dict2.get(key)
        if key not in tensor_dict1.keys():
            tensor_dict1[key] = value
            continue
        mine = tensor_dict1.get(key)
        same = mine.equal(value) if isinstance(value, torch.Tensor) else _plain(mine) == _plain(value)
        if not same:
            raise TensorDictConflict(f"union_tensor_dict: key {key!r} holds different values in the two TensorDicts.")
    return tensor_dict1


def make_iterator(
    tensordict: TensorDict,
    mini_batch_size: int,
    epochs: int,
    seed: int | None = None,
    dataloader_kwargs: Mapping[str, Any] | None = None,
) -> Iterator[TensorDict]:
    """Mini-batches of ``mini_batch_size`` rows, ``epochs`` times over ``tensordict``.

    ``dataloader_kwargs`` go to the ``torch.utils.data.DataLoader`` that draws the row indices (``shuffle=True``
    for a new order each epoch, seeded by ``seed``).

    Raises:
        ValueError: the row count is not a multiple of ``mini_batch_size``.
    """
    rows = tensordict.batch_size[0]
    if rows % mini_batch_size != 0:
        raise ValueError(f"make_iterator: {rows} rows do not split into mini-batches of {mini_batch_size}.")
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    loader = torch.utils.data.DataLoader(
        torch.arange(rows),
        batch_size=mini_batch_size,
        collate_fn=torch.stack,
        generator=generator,
        **dict(dataloader_kwargs or {}),
    )

    def batches() -> Iterator[TensorDict]:
        for _ in range(epochs):
            for indices in loader:
                yield index_select_tensor_dict(tensordict, indices)

    return batches()


def assert_tensordict_eq(tensordict1: TensorDict, tensordict2: TensorDict) -> None:
    """Raise AssertionError unless both hold the same keys with equal values (nested tensors row by row)."""
    keys1, keys2 = set(tensordict1.keys()), set(tensordict2.keys())
    assert keys1 == keys2, f"the TensorDicts hold different keys: {sorted(keys1 ^ keys2)}"
    for key in keys1:
        first, second = tensordict1[key], tensordict2[key]
        assert type(first) is type(second), f"{key!r}: {type(first).__name__} vs {type(second).__name__}"
        if isinstance(first, torch.Tensor) and first.is_nested:
            rows1, rows2 = _rows(first), _rows(second)
            assert len(rows1) == len(rows2), f"{key!r}: {len(rows1)} rows vs {len(rows2)}"
            assert all(torch.equal(a, b) for a, b in zip(rows1, rows2)), f"{key!r}: nested rows differ"
        elif isinstance(first, torch.Tensor):
            assert torch.equal(first, second), f"{key!r}: tensors differ"
        else:
            assert first == second, f"{key!r}: values differ"


def pad_to_divisor(data: TensorDict, size_divisor: int) -> tuple[TensorDict, int]:
    """``data`` with rows from its start repeated at its end until the row count is a multiple of ``size_divisor``,
    and the number of rows added (0: ``data`` itself)."""
    _require_tensordict(data)
    pad_size = -len(data) % size_divisor
    if pad_size == 0 or len(data) == 0:
        return data, 0
    repeats = [data[: min(len(data), pad_size - done)] for done in range(0, pad_size, len(data))]
    return torch.cat([data, *repeats]), pad_size


def unpad(data: TensorDict, pad_size: int) -> TensorDict:
    """``data`` without its last ``pad_size`` rows (what :func:`pad_to_divisor` added)."""
    return data[:-pad_size] if pad_size else data


def contiguous(data: TensorDict) -> TensorDict:
    """A new TensorDict with every tensor contiguous (per-row and batch-wide values kept as they are)."""
    per_row: dict[str, Any] = {}
    batch_wide: dict[str, Any] = {}
    for key in data.keys():
        value = data.get(key)
        if isinstance(value, NonTensorData):
            batch_wide[key] = value.data
        elif isinstance(value, NonTensorStack):
            per_row[key] = value
        else:
            per_row[key] = value.contiguous()
    return get_tensordict(per_row, batch_wide)


def list_of_dict_to_tensordict(list_of_dicts: Sequence[Mapping[str, Any]]) -> TensorDict:
    """Items with the same keys as one TensorDict: same-shape tensors stacked, tensors of different lengths as a
    jagged nested tensor, anything else one object per row.

    Raises:
        ValueError: no items.
    """
    if not list_of_dicts:
        raise ValueError("list_of_dict_to_tensordict needs at least one item.")
    columns: dict[str, Any] = {}
    for key in list_of_dicts[0]:
        values = [item[key] for item in list_of_dicts]
        if all(isinstance(v, torch.Tensor) for v in values):
            same = all(v.shape == values[0].shape for v in values)
            columns[key] = torch.stack(values) if same else torch.nested.as_nested_tensor(values, layout=torch.jagged)
        else:
            columns[key] = _to_stack(values)
    return TensorDict(columns, batch_size=[len(list_of_dicts)])
