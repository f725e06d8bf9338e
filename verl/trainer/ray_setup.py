"""Ray and the worker groups of a run: joining or starting Ray, and placing and starting the actor and critic groups.

:func:`start_ray` starts a local Ray instance or joins the cluster at ``ray_init.address``; :func:`worker_classes`
is the one place a backend's worker classes are chosen; :func:`build_worker_groups` places ``trainer.nnodes`` x
``trainer.n_gpus_per_node`` ranks (:func:`cpus_per_worker` sizes their CPU share from the cluster's nodes) and
starts the groups on them; :func:`shutdown_groups` kills them. ``verl.trainer.main_ppo`` calls these once per
attempt (again after a worker died) and re-exports them under its own name.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from verl.workers.config import PPOConfig

logger = logging.getLogger(__name__)


def start_ray(config: PPOConfig) -> None:
    """A local Ray instance, or the cluster at ``ray_init.address`` (``auto``: the one this machine belongs to).

    Raises:
        ValueError: ``ray_init.num_cpus`` given with an address, or no cluster to join at that address.
    """
    import ray

    from verl.utils.cpu_linear import primitive_cache_env

    if ray.is_initialized():
        return
    address, num_cpus = config.ray_init.address, config.ray_init.num_cpus
    if address is not None and num_cpus is not None:
        raise ValueError(
            f"ray_init.num_cpus={num_cpus} sizes a local Ray instance, but ray_init.address={address!r} joins a "
            "cluster whose nodes were sized by `ray start --num-cpus`; set ray_init.num_cpus=null."
        )
    repo_root = str(Path(__file__).resolve().parents[2])
    pythonpath = os.pathsep.join(p for p in (repo_root, os.getcwd(), os.environ.get("PYTHONPATH", "")) if p)
    # the node's cores split evenly over the worker processes (a rollout group of its own counts too)
    threads = max(1, (os.cpu_count() or 1) // (config.world_size + num_rollout_workers(config)))
    # Ray starts its workers at niceness 15, so that its own daemons stay responsive; our workers do the training,
    # and at low priority every bit of other load on a busy node preempts their compute threads (measured on 2 CPU
    # cores: a 10M-parameter GRPO step took 15-20% longer). A local instance gets normal priority here; a cluster
    # sets it when it starts (`RAY_worker_niceness=0 ray start ...`, docs/start/multinode.md).
    cache_env = primitive_cache_env()  # bounds oneDNN's kernel caches in the workers (verl.utils.cpu_linear)
    local_only = {"_system_config": {"worker_niceness": 0}} if address is None else {}
    try:
        ray.init(
            # null means a local instance of our own, even when this machine runs a cluster (`ray start`)
            address="local" if address is None else address,
            num_cpus=num_cpus,
            include_dashboard=False,
            log_to_driver=True,
            runtime_env={"env_vars": {"PYTHONPATH": pythonpath, "VERL_NUM_THREADS": str(threads), **cache_env}},
            **local_only,
        )
    except ConnectionError as err:
        raise ValueError(
            f"ray_init.address={address!r}: no Ray cluster to join ({str(err).splitlines()[0]}). Start one with "
            "`ray start --head` (docs/start/multinode.md), give its address, or set ray_init.address=null for a "
            "local instance."
        ) from None
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


def num_rollout_workers(config: PPOConfig) -> int:
    """Ranks of the rollout worker group of its own (``hybrid_engine=false``); 0 when the rollout lives in the actor
    workers."""
    return config.rollout.world_size if config.separate_rollout else 0


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


def build_worker_groups(config: PPOConfig, num_steps: int):
    """The actor (+rollout, +ref) worker group, the critic group when a value model is needed, the reward-model
    group with ``reward_model.enable`` (:class:`~verl.workers.reward_model.RewardModelWorker`), and the rollout
    group of its own with ``hybrid_engine=false`` (:class:`~verl.workers.rollout_worker.RolloutWorker`): ``(actor,
    critic or None, reward model or None, rollout or None)``.

    ``trainer.nnodes`` x ``trainer.n_gpus_per_node`` ranks, ``n_gpus_per_node`` on each node; the groups share
    one resource pool, so rank ``r`` of each runs in the same bundle (same node, same GPU). The rollout group has a
    pool of its own (``rollout.nnodes`` x ``rollout.n_gpus_per_node``, a device each). On failure, whatever was
    started is torn down before the error propagates.

    Raises:
        PlacementError: the Ray cluster cannot hold the ranks; the message names the keys and what is missing.
        WorkerDiedError: a worker died while the groups started.
    """
    from verl.single_controller import (
        PlacementError,
        RayClassWithInitArgs,
        RayResourcePool,
        RayWorkerGroup,
    )
    from verl.utils.profiler import worker_runtime_env

    trainer = config.trainer
    use_gpu = trainer.device == "cuda" or (trainer.device == "auto" and _cluster_has_gpus())
    groups = 1 + int(config.needs_critic) + int(config.reward_model.enable)
    # a rollout group of its own may share the nodes: its workers count towards each node's share
    rollout_per_node = config.rollout.n_gpus_per_node if config.separate_rollout else 0
    cpus = cpus_per_worker(
        trainer.nnodes, trainer.n_gpus_per_node * groups + rollout_per_node, trainer.n_gpus_per_node if use_gpu else 0
    )
    pool = RayResourcePool(
        config.world_size,
        num_cpus_per_worker=cpus,
        num_gpus_per_worker=(1 / groups) if use_gpu else 0,
        nnodes=trainer.nnodes,
        max_colocate=groups,
        placement_timeout_s=config.trainer.placement_timeout_s,
    )
    started = []

    profiled = config.profiler_sections()

    def start(worker_cls, name_prefix: str, collective_timeout_s: float, worker_pool=pool):
        enabled = any(section.enable for _, section in profiled.get(name_prefix, []))
        # tool nsys: the profiled groups' workers run under Nsight Systems
        runtime_env = worker_runtime_env(config.global_profiler) if enabled else {}
        group = RayWorkerGroup(
            worker_pool,
            RayClassWithInitArgs(worker_cls, config, num_steps),
            name_prefix=name_prefix,
            collective_timeout_s=collective_timeout_s,
            runtime_env={**runtime_env, "env_vars": worker_env_vars(trainer)},
        )
        started.append(group)
        for line in group.init_model():
            logger.info("%s", line)
        # ranks of one model-parallel group share their rows (megatron tensor parallelism)
        group.set_data_parallel_layout(group.execute_all("data_parallel_layout"))
        return group

    try:
        # verl's actor_rollout_ref.nccl_timeout is the actor group's collective timeout (null: the trainer's)
        actor_timeout_s = config.actor_rollout_ref.nccl_timeout or config.trainer.collective_timeout_s
        actor_cls = worker_classes(config.actor_rollout_ref.actor.strategy)[0]
        actor_wg = start(actor_cls, "actor_rollout_ref", actor_timeout_s)
        critic_wg = (
            start(worker_classes(config.critic_strategy)[1], "critic", config.trainer.collective_timeout_s)
            if config.needs_critic
            else None
        )
        reward_model_wg = None
        if config.reward_model.enable:
            from verl.workers.reward_model import RewardModelWorker

            reward_model_wg = start(RewardModelWorker, "reward_model", config.trainer.collective_timeout_s)
        rollout_wg = None
        if config.separate_rollout:
            from verl.workers.rollout_worker import RolloutWorker

            rollout = config.rollout
            rollout_pool = RayResourcePool(
                rollout.world_size,
                num_cpus_per_worker=cpus,
                num_gpus_per_worker=1 if use_gpu else 0,
                nnodes=rollout.nnodes,
                placement_timeout_s=config.trainer.placement_timeout_s,
            )
            rollout_wg = start(RolloutWorker, "rollout", config.trainer.collective_timeout_s, rollout_pool)
    except PlacementError as err:
        shutdown_groups(*started)
        rollout_ranks = (
            f" plus rollout.nnodes={config.rollout.nnodes} x rollout.n_gpus_per_node={config.rollout.n_gpus_per_node}"
            if config.separate_rollout
            else ""
        )
        raise PlacementError(
            f"trainer.nnodes={trainer.nnodes} x trainer.n_gpus_per_node={trainer.n_gpus_per_node}{rollout_ranks} "
            f"({'GPU' if use_gpu else 'CPU'} ranks) does not fit the Ray cluster: {err} Add nodes "
            "(`ray start --address=<head>` on each, see docs/start/multinode.md) or lower trainer.nnodes / "
            "trainer.n_gpus_per_node."
        ) from None
    except BaseException:
        shutdown_groups(*started)
        raise
    return actor_wg, critic_wg, reward_model_wg, rollout_wg


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


def _cluster_has_gpus() -> bool:
    import ray

    return ray.cluster_resources().get("GPU", 0) > 0
