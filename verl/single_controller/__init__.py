"""Single controller: the driver process orchestrates groups of workers (Ray actors), which never call each other.

Public API: ``Worker`` (base class of every worker), ``register`` with ``Dispatch`` / ``Execute`` (how a worker
method is called from the driver), and ``RayResourcePool`` / ``RayClassWithInitArgs`` / ``RayWorkerGroup``
(starting and driving the workers, on one node or several), with ``WorkerDiedError`` (a rank's process is gone),
its subclass ``CollectiveTimeoutError`` (the other ranks waited for a rank in a collective until their timeout ran
out) and ``PlacementError`` (the cluster cannot hold the ranks). Ray is initialised by the caller (the trainer), not
here. The modules: ``worker`` and ``decorator`` (the worker side), ``placement`` (pools and where ranks go),
``ray_worker_group`` (starting and calling a group), ``results`` (collecting a call, telling errors from deaths),
``timing`` (where a call's time went), ``transport`` (moving batches).

The worker side imports without Ray (a worker started by hand, or a machine without Ray, such as the GPU checks'
image); the driver-side names load Ray when first used.
"""

import importlib

from verl.single_controller.decorator import Dispatch, Execute, register
from verl.single_controller.worker import Worker

# driver-side names -> their module; each imports Ray, so they load on first use (PEP 562)
_RAY_NAMES = {
    "PlacementError": "placement",
    "RayResourcePool": "placement",
    "RayClassWithInitArgs": "ray_worker_group",
    "RayWorkerGroup": "ray_worker_group",
    "PendingResult": "results",
    "WorkerDiedError": "results",
    "CollectiveTimeoutError": "results",
    "GenerationTimeoutError": "results",
}


def __getattr__(name: str):
    if name in _RAY_NAMES:
        module = importlib.import_module(f"verl.single_controller.{_RAY_NAMES[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CollectiveTimeoutError",
    "Dispatch",
    "Execute",
    "GenerationTimeoutError",
    "PendingResult",
    "PlacementError",
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "Worker",
    "WorkerDiedError",
    "register",
]
