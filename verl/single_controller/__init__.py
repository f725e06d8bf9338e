"""Single controller: the driver process orchestrates groups of workers (Ray actors), which never call each other.

Public API: ``Worker`` (base class of every worker), ``register`` with ``Dispatch`` / ``Execute`` (how a worker
method is called from the driver), and ``RayResourcePool`` / ``RayClassWithInitArgs`` / ``RayWorkerGroup``
(starting and driving the workers, on one node or several), with ``WorkerDiedError`` (a rank's process is gone)
and ``PlacementError`` (the cluster cannot hold the ranks). Ray is initialised by the caller (the trainer), not
here.
"""

from verl.single_controller.decorator import Dispatch, Execute, register
from verl.single_controller.placement import PlacementError
from verl.single_controller.ray_worker_group import (
    PendingResult,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    WorkerDiedError,
)
from verl.single_controller.worker import Worker

__all__ = [
    "Dispatch",
    "Execute",
    "PendingResult",
    "PlacementError",
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "Worker",
    "WorkerDiedError",
    "register",
]
