"""DataProto: the one batch container that travels between the driver and the Ray workers.

A ``DataProto`` holds three parts that always describe the same ``B`` rows: ``batch``, a
``tensordict.TensorDict`` of tensors whose first dimension is ``B`` (or ``None``); ``non_tensor_batch``, a dict of
numpy arrays of length ``B`` (strings and other Python objects live in ``dtype=object`` arrays); and ``meta_info``,
a plain dict of batch-wide values (temperature, global step, ...). Row operations (indexing, slicing, chunking,
concatenation, repetition, shuffled mini-batch iteration) act on the tensors and the numpy arrays together so that
the two can never drift apart, and every constructor checks that their lengths agree.

The API follows the open-source verl project (same class, method, function and argument names and the same
results), so code written against ``verl.protocol`` runs here unchanged. Where verl asserts, this implementation
raises :class:`verl.utils.errors.ValidationError`, a ``ValueError`` naming the problem that is also an
``AssertionError``. Auto padding works as in verl: a DataProto built with ``auto_padding=True`` (or any DataProto
while ``DataProtoConfig.auto_padding`` is on, or ``VERL_AUTO_PADDING=1``) may be chunked into parts that differ by
one row. This module holds the container (construction, checks, indexing, keys, union); DataProto inherits its row
rearrangements (chunk, concat, repeat, padding, ...) from :mod:`verl.protocol_rows` and its whole-batch conversions
(TensorDict, disk, mini-batch iterator) from :mod:`verl.protocol_io`; the free functions (padding, folding, merging,
byte encoding) live in :mod:`verl.protocol_ops`. Everything verl has in ``verl.protocol`` is importable from here.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from verl.protocol_io import DataProtoIOMixin
from verl.protocol_ops import (
    as_key_list,
    as_non_tensor_array,
    check_keys_exist,
    deserialize_single_tensor,
    deserialize_tensordict,
    fold_batch_dim,
    list_of_dict_to_dict_of_list,
    normalize_index,
    pad_dataproto_to_divisor,
    serialize_single_tensor,
    serialize_tensordict,
    unfold_batch_dim,
    union_meta_info,
    union_numpy_dict,
    union_tensor_dict,
    unpad_dataproto,
)
from verl.protocol_rows import DataProtoConfig, DataProtoRowsMixin
from verl.utils.errors import ValidationError

__all__ = [
    "DataProto",
    "DataProtoConfig",
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
class DataProto(DataProtoRowsMixin, DataProtoIOMixin):
    """A batch of ``B`` rows: tensors, numpy arrays and batch-wide meta information.

    Attributes:
        batch: TensorDict with ``batch_size=[B]``, e.g. ``input_ids`` (B, S); or None when there are no tensors.
        non_tensor_batch: dict of numpy arrays, each of length ``B`` (strings as ``dtype=object`` arrays); None is
            taken as ``{}``.
        meta_info: batch-wide values; row operations copy it unchanged to their results.

    Indexing: ``data[i]`` with an int returns a :class:`DataProtoItem` (a single-row view); a slice returns a
    DataProto; a 1-D list / ndarray / tensor of row ids (or a boolean mask) returns a DataProto of those rows.
    """

    batch: TensorDict | None = None
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # verl accepts None for both dicts; an empty dict keeps every method free of None checks
        if self.non_tensor_batch is None:
            self.non_tensor_batch = {}
        if self.meta_info is None:
            self.meta_info = {}
        self.check_consistency()

    def check_consistency(self) -> None:
        """Check that every tensor and non-tensor array has the same number of rows.

        Raises:
            ValidationError: when the batch is not 1-D, a non-tensor value is not a numpy array, or lengths differ.
        """
        lengths: dict[str, int] = {}
        if self.batch is not None:
            if len(self.batch.batch_size) != 1:
                shape = list(self.batch.batch_size)
                raise ValidationError(f"DataProto.batch must have exactly one batch dimension, got batch_size={shape}.")
            lengths["batch"] = int(self.batch.batch_size[0])
        for key, value in self.non_tensor_batch.items():
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

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: Mapping[str, np.ndarray | list] | None = None,
        meta_info: dict[str, Any] | None = None,
        num_batch_dims: int = 1,
        auto_padding: bool = False,
    ) -> DataProto:
        """Build a DataProto from tensors (each (B, ...)) and non-tensor arrays or lists (each of length B).

        Lists and tuples are converted as verl converts them, ``np.array(value, dtype=object)``: a list of
        strings or dicts (or ragged lists) gives one element per row, a list of equal-length lists a 2-D
        (B, columns) object array.

        Args:
            tensors: per-row tensors sharing dim 0.
            non_tensors: per-row numpy arrays, lists or tuples.
            meta_info: batch-wide values (copied, never modified).
            num_batch_dims: how many leading dims are batch dims; a DataProto has exactly one, so only 1 is
                accepted, as in verl (use :func:`fold_batch_dim` for groups).
            auto_padding: mark this DataProto so that :meth:`chunk` accepts unequal parts.

        Raises:
            ValidationError: when the tensors disagree on B, a value has the wrong type, lengths differ, or
                ``num_batch_dims != 1``.
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
        meta = dict(meta_info or {})
        if auto_padding:
            meta[DataProtoConfig.auto_padding_key] = True
        return cls(batch=batch, non_tensor_batch=converted, meta_info=meta)

    @classmethod
    def from_single_dict(
        cls, data: dict[str, Any], meta_info: dict[str, Any] | None = None, auto_padding: bool = False
    ) -> DataProto:
        """Split one dict into tensors (``torch.Tensor`` values) and non-tensors (numpy arrays, lists, tuples).

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
        return cls.from_dict(tensors, non_tensors, meta_info, auto_padding=auto_padding)

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
            ValidationError: for a multi-dimensional index, a non-integer dtype, or a mask of the wrong length.
        """
        return self._take_rows(normalize_index(idxs, len(self)))

    def slice(self, start: int | None = None, end: int | None = None, step: int | None = None) -> DataProto:
        """Rows ``start:end:step`` (Python slice semantics, a negative step included) as a new DataProto."""
        rows = slice(start, end, step)
        if step is not None and step < 0:  # tensors take no negative step: the row ids the slice names, in order
            return self._take_rows(np.arange(len(self))[rows].copy())
        return self._take_rows(rows)

    # ------------------------------------------------------------------ keys

    def select(self, batch_keys=None, non_tensor_batch_keys=None, meta_info_keys=None, deepcopy=False) -> DataProto:
        """Keep only the named keys (None keeps all keys of that part); each argument is a name or a list.

        As in verl, ``non_tensor_batch_keys`` and ``meta_info_keys`` act as filters: names that are absent are
        skipped. Tensors are shared with ``self`` unless ``deepcopy``, which also deep-copies the other parts.

        Raises:
            ValidationError: naming any batch (tensor) key that does not exist, with the available keys.
        """
        batch = self.batch
        if batch_keys is not None:
            keys = as_key_list(batch_keys)
            check_keys_exist("batch", keys, batch.keys() if batch is not None else [])
            if batch is not None:
                batch = batch.select(*keys)
        non_tensor = dict(self.non_tensor_batch)
        if non_tensor_batch_keys is not None:
            wanted = set(as_key_list(non_tensor_batch_keys))
            non_tensor = {key: value for key, value in non_tensor.items() if key in wanted}
        meta = dict(self.meta_info)
        if meta_info_keys is not None:
            wanted = set(as_key_list(meta_info_keys))
            meta = {key: value for key, value in meta.items() if key in wanted}
        if deepcopy:
            batch = batch.clone() if batch is not None else None
            non_tensor, meta = copy.deepcopy(non_tensor), copy.deepcopy(meta)
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def pop(self, batch_keys=None, non_tensor_batch_keys=None, meta_info_keys=None) -> DataProto:
        """Remove the named keys from ``self`` and return them as a new DataProto (None pops nothing).

        The result is built like :meth:`from_dict`, so it has ``batch=None`` when no tensor key is popped. All keys
        are checked before anything is removed, so a bad key leaves ``self`` untouched.

        Raises:
            ValidationError: naming any key that does not exist, with the available keys.
        """
        batch_keys = as_key_list(batch_keys)
        non_tensor_keys = as_key_list(non_tensor_batch_keys)
        meta_keys = as_key_list(meta_info_keys)
        check_keys_exist("batch", batch_keys, self.batch.keys() if self.batch is not None else [])
        check_keys_exist("non_tensor_batch", non_tensor_keys, self.non_tensor_batch.keys())
        check_keys_exist("meta_info", meta_keys, self.meta_info.keys())
        tensors = {key: self.batch.pop(key) for key in batch_keys}
        non_tensor = {key: self.non_tensor_batch.pop(key) for key in non_tensor_keys}
        meta = {key: self.meta_info.pop(key) for key in meta_keys}
        popped = type(self).from_dict(tensors=tensors, non_tensors=non_tensor, meta_info=meta)
        if popped.batch is not None and self.batch is not None and self.batch.device is not None:
            popped.batch = popped.batch.to(self.batch.device)
        return popped

    def rename(self, old_keys=None, new_keys=None) -> DataProto:
        """Rename keys (a name or a list of names each) in place and return ``self``.

        verl renames tensor keys only; here non-tensor keys can be renamed the same way.

        Raises:
            ValidationError: when the key lists differ in length, an old key is missing, or a new key is taken.
        """
        old, new = as_key_list(old_keys), as_key_list(new_keys)
        if len(old) != len(new):
            raise ValidationError(f"rename needs as many new keys as old keys, got {old} -> {new}.")
        batch_keys = list(self.batch.keys()) if self.batch is not None else []
        check_keys_exist("batch or non_tensor_batch", old, batch_keys + list(self.non_tensor_batch))
        for old_key, new_key in zip(old, new):
            if old_key == new_key:
                continue
            if new_key in batch_keys or new_key in self.non_tensor_batch:
                raise ValidationError(f"Cannot rename {old_key!r} to {new_key!r}: {new_key!r} already exists.")
            if old_key in batch_keys:
                self.batch.rename_key_(old_key, new_key)
                batch_keys = list(self.batch.keys())
            else:
                self.non_tensor_batch[new_key] = self.non_tensor_batch.pop(old_key)
        return self

    def union(self, other: DataProto) -> DataProto:
        """Merge ``other`` into ``self`` in place and return ``self``.

        Keys present in both must hold equal values (equal copies are fine): tensors by
        :func:`union_tensor_dict`, non-tensor arrays by :func:`union_numpy_dict` (same dtype, NaN equal to NaN),
        meta_info values by equality. Everything is checked before ``self`` changes, so a conflict leaves it
        untouched.

        Raises:
            ValidationError: when lengths differ, or a key present in both holds different values (the key is
                named).
        """
        if len(self) != len(other):
            raise ValidationError(f"Cannot union DataProtos of different lengths: {len(self)} vs {len(other)}.")
        # check every part on copies first, then commit in place (callers may hold references to self's parts)
        merged_batch = None
        if self.batch is not None and other.batch is not None:
            merged_batch = union_tensor_dict(self.batch.copy(), other.batch)
        non_tensor = union_numpy_dict(dict(self.non_tensor_batch), other.non_tensor_batch)
        meta = union_meta_info(dict(self.meta_info), other.meta_info)
        if merged_batch is not None:
            for key in merged_batch.keys():
                if key not in self.batch.keys():
                    self.batch[key] = merged_batch.get(key)
        elif self.batch is None and other.batch is not None:
            self.batch = other.batch.select(*other.batch.keys())
        self.non_tensor_batch.update(non_tensor)
        self.meta_info.update(meta)
        return self

    def to(self, device: str | torch.device) -> DataProto:
        """Move the tensors to ``device`` in place and return ``self``."""
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self
