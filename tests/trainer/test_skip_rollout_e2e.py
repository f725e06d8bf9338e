"""skip.rollout end to end: ``python -m verl.trainer.main_ppo`` dumps two steps, a second run replays them.

The second run samples with another ``rollout.seed``: had it generated, its responses would differ. Replayed, every
value that follows from the samples (scores, rewards, advantages, lengths, the log-prob gap) equals the first run's.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SMALL = [
    "data.train_batch_size=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.n=2",
    "trainer.total_training_steps=2",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.save_freq=-1",
    "trainer.progress_bar=false",
    "trainer.plot=false",
    "ray_init.num_cpus=2",
]
# the values a step computes from its samples (and the prompts they answer)
GENERATION_DEPENDENT = [
    "critic/score/mean",
    "critic/rewards/mean",
    "critic/advantages/mean",
    "critic/advantages/max",
    "response_length/mean",
    "response_length/max",
    "prompt_length/mean",
    "data/batch_fingerprint",
]

pytestmark = pytest.mark.slow


def run_main(tmp_path: Path, name: str, *overrides: str) -> subprocess.CompletedProcess:
    skip = ["skip.rollout.enable=true", "skip.rollout.steps=[1,2]", f"skip.rollout.dump_dir={tmp_path / 'dumps'}"]
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *SMALL, *skip, f"trainer.default_local_dir={tmp_path / name}"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_DEDUP_LOGS": "0"}
    return subprocess.run([*cmd, *overrides], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def train_rows(tmp_path: Path, name: str, *overrides: str) -> list[dict]:
    proc = run_main(tmp_path, name, *overrides)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if "critic/score/mean" in row]


def test_a_second_run_replays_the_dumped_steps_with_the_same_numbers(tmp_path):
    first = train_rows(tmp_path, "first")
    assert [row["rollout_skip/dumped"] for row in first] == [1.0, 1.0]
    assert all("timing_s/gen" in row for row in first)
    dumps = tmp_path / "dumps"
    assert sorted(p.parent.name for p in dumps.glob("*/*/gen_batch.dp")) == ["1", "2"]

    replay = train_rows(tmp_path, "replay", "actor_rollout_ref.rollout.seed=12345")
    assert [row["step"] for row in replay] == [1, 2]
    assert [row["rollout_skip/replayed"] for row in replay] == [1.0, 1.0]
    assert [row["rollout_skip/num_replayed_steps"] for row in replay] == [1.0, 2.0]
    assert not any("timing_s/gen" in row for row in replay)  # the rollout never ran
    for key in GENERATION_DEPENDENT:
        assert [row[key] for row in replay] == [row[key] for row in first], key

    # the same dumps under another batch size: refused before the first step, naming the file and the difference
    other = run_main(tmp_path, "other", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8")
    assert other.returncode != 0
    assert "meta.json was generated with other settings: data.train_batch_size=4 there, 8 in this run" in other.stderr
