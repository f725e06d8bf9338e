"""Entry point: ``python -m verl.trainer.main_ppo [--config-name NAME] [key=value ...]``.

Composes the YAML config (``verl/trainer/config/ppo_trainer.yaml``; ``--config-name ppo_megatron_trainer`` for the
megatron defaults) with Hydra's override syntax, validates it into a typed
:class:`~verl.workers.config.PPOConfig` and checks what it points at (model, checkpoint) before Ray starts, then
starts Ray (a local instance, or joins the cluster at ``ray_init.address``, e.g. ``auto``), places
``trainer.nnodes`` x ``trainer.n_gpus_per_node`` ranks (that many on each node), starts the worker groups and the
trainer, and runs it.

A dead worker (its process killed, or its node lost) is noticed within a bounded time, also while the other ranks
wait in a collective (``torch.distributed`` timeouts, ``trainer.collective_timeout_s``). With ``trainer.max_restarts=N``
the trainer then tears the groups down, builds them again, resumes from the last checkpoint and goes on, at most N
times (each restart logged and counted in the ``trainer/restarts`` metric); past that, the run stops.

Exit codes: 0 done; 1 training stopped by the update-failure policy (the message says why and names the last good
checkpoint); 2 bad config (composition, a value, a key, a path, or more nodes/GPUs than the Ray cluster has); 3 a
checkpoint to resume from is damaged or not ours (the message names the file and what to do); 4 a worker died and
no restart was left (the message names the role, rank and node, and the last good checkpoint, which is intact:
run again to resume from it).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from verl.utils.checkpoint import CheckpointError
from verl.workers.config import PPOConfig
from verl.workers.update_outcome import UpdateFailedError

logger = logging.getLogger("verl.trainer")
CONFIG_DIR = Path(__file__).parent / "config"

EXIT_OK, EXIT_POLICY_STOP, EXIT_BAD_CONFIG, EXIT_BAD_CHECKPOINT = 0, 1, 2, 3
EXIT_WORKER_DIED = 4


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    for noisy in ("urllib3", "filelock", "matplotlib", "ray"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def total_steps(config: PPOConfig, num_train_prompts: int) -> int:
    steps_per_epoch = num_train_prompts // config.data.train_batch_size
    if steps_per_epoch < 1:
        raise ValueError(
            f"data.train_batch_size={config.data.train_batch_size} is larger than the {num_train_prompts} training "
            f"prompts; lower it or add data."
        )
    if config.trainer.total_training_steps is None:
        return steps_per_epoch * config.trainer.total_epochs
    return config.trainer.total_training_steps


def check_model_path(config: PPOConfig) -> None:
    """The model (and tokenizer) directory must load as a Hugging Face config, checked before Ray starts."""
    from verl.models.loading import load_hf_config

    paths = [("actor_rollout_ref.model.path", config.actor_rollout_ref.model.path)]
    if config.needs_critic:
        paths.append(("critic.model.path", config.critic.model.path))
    for key, path in paths:
        try:
            load_hf_config(path)
        except Exception as err:  # whatever transformers raises for a bad path, the user needs the key and the value
            first_line = str(err).splitlines()[0] if str(err) else ""
            raise ValueError(
                f"{key}={path!r} does not load as a Hugging Face model ({type(err).__name__}: {first_line}). Point "
                f"it at a model directory with config.json, or use 'default' for the embedded tiny model."
            ) from None


def check_resume_path(config: PPOConfig) -> None:
    """``trainer.resume_from_path`` must name a complete ``global_step_N`` checkpoint directory."""
    from verl.utils.checkpoint import is_complete_checkpoint, step_of_checkpoint

    trainer = config.trainer
    if trainer.resume_mode != "resume_path":
        return
    path = Path(trainer.resume_from_path)
    step_of_checkpoint(path)  # the name must be global_step_N
    if not is_complete_checkpoint(path, checkpoint_roles(config)):
        raise ValueError(
            f"trainer.resume_from_path={path} is not a complete checkpoint; point it at a global_step_N directory "
            f"written by the trainer, or use trainer.resume_mode=auto."
        )


def checkpoint_roles(config: PPOConfig) -> tuple[str, ...]:
    return ("actor", "critic") if config.needs_critic else ("actor",)


def choose_checkpoint(config: PPOConfig) -> Path | None:
    """The checkpoint the run resumes from, every file checked in the driver; None for a fresh start.

    ``auto`` takes the newest complete ``global_step_N`` (incomplete ones are skipped with a warning).

    Raises:
        CheckpointError: a file of the chosen checkpoint is damaged or was not written by this trainer.
    """
    from verl.utils.checkpoint import find_latest_checkpoint, verify_checkpoint

    trainer, roles = config.trainer, checkpoint_roles(config)
    if trainer.resume_mode == "disable":
        return None
    if trainer.resume_mode == "resume_path":
        path = Path(trainer.resume_from_path)
    else:
        path = find_latest_checkpoint(trainer.default_local_dir, roles=roles)
        if path is None:
            return None
    verify_checkpoint(path, roles)
    return path


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
    threads = max(1, (os.cpu_count() or 1) // config.world_size)
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
    """The actor (+rollout, +ref) worker group and, when a value model is needed, the critic group.

    ``trainer.nnodes`` x ``trainer.n_gpus_per_node`` ranks, ``n_gpus_per_node`` on each node; the two groups share
    one resource pool, so rank ``r`` of both runs in the same bundle (same node, same GPU). On failure, whatever
    was started is torn down before the error propagates.

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

    trainer = config.trainer
    use_gpu = trainer.device == "cuda" or (trainer.device == "auto" and _cluster_has_gpus())
    groups = 2 if config.needs_critic else 1
    cpus = cpus_per_worker(trainer.nnodes, trainer.n_gpus_per_node * groups)
    pool = RayResourcePool(
        config.world_size,
        num_cpus_per_worker=cpus,
        num_gpus_per_worker=(1 / groups) if use_gpu else 0,
        nnodes=trainer.nnodes,
        max_colocate=groups,
        placement_timeout_s=config.trainer.placement_timeout_s,
    )
    started = []

    def start(worker_cls, name_prefix: str):
        group = RayWorkerGroup(
            pool,
            RayClassWithInitArgs(worker_cls, config, num_steps),
            name_prefix=name_prefix,
            collective_timeout_s=config.trainer.collective_timeout_s,
        )
        started.append(group)
        for line in group.init_model():
            logger.info("%s", line)
        return group

    try:
        actor_wg = start(worker_classes(config.actor_rollout_ref.actor.strategy)[0], "actor_rollout_ref")
        critic_wg = start(worker_classes(config.critic_strategy)[1], "critic") if groups == 2 else None
    except PlacementError as err:
        shutdown_groups(*started)
        raise PlacementError(
            f"trainer.nnodes={trainer.nnodes} x trainer.n_gpus_per_node={trainer.n_gpus_per_node} "
            f"({'GPU' if use_gpu else 'CPU'} ranks) does not fit the Ray cluster: {err} Add nodes "
            "(`ray start --address=<head>` on each, see docs/start/multinode.md) or lower trainer.nnodes / "
            "trainer.n_gpus_per_node."
        ) from None
    except BaseException:
        shutdown_groups(*started)
        raise
    return actor_wg, critic_wg


