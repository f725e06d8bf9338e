"""Loading models, configs and tokenizers, with the embedded tiny model as the default.

Every place that takes a model path (``actor_rollout_ref.model.path`` and friends) goes through these helpers, so
``None`` or ``"default"`` means the tiny Qwen2-style model shipped inside the package (``verl/models/tiny``). Its
path is resolved from this file, which works for an editable checkout and an installed wheel alike, and loading it
needs no network.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

DEFAULT_MODEL_PATH: Path = Path(__file__).resolve().parent / "tiny"
_DEFAULT_NAMES = (None, "", "default")


def resolve_model_path(path: str | Path | None) -> str:
    """Map ``None`` / ``""`` / ``"default"`` to the embedded tiny model; pass anything else through as a string."""
    if path in _DEFAULT_NAMES:
        return str(DEFAULT_MODEL_PATH)
    return str(path)


def load_tokenizer(path: str | Path | None = None, trust_remote_code: bool = False):
    """Load a tokenizer with ``AutoTokenizer`` and make sure it has a pad token.

    A tokenizer without a pad token gets its eos token as pad (the usual choice for decoder-only models), with a
    warning, because rollout and training pad every batch.

    Args:
        path: a local directory or hub name; ``None`` or ``"default"`` for the embedded tiny model.
        trust_remote_code: forwarded to ``AutoTokenizer.from_pretrained``.

    Raises:
        ValueError: the tokenizer has neither a pad nor an eos token.
    """
    from transformers import AutoTokenizer

    resolved = resolve_model_path(path)
    tokenizer = AutoTokenizer.from_pretrained(resolved, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token is None:
            raise ValueError(
                f"The tokenizer at {resolved!r} has neither a pad token nor an eos token; verl pads every batch. "
                "Add a pad_token to its tokenizer_config.json (or special_tokens_map.json)."
            )
        logger.warning(
            "Tokenizer at %s has no pad token; using its eos token %r as pad.", resolved, tokenizer.eos_token
        )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_hf_config(
    path: str | Path | None = None, trust_remote_code: bool = False, overrides: Mapping[str, Any] | None = None
):
    """Load a model's ``transformers`` config (``AutoConfig``); ``None`` or ``"default"`` for the tiny model.

    Args:
        overrides: attributes to set on it (verl's ``model.override_config``, e.g. ``{"attention_dropout": 0.0}``);
            see :func:`apply_config_overrides`.
    """
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(resolve_model_path(path), trust_remote_code=trust_remote_code)
    return apply_config_overrides(config, overrides)


def apply_config_overrides(config: Any, overrides: Mapping[str, Any] | None, key: str = "model.override_config"):
    """Set each entry of ``overrides`` on the Hugging Face ``config`` (in place; returned).

    Both of verl's spellings are taken: the flat one of its FSDP workers (``override_config.attention_dropout``) and
    the nested one of its megatron workers (``override_config.model_config.max_position_embeddings``).

    An entry naming an attribute the config's class does not have is set all the same, as verl does (and as
    ``transformers`` keeps unknown keys of a ``config.json``), with a warning naming it: the model's code never reads
    it, so a typo changes nothing (verl's scripts set GPT-2's ``embd_pdrop`` and ``resid_pdrop`` on Qwen models).

    Raises:
        ValueError: verl's ``moe_config`` (MoE models are out of scope here).
    """
    overrides = dict(overrides or {})
    if "moe_config" in overrides:
        raise ValueError(f"{key}.moe_config sets a mixture-of-experts router; MoE models are out of scope here.")
    if "model_config" in overrides and not hasattr(config, "model_config"):
        overrides = {**overrides.pop("model_config"), **overrides}  # verl's megatron form
    for name, value in overrides.items():
        if not hasattr(config, name):
            logger.warning(
                "%s.%s: the model's config (%s) has no attribute %r; it is set, but the model's code does not read "
                "it, so it changes nothing. Check the name against the model's config.json.",
                key,
                name,
                type(config).__name__,
                name,
            )
        setattr(config, name, value)
    return config


def load_hf_causal_lm(
    path: str | Path | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
    config_overrides: Mapping[str, Any] | None = None,
):
    """Load a causal LM (``AutoModelForCausalLM``) in ``dtype`` on ``device``, in eval mode.

    Args:
        path: a local directory or hub name; ``None`` or ``"default"`` for the embedded tiny model.
        dtype: parameter dtype, e.g. ``torch.float32`` or ``torch.float16``.
        device: where to put the parameters.
        trust_remote_code: forwarded to ``from_pretrained``.
        attn_implementation: e.g. ``"eager"`` or ``"sdpa"``; ``None`` lets transformers choose.
        config_overrides: attributes set on the model's config before the model is built (``model.override_config``).

    Raises:
        ValueError: ``dtype`` is not a floating-point ``torch.dtype``.
    """
    from transformers import AutoModelForCausalLM

    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point torch.dtype such as torch.float16, got {dtype!r}.")
    kwargs = {"dtype": dtype, "trust_remote_code": trust_remote_code}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    if config_overrides:
        kwargs["config"] = load_hf_config(path, trust_remote_code, config_overrides)
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(path), **kwargs)
    return model.to(device).eval()
