"""The profiler sections: each role's ``profiler`` (profiler/profiler.yaml) and ``global_profiler``, verl's keys.

A role's section says whether and how its ranks are profiled at the steps ``global_profiler`` lists; the runtime is
:mod:`verl.utils.profiler`. The rules that span sections live here too (:func:`check_profiling`): a role's
``enable`` needs a tool and steps, the CUDA tools need CUDA, the rollout's token window needs a rollout that
generates token by token in this process (``naive``, ``hf``), and the rollout's own traces need it to live in the
actor worker (``hybrid_engine=true``).
"""

from __future__ import annotations

import logging
from typing import Any

from verl.utils.profiler_config import (  # noqa: F401  (the config package's names since the move)
    CUDA_TOOLS,
    NPU_REASON,
    PROFILER_TOOLS,
    ROLLOUT_PROFILER_KEY,
    TOKEN_WINDOW_ROLLOUTS,
    TORCH_CONTENTS,
    GlobalProfilerConfig,
    NsysToolConfig,
    ProfilerConfig,
    ProfilerToolConfig,
    TorchMemoryToolConfig,
    TorchScheduleConfig,
    TorchToolConfig,
    check_tool,
)

logger = logging.getLogger(__name__)


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
