"""End to end: ``python -m verl.trainer.main_ppo`` with ``multi_turn.enable=true``, the ``tool_agent`` loop and the
calculator tool, GRPO in fp16 for 2 steps on CPU, on each rollout engine (naive, hf, vllm where installed).

The model is built here so that it always calls the calculator: a one-layer Qwen2 whose attention and MLP write
nothing (zero output projections), so the logits depend on the last token alone, with embeddings and an LM head
set by hand to a bigram chain: the last id of the template's generation prompt -> ``<tool_call>`` -> the call's
JSON (one added token) -> ``</tool_call>`` -> ``<|im_end|>`` (the eos), each at probability ~1 - 1e-5 at
temperature 1. Every assistant turn is that call. With ``max_assistant_turns=2`` every trajectory is: the call (4
ids, mask 1), the tool's answer turn (mask 0), the call again (4 ids, mask 1), then the loop stops.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "experimental" / "agent_loop"))
from tiny_chat import tiny_tokenizer  # noqa: E402

pytestmark = pytest.mark.slow

CALL_JSON = '{"name": "calculator", "arguments": {"expression": "1+1"}}'


def write_calling_model(directory: Path, hidden_size: int = 128, num_heads: int = 2) -> Path:
    """The tokenizer (tests' character-level chat tokenizer plus the call's JSON as one token) and the bigram model
    of the module docstring (head_dim 64 by default, which vLLM's CPU kernels take)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = tiny_tokenizer()
    tokenizer.add_tokens([CALL_JSON], special_tokens=True)
    tokenizer.save_pretrained(directory)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads // 2 or 1,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    # the last id of every prompt, the template's generation prompt "<|im_start|>assistant\n": its "\n", or the "t"
    # of "assistant" where the tokenizer read back from the directory encodes no "\n" (it does so once the call's
    # token is added); both start the chain
    chain = ["\n", "<tool_call>", CALL_JSON, "</tool_call>", "<|im_end|>"]
    ids = [tokenizer.convert_tokens_to_ids(token) for token in chain]
    pairs = [(tokenizer.convert_tokens_to_ids("t"), ids[1]), *zip(ids, ids[1:])]
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
        model.lm_head.weight.zero_()
        for k, (source, target) in enumerate(pairs):
            # the final RMSNorm makes e_k sqrt(hidden) * e_k: the target's logit is 2 sqrt(128) = 22.6, the others 0
            model.model.embed_tokens.weight[source, k] = 1.0
            model.lm_head.weight[target, k] = 2.0
    model.save_pretrained(directory)
    return directory


ENGINES = {
    "naive": [],
    "hf": ["actor_rollout_ref.actor.strategy=dp"],  # generate() on the dp actor's Hugging Face module
    "vllm": ["actor_rollout_ref.rollout.gpu_memory_utilization=0.01"],  # on CPU: 1% of the RAM for its KV cache
}


@pytest.mark.parametrize("engine", list(ENGINES))
def test_tool_agent_grpo_fp16_run_logs_agent_loop_metrics_and_masks_tool_turns(tmp_path, engine):
    from verl.utils.dataset.make_tiny_tool_data import write_tiny_tool_data

    if engine == "vllm":
        pytest.importorskip("vllm", reason="the vllm extra is not installed (scripts/setup_env.sh installs it)")

    model_dir = write_calling_model(tmp_path / "model")
    files = write_tiny_tool_data(tmp_path / "data", num_train=16, num_test=4)
    out_dir = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        f"data.train_files={files['train']}",
        f"data.val_files={files['test']}",
        "data.train_batch_size=4",
        "data.val_batch_size=4",
        "data.max_prompt_length=512",
        "data.max_response_length=128",
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.actor.dtype=float16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
        f"actor_rollout_ref.rollout.name={engine}",
        *ENGINES[engine],
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path=verl/tools/configs/calculator_tool.yaml",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
        "algorithm.adv_estimator=grpo",
        "trainer.total_training_steps=2",
        "trainer.test_freq=2",
        "trainer.n_gpus_per_node=1",
        "trainer.logger=[console,jsonl]",
        "trainer.progress_bar=false",
        "trainer.plot=false",
        "ray_init.num_cpus=2",
        f"trainer.default_local_dir={out_dir}",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_DEDUP_LOGS": "0"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    train = [row for row in rows if "critic/score/mean" in row]
    assert [row["step"] for row in train] == [1, 2]
    for row in train:
        # the user's question, 2 assistant turns, 1 tool turn; 8 trajectories (4 prompts x n=2), 1 call each
        assert (row["num_turns/min"], row["num_turns/max"]) == (4, 4)
        assert row["agent_loop/tool_calls_total"] == 8 and row["agent_loop/tool_call_success_rate"] == 1.0
        assert row["tool_call_counts/mean"] == 1
        # every first turn in one engine call, every second turn in another
        assert row["agent_loop/engine_calls"] == 2
        # the tool turn the template appends after "<|im_end|>", read by this tokenizer (no "\n" ids): "<|im_start|>"
        # "user" "<tool_response>" "2" "</tool_response>" "<|im_end|>" "<|im_start|>" "assistant" = 1 + 4 + 1 + 1 +
        # 1 + 1 + 1 + 9 = 19 ids, response mask 0; with the 2 x 4 sampled ids the response is 27 ids
        assert row["agent_loop/non_model_tokens/mean"] == 19
        assert row["response_length/mean"] == 27
        for name in ("generate_sequences", "tool_calls"):
            assert f"timing_s/agent_loop/{name}/mean" in row and f"timing_s/agent_loop/{name}/max" in row
        assert row["timing_s/agent_loop/slowest/response_length"] == 27
        assert row["actor/update_failed"] == 0
