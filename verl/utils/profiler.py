"""verl's profiling keys: which steps, which roles and ranks, which tool, and what runs after.

The driver decides *when* (:class:`StepSchedule`): ``global_profiler.steps`` (1-based training steps), each its own
window, or with ``profile_continuous_steps`` every run of consecutive steps one window. It asks the profiled worker
groups to start before the window's first step and to stop after its last. A worker decides *whether* and *how*
(:class:`RoleProfiler`): a section of its roles (``profiler`` of the actor, reference, rollout or critic) that is
enabled and whose ``all_ranks`` or ``ranks`` names this rank; the tool is the section's ``tool`` or else
``global_profiler.tool``:

- ``torch``: ``torch.profiler`` (CPU, and CUDA where there is one), a Chrome trace per window and rank,
  ``<save_path>/<role>_rank<R>_step<S>.json``; ``tool_config.torch.contents`` may add ``shapes``, ``memory``,
  ``stack``. Each worker pass (``gen``, ``old_log_prob``, ``ref``, ``update_actor``, ``values``, ``update_critic``)
  is a labelled range, each update mini-batch one inside it (``mini_batch<i>``, 1-based).
- ``nsys``: Nsight Systems (CUDA). The workers run under ``nsys`` (Ray's ``nsight`` runtime environment,
  ``global_tool_config.nsys.worker_nsight_options``), capturing between ``cudaProfilerStart`` and
  ``cudaProfilerStop``, which the window calls; each pass is an NVTX range. Reports land in Ray's session log
  directory (``logs/nsight``), or in ``save_path`` with ``relocate_results``.
- ``torch_memory``: a CUDA allocator snapshot per window (``<role>_rank<R>_step<S>.pickle``; PyTorch's memory viz).

``discrete`` (``tool_config.<tool>.discrete``, or ``global_tool_config.nsys.discrete``) profiles each pass on its
own instead of the whole window: one trace (or capture range) per pass, named after it (``..._step<S>_<pass>``).
``tool_config.torch.schedule`` (``active`` > 0) runs ``torch.profiler.schedule`` over the update's mini-batches:
the update pass's trace (discrete) or the window's (counting everything before the first mini-batch's end as its
first step, one cycle unless ``repeat`` says more) keeps only the scheduled ones, named ``..._mb<first>-<last>``.

Generation belongs to the rollout's section: where it is enabled, names the rank and is discrete, each ``gen`` pass
is a trace of its own (``..._step<S>_gen``), out of the window's (which pauses around it and goes on in a
``_part<k>`` file when a pass of its own follows); ``profile_token_start`` / ``profile_token_end`` narrow that
trace to a span of response tokens, opened and closed by the rollout between two tokens. Otherwise generation is
one more labelled pass of the window.

After each window, ``relocate_results`` moves this process's nsys reports into ``save_path``; after the last one,
``finish_hook_cmd`` runs once on the finish-hook ranks (:mod:`verl.utils.profiler_hooks`). A role's null keys take
``global_profiler``'s. ``npu`` is refused at start-up (Ascend NPUs are out of scope).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from verl.utils.profiler_config import GlobalProfilerConfig, ProfilerConfig  # noqa: F401  (verl's import path)
from verl.utils.profiler_hooks import ray_nsight_dir, relocate_nsight_reports, run_finish_hook
from verl.utils.profiler_sessions import Session, mini_batch, open_session

logger = logging.getLogger(__name__)

__all__ = ["RoleProfiler", "StepSchedule", "TokenWindow", "mini_batch", "profile_windows", "worker_runtime_env"]

# The workers' passes: the rollout's, and those that step through the update's mini-batches (the schedule's).
GENERATION_PASS = "gen"
UPDATE_PASSES = ("update_actor", "update_critic")
# The capture the workers run under with tool nsys, unless worker_nsight_options says otherwise: CUDA, NVTX and
# the OS runtime, captured between the windows' cudaProfilerStart and cudaProfilerStop.
DEFAULT_NSIGHT_OPTIONS = {"t": "cuda,nvtx,osrt,cublas", "capture-range": "cudaProfilerApi", "cuda-memory-usage": "true"}
# A role's keys that take global_profiler's value when null.
INHERITED_KEYS = ("relocate_results", "finish_hook_cmd", "finish_hook_all_ranks", "finish_hook_ranks")


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
    """The driver's side: at which steps the workers start and stop profiling (``global_profiler``).

    Args:
        global_profiler: ``global_profiler``.
        last_step: the run's last training step: windows after it are dropped and one across it ends there (None:
            every listed step runs).
    """

    def __init__(self, global_profiler: Any, last_step: int | None = None):
        on = global_profiler.tool is not None
        windows = profile_windows(global_profiler.steps, global_profiler.profile_continuous_steps) if on else []
        if last_step is not None:
            windows = [(first, min(last, last_step)) for first, last in windows if first <= last_step]
        self.windows = windows

    def starts_at(self, step: int) -> bool:
        return any(first == step for first, _ in self.windows)

    def stops_at(self, step: int) -> bool:
        return any(last == step for _, last in self.windows)

    def is_last(self, step: int) -> bool:
        """Whether the window that stops after ``step`` is the run's last (the finish hook then runs)."""
        return bool(self.windows) and self.windows[-1][1] == step


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


