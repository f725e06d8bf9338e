"""The trainer's checkpoints: ``global_step_N`` directories written atomically, resumed from, and kept in number.

:class:`CheckpointMixin` is a part of :class:`~verl.trainer.ppo.ray_trainer.RayPPOTrainer`; it reads the trainer's
``config``, ``plan`` (the :class:`~verl.workers.config.plan.RunPlan`, saved as ``run_plan.json`` in each checkpoint,
:func:`write_run_plan`), worker groups, ``rollout_source`` (the data position a checkpoint saves), ``kl_ctrl``,
``roles``, ``stop_signals``, ``resume_from`` and ``global_step``, and keeps ``last_checkpoint``. Each checkpoint also
holds the run's validated config as ``config.json`` (:func:`write_saved_config`), which a later run that resumes from it
compares with its own before Ray starts (:mod:`verl.trainer.resume_check`). A write that fails
raises :class:`~verl.utils.checkpoint_errors.CheckpointWriteError` and leaves nothing of the attempt behind; between
two steps a stop signal is answered by a save and :class:`~verl.trainer.preemption.Preempted`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from verl.trainer.preemption import Preempted
from verl.utils.checkpoint import (
    CheckpointError,
    CheckpointWriteError,
    atomic_directory,
    checkpoints_to_keep,
    describe_os_error,
    load_state,
    prune_checkpoints,
    save_state,
    step_of_checkpoint,
    verify_checkpoint,
)
from verl.workers.config.plan import RunPlan

logger = logging.getLogger("verl.trainer")
# the run plan of the run that wrote a checkpoint, as plain JSON beside trainer_state.pt (for people and tools: a
# resume derives its own plan from its own config)
RUN_PLAN_FILE = "run_plan.json"
# the validated config of the run that wrote a checkpoint, as plain JSON: what a resume compares its own config with
CONFIG_FILE = "config.json"


def write_run_plan(step_dir: Path, plan: RunPlan) -> Path:
    """Write ``plan`` as ``step_dir/run_plan.json`` (keys sorted, indented); returns the file's path."""
    path = Path(step_dir) / RUN_PLAN_FILE
    path.write_text(json.dumps(plan.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def read_run_plan(step_dir: Path) -> dict[str, Any]:
    """The plain values of a checkpoint's ``run_plan.json`` (tuples come back as lists)."""
    return json.loads((Path(step_dir) / RUN_PLAN_FILE).read_text(encoding="utf-8"))


def write_saved_config(step_dir: Path, config: Any) -> Path:
    """Write the validated config (a :class:`~verl.workers.config.PPOConfig`) as ``step_dir/config.json``."""
    path = Path(step_dir) / CONFIG_FILE
    path.write_text(json.dumps(config.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def read_saved_config(step_dir: Path) -> dict[str, Any] | None:
    """The plain values of a checkpoint's ``config.json``; None for a checkpoint written before it was saved.

    Raises:
        CheckpointError: the file is there but is not a JSON object (damaged, or not written by this trainer).
    """
    path = Path(step_dir) / CONFIG_FILE
    if not path.is_file():
        return None
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(path, f"does not read as JSON ({err})") from err
    if not isinstance(values, dict):
        raise CheckpointError(path, f"holds a {type(values).__name__}, not the config's mapping")
    return values


class CheckpointMixin:
    """Saving, resuming and answering a stop signal between steps."""

    def checkpoint_root(self) -> Path:
        return Path(self.config.trainer.default_local_dir)

    def stop_if_asked(self) -> None:
        """Between two steps: when a stop signal has arrived, save the step the run stands at (unless it is saved
        already, or no step ran) and raise :class:`~verl.trainer.preemption.Preempted`.

        The save is the one ``trainer.save_freq`` makes (also when ``save_freq <= 0``: the signal asks for it).
        """
        signals = self.stop_signals
        if signals is None or signals.requested is None:
            return
        checkpoint = self.last_checkpoint
        saved = checkpoint is not None and step_of_checkpoint(checkpoint) == self.global_step
        if self.global_step > 0 and not saved:
            checkpoint = self.save_checkpoint()
        raise Preempted(signals.requested, self.global_step, checkpoint)

    def save_checkpoint(self) -> Path:
        """Write ``global_step_N`` atomically: a crash mid-save leaves the previous checkpoint intact.

        Raises:
            CheckpointWriteError: a file could not be written, here or in a worker (disk full, read-only directory,
                any ``OSError``); its ``checkpoint`` is the ``global_step_N`` that was being saved, and nothing of
                the attempt is left under its final name.
        """
        final = self.checkpoint_root() / f"global_step_{self.global_step}"
        try:
            with atomic_directory(final) as tmp:
                self.actor_wg.save_checkpoint(str(tmp / "actor"))
                if self.critic_wg is not None:
                    self.critic_wg.save_checkpoint(str(tmp / "critic"))
                save_state(
                    tmp / "trainer_state.pt",
                    {
                        "global_step": self.global_step,
                        # one step off policy: the data position before the batch in flight, which is not saved
                        "data_loader": self.rollout_source.loader_state(),
                        "rollout_source": self.rollout_source.state_dict(),
                        # the adaptive KL coefficient moves every step: a resumed run must start where it stood
                        "kl_coef": None if self.kl_ctrl is None else float(self.kl_ctrl.value),
                    },
                )
                write_run_plan(tmp, self.plan)
                write_saved_config(tmp, self.config)
                self._check_written(tmp)
        except (CheckpointWriteError, OSError) as err:
            raise CheckpointWriteError.while_saving(err, final) from err
        self.last_checkpoint = final
        logger.info("saved checkpoint %s", final)
        trainer_cfg = self.config.trainer
        limits = [trainer_cfg.max_actor_ckpt_to_keep]
        if self.critic_wg is not None:
            limits.append(trainer_cfg.max_critic_ckpt_to_keep)
        try:
            prune_checkpoints(self.checkpoint_root(), final, checkpoints_to_keep(limits), self.roles)
        except OSError as err:  # the new checkpoint is complete: a failed clean-up must not stop the run
            logger.warning(
                "could not remove old checkpoints under %s (%s); they stay until removed by hand",
                self.checkpoint_root(),
                describe_os_error(err),
            )
        return final

    def _check_written(self, tmp: Path) -> None:
        """The checkpoint read back by the driver, as a resume will read it, before the save is made final.

        Each rank writes its files on its own node: without a filesystem every node shares, the files of ranks on
        other nodes are not where the driver (and the next run) looks, and no run could resume from the checkpoint.

        Raises:
            CheckpointWriteError: a file is missing or does not read back, named with the reason.
        """
        try:
            verify_checkpoint(tmp, self.roles)
        except CheckpointError as err:
            raise CheckpointWriteError(
                err.path,
                f"every rank returned from its save, but the driver finds this file {err.reason}; if "
                "the rank that wrote it runs on another node, it went to that node's disk, and "
                "trainer.default_local_dir must be a directory every node sees (a shared filesystem)",
            ) from err

    def maybe_resume(self) -> None:
        """Restore :attr:`resume_from` (see ``verl.trainer.main_ppo.choose_checkpoint``), if set."""
        path = self.resume_from
        if path is None:
            return
        state: dict[str, Any] = load_state(path / "trainer_state.pt")
        self.actor_wg.load_checkpoint(str(path / "actor"))
        if self.critic_wg is not None:
            self.critic_wg.load_checkpoint(str(path / "critic"))
        self.train_loader.load_state_dict(state["data_loader"])
        self.rollout_source.load_state_dict(state.get("rollout_source", {}))
        self.global_step = int(state["global_step"])
        if self.kl_ctrl is not None and state.get("kl_coef") is not None:
            self.kl_ctrl.value = float(state["kl_coef"])
        self.last_checkpoint = path
        logger.info("resumed from %s at step %d", path, self.global_step)
