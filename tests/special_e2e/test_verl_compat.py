"""A verl user's GSM8K GRPO run, brought over unchanged: verl's keys, verl's data layout, a custom reward file and a
custom advantage estimator registered verl's way.

The data is made by ``examples/data_preprocess/gsm8k.py`` from a small fixture; the model is the embedded tiny one
(it learns nothing about arithmetic in two steps: the test is about the keys, the files and the calls).
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from examples.data_preprocess import gsm8k

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
QUESTIONS = [
    ("Tom has 3 apples and buys 4 more. How many apples?", "3 + 4 = 7\n#### 7"),
    ("A box holds 6 eggs. How many eggs in 2 boxes?", "6 * 2 = 12\n#### 12"),
    ("Sam had 10 coins and lost 3. How many are left?", "10 - 3 = 7\n#### 7"),
    ("A farm sells 1,000 eggs a day. How many in 2 days?", "1000*2=2000\n#### 2,000"),
]

# A custom reward file as verl users write them: compute_score(data_source, solution_str, ground_truth, extra_info)
REWARD_FILE = """
def my_score(data_source, solution_str, ground_truth, extra_info=None):
    assert data_source == "openai/gsm8k" and extra_info["split"] in ("train", "test")
    return 1.0 if ground_truth in solution_str else 0.25
"""

# A custom advantage estimator registered with verl's decorator and verl's keyword arguments, and an entry point
# that imports it before handing over to main_ppo (advantages are computed in the driver).
ESTIMATOR_MAIN = """
import torch
from verl.trainer.ppo.core_algos import register_adv_est
from verl.trainer.main_ppo import cli

@register_adv_est("centred_outcome")
def centred_outcome(token_level_rewards, response_mask, index=None, config=None, **kwargs):
    scores = token_level_rewards.sum(-1)
    advantages = (scores - scores.mean()).unsqueeze(-1) * response_mask
    print("CUSTOM ESTIMATOR CALLED with gamma", config.gamma, flush=True)
    return advantages, advantages

if __name__ == "__main__":
    cli()
"""


def verl_command_line(data_dir: Path, out_dir: Path, reward_file: Path) -> list[str]:
    """The keys of verl's examples/grpo_trainer GSM8K script that this project supports, at tiny sizes."""
    return [
        "algorithm.adv_estimator=centred_outcome",
        f"data.train_files={data_dir / 'train.parquet'}",
        f"data.val_files={data_dir / 'test.parquet'}",
        "data.train_batch_size=4",
        "data.max_prompt_length=160",
        "data.max_response_length=8",
        "data.filter_overlong_prompts=True",
        "data.truncation=error",
        "actor_rollout_ref.model.path=default",
        # the embedded model's 64 positions do not hold GSM8K's 160-token prompts (refused at start-up): widen them
        "actor_rollout_ref.model.override_config.max_position_embeddings=256",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.fsdp_config.param_offload=False",
        "algorithm.use_kl_in_reward=False",
        "trainer.critic_warmup=0",
        "trainer.logger=['console','jsonl']",
        "trainer.project_name=verl_grpo_example_gsm8k",
        "trainer.experiment_name=tiny",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.save_freq=2",
        "trainer.test_freq=2",
        "trainer.total_epochs=1",
        f"custom_reward_function.path={reward_file}",
        "custom_reward_function.name=my_score",
        f"trainer.default_local_dir={out_dir}",
        "trainer.progress_bar=false",
        "trainer.plot=false",
        "ray_init.num_cpus=2",
    ]


def test_a_verl_gsm8k_grpo_command_line_runs(tmp_path):
    fixture = tmp_path / "gsm8k.jsonl"
    fixture.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in QUESTIONS))
    data_dir = tmp_path / "data"
    gsm8k.convert_file(fixture, data_dir, "train")
    gsm8k.convert_file(fixture, data_dir, "test")
    reward_file = tmp_path / "my_reward.py"
    reward_file.write_text(textwrap.dedent(REWARD_FILE))
    entry = tmp_path / "my_main.py"
    entry.write_text(textwrap.dedent(ESTIMATOR_MAIN))
    out_dir = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_DEDUP_LOGS": "0"}
    cmd = [sys.executable, str(entry), *verl_command_line(data_dir, out_dir, reward_file)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "CUSTOM ESTIMATOR CALLED with gamma 1.0" in proc.stdout + proc.stderr
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "critic/score/mean" in r]
    # 4 prompts, batch 4, one epoch: one step; the custom scorer gives 0.25 or 1.0, never 0
    assert [r["step"] for r in train] == [1]
    assert 0.25 <= train[0]["critic/score/mean"] <= 1.0
    assert "actor/kl_loss" in train[0]  # the reference and its KL loss ran
    assert (out_dir / "global_step_1" / "actor" / "model.safetensors").exists()
