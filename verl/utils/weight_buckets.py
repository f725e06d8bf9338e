"""Weights sent in buckets: ``(name, tensor)`` pairs packed into one flat byte buffer of a fixed capacity.

verl's ``checkpoint_engine.update_weights_bucket_megabytes`` bounds how many bytes of weights travel together during
a weight sync. :func:`iter_bucketed` takes the trainer's stream of ``(name, tensor)`` pairs, copies tensors in order
into a ``uint8`` buffer of that capacity until the next one would not fit, then yields the whole bucket as typed
views of the buffer (same names, dtypes, shapes and values as the originals). Dtypes mix freely in one bucket: each
tensor starts at an offset rounded up to :data:`ALIGN_BYTES`, so a view of the bytes as any dtype is aligned. A tensor
bigger than a bucket is a bucket of its own and goes as it is, uncopied.

The buffer is reused between buckets, but only once nothing outside still refers to it: a consumer may keep the
views it was given for a while (vLLM's in-place reload holds a layer's weights until every weight of that layer has
arrived, and a ``for`` loop holds its last item while it asks for the next), so overwriting a buffer whose views are
alive would change weights already handed over. :class:`BufferPool` checks the buffer's storage for outside
references and hands out another buffer while the first is in use; a consumer that lets go of a bucket's views
before the bucket after next (vLLM's reload does, for a model sent layer by layer) keeps two buffers in use at most.

Where buckets pay is between processes. :func:`pack_buckets` copies the weights into :class:`WeightBucket` s that
are kept (one buffer each, trimmed to what it holds), for the actor of a rollout group of its own to send through
Ray: a bucket pickles its bytes as one ``uint8`` numpy array, which pickle protocol 5 and Ray's object store carry
out of band (no copy into the pickle stream, and read where it lies on the receiving side), where a torch tensor
pickles through ``torch.save`` into bytes, once per tensor. Any dtype travels this way (numpy has no bfloat16, bytes
do). :func:`named_tensors` turns what arrived (buckets, or a plain ``{name: tensor}``) back into ``(name, tensor)``
pairs, views of the buckets' bytes. In one process (a rollout engine beside the actor) there is nothing to carry:
the rollout streams tensor by tensor (``benchmarks/bench_weight_sync.py`` measured a bucket as one more copy there).

Nothing here imports vLLM or Ray.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np
import torch

__all__ = [
    "ALIGN_BYTES",
    "BufferPool",
    "WeightBucket",
    "aligned",
    "iter_bucketed",
    "named_tensors",
    "nbytes_of",
    "pack_buckets",
    "plan_buckets",
]

# each packed tensor starts at a multiple of this many bytes: a multiple of every dtype's size (and of a cache line)
ALIGN_BYTES = 64
MIB = 2**20


def aligned(offset: int, align: int = ALIGN_BYTES) -> int:
    """``offset`` rounded up to a multiple of ``align``."""
    return -(-offset // align) * align


def nbytes_of(tensor: torch.Tensor) -> int:
    """The bytes a tensor's values take once packed (its elements, not its storage)."""
    return tensor.numel() * tensor.element_size()


def plan_buckets(sizes: Sequence[int], capacity: int, align: int = ALIGN_BYTES) -> list[list[int]]:
    """Which tensors go together: indices into ``sizes`` (bytes, in sending order) grouped into buckets.

    Tensors fill a bucket in order, each at an offset rounded up to ``align``, until the next would end beyond
    ``capacity``; that one opens the next bucket. A tensor of more than ``capacity`` bytes is a bucket of its own.
    :func:`iter_bucketed` packs by this same rule.
    """
    buckets: list[list[int]] = []
    current: list[int] = []
    used = 0
    for index, size in enumerate(sizes):
        if size > capacity:
            if current:
                buckets.append(current)
            buckets.append([index])
            current, used = [], 0
            continue
        start = aligned(used, align) if current else 0
        if start + size > capacity:
            buckets.append(current)
            current, start = [], 0
        current.append(index)
        used = start + size
    if current:
        buckets.append(current)
    return buckets


def _use_count(buffer: torch.Tensor) -> int | None:
    """How many tensors (the buffer, its views, a storage handle) share the buffer's storage; None where this
    torch cannot say."""
    counter = getattr(torch._C, "_storage_Use_Count", None)
    return None if counter is None else counter(buffer.untyped_storage()._cdata)


class BufferPool:
    """Flat ``uint8`` buffers of one capacity on one device, reused once no view of them is alive.

    Args:
        capacity: bytes per buffer.
        device: where the buffers live.
    """

    def __init__(self, capacity: int, device: torch.device | str):
        self.capacity = capacity
        self.device = torch.device(device)
        # (buffer, use count of its storage with no view alive)
        self._buffers: list[tuple[torch.Tensor, int | None]] = []

    @property
    def allocated(self) -> int:
        """Buffers allocated so far."""
        return len(self._buffers)

    def acquire(self) -> torch.Tensor:
        """A buffer no one else refers to: a free one of the pool, else a new one added to it."""
        for buffer, idle in self._buffers:
            if idle is not None and _use_count(buffer) == idle:
                return buffer
        buffer = torch.empty(self.capacity, dtype=torch.uint8, device=self.device)
        self._buffers.append((buffer, _use_count(buffer)))
        return buffer


