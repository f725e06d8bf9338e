"""Weights packed into buckets (verl.utils.weight_buckets): which tensors share a bucket, where each lands in it,
and that every unpacked tensor equals the one sent, whatever its dtype and size, while the consumer keeps it."""

import pickle

import pytest
import torch

from verl.utils import weight_buckets
from verl.utils.weight_buckets import aligned, iter_bucketed, named_tensors, pack_buckets, plan_buckets

CAPACITY = 1000  # bytes per bucket in these tests; every offset is a multiple of ALIGN_BYTES = 64

# bytes of each tensor, sent in this order, and the buckets they make (ALIGN_BYTES 64):
#   bucket 0: t0 at 0 (ends 400); t1 at aligned(400) = 448, ends 648 <= 1000
#             t2 would start at aligned(648) = 704 and end at 1004 > 1000: it opens bucket 1
#   bucket 1: t2 at 0 (ends 300); t3 is 1500 > 1000 bytes: bucket 2 on its own, sent uncopied
#   bucket 3: t4 at 0 (ends 100); t5 at aligned(100) = 128, ends 192
#             t6 would start at aligned(192) = 256 and end at 1156 > 1000: bucket 4
SIZES = [400, 200, 300, 1500, 100, 64, 900]
BUCKETS = [[0, 1], [2], [3], [4, 5], [6]]
# byte offset of each tensor in its bucket's buffer (t3 has none: it is not packed)
OFFSETS = {0: 0, 1: 448, 2: 0, 4: 0, 5: 128, 6: 0}


def mixed_weights() -> list[tuple[str, torch.Tensor]]:
    """Tensors of SIZES' byte counts in four dtypes (elements x bytes each)."""
    gen = torch.Generator().manual_seed(0)
    return [
        ("t0", torch.randn(100, generator=gen)),  # 100 x 4 = 400
        ("t1", torch.randn(10, 10, generator=gen).half()),  # 100 x 2 = 200
        ("t2", torch.randn(150, generator=gen).bfloat16()),  # 150 x 2 = 300
        ("t3", torch.randn(375, generator=gen)),  # 375 x 4 = 1500
        ("t4", torch.randn(5, 10, generator=gen).half()),  # 50 x 2 = 100
        ("t5", torch.arange(8)),  # 8 x 8 = 64 (int64)
        ("t6", torch.randn(15, 15, generator=gen)),  # 225 x 4 = 900
    ]


def test_aligned_rounds_up_to_the_alignment():
    assert [aligned(0), aligned(1), aligned(64), aligned(65), aligned(100)] == [0, 64, 64, 128, 128]


def test_plan_groups_by_the_hand_derived_boundaries():
    assert [weight_buckets.nbytes_of(t) for _, t in mixed_weights()] == SIZES
    assert plan_buckets(SIZES, CAPACITY) == BUCKETS


def test_plan_puts_a_tensor_that_ends_exactly_at_the_capacity_in_the_bucket():
    # 500 bytes at 0, the next at aligned(500) = 512: 512 + 488 = 1000 fits, 512 + 489 = 1001 does not
    assert plan_buckets([500, 488], CAPACITY) == [[0, 1]]
    assert plan_buckets([500, 489], CAPACITY) == [[0], [1]]


def test_plan_sends_tensors_bigger_than_a_bucket_alone_even_back_to_back():
    assert plan_buckets([1001, 2000, 10], CAPACITY) == [[0], [1], [2]]


def test_unpacked_tensors_equal_the_originals_grouped_and_placed_as_planned():
    weights = mixed_weights()
    sent = list(iter_bucketed(iter(weights), CAPACITY))  # every view kept until the end, as a slow consumer would
    assert [name for name, _ in sent] == [name for name, _ in weights]
    for (_, original), (_, unpacked) in zip(weights, sent):
        assert unpacked.dtype == original.dtype and unpacked.shape == original.shape
        assert torch.equal(unpacked, original)
    assert sent[3][1] is weights[3][1]  # bigger than a bucket: the tensor itself, not a copy
    # the tensors of one bucket share a buffer (views of one storage), every bucket its own while all are held
    storage_of = {i: sent[i][1].untyped_storage().data_ptr() for i in OFFSETS}
    groups = [[i for i in bucket if i in OFFSETS] for bucket in BUCKETS if bucket != [3]]
    assert [len({storage_of[i] for i in group}) for group in groups] == [1, 1, 1, 1]
    assert len({storage_of[group[0]] for group in groups}) == 4
    for i, offset in OFFSETS.items():
        assert sent[i][1].data_ptr() - storage_of[i] == offset


def test_a_consumer_that_lets_go_gets_two_buffers_taking_turns():
    # the loop below holds its last view while asking for the next, so bucket k's buffer is busy when bucket k+1
    # is packed; by bucket k+2 it is free again: the packed buckets 0, 1, 3, 4 use buffers A, B, A, B
    received, storages = {}, []
    for name, tensor in iter_bucketed(iter(mixed_weights()), CAPACITY):
        received[name] = tensor.clone()
        storages.append(tensor.untyped_storage().data_ptr())
    packed = [storages[0], storages[2], storages[4], storages[6]]  # first tensor of buckets 0, 1, 3, 4
    assert packed[0] == packed[2] and packed[1] == packed[3] and packed[0] != packed[1]
    for name, original in mixed_weights():
        assert torch.equal(received[name], original)


