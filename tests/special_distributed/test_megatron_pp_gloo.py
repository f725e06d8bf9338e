"""megatron-core pipeline stages on 2 gloo CPU ranks against the same model whole on one rank.

The tiny Qwen2 (2 layers, tied embeddings) splits into two stages: the embedding and layer 0 on the first, layer 1,
the final norm and a copy of the embedding as the output layer on the second (the tie kept by summing the two
copies' gradients, :mod:`verl.utils.amp_optimizer`). Each stage runs exactly the operations the whole model runs on
its layers, in the same order, and the hidden states cross between the stages in float32: log-probs, the gradient
norm and the updated weights match the whole model to float32 rounding (the one reduction that differs is the norm,
summed per stage and then over the stages).
"""

from pathlib import Path

import pytest
import torch

from tests.special_distributed.megatron_tp_workers import (
    critic_update,
    dist_checkpoint_layouts,
    fused_update,
    lora_update,
    pipeline_decode,
    update_and_checkpoint,
)
from tests.special_distributed.test_megatron_tp_gloo import as_tensor, run_ranks, tolerance
from verl.utils.checkpoint import load_weights

STAGES = (1, 2)  # tensor-parallel size 1, two pipeline stages


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One run of the whole model on a world of one, one in two stages on two ranks (with a checkpoint)."""
    whole = run_ranks(update_and_checkpoint, 1, 1, "")[0][0]
    ckpt = str(tmp_path_factory.mktemp("pp2_ckpt"))
    staged = run_ranks(update_and_checkpoint, 2, STAGES, ckpt)
    return whole, {rank: report[0] for rank, report in staged.items()}, ckpt


def test_two_stages_give_the_whole_models_log_probs_and_entropy_on_both_ranks(runs):
    whole, staged, _ = runs
    for key in ("log_probs", "entropy"):
        want = as_tensor(whole[key])
        for rank in (0, 1):
            # the same operations in the same order: equal up to float32 rounding
            torch.testing.assert_close(as_tensor(staged[rank][key]), want, atol=1e-6, rtol=0)


def test_two_stages_update_like_the_whole_model(runs):
    whole, staged, _ = runs
    # the norm sums each stage's squares, then the stages': the same number on both ranks; the embedding counted
    # once although both stages hold a copy
    assert staged[0]["grad_norm"] == staged[1]["grad_norm"]
    assert staged[0]["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-5)
    assert set(staged[0]["weights"]) == set(whole["weights"])
    for name, data in whole["weights"].items():
        # the key bias's gradient is rounding noise that Adam turns into a step of any size up to lr (see the
        # tensor-parallel test); every other weight moves by the same ~lr = 1e-2 as in the whole model
        atol = 1e-2 if name.endswith("k_proj.bias") else 1e-5
        for rank in (0, 1):
            torch.testing.assert_close(as_tensor(staged[rank]["weights"][name]), as_tensor(data), atol=atol, rtol=0)
    # both copies of the tied embedding took the same step: the whole model's one embedding after the update
    torch.testing.assert_close(as_tensor(staged[1]["after"]), as_tensor(whole["after"]), atol=1e-5, rtol=0)


def test_two_stages_with_the_fused_head_equal_the_plain_whole_run(runs):
    # model.use_fused_kernels: the last stage's output layer computes the log-probs chunk by chunk (the first stage
    # has none); the plain whole run is the reference, within the chunked log-softmax's reordering bound
    whole, _, _ = runs
    fused = {rank: report[0] for rank, report in run_ranks(fused_update, 2, STAGES).items()}
    for key in ("log_probs", "entropy", "after"):
        want = as_tensor(whole[key])
        for rank in (0, 1):
            torch.testing.assert_close(as_tensor(fused[rank][key]), want, atol=tolerance(want), rtol=0, msg=key)
    assert fused[0]["grad_norm"] == fused[1]["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-4)
    for name, data in whole["weights"].items():
        atol = 1e-2 if name.endswith("k_proj.bias") else 1e-5  # see test_two_stages_update_like_the_whole_model
        torch.testing.assert_close(as_tensor(fused[0]["weights"][name]), as_tensor(data), atol=atol, rtol=0, msg=name)


def test_two_stage_checkpoint_holds_a_shard_per_stage_and_the_whole_weights(runs):
    _, staged, ckpt = runs

    assert sorted(p.name for p in Path(ckpt).iterdir() if p.name.startswith("mp_rank")) == [
        "mp_rank_00_000",
        "mp_rank_00_001",
    ]
    first = load_weights(Path(ckpt) / "mp_rank_00_000" / "model.safetensors")
    last = load_weights(Path(ckpt) / "mp_rank_00_001" / "model.safetensors")
    # each stage under its own names: layer 0 on both, the embedding on the first, the output layer on the last
    assert "embedding.word_embeddings.weight" in first and "output_layer.weight" not in first
    assert "output_layer.weight" in last and "embedding.word_embeddings.weight" not in last
    torch.testing.assert_close(last["output_layer.weight"], first["embedding.word_embeddings.weight"])
    whole = load_weights(Path(ckpt) / "model.safetensors")
    torch.testing.assert_close(
        whole["decoder.layers.1.mlp.linear_fc2.weight"], last["decoder.layers.0.mlp.linear_fc2.weight"]
    )
    assert "output_layer.weight" not in whole  # tied: one matrix in the whole model
    for rank in (0, 1):
        assert staged[rank]["after_resume"] == staged[rank]["after"]
        assert staged[rank]["steps_after_resume"] == 1
    exported = staged[0]["exported"]
    assert set(exported) == set(staged[0]["weights"])
    for name, data in staged[0]["weights"].items():
        assert exported[name] == data, name


def test_two_stages_decode_the_whole_models_tokens():
    whole = run_ranks(pipeline_decode, 1, 1)[0][0]
    staged = run_ranks(pipeline_decode, 2, STAGES)
    for rank in (0, 1):
        assert staged[rank][0]["tokens"] == whole["tokens"]
        torch.testing.assert_close(as_tensor(staged[rank][0]["logits"]), as_tensor(whole["logits"]), atol=1e-5, rtol=0)


def test_dist_checkpoints_load_into_two_stages_and_back(tmp_path):
    """use_dist_checkpointing: a checkpoint written by the whole model starts a two-stage actor, and one written in two
    stages starts a whole one, each with the weights converted from Hugging Face in its own layout (the tied
    embedding's copy on the last stage included)."""
    whole_dir, staged_dir = str(tmp_path / "whole"), str(tmp_path / "staged")
    run_ranks(dist_checkpoint_layouts, 1, 1, whole_dir, "")
    staged = run_ranks(dist_checkpoint_layouts, 2, STAGES, staged_dir, whole_dir)
    for rank in (0, 1):
        assert staged[rank][0]["loaded"] == staged[rank][0]["converted"]
        assert staged[rank][0]["weights"] == staged[rank][0]["want_weights"]
    whole = run_ranks(dist_checkpoint_layouts, 1, 1, str(tmp_path / "whole_again"), staged_dir)[0][0]
    assert whole["loaded"] == whole["converted"]
    assert whole["weights"] == whole["want_weights"]


def test_two_stage_lora_equals_the_whole_models_lora(tmp_path):
    # each stage adapts its own layers: the same log-probs, grad norm and merged weights as the whole model's
    # adapters; the base model (the reference, adapters off) never moves; the adapters come back from the shards
    whole = run_ranks(lora_update, 1, 1, "")[0][0]
    staged = {rank: report[0] for rank, report in run_ranks(lora_update, 2, STAGES, str(tmp_path)).items()}
    for rank in (0, 1):
        torch.testing.assert_close(
            as_tensor(staged[rank]["log_probs"]), as_tensor(whole["log_probs"]), atol=1e-6, rtol=0
        )
        assert staged[rank]["base_moved"] == 0.0
        assert staged[rank]["after_resume"] == staged[rank]["after"]
    assert staged[0]["grad_norm"] == staged[1]["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-5)
    assert set(staged[0]["weights"]) == set(whole["weights"])
    for name, data in whole["weights"].items():
        torch.testing.assert_close(as_tensor(staged[0]["weights"][name]), as_tensor(data), atol=1e-5, rtol=0, msg=name)
    torch.testing.assert_close(as_tensor(staged[1]["after"]), as_tensor(whole["after"]), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "layout",
    [
        pytest.param((2, 2), id="tp2-pp2"),  # each stage split over 2 tensor-parallel ranks
        pytest.param((1, 2), id="pp2-dp2"),  # two data-parallel copies of a two-stage model
    ],
)
def test_four_ranks_in_stages_update_like_the_whole_model(runs, layout):
    # megatron-core numbers the stages outermost: with 4 ranks the stages are not neighbouring ranks, and a
    # data-parallel or tensor-parallel group lies inside each stage; every rank must still agree with the whole model
    whole, _, _ = runs
    reports = {rank: report[0] for rank, report in run_ranks(update_and_checkpoint, 4, layout, "").items()}
    for rank, report in reports.items():
        want = as_tensor(whole["log_probs"])
        torch.testing.assert_close(as_tensor(report["log_probs"]), want, atol=tolerance(want), rtol=0, msg=str(rank))
        assert report["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-4)
        for name, data in whole["weights"].items():
            atol = 1e-2 if name.endswith("k_proj.bias") else 1e-5
            torch.testing.assert_close(as_tensor(report["weights"][name]), as_tensor(data), atol=atol, rtol=0)


def test_a_two_stage_critic_equals_the_whole_critic(tmp_path):
    """The megatron critic in two stages: values, the update and its grad norm as the whole critic's, the value head
    on the last stage and once in the gathered weights, the embedding no longer tied to anything, and a resume."""
    whole = run_ranks(critic_update, 1, 1, str(tmp_path / "whole"))[0][0]
    staged = run_ranks(critic_update, 2, STAGES, str(tmp_path / "staged"))
    want = as_tensor(whole["values"])
    assert want.abs().max() > 0  # the seeded head gives values away from 0
    for rank in (0, 1):
        report = staged[rank][0]
        torch.testing.assert_close(as_tensor(report["values"]), want, atol=1e-6, rtol=0)
        assert report["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-5)
        assert report["shapes"] == whole["shapes"] and report["shapes"]["output_layer.value.weight"] == (1, 32)
        for name, data in whole["weights"].items():
            atol = 1e-2 if name.endswith("linear_qkv.bias") else 1e-5  # see test_two_stages_update_like_the_whole_model
            torch.testing.assert_close(as_tensor(report["weights"][name]), as_tensor(data), atol=atol, rtol=0, msg=name)
        torch.testing.assert_close(as_tensor(report["after"]), as_tensor(whole["after"]), atol=1e-5, rtol=0)
        assert report["after_resume"] == report["after"]
