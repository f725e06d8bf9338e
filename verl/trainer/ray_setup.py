"""Ray and the worker groups of a run: joining or starting Ray, and placing and starting the actor and critic groups.

:func:`start_ray` starts a local Ray instance or joins the cluster at ``ray_init.address``, with verl's
``ray_kwargs.ray_init`` (:func:`ray_init_kwargs`), its processes deaf to SIGTERM so that the driver alone answers a
stop signal (:mod:`verl.trainer.preemption`); :func:`ask_for_token_auth`, called before Ray is imported, keeps Ray's
token-authentication notice out of a local run's output; :func:`cluster_gpus` is what the run's device is decided on;
:func:`write_timeline` writes Ray's timeline after training (``ray_kwargs.timeline_json_file``);
:func:`worker_classes` is the one place a backend's worker classes are chosen; :func:`build_worker_groups` places
``trainer.nnodes`` x ``trainer.n_gpus_per_node`` ranks (:func:`cpus_per_worker` sizes their CPU share from the
cluster's nodes) and starts the groups on them; :func:`shutdown_groups` kills them. ``verl.trainer.main_ppo`` calls
these once per attempt (again after a worker died) and re-exports them under its own name.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verl.workers.config import PPOConfig
from verl.workers.config.plan import RunPlan

if TYPE_CHECKING:
    from omegaconf import DictConfig

logger = logging.getLogger(__name__)

HF_PROGRESS_BARS = "HF_HUB_DISABLE_PROGRESS_BARS"
RAY_AUTH_MODE = "RAY_AUTH_MODE"


def start_ray(config: PPOConfig) -> bool:
    """A local Ray instance, or the cluster at ``ray_init.address`` (``auto``: the one this machine belongs to), with
    verl's ``ray_kwargs.ray_init`` passed to ``ray.init`` (:func:`~verl.workers.config.ray_kwargs.merged_ray_init`:
    the user's runtime environment over this project's, the user's other arguments over this project's). Returns
    whether this call started or joined Ray (False: this process was connected already), so that the caller who
    started it stops it (:func:`stop_ray`).

    Raises:
        ValueError: ``num_cpus`` given with an address, a ``runtime_env.py_executable`` whose command is not on
            this machine, an argument ``ray.init`` refuses, or no cluster to join at that address.
    """
    import ray

    if ray.is_initialized():
        return False
    from verl.trainer.preemption import children_ignore_sigterm

    kwargs = ray_init_kwargs(config)
    address = kwargs["address"]
    try:
        with children_ignore_sigterm():  # only the driver answers a SIGTERM to its process group (preemption)
            ray.init(**{**kwargs, "address": "local" if address is None else address})
    except ConnectionError as err:
        raise ValueError(
            f"ray_init.address={address!r}: no Ray cluster to join ({str(err).splitlines()[0]}). Start one with "
            "`ray start --head` (docs/start/multinode.md), give its address, or set ray_init.address=null for a "
            "local instance."
        ) from None
    except (TypeError, RuntimeError) as err:  # an argument ray.init takes by name but refuses in this combination
        if ray.is_initialized():
            raise
        raise ValueError(f"ray.init refused ray_kwargs.ray_init ({kwargs}): {err}") from None
    if address is not None:
        nodes = [node for node in ray.nodes() if node.get("Alive")]
        total = ray.cluster_resources()
        logger.info(
            "joined the Ray cluster at %s: %d alive node(s), %g CPU, %g GPU",
            address,
            len(nodes),
            total.get("CPU", 0),
            total.get("GPU", 0),
        )
    return True


def stop_ray() -> None:
    """Disconnect from Ray, stopping the local instance :func:`start_ray` started.

    Ray's own shutdown sends each daemon of a local instance a SIGTERM and waits up to a second for it to exit before
    it kills it. Ours ignore SIGTERM (:func:`~verl.trainer.preemption.children_ignore_sigterm`), so that wait is lost
    time, once per daemon (5.6 s of a 30 s one-step run here): they are killed at once instead. A joined cluster's
    daemons are not this process's to stop; Ray only disconnects from them.
    """
    import ray

    if not ray.is_initialized():
        return
    node = getattr(getattr(ray, "_private", None), "worker", None)
    node = getattr(node, "_global_node", None)
    kill_all = getattr(node, "kill_all_processes", None)
    if callable(kill_all):  # Ray's internals as of 2.x; without them, its own (slower) shutdown
        node.kill_all_processes = functools.partial(_kill_without_waiting, kill_all)
    ray.shutdown()


def _kill_without_waiting(kill_all, *args: Any, **kwargs: Any) -> Any:
    return kill_all(*args, **{**kwargs, "allow_graceful": False})


def ask_for_token_auth(composed: DictConfig) -> None:
    """``RAY_AUTH_MODE=token`` when the ``composed`` config (not validated yet: validating imports Ray) starts a local
    Ray instance, unless the variable is set or Ray is imported already.

    Ray turns token authentication on for a new local instance when ``RAY_AUTH_MODE`` is unset, and warns about that
    default on every run; asking for it by name gives the same protection without the warning. Ray reads the
    variable when it is imported, so a process that imported Ray before keeps Ray's default (and its warning). A run
    that joins a cluster (``ray_init.address`` or ``ray_kwargs.ray_init.address``) gets the cluster's own setting.
    """
    from omegaconf import OmegaConf

    if os.environ.get(RAY_AUTH_MODE) is not None or "ray" in sys.modules:
        return
    try:
        addresses = [OmegaConf.select(composed, key) for key in ("ray_init.address", "ray_kwargs.ray_init.address")]
    except Exception:  # an interpolation that does not resolve: the config's check reports it
        return
    if all(address is None for address in addresses):
        os.environ[RAY_AUTH_MODE] = "token"


def ray_init_kwargs(config: PPOConfig) -> dict[str, Any]:
    """The keyword arguments of ``ray.init`` for ``config`` (``address`` None: a local instance of our own, even
    when this machine runs a cluster), before ``address`` is spelt as Ray wants it.

    Raises:
        ValueError: ``num_cpus`` with an address; a ``py_executable`` command not found for a local instance.
    """
    from verl.utils.cpu_linear import primitive_cache_env
    from verl.workers.config.ray_kwargs import merged_ray_init, runtime_env_over, source_key

    ray_kwargs = config.ray_kwargs
    user = merged_ray_init(config.ray_init, ray_kwargs)
    address, num_cpus = user["address"], user["num_cpus"]
    if address is not None and num_cpus is not None:
        raise ValueError(
            f"{source_key(config.ray_init, ray_kwargs, 'num_cpus')}={num_cpus} sizes a local Ray instance, "
            f"but ray_init.address={address!r} joins a cluster whose nodes were sized by `ray start --num-cpus`; set "
            "ray_init.num_cpus=null."
        )
    repo_root = str(Path(__file__).resolve().parents[2])
    pythonpath = os.pathsep.join(p for p in (repo_root, os.getcwd(), os.environ.get("PYTHONPATH", "")) if p)
    # the node's cores split evenly over every worker process placed on it (actor, critic, reward model, rollout)
    threads = threads_per_process(os.cpu_count() or 1, processes_per_node(config))
    # bounds oneDNN's kernel caches in the workers (verl.utils.cpu_linear)
    env_vars = {"PYTHONPATH": pythonpath, "VERL_NUM_THREADS": str(threads), **primitive_cache_env()}
    # no per-tensor "Loading weights" bar from each worker's transformers (a user's own setting stays): relayed by
    # Ray, its carriage returns garble the log; huggingface_hub's documented switch, which transformers follows
    env_vars[HF_PROGRESS_BARS] = os.environ.get(HF_PROGRESS_BARS, "1")
    runtime_env = runtime_env_over({"env_vars": env_vars}, user.pop("runtime_env", None))
    if address is None:
        _check_py_executable(runtime_env.get("py_executable"))
    # Ray starts its workers at niceness 15, so that its own daemons stay responsive; our workers do the training,
    # and at low priority every bit of other load on a busy node preempts their compute threads (measured on 2 CPU
    # cores: a 10M-parameter GRPO step took 15-20% longer). A local instance gets normal priority here; a cluster
    # sets it when it starts (`RAY_worker_niceness=0 ray start ...`, docs/start/multinode.md).
    system_config = {"worker_niceness": 0} if address is None else {}
    system_config.update(user.pop("_system_config", None) or {})
    ours = {"include_dashboard": False, "log_to_driver": True, "runtime_env": runtime_env}
    if system_config:
        ours["_system_config"] = system_config
    return {**ours, **user, "runtime_env": runtime_env}


def _check_py_executable(executable: str | None) -> None:
    """A ``runtime_env.py_executable`` for a local instance must start with a command found on this machine, and a
    ``uv run`` prefix must be one that can start here (:func:`_uv_run_problem`)."""
    import shlex
    import shutil

    if executable is None:
        return
    words = shlex.split(executable)
    problem = f"{words[0]!r} is not found on this machine" if shutil.which(words[0]) is None else None
    problem = problem or _uv_run_problem(words, Path.cwd())
    if problem is not None:
        raise ValueError(
            f"ray_kwargs.ray_init.runtime_env.py_executable={executable!r}: {problem}, so no worker could start. "
            "Fix that, or set ray_kwargs.ray_init.runtime_env.py_executable=null to start the workers with this "
            "Python (verl's scripts set a `uv run` prefix for verl's own uv project and its extras)."
        )


def _uv_run_problem(words: list[str], cwd: Path) -> str | None:
    """Why ``uv ... run ...`` (``words``) cannot start a worker from ``cwd``, or None: uv runs in the project of the
    nearest ``pyproject.toml`` at or above the working directory, each ``--extra`` must be one of its optional
    dependency groups (checked where Python has ``tomllib``, 3.11 on), and ``--frozen`` / ``--locked`` need its
    ``uv.lock``. Any other command is left to Ray."""
    import re

    if Path(words[0]).name != "uv" or "run" not in words:
        return None
    options = words[words.index("run") + 1 :]
    project = next((d for d in (cwd, *cwd.parents) if (d / "pyproject.toml").is_file()), None)
    if project is None:
        return f"`uv run` finds no pyproject.toml in {cwd} or above"
    if any(o in ("--frozen", "--locked") for o in options) and not (project / "uv.lock").is_file():
        return f"`uv run --frozen` / `--locked` needs {project / 'uv.lock'}, which does not exist"

    def normalized(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    asked = [options[i + 1] for i, o in enumerate(options[:-1]) if o == "--extra"]
    asked += [o.split("=", 1)[1] for o in options if o.startswith("--extra=")]
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the extras are left to uv
        return None
    pyproject = tomllib.loads((project / "pyproject.toml").read_text(encoding="utf-8"))
    extras = sorted(pyproject.get("project", {}).get("optional-dependencies", {}))
    missing = [extra for extra in asked if normalized(extra) not in {normalized(e) for e in extras}]
    if missing:
        return f"{project / 'pyproject.toml'} has no extra {', '.join(missing)} (its extras: {', '.join(extras)})"
    return None


def write_timeline(config: PPOConfig) -> None:
    """Ray's timeline of the run's tasks and actors to ``ray_kwargs.timeline_json_file`` (verl's profiling trace,
    Chrome trace format), once training is over; nothing when it is null or Ray is not running."""
    import ray

    path = config.ray_kwargs.timeline_json_file
    if path is None or not ray.is_initialized():
        return
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        ray.timeline(filename=path)
        logger.info("Ray timeline written to %s (ray_kwargs.timeline_json_file)", path)
    except Exception as err:  # a trace must never hide the run's own outcome
        logger.warning("could not write the Ray timeline to %s: %s", path, err)


def worker_classes(strategy: str):
    """(actor-rollout-ref worker class, critic worker class) of a backend: the one place a backend is chosen."""
    if strategy == "megatron":
        from verl.workers.megatron_workers import MegatronActorRolloutRefWorker, MegatronCriticWorker

        return MegatronActorRolloutRefWorker, MegatronCriticWorker
    from verl.workers.config.roles import FSDP_STRATEGIES

    if strategy in FSDP_STRATEGIES:
        from verl.workers.fsdp_workers import FSDPActorRolloutRefWorker, FSDPCriticWorker

        return FSDPActorRolloutRefWorker, FSDPCriticWorker
    from verl.workers.dp_workers import DPActorRolloutRefWorker, DPCriticWorker

    return DPActorRolloutRefWorker, DPCriticWorker


@dataclass(frozen=True)
class WorkerGroups:
    """The worker groups of one attempt, by name.

    Iterating yields the groups that exist, in the order they started (what :func:`shutdown_groups` takes).

    Attributes:
        actor_rollout_ref: the actor (+ rollout, + reference) group; always there.
        critic: the critic group when a value model trains, else None.
        reward_model: the reward-model group with ``reward_model.enable``, else None.
        rollout: the rollout group of its own (``actor_rollout_ref.hybrid_engine=false``), else None.
        actor_process: the group of the actor's processes when they host other roles too (the run plan's
            ``worker_processes``; :class:`~verl.workers.colocated.ColocatedRolesWorker`), else None.
        values_ride_with_log_probs: the critic's values come out of the actor's generation call
            (``actor_process.generate_with_log_probs_and_values``): the critic is in the actor's processes, with
            the same data-parallel layout, so the sequences cross the driver once for both.
    """

    actor_rollout_ref: Any
    critic: Any = None
    reward_model: Any = None
    rollout: Any = None
    actor_process: Any = None
    values_ride_with_log_probs: bool = False

    @property
    def has_critic(self) -> bool:
        return self.critic is not None

    @property
    def has_reward_model(self) -> bool:
        return self.reward_model is not None

    @property
    def has_rollout_group(self) -> bool:
        """Whether the rollout runs in a group of its own (else it lives in the actor workers)."""
        return self.rollout is not None

    def __iter__(self) -> Iterator[Any]:
        groups = (self.actor_process, self.actor_rollout_ref, self.critic, self.reward_model, self.rollout)
        return iter([group for group in groups if group is not None])


def processes_per_node(config: PPOConfig) -> int:
    """Worker processes a node of the run holds: ``trainer.n_gpus_per_node`` ranks of each worker process of a rank
    (one when the actor, critic and reward model share it, :mod:`verl.workers.config.colocation`) plus the rollout
    group's ``rollout.n_gpus_per_node`` when it has a group of its own."""
    from verl.workers.config.colocation import worker_processes

    per_rank = len(worker_processes(config))
    return config.trainer.n_gpus_per_node * per_rank + num_rollout_workers_per_node(config)


