"""The test-only kill of ``fault_injection``: which call of which group it fires at, without a Ray cluster (a stand-in
group records its calls, a stand-in kill records the pid). The real kills run in ``test_multinode.py`` here and in
``tests/special_e2e/test_multinode.py``."""

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.single_controller.fault_injection import Killer, KillPlan, kill_in_every_group, kill_process


class StandInGroup:
    """What the kill uses of a ``RayWorkerGroup``: its name, each rank's pid, and a bound method."""

    def __init__(self, name_prefix: str, events: list) -> None:
        self.name_prefix = name_prefix
        self.placement = [{"pid": 100}, {"pid": 101}]
        self.events = events

    def update_actor(self, step: int) -> int:
        self.events.append(("call", self.name_prefix, step))
        return step

    def generate_sequences(self, step: int) -> int:
        self.events.append(("generate", self.name_prefix, step))
        return step


def test_kill_fires_once_at_the_planned_call_before_the_call_itself():
    events = []
    killer = Killer(KillPlan.parse("actor_rollout_ref:1:update_actor:3"), kill=lambda pid: events.append(("kill", pid)))
    first, rebuilt = StandInGroup("actor_rollout_ref", events), StandInGroup("actor_rollout_ref", events)
    critic = StandInGroup("critic", events)
    for group in (first, rebuilt, critic):
        killer.arm(group)
    # calls 1 and 2 on the first group, call 3 on it kills rank 1 (pid 101) and then runs; the rebuilt group's
    # call is the 4th of the process and passes
    results = [first.update_actor(1), first.update_actor(2), first.update_actor(3), rebuilt.update_actor(4)]
    assert results == [1, 2, 3, 4]
    # another method and another group are neither counted nor hit
    first.generate_sequences(5)
    critic.update_actor(6)
    assert events == [
        ("call", "actor_rollout_ref", 1),
        ("call", "actor_rollout_ref", 2),
        ("kill", 101),
        ("call", "actor_rollout_ref", 3),
        ("call", "actor_rollout_ref", 4),
        ("generate", "actor_rollout_ref", 5),
        ("call", "critic", 6),
    ]
    assert killer.num_calls == 4


@pytest.mark.parametrize("text", ["actor:1:update", "actor:x:update_actor:3", "actor:1:update_actor:0"])
def test_malformed_plan_is_refused_with_its_format(text):
    with pytest.raises(ValueError, match=r"is not <group>:<rank>:<method>:<call>"):
        KillPlan.parse(text)


def test_kill_process_returns_once_the_process_is_gone():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        kill_process(child.pid)
        # already ended when kill_process returned (poll does not wait), and by SIGKILL
        assert child.poll() == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()


def test_every_group_built_after_arming_is_armed(monkeypatch):
    from verl.single_controller import RayWorkerGroup

    def build_without_ray(group, name_prefix):
        group.name_prefix = name_prefix
        group.update_actor = lambda step: step

    # both restored after the test, the arming's wrapper of the constructor included
    monkeypatch.setattr(RayWorkerGroup, "__init__", build_without_ray)
    monkeypatch.setattr(RayWorkerGroup, "placement", [{"pid": 100}, {"pid": 101}])
    killed = []
    kill_in_every_group(KillPlan("actor_rollout_ref", 0, "update_actor", 1), kill=killed.append)
    assert RayWorkerGroup("actor_rollout_ref").update_actor(7) == 7 and killed == [100]  # rank 0's pid
    assert RayWorkerGroup("critic").update_actor(8) == 8 and killed == [100]  # another group: not armed


def test_the_trainer_and_the_worker_group_carry_no_fault_hook():
    from verl.single_controller import Worker

    # the kill comes from the test's side only: no test-named switch in production code, no suicide method
    sources = {p: p.read_text() for p in (Path(__file__).resolve().parents[2] / "verl").rglob("*.py")}
    assert [str(p) for p, text in sources.items() if "VERL_TEST" in text or "die_now" in text] == []
    assert not hasattr(Worker, "die_now")
