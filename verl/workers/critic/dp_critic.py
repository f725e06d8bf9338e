"""The ``dp`` backend's critic: a Hugging Face decoder backbone with a one-wide value head, in plain PyTorch.

:class:`ValueModel` keeps the causal LM's transformer (``model.model`` of a ``*ForCausalLM``; the LM head is
dropped) and puts a ``Linear(hidden, 1)`` on its last hidden states, initialised small and seeded so that the first
values are near zero and runs are reproducible. :class:`DataParallelPPOCritic` runs it under the shared critic loop
on the :class:`~verl.workers.actor.backend.DPBackend`; data parallelism is the optimizer's business, as for the
actor. :func:`build_dp_critic` is what a worker calls.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from transformers import PreTrainedModel

from verl.utils.amp_optimizer import build_amp_optimizer
from verl.utils.cpu_linear import use_onednn_linear
from verl.utils.padding_free import forward_packed
from verl.workers.actor.backend import DPBackend, TrainingBackend
from verl.workers.actor.update_loop import TORCH_DTYPES, build_loop_parts
from verl.workers.config import CriticConfig
from verl.workers.critic.base import DEFAULT_HEAD_INIT_STD, BasePPOCritic, init_value_head_

logger = logging.getLogger(__name__)


class ValueModel(torch.nn.Module):
    """A decoder backbone plus a scalar value head.

    Args:
        backbone: a module called as ``backbone(input_ids=, attention_mask=, position_ids=)`` returning an object
            with ``last_hidden_state`` (B, S, H) (a Hugging Face base model such as ``Qwen2Model``) or that tensor.
        hidden_size: H.
        head_init_std: standard deviation of the head's initial weight (0 gives all-zero initial values).
        seed: seed of the head's initialisation (independent of the global RNG).
    """

    def __init__(
        self, backbone: torch.nn.Module, hidden_size: int, *, head_init_std: float = DEFAULT_HEAD_INIT_STD, seed=1
    ):
        super().__init__()
        self.backbone = backbone
        # padding-free forward passes (critic.model.use_remove_padding; see verl.utils.padding_free)
        self.use_remove_padding = False
        self.value_head = torch.nn.Linear(hidden_size, 1)
        init_value_head_(self.value_head, seed=seed, std=head_init_std)

    @classmethod
    def from_pretrained_lm(
        cls,
        path_or_model: str | torch.nn.Module | None,
        *,
        device: str | torch.device = "cpu",
        head_init_std: float = DEFAULT_HEAD_INIT_STD,
        seed: int = 1,
        trust_remote_code: bool = False,
        config_overrides: Any = None,
        lora: Any = None,
        dtype: torch.dtype = torch.float32,
    ) -> ValueModel:
        """A value model on the backbone of a causal LM (a path, ``None``/"default" for the tiny model, or a module).

        The LM head is discarded; the backbone keeps the LM's weights. Parameters are ``dtype``: float32 (master
        weights; fp16/bf16 run under autocast), or verl's ``critic.model.fsdp_config.model_dtype`` on ``fsdp2``.
        With ``lora`` (the ``critic.model`` section, ``lora_rank > 0``) the LM gets peft's LoRA adapters first and
        its base weights are frozen: the adapters and the fresh value head train.

        Raises:
            ValueError: the module has no config with ``hidden_size``.
        """
        if isinstance(path_or_model, torch.nn.Module):
            lm = path_or_model
        else:
            from verl.models.loading import load_hf_causal_lm

            lm = load_hf_causal_lm(
                path_or_model,
                dtype=dtype,
                device=device,
                trust_remote_code=trust_remote_code,
                config_overrides=config_overrides,
            )
        hidden_size = getattr(getattr(lm, "config", None), "hidden_size", None)
        if hidden_size is None:
            raise ValueError(
                f"{type(lm).__name__} has no config.hidden_size; pass a Hugging Face causal LM (e.g. "
                "Qwen2ForCausalLM) or its path."
            )
        if lora is not None and lora.lora_rank:
            from verl.utils.lora import add_lora_adapters

            add_lora_adapters(lm, lora, key="critic.model")  # in place: the backbone below holds the adapters
        backbone = lm.base_model if isinstance(lm, PreTrainedModel) else getattr(lm, "model", lm)
        model = cls(backbone, int(hidden_size), head_init_std=head_init_std, seed=seed)
        from verl.utils.fsdp_utils import cast_floating_buffers, cast_floating_parameters

        model.to(device=device)
        cast_floating_parameters(model, dtype)  # the buffers (rotary frequencies) stay fp32 whatever the weights are
        cast_floating_buffers(model, torch.float32)
        return model

    def forward(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        """Per-position values.

        Args:
            input_ids, attention_mask, position_ids: (B, S) int64.

        Returns:
            (B, S) values (in the autocast dtype when autocast is on).
        """
        kwargs = {"use_cache": False} if isinstance(self.backbone, PreTrainedModel) else {}
        if self.use_remove_padding:
            hidden = forward_packed(self.backbone, input_ids, attention_mask, position_ids, **kwargs)
        else:
            output = self.backbone(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs
            )
            hidden = getattr(output, "last_hidden_state", output)
        # a tensor of its own, not a view of the head's (B, S, 1) output: FSDP2 hooks the root module's outputs for
        # the backward pass, and an in-place op on a returned view would drop that hook (torch warns on every step)
        return self.value_head(hidden).squeeze(-1).clone()


class DataParallelPPOCritic(BasePPOCritic):
    """PPO critic over a ``torch.nn.Module`` that returns per-position values.

    Args:
        config: the ``critic`` config (per-rank mini-batch size in samples).
        critic_module: called as ``module(input_ids=, attention_mask=, position_ids=)``, returning (B, S) or
            (B, S, 1) values (a :class:`ValueModel`).
        optimizer: an :class:`~verl.utils.amp_optimizer.AmpOptimizer` over the module's parameters.
        lr_scheduler: its LR schedule.
        backend: the training backend (default :class:`~verl.workers.actor.backend.DPBackend`; the FSDP2 critic
            passes its :class:`~verl.workers.actor.backend.FSDPBackend`).
        **loop_parts: ``update_outcome_handler``, ``fault_injector``, ``rank`` (see ``build_loop_parts``).
    """

    def __init__(
        self,
        config: CriticConfig,
        critic_module: torch.nn.Module,
        optimizer,
        lr_scheduler=None,
        *,
        backend: TrainingBackend | None = None,
        **loop_parts,
    ):
        self.critic_module = critic_module
        backend = DPBackend() if backend is None else backend
        super().__init__(config, optimizer, lr_scheduler, backend=backend, **loop_parts)

    def _forward_values(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        values = self.critic_module(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
        return values.squeeze(-1) if values.dim() == 3 else values

    def model_module(self) -> torch.nn.Module:
        return self.critic_module


def build_dp_critic(
    model_path_or_hf_model: str | torch.nn.Module | None,
    critic_config: CriticConfig,
    *,
    total_training_steps: int,
    rank: int = 0,
    process_group: Any = None,
    device: str | torch.device = "cpu",
) -> DataParallelPPOCritic:
    """A ready ``dp`` critic: value model, AdamW (+ fp16 loss scaling per ``critic.dtype``), LR schedule, handler.

    Args:
        model_path_or_hf_model: the LM whose backbone the value model starts from (a path, ``None``/"default", a
            ``*ForCausalLM`` module, or an already built :class:`ValueModel`).
        critic_config: the ``critic`` config, ``ppo_mini_batch_size`` in samples per rank.
        total_training_steps: length of the LR schedule.
        rank: data-parallel rank.
        process_group: the data-parallel group gradients are averaged over (None: the default group, if any).
        device: where the model lives.
    """
    dtype = TORCH_DTYPES[critic_config.dtype]
    if isinstance(model_path_or_hf_model, ValueModel):
        module = model_path_or_hf_model.to(device)
    else:
        module = ValueModel.from_pretrained_lm(
            model_path_or_hf_model,
            device=device,
            seed=critic_config.seed,
            trust_remote_code=critic_config.model.trust_remote_code,
            config_overrides=critic_config.model.override_config,
            lora=critic_config.model,
        )
    if critic_config.model.use_onednn_linear:
        use_onednn_linear(module, device)
    optimizer, scheduler = build_amp_optimizer(
        [p for p in module.parameters() if p.requires_grad],  # LoRA: the adapters and the value head
        critic_config.optim,
        dtype=dtype,
        total_training_steps=total_training_steps,
        process_group=process_group,
    )
    logger.info("dp critic: float32 master weights, %s compute, on %s", dtype, device)
    return DataParallelPPOCritic(
        critic_config, module, optimizer, scheduler, **build_loop_parts(critic_config, rank=rank)
    )
