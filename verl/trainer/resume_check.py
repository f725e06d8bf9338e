"""What a resume takes over, said and checked before Ray starts: the checkpoint, its step, and every setting changed.

A run that finds a checkpoint to resume from (``trainer.resume_mode=auto``: the newest complete ``global_step_N`` in
``trainer.default_local_dir``; ``resume_path``: the one named) logs which one and at which step, then compares the
config that checkpoint's run saved (``global_step_N/config.json``) with its own: one warning per key that differs,
so that an intended change (a lower learning rate, more steps) goes on with a record of it. It refuses to start
(a ``ValueError``: exit code 2, before anything is trained, before ``metrics.jsonl`` or the plot is touched) when

- nothing is left to train: the checkpoint's step is at or past this run's total (``trainer.total_training_steps``,
  or the steps of ``trainer.total_epochs``), so the run would end at once and leave the checkpoint's metrics cut;
- the model differs (:data:`MODEL_KEYS`: the weights' architecture and source; the checkpoint's weights are another
  model's);
- the algorithm differs (:data:`ALGORITHM_KEYS`: the advantage estimator and the policy loss; the checkpoint's
  optimizer state and counters belong to another objective).

The refusal names the checkpoint and the keys that start a run of its own: ``trainer.resume_mode=disable``, or
another ``trainer.experiment_name`` (another ``trainer.default_local_dir`` when that is set by hand). A checkpoint
written before configs were saved has no ``config.json``: its step is still checked, and a warning says that its
settings cannot be compared.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from verl.trainer.ppo.trainer_checkpoints import CONFIG_FILE, read_saved_config
from verl.utils.checkpoint import step_of_checkpoint
from verl.workers.config import PPOConfig

logger = logging.getLogger("verl.trainer")

# "The model": the keys that decide which weights the checkpoint holds (a key and everything under it). Another
# path, other config overrides (layers, sizes) or another LoRA rank make the checkpoint's weights another model's.
MODEL_KEYS = (
    "actor_rollout_ref.model.path",
    "actor_rollout_ref.model.override_config",
    "actor_rollout_ref.model.lora_rank",
    "actor_rollout_ref.model.lora.rank",
    "critic.model.path",
    "critic.model.override_config",
    "critic.model.lora_rank",
    "critic.model.lora.rank",
)
# "The algorithm": the objective the checkpoint's optimizer state was built for: the advantage estimator (which
# also decides whether a critic trains) and the policy loss. Its coefficients (clip ratios, KL, entropy, the learning
# rate) are tuning: a change is a warning.
ALGORITHM_KEYS = (
    "algorithm.adv_estimator",
    "actor_rollout_ref.actor.policy_loss.loss_mode",
)
# how the run finds its checkpoint, not what it trains: never a difference
NOT_COMPARED = ("trainer.resume_mode", "trainer.resume_from_path")


def flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; an empty mapping stays a value of its own key."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


_ABSENT = object()


def config_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(key, saved value, current value)`` for every leaf key whose value differs, sorted by key; a key only one
    side has comes with ``"(absent)"`` on the other. The current values pass through JSON as the saved ones did
    (tuples become lists), so that only real differences show."""
    old, new = flatten(saved), flatten(json.loads(json.dumps(current)))
    differences = []
    for key in sorted(old.keys() | new.keys()):
        if key in NOT_COMPARED:
            continue
        before, after = old.get(key, _ABSENT), new.get(key, _ABSENT)
        if before != after:
            differences.append((key, _shown(before), _shown(after)))
    return differences


def _shown(value: Any) -> Any:
    return "(absent)" if value is _ABSENT else value


def _under(key: str, roots: tuple[str, ...]) -> bool:
    return any(key == root or key.startswith(root + ".") for root in roots)


def check_resume(config: PPOConfig, total_training_steps: int, checkpoint: Path) -> None:
    """Log what the run resumes, warn about each setting that changed since the checkpoint was saved, and refuse a
    resume that cannot continue that run (see the module's docstring).

    Args:
        config: this run's validated config.
        total_training_steps: the step this run trains to (the run plan's).
        checkpoint: the verified ``global_step_N`` directory the run would resume from.

    Raises:
        ValueError: nothing left to train, or another model or algorithm; the message names the checkpoint, why,
            and the keys that start a run of its own.
        CheckpointError: the checkpoint's ``config.json`` is damaged.
    """
    step = step_of_checkpoint(checkpoint)
    auto = config.trainer.resume_mode == "auto"
    how = "trainer.resume_mode=auto: the newest checkpoint" if auto else "named by trainer.resume_from_path"
    logger.info(
        "resuming from %s (%s), saved after step %d; this run trains to step %d",
        checkpoint,
        how,
        step,
        total_training_steps,
    )
    saved = read_saved_config(checkpoint)
    if saved is None:
        logger.warning(
            "%s has no %s (written before checkpoints held their config): its settings cannot be compared with this "
            "run's; resuming with this run's",
            checkpoint,
            CONFIG_FILE,
        )
        differences = []
    else:
        differences = config_differences(saved, config.to_dict())
    for key, before, after in differences:
        logger.warning("resuming with a changed setting: %s=%r (was %r in %s)", key, after, before, checkpoint)
    reasons = []
    if step >= total_training_steps:
        reasons.append(
            f"nothing is left to train: it was saved after step {step}, and this run trains to step "
            f"{total_training_steps} (trainer.total_training_steps, or the steps of trainer.total_epochs)"
        )
    for what, roots in (("the model", MODEL_KEYS), ("the algorithm", ALGORITHM_KEYS)):
        changed = [f"{key}: {before!r} -> {after!r}" for key, before, after in differences if _under(key, roots)]
        if changed:
            reasons.append(f"{what} differs from the checkpoint's ({'; '.join(changed)})")
    if reasons:
        raise ValueError(_refusal(config, checkpoint, step, reasons))


def _refusal(config: PPOConfig, checkpoint: Path, step: int, reasons: list[str]) -> str:
    trainer = config.trainer
    if Path(trainer.default_local_dir).name == trainer.experiment_name:
        elsewhere = f"another trainer.experiment_name (now {trainer.experiment_name!r}: a directory of its own)"
    else:
        elsewhere = f"another trainer.default_local_dir (now {trainer.default_local_dir!r})"
    found = (
        f"trainer.resume_mode=auto found {checkpoint} in trainer.default_local_dir"
        if trainer.resume_mode == "auto"
        else f"trainer.resume_from_path={checkpoint}"
    )
    return (
        f"{found}, but this run cannot continue it: {'; and '.join(reasons)}. Nothing was trained or changed. To "
        f"start a new run, set trainer.resume_mode=disable (an earlier run's metrics.jsonl there is moved aside) or "
        f"{elsewhere}; to train that checkpoint further, keep its model and algorithm and set "
        f"trainer.total_training_steps above {step}."
    )
