"""The fp16_guard recipe end to end: its Hydra config composes and validates, and its entry point trains.

The subprocess runs prove that the ``failure_rate`` handler runs inside the Ray workers (the registry is per
process, so only the config's ``module:`` entry gets it there) and decides there: exit code 1 with its message.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl.trainer.main_ppo import compose_from_command_line
from verl.workers.config import PPOConfig
from verl.workers.update_outcome import UPDATE_OUTCOME_HANDLER_REGISTRY, build_update_outcome_handler

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO / "recipe" / "fp16_guard" / "config"
MODULE = "recipe.fp16_guard.failure_rate"
# The same tiny run as tests/special_e2e/test_main_ppo.py: one update per step (mini-batch = train batch).
SMALL = [
    "data.train_batch_size=4",
    "data.num_val_examples=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.n=2",
    "critic.ppo_mini_batch_size=4",
    "critic.ppo_micro_batch_size_per_gpu=8",
    "trainer.test_freq=-1",
    "trainer.progress_bar=false",
    "trainer.plot=false",
    "ray_init.num_cpus=2",
]


@pytest.fixture(autouse=True)
def fresh_registry():
    # validating the config imports the recipe module, which registers "failure_rate": keep that out of other tests.
    sys.modules.pop(MODULE, None)
    with UPDATE_OUTCOME_HANDLER_REGISTRY.scoped():
        yield
    sys.modules.pop(MODULE, None)


def compose_recipe(*overrides):
    # exactly what the recipe's entry point composes
    return compose_from_command_line(list(overrides), CONFIG_DIR, "fp16_guard")


def test_recipe_config_extends_the_trainer_config_and_validates():
    cfg = compose_recipe(*SMALL)
    policy = dict(cfg.actor_rollout_ref.actor.update_failure_policy)
    assert policy == {"name": "failure_rate", "module": MODULE, "window": 8, "max_failure_rate": 0.5}
    # everything else comes from ppo_trainer.yaml, overrides included
    assert cfg.actor_rollout_ref.actor.dtype == "float16"
    assert cfg.critic.update_failure_policy == "auto"
    assert cfg.data.train_batch_size == 4
    PPOConfig.from_omegaconf(cfg)
    handler = build_update_outcome_handler(policy, dtype="float16")
    assert type(handler).__name__ == "FailureRateHandler"
    assert (handler.window, handler.min_updates) == (8, 8)


def test_recipe_config_rejects_a_bad_window_at_validation():
    cfg = compose_recipe(*SMALL, "actor_rollout_ref.actor.update_failure_policy.window=0")
    with pytest.raises(ValueError, match="failure_rate: window must be an integer >= 1, got 0"):
        PPOConfig.from_omegaconf(cfg)


def run_recipe(tmp_path: Path, *overrides: str) -> tuple[subprocess.CompletedProcess, Path]:
    out_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "recipe.fp16_guard.main_fp16_guard",
        *SMALL,
        f"trainer.default_local_dir={out_dir}",
        *overrides,
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_DEDUP_LOGS": "0"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    return proc, out_dir


def train_records(out_dir: Path) -> list[dict]:
    with open(out_dir / "metrics.jsonl") as handle:
        records = [json.loads(line) for line in handle]
    return [r for r in records if "actor/update_failed" in r]


@pytest.mark.slow
def test_fire_drill_stops_at_the_derived_step(tmp_path):
    # fp32 has no loss scaler, so every injected failure counts. Window 4, limit 0.5, decisions from 4 updates on:
    # step 1 S [0]; step 2 F [0,1]; step 3 F [0,1,1] (3 updates: no decision yet, although 2/3 > 0.5);
    # step 4 F [0,1,1,1] = 0.75 > 0.5 -> the run stops at step 4, with only 3 failures in a row.
    proc, out_dir = run_recipe(
        tmp_path,
        "trainer.total_training_steps=6",
        "actor_rollout_ref.actor.dtype=float32",
        "actor_rollout_ref.actor.update_failure_policy.window=4",
        "actor_rollout_ref.actor.fault_injection.nonfinite_grad_steps=[2,3,4]",
    )
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert "actor update failure rate too high at step 4: 3 of the last 4 updates failed" in proc.stderr
    assert "max_failure_rate=0.5 over window=4" in proc.stderr
    assert proc.stderr.count("Training stopped by the update-failure policy") == 1
    records = train_records(out_dir)
    assert [r["actor/update_failed"] for r in records] == [0.0, 1.0, 1.0]
    assert [r["actor/update_failure_rate"] for r in records] == [0.0, 0.5, pytest.approx(2 / 3)]


@pytest.mark.slow
def test_fp16_run_does_not_count_the_loss_scaler_backoff(tmp_path):
    # fp16 from loss scale 2**32: the first update overflows and is skipped, but the scaler can still back off, so
    # the failure is absorbed and the window records it as 0.
    proc, out_dir = run_recipe(tmp_path, "trainer.total_training_steps=2")
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = train_records(out_dir)
    assert len(records) == 2
    assert records[0]["actor/update_failed"] == 1.0
    assert records[0]["actor/loss_scale"] == 2.0**32
    assert [r["actor/update_failure_rate"] for r in records] == [0.0, 0.0]
