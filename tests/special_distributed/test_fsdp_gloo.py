"""FSDP2 on two gloo ranks: shards, the global grad norm, an overflow in one rank's shard, strict, the critic,
padding-free passes and the rollout's agreed stop. One spawn runs every scenario (fsdp_dist_workers); each test
checks one of them."""

import socket

import pytest
import torch.multiprocessing as mp

from tests.special_distributed.fsdp_dist_workers import fsdp_training_scenarios

WORLD = 2


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spawn(target, *args, world: int = WORLD) -> dict[int, dict]:
    """Run ``target(rank, world, port, queue, *args)`` on ``world`` processes; {rank: {scenario: result}}."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(rank, world, port, queue, *args)) for rank in range(world)]
    for proc in procs:
        proc.start()
    results = {}
    for _ in procs:
        rank, scenarios = queue.get(timeout=400)  # a hang fails here instead of blocking
        results[rank] = scenarios
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    return results


@pytest.fixture(scope="module")
def results():
    return spawn(fsdp_training_scenarios)


def scenario(results, name):
    for rank in range(WORLD):
        assert "error" not in results[rank][name], results[rank][name]["error"]
    return [results[rank][name] for rank in range(WORLD)]


def test_each_rank_holds_half_of_every_parameter_and_adam_moment(results):
    ranks = scenario(results, "shards")
    for kind in ("params", "moments"):
        assert ranks[0][kind].keys() == ranks[1][kind].keys() and ranks[0][kind]
        for name, (shape0, full) in ranks[0][kind].items():
            shape1, full1 = ranks[1][kind][name]
            # Shard(0) over 2 ranks: ceil(rows / 2) rows on rank 0, the rest on rank 1, other dims whole; e.g.
            # embed_tokens 32x32 -> 16x32 + 16x32, the 32-wide q_proj bias -> 16 + 16
            rows = full[0]
            assert full == full1, name
            assert shape0 == [-(-rows // 2), *full[1:]] and shape1 == [rows // 2, *full[1:]], name
    # the tiny model's dims are all even: exactly half everywhere
    assert all(s[0][0] * 2 == s[1][0] for s in ranks[0]["params"].values())


def test_the_step_norm_is_the_global_norm_over_the_shards(results):
    ranks = scenario(results, "global_norm")
    for r in ranks:
        assert r["ok"]
        # torch's DTensor-aware norm and the norm of the gathered gradients agree with the step's
        assert r["step"] == pytest.approx(r["torch"], rel=1e-6) and r["step"] == pytest.approx(r["full"], rel=1e-6)
    assert ranks[0]["step"] == ranks[1]["step"]
    # each rank's own shards hold part of it: sum of local squares = global square
    assert ranks[0]["local"] ** 2 + ranks[1]["local"] ** 2 == pytest.approx(ranks[0]["full"] ** 2, rel=1e-6)
    assert 0 < ranks[0]["local"] < ranks[0]["full"]


def test_an_overflow_in_one_ranks_shard_skips_the_update_on_both(results):
    ranks = scenario(results, "overflow")
    # only rank 1's shard was poisoned, yet both ranks skip update 2 (MAX-agreed verdict)
    assert [r["local_found_inf"] for r in ranks] == [False, True]
    for r in ranks:
        assert r["failed"] == [0.0, 1.0]
        assert r["params_unchanged"] and r["moments_unchanged"]
        # Adam's step count is 1 before and after the skipped update; the LR schedule advanced once (update 1)
        assert r["step_counts"] == [1.0] and r["lr_epoch"] == 1
        # scale 1024, hysteresis 2: one overflow uses up hysteresis only, the scale stays 1024 on both ranks
        assert r["loss_scale"] == 1024.0


def test_strict_stops_both_ranks_at_the_same_step(results):
    ranks = scenario(results, "strict")
    for r in ranks:
        # updates 1 and 2 apply; update 3 is poisoned on rank 1 only and strict raises there, on both ranks
        assert r["update_failed"] == [0.0, 0.0] and r["raised_at"] == 3


def test_the_critic_skips_an_overflow_in_one_shard_on_both_ranks(results):
    for r in scenario(results, "critic"):
        assert r["failed"] == [0.0, 1.0] and r["params_unchanged"]


def test_padding_free_passes_work_with_ranks_packing_to_different_lengths(results):
    ranks = scenario(results, "padding_free")
    # 8 rows of 8 tokens, 2 pads in the shared batch: 62 real tokens on rank 0, 3 fewer on rank 1
    assert [r["num_real_tokens"] for r in ranks] == [62, 59]
    for r in ranks:
        assert r["pg_loss"][1] == pytest.approx(r["pg_loss"][0], abs=1e-6)
        # the same update, packed or padded: Adam's first step moves each weight by about lr * g / (|g| + eps) = 1e-2
        # in g's direction, so float rounding of g shows only where |g| is near eps; a wrong packing would move
        # weights by up to 2e-2
        assert r["max_weight_diff"] < 1e-4


def test_a_token_budget_cuts_as_many_micro_batches_on_every_rank(results):
    ranks = scenario(results, "token_budget")
    # rank 0's long rows make 4 micro-batches of 16 tokens, rank 1's short ones 3; both run 4 (rank 1 halves its
    # largest micro-batch), in the log-prob pass and in the update's one mini-batch
    assert [(r["log_prob_forwards"], r["update_forwards"]) for r in ranks] == [(4, 4), (4, 4)]
    for r in ranks:
        assert r["max_log_prob_diff"] < 1e-5  # the same log-probs as in one pass
        assert r["max_weight_diff"] < 1e-4  # the same update as by sample count (see the padding-free test)


def test_the_rollout_takes_the_same_number_of_forward_passes_on_every_rank(results):
    ranks = scenario(results, "rollout")
    # first call: rank 0 ends at token 1, rank 1 at token 2 -> both stop after 2 passes; second call: rank 1 never
    # ends -> both run the whole response length, 4 passes (a rank stopping alone would deadlock the collective)
    assert [r["calls"] for r in ranks] == [[2, 4], [2, 4]]