class _Bucket:
    """The tensors packed into one buffer so far: ``(name, offset, dtype, shape)`` of each."""

    def __init__(self, buffer: torch.Tensor):
        self.buffer = buffer
        self.entries: list[tuple[str, int, torch.dtype, torch.Size]] = []
        self.used = 0

    def offset_for(self, size: int) -> int | None:
        """Where a tensor of ``size`` bytes would start, None when it would not fit."""
        start = aligned(self.used) if self.entries else 0
        return start if start + size <= self.buffer.numel() else None

    @torch.no_grad()
    def put(self, name: str, tensor: torch.Tensor, start: int) -> None:
        size = nbytes_of(tensor)
        self._view(start, size, tensor.dtype, tensor.shape).copy_(tensor)
        self.entries.append((name, start, tensor.dtype, tensor.shape))
        self.used = start + size

    def views(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, start, dtype, shape in self.entries:
            yield name, self._view(start, torch.Size(shape).numel() * dtype.itemsize, dtype, shape)

    def _view(self, start: int, size: int, dtype: torch.dtype, shape: torch.Size) -> torch.Tensor:
        return self.buffer[start : start + size].view(dtype).view(shape)


def iter_bucketed(
    weights: Iterable[tuple[str, torch.Tensor]], capacity: int, device: torch.device | str | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """``weights`` again, sent a bucket at a time: each bucket's tensors copied into one buffer of ``capacity``
    bytes, then yielded as views of it (see :func:`plan_buckets` for the grouping).

    Args:
        weights: ``(name, tensor)`` pairs; read lazily, a tensor is copied before the next is asked for, so the
            producer may free or reuse it.
        capacity: bytes per bucket (>= 1).
        device: where the buffers live; None: the device of the first tensor.

    Yields:
        ``(name, view)`` in the order of ``weights``; a view stays valid while the caller holds it (its buffer is
        reused only once no view of it is alive). A tensor bigger than a bucket comes as it is.
    """
    if capacity < 1:
        raise ValueError(f"a bucket holds at least one byte, got capacity {capacity}")
    pool: BufferPool | None = None
    bucket: _Bucket | None = None
    for name, tensor in weights:
        size = nbytes_of(tensor)
        if size > capacity:
            if bucket is not None:
                yield from bucket.views()
                bucket = None
            yield name, tensor
            continue
        if pool is None:
            pool = BufferPool(capacity, tensor.device if device is None else device)
        start = None if bucket is None else bucket.offset_for(size)
        if start is None:  # the first bucket, or this tensor does not fit in the current one: send it, open one
            if bucket is not None:
                yield from bucket.views()
            bucket, start = _Bucket(pool.acquire()), 0
        bucket.put(name, tensor, start)
    if bucket is not None:
        yield from bucket.views()


class WeightBucket:
    """Packed weights that travel between processes: a flat CPU ``uint8`` buffer and, per tensor, ``(name, byte
    offset, dtype, shape)``.

    Pickled, the buffer goes as a numpy array (out of band under pickle protocol 5, as Ray sends it); unpickled, it
    is a tensor over that array's memory, which in Ray's object store is shared and read-only: read the views (copy
    them into parameters), never write them.
    """

    def __init__(self, buffer: torch.Tensor, entries: list[tuple[str, int, torch.dtype, tuple[int, ...]]]):
        self.buffer = buffer
        self.entries = entries

    def views(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` of each packed tensor, in packing order: views of the buffer, no copy."""
        for name, start, dtype, shape in self.entries:
            size = torch.Size(shape).numel() * dtype.itemsize
            yield name, self.buffer[start : start + size].view(dtype).view(shape)

    def __reduce__(self):
        return _bucket_from_bytes, (self.buffer.numpy(), self.entries)


def _bucket_from_bytes(array: np.ndarray, entries: list) -> WeightBucket:
    with warnings.catch_warnings():  # a buffer read from Ray's object store is read-only: the views are only read
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return WeightBucket(torch.from_numpy(array), entries)


def _closed(bucket: _Bucket) -> WeightBucket:
    entries = [(name, start, dtype, tuple(shape)) for name, start, dtype, shape in bucket.entries]
    return WeightBucket(bucket.buffer[: bucket.used], entries)


@torch.no_grad()
def pack_buckets(weights: Iterable[tuple[str, torch.Tensor]], capacity: int) -> list[WeightBucket]:
    """``weights`` copied into CPU buckets of at most ``capacity`` bytes each, grouped as :func:`plan_buckets` says
    (a tensor bigger than a bucket is copied into a bucket of its own size); every bucket is kept.

    ``weights`` is read lazily and each tensor copied (from any device) before the next is asked for, so the
    producer may free or reuse it. A bucket's buffer is allocated at ``capacity`` and trimmed to what it holds: the
    pages past its end are never written, so a large capacity costs address space, not memory.
    """
    if capacity < 1:
        raise ValueError(f"a bucket holds at least one byte, got capacity {capacity}")
    buckets: list[WeightBucket] = []
    bucket: _Bucket | None = None
    for name, tensor in weights:
        size = nbytes_of(tensor)
        if size > capacity:
            alone = _Bucket(torch.empty(size, dtype=torch.uint8))
            alone.put(name, tensor, 0)
            buckets.extend([_closed(bucket)] if bucket is not None else [])
            buckets.append(_closed(alone))
            bucket = None
            continue
        start = None if bucket is None else bucket.offset_for(size)
        if start is None:
            buckets.extend([_closed(bucket)] if bucket is not None else [])
            bucket, start = _Bucket(torch.empty(capacity, dtype=torch.uint8)), 0
        bucket.put(name, tensor, start)
    return buckets + ([_closed(bucket)] if bucket is not None else [])


def named_tensors(
    weights: Mapping[str, torch.Tensor] | Sequence[WeightBucket],
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs of weights as they arrive: a ``{name: tensor}`` mapping's items, or the views of
    :class:`WeightBucket` s in packing order."""
    if isinstance(weights, Mapping):
        yield from weights.items()
        return
    for bucket in weights:
        yield from bucket.views()
