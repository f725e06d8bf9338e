"""The driver's stop-signal handlers: the first SIGTERM / SIGINT is recorded and announced, the second stops at once.

Real signals are sent to this process (``signal.raise_signal``); each test installs the handlers first and restores
the previous ones after, so a signal never reaches pytest's own handling.
"""

import logging
import os
import signal
import subprocess
import sys

import pytest

from verl.trainer.preemption import StopAtOnce, StopSignals, children_ignore_sigterm


@pytest.fixture
def signals():
    handlers = StopSignals()
    assert handlers.install()
    yield handlers
    handlers.restore()


def test_first_signal_is_recorded_and_announced_with_the_step_in_progress(signals, caplog):
    signals.step_in_progress = 5
    with caplog.at_level(logging.WARNING, logger="verl.trainer"):
        signal.raise_signal(signal.SIGTERM)
    assert signals.requested == "SIGTERM" and signals.stopped_at_once is None
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["received SIGTERM: finishing step 5, then saving and stopping; send again to stop at once"]


def test_a_signal_before_the_first_step_says_so(signals, caplog):
    with caplog.at_level(logging.WARNING, logger="verl.trainer"):
        signal.raise_signal(signal.SIGINT)  # Ctrl-C: handled like SIGTERM, not a KeyboardInterrupt
    assert signals.requested == "SIGINT"
    assert caplog.records[-1].getMessage() == (
        "received SIGINT: stopping before the first training step; send again to stop at once"
    )


def test_second_signal_stops_at_once_and_a_third_gets_the_default(signals):
    signal.raise_signal(signal.SIGTERM)
    with pytest.raises(StopAtOnce):
        signal.raise_signal(signal.SIGINT)
    # the first signal's name stays the request; the second is recorded as the one that stopped at once
    assert (signals.requested, signals.stopped_at_once) == ("SIGTERM", "SIGINT")
    assert issubclass(StopAtOnce, KeyboardInterrupt)  # what crosses ray.get (see the module's docstring)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_restore_puts_back_the_handlers_found_at_the_first_install():
    def ray_like(signum, frame):  # what ray.init leaves in the driver
        raise AssertionError("not called in this test")

    before_int = signal.getsignal(signal.SIGINT)
    before_term = signal.signal(signal.SIGTERM, ray_like)
    try:
        handlers = StopSignals()
        handlers.install()
        handlers.install()  # again after ray.init: still restores to what was there first
        assert signal.getsignal(signal.SIGTERM) == handlers._handle
        handlers.restore()
        assert signal.getsignal(signal.SIGTERM) is ray_like and signal.getsignal(signal.SIGINT) is before_int
    finally:
        signal.signal(signal.SIGTERM, before_term)


def _signal_set(pid: int, field: str) -> int:
    """A signal bit field of ``/proc/<pid>/status`` (``SigBlk``: blocked; ``ShdPnd``: pending for the process)."""
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1], 16) for line in status if line.startswith(field + ":"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_process_started_inside_ignores_sigterm_and_the_drivers_mask_is_put_back():
    # what Ray's daemons get when ray.init starts them inside: a group's SIGTERM (timeout, a scheduler) stays pending
    # in them, for the driver alone to answer
    before = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    with children_ignore_sigterm():
        child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == before
        assert signal.SIGTERM not in before
        sigterm_bit = 1 << (signal.SIGTERM - 1)
        assert _signal_set(child.pid, "SigBlk") & sigterm_bit
        os.kill(child.pid, signal.SIGTERM)
        assert _signal_set(child.pid, "ShdPnd") & sigterm_bit  # waiting, not delivered: the child lives on
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()