def cpus_per_worker(nnodes: int, workers_per_node: int) -> float:
    """Up to one CPU per worker, less where the nodes are small: the ``nnodes``-th largest node's CPUs are shared
    by the workers of one node (0.1 at least, so that a cluster of tiny nodes gets a placement error, not a hang)."""
    import ray

    sizes = sorted((node["Resources"].get("CPU", 0.0) for node in ray.nodes() if node.get("Alive")), reverse=True)
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


def checkpoint_after_death(config: PPOConfig, last_good: Path | None) -> Path | None:
    """The checkpoint a restart resumes from, verified: with ``trainer.resume_mode=auto`` chosen again as at
    start-up (the newest complete one), otherwise the last one this run saved or resumed from (None: start over).

    Raises:
        CheckpointError: the checkpoint is damaged.
    """
    from verl.utils.checkpoint import verify_checkpoint

    if config.trainer.resume_mode == "auto":
        return choose_checkpoint(config)
    if last_good is not None:
        verify_checkpoint(last_good, checkpoint_roles(config))
    return last_good


def describe_death(err, last_good: Path | None, restarts: int, max_restarts: int) -> str:
    """The stop message for a worker death: role, rank, node, Ray's reason, the last good checkpoint, what next."""
    where = (
        f"{last_good} (intact; run again with trainer.resume_mode=auto to resume from it)"
        if last_good is not None
        else "none (set trainer.save_freq to keep checkpoints)"
    )
    return (
        f"A worker died: role {err.role}, rank {err.rank}, node {err.node_id} ({err.node_ip}). "
        f"{err.reason.rstrip('.')}. "
        f"Last good checkpoint: {where}. Restarts used: {restarts} of trainer.max_restarts={max_restarts}"
        + ("; set trainer.max_restarts=N to rebuild the workers and resume automatically." if not max_restarts else ".")
    )


