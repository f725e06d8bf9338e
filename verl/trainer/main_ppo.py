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

How :func:`run` reads: :func:`prepare` checks everything before Ray starts; :func:`_train` starts Ray and makes
attempts, each one :func:`_attempt` (build the worker groups, build the trainer, fit); after a worker died,
:func:`_restart_after_death` is the restart rule (count the restart, choose the checkpoint, or give up), and
:func:`_teardown` runs whatever the outcome (update summary, tracker, plot).

A rank that hangs in a collective is reported like a dead one (``CollectiveTimeoutError``, a ``WorkerDiedError``:
the rank that never joined, and its node) once the others' ``trainer.collective_timeout_s`` ran out, and
``trainer.max_restarts`` covers it the same way.

SIGTERM or SIGINT (Ctrl-C) to this process or its whole process group (:mod:`verl.trainer.preemption`: Ray's
processes ignore it, and output into a pipe whose reader died is dropped, :mod:`verl.trainer.console`): the current
step finishes, a checkpoint is saved, the workers are stopped, and the run exits with code 5; the same command
resumes exactly. A second signal stops at once, without saving (code 6).

Exit codes: 0 done; 1 training stopped by the update-failure policy (the message says why and names the last good
checkpoint); 2 bad config (composition, a value, a key, a path, a checkpoint this run cannot continue:
:mod:`verl.trainer.resume_check`, or more nodes/GPUs than the Ray cluster has); 3 a
checkpoint to resume from is damaged or not ours (the message names the file and what to do); 4 a worker died (or
hung in a collective) and no restart was left (the message names the role, rank and node, and the last good
checkpoint, which is intact: run again to resume from it); 5 stopped by SIGTERM/SIGINT after saving (run the same
command to resume); 6 stopped at once by a second signal, without saving; 7 a checkpoint could not be written
(disk full, read-only directory: the message names the file and the OS error; the previous complete checkpoint is
intact and is the one a restart takes); 8 anything else raised, its traceback logged: for a reward function that
raised, the message names the step, the sample and its row in the data file, and the last complete checkpoint.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from verl.trainer.console import setup_logging
from verl.trainer.ppo.reward_errors import RewardFunctionError
from verl.trainer.preemption import Preempted, StopAtOnce, StopSignals
from verl.trainer.ray_setup import (  # noqa: F401  (main_ppo's public names since before the split)
    ask_for_token_auth,
    build_worker_groups,
    cpus_per_worker,
    shutdown_groups,
    start_ray,
    stop_ray,
    worker_classes,
    write_timeline,
)
from verl.trainer.smoke_test import smoke_test_overrides
from verl.trainer.start_up_checks import (
    check_context_length,
    check_logger_packages,
    check_model_path_exists,
    missing_model_message,
)
from verl.utils.checkpoint import CheckpointError, CheckpointWriteError
from verl.workers.config import ComposedConfig, PPOConfig, compose_with_defaults
from verl.workers.config.out_of_scope import command_line_refusals
from verl.workers.config.plan import RunPlan, build_run_plan, resolve_device
from verl.workers.config.schema import did_you_mean, nearest_keys
from verl.workers.update_outcome import UpdateFailedError

logger = logging.getLogger("verl.trainer")
CONFIG_DIR = Path(__file__).parent / "config"

EXIT_OK, EXIT_POLICY_STOP, EXIT_BAD_CONFIG, EXIT_BAD_CHECKPOINT = 0, 1, 2, 3
EXIT_WORKER_DIED = 4
EXIT_PREEMPTED = 5  # SIGTERM / SIGINT: the step finished and was saved; the same command resumes
EXIT_STOPPED_AT_ONCE = 6  # a second signal: stopped without saving
EXIT_CHECKPOINT_WRITE_FAILED = 7  # disk full, read-only directory, ...: the previous checkpoint is intact
# anything else raised (a bug, or an error in user code: a reward function, a handler), its traceback logged; not
# Python's 1, which would read as the update-failure policy's stop
EXIT_UNEXPECTED_ERROR = 8


