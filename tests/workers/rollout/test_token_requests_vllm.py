"""The agent loops' token-id requests on the ``vllm`` rollout (its engine takes prompt token ids): the answers equal
the naive rollout's over the actor's own model under greedy decoding, requests of different lengths in one call;
on CUDA the engine stays awake between two turns and sleeps once the batch is released."""

import pytest
import torch

from verl.workers.rollout import NaiveRollout
from verl.workers.rollout.token_requests import generate_for_requests, make_request_batch

from .test_vllm_rollout import (  # noqa: F401  (vllm_process_state: the module's autouse clean-up, reused)
    CPU_FP32,
    CUDA_FP16,
    build_worker,
    shut_down,
    vllm_process_state,
)
from .vllm_helpers import needs_vllm, write_head_dim_64_model

needs_vllm()

GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": -1}
# ids of the tiny model's character vocabulary (50 ids, 0-2 special): prompts of 3, 7 and 1 tokens
PROMPTS = [[10, 11, 12], [13, 14, 15, 16, 17, 18, 19], [20]]
BUDGETS = [6, 3, 6]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_head_dim_64_model(tmp_path_factory.mktemp("head_dim_64_requests"))


@pytest.fixture(scope="module", params=[CPU_FP32, CUDA_FP16])
def worker(request, model_dir):
    device, dtype = request.param
    built = build_worker(model_dir, device, dtype)
    yield built
    shut_down(built)


def _naive_answers(worker):
    actor = worker.actor

    def logits_fn(input_ids, attention_mask, position_ids):
        return actor.forward_logits(input_ids, attention_mask, position_ids).float()

    engine = worker.rollout
    naive = NaiveRollout(logits_fn, worker.config.rollout.sampling_options(), engine.pad_token_id, engine.eos_ids)
    with torch.no_grad():
        return generate_for_requests(naive, make_request_batch(PROMPTS, BUDGETS, GREEDY), worker._device())


def test_vllm_answers_token_requests_as_the_naive_rollout(worker):
    worker._sync_rollout_weights()
    requests = make_request_batch(PROMPTS, BUDGETS, GREEDY)
    requests.meta_info["keep_awake"] = True
    answers = worker.generate_tokens(requests).non_tensor_batch
    expected = _naive_answers(worker).non_tensor_batch
    assert [list(ids) for ids in answers["token_ids"]] == [list(ids) for ids in expected["token_ids"]]
    assert all(len(ids) <= budget for ids, budget in zip(answers["token_ids"], BUDGETS, strict=True))
    for got, want in zip(answers["log_probs"], expected["log_probs"], strict=True):
        # fp16 engines round their logits; the fp32 ones agree to float error
        assert got == pytest.approx(want, abs=1e-3 if worker.config.actor.dtype == "float32" else 5e-2)
    engine = worker.rollout
    if str(worker._device()).startswith("cuda"):  # sleep mode is on by default on CUDA (free_cache_engine)
        assert worker.rollout_role._sleeps_after and not engine._asleep  # kept awake for the next turn
        worker.release_rollout()
        assert engine._asleep and engine.can_sleep
