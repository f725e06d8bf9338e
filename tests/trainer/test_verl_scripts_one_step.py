"""One training step of eleven of verl's example scripts, on the tiny model and the embedded task (issue 27).

Each script's stored command line is normalised as the start-up test does (model path, data files, hardware sizes;
see ``tests/trainer/verl_scripts/harness.py``), then shrunk to a step a 2-core CPU runs in seconds
(``tests/trainer/verl_scripts/one_step.py``, which also runs every script that starts). Everything else is the
script's own: its algorithm, backend, rollout engine, reward model, LoRA, KL and entropy settings, dynamic
batch sizes and fused kernels. Ten (``ONE_STEP``) cover GRPO and PPO, fsdp and megatron, a model reward (verl's
reward loop), LoRA on fsdp and on megatron, megatron roles started from a megatron-core distributed checkpoint, and
verl's options for mixture-of-experts models and DAPO's reward keyword arguments on a dense model. One
(``OWN_PIPELINE``, a PPO script) runs at its own pipeline sizes, on two ranks; the other scripts, and the rest of
verl's that start, run with ``python -m tests.trainer.verl_scripts.one_step`` (about 40 minutes here).
"""

import json
import re

import pytest

from tests.trainer.verl_scripts.harness import load_scripts, write_inputs
from tests.trainer.verl_scripts.one_step import run_one_step

pytestmark = pytest.mark.slow

ONE_STEP = {
    "examples/grpo_trainer/run_qwen2-7b.sh": "GRPO, fsdp, vLLM",
    "examples/grpo_trainer/run_deepseek7b_llm_seq_balance.sh": "GRPO, fsdp, dynamic batch sizes",
    "examples/grpo_trainer/run_qwen2_5-3b_gsm8k_grpo_lora.sh": "GRPO, fsdp, LoRA rank 64, vLLM",
    "examples/grpo_trainer/run_qwen2-7b_math_megatron.sh": "GRPO, megatron, fused kernels",
    "examples/grpo_trainer/run_qwen3moe-30b_megatron_lora.sh": "GRPO, megatron, LoRA with the reference's offload "
    "keys, activation recomputation",
    "examples/grpo_trainer/run_qwen3moe-30b_megatron_96gb.sh": "GRPO, megatron, DAPO reward_kwargs, MoE options",
    "examples/ppo_trainer/run_gemma.sh": "PPO with a critic, fsdp",
    "examples/ppo_trainer/run_qwen2-7b_math_gsm8k_megatron.sh": "PPO with a critic, megatron",
    "examples/ppo_trainer/run_moonlight16b_a3b_gsm8k_megatron.sh": "PPO, megatron, actor, reference and critic "
    "started from a megatron-core distributed checkpoint",
    "examples/ppo_trainer/run_qwen2-7b_rm.sh": "PPO, a model reward (verl's reward loop)",
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return write_inputs(tmp_path_factory.mktemp("verl_scripts_inputs"))


def _override_keys(overrides) -> set[str]:
    return {o.partition("=")[0].lstrip("+~") for o in overrides}


@pytest.mark.parametrize("path", list(ONE_STEP), ids=[p.rsplit("/", 1)[-1] for p in ONE_STEP])
def test_one_step_of_a_verl_script(tmp_path, inputs, path):
    script = next(s for s in load_scripts() if s.name == path)
    out_dir = tmp_path / "run"
    proc = run_one_step(script, inputs, tmp_path, out_dir)
    assert proc.returncode == 0, f"{ONE_STEP[path]}:\n{proc.stderr[-4000:]}"
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "critic/score/mean" in r]
    assert [r["step"] for r in steps] == [1]
    assert "actor/pg_loss" in steps[0]
    if "actor_rollout_ref.model.lora.rank" in _override_keys(script.overrides):  # verl's megatron form of LoRA
        assert "MegatronPPOActor" in proc.stderr and "LoRA rank 32 on 8 layers" in proc.stderr
    if "critic.megatron.use_dist_checkpointing=True" in script.overrides:  # the converter's shards
        for role in ("MegatronPPOActor", "MegatronPPOCritic"):  # each worker's start-up line names the source
            assert re.search(rf"{role} \([^)]*initial weights from {re.escape(inputs['dist_checkpoint'])}", proc.stderr)
    if "critic.optim.lr" in _override_keys(script.overrides):  # a PPO script: its critic trained too
        assert "critic/vf_loss" in steps[0]


# Scripts whose own pipeline sizes (2, for every megatron role they set) fit the two ranks of this machine: they run at
# those sizes, on two CPU ranks, instead of the one stage the start-up harness normalises them to.
OWN_PIPELINE = {
    "examples/ppo_trainer/run_qwen1.5_moe_a2.7b-gsm8k_megatron.sh": "PPO, megatron: actor, reference and critic in two "
    "stages each, started from a megatron-core distributed checkpoint",
}


@pytest.mark.parametrize("path", list(OWN_PIPELINE), ids=[p.rsplit("/", 1)[-1] for p in OWN_PIPELINE])
def test_one_step_of_a_verl_script_at_its_own_pipeline_size(tmp_path, inputs, path):
    script = next(s for s in load_scripts() if s.name == path)
    own = tuple(o for o in script.overrides if o.partition("=")[0].endswith(".megatron.pipeline_model_parallel_size"))
    assert {o.partition("=")[2] for o in own} == {"2"}
    out_dir = tmp_path / "run"
    proc = run_one_step(script, inputs, tmp_path, out_dir, extra=(*own, "trainer.n_gpus_per_node=2"))
    assert proc.returncode == 0, f"{OWN_PIPELINE[path]}:\n{proc.stderr[-4000:]}"
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "critic/score/mean" in r]
    assert [r["step"] for r in steps] == [1] and "actor/pg_loss" in steps[0]
    roles = {o.partition(".megatron")[0] for o in own}
    for stage in (1, 2):  # each worker's start-up line names its stage
        assert re.search(rf"MegatronPPOActor \([^)]*pipeline stage {stage} of 2", proc.stderr)
        if "critic" in roles:
            assert re.search(rf"MegatronPPOCritic \([^)]*pipeline stage {stage} of 2", proc.stderr)
    if "critic" in roles:
        assert "critic/vf_loss" in steps[0]
