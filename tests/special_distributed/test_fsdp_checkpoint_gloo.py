"""FSDP2 sharded checkpoints on two gloo ranks: each rank writes its shards, a save round-trips, a resumed run
equals the uninterrupted one bit for bit, and the Hugging Face export gives the actor's log-probs in transformers."""

import pytest

from tests.special_distributed.fsdp_dist_workers import fsdp_checkpoint_scenarios
from tests.special_distributed.test_fsdp_gloo import WORLD, spawn


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return spawn(fsdp_checkpoint_scenarios, str(tmp_path_factory.mktemp("fsdp_ckpt")))


def scenario(results, name):
    for rank in range(WORLD):
        assert "error" not in results[rank][name], results[rank][name]["error"]
    return [results[rank][name] for rank in range(WORLD)]


def test_each_rank_writes_its_own_shard_file(results):
    # DCP: one data file per rank plus rank 0's index
    assert scenario(results, "resume")[0]["files"] == [".metadata", "__0_0.distcp", "__1_0.distcp"]


def test_a_sharded_checkpoint_round_trips(results):
    for r in scenario(results, "resume"):
        # the loading actor started from other weights (seed 1); after the load its shards and Adam moments are
        # byte for byte the saved ones, and the shared state is back: scale 1024 (2 clean updates, window 1000),
        # 2 updates counted, the schedule at step 2
        assert r["round_trip"]
        assert r["state_after_load"] == (1024.0, 2, 2)


def test_a_resumed_run_equals_the_uninterrupted_one(results):
    for r in scenario(results, "resume"):
        assert r["update_failed"] == [0.0, 0.0]  # the 2 updates after the save applied: the restored state mattered
        assert r["metrics_equal"] and r["weights_equal"]


def test_the_huggingface_export_loads_in_transformers_with_the_same_log_probs(results):
    for r in scenario(results, "hf_export"):
        assert r["class"] == "Qwen2ForCausalLM"
        assert r["max_abs_diff"] < 1e-5
