"""Asynchronous training end to end: main_ppo with a rollout worker group of its own, on the embedded task.

One step off policy (``hybrid_engine=false``), verl's fully async config, a strict policy, a resume, and a rollout
worker killed mid-run. Each in-process run starts Ray (``main_ppo.run``), stops it after, and reads its
``metrics.jsonl``. fp32 makes every update apply (no loss scale backing off), so the weights change at every step.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import ray

from verl.trainer.main_ppo import EXIT_OK, EXIT_POLICY_STOP, run
from verl.workers.config import compose_omegaconf

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
FP32 = ["actor_rollout_ref.actor.dtype=float32", "critic.dtype=float32"]


def train(tmp_path, *overrides: str, name: str = "out", config_name: str = "ppo_trainer") -> tuple[int, list[dict]]:
    out = tmp_path / name
    config = compose_omegaconf(
        [
            f"trainer.default_local_dir={out}",
            "trainer.logger=[jsonl]",
            "trainer.plot=false",
            "trainer.progress_bar=false",
            "trainer.test_freq=-1",
            "trainer.val_before_train=false",
            *overrides,
        ],
        config_name=config_name,
    )
    try:
        code = run(config)
    finally:
        ray.shutdown()  # a fresh Ray instance for each run (the workers of a finished run stay until then)
    path = out / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return code, [row for row in rows if "critic/score/mean" in row]


def test_one_step_off_trains_each_batch_one_version_behind(tmp_path):
    code, rows = train(tmp_path, "actor_rollout_ref.hybrid_engine=false", "trainer.total_training_steps=4", *FP32)
    assert code == EXIT_OK
    assert [row["actor/num_updates_successful"] > 0 for row in rows] == [True] * 4
    # batch 1 is sampled by the starting weights and trained by them; batch t > 1 is sampled by the weights of
    # update t-2 (the rollout group's version when batch t-1 was taken) and trained at version t-1: stale by 1.
    # The staleness comes from the weight_version the rollout workers put on every row.
    assert [row["fully_async/staleness/max"] for row in rows] == [0.0, 1.0, 1.0, 1.0]
    assert [row["fully_async/staleness/mean"] for row in rows] == [0.0, 1.0, 1.0, 1.0]
    assert [row["fully_async/count/current_param_version"] for row in rows] == [1.0, 2.0, 3.0, 4.0]
    # the embedded run: 16 prompts x 4 responses a step; batches 2-4 were stale
    assert rows[-1]["fully_async/count/stale_samples_processed"] == 3 * 16
    assert rows[-1]["fully_async/count/stale_trajectory_processed"] == 3 * 64
    for row in rows:
        assert 0.0 <= row["trainer/idle_ratio"] <= 1.0 and 0.0 <= row["rollouter/idle_ratio"] <= 1.0
        assert row["timing_s/sync_rollout_weights"] > 0  # every update applied: weights sent after each


def test_with_staleness_threshold_0_the_rollout_group_reproduces_the_colocated_run(tmp_path):
    # Same seed, same backend (dp, fp32): the rollout group's rank 0 samples with the seed the actor's rank 0 uses,
    # and receives the trainer's weights after every update before it samples again, so each step sees the same
    # responses, scores and losses as the run whose rollout lives in the actor worker.
    common = ["trainer.total_training_steps=3", "actor_rollout_ref.actor.strategy=dp", *FP32]
    code, colocated = train(tmp_path, *common, name="colocated")
    assert code == EXIT_OK
    separate_sync = ["actor_rollout_ref.hybrid_engine=false", "async_training.staleness_threshold=0"]
    code, separate = train(tmp_path, *separate_sync, *common, name="separate")
    assert code == EXIT_OK
    assert [row["fully_async/staleness/max"] for row in separate] == [0.0, 0.0, 0.0]
    for key in ("critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/grad_norm"):
        assert [row[key] for row in separate] == pytest.approx([row[key] for row in colocated], rel=1e-6), key


def test_strict_policy_stops_the_one_step_off_run_at_the_first_failed_update(tmp_path):
    # fp16 from a loss scale of 2**32: the first update overflows, and strict stops there
    code, rows = train(
        tmp_path,
        "actor_rollout_ref.hybrid_engine=false",
        "trainer.total_training_steps=4",
        "actor_rollout_ref.actor.update_failure_policy=strict",
    )
    assert code == EXIT_POLICY_STOP
    assert rows == []  # stopped inside step 1, before its metrics were logged


def test_a_resumed_one_step_off_run_continues_from_the_checkpoint_version(tmp_path):
    one_step_off = ["actor_rollout_ref.hybrid_engine=false", "trainer.save_freq=2", *FP32]
    code, first = train(tmp_path, *one_step_off, "trainer.total_training_steps=2", name="run")
    assert code == EXIT_OK and len(first) == 2
    code, rows = train(tmp_path, *one_step_off, "trainer.total_training_steps=4", name="run")
    assert code == EXIT_OK
    resumed = rows[-2:]  # steps 3 and 4 (metrics.jsonl keeps steps 1-2 of the first run)
    # the batch in flight at the save is dropped and generated again by the checkpoint's weights (version 2): not
    # stale; the next is one step off again
    assert [row["fully_async/staleness/max"] for row in resumed] == [0.0, 1.0]
    assert [row["fully_async/count/current_param_version"] for row in resumed] == [3.0, 4.0]
    # batch 2 was stale before the save (16 prompts); batch 4 after the resume
    assert resumed[-1]["fully_async/count/stale_samples_processed"] == 2 * 16


def test_fully_async_syncs_every_trigger_steps_within_the_staleness_bound(tmp_path):
    # verl's fully async config with a sync every 2 local updates and threshold 0.5: floor(1.5 x 2) = 3 batches a
    # version, so one batch of each window is sampled a version behind (see test_rollout_source for the schedule)
    code, rows = train(
        tmp_path,
        "trainer.total_training_steps=6",
        "async_training.trigger_parameter_sync_step=2",
        "async_training.staleness_threshold=0.5",
        "async_training.partial_rollout=false",
        *FP32,
        config_name="fully_async_ppo_trainer",
    )
    assert code == EXIT_OK
    assert [row["fully_async/count/current_param_version"] for row in rows] == [0.0, 1.0, 1.0, 2.0, 2.0, 3.0]
    assert [row["fully_async/staleness/max"] for row in rows] == [0.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    assert all(row["fully_async/partial/total_partial_num"] == 0.0 for row in rows)
    # a local update is require_batches (1) x ppo_mini_batch_size (the embedded run's 16) prompts, 4 responses each:
    # two stale batches
    assert rows[-1]["fully_async/count/stale_trajectory_processed"] == 2 * 16 * 4


def test_fully_async_with_partial_rollouts_keeps_every_sample_within_one_version(tmp_path):
    # partial rollouts: weights reach the rollout workers while they generate, and the responses in progress go on
    # with them. Whether a sync lands mid-response depends on timing; what holds in every case: one sync per 2
    # steps, so no response spans more than one switch and no sample is older than one version
    code, rows = train(
        tmp_path,
        "trainer.total_training_steps=8",
        "async_training.trigger_parameter_sync_step=2",
        "async_training.staleness_threshold=0.5",
        *FP32,
        config_name="fully_async_ppo_trainer",
    )
    assert code == EXIT_OK and len(rows) == 8
    assert max(row["fully_async/partial/max_partial_span"] for row in rows) <= 1.0
    assert max(row["fully_async/staleness/max"] for row in rows) <= 1.0
    assert rows[-1]["fully_async/count/current_param_version"] == 4.0


def test_a_killed_rollout_worker_is_named_and_a_restart_finishes_the_run(tmp_path):
    # the 4th generation call meets a dead rollout rank 0; with a checkpoint every 2 steps and one restart allowed,
    # the run rebuilds every group, resumes from the last checkpoint and finishes
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "tests.special_e2e.main_ppo_killing_a_worker",
        "rollout:0:generate_sequences:4",
        "actor_rollout_ref.hybrid_engine=false",
        "trainer.total_training_steps=5",
        "trainer.save_freq=2",
        "trainer.max_restarts=1",
        "trainer.logger=[jsonl]",
        "trainer.plot=false",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        f"trainer.default_local_dir={out}",
        *FP32,
    ]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == EXIT_OK, proc.stderr[-3000:]
    assert "rollout rank 0" in proc.stderr
    assert proc.stderr.count("Restart 1 of trainer.max_restarts=1") == 1
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert sorted(row["step"] for row in rows if "critic/score/mean" in row) == [1, 2, 3, 4, 5]
