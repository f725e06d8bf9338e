"""DataProto: the one batch container that travels between the driver and the Ray workers.

A ``DataProto`` holds three parts that always describe the same ``B`` rows: ``batch``, a
``tensordict.TensorDict`` of tensors whose first dimension is ``B`` (or ``None``); ``non_tensor_batch``, a dict of
numpy arrays of length ``B`` (strings and other Python objects live in ``dtype=object`` arrays); and ``meta_info``,
a plain dict of batch-wide values (temperature, global step, ...). Row operations (indexing, slicing, chunking,
concatenation, repetition, shuffled mini-batch iteration) act on the tensors and the numpy arrays together so that
the two can never drift apart, and every constructor checks that their lengths agree. The object pickles cleanly,
which is how Ray ships it between processes. Module-level helpers pad a batch to a multiple of a divisor (for an
even split across data-parallel ranks) and remove that padding again.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from torch.utils.data import DataLoader

__all__ = ["DataProto", "DataProtoItem", "pad_dataproto_to_divisor", "unpad_dataproto"]

# make_iterator owns these DataLoader arguments; letting callers override them would break its contract.
_RESERVED_DATALOADER_KWARGS = ("batch_size", "shuffle", "sampler", "batch_sampler", "generator", "collate_fn")


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


def _arrays_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Element-wise equality that also works for object arrays holding arrays or other containers."""
    if a.shape != b.shape:
        return False
    try:
        return bool(np.array_equal(a, b))
    except (ValueError, TypeError):
        return all(bool(np.all(x == y)) for x, y in zip(a.tolist(), b.tolist()))


