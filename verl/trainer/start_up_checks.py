"""Checks of what the config points at that need no worker, run by :func:`verl.trainer.main_ppo.prepare` in the
order a user should meet them.

- :func:`check_model_path_exists`, before the config is validated: a model path that names no file on this machine
  is the first thing reported, since every other message (a micro-batch size, say) is moot until the model is
  there. A name in the Hugging Face Hub's form (``Qwen/Qwen3-8B``) is left to ``transformers``, which looks in its
  cache (or downloads it, as in verl); a filesystem path is never downloaded.
- :func:`check_logger_packages`: every sink of ``trainer.logger`` has its package installed.
- :func:`check_context_length`, once the model's Hugging Face config is loaded: ``data.max_prompt_length`` +
  ``data.max_response_length`` fit the model's context (``max_position_embeddings``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

__all__ = ["check_context_length", "check_logger_packages", "check_model_path_exists", "missing_model_message"]

# The paths of the config that must name a model (or its tokenizer) on this machine before anything else is read.
_MODEL_PATH_KEYS = ("actor_rollout_ref.model.path", "actor_rollout_ref.model.tokenizer_path")
# "default" (and an empty value) is the embedded tiny model (verl.models.loading)
_EMBEDDED_NAMES = (None, "", "default")
# A Hugging Face Hub repository id: a name, or namespace/name, of letters, digits, '-', '_' and '.'
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def missing_model_message(key: str, path: Any) -> str | None:
    """The message for ``key=path`` when the path names nothing on this machine and cannot be a Hub name; None
    when it exists, is the embedded model, or has the form of a Hub repository id."""
    if path in _EMBEDDED_NAMES:
        return None
    text = str(path)
    local = Path(text).expanduser()
    if local.exists() or (_HUB_ID.fullmatch(text) and not text.startswith(".")):
        return None
    return (
        f"{key}={text!r} does not exist: there is no such file or directory on this machine ({local}), and a "
        f"path is never downloaded. Point {key} at a local Hugging Face model directory (with config.json), or "
        f"set {key}=default for the embedded tiny model."
    )


def check_model_path_exists(config: Any) -> None:
    """The model path (and tokenizer path) of a composed config (``ComposedConfig``, ``DictConfig``) or a typed
    one, before it is validated.

    Raises:
        ValueError: a path that does not exist on this machine (:func:`missing_model_message`).
    """
    from omegaconf import DictConfig, OmegaConf

    raw = getattr(config, "config", config)  # a ComposedConfig's composed file
    for key in _MODEL_PATH_KEYS:
        if isinstance(raw, DictConfig):
            path = OmegaConf.select(raw, key, default=None, throw_on_resolution_failure=False)
        else:  # the typed config
            section, _, name = key.rpartition(".")
            path = getattr(raw.actor_rollout_ref.model, name, None) if section == "actor_rollout_ref.model" else None
        message = missing_model_message(key, path)
        if message is not None:
            raise ValueError(message)


def check_logger_packages(config: Any) -> None:
    """Every sink of ``trainer.logger`` can be built: its package is installed.

    Raises:
        ValueError: a sink whose package is missing, naming the package to install.
    """
    from verl.utils.tracking import missing_sink_packages

    loggers = list(config.trainer.logger)
    missing = missing_sink_packages(loggers)
    if missing:
        names = ", ".join(f"{sink} (pip install {package})" for sink, package in missing.items())
        raise ValueError(
            f"trainer.logger={loggers} names sinks whose package is not installed: {names}. Install it, or remove "
            f"the sink from trainer.logger (e.g. trainer.logger=[console,jsonl])."
        )


def check_context_length(config: Any, key: str, hf_config: Any) -> None:
    """``data.max_prompt_length`` + ``data.max_response_length`` must fit the context of the model at ``key``
    (its ``max_position_embeddings``, after ``override_config``); a config without that attribute is not checked.

    Raises:
        ValueError: the lengths add up to more than the model's context; the message names the three numbers.
    """
    context = getattr(hf_config, "max_position_embeddings", None)
    data = config.data
    needed = data.max_prompt_length + data.max_response_length
    if context is None or needed <= context:
        return
    model = config.critic.model if key.startswith("critic.") else config.actor_rollout_ref.model
    raise ValueError(
        f"data.max_prompt_length={data.max_prompt_length} + data.max_response_length={data.max_response_length} = "
        f"{needed} tokens is longer than the model's context: max_position_embeddings={context} of {key}="
        f"{model.path!r}. Lower data.max_prompt_length and data.max_response_length to at most {context} tokens "
        "together, or use a model with a longer context."
    )
