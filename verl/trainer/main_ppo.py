"""Entry point: ``python -m verl.trainer.main_ppo [--config-name NAME] [key=value ...]``.

Composes the YAML config (``verl/trainer/config/ppo_trainer.yaml``; ``--config-name ppo_megatron_trainer`` for the
megatron defaults) with Hydra's override syntax, validates it into a typed
:class:`~verl.workers.config.PPOConfig` and checks what it points at (model, checkpoint) before Ray starts, then
starts Ray (a local instance, or ``ray_init.address``), the worker groups and the trainer, and runs it.

Exit codes: 0 done; 1 training stopped by the update-failure policy (the message says why and names the last good
checkpoint); 2 bad config (composition, a value, a key, a path); 3 a checkpoint to resume from is damaged or not
ours (the message names the file and what to do).
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

    model = config.actor_rollout_ref.model
    try:
        load_hf_config(model.path)
    except Exception as err:  # whatever transformers raises for a bad path, the user needs the key and the value
        raise ValueError(
            f"actor_rollout_ref.model.path={model.path!r} does not load as a Hugging Face model ("
            f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}). Point it at a model directory "
            f"with config.json, or use 'default' for the embedded tiny model."
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
    import ray

    if ray.is_initialized():
        return
    repo_root = str(Path(__file__).resolve().parents[2])
    pythonpath = os.pathsep.join(p for p in (repo_root, os.getcwd(), os.environ.get("PYTHONPATH", "")) if p)
    threads = max(1, (os.cpu_count() or 1) // config.world_size)
    ray.init(
        address=config.ray_init.address,
        num_cpus=config.ray_init.num_cpus,
        include_dashboard=False,
        log_to_driver=True,
        runtime_env={"env_vars": {"PYTHONPATH": pythonpath, "VERL_NUM_THREADS": str(threads)}},
    )


def worker_classes(strategy: str):
    """(actor-rollout-ref worker class, critic worker class) of a backend: the one place a backend is chosen."""
    if strategy == "megatron":
        from verl.workers.megatron_workers import MegatronActorRolloutRefWorker, MegatronCriticWorker

        return MegatronActorRolloutRefWorker, MegatronCriticWorker
    from verl.workers.dp_workers import DPActorRolloutRefWorker, DPCriticWorker

    return DPActorRolloutRefWorker, DPCriticWorker


def build_worker_groups(config: PPOConfig, num_steps: int):
    """The actor (+rollout, +ref) worker group and, when a value model is needed, the critic group."""
    from verl.single_controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    use_gpu = config.trainer.device == "cuda" or (config.trainer.device == "auto" and _cuda_visible())
    num_workers = config.world_size
    groups = 2 if config.needs_critic else 1
    cpus = max(0.1, min(1.0, (os.cpu_count() or 1) / (num_workers * groups)))
    pool_kwargs = {"num_cpus_per_worker": cpus, "num_gpus_per_worker": (1 / groups) if use_gpu else 0}
    actor_cls, _ = worker_classes(config.actor_rollout_ref.actor.strategy)
    actor_wg = RayWorkerGroup(
        RayResourcePool(num_workers, **pool_kwargs),
        RayClassWithInitArgs(actor_cls, config, num_steps),
        name_prefix="actor_rollout_ref",
    )
    for line in actor_wg.init_model():
        logger.info("%s", line)
    critic_wg = None
    if groups == 2:
        _, critic_cls = worker_classes(config.critic_strategy)
        critic_wg = RayWorkerGroup(
            RayResourcePool(num_workers, **pool_kwargs),
            RayClassWithInitArgs(critic_cls, config, num_steps),
            name_prefix="critic",
        )
        for line in critic_wg.init_model():
            logger.info("%s", line)
    return actor_wg, critic_wg


def _cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def prepare(config: DictConfig | PPOConfig):
    """Everything checked before Ray starts: (typed config, training data, step count, checkpoint to resume).

    Raises:
        ValueError: a bad config.
        CheckpointError: the checkpoint to resume from is damaged or not ours.
    """
    from verl.trainer.data_setup import build_data

    typed = config if isinstance(config, PPOConfig) else PPOConfig.from_omegaconf(config)
    check_model_path(typed)
    check_resume_path(typed)
    data = build_data(typed, typed.world_size)
    return typed, data, total_steps(typed, data.num_train_prompts), choose_checkpoint(typed)


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
    from verl.utils.checkpoint import remove_save_debris
    from verl.utils.tracking import Tracking

    log_dir = Path(typed.trainer.default_local_dir)
    remove_save_debris(log_dir)  # temporary directories of saves that a kill interrupted
    tracker = Tracking(
        typed.trainer.logger,
        log_dir,
        typed.trainer.project_name,
        typed.trainer.experiment_name,
        config=typed.to_dict(),
    )
    trainer = None
    try:
        start_ray(typed)
        actor_wg, critic_wg = build_worker_groups(typed, num_steps)
        trainer = RayPPOTrainer(
            typed,
            data.train_loader,
            data.val_batches,
            data.reward_fn,
            actor_wg,
            critic_wg,
            tracker,
            num_steps,
            resume_from=resume_from,
        )
        trainer.fit()
        logger.info("training finished after %d steps: %s", trainer.global_step, trainer.final_summary())
        return EXIT_OK
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
        raise ValueError(str(err).strip()) from None
    plain = OmegaConf.to_container(config, resolve=False)
    plain.pop("hydra", None)
    return OmegaConf.create(plain)


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
