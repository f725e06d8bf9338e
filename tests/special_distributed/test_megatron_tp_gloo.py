"""megatron-core tensor parallelism on 2 gloo CPU ranks against the same model whole on one rank.

The tiny Qwen2 (GQA 4 heads / 2 groups, tied embeddings, vocabulary 32) splits over 2 ranks as megatron-core does
it: query groups and MLP features column-parallel, the output and down projections row-parallel, the vocabulary
of the (tied) embedding and output layer vocabulary-parallel. Every comparison is float32 and differs from the
whole model only in the order of additions (a row-parallel product is two half-sums added by the all-reduce, the
logits gathered from two vocabulary halves), so the tolerances are :mod:`tests.tolerances`' reordering bounds.
"""

import socket

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from tests.special_distributed.megatron_tp_workers import (
    a_peer_that_never_joins,
    critic_update,
    dist_checkpoint_layouts,
    fused_update,
    lora_update,
    nan_on_one_rank,
    nonfinite_inputs,
    sequence_parallel_step,
    update_and_checkpoint,
)
from tests.tolerances import decoder_reduction_length, reordering_tolerance
from tests.workers.actor.conftest import PROMPT, RESPONSE, tiny_qwen2

TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ranks(target, world_size: int, *args) -> dict:
    """Run ``target(rank, world_size, port, *args, queue)`` on ``world_size`` spawned ranks; rank -> its report."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(rank, world_size, port, *args, queue)) for rank in range(world_size)]
    for proc in procs:
        proc.start()
    reports = {}
    try:
        for _ in procs:
            report = queue.get(timeout=TIMEOUT_S)  # a hang fails here instead of blocking
            reports[report[0]] = report[1:]
        for proc in procs:
            proc.join(timeout=60)
            assert proc.exitcode == 0
    finally:  # a hung rank must not outlive the test (pytest would wait for it at exit)
        for proc in procs:
            if proc.is_alive():
                proc.kill()
    for rank, report in reports.items():
        assert report[-1] is None, f"rank {rank}:\n{report[-1]}"
    return reports


def as_tensor(data: bytes) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(data, dtype=np.float32).copy())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One TP=1 run on a world of one, one TP=2 run on two ranks (with a checkpoint round trip)."""
    whole = run_ranks(update_and_checkpoint, 1, 1, "")[0][0]
    ckpt = str(tmp_path_factory.mktemp("tp2_ckpt"))
    split = run_ranks(update_and_checkpoint, 2, 2, ckpt)
    return whole, {rank: report[0] for rank, report in split.items()}


def tolerance(reference: torch.Tensor) -> float:
    # the chain of reductions one logit goes through, over all PROMPT + RESPONSE positions
    return reordering_tolerance(reference, decoder_reduction_length(tiny_qwen2().config, PROMPT + RESPONSE))


def test_tp2_log_probs_and_entropy_equal_tp1(runs):
    whole, split = runs
    for key in ("log_probs", "entropy"):
        want = as_tensor(whole[key])
        assert want.numel() == 8 * RESPONSE
        for rank in (0, 1):
            torch.testing.assert_close(as_tensor(split[rank][key]), want, atol=tolerance(want), rtol=0)


