"""Tests of the parts of multi-node placement and worker-death reporting that need no Ray cluster.

``plan_nodes`` decides which nodes a pool uses and what a too-small cluster is told; the kill test hook, the
resource-pool arguments and the one-line death reason are plain Python too. The placement itself, on a real
two-node cluster, is in ``test_multinode.py``.
"""

from collections import Counter

import pytest
from ray.exceptions import ActorDiedError

from verl.single_controller import ray_worker_group
from verl.single_controller.placement import NodeInfo, PlacementError, plan_nodes
from verl.single_controller.ray_worker_group import (
    KILL_HOOK_ENV,
    RayResourcePool,
    WorkerDiedError,
    _death_reason,
    _kill_hook_victim,
)

HEAD = NodeInfo("aaaa", "10.0.0.1", {"CPU": 8.0})  # no GPU: a typical head node
GPU_A = NodeInfo("bbbb", "10.0.0.2", {"CPU": 32.0, "GPU": 4.0})
GPU_B = NodeInfo("cccc", "10.0.0.3", {"CPU": 32.0, "GPU": 4.0})
SMALL_GPU = NodeInfo("dddd", "10.0.0.4", {"CPU": 32.0, "GPU": 2.0})


def test_plan_keeps_fitting_nodes_in_cluster_order():
    # 4 GPUs per node: the head (no GPU) and the 2-GPU node are skipped; A and B keep the cluster's order
    chosen = plan_nodes([HEAD, GPU_A, SMALL_GPU, GPU_B], 2, {"CPU": 4.0, "GPU": 4.0})
    assert [node.node_id for node in chosen] == ["bbbb", "cccc"]


def test_plan_puts_the_preferred_node_first_when_it_fits():
    chosen = plan_nodes([GPU_A, GPU_B], 2, {"CPU": 4.0, "GPU": 4.0}, prefer_node_id="cccc")
    assert [node.node_id for node in chosen] == ["cccc", "bbbb"]
    # the head cannot hold a GPU rank, so preferring it changes nothing
    chosen = plan_nodes([GPU_A, HEAD, GPU_B], 2, {"CPU": 1.0, "GPU": 1.0}, prefer_node_id="aaaa")
    assert [node.node_id for node in chosen] == ["bbbb", "cccc"]


def test_plan_tolerates_rounding_of_fractional_shares():
    # three colocated groups of 1/3 GPU sum to 0.999...; the node's 1 GPU must still count as enough
    one_gpu = NodeInfo("eeee", "10.0.0.5", {"CPU": 4.0, "GPU": 1.0})
    assert plan_nodes([one_gpu], 1, {"GPU": (1 / 3) * 3 + 1e-9}) == [one_gpu]


def test_too_small_cluster_names_what_is_missing():
    # 3 nodes with 4 GPUs wanted; only A and B have 4 GPUs, so exactly one such node is missing
    with pytest.raises(PlacementError) as info:
        plan_nodes([HEAD, GPU_A, GPU_B, SMALL_GPU], 3, {"CPU": 4.0, "GPU": 4.0})
    message = str(info.value)
    assert "needs 3 node(s) with CPU 4, GPU 4 each" in message
    assert "only 2 of the 4 alive Ray node(s)" in message
    assert "1 more such node(s) are missing" in message
    assert "node dddd (10.0.0.4): CPU 32, GPU 2" in message  # every alive node is listed with its CPU and GPU


def test_gpu_request_on_a_cluster_without_gpus_says_so():
    with pytest.raises(PlacementError, match="No alive node has a GPU"):
        plan_nodes([HEAD], 1, {"CPU": 1.0, "GPU": 1.0})


def test_resource_pool_checks_its_arguments():
    with pytest.raises(ValueError, match="multiple of nnodes"):
        RayResourcePool(3, nnodes=2)
    with pytest.raises(ValueError, match="max_colocate"):
        RayResourcePool(2, max_colocate=0)
    with pytest.raises(ValueError, match="placement_timeout_s"):
        RayResourcePool(2, placement_timeout_s=0)


def test_resource_pool_bundle_holds_every_colocated_share():
    pool = RayResourcePool(4, num_cpus_per_worker=0.5, num_gpus_per_worker=0.5, nnodes=2, max_colocate=2)
    # 2 groups x 0.5 GPU = 1 GPU per rank's bundle, 2 x 0.5 CPU = 1 CPU; 4 ranks over 2 nodes = 2 per node
    assert pool.bundle() == {"CPU": 1.0, "GPU": 1.0}
    assert pool.workers_per_node == 2
    assert RayResourcePool(2, num_cpus_per_worker=0.25).bundle() == {"CPU": 0.25}  # no GPU key for CPU ranks


@pytest.fixture
def fresh_hook_counts(monkeypatch):
    monkeypatch.setattr(ray_worker_group, "_kill_hook_calls", Counter())


def test_kill_hook_fires_once_at_the_configured_call(monkeypatch, fresh_hook_counts):
    monkeypatch.setenv(KILL_HOOK_ENV, "actor_rollout_ref:1:update_actor:3")
    # calls 1 and 2 pass, call 3 names rank 1, call 4 (a rebuilt group's next call) passes again
    assert [_kill_hook_victim("actor_rollout_ref", "update_actor") for _ in range(4)] == [None, None, 1, None]
    # other methods and other groups are not counted and never hit
    assert _kill_hook_victim("actor_rollout_ref", "generate_sequences") is None
    assert _kill_hook_victim("critic", "update_actor") is None


def test_kill_hook_unset_does_nothing(monkeypatch, fresh_hook_counts):
    monkeypatch.delenv(KILL_HOOK_ENV, raising=False)
    assert _kill_hook_victim("actor_rollout_ref", "update_actor") is None


@pytest.mark.parametrize("raw", ["actor:1:update", "actor:x:update_actor:3", "actor:1:update_actor:0"])
def test_malformed_kill_hook_is_rejected_with_its_format(monkeypatch, fresh_hook_counts, raw):
    monkeypatch.setenv(KILL_HOOK_ENV, raw)
    with pytest.raises(ValueError, match=f"{KILL_HOOK_ENV}=.*<group>:<rank>:<method>:<call>"):
        _kill_hook_victim("actor", "update_actor")


def test_death_reason_keeps_the_cause_and_drops_the_boilerplate():
    err = ActorDiedError()
    err.error_msg = (
        "The actor died unexpectedly before finishing this task.\n\tclass_name: W\n\tactor_id: 01ab\n\tpid: 7\n"
        "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR End of file. "
        "Some common causes include: (1) the OOM killer"
    )
    assert _death_reason(err) == (
        "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR End of file."
    )


def test_worker_died_error_names_role_rank_and_node():
    err = WorkerDiedError("critic", 3, "node-id-hex", "10.0.0.7", "its node died")
    assert str(err) == "worker critic rank 3 on node node-id-hex (10.0.0.7) died: its node died"
    assert (err.role, err.rank, err.node_id, err.node_ip) == ("critic", 3, "node-id-hex", "10.0.0.7")
