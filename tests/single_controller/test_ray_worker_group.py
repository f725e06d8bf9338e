"""Tests for verl.single_controller.ray_worker_group: two Ray actors driven through every dispatch mode.

One Ray session and one worker group serve the whole module (Ray takes seconds to start on a small box).
The worker classes live in ``remote_helpers`` so that the Ray worker processes can import them.
"""

import pytest
import ray
import torch
from ray.exceptions import RayActorError

from tests.single_controller.remote_helpers import EchoWorker, ExpectedWorkerError, start_local_ray
from verl.protocol import DataProto
from verl.single_controller import PendingResult, RayClassWithInitArgs, RayResourcePool, RayWorkerGroup


@pytest.fixture(scope="module")
def group():
    start_local_ray()
    # Half a CPU each: both workers fit on a 2-core box next to anything else the tests start.
    pool = RayResourcePool(num_workers=2, num_cpus_per_worker=0.5)
    worker_group = RayWorkerGroup(pool, RayClassWithInitArgs(EchoWorker, offset=100), name_prefix="echo_test")
    yield worker_group
    worker_group.shutdown()
    ray.shutdown()


def make_batch(num_rows: int) -> DataProto:
    return DataProto.from_dict(
        tensors={"x": torch.arange(num_rows) * 10}, non_tensors={"uid": [f"u{i}" for i in range(num_rows)]}
    )


def test_world_size_and_env(group):
    assert group.world_size == 2
    # Each worker read RANK / WORLD_SIZE from the environment the group gave it.
    assert group.whoami("!") == ["rank0/2!", "rank1/2!"]


def test_dp_compute_proto_pads_chunks_and_unpads(group):
    # 5 rows are padded to 6 (row 0 repeated), chunked 3 + 3: rank 0 gets rows 0-2, rank 1 rows 3, 4 and the pad.
    out = group.tag_rows(make_batch(5), scale=2)
    assert isinstance(out, DataProto)
    assert len(out) == 5
    assert out.batch["rank"].tolist() == [0, 0, 0, 1, 1]
    assert out.batch["x"].tolist() == [0, 20, 40, 60, 80]  # x = 10 * i, times scale 2, rows in order
    assert list(out.non_tensor_batch["uid"]) == ["u0", "u1", "u2", "u3", "u4"]


def test_dp_compute_proto_keyword_batch(group):
    out = group.tag_rows(data=make_batch(4))
    # 4 rows need no padding: 2 per rank.
    assert out.batch["rank"].tolist() == [0, 0, 1, 1]
    assert out.batch["x"].tolist() == [0, 10, 20, 30]


def test_dp_compute_proto_non_dataproto_outputs_are_listed(group):
    # 5 rows padded to 6 give each rank 3 rows (the padding row is counted on rank 1).
    assert group.row_metrics(make_batch(5)) == [{"rank": 0, "num_rows": 3}, {"rank": 1, "num_rows": 3}]


def test_one_to_all_rank_zero_and_all_to_all(group):
    assert group.rank_zero_value(1) == (0, 101)  # only rank 0 ran; offset 100 came from the init kwargs
    assert group.add([1, 2], b=[10, 20]) == [(0, 11), (1, 22)]
    assert group.only_rank_zero() == 0


def test_all_to_all_rejects_wrong_length(group):
    with pytest.raises(ValueError, match="one entry per rank"):
        group.add([1, 2, 3])


def test_non_blocking_call_returns_pending_result(group):
    pending = group.later(4)
    assert isinstance(pending, PendingResult)
    assert pending.get() == [40, 41]


def test_submit_starts_a_registered_call_and_unfinished_ranks_names_the_late_ones(group):
    # nap sleeps 0.5 s x (rank + 1): after 0.2 s neither rank has returned; once both have, none is late
    pending = group.submit("nap", 0.5)
    assert pending.unfinished_ranks(0.2) == [0, 1]
    assert pending.unfinished_ranks(30.0) == []
    assert pending.get() == [0, 1]
    with pytest.raises(ValueError, match="no @register'ed method 'plain_method'"):
        group.submit("plain_method", 1)
    error = group.generation_timeout(1, 5.0)
    assert error.role == group.name_prefix and error.rank == 1
    assert "returned no samples in time: no result 5 s after it was awaited" in str(error)