def test_a_buffer_held_by_a_consumer_is_never_overwritten():
    # vLLM's reload keeps a layer's first weights until its last arrives: hold bucket 0's views through the rest
    weights = mixed_weights()
    stream = iter_bucketed(iter(weights), CAPACITY)
    first = [next(stream), next(stream)]  # t0, t1: all of bucket 0
    later = [(name, tensor.clone()) for name, tensor in stream]
    for (_, original), (_, unpacked) in zip(weights, first + later):
        assert torch.equal(unpacked, original)


def test_the_producer_may_reuse_its_tensor_once_the_next_is_asked_for():
    # a producer filling one tensor again for every weight: each value is copied before the next fill
    scratch = torch.empty(50)

    def refilled():
        for value in range(5):
            scratch.fill_(float(value))
            yield f"w{value}", scratch

    sent = list(iter_bucketed(refilled(), CAPACITY))  # 200 bytes each: four in the first bucket, one in the next
    assert [tensor[0].item() for _, tensor in sent] == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_without_a_use_count_no_buffer_is_reused(monkeypatch):
    monkeypatch.setattr(weight_buckets, "_use_count", lambda buffer: None)
    storages = {t.untyped_storage().data_ptr() for _, t in iter_bucketed(iter(mixed_weights()), CAPACITY)}
    # four packed buckets, four buffers (the pool keeps them all), and t3's own storage
    assert len(storages) == 5


def test_a_bucket_holds_at_least_one_byte():
    with pytest.raises(ValueError, match="at least one byte"):
        list(iter_bucketed(iter(mixed_weights()), 0))


# ---------------------------------------------------------------- buckets kept for another process (pack_buckets)

# bytes each bucket of BUCKETS holds, its buffer trimmed to them: t0 + pad + t1 ends at 648; t2 300; t3 alone 1500;
# t4 + pad + t5 ends at 192; t6 900
USED = [648, 300, 1500, 192, 900]


def test_packed_buckets_follow_the_plan_and_are_trimmed():
    weights = mixed_weights()
    buckets = pack_buckets(iter(weights), CAPACITY)
    assert [[name for name, *_ in bucket.entries] for bucket in buckets] == [[f"t{i}" for i in b] for b in BUCKETS]
    assert [bucket.buffer.numel() for bucket in buckets] == USED
    assert all(bucket.buffer.dtype == torch.uint8 and bucket.buffer.device.type == "cpu" for bucket in buckets)
    unpacked = list(named_tensors(buckets))
    assert [name for name, _ in unpacked] == [name for name, _ in weights]
    for (_, original), (_, view) in zip(weights, unpacked):
        assert view.dtype == original.dtype and view.shape == original.shape and torch.equal(view, original)
    # t3, bigger than a bucket, is copied into a bucket of its own: the sender's tensor is not shared
    assert unpacked[3][1].data_ptr() != weights[3][1].data_ptr()


def test_buckets_pickle_their_bytes_out_of_band_and_come_back_equal():
    weights = mixed_weights()
    buffers = []
    stream = pickle.dumps(pack_buckets(iter(weights), CAPACITY), protocol=5, buffer_callback=buffers.append)
    # one out-of-band buffer per bucket, holding exactly its bytes; the stream carries the names and shapes only
    assert [memoryview(b).nbytes for b in buffers] == USED
    assert len(stream) < sum(USED)  # 3540 bytes of weights, none of them in the stream
    arrived = pickle.loads(stream, buffers=buffers)
    for (name, original), (got_name, view) in zip(weights, named_tensors(arrived)):
        assert got_name == name and view.dtype == original.dtype and torch.equal(view, original)  # bf16 included


def test_buckets_from_a_read_only_buffer_are_read_without_a_warning(recwarn):
    # Ray's object store hands the receiver read-only memory; the views are only read (copied into parameters)
    buffers = []
    stream = pickle.dumps(pack_buckets(iter(mixed_weights()), CAPACITY), protocol=5, buffer_callback=buffers.append)
    read_only = [memoryview(bytes(b.raw())) for b in buffers]  # bytes: an immutable copy
    arrived = pickle.loads(stream, buffers=read_only)
    assert torch.equal(dict(named_tensors(arrived))["t6"], dict(mixed_weights())["t6"])
    assert not [w for w in recwarn if "not writable" in str(w.message)]


def test_named_tensors_passes_a_plain_mapping_through():
    weights = dict(mixed_weights())
    assert [(n, t) for n, t in named_tensors(weights)] == list(weights.items())


def test_packing_copies_each_tensor_before_the_next_is_asked_for():
    scratch = torch.empty(50)  # 200 bytes, refilled for every weight: four fit the first bucket, one the next

    def refilled():
        for value in range(5):
            scratch.fill_(float(value))
            yield f"w{value}", scratch

    buckets = pack_buckets(refilled(), CAPACITY)
    assert len(buckets) == 2
    assert [tensor[0].item() for _, tensor in named_tensors(buckets)] == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_a_packed_bucket_holds_at_least_one_byte():
    with pytest.raises(ValueError, match="at least one byte"):
        pack_buckets(iter(mixed_weights()), 0)
