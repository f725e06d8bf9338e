"""The profiler sections: each role's ``profiler`` (profiler/profiler.yaml) and ``global_profiler``, verl's keys.

A role's section says whether and how its ranks are profiled at the steps ``global_profiler`` lists; the runtime is
:mod:`verl.utils.profiler`. The rules that span sections live here too (:func:`check_profiling`): a role's
``enable`` needs a tool and steps, the CUDA tools need CUDA, the rollout's token window needs a rollout that
generates token by token in this process (``naive``, ``hf``), and the rollout's own traces need it to live in the
actor worker (``hybrid_engine=true``).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, ClassVar

from verl.workers.config.schema import BaseConfig, FieldError, check_int, check_int_list

logger = logging.getLogger(__name__)

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


def takes_generation(section: ProfilerConfig, glob: GlobalProfilerConfig) -> bool:
    """Whether the rollout's ``section`` writes generation's traces of its own (on the ranks it names): enabled, and
    discrete in its tool (verl's engine profilers run discrete only); otherwise generation stays in the worker's
    window, where one is open. Mirrors :class:`verl.utils.profiler.RoleProfiler`'s rule."""
    tool = section.tool or glob.tool
    if not section.enable or tool not in ("torch", "nsys"):
        return False
    global_nsys = dict((glob.global_tool_config or {}).get("nsys") or {})
    return getattr(section.tool_config, tool).discrete or (tool == "nsys" and bool(global_nsys.get("discrete")))


def check_rollout_profiler(config: Any) -> None:
    """The rollout's ``profiler`` (``config``: the whole :class:`~verl.workers.config.PPOConfig`, which imports
    this module): no update loop to schedule; a token window only where something reads it (the
    rollout's own torch traces) and the rollout generates token by token in the worker's process; its own traces
    only when it lives in the actor worker."""
    arr, glob = config.actor_rollout_ref, config.global_profiler
    section, key = arr.rollout.profiler, ROLLOUT_PROFILER_KEY
    torch_config = section.tool_config.torch
    if torch_config.schedule.enabled:
        raise ValueError(
            f"{key}.tool_config.torch.schedule.active={torch_config.schedule.active}: the schedule steps through the "
            "update loop's mini-batches, and the rollout's trace holds generation, which has none. Set it in the "
            "actor's (or critic's) section."
        )
    if torch_config.token_window is not None:
        name = "profile_token_start" if torch_config.profile_token_start is not None else "profile_token_end"
        where = f"{key}.tool_config.torch.{name}={getattr(torch_config, name)}"
        if arr.rollout.name not in TOKEN_WINDOW_ROLLOUTS:
            raise ValueError(
                f"{where}: the {arr.rollout.name} rollout generates a whole batch inside its engine, with no point "
                "between two tokens where this process could open or close the trace. Use "
                f"actor_rollout_ref.rollout.name={' or '.join(TOKEN_WINDOW_ROLLOUTS)}, or leave profile_token_start "
                "and profile_token_end null (the trace then covers the whole generation)."
            )
        if not takes_generation(section, glob) or (section.tool or glob.tool) != "torch":
            raise ValueError(
                f"{where}: the token window cuts the rollout's own torch trace, which it writes with enable=true, "
                f"tool torch and tool_config.torch.discrete=true; set those, or leave the window null."
            )
    if not arr.hybrid_engine and takes_generation(section, glob):
        raise ValueError(
            f"{key}.enable=true with discrete traces and hybrid_engine=false: the rollout's traces are written by the "
            "actor worker that hosts it, and a rollout worker group of its own generates ahead of the trainer's "
            f"steps, outside their profiling windows. Profile the rollout with hybrid_engine=true, or set "
            f"{key}.enable=false."
        )


def profiler_sections(config: Any) -> dict[str, list[tuple[str, ProfilerConfig]]]:
    """Per worker group that can be profiled, its roles' ``profiler`` sections as ``(key, section)``: the actor
    worker holds the actor, the reference and (``hybrid_engine=true``) the rollout, so theirs all apply to it."""
    arr = config.actor_rollout_ref
    actor_group = [("actor_rollout_ref.actor.profiler", arr.actor.profiler)]
    if config.needs_reference:
        actor_group.append(("actor_rollout_ref.ref.profiler", arr.ref.profiler))
    if arr.hybrid_engine:
        actor_group.append((ROLLOUT_PROFILER_KEY, arr.rollout.profiler))
    groups = {"actor_rollout_ref": actor_group}
    if config.needs_critic:
        groups["critic"] = [("critic.profiler", config.critic.profiler)]
    return groups


def check_profiling(config: Any) -> None:
    """A role's ``profiler.enable`` needs a tool and steps; the CUDA tools need CUDA; its ranks should exist; the
    rollout's own traces (``discrete``) need the rollout in the actor worker."""
    glob = config.global_profiler
    for key, section in (pair for pairs in profiler_sections(config).values() for pair in pairs):
        if not section.enable:
            continue
        tool = section.tool or glob.tool
        if tool is None or glob.tool is None:
            raise ValueError(
                f"{key}.enable=true, but global_profiler.tool is null: the driver opens the profiling windows "
                "at global_profiler.steps with that tool; set global_profiler.tool (torch, nsys, torch_memory) "
                "and global_profiler.steps."
            )
        if tool in CUDA_TOOLS and config.trainer.device == "cpu":
            what = "Nsight Systems captures CUDA ranges" if tool == "nsys" else "it snapshots the CUDA allocator"
            raise ValueError(
                f"{key}: tool {tool} needs CUDA ({what}); on CPU use global_profiler.tool=torch, or run with "
                "trainer.device=cuda."
            )
        beyond = [rank for rank in section.ranks or () if rank >= config.world_size]
        if beyond and not section.all_ranks:
            logger.warning(
                "%s.ranks: %s are not ranks of this run (%d ranks); they are not profiled",
                key,
                beyond,
                config.world_size,
            )
    check_rollout_profiler(config)