def test_a_call_of_a_concurrency_group_runs_while_a_default_call_is_still_running(group):
    # nap keeps each rank's default thread busy for 5 s (rank 0) and 10 s (rank 1); side_call, in its own group,
    # answers meanwhile, so nap has not finished on either rank when side_call's answer is in
    pending = group.submit("nap", 5.0)
    assert group.side_call() == [0, 1]
    assert pending.unfinished_ranks(0.0) == [0, 1]
    assert pending.get() == [0, 1]


def test_every_call_records_its_time_and_the_slowest_ranks_work(group):
    group.pop_call_timings()
    assert group.nap(0.05) == [0, 1]
    group.tag_rows(make_batch(4))
    group.tag_rows(make_batch(2))
    timings = group.pop_call_timings()
    assert sorted(timings) == ["nap", "tag_rows"] and len(timings["tag_rows"]) == 2
    (nap,) = timings["nap"]
    # rank 1 slept 0.1 s; the call as the driver saw it took at least that, plus the trip
    assert 0.1 <= nap.worker_s <= nap.wall_s and nap.overhead_s == nap.wall_s - nap.worker_s
    assert group.pop_call_timings() == {}  # popped: the next step starts from nothing


def test_execute_all_reaches_unregistered_methods(group):
    assert group.execute_all("plain_method", 5) == [5, 6]
    with pytest.raises(ValueError, match="no method"):
        group.execute_all("no_such_method")


def test_torch_distributed_all_reduce_over_gloo(group):
    assert group.init_torch_distributed(backend="gloo") == [True, True]
    assert group.init_torch_distributed() == [False, False]  # already initialised: a no-op
    assert group.backend() == ["gloo", "gloo"]
    # rank + 1 summed over ranks 0 and 1: 1 + 2 = 3.
    assert group.all_reduce_rank_plus_one() == [3.0, 3.0]


def test_worker_exception_keeps_type_and_message(group):
    with pytest.raises(ExpectedWorkerError) as info:
        group.fail(only_rank=1)
    err = info.value
    assert str(err) == "step 3 failed on purpose (grad norm inf), rank 1"
    assert err.rank == 1
    assert "ExpectedWorkerError" in err.remote_traceback
    # The group is still usable after a failed call.
    assert group.whoami("") == ["rank0/2", "rank1/2"]


def test_same_error_on_every_rank_is_raised_once(group, caplog):
    with pytest.raises(ExpectedWorkerError, match="^the same message on every rank$") as info:
        group.fail_same_message()
    assert info.value.rank == 0  # the lowest failed rank is the one reported
    assert "also failed" not in caplog.text


def test_different_errors_report_lowest_rank_and_log_the_rest(group, caplog):
    with pytest.raises(ExpectedWorkerError, match="rank 0$"):
        group.fail()
    assert "rank 1 also failed" in caplog.text


def test_second_group_with_name_prefix_and_shutdown(group):
    # A fresh group (its own torch.distributed world) next to the module's one; shutdown kills its actors.
    # its runtime environment's variables reach the worker, next to the group's own (RANK, WORLD_SIZE)
    other = RayWorkerGroup(
        RayResourcePool(1, num_cpus_per_worker=0.25),
        RayClassWithInitArgs(EchoWorker),
        "solo",
        runtime_env={"env_vars": {"TORCH_NCCL_BLOCKING_WAIT": "1"}},
    )
    assert other.world_size == 1
    assert other.whoami("") == ["rank0/1"]
    assert other.env("TORCH_NCCL_BLOCKING_WAIT") == ["1"] and group.env("TORCH_NCCL_BLOCKING_WAIT") == [None, None]
    handle = ray.get_actor("solo_0")
    other.shutdown()
    other.shutdown()  # idempotent
    assert other.workers == []
    with pytest.raises(RayActorError):
        ray.get(handle.whoami.remote(""))