def check_model_path(config: PPOConfig) -> None:
    """The model (and tokenizer) directory must exist and load as a Hugging Face config, with its ``override_config``
    applied (an attribute the config lacks is logged); the prompt and response lengths must fit its context; a
    megatron role's tensor-parallel size and pipeline layout must fit that model. Checked before Ray starts."""
    from verl.models.loading import apply_config_overrides, load_hf_config

    arr = config.actor_rollout_ref
    # (the path's key, the model section, the role's section, the key of its megatron section)
    models = [("actor_rollout_ref.model.path", arr.model, arr.actor, "actor_rollout_ref.actor.megatron")]
    if config.needs_critic:
        models.append(("critic.model.path", config.critic.model, config.critic, "critic.megatron"))
    for key, model, role, megatron_key in models:
        path = model.path
        missing = missing_model_message(key, path)
        if missing is not None:  # our words, not the Hub's "Repo id must be in the form ..."
            raise ValueError(missing)
        try:
            hf_config = load_hf_config(path, model.trust_remote_code)
        except Exception as err:  # whatever transformers raises for a bad path, the user needs the key and the value
            first_line = str(err).splitlines()[0] if str(err) else ""
            raise ValueError(
                f"{key}={path!r} does not load as a Hugging Face model ({type(err).__name__}: {first_line}). Point "
                f"it at a model directory with config.json, or use 'default' for the embedded tiny model."
            ) from None
        apply_config_overrides(hf_config, model.override_config, key.replace(".path", ".override_config"))
        check_context_length(config, key, hf_config)
        strategy = config.critic_strategy if role is config.critic else role.strategy
        if strategy == "megatron":
            role.megatron.check_fits(hf_config, megatron_key)


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
    """The stop message for a worker death (or a rank hung in a collective): role, rank, node, the reason, the last
    good checkpoint, what next."""
    where = (
        f"{last_good} (intact; run again with trainer.resume_mode=auto to resume from it)"
        if last_good is not None
        else "none (set trainer.save_freq to keep checkpoints)"
    )
    event = getattr(err, "event", "died")
    slow = (
        " A rank that is only slow needs a longer trainer.collective_timeout_s (actor_rollout_ref.nccl_timeout for "
        "the actor group)."
        if event != "died"
        else ""
    )
    return (
        f"A worker {event}: role {err.role}, rank {err.rank}, node {err.node_id} ({err.node_ip}). "
        f"{err.reason.rstrip('.')}.{slow} "
        f"Last good checkpoint: {where}. Restarts used: {restarts} of trainer.max_restarts={max_restarts}"
        + ("; set trainer.max_restarts=N to rebuild the workers and resume automatically." if not max_restarts else ".")
    )


def _validate(config: ComposedConfig | DictConfig | PPOConfig) -> PPOConfig:
    """The typed config: as given, or validated (with the file's defaults, when composed with them).

    Raises:
        ValueError: a bad config.
    """
    if isinstance(config, PPOConfig):
        return config
    if isinstance(config, ComposedConfig):
        return config.validate()
    return PPOConfig.from_omegaconf(config)


