"""Start-up checks of the trainer config, run in the driver before Ray starts.

Every value is checked against the type of its default in ``ppo_trainer.yaml`` (keys that accept several kinds of
value are listed in ``UNION_KEYS``), then the combinations that would only fail later — batch sizes that do not
split, a rollout that does not fit the backend, an update-failure policy that does not build — are checked here,
with messages that name the key and the fix.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from verl.workers.update_outcome import build_update_outcome_handler

# Keys whose values may legitimately differ in kind from their default (name or mapping, auto or bool, null...).
UNION_KEYS = {
    "actor_rollout_ref.actor.update_failure_policy",
    "critic.update_failure_policy",
    "actor_rollout_ref.actor.megatron.use_megatron_optimizer",
    "critic.megatron.use_megatron_optimizer",
    "actor_rollout_ref.ref.enable",
    "actor_rollout_ref.actor.recompute_old_log_prob",
    "critic.enable",
}
STRATEGIES = ("dp", "megatron")
DTYPES = ("float16", "bfloat16", "float32")
RESUME_MODES = ("auto", "disable", "resume_path")


def _kind_ok(default: Any, value: Any) -> bool:
    if default is None or value is None:
        return True
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(default, str):
        return isinstance(value, str)
    if isinstance(default, list):
        return isinstance(value, list)
    return True


def check_types(config: DictConfig, defaults: DictConfig) -> None:
    """Every leaf of ``config`` must have the kind of value its default has."""
    plain = OmegaConf.to_container(config, resolve=True)
    base = OmegaConf.to_container(defaults, resolve=True)

    def walk(value: Any, default: Any, path: str) -> None:
        if path in UNION_KEYS:
            return
        if isinstance(default, dict) and isinstance(value, dict):
            for key, sub in value.items():
                walk(sub, default.get(key), f"{path}.{key}" if path else key)
            return
        if isinstance(default, dict) and value is not None:
            raise ValueError(f"{path} must be a mapping (its keys: {sorted(default)}), got {value!r}.")
        if not _kind_ok(default, value):
            kind = type(default).__name__
            raise ValueError(f"{path}={value!r} has the wrong type: expected {kind} (default {default!r}).")

    walk(plain, base, "")


def _one_of(value: Any, accepted, key: str) -> None:
    if value not in accepted:
        raise ValueError(f"{key}={value!r} is not supported; use one of {list(accepted)}.")


def _positive(value: int, key: str) -> None:
    if value is None or value < 1:
        raise ValueError(f"{key} must be an integer >= 1, got {value!r}.")


def check_batch_sizes(cfg: DictConfig) -> None:
    world = int(cfg.trainer.n_gpus_per_node) * int(cfg.trainer.nnodes)
    _positive(world, "trainer.n_gpus_per_node x trainer.nnodes")
    n = int(cfg.actor_rollout_ref.rollout.n)
    _positive(n, "actor_rollout_ref.rollout.n")
    train_bs = int(cfg.data.train_batch_size)
    _positive(train_bs, "data.train_batch_size")
    for key in ("actor_rollout_ref.actor", "actor_rollout_ref.ref"):
        value = OmegaConf.select(cfg, f"{key}.log_prob_micro_batch_size_per_gpu")
        _positive(int(value), f"{key}.log_prob_micro_batch_size_per_gpu")
    sections = [(cfg.actor_rollout_ref.actor, "actor_rollout_ref.actor")]
    if needs_critic(cfg):
        sections.append((cfg.critic, "critic"))
    for section, key in sections:
        mini = int(section.ppo_mini_batch_size)
        micro = int(section.ppo_micro_batch_size_per_gpu)
        _positive(mini, f"{key}.ppo_mini_batch_size")
        _positive(micro, f"{key}.ppo_micro_batch_size_per_gpu")
        if train_bs % mini:
            raise ValueError(
                f"data.train_batch_size={train_bs} is not a multiple of {key}.ppo_mini_batch_size={mini}; each "
                f"training batch must split into whole mini-batches."
            )
        if (mini * n) % world or ((mini * n) // world) % micro:
            raise ValueError(
                f"{key}.ppo_mini_batch_size x rollout.n = {mini * n} samples over {world} rank(s) must give a "
                f"multiple of {key}.ppo_micro_batch_size_per_gpu={micro} per rank; change one of them."
            )


def validate_config(cfg: DictConfig, defaults: DictConfig | None = None) -> None:
    """Raise ``ValueError`` naming the key and the fix for anything that would fail after start-up."""
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY
    from verl.utils.tracking import LOGGERS
    from verl.workers.rollout import ROLLOUT_REGISTRY

    if defaults is not None:
        check_types(cfg, defaults)
    actor = cfg.actor_rollout_ref.actor
    _one_of(actor.strategy, STRATEGIES, "actor_rollout_ref.actor.strategy")
    _one_of(actor.dtype, DTYPES, "actor_rollout_ref.actor.dtype")
    _one_of(cfg.critic.dtype, DTYPES, "critic.dtype")
    if cfg.critic.strategy is not None:
        _one_of(cfg.critic.strategy, STRATEGIES, "critic.strategy")
    _one_of(actor.recompute_old_log_prob, ("auto", True), "actor_rollout_ref.actor.recompute_old_log_prob")
    _one_of(cfg.actor_rollout_ref.rollout.name, ROLLOUT_REGISTRY.names(), "actor_rollout_ref.rollout.name")
    if cfg.actor_rollout_ref.rollout.name == "hf" and actor.strategy != "dp":
        raise ValueError("actor_rollout_ref.rollout.name=hf needs a Hugging Face actor (strategy=dp); use naive.")
    _one_of(cfg.algorithm.adv_estimator, ADV_ESTIMATOR_REGISTRY.names(), "algorithm.adv_estimator")
    _one_of(cfg.trainer.resume_mode, RESUME_MODES, "trainer.resume_mode")
    if cfg.trainer.resume_mode == "resume_path":
        check_resume_path(cfg.trainer.resume_from_path)
    _one_of(cfg.trainer.device, ("cpu", "cuda", "auto"), "trainer.device")
    logger_list = list(cfg.trainer.logger) if isinstance(cfg.trainer.logger, ListConfig | list) else None
    if logger_list is None or any(name not in LOGGERS for name in logger_list):
        raise ValueError(f"trainer.logger={cfg.trainer.logger!r}: use a list of {list(LOGGERS)}.")
    if cfg.trainer.total_training_steps is not None:
        _positive(int(cfg.trainer.total_training_steps), "trainer.total_training_steps")
    _positive(int(cfg.trainer.total_epochs), "trainer.total_epochs")
    for parallel in ("tensor_model_parallel_size", "pipeline_model_parallel_size"):
        _positive(int(actor.megatron[parallel]), f"actor_rollout_ref.actor.megatron.{parallel}")
    if cfg.data.max_prompt_length < 1 or cfg.data.max_response_length < 1:
        raise ValueError("data.max_prompt_length and data.max_response_length must be >= 1.")
    check_batch_sizes(cfg)
    if actor.strategy == "megatron" and (
        int(actor.megatron.tensor_model_parallel_size),
        int(actor.megatron.pipeline_model_parallel_size),
    ) != (1, 1):
        raise ValueError(
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size and pipeline_model_parallel_size must be 1 "
            "in main_ppo: its workers load the Hugging Face weights, which needs whole models per rank; scale out "
            "with trainer.n_gpus_per_node (data parallel) instead."
        )
    if actor.strategy == "megatron" and cfg.trainer.device == "cpu":
        import torch

        from verl.workers.actor.megatron_builder import choose_training_path

        choose_training_path(actor.megatron, torch.device("cpu"), "actor_rollout_ref.actor")
    # Build each policy once here so that a typo fails now, not inside a Ray worker minutes later.
    build_update_outcome_handler(actor.update_failure_policy, dtype=actor.dtype, role="actor")
    build_update_outcome_handler(cfg.critic.update_failure_policy, dtype=cfg.critic.dtype, role="critic")
    if needs_critic(cfg) is False and cfg.algorithm.adv_estimator == "gae":
        raise ValueError("algorithm.adv_estimator=gae needs a value model: set critic.enable=true (or auto).")
    if actor.use_kl_loss and not needs_reference(cfg):
        raise ValueError(
            "actor_rollout_ref.actor.use_kl_loss=true needs reference log-probs: set actor_rollout_ref.ref.enable "
            "to auto or true."
        )


def needs_reference(cfg: DictConfig) -> bool:
    """Whether the actor workers build a frozen reference model (``ref.enable``; auto: when a KL loss needs it)."""
    enable = cfg.actor_rollout_ref.ref.enable
    if enable == "auto":
        return bool(cfg.actor_rollout_ref.actor.use_kl_loss)
    return bool(enable)


def needs_critic(cfg: DictConfig) -> bool:
    enable = cfg.critic.enable
    if enable == "auto":
        return cfg.algorithm.adv_estimator == "gae"
    return bool(enable)


def check_resume_path(resume_from_path: str | None) -> None:
    """``trainer.resume_from_path`` must name an existing ``global_step_N`` directory with the trainer's state."""
    from pathlib import Path

    from verl.utils.checkpoint import step_of_checkpoint

    if not resume_from_path:
        raise ValueError("trainer.resume_mode=resume_path needs trainer.resume_from_path=<checkpoint directory>.")
    path = Path(resume_from_path)
    step_of_checkpoint(path)  # the name must be global_step_N
    if not (path / "trainer_state.pt").is_file():
        raise ValueError(
            f"trainer.resume_from_path={path} is not a complete checkpoint (no trainer_state.pt); point it at a "
            f"global_step_N directory written by the trainer, or use trainer.resume_mode=auto."
        )


def computes_old_log_prob(cfg: DictConfig) -> bool:
    """Whether a training step runs the separate old-log-prob pass (``actor.recompute_old_log_prob``).

    ``auto`` skips it when the step makes exactly one policy update (``ppo_epochs`` 1 and ``ppo_mini_batch_size``
    equal to ``data.train_batch_size``): that update runs on the weights that sampled the batch, so its own
    detached log-probs are the old log-probs and the ratio is exactly 1, as in an on-policy GRPO step.
    """
    actor = cfg.actor_rollout_ref.actor
    if actor.recompute_old_log_prob is True:
        return True
    one_update = int(actor.ppo_epochs) == 1 and int(actor.ppo_mini_batch_size) == int(cfg.data.train_batch_size)
    return not one_update
