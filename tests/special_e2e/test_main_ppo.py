"""End-to-end runs of ``python -m verl.trainer.main_ppo`` on the embedded task, each a few steps long."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[2]
SMALL = [
    "data.train_batch_size=4",
    "data.num_val_examples=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.n=2",
    "critic.ppo_mini_batch_size=4",
    "critic.ppo_micro_batch_size_per_gpu=8",
    "trainer.test_freq=2",
    "trainer.progress_bar=false",
    "trainer.plot=false",
    "ray_init.num_cpus=2",
]

pytestmark = pytest.mark.slow


def run_main(tmp_path: Path, *overrides: str, name: str = "run") -> tuple[subprocess.CompletedProcess, Path]:
    out_dir = tmp_path / name
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *SMALL, f"trainer.default_local_dir={out_dir}", *overrides]
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_DEDUP_LOGS": "0"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    return proc, out_dir


def run_main_until_signal(
    tmp_path: Path, *overrides: str, name: str, after_step: int, sig: int = signal.SIGTERM
) -> tuple[subprocess.CompletedProcess, Path]:
    """:func:`run_main`, with ``sig`` sent to the driver's whole process group (as ``timeout`` or a scheduler sends
    it: Ray's daemons, the driver's children, get it too) once ``metrics.jsonl`` has the row of ``after_step``."""
    out_dir = tmp_path / name
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *SMALL, f"trainer.default_local_dir={out_dir}", *overrides]
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_DEDUP_LOGS": "0"}
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    while proc.poll() is None and after_step not in [r["step"] for r in _rows_so_far(out_dir)]:
        time.sleep(0.1)  # polling for the row; the test asserts nothing about time
    os.killpg(proc.pid, sig)
    stdout, stderr = proc.communicate(timeout=600)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr), out_dir


def _rows_so_far(out_dir: Path) -> list[dict]:
    path = out_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.endswith("}")]  # a row being written is not complete yet


def metrics_of(out_dir: Path) -> list[dict]:
    with open(out_dir / "metrics.jsonl") as handle:
        return [json.loads(line) for line in handle]


def train_records(out_dir: Path) -> list[dict]:
    return [r for r in metrics_of(out_dir) if "critic/score/mean" in r]


def test_dp_fp16_run_logs_the_policy_metrics(tmp_path):
    proc, out_dir = run_main(
        tmp_path,
        "trainer.total_training_steps=3",
        "trainer.plot=true",
        "actor_rollout_ref.actor.recompute_old_log_prob=true",
        "trainer.log_val_generations=2",
        "trainer.save_freq=1",
        "trainer.max_actor_ckpt_to_keep=2",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = train_records(out_dir)
    assert [r["step"] for r in records] == [1, 2, 3]
    # validation before training, at step 2 (test_freq) and at the last step: the first 2 samples of each, as text
    samples = [json.loads(line) for line in (out_dir / "val_generations.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [0, 0, 2, 2, 3, 3]
    assert all(s["input"].endswith("=") and isinstance(s["score"], float) for s in samples)  # the task's prompts
    # a checkpoint after every step, the two newest kept
    assert sorted(p.name for p in out_dir.glob("global_step_*")) == ["global_step_2", "global_step_3"]
    assert all("timing_s/old_log_prob" in r for r in records)  # the separate pass, asked for
    # the engine's log-probs against the old-log-prob pass's: same weights, same autocast, so a tiny gap
    assert all(0 <= r["training/rollout_probs_diff_mean"] < 1e-2 for r in records)
    # fp16 from loss scale 2**32: the first update overflows and is skipped, and the policy counts it
    assert records[0]["actor/update_failed"] == 1.0
    assert records[0]["actor/loss_scale"] == 2.0**32
    assert any("val/score/mean" in r for r in metrics_of(out_dir))
    assert (out_dir / "training_curves.png").stat().st_size > 0
    # every update of these 3 steps overflowed at 2**32 (one update per step: 3 attempted, 3 failed, 0 applied)
    assert [r["actor/num_updates_attempted"] for r in records] == [1.0, 2.0, 3.0]
    assert [r["actor/update_failures_total"] for r in records] == [1.0, 2.0, 3.0]
    # exit 0 with an untrained model: the run warns, and says what to change
    assert "no update was applied" in proc.stderr and "optim.initial_loss_scale=65536" in proc.stderr


def test_megatron_fp16_run_with_a_kl_loss(tmp_path):
    proc, out_dir = run_main(
        tmp_path,
        "trainer.total_training_steps=2",
        "actor_rollout_ref.actor.strategy=megatron",
        "actor_rollout_ref.actor.use_kl_loss=true",  # builds the frozen fp16 reference and uses its log-probs
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = train_records(out_dir)
    assert len(records) == 2 and records[0]["actor/update_failed"] == 1.0
    assert "CPU path" in proc.stderr + proc.stdout
    # the reference starts as the actor, so the first step's KL term is exactly zero
    assert records[0]["actor/kl_loss"] == 0.0 and "timing_s/ref" in records[0]
    # one on-policy update per step: no separate old-log-prob pass, and the ratio is exactly 1
    assert "timing_s/old_log_prob" not in records[0] and records[-1]["actor/ppo_kl"] == 0.0


# a loss scale at which fp16 updates do happen from the first step, so that a resume has real state to restore
UPDATING = ["actor_rollout_ref.actor.optim.initial_loss_scale=1024", "trainer.test_freq=-1", "trainer.save_freq=3"]
NOT_COMPARED = ("timing_s/", "timing_per_token_ms/", "perf/")  # wall-clock figures differ run to run


def comparable(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(NOT_COMPARED)}


def test_resume_is_exact_and_leaves_no_debris_or_duplicate_rows(tmp_path):
    straight, straight_dir = run_main(tmp_path, "trainer.total_training_steps=6", *UPDATING, name="a")
    assert straight.returncode == 0, straight.stderr[-4000:]
    # Preempted: SIGTERM once step 1 is logged. The run finishes the step in progress (step 2 here; on a faster
    # machine the signal may land before step 2 starts, or during step 3), saves it and exits 5 (EXIT_PREEMPTED).
    first, resumed_dir = run_main_until_signal(
        tmp_path, "trainer.total_training_steps=6", *UPDATING, name="b", after_step=1
    )
    assert first.returncode == 5, first.stderr[-4000:]
    (checkpoint,) = sorted(resumed_dir.glob("global_step_*"))  # one save: the signal's (and save_freq's, if 3)
    stopped_at = int(checkpoint.name.split("_")[-1])
    assert 1 <= stopped_at < 6
    assert "received SIGTERM: finishing step" in first.stderr and "send again to stop at once" in first.stderr
    assert f"Stopped on SIGTERM after step {stopped_at}" in first.stderr and "Traceback" not in first.stderr
    # What a kill leaves: rows of steps logged after the last checkpoint, and an interrupted save's directory.
    with open(resumed_dir / "metrics.jsonl", "a") as handle:
        handle.write(json.dumps({"step": stopped_at + 1, "critic/score/mean": -1.0}) + "\n")
    debris = resumed_dir / f".global_step_{stopped_at + 1}.tmp-killed"
    (debris / "actor").mkdir(parents=True)
    # the same command resumes
    second, _ = run_main(tmp_path, "trainer.total_training_steps=6", *UPDATING, name="b")
    assert second.returncode == 0, second.stderr[-4000:]
    assert f"resumed from {checkpoint} at step {stopped_at}" in second.stderr and not debris.exists()
    resumed, expected = train_records(resumed_dir), train_records(straight_dir)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5, 6]  # each step once: the killed attempt's row is gone
    assert any(r["actor/update_failed"] == 0.0 for r in expected)  # updates happened: the state mattered
    # Every random stream (sampler, data order, mini-batch shuffle, torch's RNG) resumes where it stopped: the
    # resumed run's scores, losses and counters equal the uninterrupted run's, and so do its final weights.
    assert [comparable(r) for r in resumed] == [comparable(r) for r in expected]
    want = load_file(straight_dir / "global_step_6" / "actor" / "model.safetensors")
    got = load_file(resumed_dir / "global_step_6" / "actor" / "model.safetensors")
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


def test_rollout_correction_weights_and_rejects_and_reports_the_mismatch(tmp_path):
    proc, out_dir = run_main(
        tmp_path,
        "trainer.total_training_steps=2",
        "trainer.test_freq=-1",
        "actor_rollout_ref.actor.strategy=dp",  # the hf rollout samples from a plain Hugging Face actor
        "actor_rollout_ref.rollout.name=hf",  # generation from the fp32 weights, the trainer under fp16 autocast
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_rs=sequence",
        "algorithm.rollout_correction.rollout_rs_threshold=1.5",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = train_records(out_dir)
    for record in records:
        assert "timing_s/old_log_prob" in record  # the weights pi_old / mu need the old-log-prob pass
        assert 0 < record["training/rollout_probs_diff_mean"] < 0.05 and record["rollout_corr/k3_kl"] >= 0
        # fp16 against fp32 stays within a few percent: weights near 1, none truncated at 2, none rejected at 1.5
        assert abs(record["rollout_corr/rollout_is_mean"] - 1) < 0.05
        assert record["rollout_corr/rollout_is_ratio_fraction_high"] == 0
        assert record["rollout_corr/rollout_rs_masked_fraction"] == 0
        assert record["rollout_corr/rollout_rs_seq_sum_k1_mean"] is not None  # "sequence" is verl's seq_sum_k1


def test_a_custom_counter_reduces_as_its_handler_declares(tmp_path):
    # Two updates per step (mini-batch 2 of a batch of 4), fp32 (nothing absorbed), update 2 poisoned: step 1 makes
    # updates 1 (applied) and 2 (failed), so the example's running count is 1 after step 1, not the mean 0.5.
    proc, out_dir = run_main(
        tmp_path,
        "trainer.total_training_steps=2",
        "trainer.test_freq=-1",
        "actor_rollout_ref.actor.dtype=float32",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.update_failure_policy="
        "{name: skip_budget, module: examples.update_failure_policy.skip_budget_handler}",
        "actor_rollout_ref.actor.fault_injection.nonfinite_grad_steps=[2]",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = train_records(out_dir)
    assert [r["actor/update_failures_unabsorbed_total"] for r in records] == [1.0, 1.0]
    assert [r["actor/update_failed"] for r in records] == [1.0, 0.0]  # max over the step's updates
    # over the run: 4 updates attempted, 1 skipped, so 3 applied
    assert records[-1]["actor/num_updates_attempted"] == 4.0 and records[-1]["actor/update_failures_total"] == 1.0


def test_fire_drill_under_strict_exits_nonzero_with_the_message(tmp_path):
    proc, out_dir = run_main(
        tmp_path,
        "trainer.total_training_steps=4",
        "actor_rollout_ref.actor.dtype=float32",
        "actor_rollout_ref.actor.update_failure_policy=strict",
        "actor_rollout_ref.actor.fault_injection.nonfinite_grad_steps=[2]",
    )
    assert proc.returncode == 1
    assert [r["step"] for r in train_records(out_dir)] == [1]  # step 2's update stopped the run: no row of its own
    # what the user reads: the step, the cause, once, and that there is no checkpoint to resume from
    assert "actor update failed at step 2: non-finite gradient norm" in proc.stderr
    assert proc.stderr.count("Training stopped by the update-failure policy") == 1
    assert "Last good checkpoint: none" in proc.stderr


def test_fire_drill_under_fp16_policy_stops_at_its_limit(tmp_path):
    # fp32 (no loss scaler: nothing is absorbed), limit 2: steps 2 and 3 are skipped, step 4 is the 3rd consecutive
    # failure and stops the run.
    proc, out_dir = run_main(
        tmp_path,
        "trainer.total_training_steps=6",
        "trainer.test_freq=-1",
        "actor_rollout_ref.actor.dtype=float32",
        "actor_rollout_ref.actor.update_failure_policy={name: fp16_warn_and_count, max_consecutive_failures: 2}",
        "actor_rollout_ref.actor.fault_injection.nonfinite_grad_steps=[2,3,4,5]",
    )
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert "actor update failed at step 4" in proc.stderr
    assert "max_consecutive_failures=2" in proc.stderr
    assert [r["actor/update_failed"] for r in train_records(out_dir)] == [0.0, 1.0, 1.0]


def test_a_nan_reward_in_fp16_stops_at_the_first_update_naming_the_inputs(tmp_path):
    # a scorer that returns NaN for every sample: GRPO's advantages come out NaN, and the actor's check of its
    # inputs stops the run at update 1 (no loss-scale back-off from 2**32 to 1 first), naming where the NaN came from
    reward_file = tmp_path / "nan_reward.py"
    reward_file.write_text(
        "def nan_score(data_source, solution_str, ground_truth, extra_info=None):\n    return float('nan')\n"
    )
    proc, out_dir = run_main(
        tmp_path,
        "trainer.total_training_steps=4",
        "trainer.test_freq=-1",
        f"custom_reward_function.path={reward_file}",
        "custom_reward_function.name=nan_score",
    )
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert "actor update failed at step 1: non-finite inputs to the loss (token_level_rewards on" in proc.stderr
    assert "advantages on" in proc.stderr and "loss_scale=4.29497e+09" in proc.stderr
    assert "fp16_warn_and_count stops at once" in proc.stderr


def test_bad_config_fails_before_ray_starts(tmp_path):
    proc, _ = run_main(tmp_path, "actor_rollout_ref.actor.update_failure_policy=strikt")
    assert proc.returncode == 2
    assert "unknown update-outcome handler 'strikt'" in proc.stderr
    assert "Started a local Ray instance" not in proc.stderr + proc.stdout


def test_unknown_key_from_the_command_line_is_a_config_error(tmp_path):
    # Hydra rejects the key itself (exit 1 in plain Hydra); the entry point reports it as the config error it is.
    proc, _ = run_main(tmp_path, "actor_rollout_ref.actor.update_failure_polcy=strict")
    assert proc.returncode == 2
    assert "update_failure_polcy" in proc.stderr


@pytest.mark.parametrize("strategy", ["dp", "megatron"])
def test_ppo_with_a_critic(tmp_path, strategy):
    proc, out_dir = run_main(
        tmp_path,
        "trainer.total_training_steps=2",
        "trainer.test_freq=-1",
        "algorithm.adv_estimator=gae",
        f"actor_rollout_ref.actor.strategy={strategy}",
        "trainer.critic_warmup=2",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = train_records(out_dir)
    assert len(records) == 2
    # verl's rule: with critic_warmup=2 the actor starts at step 2; step 1 trains only the critic
    assert "actor/pg_loss" not in records[0] and "actor/pg_loss" in records[1]
    for record in records:
        assert "critic/vf_loss" in record and "critic/update_failed" in record
    assert records[0]["critic/loss_scale"] == 2.0**32  # the critic trains in fp16 too, with its own scaler


def test_critic_fire_drill_under_strict_names_the_critic(tmp_path):
    proc, out_dir = run_main(
        tmp_path,
        "trainer.total_training_steps=3",
        "algorithm.adv_estimator=gae",
        "critic.dtype=float32",
        "critic.update_failure_policy=strict",
        "critic.fault_injection.nonfinite_grad_steps=[2]",
    )
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert [r["step"] for r in train_records(out_dir)] == [1]  # the critic's step-2 update stopped the run
    assert "critic update failed at step 2" in proc.stderr
    assert "critic.update_failure_policy" in proc.stderr