def prepare(config: ComposedConfig | DictConfig | PPOConfig):
    """Everything checked before Ray starts: (typed config, training data, run plan, checkpoint to resume).

    The run plan (:func:`~verl.workers.config.plan.build_run_plan`) has the run's step count; a device of
    ``trainer.device=auto`` is still ``"auto"`` in it (resolved once Ray starts, :func:`_resolve_plan`).

    A checkpoint to resume from is checked against this run (:func:`~verl.trainer.resume_check.check_resume`):
    logged, each changed setting warned about, refused when nothing is left to train or the model or the algorithm
    differ.

    Raises:
        ValueError: a bad config, or a checkpoint this run cannot continue.
        CheckpointError: the checkpoint to resume from is damaged or not ours.
    """
    from verl.trainer.data_setup import build_data

    check_model_path_exists(config)  # first: every other message is moot until the model is there
    typed = _validate(config)
    check_logger_packages(typed)
    check_model_path(typed)
    from verl.workers.rollout.vllm_engine import check_vllm_config

    check_vllm_config(typed)  # nothing unless rollout.name=vllm: installed, fits the model and the device
    check_resume_path(typed)
    data = build_data(typed, typed.world_size)
    plan = build_run_plan(typed, num_train_prompts=data.num_train_prompts)
    from verl.utils.checkpoint import remove_save_debris

    # before choosing: a save killed mid-swap leaves its newest checkpoint under a temporary name, put back here
    remove_save_debris(typed.trainer.default_local_dir)
    resume_from = choose_checkpoint(typed)
    if resume_from is not None:  # said, compared with this run's config, refused when it cannot be continued
        from verl.trainer.resume_check import check_resume

        check_resume(typed, plan.total_training_steps, resume_from)
    return typed, data, plan, resume_from


@dataclass
class _Attempts:
    """What one training attempt hands to the next, and to the teardown.

    Attributes:
        resume_from: the checkpoint the next attempt resumes from (None: from the start).
        last_good: the newest checkpoint known intact: a restart, or the next run, resumes from it.
        restarts: how many times the worker groups were rebuilt after a worker died.
        trainer: the latest attempt's trainer (None until it is built): its last checkpoint and update summary.
        stop_signals: the SIGTERM / SIGINT handlers, installed while Ray runs (None: not installed).
    """

    resume_from: Path | None
    last_good: Path | None
    restarts: int = 0
    trainer: Any = None
    stop_signals: StopSignals | None = None


def run(config: ComposedConfig | DictConfig | PPOConfig) -> int:
    """Train with ``config`` (composed, with or without its file's defaults, or already typed); the exit code.

    A :class:`~verl.workers.config.ComposedConfig` (what :func:`cli` composes) is validated against its file's
    defaults, so a setting that nothing would read is refused; a bare ``DictConfig`` is validated without that
    comparison. Logging is the caller's to set up (:func:`cli` does, with :func:`setup_logging`).
    """
    try:
        typed, data, plan, resume_from = prepare(config)
    except ValueError as err:
        logger.error("Bad config: %s", err)
        return EXIT_BAD_CONFIG
    except CheckpointError as err:
        logger.error("Cannot resume: %s", err)
        return EXIT_BAD_CHECKPOINT
    from verl.utils.tracking import Tracking

    tracker = Tracking(
        typed.trainer.logger,
        Path(typed.trainer.default_local_dir),
        typed.trainer.project_name,
        typed.trainer.experiment_name,
        config=typed.to_dict(),
    )
    attempts = _Attempts(resume_from=resume_from, last_good=resume_from, stop_signals=StopSignals())
    try:
        return _train(typed, data, plan, tracker, attempts)
    finally:
        try:  # still under the stop handlers: a second signal here cuts the teardown short, not the exit code
            _teardown(typed, tracker, attempts.trainer)
        except StopAtOnce:
            logger.warning(
                "A second stop signal cut the teardown short: the tracker may not have flushed its last "
                "lines, and the training plot is not drawn."
            )
        finally:
            attempts.stop_signals.restore()


