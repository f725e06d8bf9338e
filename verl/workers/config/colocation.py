"""Which roles of a run share a worker process on each rank (verl's colocated worker class).

The roles on the trainer's ranks (``actor_rollout_ref`` always, ``critic`` when a value model trains,
``reward_model`` with ``reward_model.enable``) run in one process per rank, unless what a process holds once for
all its roles cannot serve them alike:

- the default ``torch.distributed`` group and its collective timeout: the actor's is ``actor_rollout_ref.
  nccl_timeout`` when set, the others' ``trainer.collective_timeout_s``;
- the process-group kind and megatron-core's parallel state: megatron roles share a process only with megatron
  roles of the same tensor- and pipeline-parallel sizes (megatron-core holds one layout per process); the other
  backends (``dp``, ``fsdp``, ``fsdp2``, the reward model) share one kind of group;
- the profiler: a profiled role gets a process of its own (torch's profiler and Nsight Systems see a whole process).

Each role joins the first process whose roles it is compatible with, in the order above; ``trainer.colocate_roles=
false`` gives every role a process of its own. A rollout group of its own (``hybrid_engine=false``) is never in
these processes: it has its own pool. The layout is part of the run plan (``worker_processes``), and every split
is logged with its reason (:func:`colocation_notes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from verl.workers.config.ppo import PPOConfig

ACTOR, CRITIC, REWARD_MODEL = "actor_rollout_ref", "critic", "reward_model"


@dataclass(frozen=True)
class RoleProcessNeeds:
    """What a role needs of the process it runs in."""

    role: str
    collective_timeout_s: float
    backend: tuple  # ("torch",) or ("megatron", tensor-parallel size, pipeline-parallel size)
    profiled: bool


def pool_roles(config: PPOConfig) -> list[str]:
    """The roles on the trainer's ranks, in the order their workers are built."""
    roles = [ACTOR]
    if config.needs_critic:
        roles.append(CRITIC)
    if config.reward_model.enable:
        roles.append(REWARD_MODEL)
    return roles


def role_needs(config: PPOConfig, role: str) -> RoleProcessNeeds:
    """What ``role`` needs of its process (see the module)."""
    timeout = config.trainer.collective_timeout_s
    if role == ACTOR:
        actor = config.actor_rollout_ref.actor
        timeout = config.actor_rollout_ref.nccl_timeout or timeout
        backend = _backend(actor.strategy, actor.megatron)
    elif role == CRITIC:
        backend = _backend(config.critic_strategy, config.critic.megatron)
    else:
        backend = ("torch",)
    profiled = any(section.enable for _key, section in config.profiler_sections().get(role, []))
    return RoleProcessNeeds(role, float(timeout), backend, profiled)


def _backend(strategy: str, megatron) -> tuple:
    if strategy == "megatron":
        return ("megatron", megatron.tensor_model_parallel_size, megatron.pipeline_model_parallel_size)
    return ("torch",)


def why_apart(a: RoleProcessNeeds, b: RoleProcessNeeds) -> str | None:
    """Why roles ``a`` and ``b`` cannot share a process, or None when they can."""
    if a.profiled or b.profiled:
        profiled = a.role if a.profiled else b.role
        return f"{profiled} is profiled, and a profiler sees its whole process"
    if a.collective_timeout_s != b.collective_timeout_s:
        return (
            f"their collective timeouts differ ({a.role} {a.collective_timeout_s:g} s, {b.role} "
            f"{b.collective_timeout_s:g} s), and a process has one default process group"
        )
    if a.backend != b.backend:
        return (
            f"{a.role} runs {_describe(a.backend)} and {b.role} {_describe(b.backend)}; megatron-core holds one "
            "parallel layout per process"
        )
    return None


def _describe(backend: tuple) -> str:
    return "without megatron" if backend[0] == "torch" else f"megatron at tp={backend[1]}, pp={backend[2]}"


def worker_processes(config: PPOConfig) -> tuple[tuple[str, ...], ...]:
    """The roles of each worker process on a rank (first: the actor's), see the module."""
    return _layout(config)[0]


def colocation_notes(config: PPOConfig) -> list[str]:
    """One line per role that does not run in the actor's process, with the reason."""
    return _layout(config)[1]


def _layout(config: PPOConfig) -> tuple[tuple[tuple[str, ...], ...], list[str]]:
    needs = [role_needs(config, role) for role in pool_roles(config)]
    if not config.trainer.colocate_roles:
        notes = [f"{n.role}: a process of its own (trainer.colocate_roles=false)" for n in needs[1:]]
        return tuple((n.role,) for n in needs), notes
    processes: list[list[RoleProcessNeeds]] = []
    notes: list[str] = []
    for need in needs:
        for members in processes:
            reasons = [why_apart(member, need) for member in members]
            if not any(reasons):
                members.append(need)
                break
            if members is processes[0]:
                notes.append(f"{need.role}: not in the actor's process, because {next(r for r in reasons if r)}")
        else:
            processes.append([need])
    return tuple(tuple(n.role for n in members) for members in processes), notes
