"""Tests of the parts of result collection that need no Ray cluster: the error a dead rank is reported as, the
one-line account of a death, and which rank a collective timeout blames (over stand-in refs, ``ray`` replaced).
Collecting real calls (errors, deaths, grace periods, a hung rank) is tested on live groups in
``test_ray_worker_group.py`` and ``test_multinode.py``.
"""

import pytest
from ray.exceptions import ActorDiedError, RayTaskError

import verl.single_controller.results as results
from verl.single_controller.results import CollectiveTimeoutError, WorkerDiedError, death_reason, is_collective_timeout


def test_death_reason_keeps_the_cause_and_drops_the_boilerplate():
    err = ActorDiedError()
    err.error_msg = (
        "The actor died unexpectedly before finishing this task.\n\tclass_name: W\n\tactor_id: 01ab\n\tpid: 7\n"
        "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR End of file. "
        "Some common causes include: (1) the OOM killer"
    )
    assert death_reason(err) == (
        "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR End of file."
    )


def test_worker_died_error_names_role_rank_and_node():
    err = WorkerDiedError("critic", 3, "node-id-hex", "10.0.0.7", "its node died")
    assert str(err) == "worker critic rank 3 on node node-id-hex (10.0.0.7) died: its node died"
    assert (err.role, err.rank, err.node_id, err.node_ip) == ("critic", 3, "node-id-hex", "10.0.0.7")


def test_gloo_and_nccl_timeouts_are_collective_timeouts_and_a_lost_peer_is_not():
    # gloo in the rank that waited (torch 2.13's wording), and the NCCL watchdog's
    gloo = RuntimeError(
        "[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 2000ms for recv "
        "operation to complete"
    )
    nccl = RuntimeError("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE)")
    assert is_collective_timeout(gloo) and is_collective_timeout(nccl)
    # what the late rank gets once the others gave up, and an error that merely mentions a timeout
    assert not is_collective_timeout(RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:36262"))
    assert not is_collective_timeout(ValueError("timeout_s must be a number of seconds > 0"))


def _group_on_two_nodes():
    from verl.single_controller.ray_worker_group import RayWorkerGroup

    group = object.__new__(RayWorkerGroup)  # only its name, placement and timeout: no Ray
    group.name_prefix, group._collective_timeout_s = "actor_rollout_ref", 2.0
    group._placement = [{"node_id": "node-a", "node_ip": "10.0.0.1"}, {"node_id": "node-b", "node_ip": "10.0.0.2"}]
    return group


def test_a_hang_names_the_rank_the_others_waited_for_and_its_node():
    timeout = RuntimeError("Timed out waiting 2000ms for recv operation to complete")
    err = _group_on_two_nodes()._hang("update_actor", awaited=[1], timed_out={0: timeout}, still_running=[1])
    assert isinstance(err, CollectiveTimeoutError) and isinstance(err, WorkerDiedError)  # restarts cover it
    assert (err.role, err.rank, err.node_id, err.node_ip) == ("actor_rollout_ref", 1, "node-b", "10.0.0.2")
    assert str(err) == (
        "worker actor_rollout_ref rank 1 on node node-b (10.0.0.2) hung in a collective: rank(s) 0 waited for it in a "
        "collective of update_actor until their collective timeout of 2 s ran out (Timed out waiting 2000ms for recv "
        "operation to complete); it was still running then: it hangs, or is far slower than the others"
    )


def test_a_rank_that_returned_without_joining_is_named_as_such_and_all_timed_out_names_the_lowest():
    timeout = RuntimeError("Timed out waiting 2000ms for recv operation to complete")
    group = _group_on_two_nodes()
    skipped = group._hang("all_reduce_on", awaited=[1], timed_out={0: timeout}, still_running=[])
    assert skipped.rank == 1 and skipped.reason.endswith("it had returned without joining that collective")
    both = group._hang("update_actor", awaited=[], timed_out={0: timeout, 1: timeout}, still_running=[])
    assert (both.rank, both.node_id) == (0, "node-a") and "every rank timed out" in both.reason


class _Ref:
    """A stand-in for a rank's object ref: a value, an exception the worker raised, or still running."""

    def __init__(self, value=None, error=None, running=False):
        self.value, self.error, self.running = value, error, running


class _FakeRay:
    """``ray.wait`` / ``ray.get`` over :class:`_Ref`: finished refs are ready in order, running ones never."""

    @staticmethod
    def wait(pending, num_returns, timeout):
        done = [ref for ref in pending if not ref.running]
        return (done[:1], [ref for ref in pending if ref is not done[0]]) if done else ([], pending)

    @staticmethod
    def get(ref):
        if ref.error is not None:
            raise RayTaskError("run_timed", "worker traceback", ref.error)
        return ref.value


def collect(monkeypatch, refs):
    """get_all over ``refs`` (ranks 0..n-1); returns what on_hang was called with, or raises the other error."""
    monkeypatch.setattr(results, "ray", _FakeRay)
    calls = []

    def on_hang(awaited, timed_out, still_running):
        calls.append((awaited, sorted(timed_out), still_running))
        return RuntimeError("hang")

    with pytest.raises(RuntimeError, match="hang"):
        results.get_all(refs, list(range(len(refs))), on_hang=on_hang)
    return calls[0]


TIMEOUT = RuntimeError("[unbound_buffer.cc:78] Timed out waiting 2000ms for recv operation to complete")


def test_the_rank_still_running_when_the_others_timed_out_is_the_one_awaited(monkeypatch):
    # ranks 0 and 2 timed out; rank 1 never finished (it hangs): rank 1 is awaited and still running
    refs = [_Ref(error=TIMEOUT), _Ref(running=True), _Ref(error=TIMEOUT)]
    assert collect(monkeypatch, refs) == ([1], [0, 2], [1])


def test_a_late_rank_that_found_its_peers_gone_is_still_the_one_awaited(monkeypatch):
    late = RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:36262")
    assert collect(monkeypatch, [_Ref(error=TIMEOUT), _Ref(error=late)]) == ([1], [0], [])


def test_the_hung_rank_is_named_before_a_lower_rank_that_found_its_peers_gone(monkeypatch):
    # 4 gloo ranks: rank 3 never joins; rank 1, a ring neighbour of ranks that timed out, gets "connection closed by
    # peer" although it joined in time. The hung rank 3 comes first, not rank 1 for its lower number.
    late = RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:36262")
    refs = [_Ref(error=TIMEOUT), _Ref(error=late), _Ref(error=TIMEOUT), _Ref(running=True)]
    assert collect(monkeypatch, refs) == ([3, 1], [0, 2], [3])


def test_a_rank_that_failed_on_its_own_is_reported_instead_of_a_hang(monkeypatch):
    # rank 1 raised before the collective: rank 0's timeout follows from it, so rank 1's error is the one raised
    monkeypatch.setattr(results, "ray", _FakeRay)
    refs = [_Ref(error=TIMEOUT), _Ref(error=ValueError("bad batch on rank 1"))]
    with pytest.raises(ValueError, match="bad batch on rank 1") as info:
        results.get_all(refs, [0, 1], on_hang=lambda *args: AssertionError("not a hang"))
    assert info.value.rank == 1