def _train(typed: PPOConfig, data, plan: RunPlan, tracker, attempts: _Attempts) -> int:
    """Start Ray, resolve and log the run plan, then attempt until one finishes or the restart rule gives up; returns
    the exit code."""
    signals = attempts.stop_signals
    started_ray = False
    try:
        started_ray = start_ray(typed)
        plan = _resolve_plan(typed, plan)
    except ValueError as err:
        logger.error("Bad config: %s", err)
        return EXIT_BAD_CONFIG
    if signals is not None:
        signals.install()  # after ray.init, which installs its own SIGTERM handler in the driver
    try:
        return _attempt_until_done(typed, data, plan, tracker, attempts)
    except KeyboardInterrupt:  # in an attempt or in the restart rule between two
        if signals is None or signals.stopped_at_once is None:
            raise
        return _stopped_at_once(signals.stopped_at_once, typed, attempts)
    finally:
        write_timeline(typed)  # verl's ray_kwargs.timeline_json_file, whatever the outcome
        if started_ray:
            stop_ray()


def _resolve_plan(typed: PPOConfig, plan: RunPlan) -> RunPlan:
    """The run plan with its device decided on the cluster Ray runs (:func:`~verl.workers.config.plan.resolve_device`:
    ``auto`` is the GPUs when there is one for every rank, the CPU when there is none), the one line that says
    where the run trains, and the plan logged as one block: the plan the workers get and each checkpoint saves.

    Raises:
        ValueError: ``cuda`` (asked for, or ``auto`` on a cluster with GPUs) without a GPU for every rank; a setting
            the resolved device cannot run (megatron-core's optimizer without CUDA).
    """
    from verl.trainer.ray_setup import cluster_gpus
    from verl.workers.config.colocation import colocation_notes
    from verl.workers.config.plan import device_summary

    gpus = cluster_gpus()
    plan = resolve_device(plan, typed, gpus)
    logger.info("%s", device_summary(plan, typed, gpus))
    logger.info("run plan (derived from the config; saved as run_plan.json in each checkpoint):\n%s", plan.describe())
    for note in colocation_notes(typed):  # why a role has a worker process of its own
        logger.info("worker processes: %s", note)
    return plan


def _attempt_until_done(typed: PPOConfig, data, plan: RunPlan, tracker, attempts: _Attempts) -> int:
    """Attempt until one finishes or the restart rule gives up; returns the exit code.

    Raises:
        KeyboardInterrupt: a second stop signal (or a Ctrl-C before the handlers were installed).
    """
    from verl.single_controller import PlacementError, WorkerDiedError

    fresh_loader_state = data.train_loader.state_dict()  # a restart with no checkpoint starts the data over
    while True:
        try:
            _attempt(typed, data, plan, tracker, attempts)
            return EXIT_OK
        except WorkerDiedError as err:
            code = _restart_after_death(err, typed, data.train_loader, fresh_loader_state, attempts)
            if code is not None:
                return code
        except PlacementError as err:
            return _placement_failed(err, attempts)
        except UpdateFailedError as err:
            return _policy_stopped(err, attempts.trainer)
        except Preempted as stop:
            return _preempted(stop, typed)
        except CheckpointWriteError as err:
            return _save_failed(err, typed, attempts)
        except CheckpointError as err:  # a worker found the checkpoint damaged while loading it
            logger.error("Cannot resume: %s", err)
            return EXIT_BAD_CHECKPOINT
        except RewardFunctionError as err:
            return _reward_function_failed(err, typed, attempts)


