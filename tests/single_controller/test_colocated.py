"""Tests for verl.single_controller.colocated: roles hosted in one process, in-process and through a Ray group."""

import pytest
import ray
import torch

from tests.single_controller.remote_helpers import DiceWorker, EchoWorker, start_local_ray
from verl.protocol import DataProto
from verl.single_controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from verl.single_controller.colocated import ColocatedWorker, create_colocated_worker_cls, role_method_name
from verl.single_controller.decorator import Dispatch, registered_methods
from verl.single_controller.worker import Worker


def _alone(seed: int, draws: list[int]) -> list[list[float]]:
    """What a DiceWorker draws in a process of its own: seeded in its constructor, then ``draws`` calls."""
    torch.manual_seed(12345)  # whatever the process held before: the constructor reseeds
    worker = DiceWorker(seed)
    return [worker.roll(count) for count in draws]


def test_each_role_method_is_registered_under_its_role_with_the_roles_spec():
    cls = create_colocated_worker_cls({"a": DiceWorker, "b": EchoWorker})
    specs = registered_methods(cls)
    assert specs["a__roll"] == registered_methods(DiceWorker)["roll"]
    assert specs["b__tag_rows"].dispatch_mode is Dispatch.DP_COMPUTE_PROTO
    assert role_method_name("b", "later") in specs  # EchoWorker's concurrency-group method keeps its group
    assert specs["b__later"].concurrency_group == registered_methods(EchoWorker)["later"].concurrency_group
    assert cls.ROLE_CLASSES == {"a": DiceWorker, "b": EchoWorker}


def test_roles_draw_the_numbers_they_would_draw_alone_however_their_calls_interleave():
    cls = create_colocated_worker_cls({"a": DiceWorker, "b": DiceWorker})
    torch.manual_seed(999)
    worker = cls(roles={"a": (DiceWorker, {"seed": 1}), "b": (DiceWorker, {"seed": 2})})
    outside = torch.get_rng_state()
    # a, b, b, a: each role continues its own stream; the process's own state is left as it was
    drawn_a = [worker.a__roll(3)]
    drawn_b = [worker.b__roll(2), worker.b__roll(4)]
    drawn_a.append(worker.call_role("a", "roll", 5))
    assert torch.equal(torch.get_rng_state(), outside)
    assert drawn_a == _alone(1, [3, 5])
    assert drawn_b == _alone(2, [2, 4])
    assert worker.call_role("b", "layout") == (0, 2)  # plain methods too


def test_bad_roles_are_refused_by_name():
    with pytest.raises(ValueError, match="at least one role"):
        create_colocated_worker_cls({})
    with pytest.raises(ValueError, match="contains '__'"):
        create_colocated_worker_cls({"a__b": DiceWorker})
    with pytest.raises(ValueError, match="not a subclass of verl.single_controller.Worker"):
        create_colocated_worker_cls({"a": dict})
    with pytest.raises(ValueError, match="not a ColocatedWorker"):
        create_colocated_worker_cls({"a": DiceWorker}, base=DiceWorker)
    worker = ColocatedWorker({"a": (DiceWorker, {"seed": 1})})
    with pytest.raises(ValueError, match=r"hosts the roles \['a'\], not 'b'"):
        worker.call_role("b", "roll", 1)


@pytest.fixture(scope="module")
def colocated_group():
    start_local_ray()
    pool = RayResourcePool(num_workers=2, num_cpus_per_worker=0.5)
    cls = create_colocated_worker_cls({"dice": DiceWorker, "echo": EchoWorker})
    roles = {"dice": (DiceWorker, {"seed": 7}), "echo": (EchoWorker, {"offset": 100})}
    group = RayWorkerGroup(pool, RayClassWithInitArgs(cls, roles=roles), name_prefix="dice+echo")
    yield group
    group.shutdown()
    ray.shutdown()


