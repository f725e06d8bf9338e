"""megatron-core model layer: Hugging Face Llama/Qwen2 configs and weights as megatron-core GPTModels.

``build_gpt_model`` makes the model (on CPU with a portable attention/RoPE spec, on CUDA with megatron's own),
``load_hf_weights_into_mcore`` / ``export_mcore_to_hf`` move weights in and out, and ``make_logits_fn`` gives the
shared ``logits_fn(input_ids, attention_mask, position_ids) -> (B, S, V)`` contract.
"""

from verl.models.mcore.config import SUPPORTED_MODEL_TYPES, build_transformer_config, rope_settings
from verl.models.mcore.layer_spec import PortableRotaryEmbedding, SDPACoreAttention, get_layer_spec
from verl.models.mcore.model import build_attention_mask, build_gpt_model, forward_logits, make_logits_fn
from verl.models.mcore.parallel import ensure_model_parallel_initialized, set_model_parallel_seed
from verl.models.mcore.weight_converter import (
    export_mcore_to_hf,
    hf_to_mcore_state_dict,
    load_hf_weights_into_mcore,
    mcore_to_hf_state_dict,
)

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "PortableRotaryEmbedding",
    "SDPACoreAttention",
    "build_attention_mask",
    "build_gpt_model",
    "build_transformer_config",
    "ensure_model_parallel_initialized",
    "export_mcore_to_hf",
    "forward_logits",
    "get_layer_spec",
    "hf_to_mcore_state_dict",
    "load_hf_weights_into_mcore",
    "make_logits_fn",
    "mcore_to_hf_state_dict",
    "rope_settings",
    "set_model_parallel_seed",
]