def test_tp2_update_equals_tp1_update(runs):
    whole, split = runs
    # the grad norm counts each weight once: the split weights' squares summed over the ranks, the replicated
    # norms once; the same number on both ranks
    assert split[0]["grad_norm"] == split[1]["grad_norm"]
    assert split[0]["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-4)
    assert set(split[0]["weights"]) == set(whole["weights"])
    for name, data in whole["weights"].items():
        want = as_tensor(data)
        # AdamW's first step moves each weight by lr * g / (|g| + eps), about lr = 1e-2 whatever the gradient's
        # size; a wrong shard or a wrong norm moves it by a different amount or the other way. The exception is
        # the key bias: its gradient is zero in exact arithmetic (softmax ignores a shift shared by every key's
        # score, and q . b_k is one), so what it holds is rounding noise of ~1e-9, which Adam's division by
        # |g| + eps (1e-8) turns into a step of any size up to lr: only that bound holds there.
        atol = 1e-2 if name.endswith("k_proj.bias") else 1e-5
        for rank in (0, 1):
            torch.testing.assert_close(as_tensor(split[rank]["weights"][name]), want, atol=atol, rtol=0, msg=name)
    want = as_tensor(whole["after"])
    torch.testing.assert_close(as_tensor(split[0]["after"]), want, atol=tolerance(want), rtol=0)


def test_tp2_checkpoint_round_trip_and_gathered_export(runs):
    _, split = runs
    for rank in (0, 1):
        # the shards and the optimizer state come back: same log-probs, same step count
        assert split[rank]["after_resume"] == split[rank]["after"]
        assert split[rank]["steps_after_resume"] == 1
    # the Hugging Face export gathers the shards: the whole updated weights, under Hugging Face names
    exported = split[0]["exported"]
    weights = split[0]["weights"]
    assert set(exported) == set(weights)
    for name, data in weights.items():
        assert exported[name] == data, name


def test_nan_on_one_tp_rank_makes_both_ranks_skip():
    reports = run_ranks(nan_on_one_rank, 2, 2)
    for rank in (0, 1):
        seen, weights, _ = reports[rank]
        # update 2 is poisoned on rank 1 only; the verdict is agreed, so rank 0 skips it too, and both go on
        assert seen == [(1, 0.0), (2, 1.0), (3, 0.0)], (rank, seen)
        before, after = weights
        assert before == after, f"rank {rank} changed its weights in a skipped update"


def test_nonfinite_inputs_are_counted_once_per_row_not_once_per_tensor_parallel_rank():
    # both ranks take the same 8 rows; row 3's advantages are NaN on 2 tokens: 2 bad tokens, not 2 x 2 ranks, on
    # every rank (dp and fsdp2 sum rows of their own); the loss scale does not back off for a bad input
    reports = run_ranks(nonfinite_inputs, 2, 2)
    for rank in (0, 1):
        report = reports[rank][0]
        assert report == {"cause": "nonfinite_inputs", "inputs": {"advantages": 2}, "scale": 1024.0}, (rank, report)


def test_a_tensor_parallel_collective_waits_the_workers_collective_timeout_not_megatrons_30_minutes():
    # megatron-core builds its groups with a 30-minute timeout of its own unless told; with the worker's timeout
    # (3 s here) rank 0's all-reduce raises a timeout the trainer names the hung rank from, within this test's wait
    reports = run_ranks(a_peer_that_never_joins, 2, 3.0)
    assert reports[0][0]["timed_out"] is True, reports[0][0]


def test_tp2_fused_kernels_equal_the_plain_tp1_run(runs):
    # model.use_fused_kernels on 2 ranks: each gathers the vocabulary halves of the (tied) output weight and computes
    # the log-probs chunk by chunk; the plain whole-model run is the reference, with the same reordering bounds
    whole, _ = runs
    fused = {rank: report[0] for rank, report in run_ranks(fused_update, 2, 2).items()}
    for key in ("log_probs", "entropy", "after"):
        want = as_tensor(whole[key])
        for rank in (0, 1):
            torch.testing.assert_close(as_tensor(fused[rank][key]), want, atol=tolerance(want), rtol=0, msg=key)
    # the gather's backward keeps each rank's slice of the weight gradient: the norm is the whole model's, not
    # twice it (a summed gradient would double the output weight's share)
    assert fused[0]["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-4)
    for name, data in whole["weights"].items():
        atol = 1e-2 if name.endswith("k_proj.bias") else 1e-5  # see test_tp2_update_equals_tp1_update
        torch.testing.assert_close(as_tensor(fused[1]["weights"][name]), as_tensor(data), atol=atol, rtol=0, msg=name)


def test_tp2_lora_equals_tp1_lora(tmp_path):
    # LoRA adapters split as their layers are (verl.models.mcore.lora): the same log-probs, update, grad norm and
    # merged weights as the whole model's adapters; the base model (the reference) never moves
    whole = run_ranks(lora_update, 1, 1, "")[0][0]
    split = {rank: report[0] for rank, report in run_ranks(lora_update, 2, 2, str(tmp_path)).items()}
    want = as_tensor(whole["log_probs"])
    for rank in (0, 1):
        torch.testing.assert_close(as_tensor(split[rank]["log_probs"]), want, atol=tolerance(want), rtol=0)
        assert split[rank]["base_moved"] == 0.0
    assert whole["base_moved"] == 0.0
    assert split[0]["grad_norm"] == split[1]["grad_norm"]
    assert split[0]["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-4)
    # merged weights W + (alpha / r) B A under Hugging Face names; Adam moves A and B by about lr = 1e-2 each
    assert set(split[0]["weights"]) == set(whole["weights"])
    for name, data in whole["weights"].items():
        torch.testing.assert_close(as_tensor(split[0]["weights"][name]), as_tensor(data), atol=1e-5, rtol=0, msg=name)
    want = as_tensor(whole["after"])
    assert not torch.equal(want, as_tensor(whole["log_probs"]))
    torch.testing.assert_close(as_tensor(split[0]["after"]), want, atol=tolerance(want), rtol=0)
    for rank in (0, 1):
        assert split[rank]["after_resume"] == split[rank]["after"]  # the adapters come back from the shards
    exported = split[0]["exported"]  # the checkpoint's Hugging Face export holds the merged weights
    assert set(exported) == set(split[0]["weights"])
    for name, data in split[0]["weights"].items():
        assert exported[name] == data, name


def test_dist_checkpoints_load_at_another_tensor_parallel_size(tmp_path):
    """use_dist_checkpointing: shards written at TP 2 start a TP 1 actor, and shards written at TP 1 a TP 2 one, each
    with the weights converted from Hugging Face at its own size (so the log-probs equal that actor's bit for bit)."""
    tp1_dir, tp2_dir = str(tmp_path / "tp1"), str(tmp_path / "tp2")
    run_ranks(dist_checkpoint_layouts, 2, 2, tp2_dir, "")  # TP 2 writes its two halves
    whole = run_ranks(dist_checkpoint_layouts, 1, 1, tp1_dir, tp2_dir)[0][0]  # TP 1 reads both halves
    assert whole["loaded"] == whole["converted"]
    assert whole["weights"] == whole["want_weights"]
    split = run_ranks(dist_checkpoint_layouts, 2, 2, str(tmp_path / "tp2_again"), tp1_dir)  # TP 2 reads its halves
    for rank in (0, 1):
        assert split[rank][0]["loaded"] == split[rank][0]["converted"]
        assert split[rank][0]["weights"] == split[rank][0]["want_weights"]


def test_tp2_critic_equals_tp1_critic(tmp_path):
    """The megatron critic split over 2 ranks: values, the update and its grad norm as the whole critic's, the value
    head whole on both ranks (one copy in the gathered weights), and a resume from the shards."""
    whole = run_ranks(critic_update, 1, 1, str(tmp_path / "tp1"))[0][0]
    split = run_ranks(critic_update, 2, 2, str(tmp_path / "tp2"))
    want = as_tensor(whole["values"])
    assert want.abs().max() > 0  # the seeded head gives values away from 0
    for rank in (0, 1):
        report = split[rank][0]
        torch.testing.assert_close(as_tensor(report["values"]), want, atol=tolerance(want), rtol=0)
        assert report["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-4)
        # the gathered model has the whole model's shapes: a (1, hidden) head, not one row per rank
        assert report["shapes"] == whole["shapes"] and report["shapes"]["output_layer.value.weight"] == (1, 32)
        for name, data in whole["weights"].items():
            # AdamW's first step moves each weight by about lr = 1e-2 whatever its gradient's size (see above); the
            # key bias' gradient is rounding noise, which Adam turns into a step of any size up to lr
            atol = 1e-2 if name.endswith("linear_qkv.bias") else 1e-5
            torch.testing.assert_close(as_tensor(report["weights"][name]), as_tensor(data), atol=atol, rtol=0, msg=name)
        after = as_tensor(report["after"])
        torch.testing.assert_close(after, as_tensor(whole["after"]), atol=1e-4, rtol=0)
        assert report["after_resume"] == report["after"]  # the shards and the optimizer state came back
    assert split[0][0]["weights"]["output_layer.value.weight"] == split[1][0]["weights"]["output_layer.value.weight"]


def test_sequence_parallel_weights_get_the_gradient_of_the_whole_sequence():
    """The torch.optim adapter with sequence parallelism (megatron-core's layer norms see part of the sequence on
    each rank): their gradients are summed over the tensor-parallel group before the norm and the step."""
    reports = run_ranks(sequence_parallel_step, 2, 2)
    for rank in (0, 1):
        report = reports[rank][0]
        assert report["ok"]
        # summed gradient 1 + 2 = 3 per element, SGD lr 1 from 0: -3 on both ranks (without the sum: -1 and -2)
        assert report["norm_weight"] == [-3.0, -3.0, -3.0]
        # squares: norm weight 3 x 3^2 = 27 (replicated after the sum, once), split 2 x 1^2 on each of 2 ranks = 4,
        # replicated 4 x 2^2 = 16: sqrt(47)
        assert report["grad_norm"] == pytest.approx(47**0.5)
