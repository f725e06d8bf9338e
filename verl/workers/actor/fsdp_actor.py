"""The ``fsdp2`` backend's actor (alias ``fsdp``): a Hugging Face causal LM sharded with torch FSDP2.

Every rank holds 1/N of the fp32 master weights (verl's ``fsdp_config.model_dtype`` may make them bf16, with bf16
training), of their gradients and of the AdamW state (:func:`verl.utils.fsdp_utils.shard_model`); forward passes
gather one decoder layer at a time and compute in the training dtype through FSDP2's mixed-precision policy
(:func:`model_precision`: verl's ``fsdp_config.mixed_precision`` sets the gather and reduce dtypes). The update
loop, the losses and the optimizer-step contract are the shared ones
(:class:`~verl.workers.actor.update_loop.UpdateLoop`); the step itself is
:class:`~verl.utils.fsdp_optimizer.ShardedAmpOptimizer`, whose verdict every rank agrees on before anyone updates.

What any FSDP2-trained model (actor, critic) changes in the loop is its backend,
:class:`~verl.workers.actor.backend.FSDPBackend`: autocast on the compute device (parameters may sit in CPU memory
under offload) and sharded checkpoints (:mod:`verl.utils.fsdp_checkpoint`), whose save and load are collective:
every rank calls them. :func:`shard_for_training` shards a model and builds its optimizer, for both roles.
:func:`build_fsdp_actor` is what a worker calls; it also builds the frozen reference (no optimizer, no gradients).

Every rank must run the same number of forward passes (each one gathers parameters from all ranks): the data
dispatch gives every rank the same number of rows, and the rollout agrees on when to stop sampling
(:meth:`verl.workers.rollout.naive_rollout.NaiveRollout.synchronize_stop`).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh
from transformers import PreTrainedModel

from verl.models.decoding import IncrementalDecoder
from verl.utils.fsdp_optimizer import build_sharded_amp_optimizer
from verl.utils.fsdp_utils import (
    cast_floating_buffers,
    cast_floating_parameters,
    enable_activation_checkpointing,
    mixed_precision_policy,
    shard_model,
)
from verl.workers.actor.backend import FSDPBackend
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.actor.update_loop import TORCH_DTYPES, build_loop_parts
from verl.workers.config import ActorConfig
from verl.workers.config.precision import FSDPPrecision, fsdp_precision
from verl.workers.config.roles import cpu_offload

logger = logging.getLogger(__name__)


class FSDPPPOActor(DataParallelPPOActor):
    """PPO actor over an FSDP2-sharded causal LM: the ``dp`` actor's forward pass on the
    :class:`~verl.workers.actor.backend.FSDPBackend` (autocast on the mesh's device, sharded checkpoints).

    Args:
        config: the ``actor_rollout_ref.actor`` config (per-rank mini-batch size in samples).
        actor_module: the sharded module, called as ``module(input_ids=, attention_mask=, position_ids=)``,
            returning logits (B, S, V) or an object with ``.logits``.
        optimizer: a :class:`~verl.utils.fsdp_optimizer.ShardedAmpOptimizer` (None: a frozen reference).
        lr_scheduler: its LR schedule.
        mesh: the data-parallel mesh the module is sharded over.
        use_remove_padding: run forward passes on the packed real tokens (``model.use_remove_padding``; see
            :mod:`verl.utils.padding_free`). Each rank packs its own rows; the collectives do not depend on the
            packed length, so ranks may pack to different lengths.
        offload_activations: keep what each update's forward pass saves for its backward pass in CPU memory
            (``model.enable_activation_offload``; :class:`~verl.workers.actor.backend.FSDPBackend`).
        compile_entropy: compute the entropy with ``torch.compile`` (verl's ``fsdp_config.use_torch_compile``:
            :func:`~verl.utils.torch_functional.compiled_entropy`) where the logits path computes one.
        **loop_parts: ``update_outcome_handler``, ``fault_injector``, ``rank`` (see :func:`build_loop_parts`).
    """

    training_path = "fsdp2"

    def __init__(
        self,
        config: ActorConfig,
        actor_module: torch.nn.Module,
        optimizer=None,
        lr_scheduler=None,
        *,
        mesh: DeviceMesh,
        use_remove_padding: bool = False,
        offload_activations: bool = False,
        compile_entropy: bool = False,
        **loop_parts,
    ):
        # a Hugging Face model also gets a Hugging Face export with each checkpoint
        backend = FSDPBackend(
            mesh, hf_export=isinstance(actor_module, PreTrainedModel), offload_activations=offload_activations
        )
        self.compile_entropy = compile_entropy
        if config.use_fused_kernels:
            # the fused head's backward reads the gathered output projection, outside the root's own outputs whose
            # backward hook would gather it again: keep the root's parameters gathered from forward to backward (what
            # FSDP2 does for a root by default; the decoder layers still reshard)
            actor_module.set_reshard_after_forward(False, recurse=False)
        super().__init__(
            config,
            actor_module,
            optimizer,
            lr_scheduler,
            use_remove_padding=use_remove_padding,
            backend=backend,
            **loop_parts,
        )

    def _entropy_options(self) -> dict[str, bool]:
        return {**super()._entropy_options(), "entropy_compiled": self.compile_entropy}

    def incremental_decoder(self) -> IncrementalDecoder:
        """On one rank the shards are the whole weights: the rollout decodes on a plain copy of the model that
        shares them (:class:`OneRankPlainDecoder`), with the ``dp`` backend's lean decode step. On more ranks each
        forward gathers one layer at a time, as in training (the Hugging Face decoder through FSDP2's hooks)."""
        if self.backend.mesh.size() == 1 and isinstance(self.actor_module, PreTrainedModel):
            return OneRankPlainDecoder(self.actor_module, self.autocast)
        return super().incremental_decoder()


class OneRankPlainDecoder(IncrementalDecoder):
    """Decoding for an FSDP2 model sharded over one rank, on a plain (unsharded) copy of its Hugging Face class.

    An FSDP2 module gathers its weights only inside its own forward, through hooks on every wrapped layer, so the
    lean decode step (:class:`~verl.models.llama_decode.LlamaFamilyDecoder`, which computes each decode step from the
    weights directly) cannot run on it. On one rank each shard is a whole parameter: at each call's prefill the
    plain copy takes those very tensors (no copy; a LoRA model's adapted layers are merged,
    :func:`verl.utils.lora.merged_lora_weights`), and the call decodes on it as the ``dp`` backend does, in the same
    autocast; :meth:`release` drops them.

    Args:
        sharded: the FSDP2-sharded Hugging Face causal LM (one rank).
        autocast: the actor's mixed-precision context factory.
    """

    def __init__(self, sharded: PreTrainedModel, autocast):
        from transformers import AutoModelForCausalLM

        self.sharded = sharded
        self.autocast = autocast
        with torch.device("meta"):
            self.plain = AutoModelForCausalLM.from_config(
                sharded.config, attn_implementation=sharded.config._attn_implementation
            )
        self.plain.eval()
        from verl.utils.cpu_linear import OneDNNLinear

        self.onednn = any(isinstance(m, OneDNNLinear) for m in sharded.modules())
        self.inner: IncrementalDecoder | None = None

    def _load_plain_weights(self) -> None:
        from verl.utils.fsdp_utils import local_tensor
        from verl.utils.lora import lora_scalings, merged_lora_weights

        weights = ((name, local_tensor(tensor)) for name, tensor in self.sharded.state_dict().items())
        scalings = lora_scalings(self.sharded)
        if scalings:
            weights = merged_lora_weights(weights, scalings)
        self.plain.load_state_dict(dict(weights), assign=True)
        # buffers outside the state dict (the rotary frequencies) are the sharded model's own, whole on every rank
        for name, buffer in self.sharded.named_buffers():
            owner, _, leaf = name.rpartition(".")
            self.plain.get_submodule(owner).register_buffer(leaf, buffer, persistent=False)
        if self.onednn:  # the same linear kernels as the training forward (verl.utils.cpu_linear)
            from verl.utils.cpu_linear import use_onednn_linear

            use_onednn_linear(self.plain, next(self.plain.parameters()).device)

    def prefill(self, input_ids, attention_mask, position_ids, max_new_tokens):
        from verl.models.decoding import HFCachedDecoder
        from verl.models.llama_decode import LlamaFamilyDecoder, supports_llama_decode

        self._load_plain_weights()
        decoder = LlamaFamilyDecoder if supports_llama_decode(self.plain) else HFCachedDecoder
        self.inner = decoder(self.plain, self.autocast)
        return self.inner.prefill(input_ids, attention_mask, position_ids, max_new_tokens)

    def decode(self, tokens, attention_mask, position_ids):
        return self.inner.decode(tokens, attention_mask, position_ids)

    def keep_rows(self, rows):
        self.inner.keep_rows(rows)

    def release(self):
        if self.inner is not None:
            self.inner.release()
            self.inner = None
        self.plain.to_empty(device="meta")  # the shared tensors (or a LoRA run's merged ones) are let go


def model_precision(config, fsdp_config, *, trainable: bool, key: str) -> FSDPPrecision:
    """The dtypes of an FSDP2 model (:func:`~verl.workers.config.precision.fsdp_precision`): ``config.dtype`` as the
    compute dtype, ``fsdp_config``'s ``model_dtype`` and ``mixed_precision``.

    Raises:
        ValueError: a combination the precision contract refuses (also refused at start-up).
    """
    # the reference computes in the actor's dtype: its config is the actor's section
    return fsdp_precision(config.dtype, fsdp_config, trainable=trainable, key=key, dtype_key=f"{config.KEY}.dtype")


def _warn_if_coarser_than_compute(precision: FSDPPrecision, key: str, trainable: bool) -> None:
    """Warn when a trained model keeps bf16 master weights under another compute dtype (updates rounded to bf16), and
    when the weights are gathered in bf16 for an fp16 forward (a mismatch with an fp16 rollout engine)."""
    if trainable and precision.master_coarser_than_compute:
        logger.warning(
            "%s.model_dtype=bf16 with %s compute: the master weights and AdamW's moments are bf16, so updates smaller "
            "than bf16's resolution (about 0.4%% of a weight) are rounded away, as in verl; the forward and backward "
            "compute in %s%s. model_dtype=fp32 keeps full-precision master weights",
            key,
            precision.compute,
            precision.compute,
            " with the dynamic loss scale" if precision.compute == "float16" else "",
        )
    if precision.gathers_coarser_than_compute:
        logger.warning(
            "%s.mixed_precision.param_dtype=bf16 with dtype=float16: the weights are rounded to bf16 before each fp16 "
            "forward, which an fp16 rollout engine does not do (the training/rollout_probs_diff metrics show it); "
            "leave param_dtype null to gather in fp16",
            key,
        )


def shard_for_training(module, config, fsdp_config, *, mesh, total_training_steps, wrap_class_names, key, trainable):
    """Shard ``module`` per ``fsdp_config`` and, when ``trainable``, build its sharded AdamW and LR schedule.

    Args:
        module: the model, in CPU memory or on the mesh device; its floating-point parameters are cast to
            ``fsdp_config.model_dtype`` (fp32 when null) and its buffers to ``mixed_precision.buffer_dtype`` here,
            before sharding (the workers' loaders already load in ``model_dtype``).
        config: the trained model's section (actor or critic): its ``dtype`` and ``optim``.
        fsdp_config: ``param_offload``, ``reshard_after_forward``, the precision keys (and ``optimizer_offload`` when
            trainable).
        mesh: the data-parallel mesh.
        total_training_steps: length of the LR schedule.
        wrap_class_names: ``wrap_policy.transformer_layer_cls_to_wrap``.
        key: the ``fsdp_config`` section's full key, for messages.
        trainable: False shards a frozen model and builds no optimizer.

    Returns:
        (optimizer, lr_scheduler), both None for a frozen model.

    Raises:
        ValueError: the precision keys contradict the role's ``dtype`` (:func:`model_precision`).
    """
    precision = model_precision(config, fsdp_config, trainable=trainable, key=key)
    dtype = TORCH_DTYPES[precision.compute]
    _warn_if_coarser_than_compute(precision, key, trainable)
    # the loaders already load in model_dtype (no fp32 copy of a large model first); a module handed in is cast here
    cast_floating_parameters(module, TORCH_DTYPES[precision.model])
    cast_floating_buffers(module, TORCH_DTYPES[precision.buffer])
    shard_model(
        module,
        mesh=mesh,
        dtype=dtype,
        reshard_after_forward=fsdp_config.reshard_after_forward,
        param_offload=cpu_offload(fsdp_config),
        wrap_class_names=wrap_class_names,
        key=key,
        forward_prefetch=fsdp_config.forward_prefetch,
        mp_policy=mixed_precision_policy(
            dtype, param_dtype=TORCH_DTYPES[precision.param], reduce_dtype=TORCH_DTYPES[precision.reduce]
        ),
    )
    if not trainable:
        return None, None
    logger.info("fsdp2: %s master shards over %d rank(s), %s compute (%s)", precision.model, mesh.size(), dtype, key)
    return build_sharded_amp_optimizer(
        module,
        config.optim,
        mesh=mesh,
        dtype=dtype,
        total_training_steps=total_training_steps,
        optimizer_offload=fsdp_config.optimizer_offload,
        param_offload=cpu_offload(fsdp_config),
        key=key,
    )


def build_fsdp_actor(
    config: ActorConfig,
    module: torch.nn.Module,
    *,
    mesh: DeviceMesh,
    total_training_steps: int,
    trainable: bool = True,
    fsdp_config: Any = None,
    enable_gradient_checkpointing: bool = False,
    use_remove_padding: bool = False,
    enable_activation_offload: bool = False,
    rank: int = 0,
) -> FSDPPPOActor:
    """Shard ``module`` (on the CPU or the mesh device) with FSDP2 and build the actor around it.

    Args:
        config: the actor config; its ``fsdp_config`` gives the wrap policy and the optimizer offload.
        module: the Hugging Face causal LM (or any module returning logits); its parameters are cast to the
            ``model_dtype`` of its ``fsdp_config`` (fp32 when null) before sharding.
        mesh: the data-parallel mesh (:func:`verl.utils.fsdp_utils.device_mesh`).
        total_training_steps: length of the LR schedule.
        trainable: False gives a frozen reference: no optimizer, no handler, no gradients.
        fsdp_config: the section with ``param_offload`` and ``reshard_after_forward`` (default
            ``config.fsdp_config``; the reference passes ``actor_rollout_ref.ref.fsdp_config``).
        enable_gradient_checkpointing: recompute activations in the backward pass (trainable models only).
        use_remove_padding: padding-free forward passes (``actor_rollout_ref.model.use_remove_padding``).
        enable_activation_offload: keep the update's saved activations in CPU memory (trainable models only).
        rank: data-parallel rank.

    The entropy is computed with ``torch.compile`` when ``fsdp_config.use_torch_compile`` says so.
    """
    fsdp_config = config.fsdp_config if fsdp_config is None else fsdp_config
    if not trainable:
        module.eval().requires_grad_(False)
    elif enable_gradient_checkpointing:
        enable_activation_checkpointing(module)
    optimizer, scheduler = shard_for_training(
        module,
        config,
        fsdp_config,
        mesh=mesh,
        total_training_steps=total_training_steps,
        wrap_class_names=config.fsdp_config.wrap_policy.transformer_layer_cls_to_wrap,
        key=f"{ActorConfig.KEY}.fsdp_config" if trainable else "actor_rollout_ref.ref.fsdp_config",
        trainable=trainable,
    )
    shared = {"mesh": mesh, "use_remove_padding": use_remove_padding, "compile_entropy": fsdp_config.use_torch_compile}
    if not trainable:
        return FSDPPPOActor(config, module, rank=rank, **shared)
    loop_parts = build_loop_parts(config, rank=rank)
    return FSDPPPOActor(
        config, module, optimizer, scheduler, offload_activations=enable_activation_offload, **shared, **loop_parts
    )
