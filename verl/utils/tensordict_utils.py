"""Helpers for TensorDicts that carry non-tensor data next to their tensors.

A ``tensordict.TensorDict`` stores Python objects in two wrappers: ``NonTensorStack`` holds one object per row (a
column of strings, lists, dicts, ...) and follows the rows through indexing and concatenation, while
``NonTensorData`` holds one object for the whole batch. :meth:`verl.protocol.DataProto.to_tensordict` and
:meth:`~verl.protocol.DataProto.from_tensordict` map ``non_tensor_batch`` onto the first and ``meta_info`` onto the
second; the functions here build such TensorDicts and read plain Python values back out of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDict
from tensordict.tensorclass import NonTensorData, NonTensorStack

__all__ = [
    "assign_non_tensor",
    "assign_non_tensor_data",
    "assign_non_tensor_stack",
    "get",
    "get_non_tensor_data",
    "get_tensordict",
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
