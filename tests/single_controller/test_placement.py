"""Tests of the parts of multi-node placement that need no Ray cluster.

``plan_nodes`` decides which nodes a pool uses and what a too-small cluster is told; the resource-pool arguments
are plain Python too. The placement itself, on a real two-node cluster, is in ``test_multinode.py``.
"""

import pytest

from verl.single_controller.placement import NodeInfo, PlacementError, RayResourcePool, plan_nodes

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