def _attempt(typed: PPOConfig, data, plan: RunPlan, tracker, attempts: _Attempts) -> None:
    """One attempt: build the worker groups and a trainer on them (with the run ``plan``), and fit from
    ``attempts.resume_from``.

    Raises:
        WorkerDiedError: a worker died (or hung in a collective); the groups are shut down and ``attempts.last_good``
            is up to date.
        PlacementError: the groups do not fit the cluster.
        UpdateFailedError: the update-failure policy stopped training.
        Preempted: a stop signal arrived and was answered; the groups are shut down.
        KeyboardInterrupt: a second stop signal (or a Ctrl-C before the handlers were installed).
        CheckpointWriteError: a checkpoint could not be written; the groups are shut down.
        CheckpointError: a worker found the checkpoint to resume from damaged; the groups are shut down.
    """
    from verl.single_controller import WorkerDiedError
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, TrainerRun

    attempts.trainer, groups = None, ()
    signals = attempts.stop_signals
    try:
        if signals is not None and signals.requested is not None:  # the signal came while Ray started
            from verl.utils.checkpoint import step_of_checkpoint

            last = attempts.last_good
            raise Preempted(signals.requested, step_of_checkpoint(last) if last is not None else 0, last)
        num_steps = plan.total_training_steps
        groups = build_worker_groups(typed, plan)
        run = TrainerRun(num_steps, attempts.resume_from, attempts.restarts, signals, plan=plan)
        attempts.trainer = RayPPOTrainer(typed, groups, data, tracker, run)
        attempts.trainer.fit()
    except WorkerDiedError:
        trainer = attempts.trainer
        attempts.last_good = (trainer.last_checkpoint if trainer is not None else None) or attempts.last_good
        shutdown_groups(*groups)  # the living ranks may sit in a collective with the dead one
        raise
    except (Preempted, KeyboardInterrupt, CheckpointWriteError, CheckpointError, RewardFunctionError):
        shutdown_groups(*groups)  # stopped cleanly: no rank is left waiting in a collective or writing a file
        raise
    steps = attempts.trainer.global_step
    logger.info(
        "training finished after %d step%s: %s", steps, "" if steps == 1 else "s", attempts.trainer.final_summary()
    )


def _restart_after_death(err, typed: PPOConfig, train_loader, fresh_loader_state, attempts: _Attempts) -> int | None:
    """The restart rule after a worker died: count the restart and choose where to resume (None: attempt again),
    or give up with the exit code (no restart left, or the checkpoint to resume from is damaged)."""
    from verl.utils.checkpoint import remove_save_debris

    max_restarts = typed.trainer.max_restarts
    stopping = attempts.stop_signals is not None and attempts.stop_signals.requested is not None
    if attempts.restarts >= max_restarts or stopping:  # asked to stop: no rebuilding
        logger.error("%s", describe_death(err, attempts.last_good, attempts.restarts, max_restarts))
        return EXIT_WORKER_DIED
    attempts.restarts += 1
    remove_save_debris(typed.trainer.default_local_dir)  # before choosing again: a save the death interrupted
    try:
        attempts.resume_from = checkpoint_after_death(typed, attempts.last_good)
    except CheckpointError as bad:
        logger.error("Cannot resume after a worker died (%s): %s", err, bad)
        return EXIT_BAD_CHECKPOINT
    if attempts.resume_from is None:
        train_loader.load_state_dict(fresh_loader_state)
    logger.warning(
        "%s Restart %d of trainer.max_restarts=%d: rebuilding the worker groups and resuming from %s.",
        err,
        attempts.restarts,
        max_restarts,
        attempts.resume_from or "the start (no checkpoint yet)",
    )
    return None


def _placement_failed(err, attempts: _Attempts) -> int:
    """The exit code when the groups do not fit: the config's (at start-up), or a lost worker's (on a rebuild)."""
    if attempts.restarts == 0:  # the request does not fit the cluster: the config's to change, or the cluster
        logger.error("Cannot place the workers: %s", err)
        return EXIT_BAD_CONFIG
    logger.error(
        "The workers could not be rebuilt after a worker died: %s Last good checkpoint: %s.",
        err,
        attempts.last_good or "none",
    )
    return EXIT_WORKER_DIED


def _policy_stopped(err: UpdateFailedError, trainer) -> int:
    """The exit code when the update-failure policy stopped training, with the last good checkpoint named."""
    where = trainer.last_checkpoint if trainer is not None else None
    logger.error(
        "Training stopped by the update-failure policy: %s Last good checkpoint: %s.",
        _sentence(str(err)),  # a custom handler's message may end without a full stop
        where if where is not None else "none (set trainer.save_freq to keep checkpoints)",
    )
    return EXIT_POLICY_STOP


