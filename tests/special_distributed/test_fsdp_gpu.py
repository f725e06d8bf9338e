"""FSDP2 on CUDA with NCCL (gloo for CPU tensors): fp16 training, CPU offload of parameters or optimizer state,
sharded save and resume, and the rollout's agreed stop. One rank per GPU, at most two; skipped without CUDA."""

import pytest
import torch

from tests.special_distributed.fsdp_dist_workers import fsdp_cuda_scenarios
from tests.special_distributed.test_fsdp_gloo import spawn

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    world = min(2, torch.cuda.device_count())
    return spawn(fsdp_cuda_scenarios, str(tmp_path_factory.mktemp("fsdp_gpu")), world=world)


def scenario(results, name):
    for ranks in results.values():
        assert "error" not in ranks[name], ranks[name]["error"]
    return [results[rank][name] for rank in sorted(results)]


def test_fp16_on_cuda_trains_and_resumes_exactly(results):
    for r in scenario(results, "plain"):
        # loss scale 1024 fits: all 3 updates apply; weights, gradients and Adam state stay on the GPU
        assert r["update_failed"] == [0.0, 0.0, 0.0]
        assert r["param_device"] == r["grad_device"] == "cuda" and r["state_devices"] == ["cuda"]
        assert r["weights_equal"]


def test_param_offload_keeps_shards_gradients_and_adam_state_in_cpu_memory(results):
    for r in scenario(results, "param_offload"):
        assert r["update_failed"] == [0.0, 0.0, 0.0]
        assert r["param_device"] == r["grad_device"] == "cpu" and r["state_devices"] == ["cpu"]
        assert r["weights_equal"]


def test_optimizer_offload_keeps_adam_state_in_cpu_memory_between_steps(results):
    for r in scenario(results, "optimizer_offload"):
        assert r["update_failed"] == [0.0, 0.0, 0.0]
        assert r["param_device"] == "cuda" and r["state_devices"] == ["cpu"]
        assert r["weights_equal"]


def test_the_rollout_stop_is_agreed_over_nccl(results):
    ranks = scenario(results, "rollout")
    # alone, rank 0 would stop after 1 pass; every other rank ends at token 3: all take 3 passes
    expected = 3 if len(ranks) > 1 else 1
    assert [r["calls"] for r in ranks] == [expected] * len(ranks)