def _asks_for(section: Any, rank: int) -> bool:
    return bool(section.enable) and (bool(section.all_ranks) or rank in list(section.ranks or ()))


@dataclasses.dataclass(frozen=True)
class _Scope:
    """How one section profiles this rank: the tool and its settings, read off the section and ``global_profiler``."""

    tool: str
    save_dir: Path
    discrete: bool
    contents: tuple[str, ...]
    schedule: dict[str, int] | None  # torch.profiler.schedule's arguments; None: no schedule
    token_window: tuple[int, int | None] | None  # response tokens [first, end) of the rollout's trace
    max_entries: int

    @classmethod
    def of(cls, section: Any, glob: Any) -> _Scope:
        tool = section.tool or glob.tool
        tools = section.tool_config
        discrete = _setting(tools, tool, "discrete", default=False)
        if tool == "nsys":
            discrete = discrete or _setting(glob.global_tool_config, "nsys", "discrete", default=False)
        schedule = _setting(tools, "torch", "schedule")
        schedule = {
            name: int(_setting(schedule, name, default=0))
            for name in ("skip_first", "wait", "warmup", "active", "repeat")
        }
        start, end = _setting(tools, "torch", "profile_token_start"), _setting(tools, "torch", "profile_token_end")
        return cls(
            tool=tool,
            save_dir=Path(section.save_path or glob.save_path),
            discrete=bool(discrete),
            contents=tuple(_setting(tools, "torch", "contents", default=()) or ()),
            schedule=schedule if tool == "torch" and schedule["active"] > 0 else None,
            token_window=None if start is None and end is None else (start or 0, end),
            max_entries=int(
                _setting(glob.global_tool_config, "torch_memory", "trace_alloc_max_entries", default=100_000)
            ),
        )

    def open(self, path: Path, *, scheduled: bool = False, repeat_default: int | None = None) -> Session:
        """A session of this scope's tool writing ``path``; ``scheduled``: with the schedule (``repeat`` 0 becomes
        ``repeat_default`` when given)."""
        schedule = None
        if scheduled and self.schedule is not None:
            schedule = dict(self.schedule)
            if repeat_default is not None and schedule["repeat"] == 0:
                schedule["repeat"] = repeat_default
        return open_session(self.tool, path, contents=self.contents, schedule=schedule, max_entries=self.max_entries)


class TokenWindow:
    """The rollout's trace between two response tokens: the rollout calls it with the index of the token it is about
    to produce (0 before the prompt's forward pass); the trace opens at ``first`` and closes at ``end``, or when the
    pass ends (:meth:`close`). It opens once per pass."""

    def __init__(self, begin: Callable[[], Session], first: int, end: int | None):
        self._begin, self.first, self.end = begin, first, end
        self._session: Session | None = None
        self._done = False
        self.written: list[str] = []

    def __call__(self, index: int) -> None:
        if self._session is None and not self._done and index >= self.first and (self.end is None or index < self.end):
            self._session = self._begin()
        elif self._session is not None and self.end is not None and index >= self.end:
            self.close()

    def close(self) -> None:
        if self._session is not None:
            self.written += self._session.end()
            self._session, self._done = None, True