def _sentence(text: str) -> str:
    """``text`` as a sentence that another can follow: stripped, with a full stop unless it ends in . ! or ?."""
    text = text.strip()
    return text if text.endswith((".", "!", "?")) else f"{text}."


def _preempted(stop: Preempted, typed: PPOConfig) -> int:
    """The exit code after a stop signal was answered, with where the next run resumes."""
    if stop.checkpoint is not None:
        where = f"checkpoint {stop.checkpoint}; {_how_to_resume(typed, stop.checkpoint)}"
    else:
        where = "no checkpoint (no step had finished); the same command starts from the beginning"
    logger.warning("Stopped on %s after step %d, the workers shut down: %s.", stop.signal_name, stop.step, where)
    return EXIT_PREEMPTED


def _stopped_at_once(signal_name: str, typed: PPOConfig, attempts: _Attempts) -> int:
    """The exit code after a second stop signal: nothing saved; the checkpoint a restart takes is named."""
    latest = _restart_point(typed, attempts)
    logger.error(
        "Stopped at once on a second %s, without saving. Last complete checkpoint: %s.",
        signal_name,
        f"{latest}; {_how_to_resume(typed, latest)}" if latest is not None else "none",
    )
    return EXIT_STOPPED_AT_ONCE


def _save_failed(err: CheckpointWriteError, typed: PPOConfig, attempts: _Attempts) -> int:
    """The exit code when a checkpoint could not be written: the file, the OS error, the checkpoint that stays."""
    latest = _restart_point(typed, attempts)
    logger.error(
        "Saving %s failed: cannot write %s: %s. Nothing of that save was kept; the last complete checkpoint is %s. "
        "Free space in %s, or make it writable (trainer.default_local_dir), then run again.",
        f"checkpoint {err.checkpoint}" if err.checkpoint is not None else "a checkpoint",
        err.path,
        err.reason,
        f"{latest} (intact; {_how_to_resume(typed, latest)})" if latest is not None else "none",
        typed.trainer.default_local_dir,
    )
    return EXIT_CHECKPOINT_WRITE_FAILED


def _reward_function_failed(err: RewardFunctionError, typed: PPOConfig, attempts: _Attempts) -> int:
    """Exit code 8 when the reward function raised: the step, the sample and its data row, the last complete
    checkpoint and how to resume from it once the function is fixed, then the function's own traceback."""
    latest = _restart_point(typed, attempts)
    where = (
        f"{latest}; once the reward function is fixed, {_how_to_resume(typed, latest)}"
        if latest is not None
        else "none (set trainer.save_freq to keep checkpoints); the same command starts from the beginning"
    )
    cause = err
    while cause.__cause__ is not None:  # the function's own exception (under the reward manager's)
        cause = cause.__cause__
    logger.error(
        "Stopped by an error in the reward function (exit code %d). %s Last complete checkpoint: %s. Its traceback:",
        EXIT_UNEXPECTED_ERROR,
        _sentence(str(err)),
        where,
        exc_info=(type(cause), cause, cause.__traceback__),
    )
    return EXIT_UNEXPECTED_ERROR


def _restart_point(typed: PPOConfig, attempts: _Attempts) -> Path | None:
    """The checkpoint the next run would resume from: the newest complete one under ``resume_mode=auto``,
    otherwise the run's own last good one."""
    from verl.utils.checkpoint import find_latest_checkpoint

    if typed.trainer.resume_mode == "auto":
        return find_latest_checkpoint(typed.trainer.default_local_dir, roles=checkpoint_roles(typed))
    trainer = attempts.trainer
    return (trainer.last_checkpoint if trainer is not None else None) or attempts.last_good


def _how_to_resume(typed: PPOConfig, checkpoint: Path) -> str:
    """How to resume from ``checkpoint``: under ``auto`` the same command takes it (the newest complete one in
    ``default_local_dir``); otherwise ``auto`` might take a newer one of another run there, so it is named."""
    if typed.trainer.resume_mode == "auto":
        return "run the same command to resume from it (trainer.resume_mode=auto)"
    return f"resume from it with trainer.resume_mode=resume_path trainer.resume_from_path={checkpoint}"


