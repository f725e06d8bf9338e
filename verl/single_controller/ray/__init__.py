"""verl's import path ``verl.single_controller.ray``: starting and driving worker groups on Ray, as verl's trainers,
recipes and tests import them (:mod:`verl.single_controller.ray.base`)."""

from verl.single_controller.ray.base import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    create_colocated_worker_cls,
)

__all__ = ["RayClassWithInitArgs", "RayResourcePool", "RayWorkerGroup", "create_colocated_worker_cls"]