def test_role_groups_dispatch_like_groups_of_their_own_class_in_one_process_per_rank(colocated_group):
    roles = colocated_group.spawn()
    dice, echo = roles["dice"], roles["echo"]
    assert (dice.role, echo.role, dice.world_size) == ("dice", "echo", 2)
    # 5 rows padded to 6 and split 3 + 3, as a group of DiceWorker alone would (tests of ray_worker_group)
    marked = dice.mark_rows(DataProto.from_dict(tensors={"x": torch.arange(5)}))
    assert marked.batch["rank"].tolist() == [0, 0, 0, 1, 1]
    assert echo.rank_zero_value(1) == (0, 101)  # the echo role's own constructor arguments
    assert echo.add([1, 2], b=[10, 20]) == [(0, 11), (1, 22)]
    # both roles of a rank run in that rank's one process
    pids = [info["pid"] for info in colocated_group.placement]
    assert marked.batch["pid"].tolist() == [pids[0]] * 3 + [pids[1]] * 2
    assert dice.execute_all("layout") == [(0, 7), (1, 7)]  # unregistered methods reach the role's worker
    assert dice.roll(2)[0] == _alone(7, [2])[0]  # rank 0 draws what a DiceWorker(7) draws alone
    assert set(dice.pop_call_timings()) == {"mark_rows", "roll"}  # each role group times its own calls
    assert set(echo.pop_call_timings()) == {"rank_zero_value", "add"}
    assert list(colocated_group.spawn({"echo"})) == ["echo"]  # verl's prefix_set picks roles
    with pytest.raises(ValueError, match=r"hosts the roles \['dice', 'echo'\], not \['critic'\]"):
        colocated_group.spawn({"critic"})


def test_a_group_that_hosts_no_roles_cannot_spawn(colocated_group):
    pool = RayResourcePool(num_workers=1, num_cpus_per_worker=0.1)
    plain = RayWorkerGroup(pool, RayClassWithInitArgs(EchoWorker), name_prefix="plain")
    try:
        with pytest.raises(ValueError, match="not a colocated worker class"):
            plain.spawn()
    finally:
        plain.shutdown()


def test_shutting_a_role_group_down_stops_the_processes_of_every_role(colocated_group):
    roles = colocated_group.spawn()
    roles["echo"].shutdown()
    assert colocated_group.workers == [] and roles["dice"].workers == []
    colocated_group.shutdown()  # twice is safe


def test_verls_import_paths_and_form_take_classes_with_init_args_and_spawn_by_prefix_set(colocated_group):
    from verl.single_controller.base import Worker as BaseWorker
    from verl.single_controller.base.decorator import Dispatch as BaseDispatch
    from verl.single_controller.ray import RayClassWithInitArgs
    from verl.single_controller.ray import create_colocated_worker_cls as verl_form
    from verl.single_controller.ray.base import RayResourcePool as BasePool
    from verl.single_controller.ray.base import RayWorkerGroup as BaseGroup

    assert (BaseWorker, BaseDispatch, BasePool, BaseGroup) == (Worker, Dispatch, RayResourcePool, RayWorkerGroup)
    hosted = verl_form({"a": RayClassWithInitArgs(DiceWorker, seed=3), "b": RayClassWithInitArgs(EchoWorker, offset=5)})
    group = RayWorkerGroup(RayResourcePool(num_workers=1, num_cpus_per_worker=0.1), hosted, name_prefix="verl_form")
    try:
        roles = group.spawn(prefix_set={"a", "b"})
        assert roles["b"].rank_zero_value(1) == (0, 6)  # offset 5 from the role's own init arguments
        assert roles["a"].roll(2) == [_alone(3, [2])[0]]  # one rank: the list of its one result
    finally:
        group.shutdown()
    with pytest.raises(ValueError, match="give their constructor arguments by name"):
        verl_form({"a": RayClassWithInitArgs(DiceWorker, 3)})
