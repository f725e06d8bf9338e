"""One capture of a profiling tool in this process, begun when built and ended once: what a profiled pass or window
of :mod:`verl.utils.profiler` opens.

- :class:`TorchSession`: ``torch.profiler`` (CPU, and CUDA where there is one); a Chrome trace per capture, or with a
  ``torch.profiler.schedule`` one per recorded cycle, named after the update mini-batches it holds (``_mb2-3``).
- :class:`NsysSession`: an Nsight Systems capture range (``cudaProfilerStart`` / ``Stop``) with NVTX labels.
- :class:`MemorySession`: the CUDA allocator's history, dumped as a snapshot (``.pickle``) at the end.

torch.profiler is one per process (a second profile started inside a first breaks the first), so at most one
session is open at a time, and the update loop reaches it without being handed it: :func:`mini_batch` labels one
update mini-batch in the open session and walks its schedule.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = ["MemorySession", "NsysSession", "Session", "TorchSession", "mini_batch", "open_session"]

_OPEN: list[Session] = []  # the open session of this process (a list: empty, or one)


class Session:
    """An open capture (built by :func:`open_session`). ``path`` is its file without suffix; :meth:`end` closes it
    and returns the files written."""

    def __init__(self, path: Path):
        self.path = path

    def end(self) -> list[str]:
        _OPEN.remove(self)
        return self._close()

    def _close(self) -> list[str]:
        raise NotImplementedError

    def label(self, name: str) -> contextlib.AbstractContextManager:
        """A named range of the capture."""
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def mini_batch(self, index: int) -> Iterator[None]:
        """The update mini-batch ``index`` (1-based), a labelled range."""
        with self.label(f"mini_batch{index}"):
            yield


class TorchSession(Session):
    """``torch.profiler.profile`` from now until :meth:`end`.

    Args:
        path: the trace's path without ``.json``.
        contents: what to record besides CPU activity: ``cuda`` (with ``cpu``, the activities; none named: CUDA where
            present), ``shapes``, ``memory``, ``stack``.
        schedule: keyword arguments of ``torch.profiler.schedule`` (``skip_first``, ``wait``, ``warmup``, ``active``,
            ``repeat``), walked one step per update mini-batch (:func:`mini_batch`); None records everything.
    """

    def __init__(self, path: Path, contents: Sequence[str] = (), schedule: dict[str, int] | None = None):
        super().__init__(path)
        contents = set(contents)
        # CPU activity always: the passes' labels are CPU-side events, without which CUDA kernels belong to nothing
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available() and (not contents or "cuda" in contents):
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.scheduled = schedule is not None
        self._written: list[str] = []
        self._recorded: list[int] = []  # mini-batches recorded since the last trace written
        self._profile = torch.profiler.profile(
            activities=activities,
            record_shapes="shapes" in contents,
            profile_memory="memory" in contents,
            with_stack="stack" in contents,
            schedule=torch.profiler.schedule(**schedule) if self.scheduled else None,
            on_trace_ready=self._export,
        )
        # a step here is a mini-batch, labelled by mini_batch(); torch's own ProfilerStep#<n> rows would repeat it
        self._profile.record_steps = False
        self._profile.start()

    def _export(self, profile: Any) -> None:
        suffix = ""
        if self._recorded:
            first, last = self._recorded[0], self._recorded[-1]
            suffix = f"_mb{first}" if first == last else f"_mb{first}-{last}"
        target = self.path.with_name(f"{self.path.name}{suffix}.json")
        target.parent.mkdir(parents=True, exist_ok=True)
        profile.export_chrome_trace(str(target))
        self._written.append(str(target))
        self._recorded = []

    def _close(self) -> list[str]:
        self._profile.stop()  # a schedule stopped while recording writes what it holds
        return self._written

    def label(self, name: str) -> contextlib.AbstractContextManager:
        return torch.profiler.record_function(name)

    @contextlib.contextmanager
    def mini_batch(self, index: int) -> Iterator[None]:
        recording = torch.profiler.ProfilerAction.RECORD, torch.profiler.ProfilerAction.RECORD_AND_SAVE
        if self.scheduled and self._profile.current_action in recording:
            self._recorded.append(index)
        with self.label(f"mini_batch{index}"):
            yield
        if self.scheduled:
            self._profile.step()


class NsysSession(Session):
    """An Nsight Systems capture range; the workers run under ``nsys`` (Ray's ``nsight`` runtime environment), which
    writes the report itself (no file here)."""

    def __init__(self, path: Path):
        super().__init__(path)
        torch.cuda.profiler.start()

    def _close(self) -> list[str]:
        torch.cuda.profiler.stop()
        return []

    def label(self, name: str) -> contextlib.AbstractContextManager:
        return torch.cuda.nvtx.range(name)


class MemorySession(Session):
    """The CUDA allocator's history (at most ``max_entries`` events), dumped to ``<path>.pickle`` at the end."""

    def __init__(self, path: Path, max_entries: int):
        super().__init__(path)
        torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks="python")

    def _close(self) -> list[str]:
        target = self.path.with_name(f"{self.path.name}.pickle")
        target.parent.mkdir(parents=True, exist_ok=True)
        torch.cuda.memory._dump_snapshot(str(target))
        torch.cuda.memory._record_memory_history(enabled=None)
        return [str(target)]


def open_session(tool: str, path: Path, *, contents=(), schedule=None, max_entries: int = 100_000) -> Session:
    """A session of ``tool`` (``torch``, ``nsys``, ``torch_memory``) writing to ``path`` (without suffix), begun now;
    the process's open session until it ends.

    Raises:
        RuntimeError: a session is open in this process already (the tools cannot nest).
    """
    if _OPEN:
        raise RuntimeError(f"a profiling session ({_OPEN[0].path}) is open in this process already")
    if tool == "torch":
        session = TorchSession(path, contents, schedule)
    elif tool == "nsys":
        session = NsysSession(path)
    elif tool == "torch_memory":
        session = MemorySession(path, max_entries)
    else:
        raise ValueError(f"{tool!r} is not a profiler here; take one of torch, nsys, torch_memory.")
    _OPEN.append(session)
    return session


def mini_batch(index: int) -> contextlib.AbstractContextManager:
    """Update mini-batch ``index`` (1-based) in this process's open session: a labelled range, and one step of its
    ``torch.profiler.schedule``; nothing while no session is open. The update loop wraps each mini-batch in it."""
    return _OPEN[0].mini_batch(index) if _OPEN else contextlib.nullcontext()
