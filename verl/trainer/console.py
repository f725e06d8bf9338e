"""What the driver writes to the console: its log format, streams that outlive their reader, and the progress bar.

:func:`setup_logging` sets the driver's log format on stderr, puts chatty third-party loggers at WARNING, and makes
stdout and stderr survive a reader that went away (:class:`ReaderGoneSafe`): under ``... | tee log`` a Ctrl-C ends
``tee`` at once, while the run goes on to finish its step and save; from then on its output goes to ``/dev/null``
instead of raising ``BrokenPipeError`` in whatever code printed (the progress bar, a log record, a worker's line
relayed by Ray) and turning a clean stop into a crash.

:class:`StepProgress` is the training progress bar. It is drawn only on a terminal (in a pipe or a file, each
step's log line is the progress, and a bar's carriage returns would glue its states onto the log lines), its postfix
always belongs to the step it counts, and it keeps to its own line: while it is open, every complete line written to
stdout or stderr (log records, warnings, the workers' lines Ray relays) is written above it.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any, TextIO

from tqdm import tqdm

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# loggers whose INFO records are about their own plumbing, not the run
QUIET_LOGGERS = ("urllib3", "filelock", "matplotlib", "ray")


def setup_logging() -> None:
    """The driver's logging: INFO records in :data:`LOG_FORMAT` on stderr, stdout and stderr reader-safe first."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, ReaderGoneSafe):
            setattr(sys, name, ReaderGoneSafe(stream))
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, stream=sys.stderr, force=True)
    for noisy in QUIET_LOGGERS:
        logging.getLogger(noisy).setLevel(logging.WARNING)


class _StreamProxy:
    """Every attribute of the wrapped text stream except the ones a subclass defines."""

    def __init__(self, stream: TextIO) -> None:
        self.wrapped = stream

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)


class ReaderGoneSafe(_StreamProxy):
    """A text stream whose writes, once the reading end of its pipe is closed, go to ``/dev/null``.

    The first ``BrokenPipeError`` points the stream's file descriptor at ``/dev/null`` (so that Python's own flush at
    exit, and C code writing to the same descriptor, find it writable too); nothing is raised to the writer.
    """

    def write(self, text: str) -> int:
        try:
            return self.wrapped.write(text)
        except BrokenPipeError:
            self._to_devnull()
            return len(text)

    def flush(self) -> None:
        try:
            self.wrapped.flush()
        except BrokenPipeError:
            self._to_devnull()

    def _to_devnull(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self.wrapped.fileno())
        finally:
            os.close(devnull)


class _AboveTheBar(_StreamProxy):
    """A text stream that writes complete lines above the open bars of ``bar_stream`` (a partial line waits)."""

    def __init__(self, stream: TextIO, bar_stream: TextIO) -> None:
        super().__init__(stream)
        self._bar_stream = bar_stream
        self._pending = ""
        self._lock = threading.Lock()  # Ray relays the workers' lines from a thread of its own

    def write(self, text: str) -> int:
        with self._lock:
            lines, newline, self._pending = (self._pending + text).rpartition("\n")
            if newline:
                self._write_above(lines + newline)
        return len(text)

    def flush(self) -> None:
        self.wrapped.flush()

    def close_line(self) -> None:
        """Write what waits for its newline (when the bar closes)."""
        with self._lock:
            if self._pending:
                self._write_above(self._pending + "\n")
                self._pending = ""

    def _write_above(self, lines: str) -> None:
        with tqdm.external_write_mode(file=self._bar_stream):
            self.wrapped.write(lines)
            self.wrapped.flush()


class StepProgress:
    """The training progress bar: ``with StepProgress(total, initial, enabled) as progress: progress.step(...)``.

    Args:
        total: the run's number of training steps.
        initial: the step it starts after (a resumed run's step).
        enabled: ``trainer.progress_bar``; the bar is drawn only when stderr is also a terminal.
    """

    def __init__(self, total: int, initial: int, enabled: bool) -> None:
        self.stream = sys.stderr
        self.shown = bool(enabled) and _is_terminal(self.stream)
        self._bar: tqdm | None = None
        self._saved: list[tuple[Any, str, Any]] = []  # (owner, attribute, value) to put back on close
        self._total, self._initial = total, initial

    def __enter__(self) -> StepProgress:
        if self.shown:
            # redrawn on every step (steps are seconds apart), so that the last drawn state is always the step's own
            self._bar = tqdm(
                total=self._total,
                initial=self._initial,
                desc="training",
                file=self.stream,
                dynamic_ncols=True,
                mininterval=0,
                miniters=1,
            )
            self._redirect_lines_above_the_bar()
        return self

    def step(self, **postfix: Any) -> None:
        """Count one finished step, shown with its own ``postfix`` (e.g. ``reward=0.41, failed=3``) in one redraw."""
        if self._bar is not None:
            self._bar.set_postfix(postfix, refresh=False)
            self._bar.update(1)

    def __exit__(self, *exc_info: Any) -> None:
        if self._bar is None:
            return
        for owner, attribute, value in reversed(self._saved):
            current = getattr(owner, attribute)
            if isinstance(current, _AboveTheBar):
                current.close_line()
            setattr(owner, attribute, value)
        self._saved.clear()
        self._bar.close()
        self._bar = None

    def _redirect_lines_above_the_bar(self) -> None:
        """sys.stdout, sys.stderr and the logging handlers that write to either go through :class:`_AboveTheBar`."""
        consoles = (sys.stdout, sys.stderr)
        for name in ("stdout", "stderr"):
            self._swap(sys, name, _AboveTheBar(getattr(sys, name), self.stream))
        loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
        for logger in loggers:
            for handler in getattr(logger, "handlers", ()):
                if isinstance(handler, logging.StreamHandler) and handler.stream in consoles:
                    self._swap(handler, "stream", _AboveTheBar(handler.stream, self.stream))

    def _swap(self, owner: Any, attribute: str, value: Any) -> None:
        self._saved.append((owner, attribute, getattr(owner, attribute)))
        setattr(owner, attribute, value)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
