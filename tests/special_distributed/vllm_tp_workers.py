"""Process entry points of the tensor-parallel ``vllm`` rollout tests (importable, so that spawned processes find them).

``fake_engine_scenario`` runs on CPU (gloo) with a stand-in for ``vllm.LLM`` that records what it is asked: it
checks the rollout's side of tensor parallelism (the group's prompts gathered, one request list and one seed list
for the whole group, each rank keeping its own rows). ``real_engine_scenario`` builds real vLLM engines over two
GPUs with the external launcher (NCCL), as the actor workers do.
"""

from __future__ import annotations

import datetime
import os
from types import SimpleNamespace

import torch
import torch.distributed as dist

# a prompt's responses in the fake engine: its last prompt token + 1, + 2, ... (so each row names its prompt)
NUM_FAKE_RESPONSE_TOKENS = 3


class FakeEngine:
    """What VLLMRollout uses of ``vllm.LLM``: ``generate`` answers each prompt with its last token + 1, + 2, ...;
    ``collective_rpc`` and ``model_config`` exist. It records the prompts and the seeds of each call."""

    def __init__(self):
        self.model_config = SimpleNamespace(enable_sleep_mode=False)
        self.calls: list[dict] = []

    def collective_rpc(self, *args, **kwargs):
        return None

    def generate(self, prompts, sampling_params, use_tqdm=False):
        self.calls.append(
            {"prompts": [p["prompt_token_ids"] for p in prompts], "seeds": [sp.seed for sp in sampling_params]}
        )
        outputs = []
        for prompt in prompts:
            last = prompt["prompt_token_ids"][-1]
            ids = [last + step for step in range(1, NUM_FAKE_RESPONSE_TOKENS + 1)]
            logprobs = [{token: SimpleNamespace(logprob=-0.5)} for token in ids]
            outputs.append(SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids, logprobs=logprobs)]))
        return outputs


def _rank_prompts(rank: int):
    """Rank 0 has 2 prompts, rank 1 has 3 (unequal parts); token ids name the rank and the row."""
    from tests.workers.rollout.conftest import make_prompts

    rows = [[5, 10 * (rank + 1) + row] for row in range(2 + rank)]  # last tokens: rank 0 10, 11; rank 1 20, 21, 22
    return make_prompts(rows, num_prompt_tokens=4)


def fake_engine_scenario(rank: int, world: int, port: int, queue) -> None:
    """Two ranks, one engine over both (tensor-parallel group = the world), n = 2 samples per prompt."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        from tests.workers.rollout.conftest import sampling_options
        from verl.workers.rollout import VLLMRollout

        engine = FakeEngine()
        # the ranks of one engine share its seed offset (engine_index), so their seed sources agree
        options = sampling_options(n=2, response_length=NUM_FAKE_RESPONSE_TOKENS, seed=7, do_sample=True)
        rollout = VLLMRollout(engine, options, pad_token_id=0, eos_token_id=99)
        rollout.tp_group = dist.new_group(list(range(world)), backend="gloo")
        prompts = _rank_prompts(rank)
        output = rollout.generate_sequences(prompts)
        queue.put(
            (
                rank,
                {
                    "calls": engine.calls,
                    "num_rows": len(output),
                    "prompts": output.batch["prompts"].tolist(),
                    "responses": output.batch["responses"].tolist(),
                    "own_prompts": prompts.batch["input_ids"].tolist(),
                    "rollout_log_probs": output.batch["rollout_log_probs"].tolist(),
                },
            )
        )
    finally:
        dist.destroy_process_group()


def real_engine_scenario(rank: int, world: int, port: int, queue, model_dir: str) -> None:
    """Two GPUs, one vLLM engine over both (TP 2, external launcher on this NCCL group), greedy answers to each
    rank's own prompts; then the weights are sent in again (each rank passes the full tensors) and the answers
    must not change."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    try:
        from transformers import AutoModelForCausalLM

        from verl.workers.config import compose_ppo_config
        from verl.workers.rollout import VLLMRollout
        from verl.workers.rollout.vllm_engine import build_vllm_engine, engine_index

        config = compose_ppo_config(
            [
                "actor_rollout_ref.rollout.name=vllm",
                f"actor_rollout_ref.model.path={model_dir}",
                "actor_rollout_ref.actor.dtype=float32",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                "actor_rollout_ref.rollout.gpu_memory_utilization=0.2",
                "actor_rollout_ref.rollout.free_cache_engine=false",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
                "algorithm.adv_estimator=grpo",
                "data.max_prompt_length=8",
                "data.max_response_length=8",
                "trainer.device=cuda",
                f"trainer.n_gpus_per_node={world}",
            ]
        )
        rollout_config = config.actor_rollout_ref.rollout
        offset = engine_index(rollout_config, rank)
        engine = build_vllm_engine(config.actor_rollout_ref, seed=rollout_config.seed + offset, device="cuda")
        options = rollout_config.sampling_options(seed_offset=offset).replace(n=1, do_sample=False)
        rollout = VLLMRollout(engine, options, pad_token_id=0, eos_token_id=2)
        prompts = _rank_prompts(rank)
        first = rollout.generate_sequences(prompts)
        hf_model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
        rollout.load_weights(hf_model.state_dict().items())
        again = rollout.generate_sequences(prompts)
        queue.put(
            (
                rank,
                {
                    "tp_group_size": dist.get_world_size(rollout.tp_group) if rollout.tp_group is not None else 1,
                    "num_rows": len(first),
                    "prompts": first.batch["prompts"].tolist(),
                    "own_prompts": prompts.batch["input_ids"].tolist(),
                    "responses": first.batch["responses"].tolist(),
                    "responses_after_sync": again.batch["responses"].tolist(),
                },
            )
        )
    finally:
        dist.destroy_process_group()
