"""The ``dp`` backend's actor: a Hugging Face causal LM (or any module returning logits) in plain PyTorch.

Data parallelism is the optimizer's business (:class:`verl.utils.amp_optimizer.AmpOptimizer` averages gradients
over the process group before it checks them), so this class only says how to run the model forward and which
backend trains it (:class:`~verl.workers.actor.backend.DPBackend`); the loop, the losses and the optimizer-step
contract live in :class:`~verl.workers.actor.update_loop.UpdateLoop` and :class:`~verl.workers.actor.base.BasePPOActor`.
:func:`build_dp_actor` is what a worker calls.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch
from transformers import PreTrainedModel

from verl.models.decoding import HFCachedDecoder, IncrementalDecoder
from verl.models.llama_decode import LlamaFamilyDecoder, supports_llama_decode
from verl.utils.amp_optimizer import build_amp_optimizer
from verl.utils.kernel import response_log_probs_from_hidden
from verl.utils.padding_free import Packed, forward_packed, pack, unpack, uses_flash_attention
from verl.workers.actor.backend import DPBackend, TrainingBackend
from verl.workers.actor.base import BasePPOActor
from verl.workers.actor.update_loop import TORCH_DTYPES, build_loop_parts
from verl.workers.config import ActorConfig

logger = logging.getLogger(__name__)


class DataParallelPPOActor(BasePPOActor):
    """PPO actor over a ``torch.nn.Module``.

    Args:
        config: the ``actor_rollout_ref.actor`` config (per-rank mini-batch size in samples).
        actor_module: a module called as ``module(input_ids=, attention_mask=, position_ids=)`` returning logits
            (B, S, V) or an object with ``.logits`` (Hugging Face models).
        optimizer: an :class:`~verl.utils.amp_optimizer.AmpOptimizer` over the module's parameters (None: frozen).
        lr_scheduler: its LR schedule.
        use_remove_padding: run forward passes on the packed real tokens (``model.use_remove_padding``; see
            :mod:`verl.utils.padding_free`).
        backend: the training backend (default :class:`~verl.workers.actor.backend.DPBackend`; the FSDP2 actor
            passes its :class:`~verl.workers.actor.backend.FSDPBackend`).
        **loop_parts: ``update_outcome_handler``, ``fault_injector``, ``rank`` (see :func:`build_loop_parts`).
    """

    #: The ``peft.PeftModel`` around ``actor_module`` when it trains LoRA adapters (:mod:`verl.utils.lora`), set
    #: by the worker; checkpoints then also write the adapter directory, and the reference is the adapters off.
    peft_model = None

    def adapters_off(self):
        return None if self.peft_model is None else self.peft_model.disable_adapter

    def __init__(
        self,
        config: ActorConfig,
        actor_module: torch.nn.Module,
        optimizer=None,
        lr_scheduler=None,
        use_remove_padding: bool = False,
        backend: TrainingBackend | None = None,
        **loop_parts,
    ):
        self.actor_module = actor_module
        self.use_remove_padding = use_remove_padding
        backend = DPBackend() if backend is None else backend
        super().__init__(config, optimizer, lr_scheduler, backend=backend, **loop_parts)
        self._call_module = self.actor_module
        if config.use_torch_compile:
            self._call_module = CompiledModuleCall(self.actor_module)
        self._fused_request: _FusedRequest | None = None
        if config.use_fused_kernels:
            _hidden_state_module(actor_module).register_forward_hook(self._fused_head_hook)

    def forward_logits(self, input_ids, attention_mask, position_ids, logits_to_keep: int = 0) -> torch.Tensor:
        kwargs = {"use_cache": False} if isinstance(self.actor_module, PreTrainedModel) else {}
        if self.use_remove_padding:
            return forward_packed(self._call_module, input_ids, attention_mask, position_ids, **kwargs)
        # a Hugging Face model projects only the last logits_to_keep positions onto the vocabulary (0: all); the
        # compiled call takes them all (its graph would specialise on the count)
        if logits_to_keep and kwargs and not self.config.use_torch_compile:
            kwargs["logits_to_keep"] = logits_to_keep
        output = self._call_module(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs
        )
        return getattr(output, "logits", output)

    def forward_response_logits(self, input_ids, attention_mask, position_ids, response_length):
        # the prompt's logits are never read (packed rows, use_remove_padding, still take the whole sequence)
        return self.forward_logits(input_ids, attention_mask, position_ids, logits_to_keep=response_length + 1)

    def forward_response_log_probs(
        self, input_ids, attention_mask, position_ids, response_length, temperature, calculate_entropy
    ):
        # The chunked head runs inside the model's own call (a hook on its decoder), where a sharded model's output
        # projection is gathered; the model itself computes the logits of one position only (logits_to_keep=1).
        packed = None
        if self.use_remove_padding:
            packed = pack(
                input_ids, attention_mask, position_ids, block_mask=not uses_flash_attention(self.actor_module)
            )
            call_ids, call_mask, call_pos = packed.input_ids, packed.attention_mask, packed.position_ids
        else:
            call_ids, call_mask, call_pos = input_ids, attention_mask, position_ids
        request = _FusedRequest(input_ids, response_length, temperature, calculate_entropy, packed)
        self._fused_request = request
        try:
            self._call_module(
                input_ids=call_ids, attention_mask=call_mask, position_ids=call_pos, use_cache=False, logits_to_keep=1
            )
        finally:
            self._fused_request = None
        assert request.result is not None, "the decoder's forward hook did not run"
        return request.result

    @torch._dynamo.disable
    def _fused_head_hook(self, module, args, output) -> None:
        request = self._fused_request
        if request is None:  # a call outside forward_response_log_probs (the rollout's decoding)
            return
        hidden = output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]
        if request.packed is not None:
            hidden = unpack(hidden, request.packed)
        weight = self.actor_module.get_output_embeddings().weight
        request.result = response_log_probs_from_hidden(
            hidden,
            weight,
            request.input_ids,
            request.response_length,
            request.temperature,
            request.calculate_entropy,
        )

    def model_module(self) -> torch.nn.Module:
        return self.actor_module

    def incremental_decoder(self) -> IncrementalDecoder:
        """A Hugging Face model decodes on its own key/value cache (Llama-family models on the lean decode step of
        :mod:`verl.models.llama_decode`); any other module re-runs the sequence."""
        if supports_llama_decode(self.actor_module):
            return LlamaFamilyDecoder(self.actor_module, self.autocast)
        if isinstance(self.actor_module, PreTrainedModel):
            return HFCachedDecoder(self.actor_module, self.autocast)
        return super().incremental_decoder()


@dataclasses.dataclass
class _FusedRequest:
    """What the fused head computes in the current forward pass, and (after it) its result."""

    input_ids: torch.Tensor
    response_length: int
    temperature: float
    calculate_entropy: bool
    packed: Packed | None
    result: tuple[torch.Tensor, torch.Tensor | None] | None = None


def _hidden_state_module(module: torch.nn.Module) -> torch.nn.Module:
    """The decoder whose output (the last hidden states) feeds ``module``'s output projection, for
    ``model.use_fused_kernels``.

    Raises:
        ValueError: ``module`` is not a Hugging Face causal LM with a bias-free linear output projection.
    """
    head = module.get_output_embeddings() if isinstance(module, PreTrainedModel) else None
    if head is None or not isinstance(getattr(head, "weight", None), torch.Tensor) or head.weight.dim() != 2:
        raise ValueError(
            f"actor_rollout_ref.model.use_fused_kernels=true needs a Hugging Face causal LM with a linear output "
            f"projection (get_output_embeddings()); {type(module).__name__} has none. Set it to false."
        )
    if getattr(head, "bias", None) is not None:
        raise ValueError(
            f"actor_rollout_ref.model.use_fused_kernels=true: the output projection of {type(module).__name__} has a "
            "bias, which the chunked log-prob kernel does not add. Set use_fused_kernels=false."
        )
    return module.get_decoder()


class CompiledModuleCall:
    """``module``'s call under ``torch.compile(dynamic=True)`` (``actor.use_torch_compile``).

    ``dynamic=True`` compiles one graph whose sequence length and batch size are symbols: micro-batches of other
    sizes, the padding trimmed to each batch's longest prompt and response, and packed rows of any length then reuse
    it instead of recompiling per shape (``torch._dynamo.config.recompile_limit`` would otherwise cut in after 8
    shapes and fall back to eager). Two more shape guards are avoided here: inputs are made contiguous (the trimmed
    batches are column slices, whose strides would be guarded), and duck sizing is off (a batch whose size equals
    its length would otherwise compile a graph for that equality). What remains is one graph per grad mode (the
    log-prob passes run without gradients, the update with). The module itself is left as is (its state dict, its
    rollout decoding); only the actor's forward passes go through this call. Under FSDP2 the per-unit gather hooks
    stay outside the graphs (Dynamo does not trace them), so each decoder layer is compiled between them.
    """

    def __init__(self, module: torch.nn.Module):
        self.module = module
        self._compiled = torch.compile(module, dynamic=True, backend=COMPILE_BACKEND)

    @property
    def config(self):
        """The module's Hugging Face config (read by :func:`verl.utils.padding_free.forward_packed`)."""
        return getattr(self.module, "config", None)

    def __call__(self, **kwargs):
        kwargs = {k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        with torch.fx.experimental._config.patch(use_duck_shape=False):
            return self._compiled(**kwargs)


# torch.compile's default backend; tests use a cheaper one to count compilations
COMPILE_BACKEND = "inductor"


def build_dp_actor(
    config: ActorConfig,
    module: torch.nn.Module,
    *,
    total_training_steps: int,
    trainable: bool = True,
    rank: int = 0,
    process_group: Any = None,
    use_remove_padding: bool = False,
) -> DataParallelPPOActor:
    """A ready ``dp`` actor over ``module`` (fp32 master weights): AdamW, LR schedule, handler, fire drill.

    ``trainable=False`` gives a frozen reference: no optimizer, no handler, no gradients.
    """
    if not trainable:
        module.eval().requires_grad_(False)
        return DataParallelPPOActor(config, module, rank=rank, use_remove_padding=use_remove_padding)
    dtype = TORCH_DTYPES[config.dtype]
    optimizer, scheduler = build_amp_optimizer(
        # frozen parameters (a LoRA model's base weights) get no optimizer state
        [p for p in module.parameters() if p.requires_grad],
        config.optim,
        dtype=dtype,
        total_training_steps=total_training_steps,
        process_group=process_group,
    )
    logger.info("dp actor: float32 master weights, %s compute", dtype)
    return DataParallelPPOActor(
        config,
        module,
        optimizer,
        scheduler,
        use_remove_padding=use_remove_padding,
        **build_loop_parts(config, rank=rank),
    )
