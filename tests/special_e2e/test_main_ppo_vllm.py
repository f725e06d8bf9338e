"""End-to-end `python -m verl.trainer.main_ppo` with `actor_rollout_ref.rollout.name=vllm`, fp16, both backends.

Each run trains a head_dim-64 model the test writes (vLLM's CPU attention rejects the embedded model's head_dim 16)
for a few steps. The second update of each run is poisoned (the fire drill), so the runs show both sides of the
weight sync: a step with a successful update sends the weights into the engine, a step whose update was skipped
sends nothing. The trainer's separate old-log-prob pass gives the engine-vs-trainer mismatch metrics, which stay at
fp16 rounding only while the engine's weights follow the trainer's. On ``dp`` a restarted run resumes exactly.
"""

import pytest
import torch
from safetensors.torch import load_file

from tests.special_e2e.test_main_ppo import comparable, metrics_of, run_main, train_records
from tests.workers.rollout.vllm_helpers import VLLM_TEST_OVERRIDES, needs_vllm, write_head_dim_64_model

pytestmark = pytest.mark.slow
needs_vllm()

# |p_engine - p_trainer| of a sampled token in fp16: a few 1e-3 (see tests/workers/rollout/test_vllm_rollout.py);
# an engine left on the weights before a lr-1e-2 update would be off by tenths
MAX_PROB_DIFF = 0.03


def run_vllm(tmp_path, strategy: str, *overrides: str, name: str):
    model_dir = tmp_path / "model"
    if not model_dir.exists():
        write_head_dim_64_model(model_dir)
    return run_main(
        tmp_path,
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.rollout.name=vllm",
        f"actor_rollout_ref.actor.strategy={strategy}",
        "actor_rollout_ref.actor.dtype=float16",
        "actor_rollout_ref.actor.optim.lr=1e-2",
        "actor_rollout_ref.actor.optim.initial_loss_scale=1024",  # updates apply from the first step
        "actor_rollout_ref.actor.fault_injection.nonfinite_grad_steps=[2]",
        "actor_rollout_ref.actor.recompute_old_log_prob=true",
        *VLLM_TEST_OVERRIDES,
        *overrides,
        name=name,
    )


def check_syncs(proc, out_dir, num_steps: int) -> list[dict]:
    """The run's steps: weights sent after each step with a successful update, nothing after the poisoned one."""
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "rollout vllm" in proc.stdout + proc.stderr  # the worker built the vLLM rollout
    records = train_records(out_dir)
    assert [r["step"] for r in records] == list(range(1, num_steps + 1))
    # update 2 is poisoned: step 2 applies nothing and sends nothing; every other step sends the weights once
    successful = [1.0, 0.0] + [1.0] * (num_steps - 2)
    assert [r["actor/num_updates_successful"] for r in records] == successful
    assert [r["rollout/weight_syncs"] for r in records] == [1.0, 1.0] + [float(i) for i in range(2, num_steps)]
    assert [r["timing_s/weight_sync"] > 0.0 for r in records] == [bool(s) for s in successful]
    # steps 2 on sample from weights updated at step 1: only synced weights keep the engine this close
    assert all(r["training/rollout_probs_diff_max"] < MAX_PROB_DIFF for r in records)
    assert any("val/score/mean" in r for r in metrics_of(out_dir))  # greedy validation through the engine
    return records


def test_megatron_fp16_run_syncs_the_engine_after_successful_updates_only(tmp_path):
    proc, out_dir = run_vllm(tmp_path, "megatron", "trainer.total_training_steps=3", name="megatron")
    check_syncs(proc, out_dir, 3)


def test_dp_fp16_run_syncs_the_engine_and_resumes_exactly(tmp_path):
    # 4 steps straight, and 2 steps then a restart that resumes from the step-2 checkpoint: the rollout's seed stream,
    # the sync count and the engine's weights (sent again at the load) all continue, so every step's scores,
    # losses, mismatch metrics and the final weights are the same
    saving = ["trainer.save_freq=2"]
    straight, straight_dir = run_vllm(tmp_path, "dp", "trainer.total_training_steps=4", *saving, name="straight")
    expected = check_syncs(straight, straight_dir, 4)
    first, resumed_dir = run_vllm(tmp_path, "dp", "trainer.total_training_steps=2", *saving, name="resumed")
    assert first.returncode == 0, first.stderr[-4000:]
    second, _ = run_vllm(tmp_path, "dp", "trainer.total_training_steps=4", *saving, name="resumed")
    assert second.returncode == 0 and "resumed from" in second.stderr, second.stderr[-4000:]
    assert [comparable(r) for r in train_records(resumed_dir)] == [comparable(r) for r in expected]
    want = load_file(straight_dir / "global_step_4" / "actor" / "model.safetensors")
    got = load_file(resumed_dir / "global_step_4" / "actor" / "model.safetensors")
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


def test_dp_lora_run_syncs_the_merged_weights_into_the_engine(tmp_path):
    # LoRA (rank 8 on every linear layer): the engine runs the plain model, and after each successful update it
    # gets W + (alpha / r) B A; the mismatch stays at fp16 rounding only if those merged weights are the trainer's
    proc, out_dir = run_vllm(
        tmp_path,
        "dp",
        "trainer.total_training_steps=3",
        "actor_rollout_ref.model.lora_rank=8",
        "actor_rollout_ref.model.lora_alpha=16",
        "actor_rollout_ref.actor.optim.lr=5e-2",  # adapters start at B = 0: a large step moves the policy visibly
        name="lora",
    )
    check_syncs(proc, out_dir, 3)
    assert "LoRA:" in proc.stdout + proc.stderr  # the worker built adapters


def test_a_vllm_rollout_group_of_its_own_gets_the_weights_of_every_successful_update(tmp_path):
    # the engine in a rollout worker group of its own (hybrid_engine=false), synchronous (staleness_threshold 0): the
    # rollout group samples each batch after the sync of the previous step's update, so the engine's probabilities
    # stay at fp16 rounding from the trainer's only while the weights of every successful update reach it; the
    # poisoned update 2 sends none, and the version does not move
    proc, out_dir = run_vllm(
        tmp_path,
        "fsdp2",
        "trainer.total_training_steps=4",
        "actor_rollout_ref.hybrid_engine=false",
        "async_training.staleness_threshold=0",
        name="rollout_group",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "rollout rank 0: vllm" in proc.stdout + proc.stderr  # the rollout group built the engine
    records = train_records(out_dir)
    assert [r["actor/num_updates_successful"] for r in records] == [1.0, 0.0, 1.0, 1.0]
    assert [r["fully_async/count/current_param_version"] for r in records] == [1.0, 1.0, 2.0, 3.0]
    assert [r["fully_async/staleness/max"] for r in records] == [0.0] * 4
    assert all(r["training/rollout_probs_diff_max"] < MAX_PROB_DIFF for r in records)
