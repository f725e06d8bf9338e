"""A rank killed while an FSDP2 checkpoint is being written, in a real run (issue 31's sharded-checkpoint guarantee).

Two fsdp2 ranks on this machine (gloo), a checkpoint every 2 steps. The entry point
``tests/special_e2e/main_ppo_killing_a_worker.py`` SIGKILLs actor rank 1 as the driver asks for the step-4 save:
rank 0 starts writing its shards of torch.distributed.checkpoint and waits in the save's collectives for a rank that
is gone. The driver must report the death by rank, leave the step-2 checkpoint as the newest complete one, remove the
half-written step-4 directory, and, with a restart allowed, resume from step 2 and finish.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.special_e2e.test_main_ppo import SMALL

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def run_killing(tmp_path: Path, kill: str, *overrides: str) -> tuple[subprocess.CompletedProcess, Path]:
    out_dir = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "tests.special_e2e.main_ppo_killing_a_worker",
        kill,
        *SMALL,
        "actor_rollout_ref.actor.strategy=fsdp2",
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",  # 4 prompts x 2 responses over 2 ranks
        "trainer.test_freq=-1",
        "trainer.save_freq=2",
        "trainer.total_training_steps=4",
        f"trainer.default_local_dir={out_dir}",
        *overrides,
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_DEDUP_LOGS": "0"}
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    return proc, out_dir


def test_a_rank_killed_during_a_sharded_save_resumes_from_the_last_complete_checkpoint(tmp_path):
    proc, out_dir = run_killing(tmp_path, "actor_rollout_ref:1:save_checkpoint:2", "trainer.max_restarts=1")
    assert proc.returncode == 0, proc.stderr[-4000:]
    # the death is named by group and rank
    assert "worker actor_rollout_ref rank 1" in proc.stderr
    # no half-written directory is left, and the step-4 checkpoint the restart wrote is complete
    assert sorted(p.name for p in out_dir.iterdir() if p.name.startswith((".global_step", "global_step"))) == [
        "global_step_2",
        "global_step_4",
    ]
    assert (out_dir / "global_step_4" / "trainer_state.pt").is_file()
    # one restart, from the step-2 checkpoint: steps 1-2 by the first workers, 3-4 (once each) after the restart
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    restarts = [(r["step"], r["trainer/restarts"]) for r in rows if "critic/score/mean" in r]
    assert restarts == [(1, 0.0), (2, 0.0), (3, 1.0), (4, 1.0)]


def test_without_a_restart_the_run_stops_and_the_last_complete_checkpoint_is_the_one_kept(tmp_path):
    proc, out_dir = run_killing(tmp_path, "actor_rollout_ref:1:save_checkpoint:2")
    assert proc.returncode == 4, proc.stderr[-4000:]  # EXIT_WORKER_DIED
    assert "A worker died: role actor_rollout_ref, rank 1" in proc.stderr
    assert "Last good checkpoint:" in proc.stderr and "global_step_2" in proc.stderr
    assert sorted(p.name for p in out_dir.iterdir() if p.name.startswith((".global_step", "global_step"))) == [
        "global_step_2"
    ]
