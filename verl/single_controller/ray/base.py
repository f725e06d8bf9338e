"""verl's import path ``verl.single_controller.ray.base``: the worker-group classes
(:mod:`verl.single_controller.ray_worker_group`, :mod:`verl.single_controller.placement`) and verl's form of
``create_colocated_worker_cls``, which takes and returns :class:`RayClassWithInitArgs`.

verl's way of hosting several roles in one process per rank works unchanged::

    cls = create_colocated_worker_cls({"actor": RayClassWithInitArgs(ActorWorker, config=a),
                                       "critic": RayClassWithInitArgs(CriticWorker, config=c)})
    groups = RayWorkerGroup(pool, cls).spawn(prefix_set={"actor", "critic"})
    groups["critic"].init_model()
"""

from __future__ import annotations

from verl.single_controller import colocated
from verl.single_controller.placement import RayResourcePool
from verl.single_controller.ray_worker_group import RayClassWithInitArgs, RayWorkerGroup

__all__ = ["RayClassWithInitArgs", "RayResourcePool", "RayWorkerGroup", "create_colocated_worker_cls"]


def create_colocated_worker_cls(class_dict: dict[str, RayClassWithInitArgs]) -> RayClassWithInitArgs:
    """The roles of ``class_dict`` (role name -> worker class with its constructor's keyword arguments) hosted in one
    process per rank: a :class:`RayClassWithInitArgs` of the colocated class
    (:func:`verl.single_controller.colocated.create_colocated_worker_cls`) whose group hands out one group per role
    with :meth:`RayWorkerGroup.spawn`.

    Raises:
        ValueError: a role's class takes positional arguments (give them by name), or a role is refused by
            :func:`~verl.single_controller.colocated.create_colocated_worker_cls`.
    """
    positional = [role for role, item in class_dict.items() if item.args]
    if positional:
        raise ValueError(f"roles {positional}: give their constructor arguments by name; positional ones are not kept.")
    cls = colocated.create_colocated_worker_cls({role: item.cls for role, item in class_dict.items()})
    return RayClassWithInitArgs(cls, roles={role: (item.cls, dict(item.kwargs)) for role, item in class_dict.items()})
