"""Two gloo ranks, only rank 1's gradients poisoned: both ranks skip the same steps and stop at the same step; bad
inputs or a NaN loss on one rank stop both ranks at the same step with the same cause."""

import socket

import torch.multiprocessing as mp

from tests.special_distributed.dist_workers import dp_actor_fire_drill


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_ranks_agree_on_skips_and_on_the_stop():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=dp_actor_fire_drill, args=(rank, 2, port, queue)) for rank in range(2)]
    for proc in procs:
        proc.start()
    results = {}
    for _ in procs:
        rank, seen, raised_at, error, weights, causes = queue.get(timeout=240)  # a hang fails here, not blocks
        results[rank] = (seen, raised_at, error, weights, causes)
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    for rank in range(2):
        assert results[rank][2] is None, results[rank][2]
    # Steps 2..5 are poisoned on rank 1 only; the gradient all-reduce carries the NaN to rank 0, so both ranks see
    # step 1 succeed and steps 2 and 3 fail (fp32: nothing absorbed, limit 2). Step 4 is the 3rd consecutive
    # failure, more than max_consecutive_failures=2: both ranks raise at step 4.
    for rank in range(2):
        seen, raised_at, _, _, _ = results[rank]
        assert seen == [(1, 0.0), (2, 1.0), (3, 1.0)], (rank, seen)
        assert raised_at == 4, (rank, raised_at)
    # Averaged gradients: the two ranks hold identical weights after training on different data.
    for w0, w1 in zip(results[0][3], results[1][3]):
        assert w0 == w1
    # Then a fresh fp16 actor: rank 1's row 3 has NaN advantages on 2 tokens. The counts are summed over the ranks,
    # so both ranks report step 1 failed on {advantages: 2}; then rank 0's loss is NaN: both report step 2 failed by
    # nonfinite_loss, and neither backs its loss scale off (1024 stays).
    for rank in range(2):
        assert results[rank][4] == [
            (1, "nonfinite_inputs", {"advantages": 2}),
            (2, "nonfinite_loss", None),
            1024.0,
        ], (rank, results[rank][4])
