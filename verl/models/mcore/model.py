"""Build a megatron-core GPTModel from a Hugging Face config and run it to per-token logits.

``build_gpt_model`` brings up megatron's process groups if needed, translates the config, picks a layer spec
(portable on CPU, megatron's TE or local spec on CUDA) and constructs ``GPTModel``. ``forward_logits`` turns the
shared contract's padding mask into megatron's boolean attention mask and returns ``(B, S, V)`` logits;
``make_logits_fn`` wraps it into the ``logits_fn(input_ids, attention_mask, position_ids)`` closure the actors use.

RoPE note: megatron's GPTModel rotates by sequence index ``0 .. S-1`` and ignores ``position_ids``. Under the
shared data layout the real tokens of each row are contiguous, so their positions differ from the contract's
``position_ids`` by a per-row constant, and RoPE attention scores depend only on position differences; pad tokens
are masked out. The logits at real tokens are therefore those of a model that used ``position_ids``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel

from verl.models.mcore.config import build_transformer_config, rope_settings
from verl.models.mcore.layer_spec import (
    PortableOutputLayer,
    PortableRotaryEmbedding,
    get_layer_spec,
    resolve_spec_backend,
)
from verl.models.mcore.parallel import (
    ensure_cuda_rng_tracker,
    ensure_model_parallel_initialized,
    set_model_parallel_seed,
)
from verl.models.mcore.recompute import recompute_on_cpu

LogitsFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _use_portable_rotary(model: GPTModel, hf_config: Any) -> None:
    """Give the model a rotary module that never moves itself to CUDA (same frequencies as the stock one)."""
    rope = rope_settings(hf_config)
    model.rotary_pos_emb = PortableRotaryEmbedding(
        kv_channels=model.config.kv_channels,
        rotary_percent=model.rotary_percent,
        rotary_interleaved=model.config.rotary_interleaved,
        seq_len_interpolation_factor=rope.seq_len_interpolation_factor,
        rotary_base=rope.rotary_base,
        rope_scaling=rope.rope_scaling,
        rope_scaling_factor=rope.rope_scaling_factor,
        cp_group=model.pg_collection.cp,
    )


def build_gpt_model(
    hf_config: Any,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    *,
    tensor_model_parallel_size: int = 1,
    pipeline_model_parallel_size: int = 1,
    spec_backend: str = "auto",
    seed: int | None = None,
    **config_overrides: Any,
) -> GPTModel:
    """Build a megatron-core ``GPTModel`` shaped like the Hugging Face Llama / Qwen2 model of ``hf_config``.

    Weights are freshly initialised (load real ones with ``load_hf_weights_into_mcore``).

    Args:
        hf_config: a ``LlamaConfig`` or ``Qwen2Config``.
        dtype: parameter dtype (torch.float32, torch.float16, torch.bfloat16).
        device: where the model lives; "cpu" uses the portable layer spec.
        tensor_model_parallel_size: megatron tensor-parallel size (megatron groups are created if needed).
        pipeline_model_parallel_size: megatron pipeline-parallel size.
        spec_backend: "auto" (portable off CUDA; TE if installed, else local, on CUDA), "portable", "local", "te".
        seed: if given, seeds the CPU generator (and megatron's CUDA RNG tracker on CUDA) before initialising.
        **config_overrides: extra ``TransformerConfig`` fields.

    Returns:
        The GPTModel on ``device``.

    Raises:
        ValueError: unsupported architecture/dtype, an unknown or unavailable spec backend.
    """
    device = torch.device(device)
    backend = _prepare_to_build(device, spec_backend, tensor_model_parallel_size, pipeline_model_parallel_size, seed)
    config = build_transformer_config(
        hf_config,
        dtype,
        use_cpu_initialization=device.type != "cuda",
        tensor_model_parallel_size=tensor_model_parallel_size,
        pipeline_model_parallel_size=pipeline_model_parallel_size,
        **config_overrides,
    )
    tied = bool(getattr(hf_config, "tie_word_embeddings", False))
    # megatron-core copies a tied embedding to the last pipeline stage through CUDA; off CUDA the copy is made here
    tie_by_hand = tied and pipeline_model_parallel_size > 1 and device.type != "cuda"
    model = _construct(config, hf_config, backend, share_embeddings=tied and not tie_by_hand)
    if tie_by_hand:
        _mark_tied_copies(model)
    _adapt_to_backend(model, hf_config, backend, device)
    # megatron's torch RMSNorm (local spec) ignores params_dtype and stays float32; cast everything to `dtype`
    # as megatron's Float16Module would (the rotary frequencies guard their own float32)
    return model.to(device=device, dtype=dtype)


def _prepare_to_build(device: torch.device, spec_backend: str, tp: int, pp: int, seed: int | None) -> str:
    """Check the device, resolve the layer-spec backend, and set up the parallel groups and RNGs a build needs.

    Returns:
        The resolved spec backend ("portable", "local" or "te").

    Raises:
        ValueError: a CUDA device without CUDA, or an unknown or unavailable spec backend.
    """
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device} was requested but CUDA is not available; use device='cpu'")
    backend = resolve_spec_backend(spec_backend, device)
    ensure_model_parallel_initialized(tp=tp, pp=pp)
    if seed is not None:
        set_model_parallel_seed(seed)
    ensure_cuda_rng_tracker()
    return backend


def _adapt_to_backend(model: GPTModel, hf_config: Any, backend: str, device: torch.device) -> None:
    """Swap in the pieces that let ``model`` run off CUDA: CPU recomputation, portable rotary and logits gather."""
    if device.type != "cuda":
        recompute_on_cpu(model)  # megatron-core's own recomputation needs the CUDA RNG
    if backend == "portable":
        _use_portable_rotary(model, hf_config)
        if getattr(model, "output_layer", None) is not None:
            # megatron's logits gather allocates on CUDA; the portable output layer gathers on any device
            model.output_layer.__class__ = PortableOutputLayer


def _construct(config: Any, hf_config: Any, backend: str, share_embeddings: bool) -> GPTModel:
    """GPTModel for this rank's pipeline stage, with the HF vocabulary, context length, RoPE and tying."""
    rope = rope_settings(hf_config)
    return GPTModel(
        config=config,
        transformer_layer_spec=get_layer_spec(backend),
        vocab_size=hf_config.vocab_size,
        max_sequence_length=hf_config.max_position_embeddings,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=share_embeddings,
        position_embedding_type="rope",
        rotary_base=rope.rotary_base,
        rope_scaling=rope.rope_scaling,
        rope_scaling_factor=rope.rope_scaling_factor,
        seq_len_interpolation_factor=rope.seq_len_interpolation_factor,
    )


def _mark_tied_copies(model: GPTModel) -> None:
    """Tied embeddings over pipeline stages, off CUDA: the first stage's embedding and the last stage's output
    weight are two parameters holding one matrix (the weight converter loads the same values into both). They are
    marked as megatron-core marks its own copies (``shared_embedding`` on both, ``shared`` on the last stage's), so
    that the torch.optim adapter sums their gradients over the embedding group and counts the matrix once in the
    gradient norm, as megatron-core does."""
    if model.pre_process:
        model.embedding.word_embeddings.weight.shared_embedding = True
    if model.post_process:
        model.output_layer.weight.shared_embedding = True
        model.output_layer.weight.shared = True


def build_attention_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """megatron's boolean attention mask (True = masked out) from a padding mask: causal AND key is real.

    A pad query row would otherwise see no key at all (every key before it is padding under left padding), and a
    softmax over nothing is NaN, which poisons gradients even though those rows are never used; so every token
    may always attend to itself.

    Args:
        attention_mask: ``(B, S)`` 1/True for real tokens, 0/False for padding.

    Returns:
        ``(B, 1, S, S)`` bool, True where query ``i`` must not attend to key ``j``.
    """
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must be (batch, seq), got shape {tuple(attention_mask.shape)}")
    seq_len = attention_mask.shape[1]
    device = attention_mask.device
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()
    allowed = causal[None, :, :] & attention_mask.bool()[:, None, :]
    allowed = allowed | torch.eye(seq_len, dtype=torch.bool, device=device)[None]
    return ~allowed[:, None, :, :]


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """Peel megatron/torch wrappers (DDP, Float16Module) that keep the real model in ``.module``."""
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    return model


def forward_logits(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    *,
    fp32: bool = True,
) -> torch.Tensor:
    """Per-token logits of a megatron GPTModel on a padded batch.

    Args:
        model: a GPTModel from ``build_gpt_model`` (optionally wrapped in megatron DDP / Float16Module), holding
            both the first and last pipeline stage.
        input_ids: ``(B, S)`` int64 token ids.
        attention_mask: ``(B, S)`` 1 for real tokens, 0 for padding (left and/or right).
        position_ids: ``(B, S)`` int64 positions (see the module note on RoPE).
        fp32: cast logits to float32 (recommended for log-softmax of half-precision models).

    Returns:
        ``(B, S, V)`` logits over the full vocabulary (gathered across tensor-parallel ranks), float32 when
        ``fp32`` else the model dtype. Rows at pad positions are finite but meaningless.
    """
    inner = unwrap_model(model)
    if not (getattr(inner, "pre_process", True) and getattr(inner, "post_process", True)):
        raise ValueError(
            "forward_logits needs a model holding the whole pipeline (pipeline_model_parallel_size=1); a pipeline "
            "stage runs with verl.models.mcore.pipeline.stage_forward"
        )
    logits = model(**gpt_inputs(input_ids, attention_mask, position_ids))
    return logits.float() if fp32 else logits


def batch_gpt_inputs(batch: Any) -> dict[str, Any]:
    """:func:`gpt_inputs` of a micro-batch's tensors (``input_ids``, ``attention_mask``, ``position_ids``)."""
    return gpt_inputs(batch["input_ids"], batch["attention_mask"], batch["position_ids"])


def gpt_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> dict[str, Any]:
    """A GPTModel's forward arguments for a padded batch: megatron's boolean attention mask, and the whole
    vocabulary's logits on every tensor-parallel rank (the losses and the sampler read all of it)."""
    return {
        "input_ids": input_ids,
        "position_ids": position_ids,
        "attention_mask": build_attention_mask(attention_mask),
        "runtime_gather_output": True,
    }


def make_logits_fn(model: torch.nn.Module, *, fp32: bool = True) -> LogitsFn:
    """The shared-contract closure ``logits_fn(input_ids, attention_mask, position_ids) -> (B, S, V)``.

    Args:
        model: see ``forward_logits``.
        fp32: see ``forward_logits``.

    Returns:
        A callable with the shared ``logits_fn`` signature.
    """

    def logits_fn(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        return forward_logits(model, input_ids, attention_mask, position_ids, fp32=fp32)

    return logits_fn
