"""verl's import path ``verl.single_controller.base.decorator``: ``register`` and the dispatch and execute modes a
worker method is registered with (:mod:`verl.single_controller.decorator`)."""

from verl.single_controller.decorator import Dispatch, Execute, register

__all__ = ["Dispatch", "Execute", "register"]