class RoleProfiler:
    """One worker's profiler: what its roles' sections ask of this rank (nothing, when none asks).

    Args:
        role: the worker's role name (``actor_rollout_ref``, ``critic``), in the trace names.
        sections: the ``profiler`` sections of the roles whose passes the worker runs (the actor worker: the actor's
            and the reference's); the first enabled one naming this rank profiles its window.
        global_profiler: ``global_profiler``.
        rank: this worker's rank.
        rollout: the rollout's ``profiler`` section when the worker hosts the rollout (it profiles the ``gen`` pass
            where it is discrete and names this rank); None otherwise.
        nsight_dir: where nsys reports land (Ray's session log directory by default).
    """

    def __init__(
        self,
        role: str,
        sections: Sequence[Any],
        global_profiler: Any,
        rank: int,
        rollout: Any = None,
        nsight_dir: Path | None = None,
    ):
        self.role, self.rank = role, rank
        asked = [s for s in sections if _asks_for(s, rank)]
        self.window = _Scope.of(asked[0], global_profiler) if asked else None
        self.generation = None
        if rollout is not None and _asks_for(rollout, rank):
            scope = _Scope.of(rollout, global_profiler)
            self.generation = scope if scope.discrete else None
        enabled = [s for s in [*sections, rollout] if s is not None and s.enable]
        self._hook = self._hook_settings(enabled[0], global_profiler) if enabled else None
        self._profiled = bool(asked) or (rollout is not None and _asks_for(rollout, rank))
        self._nsight_dir = nsight_dir
        self.step: int | None = None
        self._session: Session | None = None  # the window's open session (not discrete)
        self._num_parts = 0
        self._written: list[str] = []

    @staticmethod
    def _hook_settings(section: Any, glob: Any) -> dict[str, Any]:
        def value(name: str) -> Any:
            own = getattr(section, name, None)
            return own if own is not None else getattr(glob, name, None)

        settings = {name: value(name) for name in INHERITED_KEYS}
        settings["tool"] = section.tool or glob.tool
        settings["save_path"] = section.save_path or glob.save_path
        return settings

    @property
    def tool(self) -> str | None:
        """The tool of this rank's window (None: its window records nothing)."""
        return None if self.window is None else self.window.tool

    @property
    def active(self) -> bool:
        """Whether a window is open on this rank."""
        return self.step is not None

    def start(self, step: int) -> None:
        """Open the window that starts at ``step``; its capture begins with the first pass it records."""
        if self.window is None and self.generation is None:
            return
        self.step, self._num_parts, self._written = step, 0, []

    def stop(self, last: bool = False) -> list[str]:
        """Close the window; returns the files this rank wrote for it (nsys reports relocated with
        ``relocate_results`` included). ``last``: the run's last window, after which the finish hook runs."""
        written = []
        if self.active:
            self._pause()
            written, self.step = self._written, None
            written += self._relocate()
        if last:
            self._run_finish_hook()
        return written

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[TokenWindow | None]:
        """One worker pass, a labelled range of the window (its own trace when discrete; the rollout's when it is
        ``gen`` and the rollout profiles it). Yields the :class:`TokenWindow` the rollout calls between tokens when
        its trace spans a token window, else None."""
        if not self.active:
            yield None
        elif name == GENERATION_PASS and self.generation is not None:
            with self._generation_pass() as tokens:
                yield tokens
        elif self.window is None:
            yield None
        elif self.window.discrete:
            session = self.window.open(self._path(name), scheduled=name in UPDATE_PASSES)
            try:
                with session.label(name):
                    yield None
            finally:
                self._written += session.end()
        else:
            if self._session is None:
                part = f"part{self._num_parts + 1}" if self._num_parts else ""
                self._session = self.window.open(self._path(part), scheduled=True, repeat_default=1)
                self._num_parts += 1
            with self._session.label(name):
                yield None

    @contextlib.contextmanager
    def _generation_pass(self) -> Iterator[TokenWindow | None]:
        self._pause()  # torch.profiler is one per process: the window's capture waits for its next pass
        scope = self.generation
        path = self._path(GENERATION_PASS, scope)
        if scope.token_window is not None:
            tokens = TokenWindow(lambda: scope.open(path), *scope.token_window)
            try:
                yield tokens
            finally:
                tokens.close()
                self._written += tokens.written
            return
        session = scope.open(path)
        try:
            with session.label(GENERATION_PASS):
                yield None
        finally:
            self._written += session.end()

    def _pause(self) -> None:
        if self._session is not None:
            self._written += self._session.end()
            self._session = None

    def _path(self, label: str, scope: _Scope | None = None) -> Path:
        scope = scope or self.window
        stem = f"{self.role}_rank{self.rank}_step{self.step}"
        return scope.save_dir / (f"{stem}_{label}" if label else stem)

    def _relocate(self) -> list[str]:
        if self._hook is None or not self._hook["relocate_results"] or self._hook["tool"] != "nsys":
            return []
        source = self._nsight_dir or ray_nsight_dir()
        return relocate_nsight_reports(source, Path(self._hook["save_path"]), self.role)

    def _run_finish_hook(self) -> None:
        hook = self._hook
        if hook is None or not hook["finish_hook_cmd"]:
            return
        ranks = list(hook["finish_hook_ranks"] or ())
        if not (hook["finish_hook_all_ranks"] or (self.rank in ranks if ranks else self._profiled)):
            return
        env = {
            "VERL_PROFILE_SAVE_PATH": str(hook["save_path"]),
            "VERL_PROFILE_TOOL": str(hook["tool"] or ""),
            "VERL_PROFILE_RANK": str(self.rank),
            "VERL_PROFILE_PID": str(os.getpid()),
            "VERL_PROFILE_ROLE": self.role,
        }
        if hook["tool"] == "nsys":
            env["VERL_PROFILE_RAY_NSIGHT_DIR"] = str(self._nsight_dir or ray_nsight_dir())
        run_finish_hook(hook["finish_hook_cmd"], env)
