"""Placing a worker group's ranks on a Ray cluster: ``nnodes`` distinct nodes, the same number of ranks on each.

Each node's ranks get one placement group with strategy STRICT_PACK (all its bundles on one node), aimed at a node
chosen here (``_soft_target_node_id`` where Ray has it), and the nodes are checked to be distinct once Ray has
placed the groups: ranks ``[i * per_node, (i + 1) * per_node)`` share node ``i``, whatever the nodes' sizes. Before
anything is reserved, the cluster's alive nodes are compared with the request, so a cluster too small fails at
once with what is missing (:func:`plan_nodes`); a cluster big enough but busy fails after a bounded wait
(:func:`reserve_nodes`), never hangs. Node 0 (rank 0's node, the rendezvous) is the driver's node when it fits.
:class:`RayResourcePool` is what a worker group asks for: ranks, nodes and each rank's share, reserved when the first
group starts on it and freed when the last one shuts down.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group

logger = logging.getLogger(__name__)

# A request is compared per resource with this slack, so that 3 x (1/3 GPU) fits a node with 1 GPU.
_EPSILON = 1e-6
# How long to wait for the cluster to place a pool's reservations once it has the capacity.
DEFAULT_PLACEMENT_TIMEOUT_S = 120.0


class PlacementError(RuntimeError):
    """The cluster cannot hold a worker group's ranks (too few fitting nodes, or not free within the wait)."""


@dataclass(frozen=True)
class NodeInfo:
    """An alive Ray node and its total resources (``{"CPU": 8.0, "GPU": 1.0, ...}``)."""

    node_id: str
    ip: str
    resources: dict[str, float]

    def describe(self) -> str:
        shown = ", ".join(f"{key} {self.resources.get(key, 0):g}" for key in ("CPU", "GPU"))
        return f"node {self.node_id} ({self.ip}): {shown}"


@dataclass(frozen=True)
class RankSlot:
    """Where one rank goes: its node (index among the group's nodes, id, IP) and its bundle there."""

    rank: int
    node_index: int
    local_rank: int
    local_world_size: int
    node_id: str
    node_ip: str
    placement_group: PlacementGroup
    bundle_index: int


def alive_nodes() -> list[NodeInfo]:
    """The cluster's alive nodes, as the GCS lists them."""
    return [
        NodeInfo(node["NodeID"], node.get("NodeManagerAddress", "?"), dict(node.get("Resources", {})))
        for node in ray.nodes()
        if node.get("Alive")
    ]


def _fits(node: NodeInfo, demand: dict[str, float]) -> bool:
    return all(node.resources.get(key, 0.0) + _EPSILON >= amount for key, amount in demand.items())


def _format_resources(demand: dict[str, float]) -> str:
    return ", ".join(f"{key} {amount:g}" for key, amount in sorted(demand.items()))


def plan_nodes(
    nodes: list[NodeInfo], nnodes: int, per_node_demand: dict[str, float], prefer_node_id: str | None = None
) -> list[NodeInfo]:
    """The ``nnodes`` nodes to use, rank 0's node first; pure, so the error text is testable without a cluster.

    Only total resources count here (what is in use by others shows up as a bounded wait later). The preferred
    node (the driver's) comes first when it fits; the others keep the cluster's order.

    Raises:
        PlacementError: fewer than ``nnodes`` alive nodes can hold ``per_node_demand``; the message names the
            demand, the fitting nodes, every alive node's CPU/GPU, and how many nodes are missing.
    """
    fitting = [node for node in nodes if _fits(node, per_node_demand)]
    if len(fitting) < nnodes:
        missing = nnodes - len(fitting)
        listing = "; ".join(node.describe() for node in nodes) or "none"
        hint = ""
        if per_node_demand.get("GPU", 0) > 0 and not any(node.resources.get("GPU", 0) > 0 for node in nodes):
            hint = " No alive node has a GPU: start the GPU nodes with `ray start --address=<head>`."
        raise PlacementError(
            f"needs {nnodes} node(s) with {_format_resources(per_node_demand)} each, but only {len(fitting)} of the "
            f"{len(nodes)} alive Ray node(s) have that much ({listing}); {missing} more such node(s) are "
            f"missing.{hint}"
        )
    fitting.sort(key=lambda node: node.node_id != prefer_node_id)  # stable: the rest keep the cluster's order
    return fitting[:nnodes]


