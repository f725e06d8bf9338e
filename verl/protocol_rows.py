"""Splitting, joining, repeating and padding the rows of a DataProto, and verl's auto-padding switch.

:class:`DataProtoRowsMixin` holds the methods of :class:`verl.protocol.DataProto` that rearrange whole rows
(``chunk``, ``split``, ``concat``, ``repeat``, ``sample_level_repeat``, ``unfold_column_chunks``, ``reorder``,
``padding``); DataProto inherits them, so they are called as verl's methods. Every method moves the tensors and the
non-tensor arrays together and copies meta_info to its result. :class:`DataProtoConfig` is verl's process-wide
auto-padding switch, which lets :meth:`~DataProtoRowsMixin.chunk` split into parts one row apart.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tensordict import TensorDict

from verl.protocol_ops import as_key_list, check_keys_exist, concat_meta_info, normalize_index, split_columns
from verl.utils.errors import ValidationError

if TYPE_CHECKING:
    from verl.protocol import DataProto

__all__ = ["DataProtoConfig", "DataProtoRowsMixin"]

# the environment variable that turns auto padding on for every DataProto in the process, as in verl
_AUTO_PADDING_ENV = "VERL_AUTO_PADDING"


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


class DataProtoRowsMixin:
    """Row rearrangements; see :class:`verl.protocol.DataProto` for the attributes they read."""

    batch: TensorDict | None
    non_tensor_batch: dict[str, np.ndarray]
    meta_info: dict[str, Any]

    # ------------------------------------------------------------------ splitting and joining

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
        if padding_size < 0 or padding_candidate not in ("", "first", "last"):
            raise ValidationError(
                f"padding(padding_size={padding_size}, padding_candidate={padding_candidate!r}): the size must be "
                "a non-negative integer and the candidate 'first' or 'last' (or '' for the last row)."
            )
        if padding_size == 0:
            return
        if len(self) == 0:
            raise ValidationError("Cannot pad an empty DataProto: there is no row to repeat.")
        row = 0 if padding_candidate == "first" else len(self) - 1
        padded = type(self).concat([self, self._take_rows(np.full(padding_size, row, dtype=np.int64))])
        self.batch, self.non_tensor_batch = padded.batch, padded.non_tensor_batch

    def chunk(self, chunks: int) -> list[DataProto]:
        """Split into ``chunks`` consecutive parts; each carries a copy of meta_info.

        The parts are equal unless auto padding is enabled (:meth:`is_padding_enabled`); then ``B`` rows split
        into parts whose sizes differ by at most one row, the longer ones first (7 rows in 3 parts: 3, 2, 2).

        Raises:
            ValidationError: when ``chunks`` is not positive, or does not divide ``len(self)`` without auto padding.
        """
        num_rows = len(self)
        if chunks <= 0:
            raise ValidationError(f"chunk: chunks must be a positive integer, got {chunks}.")
        if num_rows % chunks != 0 and not self.is_padding_enabled():
            raise ValidationError(
                f"chunk({chunks}): the DataProto has {num_rows} rows, which is not divisible into {chunks} equal "
                "chunks. Pad it first with pad_dataproto_to_divisor, pick a divisor of the length, or enable auto "
                "padding (DataProto.from_dict(..., auto_padding=True)) to accept parts one row apart."
            )
        size, num_longer = divmod(num_rows, chunks)
        bounds = np.cumsum([0] + [size + (i < num_longer) for i in range(chunks)])
        return [self.slice(int(bounds[i]), int(bounds[i + 1])) for i in range(chunks)]

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
        if not data:
            raise ValidationError("DataProto.concat needs at least one DataProto, got an empty list.")
        first = data[0]
        for i, part in enumerate(data[1:], start=1):
            first_keys = set(first.batch.keys()) if first.batch is not None else None
            part_keys = set(part.batch.keys()) if part.batch is not None else None
            if first_keys != part_keys or set(first.non_tensor_batch) != set(part.non_tensor_batch):
                raise ValidationError(
                    f"DataProto.concat: part {i} has keys batch={part_keys}, non_tensor={sorted(part.non_tensor_batch)}"
                    f" but part 0 has batch={first_keys}, non_tensor={sorted(first.non_tensor_batch)}."
                )
        batch = torch.cat([part.batch for part in data], dim=0) if first.batch is not None else None
        non_tensor = {
            key: np.concatenate([part.non_tensor_batch[key] for part in data], axis=0) for key in first.non_tensor_batch
        }
        meta = concat_meta_info([part.meta_info for part in data])
        return type(first)(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    # ------------------------------------------------------------------ repeating and reshaping rows

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> DataProto:
        """Repeat every row ``repeat_times`` times: interleaved ``[a, a, b, b]`` or tiled ``[a, b, a, b]``."""
        if repeat_times <= 0:
            raise ValidationError(f"repeat_times must be a positive integer, got {repeat_times}.")
        rows = np.arange(len(self), dtype=np.int64)
        index = np.repeat(rows, repeat_times) if interleave else np.tile(rows, repeat_times)
        return self._take_rows(index)

    def sample_level_repeat(self, repeat_times: Sequence[int] | np.ndarray | torch.Tensor) -> DataProto:
        """Repeat row ``i`` ``repeat_times[i]`` times, keeping the rows in order (``[2, 0, 1]`` gives
        ``[a, a, c]``).

        Args:
            repeat_times: a list, tuple, 1-D ndarray or 1-D tensor of ``B`` non-negative integers.

        Raises:
            ValidationError: when ``repeat_times`` is not ``B`` non-negative integers.
        """
        if isinstance(repeat_times, torch.Tensor):
            repeat_times = repeat_times.detach().cpu().numpy()
        counts = np.asarray(repeat_times)
        valid = counts.ndim == 1 and len(counts) == len(self)
        if valid and counts.size:
            valid = np.issubdtype(counts.dtype, np.integer) and bool((counts >= 0).all())
        if not valid:
            raise ValidationError(
                f"sample_level_repeat: repeat_times must hold one non-negative integer per row ({len(self)}), got "
                f"{counts.tolist()!r:.120}."
            )
        return self._take_rows(np.repeat(np.arange(len(self), dtype=np.int64), counts.astype(np.int64)))

    def unfold_column_chunks(self, n_split: int, split_keys: Sequence[str] | None = None) -> DataProto:
        """Cut the columns (dim 1) of ``split_keys`` into ``n_split`` chunks that become rows; repeat the rest.

        Each row becomes ``n_split`` consecutive rows: a split key of shape (B, C, ...) becomes
        (B * n_split, C // n_split, ...), row ``i``'s column chunk ``j`` landing in row ``i * n_split + j``;
        every other tensor and array is repeated ``n_split`` times (interleaved). Useful to pass groups that must
        not be shuffled apart. Works on tensors and on non-tensor arrays alike (a list of equal-length lists given
        to :meth:`from_dict` is 2-D).

        Raises:
            ValidationError: for ``n_split < 1``, an unknown split key, or a split key whose dim 1 is missing or
                not divisible by ``n_split``.
        """
        if n_split < 1:
            raise ValidationError(f"unfold_column_chunks: n_split must be a positive integer, got {n_split}.")
        keys = as_key_list(split_keys)
        tensor_keys = list(self.batch.keys()) if self.batch is not None else []
        check_keys_exist("batch or non_tensor_batch", keys, tensor_keys + list(self.non_tensor_batch))
        batch = None
        if self.batch is not None:
            tensors = {
                key: split_columns(key, value, n_split) if key in keys else value.repeat_interleave(n_split, dim=0)
                for key, value in self.batch.items()
            }
            batch = TensorDict(tensors, batch_size=[len(self) * n_split], device=self.batch.device)
        non_tensor = {
            key: split_columns(key, value, n_split) if key in keys else np.repeat(value, n_split, axis=0)
            for key, value in self.non_tensor_batch.items()
        }
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))

    def reorder(self, indices: Sequence[int] | np.ndarray | torch.Tensor) -> DataProto:
        """Permute rows in place (row ``i`` becomes old row ``indices[i]``) and return ``self``."""
        index = normalize_index(indices, len(self))
        if len(index) != len(self):
            raise ValidationError(f"reorder needs {len(self)} indices (one per row), got {len(index)}.")
        reordered = self._take_rows(index)
        self.batch, self.non_tensor_batch = reordered.batch, reordered.non_tensor_batch
        return self
