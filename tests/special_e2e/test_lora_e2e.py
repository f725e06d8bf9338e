"""The default GRPO run (embedded task, fp16, fsdp) with LoRA adapters in place of full fine-tuning: the reward rises.

Rank 32 on every linear layer of the tiny model trains about a third as many parameters as the model has; with the
base weights frozen it learns more slowly than full fine-tuning (the default run reaches a train score near 0.43),
so the check is the direction and a margin well above the run-to-run spread of the seeded run.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_grpo_with_lora_on_the_default_task_raises_the_reward(tmp_path):
    out_dir = tmp_path / "lora"
    cmd = [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        "actor_rollout_ref.model.lora_rank=32",
        "actor_rollout_ref.model.lora_alpha=64",
        "actor_rollout_ref.actor.optim.lr=3e-3",
        "trainer.save_freq=60",
        "trainer.plot=false",
        "trainer.progress_bar=false",
        f"trainer.default_local_dir={out_dir}",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    scores = [r["critic/score/mean"] for r in rows if "critic/score/mean" in r]
    validation = [r["val/score/mean"] for r in rows if "val/score/mean" in r]
    assert len(scores) == 60
    # measured (seeded): train score 0.278 over the first 10 steps, 0.334 over the last 10; greedy validation 0.468
    # before training, then 0.468, 0.493, 0.503, 0.492, 0.508, 0.462 (every 10 steps). One greedy validation
    # moves by a few hundredths between neighbouring checkpoints (the last here dipped to 0.462), so the
    # check is their mean over the run: 0.488 against 0.468
    first, last = sum(scores[:10]) / 10, sum(scores[-10:]) / 10
    assert last > first + 0.02, (first, last)
    trained = validation[1:]
    assert sum(trained) / len(trained) > validation[0] + 0.01, validation
    # the checkpoint holds the adapter directory peft loads
    adapter = out_dir / "global_step_60" / "actor" / "lora_adapter"
    assert (adapter / "adapter_config.json").is_file() and (adapter / "adapter_model.safetensors").is_file()