def _supports_soft_target() -> bool:
    return "_soft_target_node_id" in inspect.signature(placement_group).parameters


def reserve_nodes(
    nnodes: int, workers_per_node: int, bundle: dict[str, float], timeout_s: float, name: str = ""
) -> tuple[list[PlacementGroup], list[RankSlot]]:
    """Reserve ``workers_per_node`` bundles on each of ``nnodes`` distinct nodes; returns (groups, rank slots).

    Raises:
        PlacementError: the cluster is too small (at once), the groups are not placed within ``timeout_s``
            (resources held by others), or Ray put two nodes' groups on one node; nothing stays reserved.
    """
    per_node_demand = {key: amount * workers_per_node for key, amount in bundle.items()}
    chosen = plan_nodes(alive_nodes(), nnodes, per_node_demand, ray.get_runtime_context().get_node_id())
    soft_target = _supports_soft_target()
    groups: list[PlacementGroup] = []
    try:
        for index, node in enumerate(chosen):
            kwargs = {"_soft_target_node_id": node.node_id} if soft_target else {}
            groups.append(
                placement_group(
                    [dict(bundle)] * workers_per_node,
                    strategy="STRICT_PACK",
                    name=f"{name}_node{index}" if name else "",
                    **kwargs,
                )
            )
        ready, _ = ray.wait([group.ready() for group in groups], num_returns=len(groups), timeout=timeout_s)
        if len(ready) < len(groups):
            raise PlacementError(
                f"{len(groups) - len(ready)} of the {len(groups)} node reservation(s) ({workers_per_node} x "
                f"{_format_resources(bundle)} each) were not placed within {timeout_s:g} s: the nodes are big "
                "enough, but other actors or jobs hold the resources (`ray status` shows who)."
            )
        node_of_group = [_node_of(group) for group in groups]
        if len(set(node_of_group)) < len(groups):
            raise PlacementError(
                f"Ray placed the reservations of {len(groups)} nodes on only {len(set(node_of_group))} distinct "
                "node(s) (a chosen node was busy); free the nodes or retry."
            )
    except BaseException:
        release_groups(groups)
        raise
    ip_of = {node.node_id: node.ip for node in alive_nodes()}
    slots = []
    for node_index, (group, node_id) in enumerate(zip(groups, node_of_group)):
        for local_rank in range(workers_per_node):
            slots.append(
                RankSlot(
                    rank=node_index * workers_per_node + local_rank,
                    node_index=node_index,
                    local_rank=local_rank,
                    local_world_size=workers_per_node,
                    node_id=node_id,
                    node_ip=ip_of.get(node_id, "?"),
                    placement_group=group,
                    bundle_index=local_rank,
                )
            )
    return groups, slots


def _node_of(group: PlacementGroup) -> str:
    """The node of a ready STRICT_PACK group (all its bundles are on one node)."""
    nodes = set(placement_group_table(group)["bundles_to_node_id"].values())
    if len(nodes) != 1:  # STRICT_PACK promises one node; say so rather than mis-number local ranks
        raise PlacementError(f"a STRICT_PACK reservation spans {len(nodes)} nodes; this Ray version breaks it.")
    return nodes.pop()


def release_groups(groups: list[PlacementGroup]) -> None:
    """Remove placement groups (their actors must be gone or going); errors of an already-gone cluster are logged."""
    for group in groups:
        try:
            remove_placement_group(group)
        except Exception as err:  # a dead cluster cannot hold the reservation anyway
            logger.warning("could not remove placement group %s: %s", group.id.hex(), err)