def _teardown(typed: PPOConfig, tracker, trainer) -> None:
    """Whatever the outcome: the latest trainer's update summary, the tracker closed, the training plot drawn."""
    if trainer is not None:
        trainer.log_update_summary()
    tracker.close()
    log_dir = Path(typed.trainer.default_local_dir)
    if typed.trainer.plot and (log_dir / "metrics.jsonl").exists():
        from verl.utils.plot import plot_training_curves

        try:
            path = plot_training_curves(log_dir / "metrics.jsonl", log_dir / "training_curves.png")
            logger.info("plot of reward, loss scale and failed updates: %s", path)
        except Exception as err:  # a plot must never hide the run's own outcome
            logger.warning("could not draw the training plot: %s", err)


def parse_command_line(argv: Sequence[str], config_dir: Path, config_name: str) -> ComposedConfig:
    """The command line's config: ``--config-path``/``--config-name`` (defaulting to ``config_dir`` and
    ``config_name``) composed with the ``key=value`` overrides of ``argv``, and that file's defaults.

    A relative ``--config-path`` is resolved as verl's Hydra entry point resolves it: against the directory of this
    file (``verl/trainer/``), not the working directory, so verl's ``--config-path=config
    --config-name=ppo_megatron_trainer`` finds ``verl/trainer/config/ppo_megatron_trainer.yaml`` from anywhere.

    Raises:
        ValueError: an unknown option, a malformed override, or a key the config does not have.
    """
    parser = argparse.ArgumentParser(prog="python -m verl.trainer.main_ppo", add_help=True)
    parser.add_argument("--config-name", "-cn", default=config_name, help="config file name (without .yaml)")
    parser.add_argument("--config-path", "-cp", default=str(config_dir), help="directory of the config files")
    parser.add_argument(
        "--smoke-test", action="store_true", help="shrink the run to one step on CPU (verl.trainer.smoke_test)"
    )
    parser.add_argument("overrides", nargs="*", help="key=value overrides in Hydra's syntax")
    # intermixed: an option after the overrides (a script's "$@" at the end) still parses, the overrides after it too
    args, unknown = parser.parse_known_intermixed_args(list(argv))
    if unknown:
        raise ValueError(f"unknown command-line option(s) {unknown}; pass settings as key=value overrides.")
    if args.smoke_test:
        args.overrides = list(smoke_test_overrides(args.overrides))
    refusals = command_line_refusals(args.overrides)
    if refusals:
        if len(refusals) == 1:
            raise ValueError(refusals[0])
        raise ValueError(
            f"{len(refusals)} settings ask for features out of scope here:\n  - " + "\n  - ".join(refusals)
        )
    try:
        return compose_with_defaults(args.overrides, args.config_name, resolve_config_path(args.config_path))
    except ValueError as err:
        config_path = resolve_config_path(args.config_path)
        explained = _explain_override_error(args.overrides, str(err), args.config_name, config_path)
        raise ValueError(explained or str(err)) from None


def resolve_config_path(config_path: str | Path) -> Path:
    """``--config-path`` as Hydra resolves it for verl's ``main_ppo``: absolute as given, relative against
    ``verl/trainer/`` (the directory of the file that declares the entry point)."""
    path = Path(config_path).expanduser()
    return path if path.is_absolute() else (Path(__file__).parent / path).resolve()


def compose_from_command_line(argv: Sequence[str], config_dir: Path, config_name: str) -> DictConfig:
    """The composed config of :func:`parse_command_line` alone (without the file's defaults).

    Raises:
        ValueError: an unknown option, a malformed override, or a key the config does not have.
    """
    return parse_command_line(argv, config_dir, config_name).config