def prepare(config: DictConfig | PPOConfig):
    """Everything checked before Ray starts: (typed config, training data, step count, checkpoint to resume).

    Raises:
        ValueError: a bad config.
        CheckpointError: the checkpoint to resume from is damaged or not ours.
    """
    from verl.trainer.data_setup import build_data

    typed = config if isinstance(config, PPOConfig) else PPOConfig.from_omegaconf(config)
    check_model_path(typed)
    from verl.workers.rollout.vllm_engine import check_vllm_config

    check_vllm_config(typed)  # nothing unless rollout.name=vllm: installed, fits the model and the device
    check_resume_path(typed)
    data = build_data(typed, typed.world_size)
    num_steps = total_steps(typed, data.num_train_prompts)
    from verl.utils.checkpoint import remove_save_debris

    # before choosing: a save killed mid-swap leaves its newest checkpoint under a temporary name, put back here
    remove_save_debris(typed.trainer.default_local_dir)
    return typed, data, num_steps, choose_checkpoint(typed)


def run(config: DictConfig | PPOConfig) -> int:
    """Train with ``config`` (composed or already typed); returns the process exit code.

    Logging is the caller's to set up (:func:`cli` does, with :func:`setup_logging`).
    """
    try:
        typed, data, num_steps, resume_from = prepare(config)
    except ValueError as err:
        logger.error("Bad config: %s", err)
        return EXIT_BAD_CONFIG
    except CheckpointError as err:
        logger.error("Cannot resume: %s", err)
        return EXIT_BAD_CHECKPOINT
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.utils.tracking import Tracking

    log_dir = Path(typed.trainer.default_local_dir)
    tracker = Tracking(
        typed.trainer.logger,
        log_dir,
        typed.trainer.project_name,
        typed.trainer.experiment_name,
        config=typed.to_dict(),
    )
    from verl.single_controller import PlacementError, WorkerDiedError
    from verl.utils.checkpoint import remove_save_debris

    trainer = None
    max_restarts, restarts = typed.trainer.max_restarts, 0
    last_good = resume_from  # the newest checkpoint known intact: a restart, or the next run, resumes from it
    fresh_loader_state = data.train_loader.state_dict()  # a restart with no checkpoint starts the data over
    try:
        try:
            start_ray(typed)
        except ValueError as err:
            logger.error("Bad config: %s", err)
            return EXIT_BAD_CONFIG
        while True:
            trainer, groups = None, ()
            try:
                groups = build_worker_groups(typed, num_steps)
                trainer = RayPPOTrainer(
                    typed,
                    data.train_loader,
                    data.val_batches,
                    data.reward_fn,
                    *groups,
                    tracker,
                    num_steps,
                    resume_from=resume_from,
                    restarts=restarts,
                )
                trainer.fit()
                logger.info("training finished after %d steps: %s", trainer.global_step, trainer.final_summary())
                return EXIT_OK
            except WorkerDiedError as err:
                last_good = (trainer.last_checkpoint if trainer is not None else None) or last_good
                shutdown_groups(*groups)  # the living ranks may sit in a collective with the dead one
                if restarts >= max_restarts:
                    logger.error("%s", describe_death(err, last_good, restarts, max_restarts))
                    return EXIT_WORKER_DIED
                restarts += 1
                remove_save_debris(log_dir)  # before choosing again: a save the death interrupted
                try:
                    resume_from = checkpoint_after_death(typed, last_good)
                except CheckpointError as bad:
                    logger.error("Cannot resume after a worker died (%s): %s", err, bad)
                    return EXIT_BAD_CHECKPOINT
                if resume_from is None:
                    data.train_loader.load_state_dict(fresh_loader_state)
                logger.warning(
                    "%s Restart %d of trainer.max_restarts=%d: rebuilding the worker groups and resuming from %s.",
                    err,
                    restarts,
                    max_restarts,
                    resume_from or "the start (no checkpoint yet)",
                )
            except PlacementError as err:
                if restarts == 0:  # the request does not fit the cluster: the config's to change, or the cluster
                    logger.error("Cannot place the workers: %s", err)
                    return EXIT_BAD_CONFIG
                logger.error(
                    "The workers could not be rebuilt after a worker died: %s Last good checkpoint: %s.",
                    err,
                    last_good or "none",
                )
                return EXIT_WORKER_DIED
    except UpdateFailedError as err:
        where = trainer.last_checkpoint if trainer is not None else None
        logger.error(
            "Training stopped by the update-failure policy: %s Last good checkpoint: %s.",
            err,
            where if where is not None else "none (set trainer.save_freq to keep checkpoints)",
        )
        return EXIT_POLICY_STOP
    finally:
        if trainer is not None:
            trainer.log_update_summary()
        tracker.close()
        if typed.trainer.plot and (log_dir / "metrics.jsonl").exists():
            from verl.utils.plot import plot_training_curves

            try:
                path = plot_training_curves(log_dir / "metrics.jsonl", log_dir / "training_curves.png")
                logger.info("plot of reward, loss scale and failed updates: %s", path)
            except Exception as err:  # a plot must never hide the run's own outcome
                logger.warning("could not draw the training plot: %s", err)


