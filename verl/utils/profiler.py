"""verl's profiling keys: which steps, which roles and ranks, and which tool.

The driver decides *when* (:class:`StepSchedule`): ``global_profiler.steps`` (1-based training steps), each its own
window, or with ``profile_continuous_steps`` every run of consecutive steps one window. It asks the actor and critic
worker groups to start before the window's first step and to stop after its last. A worker decides *whether* and
*how* (:class:`RoleProfiler`): its role's ``profiler.enable``, and ``all_ranks`` or ``ranks`` naming this rank;
the tool is the role's ``profiler.tool`` or else ``global_profiler.tool``:

- ``torch``: ``torch.profiler`` (CPU, and CUDA where there is one), a Chrome trace per window and rank,
  ``<save_path>/<role>_rank<R>_step<S>.json``; ``tool_config.torch.contents`` may add ``shapes``, ``memory``,
  ``stack``. Each worker pass (``gen``, ``old_log_prob``, ``ref``, ``update_actor``, ``values``,
  ``update_critic``) is a labelled range.
- ``nsys``: Nsight Systems (CUDA). The workers run under ``nsys`` (Ray's ``nsight`` runtime environment,
  ``global_tool_config.nsys.worker_nsight_options``), capturing between ``cudaProfilerStart`` and
  ``cudaProfilerStop``, which the window calls; each pass is an NVTX range. Reports land in Ray's session
  log directory (``logs/nsight``).
- ``torch_memory``: a CUDA allocator snapshot per window (``torch.cuda.memory._record_memory_history`` while it is
  open, dumped to ``<role>_rank<R>_step<S>.pickle``; read it with PyTorch's memory viz).

``discrete`` (``tool_config.<tool>.discrete``, or ``global_tool_config.nsys.discrete``) profiles each pass on its
own instead of the whole window: one trace (or capture range) per pass, named after it. ``npu`` is refused at
start-up (Ascend NPUs are out of scope).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

TOOLS = ("torch", "nsys", "torch_memory")
CUDA_TOOLS = ("nsys", "torch_memory")
TORCH_CONTENTS = ("cpu", "cuda", "shapes", "memory", "stack")
# The capture the workers run under with tool nsys, unless worker_nsight_options says otherwise: CUDA, NVTX and
# the OS runtime, captured between the windows' cudaProfilerStart and cudaProfilerStop.
DEFAULT_NSIGHT_OPTIONS = {"t": "cuda,nvtx,osrt,cublas", "capture-range": "cudaProfilerApi", "cuda-memory-usage": "true"}


def profile_windows(steps: Sequence[int] | None, continuous: bool) -> list[tuple[int, int]]:
    """``(first, last)`` step of each profiled window: each listed step alone, or runs of consecutive steps."""
    ordered = sorted(set(steps or ()))
    if not continuous:
        return [(step, step) for step in ordered]
    windows: list[tuple[int, int]] = []
    for step in ordered:
        if windows and step == windows[-1][1] + 1:
            windows[-1] = (windows[-1][0], step)
        else:
            windows.append((step, step))
    return windows


class StepSchedule:
    """The driver's side: at which steps the workers start and stop profiling (``global_profiler``)."""

    def __init__(self, global_profiler: Any):
        on = global_profiler.tool is not None
        self.windows = profile_windows(global_profiler.steps, global_profiler.profile_continuous_steps) if on else []

    def starts_at(self, step: int) -> bool:
        return any(first == step for first, _ in self.windows)

    def stops_at(self, step: int) -> bool:
        return any(last == step for _, last in self.windows)


def worker_runtime_env(global_profiler: Any) -> dict[str, Any]:
    """Ray's runtime environment for the profiled worker groups: under ``nsys`` with tool nsys, else nothing."""
    if global_profiler.tool != "nsys":
        return {}
    nsys = dict((global_profiler.global_tool_config or {}).get("nsys") or {})
    options = {
        **DEFAULT_NSIGHT_OPTIONS,
        **{k: str(v) for k, v in dict(nsys.get("worker_nsight_options") or {}).items()},
    }
    return {"nsight": options}


