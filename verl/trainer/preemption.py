"""Stopping a run on SIGTERM or SIGINT: finish the step, save, stop the workers, and exit with a code of its own.

A preempted job (a scheduler's SIGTERM, an operator's Ctrl-C) should lose no finished work. :class:`StopSignals`
owns the driver's handlers of both signals. The first signal only records the request and logs one line saying what
happens next; the trainer sees the request between two steps, saves a checkpoint (the same ``global_step_N`` a
``trainer.save_freq`` save writes, atomic) unless the step it stands at is already saved, and raises
:class:`Preempted`; ``main_ppo`` then stops the workers and exits with its own code, and the same command resumes
exactly. A second signal stops at once: the handler raises :class:`StopAtOnce`, nothing more is saved (a save in
progress is abandoned, its temporary directory removed), and the last complete checkpoint stays as it was. A third
signal meets the default handlers.

Why the second signal raises a ``KeyboardInterrupt``: while the driver waits in ``ray.get`` / ``ray.wait``, Ray runs
the Python signal handlers itself and turns whatever they raise into a plain ``KeyboardInterrupt`` (a
``KeyboardInterrupt`` subclass is the only kind that gets through, and not as itself). So the caller catches
``KeyboardInterrupt`` and asks :attr:`StopSignals.stopped_at_once` whether it was ours.

Only the driver answers a stop signal, also when the signal goes to its whole process group (a Ctrl-C in the
terminal, ``timeout``, ``kill -- -PGID``, a scheduler signalling every process of the job): Ray's daemons (GCS,
raylet, agents) are the driver's children in its process group, and a SIGTERM would end them and the run with them.
:func:`children_ignore_sigterm` blocks SIGTERM while ``ray.init`` starts them; a blocked signal stays blocked across
``exec``, so they and the workers the raylet starts ignore it (Ray blocks SIGINT in them itself), and the driver
finishes the step, saves, and stops them. The cost: a graceful SIGTERM no longer ends them at shutdown, so Ray waits
its one second for each before it kills it. Ray's ``ray.init`` also installs its own SIGTERM handler in the driver (it
exits with status 15), so :meth:`StopSignals.install` must run again after Ray started.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

logger = logging.getLogger("verl.trainer")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopAtOnce(KeyboardInterrupt):
    """Raised by the second stop signal: stop now, without saving."""


class Preempted(Exception):
    """Raised by the trainer once it has answered a stop signal: the step finished and the checkpoint saved.

    Attributes:
        signal_name: the signal that asked for the stop (``SIGTERM``, ``SIGINT``).
        step: the last finished training step (0: none yet in this run).
        checkpoint: the checkpoint the same command resumes from (None: there is none; the next run starts over).
    """

    def __init__(self, signal_name: str, step: int, checkpoint: Path | None) -> None:
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint
        super().__init__(f"stopped on {signal_name} after step {step}")


class StopSignals:
    """The driver's SIGTERM and SIGINT handlers (see the module's docstring).

    Attributes:
        requested: the name of the first stop signal received, or None.
        stopped_at_once: the name of the second one, or None.
        step_in_progress: the training step being run, set by the trainer; None before the first.
    """

    def __init__(self) -> None:
        self.requested: str | None = None
        self.stopped_at_once: str | None = None
        self.step_in_progress: int | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> bool:
        """Handle both signals from now on (call again after ``ray.init``, which replaces the SIGTERM handler).

        Returns:
            False, and nothing changed, outside the main thread (only it may set signal handlers).
        """
        if threading.current_thread() is not threading.main_thread():
            logger.warning("not in the main thread: SIGTERM and SIGINT keep their default handling")
            return False
        for signum in STOP_SIGNALS:
            previous = signal.signal(signum, self._handle)
            self._previous.setdefault(signum, previous)
        return True

    def restore(self) -> None:
        """Put back the handlers found at the first :meth:`install` (a no-op when none was installed)."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def first_signal_message(self, name: str) -> str:
        """The line logged when the first stop signal arrives: what the run does now, and how to stop at once."""
        if self.step_in_progress is None:
            now = "stopping before the first training step"
        else:
            now = f"finishing step {self.step_in_progress}, then saving and stopping"
        return f"received {name}: {now}; send again to stop at once"

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.requested is None:
            self.requested = name
            logger.warning("%s", self.first_signal_message(name))
            return
        self.stopped_at_once = name
        logger.error("received %s again: stopping at once, without saving", name)
        # a third signal gets the default handling: Ctrl-C raises KeyboardInterrupt, SIGTERM ends the process
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise StopAtOnce(name)


@contextmanager
def children_ignore_sigterm() -> Iterator[None]:
    """Block SIGTERM in this thread while the block runs: the processes it starts (and theirs) inherit the block.

    A SIGTERM that reaches this process meanwhile waits, and is handled when the block ends. Outside the main thread,
    or where the platform has no signal masks, nothing changes.
    """
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
