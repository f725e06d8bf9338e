"""Tests of the parts of result collection that need no Ray cluster: the error a dead rank is reported as, and
the one-line account of a death. Collecting real calls (errors, deaths, grace periods) is tested on live groups in
``test_ray_worker_group.py`` and ``test_multinode.py``.
"""

from ray.exceptions import ActorDiedError

from verl.single_controller.results import WorkerDiedError, death_reason


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
