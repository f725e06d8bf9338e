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
one row. This module holds the container and every method verl users call; the work on the parts is done by helper
modules that take and return tensors, arrays, TensorDicts and dicts and never import DataProto: row arithmetic in
:mod:`verl.protocol_rows`, TensorDict / disk / mini-batch / byte conversions in :mod:`verl.protocol_io`, key
selection, merging and folding in :mod:`verl.protocol_ops`. Everything verl has in ``verl.protocol`` is importable
from here.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from verl import protocol_io, protocol_rows
from verl.protocol_io import (
    deserialize_single_tensor,
    deserialize_tensordict,
    serialize_single_tensor,
    serialize_tensordict,
)
from verl.protocol_ops import (
    as_key_list,
    check_keys_exist,
    fold_parts,
    list_of_dict_to_dict_of_list,
    normalize_index,
    rename_keys,
    select_parts,
    unfold_parts,
    union_numpy_dict,
    union_parts,
    union_tensor_dict,
)
from verl.protocol_rows import DataProtoConfig
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
class DataProto:
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
        protocol_rows.check_part_lengths(self.batch, self.non_tensor_batch)

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
        batch, converted = protocol_rows.parts_from_dicts(tensors, non_tensors, num_batch_dims)
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
        tensors, non_tensors = protocol_rows.split_single_dict(data)
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
        batch, non_tensor = protocol_rows.take_rows(self.batch, self.non_tensor_batch, index)
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
        batch, non_tensor, meta = select_parts(
            self.batch, self.non_tensor_batch, self.meta_info, batch_keys, non_tensor_batch_keys, meta_info_keys
        )
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
        rename_keys(self.batch, self.non_tensor_batch, as_key_list(old_keys), as_key_list(new_keys))
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
        merged_batch, non_tensor, meta = union_parts(
            (self.batch, self.non_tensor_batch, self.meta_info), (other.batch, other.non_tensor_batch, other.meta_info)
        )
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

    # ------------------------------------------------------------------ splitting, joining, repeating rows

    def is_padding_enabled(self) -> bool:
        """Whether :meth:`chunk` may split unequally: set for this DataProto (``from_dict(auto_padding=True)``)
        or process-wide (``DataProtoConfig.auto_padding``, ``VERL_AUTO_PADDING``)."""
        return bool(self.meta_info.get(DataProtoConfig.auto_padding_key, False)) or DataProtoConfig.auto_padding

    def padding(self, padding_size: int, padding_candidate: str = "") -> None:
        """Append ``padding_size`` copies of the first (``"first"``) or last (``"last"``, or ``""`` as in verl)
        row, in place; meta_info is unchanged.

        Raises:
            ValidationError: for a negative size, another candidate name, or padding an empty DataProto.
        """
        rows = protocol_rows.padding_rows(len(self), padding_size, padding_candidate)
        if padding_size == 0:
            return
        padded = type(self).concat([self, self._take_rows(rows)])
        self.batch, self.non_tensor_batch = padded.batch, padded.non_tensor_batch

    def chunk(self, chunks: int) -> list[DataProto]:
        """Split into ``chunks`` consecutive parts; each carries a copy of meta_info.

        The parts are equal unless auto padding is enabled (:meth:`is_padding_enabled`); then ``B`` rows split
        into parts whose sizes differ by at most one row, the longer ones first (7 rows in 3 parts: 3, 2, 2).

        Raises:
            ValidationError: when ``chunks`` is not positive, or does not divide ``len(self)`` without auto padding.
        """
        bounds = protocol_rows.chunk_bounds(len(self), chunks, self.is_padding_enabled())
        return [self.slice(start, end) for start, end in bounds]

    def split(self, split_size: int) -> list[DataProto]:
        """Split into parts of ``split_size`` rows; the last part may be shorter."""
        if split_size <= 0:
            raise ValidationError(f"split_size must be a positive integer, got {split_size}.")
        return [self.slice(start, start + split_size) for start in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: Sequence[DataProto]) -> DataProto:
        """Concatenate along rows and merge the parts' meta_info.

        meta_info is merged as verl does: every key except ``"metrics"`` must have the same value in all parts
        that have it; ``"metrics"`` (a dict, or a list of dicts, per part, e.g. one per worker) are gathered into
        one dict of lists, ``{"loss": [loss_part0, loss_part1, ...]}``.

        Raises:
            ValidationError: for an empty list, parts whose tensor / non-tensor keys differ, or a meta_info key
                with different values in two parts ("Conflicting values for meta_info key ...").
        """
        batch, non_tensor, meta = protocol_rows.concat_parts(
            [part.batch for part in data], [part.non_tensor_batch for part in data], [part.meta_info for part in data]
        )
        return type(data[0])(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> DataProto:
        """Repeat every row ``repeat_times`` times: interleaved ``[a, a, b, b]`` or tiled ``[a, b, a, b]``."""
        return self._take_rows(protocol_rows.repeat_rows(len(self), repeat_times, interleave))

    def sample_level_repeat(self, repeat_times: Sequence[int] | np.ndarray | torch.Tensor) -> DataProto:
        """Repeat row ``i`` ``repeat_times[i]`` times (a list, tuple, 1-D ndarray or tensor of ``B`` non-negative
        integers), keeping the rows in order: ``[2, 0, 1]`` gives ``[a, a, c]``.

        Raises:
            ValidationError: when ``repeat_times`` is not ``B`` non-negative integers.
        """
        return self._take_rows(protocol_rows.sample_repeat_rows(len(self), repeat_times))

    def unfold_column_chunks(self, n_split: int, split_keys: Sequence[str] | None = None) -> DataProto:
        """Cut the columns (dim 1) of ``split_keys`` into ``n_split`` chunks that become rows; repeat the rest.

        A split key of shape (B, C, ...) becomes (B * n_split, C // n_split, ...), row ``i``'s column chunk ``j``
        landing in row ``i * n_split + j``; every other tensor and array is repeated ``n_split`` times
        (interleaved). Works on tensors and non-tensor arrays alike.

        Raises:
            ValidationError: for ``n_split < 1``, an unknown split key, or a split key whose dim 1 is missing or
                not divisible by ``n_split``.
        """
        batch, non_tensor = protocol_rows.unfold_column_parts(self.batch, self.non_tensor_batch, n_split, split_keys)
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))

    def reorder(self, indices: Sequence[int] | np.ndarray | torch.Tensor) -> DataProto:
        """Permute rows in place (row ``i`` becomes old row ``indices[i]``) and return ``self``."""
        index = normalize_index(indices, len(self))
        if len(index) != len(self):
            raise ValidationError(f"reorder needs {len(self)} indices (one per row), got {len(index)}.")
        reordered = self._take_rows(index)
        self.batch, self.non_tensor_batch = reordered.batch, reordered.non_tensor_batch
        return self

    # ------------------------------------------------------------------ other forms: TensorDict, disk, mini-batches

    @classmethod
    def from_tensordict(
        cls, tensor_dict: TensorDict | None = None, meta_info: dict[str, Any] | None = None, num_batch_dims: int = 1
    ) -> DataProto:
        """Build a DataProto from a TensorDict such as :meth:`to_tensordict` returns (None: an empty DataProto).

        Tensors go to ``batch``; ``NonTensorStack`` values (one object per row) become ``dtype=object`` arrays in
        ``non_tensor_batch``; ``NonTensorData`` values (one object for the batch) go to ``meta_info``, on top of
        the ``meta_info`` argument. Only ``num_batch_dims=1`` is accepted.

        Raises:
            ValidationError: for ``num_batch_dims != 1``, a value of another kind (e.g. a nested TensorDict), or
                parts with different numbers of rows.
        """
        batch, non_tensor, meta = protocol_io.parts_from_tensordict(tensor_dict, meta_info, num_batch_dims)
        return cls(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def to_tensordict(self) -> TensorDict:
        """This batch as one TensorDict (``batch_size=[B]``): tensors as they are, non-tensor arrays as
        ``NonTensorStack``, meta_info entries as ``NonTensorData``; :meth:`from_tensordict` reverses it (non-tensor
        arrays come back as ``dtype=object`` arrays).

        Raises:
            ValidationError: when a key is used by more than one of batch, non_tensor_batch and meta_info.
        """
        return protocol_io.parts_to_tensordict(self.batch, self.non_tensor_batch, self.meta_info)

    def make_iterator(
        self, mini_batch_size: int, epochs: int, seed: int | None = None, dataloader_kwargs: dict | None = None
    ) -> Iterator[DataProto]:
        """Yield mini-batches of ``mini_batch_size`` rows for ``epochs`` passes, each with a copy of meta_info.

        Shuffling follows ``dataloader_kwargs["shuffle"]`` as in verl; when that key is absent, the rows are
        shuffled exactly when a ``seed`` is given, from one generator seeded once (a fresh, reproducible
        permutation every epoch). Other ``dataloader_kwargs`` (e.g. ``num_workers``) go to the ``DataLoader``.

        Raises:
            ValidationError: when ``len(self)`` is not divisible by ``mini_batch_size``, ``epochs`` is negative,
                or ``dataloader_kwargs`` sets batch_size, sampler, batch_sampler, generator or collate_fn.
        """
        rows = protocol_io.mini_batch_rows(len(self), mini_batch_size, epochs, seed, dataloader_kwargs)
        return (self._take_rows(index) for index in rows)

    def save_to_disk(self, filepath: str | os.PathLike) -> None:
        """Write this batch to ``filepath`` in a format that loads without unpickling arbitrary objects.

        verl pickles the whole object, so loading its files runs whatever code the file names. Here the file is a
        ``torch.save`` archive of plain data (see :func:`verl.protocol_io.save_parts`) that :meth:`load_from_disk`
        reads with ``torch.load(weights_only=True)``; files written by upstream verl are not readable here.

        Raises:
            ValidationError: when a non-tensor element or a meta_info value is of a type that cannot be stored
                safely (e.g. a custom class instance); the message names the key.
        """
        protocol_io.save_parts(filepath, self.batch, self.non_tensor_batch, self.meta_info)

    @classmethod
    def load_from_disk(cls, filepath: str | os.PathLike) -> DataProto:
        """Read a file written by :meth:`save_to_disk` (tensors onto the CPU); safe for untrusted files.

        Raises:
            ValidationError: when the file is not in this format (e.g. a pickle written by upstream verl), or is
                corrupt or from a newer version.
        """
        batch, non_tensor, meta = protocol_io.load_parts(filepath)
        return cls(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)


# ---------------------------------------------------------------------------------------------- verl's free functions


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Pad ``data`` to a multiple of ``size_divisor`` rows by appending copies of its first rows, cyclically
    (3 rows padded to a multiple of 7 become rows ``0 1 2 0 1 2 0``).

    Returns:
        ``(padded, pad_size)`` with ``len(padded) == len(data) + pad_size`` and ``pad_size < size_divisor``;
        ``data`` itself when no padding is needed.

    Raises:
        ValidationError: when ``size_divisor`` is not positive, or padding is needed but ``data`` is empty.
    """
    rows = protocol_rows.pad_to_divisor_rows(len(data), size_divisor)
    if len(rows) == 0:
        return data, 0
    return type(data).concat([data, data[rows]]), len(rows)


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Drop the last ``pad_size`` rows added by :func:`pad_dataproto_to_divisor` (``data`` itself for 0)."""
    if pad_size < 0 or pad_size > len(data):
        raise ValidationError(f"pad_size must be in [0, {len(data)}], got {pad_size}.")
    return data if pad_size == 0 else data.slice(0, len(data) - pad_size)


def fold_batch_dim(data: DataProto, new_batch_size: int) -> DataProto:
    """Group the ``B`` rows into ``new_batch_size`` rows of ``B // new_batch_size`` consecutive old rows each:
    tensors (B, ...) become (new_batch_size, B // new_batch_size, ...), arrays likewise. ``data`` is unchanged;
    meta_info is shallow-copied; :func:`unfold_batch_dim` undoes it.

    Raises:
        ValidationError: when ``new_batch_size`` is not a positive divisor of ``len(data)``.
    """
    batch, non_tensor = fold_parts(data.batch, data.non_tensor_batch, new_batch_size)
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(data.meta_info))


def unfold_batch_dim(data: DataProto, batch_dims: int = 2) -> DataProto:
    """Merge the first ``batch_dims`` dimensions of every tensor and array into one row dimension (row-major), so
    ``unfold_batch_dim(fold_batch_dim(data, n))`` gives ``data`` back. ``data`` is unchanged.

    Raises:
        ValidationError: when ``batch_dims < 1`` or the values disagree on their first ``batch_dims`` sizes.
    """
    batch, non_tensor = unfold_parts(data.batch, data.non_tensor_batch, batch_dims)
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(data.meta_info))
