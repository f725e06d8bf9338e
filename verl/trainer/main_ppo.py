"""Entry point: ``python -m verl.trainer.main_ppo [key=value ...]``.

Composes the Hydra config (``verl/trainer/config/ppo_trainer.yaml``; ``--config-name ppo_megatron_trainer`` for
the megatron defaults), validates it before Ray starts, starts Ray (a local instance, or ``ray_init.address``),
the worker groups and the trainer, and runs it. Exit codes: 0 done, 1 training stopped by the update-failure
policy (the message says why and names the last good checkpoint), 2 bad config.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from verl.trainer.config_validation import needs_critic, validate_config
from verl.workers.update_outcome import UpdateFailedError

logger = logging.getLogger("verl.trainer")
CONFIG_DIR = Path(__file__).parent / "config"


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    for noisy in ("urllib3", "filelock", "matplotlib", "ray"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def default_config() -> DictConfig:
    """The defaults of ppo_trainer.yaml (without Hydra's own section), for type checks."""
    config = OmegaConf.load(CONFIG_DIR / "ppo_trainer.yaml")
    config.pop("hydra", None)
    return config


def total_steps(config: DictConfig, num_train_prompts: int) -> int:
    steps_per_epoch = num_train_prompts // int(config.data.train_batch_size)
    if steps_per_epoch < 1:
        raise ValueError(
            f"data.train_batch_size={config.data.train_batch_size} is larger than the {num_train_prompts} training "
            f"prompts; lower it or add data."
        )
    by_epochs = steps_per_epoch * int(config.trainer.total_epochs)
    if config.trainer.total_training_steps is None:
        return by_epochs
    return int(config.trainer.total_training_steps)


def world_size(config: DictConfig) -> int:
    return int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)


def start_ray(config: DictConfig) -> None:
    import ray

    if ray.is_initialized():
        return
    repo_root = str(Path(__file__).resolve().parents[2])
    pythonpath = os.pathsep.join(p for p in (repo_root, os.getcwd(), os.environ.get("PYTHONPATH", "")) if p)
    threads = max(1, (os.cpu_count() or 1) // max(1, world_size(config)))
    ray.init(
        address=config.ray_init.address,
        num_cpus=config.ray_init.num_cpus,
        include_dashboard=False,
        log_to_driver=True,
        runtime_env={"env_vars": {"PYTHONPATH": pythonpath, "VERL_NUM_THREADS": str(threads)}},
    )


def build_worker_groups(config: DictConfig, num_steps: int):
    """The actor (+rollout, +ref) worker group and, when a value model is needed, the critic group."""
    from verl.single_controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    use_gpu = config.trainer.device == "cuda" or (config.trainer.device == "auto" and _cuda_visible())
    num_workers = world_size(config)
    groups = 2 if needs_critic(config) else 1
    cpus = max(0.1, min(1.0, (os.cpu_count() or 1) / (num_workers * groups)))
    pool_kwargs = {"num_cpus_per_worker": cpus, "num_gpus_per_worker": (1 / groups) if use_gpu else 0}
    if config.actor_rollout_ref.actor.strategy == "megatron":
        from verl.workers.megatron_workers import MegatronActorRolloutRefWorker as ActorWorker
    else:
        from verl.workers.dp_workers import DPActorRolloutRefWorker as ActorWorker
    actor_wg = RayWorkerGroup(
        RayResourcePool(num_workers, **pool_kwargs),
        RayClassWithInitArgs(ActorWorker, config, num_steps),
        name_prefix="actor_rollout_ref",
    )
    for line in actor_wg.init_model():
        logger.info("%s", line)
    critic_wg = None
    if groups == 2:
        from verl.workers.critic_workers import CriticWorker

        critic_wg = RayWorkerGroup(
            RayResourcePool(num_workers, **pool_kwargs),
            RayClassWithInitArgs(CriticWorker, config, num_steps),
            name_prefix="critic",
        )
        for line in critic_wg.init_model():
            logger.info("%s", line)
    return actor_wg, critic_wg


def _cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def run(config: DictConfig) -> int:
    """Train with ``config``; returns the process exit code."""
    global _run_entered
    _run_entered = True
    setup_logging()
    try:
        validate_config(config, default_config())
        from verl.trainer.data_setup import build_data

        data = build_data(config, world_size(config))
        num_steps = total_steps(config, data.num_train_prompts)
    except ValueError as err:
        logger.error("Bad config: %s", err)
        return 2
    from verl.utils.tracking import Tracking

    log_dir = Path(config.trainer.default_local_dir)
    tracker = Tracking(
        config.trainer.logger,
        log_dir,
        config.trainer.project_name,
        config.trainer.experiment_name,
        config=OmegaConf.to_container(config, resolve=True),
    )
    start_ray(config)
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    trainer = None
    try:
        actor_wg, critic_wg = build_worker_groups(config, num_steps)
        trainer = RayPPOTrainer(
            config, data.train_loader, data.val_batches, data.reward_fn, actor_wg, critic_wg, tracker, num_steps
        )
        final = trainer.fit()
        logger.info("training finished after %d steps: %s", trainer.global_step, _summary(final))
        return 0
    except UpdateFailedError as err:
        where = trainer.last_checkpoint if trainer is not None else None
        logger.error(
            "Training stopped by the update-failure policy: %s Last good checkpoint: %s.",
            err,
            where if where is not None else "none (set trainer.save_freq to keep checkpoints)",
        )
        return 1
    finally:
        tracker.close()
        if config.trainer.plot and (log_dir / "metrics.jsonl").exists():
            from verl.utils.plot import plot_training_curves

            try:
                path = plot_training_curves(log_dir / "metrics.jsonl", log_dir / "training_curves.png")
                logger.info("plot of reward, loss scale and failed updates: %s", path)
            except Exception as err:  # a plot must never hide the run's own outcome
                logger.warning("could not draw the training plot: %s", err)


def _summary(metrics: dict[str, float]) -> str:
    keys = ("critic/score/mean", "val/score/mean", "actor/update_failures_total", "actor/loss_scale")
    return ", ".join(f"{k}={metrics[k]:.4g}" for k in keys if k in metrics)


@hydra.main(config_path="config", config_name="ppo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    sys.exit(run(config))


_run_entered = False  # set by run(): from then on, exit codes are run()'s own


def cli(hydra_main: Callable[[], None] = main) -> None:
    """Call a ``@hydra.main`` entry point, mapping Hydra's own config errors to exit code 2.

    Hydra reports a config it cannot compose (unknown key, bad override syntax) and exits with 1, the code this
    entry point keeps for a run stopped by the update-failure policy; a failure before :func:`run` was entered is
    always a config error.
    """
    try:
        hydra_main()
    except SystemExit as exit_:
        if not _run_entered and exit_.code == 1:
            raise SystemExit(2) from None
        raise


if __name__ == "__main__":
    cli()
