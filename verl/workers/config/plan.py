"""The run plan: every decision derived from the validated config, made once, logged, and saved with checkpoints.

The typed config (:class:`~verl.workers.config.PPOConfig`) is what the user asked for, validated and never changed
afterwards. What follows from it (the sizes a step really uses, which roles exist, which log-prob passes run, the
device, the megatron optimizer each model trains with) is a :class:`RunPlan`, built by :func:`build_run_plan` before
Ray starts, logged at start-up as one block, and written as ``run_plan.json`` into every checkpoint. Workers receive
their own config section and the plan, never the whole config.

When each value is known: the sizes and the decisions come from the config alone. The step count needs the number
of training prompts, so the driver builds the plan once the data is loaded (``num_train_prompts``); without it,
``total_training_steps`` is what the config says (None: the epochs decide).

The device (``trainer.device``, ``auto`` by default) is decided once, after Ray starts and the driver sees the
cluster's GPUs, by :func:`resolve_device` (a ``dataclasses.replace`` of the plan); before that the plan says what
the config says (``auto``: the megatron optimizer choices, which depend on the device, are None then). The rule:
``auto`` is ``cuda`` when the cluster has a GPU for every rank the run places (:func:`gpus_needed`), ``cpu`` when
it has no GPU at all, and an error naming the sizes when it has some GPUs but too few (a run sized for 8 GPUs on a
machine with 4 is a mistake to fix, not a run to move silently onto CPU processes); ``cuda`` without enough GPUs is
an error; ``cpu`` is taken as given. :func:`device_summary` is the one start-up line that says which it is. The
plan that is logged, handed to the workers and saved is the resolved one.

The sizes live one module down (:mod:`verl.workers.config.sizes`, re-exported here), where
:class:`~verl.workers.config.PPOConfig` checks its cross-key rules on them without importing this module.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from verl.workers.config.profiler import ROLLOUT_PROFILER_KEY
from verl.workers.config.sizes import StepSizes, num_training_steps, step_sizes

__all__ = [
    "RoleProfilerSettings",
    "RunPlan",
    "StepSizes",
    "build_run_plan",
    "device_summary",
    "gpus_needed",
    "num_training_steps",
    "resolve_device",
    "role_profiler_settings",
    "standalone_plan",
    "step_sizes",
]

if TYPE_CHECKING:
    from verl.workers.config.ppo import PPOConfig


@dataclass(frozen=True)
class RunPlan:
    """Decisions derived from the validated config.

    Attributes:
        device: where the workers train, resolved ("cuda" or "cpu"; ``trainer.device=auto`` resolved on the
            driver's view of the cluster).
        world_size: trainer ranks (``trainer.nnodes`` x ``trainer.n_gpus_per_node``).
        train_batch_size: prompts per training step (verl's fully async ``require_batches`` x mini-batch when the
            rollout has a group of its own; ``data.train_batch_size`` otherwise).
        total_training_steps: ``trainer.total_training_steps`` as the run applies it (None: epochs decide).
        total_epochs: epochs over the training data.
        test_freq: validate every that many steps (-1: never).
        roles: the roles this run builds, in order (``actor``, ``rollout``, ``ref``, ``critic``, ``reward_model``).
        needs_reference: the actor workers build a frozen reference model.
        needs_critic: a value model trains.
        critic_strategy: the critic's backend (None without a critic).
        computes_old_log_prob: a step runs the separate old-log-prob pass.
        uses_rollout_log_probs_as_old: the rollout's log-probs serve as the old ones.
        prox_log_prob_pass: the trainer computes the proximal log-probs (fully async with a rollout group).
        separate_rollout: the rollout runs in a worker group of its own.
        megatron_optimizer: per megatron-trained role, whether it trains on megatron-core's own optimizer
            (``{"actor": True}``; None while the device is still ``auto``); empty without megatron.
        rollout_n: responses sampled per prompt (``actor_rollout_ref.rollout.n``); the actor and the critic size
            their per-rank mini-batches with it.
        partial_rollout: the rollout switches to new weights in the middle of a generation
            (``async_training.partial_rollout``).
        worker_processes: the roles of each worker process on a trainer rank, the actor's first
            (:mod:`verl.workers.config.colocation`): ``(("actor_rollout_ref", "critic"),)`` is one process hosting
            both.
    """

    device: str
    world_size: int
    train_batch_size: int
    total_training_steps: int | None
    total_epochs: int
    test_freq: int
    roles: tuple[str, ...]
    needs_reference: bool
    needs_critic: bool
    critic_strategy: str | None
    computes_old_log_prob: bool
    uses_rollout_log_probs_as_old: bool
    prox_log_prob_pass: bool
    separate_rollout: bool
    megatron_optimizer: dict[str, bool | None]
    rollout_n: int
    partial_rollout: bool
    worker_processes: tuple[tuple[str, ...], ...]

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain values (what the log line and the checkpoint's ``run_plan.json`` hold)."""
        return dataclasses.asdict(self)

    def describe(self) -> str:
        """The plan as indented ``key: value`` lines, for the start-up log."""
        return "\n".join(f"  {key}: {value}" for key, value in self.to_dict().items())


def build_run_plan(config: PPOConfig, *, num_train_prompts: int | None = None) -> RunPlan:
    """The decisions derived from a validated ``config``; the config is only read.

    Args:
        config: the validated trainer config.
        num_train_prompts: the training prompts, once the data is loaded: ``total_training_steps`` is then the
            number of steps the run makes (:func:`num_training_steps`); None leaves it as configured.

    Raises:
        ValueError: a step needs more prompts than ``num_train_prompts``.
    """
    sizes = step_sizes(config)
    steps = sizes.total_training_steps
    if num_train_prompts is not None:
        steps = num_training_steps(sizes, num_train_prompts)
    device = config.trainer.device
    from verl.workers.config.colocation import worker_processes

    return RunPlan(
        device=device,
        world_size=config.world_size,
        train_batch_size=sizes.train_batch_size,
        total_training_steps=steps,
        total_epochs=sizes.total_epochs,
        test_freq=sizes.test_freq,
        roles=_roles(config),
        needs_reference=config.needs_reference,
        needs_critic=config.needs_critic,
        critic_strategy=config.critic_strategy if config.needs_critic else None,
        computes_old_log_prob=config.computes_old_log_prob,
        uses_rollout_log_probs_as_old=config.uses_rollout_log_probs_as_old,
        prox_log_prob_pass=config.prox_log_prob_pass,
        separate_rollout=config.separate_rollout,
        megatron_optimizer=_megatron_optimizers(config, device),
        rollout_n=config.actor_rollout_ref.rollout.n,
        partial_rollout=config.async_training.partial_rollout,
        worker_processes=worker_processes(config),
    )


def gpus_needed(config: PPOConfig) -> int:
    """The GPUs a CUDA run places, one per rank: ``trainer.nnodes`` x ``trainer.n_gpus_per_node`` (the critic and
    the reward model share the actor's ranks and their GPUs), plus ``rollout.nnodes`` x ``rollout.n_gpus_per_node``
    for a rollout group of its own."""
    return config.world_size + (config.rollout.world_size if config.separate_rollout else 0)


def resolve_device(plan: RunPlan, config: PPOConfig, cluster_gpus: int) -> RunPlan:
    """``plan`` with its device decided on a cluster of ``cluster_gpus`` GPUs (the module's rule), and the megatron
    optimizer choices that depend on it. ``cpu`` is returned as it is; ``auto`` resolved to ``cpu`` or ``cuda`` has
    the config's device rules checked again on that device (a CUDA-only setting on CPU processes).

    Raises:
        ValueError: ``cuda`` (asked for, or ``auto`` on a cluster with GPUs) and fewer GPUs than ranks; a setting
            that the resolved device cannot run (megatron-core's optimizer on CPU).
    """
    requested = plan.device
    if requested == "cpu":
        return plan
    device = _device_for(requested, gpus_needed(config), int(cluster_gpus), config)
    if requested == "auto":
        # the rules that need the device (CUDA-only tools and paths) were left to later while it was auto
        config.replace(trainer=config.trainer.replace(device=device))
    return _with_device(plan, config, device)


def _device_for(requested: str, needed: int, cluster_gpus: int, config: PPOConfig) -> str:
    """``cuda`` or ``cpu`` for ``requested`` (``auto`` | ``cuda``) on ``cluster_gpus`` GPUs; see the module."""
    if requested == "auto" and cluster_gpus == 0:
        return "cpu"
    if cluster_gpus >= needed:
        return "cuda"
    trainer, rollout = config.trainer, config.rollout
    sizes = f"trainer.nnodes={trainer.nnodes} x trainer.n_gpus_per_node={trainer.n_gpus_per_node}"
    if config.separate_rollout:
        sizes += f" plus rollout.nnodes={rollout.nnodes} x rollout.n_gpus_per_node={rollout.n_gpus_per_node}"
    if cluster_gpus == 0:
        raise ValueError(
            "trainer.device=cuda, but the Ray cluster has no GPU. Set trainer.device=auto (the GPUs where the "
            "cluster has them, else CPU processes) or trainer.device=cpu."
        )
    raise ValueError(
        f"trainer.device={requested}: the run places {needed} rank(s), one GPU each ({sizes}), but the Ray cluster "
        f"has {cluster_gpus} GPU(s). Lower those sizes to fit the GPUs, add GPU nodes, or set trainer.device=cpu "
        "to train on CPU processes (auto never moves a run sized for GPUs onto the CPU by itself)."
    )


def device_summary(plan: RunPlan, config: PPOConfig, cluster_gpus: int) -> str:
    """The start-up line that says where the run trains: ``training on 8 GPUs``, ``training on 2 CPU processes: no
    GPU in the cluster`` (``auto``), or ``... : trainer.device=cpu`` (naming the GPUs left unused, if any)."""
    ranks = gpus_needed(config)
    if plan.device == "cuda":
        return f"training on {ranks} GPU{'s' if ranks != 1 else ''}"
    line = f"training on {ranks} CPU process{'es' if ranks != 1 else ''}: "
    if config.trainer.device != "cpu":
        return line + "no GPU in the cluster"
    unused = f" (the cluster's {int(cluster_gpus)} GPU(s) stay unused)" if cluster_gpus else ""
    return line + "trainer.device=cpu" + unused


def _with_device(plan: RunPlan, config: PPOConfig, device: str) -> RunPlan:
    """``plan`` on ``device``, with the megatron optimizer choices made for it."""
    if plan.device == device:
        return plan
    return dataclasses.replace(plan, device=device, megatron_optimizer=_megatron_optimizers(config, device))


def standalone_plan(config: PPOConfig, total_training_steps: int | None = None) -> RunPlan:
    """The plan of a worker built outside a worker group (a test, a script): :func:`build_run_plan`, the device
    resolved on what this process sees (``auto``: ``cuda`` when torch sees a CUDA device, else ``cpu``; this one
    process is all it places), and ``total_training_steps`` when given (None: the config's)."""
    import torch

    plan = build_run_plan(config)
    if plan.device == "auto":
        plan = _with_device(plan, config, "cuda" if torch.cuda.is_available() else "cpu")
    if total_training_steps is None:
        return plan
    return dataclasses.replace(plan, total_training_steps=total_training_steps)


@dataclass(frozen=True)
class RoleProfilerSettings:
    """What a worker group's profiler reads from the config: its roles' ``profiler`` sections and
    ``global_profiler``.

    Attributes:
        sections: the ``profiler`` sections of the roles whose passes the group runs (the actor group: the actor's,
            and the reference's when it has one); empty for a group that is never profiled.
        global_profiler: the ``global_profiler`` section (None: no profiling at all).
        rollout: the rollout's ``profiler`` section when the group hosts the rollout (the actor group with
            ``hybrid_engine=true``), else None.
    """

    sections: tuple[Any, ...] = ()
    global_profiler: Any = None
    rollout: Any = None

    @property
    def enabled(self) -> bool:
        """Whether any of the sections turns profiling on (the group then runs under the profiling tool)."""
        return any(section.enable for section in (*self.sections, self.rollout) if section is not None)


def role_profiler_settings(config: PPOConfig, role: str) -> RoleProfilerSettings:
    """The profiler settings of the worker group ``role`` (``actor_rollout_ref``, ``critic``; any other role has
    no profiler sections), as :meth:`~verl.workers.config.PPOConfig.profiler_sections` lists them."""
    pairs = config.profiler_sections().get(role, [])
    sections = tuple(section for key, section in pairs if key != ROLLOUT_PROFILER_KEY)
    rollout = next((section for key, section in pairs if key == ROLLOUT_PROFILER_KEY), None)
    return RoleProfilerSettings(sections, config.global_profiler, rollout)


def _roles(config: PPOConfig) -> tuple[str, ...]:
    """The roles the run builds, in the order of :attr:`RunPlan.roles`."""
    built = [("actor", True), ("rollout", True), ("ref", config.needs_reference), ("critic", config.needs_critic)]
    built.append(("reward_model", config.reward_model.enable))
    return tuple(name for name, on in built if on)


def _megatron_optimizers(config: PPOConfig, device: str) -> dict[str, bool | None]:
    """Per megatron-trained role, whether it trains on megatron-core's optimizer (``MegatronConfig.training_path``);
    None for each while the device is ``auto``. The critic has no megatron-core optimizer path yet (False, or the
    error that names the setting asking for one)."""
    choices: dict[str, bool | None] = {}
    actor = config.actor_rollout_ref.actor
    if actor.strategy == "megatron":
        key = "actor_rollout_ref.actor.megatron"
        choices["actor"] = None if device == "auto" else actor.megatron.training_path(device, key)
    if config.needs_critic and config.critic_strategy == "megatron":
        megatron, key = config.critic.megatron, "critic.megatron"
        choices["critic"] = (
            None if device == "auto" else megatron.training_path(device, key, has_megatron_optimizer_path=False)
        )
    return choices