class RayResourcePool:
    """How many workers a group has, on how many nodes, and what each one reserves.

    The pool reserves ``num_workers / nnodes`` bundles on each of ``nnodes`` distinct nodes when the first group
    starts on it, and frees them when the last group using it shuts down. Each bundle holds rank ``r`` of up to
    ``max_colocate`` groups: ``max_colocate x num_cpus_per_worker`` CPUs and ``max_colocate x num_gpus_per_worker``
    GPUs (give each of 2 colocated groups ``num_gpus_per_worker=0.5`` to share one GPU per rank).

    Args:
        num_workers: number of ranks (the group's world size); a multiple of ``nnodes``.
        num_cpus_per_worker: CPUs each worker takes; fractions are allowed (small CPU boxes).
        num_gpus_per_worker: GPUs each worker takes; Ray sets each worker's ``CUDA_VISIBLE_DEVICES`` to its share.
        nnodes: number of distinct nodes, with the same number of ranks on each.
        max_colocate: how many groups share the pool's bundles (rank by rank).
        placement_timeout_s: how long to wait for the cluster to place the reservations once it has the capacity.

    Raises:
        ValueError: for a non-positive count or share, or ranks that do not split evenly over the nodes.
    """

    def __init__(
        self,
        num_workers: int,
        num_cpus_per_worker: float = 1,
        num_gpus_per_worker: float = 0,
        nnodes: int = 1,
        max_colocate: int = 1,
        placement_timeout_s: float = DEFAULT_PLACEMENT_TIMEOUT_S,
    ) -> None:
        for name, value in (("num_workers", num_workers), ("nnodes", nnodes), ("max_colocate", max_colocate)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
        if num_workers % nnodes:
            raise ValueError(
                f"num_workers={num_workers} ranks do not split evenly over nnodes={nnodes} nodes; every node gets "
                "the same number of ranks, so make num_workers a multiple of nnodes."
            )
        if not num_cpus_per_worker > 0:
            raise ValueError(
                f"num_cpus_per_worker must be > 0 (fractions such as 0.5 are fine), got {num_cpus_per_worker!r}."
            )
        if not num_gpus_per_worker >= 0:
            raise ValueError(f"num_gpus_per_worker must be >= 0, got {num_gpus_per_worker!r}.")
        if not placement_timeout_s > 0:
            raise ValueError(f"placement_timeout_s must be > 0 seconds, got {placement_timeout_s!r}.")
        self.num_workers = num_workers
        self.num_cpus_per_worker = num_cpus_per_worker
        self.num_gpus_per_worker = num_gpus_per_worker
        self.nnodes = nnodes
        self.max_colocate = max_colocate
        self.placement_timeout_s = placement_timeout_s
        self._groups: list = []
        self._slots: list[RankSlot] = []
        self._users = 0

    @property
    def world_size(self) -> int:
        return self.num_workers

    @property
    def workers_per_node(self) -> int:
        return self.num_workers // self.nnodes

    @property
    def uses_gpus(self) -> bool:
        return self.num_gpus_per_worker > 0

    def bundle(self) -> dict[str, float]:
        """What one rank's bundle reserves: the share of every group that may colocate there."""
        bundle = {"CPU": self.num_cpus_per_worker * self.max_colocate}
        if self.uses_gpus:
            bundle["GPU"] = self.num_gpus_per_worker * self.max_colocate
        return bundle

    def acquire(self, name: str = "") -> list[RankSlot]:
        """The rank slots, reserving them for the first group; one more group now uses the pool.

        Raises:
            ValueError: more groups than ``max_colocate`` would share the bundles (their actors could never start).
            PlacementError: the cluster cannot hold the reservation (see ``placement.reserve_nodes``).
        """
        if self._users >= self.max_colocate:
            raise ValueError(
                f"{self._users + 1} groups would share a resource pool made for max_colocate={self.max_colocate}; "
                "raise max_colocate or give the group its own pool."
            )
        if not self._slots:
            self._groups, self._slots = reserve_nodes(
                self.nnodes, self.workers_per_node, self.bundle(), self.placement_timeout_s, name
            )
        self._users += 1
        return list(self._slots)

    def release(self) -> None:
        """One group is done with the pool; the last one frees the reservations."""
        self._users = max(0, self._users - 1)
        if self._users == 0 and self._groups:
            release_groups(self._groups)
            self._groups, self._slots = [], []