def _values_equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and _arrays_equal(a, b)
    return bool(a == b)


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

    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, np.ndarray | list] | None = None,
        meta_info: dict[str, Any] | None = None,
    ) -> DataProto:
        """Build a DataProto from tensors (each (B, ...)) and non-tensor arrays or lists (each of length B).

        Raises:
            ValueError: when the tensors disagree on B, a value has the wrong type, or lengths differ.
        """
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
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))

    def __getitem__(self, item: int | slice | Sequence[int] | np.ndarray | torch.Tensor) -> DataProto | DataProtoItem:
        if isinstance(item, (int, np.integer)) and not isinstance(item, bool):
            length = len(self)
            if not -length <= item < length:
                raise IndexError(f"Row {item} is out of range for a DataProto with {length} rows.")
            batch = self.batch[int(item)] if self.batch is not None else None
            non_tensor = {key: value[item] for key, value in self.non_tensor_batch.items()}
            return DataProtoItem(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))
        if isinstance(item, slice):
            return self._take_rows(item)
        if isinstance(item, (list, tuple, np.ndarray, torch.Tensor)):
            return self._take_rows(_normalize_index(item, len(self)))
        raise ValueError(
            f"DataProto index of type {type(item).__name__} is not supported; use an int, a slice, "
            "or a 1-D list/ndarray/tensor of row ids."
        )

    def slice(self, start: int | None = None, end: int | None = None) -> DataProto:
        """Rows ``start:end`` (Python slice semantics) as a new DataProto."""
        return self._take_rows(slice(start, end))

    def select(
        self,
        batch_keys: str | Iterable[str] | None = None,
        non_tensor_batch_keys: str | Iterable[str] | None = None,
        meta_info_keys: str | Iterable[str] | None = None,
        deepcopy: bool = False,
    ) -> DataProto:
        """Keep only the named keys (None keeps all keys of that part); tensors are shared unless ``deepcopy``.

        Raises:
            ValueError: naming any key that does not exist, with the available keys.
        """
        batch = self.batch
        if batch is not None and batch_keys is not None:
            keys = _as_key_list(batch_keys)
            _check_keys_exist("batch", keys, batch.keys())
            batch = batch.select(*keys)
        elif batch is None and _as_key_list(batch_keys):
            _check_keys_exist("batch", _as_key_list(batch_keys), [])
        non_tensor = dict(self.non_tensor_batch)
        if non_tensor_batch_keys is not None:
            keys = _as_key_list(non_tensor_batch_keys)
            _check_keys_exist("non_tensor_batch", keys, non_tensor.keys())
            non_tensor = {key: non_tensor[key] for key in keys}
        meta = dict(self.meta_info)
        if meta_info_keys is not None:
            keys = _as_key_list(meta_info_keys)
            _check_keys_exist("meta_info", keys, meta.keys())
            meta = {key: meta[key] for key in keys}
        if deepcopy:
            batch = batch.clone() if batch is not None else None
            non_tensor, meta = copy.deepcopy(non_tensor), copy.deepcopy(meta)
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def pop(
        self,
        batch_keys: str | Iterable[str] | None = None,
        non_tensor_batch_keys: str | Iterable[str] | None = None,
        meta_info_keys: str | Iterable[str] | None = None,
    ) -> DataProto:
        """Remove the named keys from ``self`` and return them as a new DataProto (None pops nothing).

        All keys are checked before anything is removed, so a bad key leaves ``self`` untouched.

        Raises:
            ValueError: naming any key that does not exist, with the available keys.
        """
        batch_keys = _as_key_list(batch_keys)
        non_tensor_keys = _as_key_list(non_tensor_batch_keys)
        meta_keys = _as_key_list(meta_info_keys)
        _check_keys_exist("batch", batch_keys, self.batch.keys() if self.batch is not None else [])
        _check_keys_exist("non_tensor_batch", non_tensor_keys, self.non_tensor_batch.keys())
        _check_keys_exist("meta_info", meta_keys, self.meta_info.keys())
        batch = None
        if self.batch is not None:
            popped = {key: self.batch.pop(key) for key in batch_keys}
            batch = TensorDict(popped, batch_size=self.batch.batch_size, device=self.batch.device)
        non_tensor = {key: self.non_tensor_batch.pop(key) for key in non_tensor_keys}
        meta = {key: self.meta_info.pop(key) for key in meta_keys}
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def rename(self, old_keys: str | Sequence[str], new_keys: str | Sequence[str]) -> DataProto:
        """Rename tensor or non-tensor keys in place and return ``self``.

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
        """Merge ``other`` into ``self`` in place and return ``self``; shared keys must hold equal values.

        Raises:
            ValueError: when lengths differ, or a key present in both holds different values (the key is named).
        """
        if len(self) != len(other):
            raise ValueError(f"Cannot union DataProtos of different lengths: {len(self)} vs {len(other)}.")
        if other.batch is not None:
            if self.batch is None:
                self.batch = other.batch.select(*other.batch.keys())
            else:
                for key in other.batch.keys():
                    value = other.batch[key]
                    if key in self.batch.keys():
                        if not _values_equal(self.batch[key], value):
                            raise ValueError(f"union conflict: batch key {key!r} differs between the two DataProtos.")
                    else:
                        self.batch[key] = value
        for key, value in other.non_tensor_batch.items():
            if key in self.non_tensor_batch and not _values_equal(self.non_tensor_batch[key], value):
                raise ValueError(f"union conflict: non_tensor_batch key {key!r} differs between the two DataProtos.")
            self.non_tensor_batch.setdefault(key, value)
        for key, value in other.meta_info.items():
            if key in self.meta_info and not _values_equal(self.meta_info[key], value):
                raise ValueError(
                    f"union conflict: meta_info key {key!r} is {self.meta_info[key]!r} in one DataProto and "
                    f"{value!r} in the other."
                )
            self.meta_info.setdefault(key, value)
        self.check_consistency()
        return self

    def chunk(self, chunks: int) -> list[DataProto]:
        """Split into ``chunks`` equal parts.

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
        """Concatenate along rows; meta_info comes from the first element.

        Raises:
            ValueError: for an empty list or parts whose tensor / non-tensor keys differ.
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
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(first.meta_info))

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

        With ``seed`` the rows are shuffled anew every epoch by a ``torch.Generator`` seeded once with ``seed``
        (so the whole sequence is reproducible); without ``seed`` the rows come in order. Every mini-batch
        carries a copy of ``meta_info``. ``dataloader_kwargs`` go to the underlying ``DataLoader`` (e.g.
        ``num_workers``), except the arguments this method controls itself.

        Raises:
            ValueError: when ``len(self)`` is not divisible by ``mini_batch_size``, ``epochs`` is negative, or a
                reserved DataLoader argument is passed.
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
        generator = None
        if seed is not None:
            generator = torch.Generator()
            generator.manual_seed(seed)
        loader = DataLoader(
            list(range(len(self))),
            batch_size=mini_batch_size,
            shuffle=seed is not None,
            generator=generator,
            collate_fn=_collate_row_ids,
            **kwargs,
        )

        def _iterate() -> Iterator[DataProto]:
            for _ in range(epochs):
                for index in loader:
                    yield self._take_rows(index)

        return _iterate()


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
