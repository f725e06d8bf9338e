"""One training step of twelve of verl's example scripts, on the tiny model and the embedded task (issue 27).

Each script's stored command line is normalised as the start-up test does (model path, data files, hardware sizes;
see ``tests/trainer/verl_scripts/harness.py``), then shrunk to a step a 2-core CPU runs in seconds: 8 prompts of at
most 64 tokens, responses of at most 8, the micro-batch sizes that divide that, one step, no validation, no
checkpoint, the console logger (verl's scripts log to W&B), vLLM's KV cache at 2% of the RAM. Everything else is
the script's own: its algorithm, backend, rollout engine, reward model, LoRA, KL and entropy settings, dynamic
batch sizes and fused kernels. The twelve cover GRPO and PPO, fsdp and megatron, a model reward (the legacy worker
and verl's reward loop), LoRA on fsdp and on megatron, and verl's options for mixture-of-experts models and DAPO's
reward keyword arguments on a dense model.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.verl_scripts.harness import load_scripts, normalise, write_inputs

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

ONE_STEP = {
    "examples/grpo_trainer/run_qwen2-7b.sh": "GRPO, fsdp, vLLM",
    "examples/grpo_trainer/run_deepseek7b_llm_seq_balance.sh": "GRPO, fsdp, dynamic batch sizes",
    "examples/grpo_trainer/run_qwen2_5-3b_gsm8k_grpo_lora.sh": "GRPO, fsdp, LoRA rank 64, vLLM",
    "examples/grpo_trainer/run_qwen2-7b_math_megatron.sh": "GRPO, megatron, fused kernels",
    "examples/grpo_trainer/run_qwen3moe-30b_megatron_lora.sh": "GRPO, megatron, LoRA with the reference's offload "
    "keys, activation recomputation",
    "examples/grpo_trainer/run_qwen3moe-30b_megatron_96gb.sh": "GRPO, megatron, DAPO reward_kwargs, MoE options",
    "examples/grpo_trainer/run_qwen2_5-7b_math_megatron_diff_tp.sh": "GRPO, megatron, its own rollout TP",
    "examples/ppo_trainer/run_gemma.sh": "PPO with a critic, fsdp",
    "examples/ppo_trainer/run_qwen2-7b_math_gsm8k_megatron.sh": "PPO with a critic, megatron",
    "examples/ppo_trainer/run_qwen2-7b_rm_legacy.sh": "PPO, a model reward (verl's legacy worker)",
    "examples/ppo_trainer/run_qwen2-7b_rm.sh": "PPO, a model reward (verl's reward loop)",
    "examples/ppo_trainer/run_qwen2-7b_seq_balance.sh": "PPO, fsdp, dynamic batch sizes",
}
# the sizes of one small step (on top of the normalised script)
SMALL_STEP = (
    "data.train_batch_size=8",
    "data.val_batch_size=null",
    "data.max_prompt_length=64",
    "data.max_response_length=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.02",
    "critic.ppo_mini_batch_size=8",
    "critic.ppo_micro_batch_size_per_gpu=8",
    "reward_model.micro_batch_size_per_gpu=8",
    "trainer.total_training_steps=1",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.save_freq=-1",
    "trainer.resume_mode=disable",
    "trainer.logger=[console,jsonl]",
    "trainer.progress_bar=false",
    "trainer.plot=false",
    "ray_init.num_cpus=2",
)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return write_inputs(tmp_path_factory.mktemp("verl_scripts_inputs"))


def _override_keys(overrides) -> set[str]:
    return {o.partition("=")[0].lstrip("+~") for o in overrides}


@pytest.mark.parametrize("path", list(ONE_STEP), ids=[p.rsplit("/", 1)[-1] for p in ONE_STEP])
def test_one_step_of_a_verl_script(tmp_path, inputs, path):
    script = next(s for s in load_scripts() if s.name == path)
    normalised = normalise(script.overrides, inputs)
    # a key the script sets with '+' (it is absent from verl's config) keeps its '+'; ours are plain overrides of
    # keys the config has, so only those the script does not set are added, and the ones it sets are replaced
    ours = {o.partition("=")[0]: o for o in SMALL_STEP}
    kept = [o for o in normalised if o.partition("=")[0].lstrip("+~") not in ours]
    out_dir = tmp_path / "run"
    argv = script.argv(tuple(kept) + SMALL_STEP + (f"trainer.default_local_dir={out_dir}",))
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_DEDUP_LOGS": "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo", *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"{ONE_STEP[path]}:\n{proc.stderr[-4000:]}"
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "critic/score/mean" in r]
    assert [r["step"] for r in steps] == [1]
    assert "actor/pg_loss" in steps[0]
    if "actor_rollout_ref.model.lora.rank" in _override_keys(script.overrides):  # verl's megatron form of LoRA
        assert "MegatronPPOActor" in proc.stderr and "LoRA rank 32 on 8 layers" in proc.stderr
    if "critic.optim.lr" in _override_keys(script.overrides):  # a PPO script: its critic trained too
        assert "critic/vf_loss" in steps[0]
