"""verl's import path ``verl.single_controller.base.worker``: :class:`~verl.single_controller.worker.Worker`."""

from verl.single_controller.worker import Worker

__all__ = ["Worker"]