def _explain_override_error(
    overrides: Sequence[str], hydra_message: str, config_name: str, config_dir: Path
) -> str | None:
    """Our message for the override Hydra refused (the one its message quotes): a renamed key's new name, a verl
    feature we lack, or, for a key the config does not have, the nearest keys it does have (Hydra's own advice,
    "use +key=value", is wrong here: the typed schema refuses a key it does not know, ``+`` or not). None when the
    message is none of these, so that Hydra's own names the key it refused."""
    from verl.workers.config.schema import known_key_message

    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        message = known_key_message(key)
        if message is not None and f"'{key}'" in hydra_message:
            return message
    unknown = re.match(r"Could not override '([^']+)'", hydra_message)
    if unknown is None:
        return None
    key = unknown.group(1)
    others = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") != key]
    return (
        f"{key} is not a key of this config.{did_you_mean(nearest_config_keys(key, others, config_name, config_dir))}"
        " (Adding it with a leading + does not help: the typed config refuses a key it does not know; see "
        "docs/config.)"
    )


def nearest_config_keys(key: str, overrides: Sequence[str], config_name: str, config_dir: Path) -> list[str]:
    """The full keys of the composed config (``overrides`` applied, or none if they do not compose) spelled most
    like ``key``: its own section's keys by their last part first (``optim.lrr`` -> ``optim.lr``), then any key
    of the config by its whole dotted name (a key put in the wrong section)."""
    from omegaconf import OmegaConf

    try:
        config = compose_with_defaults(overrides, config_name, config_dir).config
    except ValueError:
        config = compose_with_defaults((), config_name, config_dir).config
    flat = _dotted_keys(OmegaConf.to_container(config, resolve=False))
    parent, _, name = key.rpartition(".")
    siblings = [k.rpartition(".")[2] for k in flat if k.rpartition(".")[0] == parent]
    close = [f"{parent}.{n}" if parent else n for n in nearest_keys(name, siblings)]
    if close:
        return close
    # a key put in the wrong section: the keys elsewhere with that very name, else the nearest whole names
    same_name = [k for k in flat if k.rpartition(".")[2] == name]
    return same_name[:3] or nearest_keys(key, [k for k in flat if not key.startswith(k + ".")])


def _dotted_keys(tree: Any, prefix: str = "") -> list[str]:
    if not isinstance(tree, dict):
        return [prefix] if prefix else []
    keys = []
    for name, value in tree.items():
        full = f"{prefix}.{name}" if prefix else str(name)
        keys += [full, *_dotted_keys(value, full)] if isinstance(value, dict) else [full]
    return keys


def cli(argv: Sequence[str] | None = None, config_dir: Path = CONFIG_DIR, config_name: str = "ppo_trainer") -> None:
    """The command line: compose, run, exit with :func:`run`'s code (2 when the config does not compose, 8 with the
    traceback logged when anything else is raised)."""
    setup_logging()
    try:
        config = parse_command_line(sys.argv[1:] if argv is None else argv, config_dir, config_name)
    except ValueError as err:
        logger.error("Bad config: %s", err)
        sys.exit(EXIT_BAD_CONFIG)
    ask_for_token_auth(config.config)  # before the config's check imports Ray, which reads RAY_AUTH_MODE then
    try:
        code = run(config)
    except Exception as err:
        # a worker's exception reaches the driver as its own type and message; where it was raised is the worker's
        # traceback (verl.single_controller.results attaches it), which the driver's own traceback does not show
        remote = getattr(err, "remote_traceback", None)
        if remote:
            logger.error("rank %s raised %s; its traceback:\n%s", getattr(err, "rank", "?"), type(err).__name__, remote)
        logger.exception("Stopped by an unexpected error (exit code %d): %s", EXIT_UNEXPECTED_ERROR, err)
        sys.exit(EXIT_UNEXPECTED_ERROR)
    sys.exit(code)


if __name__ == "__main__":
    cli()
