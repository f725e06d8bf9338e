"""A batch in other forms: a TensorDict, a file on disk, a stream of shuffled mini-batches, bytes.

The functions here take and return the parts of a batch (a ``TensorDict`` or None, a dict of numpy arrays, a
meta_info dict), row ids or byte encodings; :class:`verl.protocol.DataProto`'s ``from_tensordict`` /
``to_tensordict``, ``save_to_disk`` / ``load_from_disk`` and ``make_iterator`` call them, and ``verl.protocol``
re-exports the byte encoders under verl's names, so this module never imports DataProto. The disk format is the one
deliberate departure from verl: verl pickles the object, so loading a file runs whatever code it names; here the
file holds plain data that ``torch.load(weights_only=True)`` reads, and anything that cannot be stored that way is
refused at save time.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from torch.utils.data import DataLoader

from verl.protocol_ops import to_object_array
from verl.utils.errors import ValidationError

__all__ = [
    "deserialize_single_tensor",
    "deserialize_tensordict",
    "load_parts",
    "mini_batch_rows",
    "parts_from_tensordict",
    "parts_to_tensordict",
    "save_parts",
    "serialize_single_tensor",
    "serialize_tensordict",
]

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


Parts = tuple[TensorDict | None, dict[str, np.ndarray], dict[str, Any]]


def parts_from_tensordict(
    tensor_dict: TensorDict | None, meta_info: dict[str, Any] | None, num_batch_dims: int
) -> Parts:
    """The parts ``(batch, non_tensor_batch, meta_info)`` of ``DataProto.from_tensordict(tensor_dict, ...)``.

    Tensors go to ``batch``; ``NonTensorStack`` values (one object per row) become ``dtype=object`` arrays;
    ``NonTensorData`` values (one object for the batch) go to ``meta_info``, on top of the ``meta_info`` argument.

    Raises:
        ValidationError: for ``num_batch_dims != 1`` or a value of another kind (e.g. a nested TensorDict).
    """
    from tensordict.tensorclass import NonTensorData, NonTensorStack

    if num_batch_dims != 1:
        raise ValidationError(
            f"from_tensordict: num_batch_dims={num_batch_dims} is not supported; a DataProto has exactly one "
            "batch dimension."
        )
    meta = dict(meta_info or {})
    if tensor_dict is None:
        return None, {}, meta
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
        rows = tensor_dict.batch_size[:1] if len(tensor_dict.batch_size) else [next(iter(tensors.values())).shape[0]]
        batch = TensorDict(tensors, batch_size=list(rows), device=tensor_dict.device)
    return batch, non_tensor, meta


def parts_to_tensordict(
    batch: TensorDict | None, non_tensor: dict[str, np.ndarray], meta_info: dict[str, Any]
) -> TensorDict:
    """One TensorDict holding the parts: tensors as they are, non-tensor arrays as ``NonTensorStack`` (one object
    per row), meta_info entries as ``NonTensorData``; :func:`parts_from_tensordict` reverses it.

    Raises:
        ValidationError: when a key is used by more than one of the three parts.
    """
    from verl.utils import tensordict_utils as tu

    tensors = dict(batch.items()) if batch is not None else {}
    clashes = (set(tensors) & set(non_tensor)) | ((set(tensors) | set(non_tensor)) & set(meta_info))
    if clashes:
        raise ValidationError(
            f"to_tensordict: key(s) {sorted(clashes)} appear in more than one of batch, non_tensor_batch and "
            "meta_info; a TensorDict has one namespace. Rename them first (DataProto.rename)."
        )
    per_row: dict[str, Any] = dict(tensors)
    for key, value in non_tensor.items():
        per_row[key] = list(value)
    return tu.get_tensordict(tensor_dict=per_row, non_tensor_dict=meta_info)


def mini_batch_rows(
    num_rows: int, mini_batch_size: int, epochs: int, seed: int | None, dataloader_kwargs: dict[str, Any] | None
) -> Iterator[np.ndarray]:
    """The row ids of each mini-batch of ``DataProto.make_iterator``, epoch after epoch.

    Shuffling follows ``dataloader_kwargs["shuffle"]`` as in verl; when that key is absent, rows are shuffled
    exactly when a ``seed`` is given. A ``seed`` seeds one ``torch.Generator`` once, so every epoch gets a fresh
    permutation and the whole sequence is reproducible. Other ``dataloader_kwargs`` go to the ``DataLoader``.

    Raises:
        ValidationError: when ``num_rows`` is not divisible by ``mini_batch_size``, ``epochs`` is negative, or
            ``dataloader_kwargs`` sets an argument this function controls.
    """
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

    def _iterate() -> Iterator[np.ndarray]:
        for _ in range(epochs):
            yield from loader

    return _iterate()


def save_parts(
    filepath: str | os.PathLike, batch: TensorDict | None, non_tensor: dict[str, np.ndarray], meta_info: dict
) -> None:
    """Write the parts of a DataProto to ``filepath`` as plain data that ``torch.load(weights_only=True)`` reads.

    Tensors are moved to CPU, numpy arrays stored as dtype + shape + raw bytes, object arrays and meta_info as
    nested lists / dicts / tuples of tensors, str, int, float, bool and None (subclasses of str, int and float,
    such as string enums, as their plain value).

    Raises:
        ValidationError: when a non-tensor element or a meta_info value is of a type that cannot be stored safely
            (e.g. a custom class instance); the message names the key.
    """
    stored_batch = None
    if batch is not None:
        stored_batch = {
            "batch_size": list(batch.batch_size),
            "tensors": {key: value.detach().cpu() for key, value in batch.items()},
        }
    payload = {
        "format": _DISK_FORMAT,
        "version": _DISK_FORMAT_VERSION,
        "batch": stored_batch,
        "non_tensor_batch": {
            key: _encode_array(value, f"non_tensor_batch[{key!r}]") for key, value in non_tensor.items()
        },
        "meta_info": {key: _encode_value(value, f"meta_info[{key!r}]") for key, value in meta_info.items()},
    }
    torch.save(payload, filepath)


def load_parts(filepath: str | os.PathLike) -> Parts:
    """The parts stored by :func:`save_parts`, tensors on the CPU; read with ``torch.load(weights_only=True)``.

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
    return batch, non_tensor, meta


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
