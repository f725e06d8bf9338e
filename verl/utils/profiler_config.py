"""The profiler's config sections (verl's ``ProfilerConfig`` and its tool configs, ``global_profiler``), typed.

They live a layer below the config package so that code written for verl imports them where verl has them
(``from verl.utils.profiler import ProfilerConfig``); the rules that span sections and the runtime are
:mod:`verl.workers.config.profiler` and :mod:`verl.utils.profiler`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from verl.utils.config_schema import BaseConfig, FieldError, check_int, check_int_list

# verl's profiler tools built here (verl.utils.profiler), and the one that is not.
PROFILER_TOOLS = ("torch", "nsys", "torch_memory")
CUDA_TOOLS = ("nsys", "torch_memory")
NPU_REASON = "Ascend NPU profiling (NPU hardware is out of scope here)"
TORCH_CONTENTS = ("cpu", "cuda", "shapes", "memory", "stack")
# The rollouts whose generation loop runs token by token in the worker's process, where a token window can open and
# close the trace; vLLM runs a whole request batch inside its engine.
TOKEN_WINDOW_ROLLOUTS = ("naive", "hf")
ROLLOUT_PROFILER_KEY = "actor_rollout_ref.rollout.profiler"


def check_tool(section: Any) -> None:
    """``tool``: one of :data:`PROFILER_TOOLS` or null; ``npu`` is refused by name."""
    if section.tool == "npu":
        raise FieldError("tool", f"='npu' asks for {NPU_REASON}. Use torch or nsys.")
    if section.tool is not None and section.tool not in PROFILER_TOOLS:
        raise FieldError(
            "tool", f"={section.tool!r} is not a profiler here; take one of {list(PROFILER_TOOLS)} or null."
        )


@dataclasses.dataclass(frozen=True)
class TorchScheduleConfig(BaseConfig):
    """``tool_config.torch.schedule``: ``torch.profiler.schedule`` over the update loop's mini-batches.

    Off while ``active`` is 0. With ``discrete`` the update pass's trace keeps, after ``skip_first`` mini-batches,
    ``wait`` idle, ``warmup`` discarded and ``active`` recorded ones, ``repeat`` times (0: until the pass ends).
    Without it the window's one trace counts everything before the first mini-batch's end as the first step, and
    ``repeat`` 0 means one cycle.
    """

    skip_first: int
    wait: int
    warmup: int
    active: int
    repeat: int

    def check(self) -> None:
        for name in ("skip_first", "wait", "warmup", "active", "repeat"):
            check_int(self, name, 0)

    @property
    def enabled(self) -> bool:
        return self.active > 0


@dataclasses.dataclass(frozen=True)
class TorchToolConfig(BaseConfig):
    """``tool_config.torch``: what torch.profiler records, per pass or per window, and the rollout's token window.

    ``profile_token_start`` / ``profile_token_end`` (the rollout's section): the trace of generation covers the
    response tokens ``[start, end)`` only (null: from the first / to the last).
    """

    contents: list[str]
    discrete: bool
    profile_token_start: int | None
    profile_token_end: int | None
    schedule: TorchScheduleConfig

    def check(self) -> None:
        unknown = [item for item in self.contents if item not in TORCH_CONTENTS]
        if unknown:
            raise FieldError(
                "contents", f"={list(self.contents)!r}: {unknown[0]!r} is not one of {list(TORCH_CONTENTS)}."
            )
        check_int(self, "profile_token_start", 0)
        check_int(self, "profile_token_end", 1)
        start, end = self.profile_token_start, self.profile_token_end
        if start is not None and end is not None and end <= start:
            raise FieldError(
                "profile_token_end", f"={end} must be above profile_token_start={start} (the window is [start, end))."
            )

    @property
    def token_window(self) -> tuple[int, int | None] | None:
        """``(first token, end token or None)`` of the rollout's trace; None: the whole generation."""
        if self.profile_token_start is None and self.profile_token_end is None:
            return None
        return (self.profile_token_start or 0, self.profile_token_end)


@dataclasses.dataclass(frozen=True)
class NsysToolConfig(BaseConfig):
    """``tool_config.nsys``: one capture range per worker pass (``discrete``) instead of one per window."""

    discrete: bool


@dataclasses.dataclass(frozen=True)
class TorchMemoryToolConfig(BaseConfig):
    """``tool_config.torch_memory``: verl's allocator-snapshot settings of the role (the window's snapshot keeps
    ``global_profiler.global_tool_config.torch_memory.trace_alloc_max_entries`` events)."""

    trace_alloc_max_entries: int
    stack_depth: int

    def check(self) -> None:
        check_int(self, "trace_alloc_max_entries", 1)
        check_int(self, "stack_depth", 1)


@dataclasses.dataclass(frozen=True)
class ProfilerToolConfig(BaseConfig):
    """``tool_config``: per-tool settings; ``npu`` is verl's Ascend mapping, read by nothing here."""

    nsys: NsysToolConfig
    npu: dict
    torch: TorchToolConfig
    torch_memory: TorchMemoryToolConfig


@dataclasses.dataclass(frozen=True)
class ProfilerConfig(BaseConfig):
    """A role's ``profiler`` section (verl's ``ProfilerConfig``), read by :class:`verl.utils.profiler.RoleProfiler`.

    ``tool`` and ``save_path`` null take ``global_profiler``'s; so do ``relocate_results`` and the ``finish_hook_*``
    keys (verl's roles inherit them from ``global_profiler`` the same way).
    """

    tool: str | None
    enable: bool
    all_ranks: bool
    ranks: list[int]
    save_path: str | None
    relocate_results: bool | None
    finish_hook_cmd: str | None
    finish_hook_all_ranks: bool | None
    finish_hook_ranks: list[int] | None
    tool_config: ProfilerToolConfig

    def check(self) -> None:
        check_tool(self)
        check_int_list(self, "ranks", 0)
        check_int_list(self, "finish_hook_ranks", 0)


@dataclasses.dataclass(frozen=True)
class GlobalProfilerConfig(BaseConfig):
    """``global_profiler``: the tool, the (1-based) steps the driver profiles, where traces go and what runs after
    the last profiled step (:mod:`verl.utils.profiler`)."""

    KEY: ClassVar[str] = "global_profiler"

    tool: str | None
    steps: list[int] | None
    profile_continuous_steps: bool
    save_path: str
    relocate_results: bool
    finish_hook_cmd: str | None
    finish_hook_all_ranks: bool
    finish_hook_ranks: list[int]
    global_tool_config: Any

    def check(self) -> None:
        check_tool(self)
        check_int_list(self, "finish_hook_ranks", 0)
        if self.tool is None:
            return
        if not self.steps or not all(isinstance(step, int) and step >= 1 for step in self.steps):
            raise FieldError("steps", f"={self.steps!r}: list the training steps to profile (1-based), e.g. [1, 2, 5].")