def _setting(section: Any, *path: str, default: Any = None) -> Any:
    for name in path:
        section = section.get(name) if isinstance(section, dict) else getattr(section, name, None)
        if section is None:
            return default
    return section


class RoleProfiler:
    """One worker's profiler: what its role's sections ask of this rank (nothing, when it is not asked).

    Args:
        role: the worker's role name (``actor_rollout_ref``, ``critic``), in the trace names.
        sections: the role's ``profiler`` sections (the actor worker's are the actor's and the reference's: they
            share its process); one enabled section naming this rank turns it on.
        global_profiler: ``global_profiler``.
        rank: this worker's rank.
    """

    def __init__(self, role: str, sections: Sequence[Any], global_profiler: Any, rank: int):
        asked = [s for s in sections if s.enable and (s.all_ranks or rank in list(s.ranks or ()))]
        section = asked[0] if asked else None
        self.tool = None if section is None else (section.tool or global_profiler.tool)
        self.role, self.rank = role, rank
        if self.tool is None:
            return
        self.save_dir = Path(section.save_path or global_profiler.save_path)
        self.discrete = bool(
            _setting(section.tool_config, self.tool, "discrete", default=False)
            or (self.tool == "nsys" and _setting(global_profiler.global_tool_config, "nsys", "discrete"))
        )
        self.contents = list(_setting(section.tool_config, "torch", "contents", default=[]) or [])
        memory = _setting(global_profiler.global_tool_config, "torch_memory", default={}) or {}
        self.max_entries = int(_setting(memory, "trace_alloc_max_entries", default=100_000))
        self.step: int | None = None
        self._open: Any = None

    @property
    def active(self) -> bool:
        """Whether a window is open on this rank."""
        return self.tool is not None and self.step is not None

    def start(self, step: int) -> None:
        """Open the window that starts at ``step`` (a discrete profiler opens one per pass instead)."""
        if self.tool is None:
            return
        self.step = step
        if not self.discrete:
            self._begin(f"step{step}")

    def stop(self) -> list[str]:
        """Close the window; returns the files this rank wrote for it."""
        if not self.active:
            return []
        written = [] if self.discrete else self._end(f"step{self.step}")
        self.step = None
        return written

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """One worker pass, a labelled range inside an open window (its own trace when discrete)."""
        if not self.active:
            yield
            return
        if self.discrete:
            self._begin(f"step{self.step}_{name}")
        try:
            with self._label(name):
                yield
        finally:
            if self.discrete:
                self._end(f"step{self.step}_{name}")

    # ------------------------------------------------------------------ the tools

    def _label(self, name: str) -> contextlib.AbstractContextManager:
        if self.tool == "torch":
            return torch.profiler.record_function(name)
        if self.tool == "nsys":
            return torch.cuda.nvtx.range(name)
        return contextlib.nullcontext()

    def _path(self, label: str, suffix: str) -> Path:
        self.save_dir.mkdir(parents=True, exist_ok=True)
        return self.save_dir / f"{self.role}_rank{self.rank}_{label}{suffix}"

    def _begin(self, label: str) -> None:
        if self.tool == "torch":
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available() and (not self.contents or "cuda" in self.contents):
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._open = torch.profiler.profile(
                activities=activities,
                record_shapes="shapes" in self.contents,
                profile_memory="memory" in self.contents,
                with_stack="stack" in self.contents,
            )
            self._open.__enter__()
        elif self.tool == "nsys":
            torch.cuda.profiler.start()
        else:
            torch.cuda.memory._record_memory_history(max_entries=self.max_entries, stacks="python")

    def _end(self, label: str) -> list[str]:
        if self.tool == "torch":
            profile, self._open = self._open, None
            profile.__exit__(None, None, None)
            path = self._path(label, ".json")
            profile.export_chrome_trace(str(path))
            return [str(path)]
        if self.tool == "nsys":
            torch.cuda.profiler.stop()
            return []
        path = self._path(label, ".pickle")
        torch.cuda.memory._dump_snapshot(str(path))
        torch.cuda.memory._record_memory_history(enabled=None)
        return [str(path)]