def compose_from_command_line(argv: Sequence[str], config_dir: Path, config_name: str) -> DictConfig:
    """Hydra's composition of ``config_name`` with the ``key=value`` overrides of ``argv``.

    Raises:
        ValueError: an unknown option, a malformed override, or a key the config does not have.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    parser = argparse.ArgumentParser(prog="python -m verl.trainer.main_ppo", add_help=True)
    parser.add_argument("--config-name", "-cn", default=config_name, help="config file name (without .yaml)")
    parser.add_argument("--config-path", "-cp", default=str(config_dir), help="directory of the config files")
    parser.add_argument("overrides", nargs="*", help="key=value overrides in Hydra's syntax")
    args, unknown = parser.parse_known_args(list(argv))
    if unknown:
        raise ValueError(f"unknown command-line option(s) {unknown}; pass settings as key=value overrides.")
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(Path(args.config_path).resolve()), version_base=None):
            config = compose(config_name=args.config_name, overrides=args.overrides)
    except (HydraException, OmegaConfBaseException) as err:
        raise ValueError(_explain_override_error(args.overrides) or str(err).strip()) from None
    plain = OmegaConf.to_container(config, resolve=False)
    plain.pop("hydra", None)
    return OmegaConf.create(plain)


def _explain_override_error(overrides: Sequence[str]) -> str | None:
    """Our message for an override Hydra refused because the key is renamed or names a verl feature we lack."""
    from verl.workers.config.schema import known_key_message

    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        message = known_key_message(key)
        if message is not None:
            return message
    return None


def cli(argv: Sequence[str] | None = None, config_dir: Path = CONFIG_DIR, config_name: str = "ppo_trainer") -> None:
    """The command line: compose, run, exit with :func:`run`'s code (2 when the config does not compose)."""
    setup_logging()
    try:
        config = compose_from_command_line(sys.argv[1:] if argv is None else argv, config_dir, config_name)
    except ValueError as err:
        logger.error("Bad config: %s", err)
        sys.exit(EXIT_BAD_CONFIG)
    sys.exit(run(config))


if __name__ == "__main__":
    cli()
