"""End-to-end runs of ``python -m verl.trainer.main_ppo`` with verl's algorithm keys, on the embedded task."""

import json
import sys

import pytest

from tests.special_e2e.test_main_ppo import run_main, train_records

pytestmark = pytest.mark.slow


def test_one_gspo_step_with_verl_spelling(tmp_path):
    # verl's scripts name the loss as policy_loss.loss_mode; fp32 so that the one update is applied, not skipped
    proc, out_dir = run_main(
        tmp_path,
        "trainer.total_training_steps=1",
        "trainer.test_freq=-1",
        "actor_rollout_ref.actor.dtype=float32",
        "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    (record,) = train_records(out_dir)
    assert record["actor/num_updates_successful"] == 1.0
    assert record["actor/grad_norm"] > 0
    assert "actor/pg_clipfrac" in record  # gspo's metrics, under the actor's prefix


def test_bypass_mode_trains_without_an_old_log_prob_pass(tmp_path):
    # verl's bypass_pg_is preset: REINFORCE weighted by truncated sequence ratios pi_theta / pi_rollout, two updates
    # per step, so that without bypass mode the step would need the separate old-log-prob pass
    rc = "algorithm.rollout_correction"
    proc, out_dir = run_main(
        tmp_path,
        "trainer.total_training_steps=2",
        "trainer.test_freq=-1",
        "actor_rollout_ref.actor.dtype=float32",
        "actor_rollout_ref.actor.ppo_epochs=2",
        "actor_rollout_ref.actor.use_rollout_log_probs=true",
        f"{rc}.bypass_mode=true",
        f"{rc}.loss_type=reinforce",
        f"{rc}.rollout_is=sequence",
        f"{rc}.rollout_rs=seq_mean_k3",
        f"{rc}.rollout_rs_threshold=0.01",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = train_records(out_dir)
    assert len(records) == 2
    for record in records:
        assert "timing_s/old_log_prob" not in record
        assert record["actor/num_updates_successful"] >= 1
        # the naive rollout is the actor's own forward: the sequence weights start at 1 and move with the update
        assert 0.5 < record["rollout_corr/rollout_is_mean"] <= 2.0
        assert "rollout_corr/rollout_rs_seq_mean_k3_mean" in record and "rollout_corr/ppl_ratio" in record


def test_dapo_example_drops_uniform_groups_and_its_reward_rises(tmp_path):
    # examples/dapo_trainer/run_tiny_fp16_dp.sh as written (60 steps of 16 prompts), with the outputs redirected
    import os
    import subprocess

    from tests.special_e2e.test_main_ppo import REPO, metrics_of

    out_dir = tmp_path / "dapo"
    script = REPO / "examples" / "dapo_trainer" / "run_tiny_fp16_dp.sh"
    overrides = [
        f"trainer.default_local_dir={out_dir}",
        "trainer.test_freq=-1",
        "trainer.progress_bar=false",
        "trainer.plot=false",
        "ray_init.num_cpus=2",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    proc = subprocess.run(
        ["bash", str(script), *overrides], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [r for r in metrics_of(out_dir) if "critic/score/mean" in r]
    assert len(records) == 60
    # uniform groups were dropped, and the steps that dropped some generated again to refill the batch
    dropped = sum(r["train/num_groups_dropped"] for r in records)
    rounds = sum(r["train/num_gen_batches"] for r in records)
    assert dropped > 0 and rounds > len(records)
    assert all(1 <= r["train/num_gen_batches"] <= 10 for r in records)
    # every step still trains on exactly 16 groups of 4, the surplus cut off: one mini-batch of 16 prompts, so
    # one update per step (fewer rows would not split into it, more would make two)
    assert [r["actor/num_updates_attempted"] for r in records] == [float(step) for step in range(1, 61)]
    # the reward rises: the mean training score of the last 10 steps clearly above that of the first 10
    first, last = (sum(r["critic/score/mean"] for r in part) / 10 for part in (records[:10], records[-10:]))
    assert last > first + 0.1, (first, last)


def test_a_torch_profile_of_step_2_labels_every_actor_pass(tmp_path):
    # verl's profiling keys with the torch tool (CPU): the actor worker writes one Chrome trace for step 2, and
    # the driver names it; step 1 is not profiled
    save_path = tmp_path / "profile"
    proc, _ = run_main(
        tmp_path,
        "trainer.total_training_steps=2",
        "trainer.test_freq=-1",
        "global_profiler.tool=torch",
        "global_profiler.steps=[2]",
        f"global_profiler.save_path={save_path}",
        "actor_rollout_ref.actor.profiler.enable=true",
        "actor_rollout_ref.actor.profiler.all_ranks=true",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    trace = save_path / "actor_rollout_ref_rank0_step2.json"
    assert sorted(p.name for p in save_path.iterdir()) == [trace.name]
    assert f"profile of step 2: {trace}" in proc.stderr
    names = {event.get("name") for event in json.loads(trace.read_text())["traceEvents"]}
    assert {"gen", "update_actor"} <= names
