"""Killing a worker mid-call from outside the worker group: the fault that the tests of worker deaths inject.

A kill is planned as ``<group>:<rank>:<method>:<call>`` (e.g. ``actor_rollout_ref:1:update_actor:3``): the
``<call>``-th call of ``<method>`` on a group named ``<group>``, counted from 1 over the process (so a group rebuilt
after the death does not repeat it), first SIGKILLs rank ``<rank>``'s process, as the OOM killer or a lost node
would, waits until it is gone, and then makes the call: the other ranks run the method (and wait in its collectives
for the dead one), the dead rank's share meets a dead actor. Only the group's public surface is used (its bound
methods, and each rank's ``pid`` in ``placement``), so the worker processes must run on this machine, as those of a
``ray.cluster_utils.Cluster`` do. :func:`kill_in_every_group` arms every group a process builds afterwards, for a
trainer run as a whole (``tests/special_e2e/main_ppo_killing_a_worker.py``).
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

# How long a SIGKILLed process may take to be gone before the test calls it stuck.
GONE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class KillPlan:
    """Which rank of which group dies at which call of which method (``call`` counted from 1)."""

    group: str
    rank: int
    method: str
    call: int

    @classmethod
    def parse(cls, text: str) -> KillPlan:
        """``<group>:<rank>:<method>:<call>`` as a plan.

        Raises:
            ValueError: the text is not of that form, or the rank or the call is not a count (call >= 1).
        """
        parts = text.split(":")
        if len(parts) != 4 or not parts[1].isdigit() or not parts[3].isdigit() or int(parts[3]) < 1:
            raise ValueError(
                f"{text!r} is not <group>:<rank>:<method>:<call>, e.g. actor_rollout_ref:1:update_actor:3."
            )
        return cls(parts[0], int(parts[1]), parts[2], int(parts[3]))


def kill_process(pid: int) -> None:
    """SIGKILL ``pid`` and wait until it is gone (exited or a zombie), so that nothing runs there any more."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while not _is_gone(pid):
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} still runs {GONE_TIMEOUT_S:g} s after SIGKILL")
        time.sleep(0.01)


def _is_gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")  # the state follows the command name in parentheses


class Killer:
    """Carries out one :class:`KillPlan` on the groups it arms, counting the planned method's calls over all of
    them; ``kill`` (a pid to kill) is :func:`kill_process` unless a test gives its own."""

    def __init__(self, plan: KillPlan, kill: Callable[[int], None] = kill_process) -> None:
        self.plan = plan
        self.num_calls = 0
        self._kill = kill

    def arm(self, group) -> None:
        """Wrap ``group``'s planned method if the group has the planned name (a role's group hosted in a shared
        process, by its role's name); other groups are left alone."""
        if self.plan.group not in (group.name_prefix, getattr(group, "role", None)):
            return
        method = getattr(group, self.plan.method)

        @functools.wraps(method)
        def call_then_maybe_die(*args, **kwargs):
            self._count_and_maybe_kill(group)
            return method(*args, **kwargs)

        setattr(group, self.plan.method, call_then_maybe_die)
        submit = getattr(group, "submit", None)
        if submit is None:
            return

        @functools.wraps(submit)
        def submit_then_maybe_die(method_name, *args, **kwargs):  # the calls a driver starts without waiting
            if method_name == self.plan.method:
                self._count_and_maybe_kill(group)
            return submit(method_name, *args, **kwargs)

        group.submit = submit_then_maybe_die

    def _count_and_maybe_kill(self, group) -> None:
        self.num_calls += 1
        if self.num_calls == self.plan.call:
            pid = group.placement[self.plan.rank]["pid"]
            logger.warning(
                "fault injection: killing %s rank %d (pid %d) at call %d of %s",
                group.name_prefix,
                self.plan.rank,
                pid,
                self.num_calls,
                self.plan.method,
            )
            self._kill(pid)


def kill_in_every_group(plan: KillPlan, kill: Callable[[int], None] = kill_process) -> Killer:
    """Arm every ``RayWorkerGroup`` this process builds from now on with ``plan`` (the group's constructor is
    wrapped for the rest of the process: meant for a process that runs one trainer and exits)."""
    from verl.single_controller import RayWorkerGroup

    killer = Killer(plan, kill)
    build = RayWorkerGroup.__init__

    @functools.wraps(build)
    def build_and_arm(group, *args, **kwargs):
        build(group, *args, **kwargs)
        killer.arm(group)

    RayWorkerGroup.__init__ = build_and_arm
    spawn = RayWorkerGroup.spawn

    @functools.wraps(spawn)
    def spawn_and_arm(group, *args, **kwargs):  # the groups of the roles that share a process
        role_groups = spawn(group, *args, **kwargs)
        for role_group in role_groups.values():
            killer.arm(role_group)
        return role_groups

    RayWorkerGroup.spawn = spawn_and_arm
    return killer
