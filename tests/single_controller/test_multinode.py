"""Worker groups on a two-node Ray cluster on one machine (``ray.cluster_utils.Cluster``): placement, rendezvous,
colocation, clear placement errors, and dead workers reported by rank and node.

The two nodes have 2 logical CPUs each, so either node could hold both reservations of a 2-node pool: landing on
distinct nodes is the placement's doing, not a side effect of full nodes. One cluster serves the module (it takes
~15 s to start); the test that removes a node runs last.
"""

import logging
import os
import time
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster

import verl.single_controller.results as results
from tests.single_controller.fault_injection import Killer, KillPlan
from tests.single_controller.remote_helpers import EchoWorker
from verl.single_controller import (
    CollectiveTimeoutError,
    PlacementError,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    WorkerDiedError,
)

pytestmark = pytest.mark.slow
REPO_ROOT = str(Path(__file__).resolve().parents[2])
logger = logging.getLogger(__name__)


@pytest.fixture(scope="module")
def cluster():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    python_path = os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p)
    ray.init(address=cluster.address, log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": python_path}})
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def node_ids(cluster) -> set[str]:
    return {node.node_id for node in cluster.list_all_nodes()}


def echo_group(name: str, nnodes: int, per_node: int, **group_kwargs) -> RayWorkerGroup:
    # a quarter CPU per worker: 2 ranks per node use half of a node, so a single node could hold everything
    pool = RayResourcePool(nnodes * per_node, num_cpus_per_worker=0.25, nnodes=nnodes)
    return RayWorkerGroup(pool, RayClassWithInitArgs(EchoWorker), name_prefix=name, **group_kwargs)


def wait_for_free_cpus(expected: float, timeout_s: float = 30.0) -> float:
    """Ray frees a removed reservation asynchronously: poll until ``expected`` CPUs are free (bounded)."""
    deadline = time.monotonic() + timeout_s
    while True:
        free = ray.available_resources().get("CPU", 0.0)
        if free >= expected or time.monotonic() > deadline:
            return free
        time.sleep(0.2)


def test_ranks_split_over_nodes_rendezvous_at_rank_zero_and_colocate(cluster):
    # 4 ranks on 2 nodes, shared by 2 groups (as the actor and critic groups share theirs)
    pool = RayResourcePool(4, num_cpus_per_worker=0.25, nnodes=2, max_colocate=2)
    actor = RayWorkerGroup(pool, RayClassWithInitArgs(EchoWorker), name_prefix="colo_actor")
    critic = None
    try:
        critic = RayWorkerGroup(pool, RayClassWithInitArgs(EchoWorker), name_prefix="colo_critic")
        placement = actor.placement
        # ranks 0-1 on one node, 2-3 on the other, and the two nodes are the cluster's two
        assert placement[0]["node_id"] == placement[1]["node_id"] != placement[2]["node_id"] == placement[3]["node_id"]
        assert {info["node_id"] for info in placement} == node_ids(cluster)
        assert [(info["local_rank"], info["local_world_size"]) for info in placement] == [(0, 2), (1, 2)] * 2
        # rank 0 is on the driver's node, and every rank rendezvouses at rank 0's node IP and claimed port
        assert placement[0]["node_id"] == ray.get_runtime_context().get_node_id()
        rendezvous = {info["master"] for info in placement}
        assert len(rendezvous) == 1 and rendezvous.pop().startswith(placement[0]["node_ip"] + ":")
        assert actor.init_torch_distributed(backend="gloo") == [True] * 4
        # sum over ranks of (rank + 1) = 1 + 2 + 3 + 4 = 10, across the two nodes
        assert actor.all_reduce_rank_plus_one() == [10.0] * 4
        # colocated: rank r of both groups on the same node; each group has its own rendezvous
        assert [info["node_id"] for info in critic.placement] == [info["node_id"] for info in placement]
        assert critic.placement[0]["master"] != placement[0]["master"]
        with pytest.raises(ValueError, match="max_colocate=2"):
            RayWorkerGroup(pool, RayClassWithInitArgs(EchoWorker), name_prefix="colo_third")
    finally:
        actor.shutdown()
        if critic is not None:
            critic.shutdown()


def test_too_small_cluster_fails_at_once_and_reserves_nothing(cluster):
    with pytest.raises(PlacementError, match=r"needs 3 node\(s\).*1 more such node\(s\) are missing"):
        echo_group("echo_3_nodes", nnodes=3, per_node=1)
    # 2 nodes x 2 CPUs, all free again (bounded poll: Ray frees asynchronously)
    assert wait_for_free_cpus(4.0) == 4.0


def test_busy_cluster_fails_after_the_bounded_wait(cluster):
    holder = RayResourcePool(4, num_cpus_per_worker=1, nnodes=2)  # 2 CPUs on each node: everything
    holder.acquire("holder")
    try:
        waiting = RayResourcePool(1, num_cpus_per_worker=1, placement_timeout_s=1)
        # the cluster has the capacity, so the request is placed or refused within its 1 s, never left pending
        with pytest.raises(PlacementError, match="not placed within 1 s"):
            waiting.acquire("waiting")
    finally:
        holder.release()
    assert wait_for_free_cpus(4.0) == 4.0


def test_a_hung_rank_then_a_killed_rank_reported_by_rank_and_node(cluster, monkeypatch):
    # one group for both faults (a group costs seconds to start here); the timeout leaves both ranks alive
    group = echo_group("echo_faults", nnodes=2, per_node=1, collective_timeout_s=2)
    try:
        group.init_torch_distributed(backend="gloo")
        # rank 1 hangs (a 30 s sleep) before its all-reduce: rank 0 gives up after the group's 2 s timeout, and
        # rank 1, still running after the grace period (shortened from 10 s: it sleeps far longer), is the one named
        monkeypatch.setattr(results, "ERROR_GRACE_S", 1.0)
        with pytest.raises(CollectiveTimeoutError) as hang:
            group.all_reduce_after_sleep(1, 30.0).get()
        assert (hang.value.role, hang.value.rank) == ("echo_faults", 1)
        rank_1 = group.placement[1]
        assert (hang.value.node_id, hang.value.node_ip) == (rank_1["node_id"], rank_1["node_ip"])
        assert hang.value.reason.startswith("rank(s) 0 waited for it in a collective of all_reduce_after_sleep")
        assert "collective timeout of 2 s" in hang.value.reason and "it was still running then" in hang.value.reason
        # the next all-reduce call first SIGKILLs rank 1; then rank 0 enters the collective, rank 1's call meets a
        # dead actor
        killer = Killer(KillPlan("echo_faults", 1, "all_reduce_rank_plus_one", 1))
        killer.arm(group)
        start = time.monotonic()
        with pytest.raises(WorkerDiedError) as info:
            group.all_reduce_rank_plus_one()
        logger.warning("killed rank reported after %.2f s", time.monotonic() - start)  # a figure, not a check
        err = info.value
        assert (err.role, err.rank) == ("echo_faults", 1)
        assert err.node_id == group.placement[1]["node_id"] and err.node_ip == group.placement[1]["node_ip"]
        assert "worker process has died" in err.reason
        assert killer.num_calls == 1
    finally:
        group.shutdown()


def test_lost_node_is_reported_as_a_dead_rank(cluster):
    group = echo_group("echo_node", nnodes=2, per_node=1)
    try:
        group.init_torch_distributed(backend="gloo")
        (worker_node,) = cluster.worker_nodes
        assert group.placement[1]["node_id"] == worker_node.node_id  # rank 0 is on the head (the driver's node)
        # rank 1 sleeps before its all-reduce, so rank 0 sits in the collective when rank 1's node goes
        pending = group.all_reduce_after_sleep(1, 60.0)
        start = time.monotonic()
        cluster.remove_node(worker_node, allow_graceful=False)
        with pytest.raises(WorkerDiedError) as info:
            pending.get()
        logger.warning("lost node reported after %.2f s", time.monotonic() - start)  # a figure, not a check
        assert (info.value.rank, info.value.node_id) == (1, worker_node.node_id)
    finally:
        group.shutdown()