def num_rollout_workers_per_node(config: PPOConfig) -> int:
    """Ranks of the rollout group of its own on one node (0: the rollout lives in the actor workers)."""
    return config.rollout.n_gpus_per_node if config.separate_rollout else 0


def threads_per_process(cores: int, processes: int) -> int:
    """``VERL_NUM_THREADS``: a node's cores split evenly over the worker processes placed on it, 1 at least.

    Every process that computes at the same time as the others counts: each worker process (roles that share one
    take turns, so they share its threads) and each rank of a rollout group of its own. A hosted vLLM engine runs on
    its process's threads (``OMP_NUM_THREADS``); the driver and the workers' weight-receiving threads wait while the
    workers compute."""
    return max(1, cores // max(1, processes))


def build_worker_groups(config: PPOConfig, plan: RunPlan) -> WorkerGroups:
    """Start the run's worker groups: actor (+rollout, +ref); critic when a value model trains; reward model with
    ``reward_model.enable`` (:class:`~verl.workers.reward_model.RewardModelWorker`); the rollout group of its own
    with ``hybrid_engine=false`` (:class:`~verl.workers.rollout_worker.RolloutWorker`).

    ``trainer.nnodes`` x ``trainer.n_gpus_per_node`` ranks share one resource pool, so rank ``r`` of each role runs
    in the same bundle (same node, same GPU), and the roles of one entry of ``plan.worker_processes`` in the same
    process; the rollout group has a pool of its own (``rollout.nnodes`` x ``rollout.n_gpus_per_node``, a device
    each). Every worker gets its own config section and the run ``plan`` (its device, the passes a step runs,
    ``total_training_steps``, which sizes the LR schedules), plus its role's profiler settings (the worker class's
    ``init_kwargs``), never the whole config. On failure, whatever was started is torn down first.

    Raises:
        PlacementError: the Ray cluster cannot hold the ranks; the message names the keys and what is missing.
        WorkerDiedError: a worker died while the groups started.
    """
    from verl.single_controller import PlacementError

    use_gpu = plan.device == "cuda" or (plan.device == "auto" and cluster_gpus() > 0)  # main_ppo resolves it first
    pool, rollout_pool = _resource_pools(config, plan, use_gpu)
    started: list = []
    try:
        groups: dict[str, Any] = {}
        for roles in plan.worker_processes:
            groups.update(_start_process(config, plan, roles, pool, started))
        if rollout_pool is not None:
            from verl.workers.rollout_worker import RolloutWorker

            timeout_s = config.trainer.collective_timeout_s
            groups["rollout"] = _start_group(config, plan, "rollout", RolloutWorker, rollout_pool, timeout_s, started)
    except PlacementError as err:
        shutdown_groups(*started)
        raise _placement_error(config, use_gpu, err) from None
    except BaseException:
        shutdown_groups(*started)
        raise
    return WorkerGroups(**groups, values_ride_with_log_probs=_values_can_ride(groups))


def role_worker_class(config: PPOConfig, plan: RunPlan, role: str) -> type:
    """The worker class of ``role`` (``actor_rollout_ref``, ``critic``, ``reward_model``) in this run."""
    if role == "actor_rollout_ref":
        return worker_classes(config.actor_rollout_ref.actor.strategy)[0]
    if role == "critic":
        return worker_classes(plan.critic_strategy)[1]
    from verl.workers.reward_model import RewardModelWorker

    return RewardModelWorker


def _start_process(config: PPOConfig, plan: RunPlan, roles: tuple[str, ...], pool, started) -> dict[str, Any]:
    """The groups of the roles that share one worker process per rank: a group of their own for a lone role, else
    one group of :class:`~verl.workers.colocated.ColocatedRolesWorker` and a role group per role
    (:meth:`~verl.single_controller.ray_worker_group.RayWorkerGroup.spawn`), built in order; ``actor_process``
    names the shared group when it hosts the actor."""
    from verl.workers.config.colocation import role_needs

    # verl's actor_rollout_ref.nccl_timeout for the actor; the same for every role of one process (colocation)
    timeout_s = role_needs(config, roles[0]).collective_timeout_s
    if len(roles) == 1:
        cls = role_worker_class(config, plan, roles[0])
        return {roles[0]: _start_group(config, plan, roles[0], cls, pool, timeout_s, started)}
    from verl.single_controller import RayClassWithInitArgs, RayWorkerGroup
    from verl.single_controller.colocated import create_colocated_worker_cls
    from verl.workers.colocated import ColocatedRolesWorker

    classes = {role: role_worker_class(config, plan, role) for role in roles}
    hosted = {role: (cls, cls.init_kwargs(config, plan)) for role, cls in classes.items()}
    group = RayWorkerGroup(
        pool,
        RayClassWithInitArgs(create_colocated_worker_cls(classes, base=ColocatedRolesWorker), roles=hosted),
        name_prefix="+".join(roles),
        collective_timeout_s=timeout_s,
        runtime_env={**_profiled_runtime_env(config, roles[0]), "env_vars": worker_env_vars(config.trainer)},
    )
    started.append(group)
    views = group.spawn()
    for role in roles:
        _init_models(views[role])
    if "actor_rollout_ref" in roles:  # the shared group's own calls split rows as the actor does
        group.set_data_parallel_layout(views["actor_rollout_ref"].data_parallel_layout)
        views["actor_process"] = group
    return views


def _values_can_ride(groups: dict[str, Any]) -> bool:
    """Whether the actor's processes compute the values in the generation call: they host the critic (the critic's
    group is a role of theirs), and both roles split rows over the ranks alike."""
    process, critic = groups.get("actor_process"), groups.get("critic")
    if process is None or critic is None or critic.name_prefix != process.name_prefix:
        return False
    return critic.data_parallel_layout == groups["actor_rollout_ref"].data_parallel_layout


def _profiled_runtime_env(config: PPOConfig, role: str) -> dict:
    """Nsight Systems' runtime environment for a profiled role's workers (``tool: nsys``), else none."""
    from verl.utils.profiler import worker_runtime_env
    from verl.workers.config.plan import role_profiler_settings

    return worker_runtime_env(config.global_profiler) if role_profiler_settings(config, role).enabled else {}


def _init_models(group) -> None:
    """Build the group's models (logging each rank's line) and learn its data-parallel layout."""
    for line in group.init_model():
        logger.info("%s", line)
    # ranks of one model-parallel group share their rows (megatron tensor parallelism)
    group.set_data_parallel_layout(group.execute_all("data_parallel_layout"))


def _resource_pools(config: PPOConfig, plan: RunPlan, use_gpu: bool):
    """(the pool the trainer's worker processes share, the rollout group's own pool or None), each process's CPU
    share sized by every worker process a node holds."""
    from verl.single_controller import RayResourcePool

    trainer = config.trainer
    processes = len(plan.worker_processes)
    cpus = cpus_per_worker(trainer.nnodes, processes_per_node(config), trainer.n_gpus_per_node if use_gpu else 0)
    pool = RayResourcePool(
        config.world_size,
        num_cpus_per_worker=cpus,
        num_gpus_per_worker=(1 / processes) if use_gpu else 0,
        nnodes=trainer.nnodes,
        max_colocate=processes,
        placement_timeout_s=trainer.placement_timeout_s,
    )
    if not config.separate_rollout:
        return pool, None
    rollout_pool = RayResourcePool(
        config.rollout.world_size,
        num_cpus_per_worker=cpus,
        num_gpus_per_worker=1 if use_gpu else 0,
        nnodes=config.rollout.nnodes,
        placement_timeout_s=trainer.placement_timeout_s,
    )
    return pool, rollout_pool


def _start_group(config: PPOConfig, plan: RunPlan, name_prefix: str, worker_cls, pool, timeout_s: float, started):
    """Start the group ``name_prefix`` (its role's name), build its models, and learn its data-parallel layout; the
    group is appended to ``started`` as soon as it exists, so that a failure can tear it down."""
    from verl.single_controller import RayClassWithInitArgs, RayWorkerGroup

    group = RayWorkerGroup(
        pool,
        # the worker's own section, the plan and what it reads of other sections (never the whole config)
        RayClassWithInitArgs(worker_cls, **worker_cls.init_kwargs(config, plan)),
        name_prefix=name_prefix,
        collective_timeout_s=timeout_s,
        # tool nsys: the profiled groups' workers run under Nsight Systems
        runtime_env={**_profiled_runtime_env(config, name_prefix), "env_vars": worker_env_vars(config.trainer)},
    )
    started.append(group)
    _init_models(group)
    return group


def _placement_error(config: PPOConfig, use_gpu: bool, err: Exception) -> Exception:
    """The placement error of the run's groups, naming the keys that size them."""
    from verl.single_controller import PlacementError

    trainer, rollout = config.trainer, config.rollout
    rollout_ranks = (
        f" plus rollout.nnodes={rollout.nnodes} x rollout.n_gpus_per_node={rollout.n_gpus_per_node}"
        if config.separate_rollout
        else ""
    )
    return PlacementError(
        f"trainer.nnodes={trainer.nnodes} x trainer.n_gpus_per_node={trainer.n_gpus_per_node}{rollout_ranks} "
        f"({'GPU' if use_gpu else 'CPU'} ranks) does not fit the Ray cluster: {err} Add nodes "
        "(`ray start --address=<head>` on each, see docs/start/multinode.md) or lower trainer.nnodes / "
        "trainer.n_gpus_per_node."
    )


def worker_env_vars(trainer) -> dict[str, str]:
    """The environment variables of every worker of a run, from ``trainer``.

    ``trainer.nccl_blocking_wait=true`` sets ``TORCH_NCCL_BLOCKING_WAIT=1``: an NCCL collective that waits past
    ``trainer.collective_timeout_s`` then raises its timeout in the waiting rank's Python thread (torch turns the
    watchdog's tear-down off in this mode), so the waiting ranks report a timeout and the rank they waited for, still
    running, is named as hung, as on gloo. Without it NCCL's watchdog ends the waiting ranks' processes, and the
    run reports the lowest of them as dead. The cost: each rank's CPU waits for every collective it waits on to
    finish on the GPU instead of queueing the next kernels, so it is off by default.
    """
    return {"TORCH_NCCL_BLOCKING_WAIT": "1"} if trainer.nccl_blocking_wait else {}


def cpus_per_worker(nnodes: int, workers_per_node: int, gpus_per_node: int = 0) -> float:
    """Up to one CPU per worker, less where the nodes are small: the ``nnodes``-th largest node's CPUs are shared
    by the workers of one node (0.1 at least, so that a cluster of tiny nodes gets a placement error, not a hang).
    On a GPU run only the nodes with ``gpus_per_node`` GPUs count: a CPU-only head node holds no rank."""
    import ray

    alive = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    sizes = sorted((r.get("CPU", 0.0) for r in alive if r.get("GPU", 0.0) >= gpus_per_node), reverse=True)
    node_cpus = sizes[min(nnodes, len(sizes)) - 1] if sizes else 1.0
    return max(0.1, min(1.0, node_cpus / workers_per_node))


def shutdown_groups(*groups) -> None:
    """Kill the workers of every group given (None entries are skipped) and free their placement."""
    for group in groups:
        if group is not None:
            group.shutdown()


def cluster_gpus() -> int:
    """The whole GPUs of the Ray cluster this process is connected to (0 without any, and 0 when it is connected to
    none: a caller that replaced :func:`start_ray`, as the tests of the training loop do)."""
    import ray

    if not ray.is_initialized():
        return 0
    return int(ray.cluster_resources().get("GPU", 0))
