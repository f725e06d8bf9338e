"""verl's import path ``verl.single_controller.base``: the worker side of the single controller (``Worker``), as
verl's own code and its users' workers import it. The classes live in :mod:`verl.single_controller.worker`."""

from verl.single_controller.worker import Worker

__all__ = ["Worker"]
