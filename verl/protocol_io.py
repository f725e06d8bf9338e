"""DataProto in other forms: a TensorDict, a file on disk, a stream of shuffled mini-batches.

:class:`DataProtoIOMixin` holds the methods of :class:`verl.protocol.DataProto` that convert a whole batch
(``from_tensordict`` / ``to_tensordict``, ``save_to_disk`` / ``load_from_disk``, ``make_iterator``); DataProto
inherits them, so they are called as verl's methods. The disk format is the one deliberate departure from verl:
verl pickles the object, so loading a file runs whatever code it names; here the file holds plain data that
``torch.load(weights_only=True)`` reads, and anything that cannot be stored that way is refused at save time.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from torch.utils.data import DataLoader

from verl.protocol_ops import to_object_array
from verl.utils.errors import ValidationError

__all__ = ["DataProtoIOMixin"]

# make_iterator owns these DataLoader arguments; letting callers override them would break its contract.
_RESERVED_DATALOADER_KWARGS = ("batch_size", "sampler", "batch_sampler", "generator", "collate_fn")

# save_to_disk's file layout; bump the version when the layout changes so old readers fail loudly.
_DISK_FORMAT = "verl.DataProto"
_DISK_FORMAT_VERSION = 1
# numpy dtype kinds whose arrays are plain bytes (bool, ints, floats, complex, fixed-width strings, datetimes)
_RAW_NUMPY_KINDS = "biufcUSMm"


def _collate_row_ids(ids: list[int]) -> np.ndarray:
    # module level (not a lambda) so DataLoader worker processes can pickle it
    return np.asarray(ids, dtype=np.int64)


class DataProtoIOMixin:
    """Conversions of a whole DataProto; see :class:`verl.protocol.DataProto` for the attributes they read."""

    batch: TensorDict | None
    non_tensor_batch: dict[str, np.ndarray]
    meta_info: dict[str, Any]

    # ------------------------------------------------------------------ TensorDict

    @classmethod
    def from_tensordict(
        cls,
        tensor_dict: TensorDict | None = None,
        meta_info: dict[str, Any] | None = None,
        num_batch_dims: int = 1,
    ) -> Any:
        """Build a DataProto from a TensorDict such as :meth:`to_tensordict` returns.

        Tensors go to ``batch``; ``NonTensorStack`` values (one object per row) become ``dtype=object`` arrays in
        ``non_tensor_batch``; ``NonTensorData`` values (one object for the batch) go to ``meta_info``, on top of
        the ``meta_info`` argument.

        Args:
            tensor_dict: a TensorDict with ``batch_size=[B]`` (None gives an empty DataProto).
            meta_info: extra batch-wide values.
            num_batch_dims: only 1 is accepted: a DataProto has one batch dimension.

        Raises:
            ValidationError: for ``num_batch_dims != 1``, a value of another kind (e.g. a nested TensorDict), or
                parts with different numbers of rows.
        """
        from tensordict.tensorclass import NonTensorData, NonTensorStack

        if num_batch_dims != 1:
            raise ValidationError(
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
                non_tensor[key] = to_object_array(value.tolist())
            elif isinstance(value, NonTensorData):
                meta[key] = value.data
            else:
                raise ValidationError(
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
            ValidationError: when a key is used by more than one of batch, non_tensor_batch and meta_info.
        """
        from verl.utils import tensordict_utils as tu

        tensors = dict(self.batch.items()) if self.batch is not None else {}
        clashes = (set(tensors) & set(self.non_tensor_batch)) | (
            (set(tensors) | set(self.non_tensor_batch)) & set(self.meta_info)
        )
        if clashes:
            raise ValidationError(
                f"to_tensordict: key(s) {sorted(clashes)} appear in more than one of batch, non_tensor_batch and "
                "meta_info; a TensorDict has one namespace. Rename them first (DataProto.rename)."
            )
        per_row: dict[str, Any] = dict(tensors)
        for key, value in self.non_tensor_batch.items():
            per_row[key] = list(value)
        return tu.get_tensordict(tensor_dict=per_row, non_tensor_dict=self.meta_info)

    # ------------------------------------------------------------------ mini-batches

    def make_iterator(
        self,
        mini_batch_size: int,
        epochs: int,
        seed: int | None = None,
        dataloader_kwargs: dict[str, Any] | None = None,
    ) -> Iterator[Any]:
        """Yield mini-batches of ``mini_batch_size`` rows for ``epochs`` passes over the data.

        Shuffling follows ``dataloader_kwargs["shuffle"]`` as in verl; when that key is absent, the rows are
        shuffled exactly when a ``seed`` is given (this project's callers rely on that). A ``seed`` seeds one
        ``torch.Generator`` once, so every epoch gets a fresh permutation and the whole sequence is reproducible.
        Every mini-batch carries a copy of ``meta_info``. Other ``dataloader_kwargs`` (e.g. ``num_workers``) go to
        the underlying ``DataLoader``.

        Raises:
            ValidationError: when ``len(self)`` is not divisible by ``mini_batch_size``, ``epochs`` is negative,
                or ``dataloader_kwargs`` sets an argument this method controls (batch_size, sampler,
                batch_sampler, generator, collate_fn).
        """
        num_rows = len(self)  # type: ignore[arg-type]
        if mini_batch_size <= 0 or num_rows % mini_batch_size != 0:
            raise ValidationError(
                f"make_iterator: {num_rows} rows are not divisible by mini_batch_size={mini_batch_size}; "
                "choose a mini-batch size that divides the batch, or pad the batch first."
            )
        if epochs < 0:
            raise ValidationError(f"make_iterator: epochs must be >= 0, got {epochs}.")
        kwargs = dict(dataloader_kwargs or {})
        reserved = sorted(set(kwargs) & set(_RESERVED_DATALOADER_KWARGS))
        if reserved:
            raise ValidationError(f"make_iterator sets {reserved} itself; remove them from dataloader_kwargs.")
        shuffle = bool(kwargs.pop("shuffle", seed is not None))
        generator = None
        if seed is not None:
            generator = torch.Generator()
            generator.manual_seed(seed)
        loader = DataLoader(
            list(range(num_rows)),
            batch_size=mini_batch_size,
            shuffle=shuffle,
            generator=generator,
            collate_fn=_collate_row_ids,
            **kwargs,
        )

        def _iterate() -> Iterator[Any]:
            for _ in range(epochs):
                for index in loader:
                    yield self._take_rows(index)  # type: ignore[attr-defined]

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
            ValidationError: when a non-tensor element or a meta_info value is of a type that cannot be stored
                safely (e.g. a custom class instance); the message names the key.
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

    @classmethod
    def load_from_disk(cls, filepath: str | os.PathLike) -> Any:
        """Read a file written by :meth:`save_to_disk`; tensors are loaded onto the CPU.

        Loading uses ``torch.load(weights_only=True)``, which refuses to run code from the file, so files from
        untrusted sources are safe to open.

        Raises:
            ValidationError: when the file is not in this format (e.g. a pickle written by upstream verl), or is
                corrupt or from a newer version.
        """
        try:
            payload = torch.load(filepath, weights_only=True, map_location="cpu")
        except Exception as err:  # the unpickler raises several error types for foreign files
            raise ValidationError(
                f"load_from_disk: {os.fspath(filepath)!r} is not a DataProto file written by save_to_disk "
                f"({type(err).__name__}: {err}). Pickled DataProtos (upstream verl's format) are refused because "
                "loading them can run arbitrary code; re-save the data with DataProto.save_to_disk."
            ) from err
        if not isinstance(payload, dict) or payload.get("format") != _DISK_FORMAT:
            raise ValidationError(f"load_from_disk: {os.fspath(filepath)!r} does not hold a {_DISK_FORMAT} archive.")
        if payload.get("version") != _DISK_FORMAT_VERSION:
            raise ValidationError(
                f"load_from_disk: {os.fspath(filepath)!r} has format version {payload.get('version')!r}; this "
                f"version of verl reads version {_DISK_FORMAT_VERSION}."
            )
        batch = None
        if payload["batch"] is not None:
            batch = TensorDict(payload["batch"]["tensors"], batch_size=payload["batch"]["batch_size"])
        non_tensor = {key: _decode_array(value) for key, value in payload["non_tensor_batch"].items()}
        meta = {key: _decode_value(value) for key, value in payload["meta_info"].items()}
        return cls(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)


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
    raise ValidationError(
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
    for plain in (bool, int, float):
        if isinstance(value, plain):
            return plain(value)
    if isinstance(value, str):
        return str.__str__(value)
    raise ValidationError(
        f"save_to_disk: {where} holds a {type(value).__module__}.{type(value).__qualname__}, which cannot be stored "
        "safely. Supported: tensors, numpy arrays and scalars, str, int, float, complex, bool, None, bytes, and "
        "lists, tuples, sets and dicts of these; convert other objects (e.g. to a tensor or a dict) first."
    )


def _decode_array(encoded: Any) -> np.ndarray:
    tag = encoded[0]
    if tag == "object_array":
        _, shape, items = encoded
        return to_object_array([_decode_value(item) for item in items]).reshape(shape)
    if tag == "array":
        _, dtype, shape, data = encoded
        return np.frombuffer(data.numpy().tobytes(), dtype=np.dtype(dtype)).reshape(shape).copy()
    raise ValidationError(
        f"load_from_disk: unknown array encoding {tag!r}; the file is corrupt or from a newer version."
    )


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
    raise ValidationError(
        f"load_from_disk: unknown value encoding {tag!r}; the file is corrupt or from a newer version."
    )
