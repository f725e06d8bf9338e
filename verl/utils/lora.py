"""LoRA adapters through ``peft`` on a Hugging Face causal LM (``actor_rollout_ref.model.lora_rank > 0``).

:func:`add_lora_adapters` injects peft's LoRA layers into the model in place (or loads an existing adapter from
``lora_adapter_path``) and freezes every base weight, so the optimizer built afterwards over the parameters that
require gradients holds the adapters only. The model keeps its class (a ``transformers`` model whose targeted linear
layers became peft ``lora.Linear`` modules): the actor's forward passes, the rollout's decoding, FSDP2 sharding and
checkpoints work on it as on any Hugging Face model. The ``PeftModel`` around it is kept for two things only: switching
the adapters off for the reference policy (:meth:`PeftModel.disable_adapter`, no second copy of the weights) and
writing the adapter directory peft loads (:func:`save_lora_adapter`).
:func:`verl.models.lora_targets.check_lora_targets` runs the same injection on an empty (meta-device) copy of the
model at start-up, so a ``target_modules`` that matches nothing or a rank wider than a targeted layer fails before
any worker starts, with the key named.

The naive and hf rollouts sample from the actor's own module, adapters included, so they need no sync. A rollout
that holds its own weights (vLLM) gets the merged weights ``W + (alpha / r) B A`` under the plain model's names after
each update (:func:`merged_lora_weights`), through the same sync as full fine-tuning: the engine runs the plain
model, with no LoRA support of its own switched on.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

KEY = "actor_rollout_ref.model"
#: The directory a LoRA run's checkpoint holds its peft adapter in (verl's name).
LORA_ADAPTER_DIR = "lora_adapter"
_ADAPTER_CONFIG = "adapter_config.json"
# the adapter peft creates (get_peft_model) or loads (PeftModel.from_pretrained) when none is named
_ADAPTER_NAME = "default"
# prefix of the wrapped model's names inside PeftModel.state_dict(), which peft's save_pretrained expects
_PEFT_PREFIX = "base_model.model."


def lora_config(model_config: Any):
    """The ``peft.LoraConfig`` of ``model_config`` (its ``lora_rank``, ``lora_alpha``, ``target_modules``,
    ``exclude_modules``); dropout 0 and no bias adapters, so that forward passes are deterministic."""
    from peft import LoraConfig

    return LoraConfig(
        r=model_config.lora_rank,
        lora_alpha=model_config.lora_alpha,
        target_modules=model_config.target_modules,
        # the critic's section has no exclude_modules (verl's neither)
        exclude_modules=getattr(model_config, "exclude_modules", None),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )


def add_lora_adapters(module: torch.nn.Module, model_config: Any, *, key: str = KEY):
    """Inject LoRA adapters into ``module`` in place and freeze its base weights.

    Fresh adapters follow ``model_config`` (peft's initialisation: B = 0, so the model starts equal to the base);
    with ``lora_adapter_path`` set, the adapter saved there is loaded, trainable, with its own rank and targets.

    Args:
        module: a Hugging Face causal LM (fp32); it stays the same object, with peft layers inside.
        model_config: the ``actor_rollout_ref.model`` section.
        key: the section's key, for messages.

    Returns:
        The ``peft.PeftModel`` wrapping ``module`` (``peft_model.base_model.model is module``).

    Raises:
        ValueError: ``target_modules`` matches no linear layer, or ``lora_rank`` exceeds a targeted layer's width.
    """
    from peft import PeftModel, get_peft_model

    adapter_path = getattr(model_config, "lora_adapter_path", None)  # the critic's section has none
    if adapter_path:
        peft_model = PeftModel.from_pretrained(module, adapter_path, is_trainable=True)
        logger.info("LoRA: adapter loaded from %s", adapter_path)
    else:
        try:
            peft_model = get_peft_model(module, lora_config(model_config))
        except ValueError as error:  # peft's "Target modules ... not found in the base model"
            excluded = getattr(model_config, "exclude_modules", None)  # the critic's section has none
            raise ValueError(
                f"{key}.target_modules={model_config.target_modules!r} (with exclude_modules="
                f"{excluded!r}) selects no linear layer of {type(module).__name__}: {error} "
                "Name linear layers of the model (e.g. [q_proj, v_proj]) or use all-linear."
            ) from error
    _check_rank_fits(peft_model, key)
    _check_mergeable(peft_model, module, key)
    num_trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    num_total = sum(p.numel() for p in module.parameters())
    logger.info(
        "LoRA: %d trainable parameters of %d (%.3f%%)", num_trainable, num_total, 100 * num_trainable / num_total
    )
    return peft_model


def _check_mergeable(peft_model: Any, module: torch.nn.Module, key: str) -> None:
    """Refuse an adapter whose merged weights :func:`merged_lora_weights` cannot give: the rollout engine, the
    one-rank FSDP2 decoder and the Hugging Face export all sample from ``W + scaling x B @ A`` of linear layers.

    Refused, naming the layer: an adapter on a layer that is not a linear one (an embedding, a Conv1D), DoRA (its
    magnitude vector rescales the merged weight), adapter biases (``lora_bias``), ``modules_to_save`` (whole copies
    of layers, which the merge would not put back under the plain names), and, in a model whose output layer shares
    the input embedding's weight (``tie_word_embeddings``), an adapter on ``lm_head``: the trained policy would need
    two different matrices where the model holds one, and vLLM and the export would both lose the adapter.
    """
    from peft.tuners.lora import LoraLayer

    for adapter, config in peft_model.peft_config.items():
        if getattr(config, "modules_to_save", None):
            raise ValueError(
                f"{key}: the LoRA adapter {adapter!r} has modules_to_save={list(config.modules_to_save)}; whole "
                "trained copies of layers are not merged into the rollout's and the export's weights here. Train "
                "them as adapters (target_modules) instead."
            )
    tied = bool(getattr(getattr(module, "config", None), "tie_word_embeddings", False))
    for name, layer in peft_model.base_model.model.named_modules():
        if not isinstance(layer, LoraLayer):
            continue
        base = layer.get_base_layer()
        if not isinstance(base, torch.nn.Linear):
            raise ValueError(
                f"{key}.target_modules puts a LoRA adapter on {name}, a {type(base).__name__}; only linear layers' "
                "adapters are merged into the weights the rollout samples with. Leave it out of target_modules."
            )
        if any(getattr(layer, "use_dora", {}).values()):
            raise ValueError(f"{key}: the adapter on {name} is DoRA (use_dora), which is not merged here; use LoRA.")
        if any(getattr(layer, "lora_bias", {}).values()):
            raise ValueError(f"{key}: the adapter on {name} has a bias (lora_bias), which is not merged here.")
        if tied and name.split(".")[-1] == "lm_head":
            raise ValueError(
                f"{key}.target_modules puts a LoRA adapter on lm_head, whose weight is the input embedding's "
                "(tie_word_embeddings: true): the adapted output layer would need a matrix of its own. Leave lm_head "
                "out of target_modules."
            )


def _check_rank_fits(peft_model: Any, key: str) -> None:
    """Refuse a rank wider than a targeted layer: ``B @ A`` has rank at most min(in, out), so the excess columns
    would only add parameters and optimizer state."""
    from peft.tuners.lora import LoraLayer

    for name, layer in peft_model.base_model.model.named_modules():
        if not isinstance(layer, LoraLayer):
            continue
        for adapter, rank in layer.r.items():
            width = min(layer.in_features, layer.out_features)
            if rank > width:
                raise ValueError(
                    f"{key}.lora_rank={rank} is larger than the width of {name} ({layer.in_features} -> "
                    f"{layer.out_features}, at most rank {width}) (adapter {adapter!r}); use lora_rank <= {width} "
                    "or leave that layer out with exclude_modules."
                )


def save_lora_adapter(
    directory: str | os.PathLike, peft_model: Any, weights: dict[str, torch.Tensor] | None = None
) -> None:
    """Write the peft adapter directory (``adapter_config.json``, ``adapter_model.safetensors``) that
    ``PeftModel.from_pretrained`` and ``lora_adapter_path`` load.

    Args:
        directory: where to write (created).
        peft_model: the model :func:`add_lora_adapters` returned.
        weights: the wrapped model's full state dict (names as in ``module.state_dict()``), e.g. gathered from FSDP2
            shards; None reads the module's own (unsharded) state dict.
    """
    if weights is None:
        weights = peft_model.base_model.model.state_dict()
    state_dict = {_PEFT_PREFIX + name: tensor for name, tensor in weights.items() if "lora_" in name}
    peft_model.save_pretrained(str(directory), state_dict=state_dict, safe_serialization=True)


def is_lora_adapter_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` looks like a peft adapter directory."""
    return (Path(path) / _ADAPTER_CONFIG).is_file()


class AdaptersOffReference:
    """The reference policy of a LoRA run: the actor's own model with its adapters switched off.

    The base weights are frozen and never change, so the base model *is* the reference policy; running the actor's
    log-prob pass with its adapters off (:meth:`peft.PeftModel.disable_adapter`, or the megatron adapters' own
    switch, :func:`verl.models.mcore.lora.adapters_disabled`) gives it without a second copy of the weights (and,
    under FSDP2, with the same collectives every rank runs). Only :meth:`compute_log_prob` is offered: the reference
    is never trained, checkpointed or sampled from (:meth:`model_module` names the module it runs).

    Args:
        actor: the trained actor; its ``adapters_off()`` gives the switch.
    """

    def __init__(self, actor: Any):
        self.switch = actor.adapters_off()
        assert self.switch is not None, "the reference without adapters needs a LoRA actor"
        self.actor = actor

    def model_module(self) -> Any:
        """The actor's module, which this reference runs."""
        return self.actor.model_module()

    def compute_log_prob(self, data: Any, micro_batching: Any = None, calculate_entropy: bool = False):
        """As the actor's ``compute_log_prob`` (log-probs (B, R), entropy or None), with the adapters off."""
        trainable = [p for p in self.actor.model_module().parameters() if p.requires_grad]
        with self.switch():
            # peft's switch also marks the adapters frozen; they stay trainable here (the pass runs without
            # gradients, and a switched-off adapter is skipped whatever the flag says), because FSDP2 fixes each
            # unit's gradient dtypes at its first forward from the parameters that require gradients then: a first
            # forward in this pass would leave the adapters' fp16 gradients uncast to their fp32 shards
            for param in trainable:
                param.requires_grad_(True)
            return self.actor.compute_log_prob(data, micro_batching, calculate_entropy)


def lora_scalings(module: torch.nn.Module) -> dict[str, float]:
    """``{module name: alpha / rank}`` of every LoRA layer peft put into ``module`` (names as in its state dict)."""
    from peft.tuners.lora import LoraLayer

    return {
        name: float(layer.scaling[_ADAPTER_NAME])
        for name, layer in module.named_modules()
        if isinstance(layer, LoraLayer) and _ADAPTER_NAME in layer.scaling
    }


def merged_lora_weights(
    named_tensors: Iterable[tuple[str, torch.Tensor]], scalings: dict[str, float]
) -> Iterator[tuple[str, torch.Tensor]]:
    """The plain model's weights from a LoRA model's state dict, one tensor at a time: each adapted layer's
    ``W + (alpha / r) B A`` under the layer's own name (``...q_proj.weight``), its base bias as ``...q_proj.bias``,
    the adapters themselves left out, everything else as it is.

    This is what a rollout engine that holds its own weights (vLLM) gets after each update: the merged weights
    under Hugging Face names, through the same sync as full fine-tuning. peft's state dict lists a layer's base
    weight before its ``lora_A`` and ``lora_B``, so only one layer's base weight waits for its adapters at a time.

    Args:
        named_tensors: ``(name, tensor)`` in the module's state-dict order (full tensors, not shards).
        scalings: :func:`lora_scalings` of the module.

    Raises:
        ValueError: an adapted layer's base weight, ``lora_A`` or ``lora_B`` is missing from ``named_tensors``.
    """
    waiting: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in named_tensors:
        layer, _, leaf = name.rpartition(".base_layer.")
        if layer in scalings:
            if leaf == "weight":
                waiting.setdefault(layer, {})["weight"] = tensor.detach().clone()  # the sync may reuse the buffer
            else:
                yield f"{layer}.{leaf}", tensor
            continue
        adapter = _adapter_part(name, scalings)
        if adapter is None:
            yield name, tensor
            continue
        layer, part = adapter
        parts = waiting.setdefault(layer, {})
        parts[part] = tensor.detach().clone()
        if {"weight", "lora_A", "lora_B"} <= parts.keys():
            del waiting[layer]
            delta = parts["lora_B"].float() @ parts["lora_A"].float() * scalings[layer]
            yield f"{layer}.weight", (parts["weight"].float() + delta).to(parts["weight"].dtype)
    if waiting:
        layer, parts = next(iter(waiting.items()))
        raise ValueError(f"LoRA layer {layer} lacks {sorted({'weight', 'lora_A', 'lora_B'} - parts.keys())}.")


def _adapter_part(name: str, scalings: dict[str, float]) -> tuple[str, str] | None:
    """``(layer, "lora_A" | "lora_B")`` for an adapter weight ``<layer>.lora_A.default.weight``; None otherwise."""
    for part in ("lora_A", "lora_B"):
        layer, found, rest = name.partition(f".{part}.")
        if found and layer in scalings:
            return (layer, part) if rest == f"{_ADAPTER_NAME}.weight" else None
    return None
