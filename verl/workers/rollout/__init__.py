"""Rollouts: generate responses for prompts, chosen by ``actor_rollout_ref.rollout.name``.

Three rollouts are registered on import: ``hf`` (``transformers`` ``generate`` on a Hugging Face causal LM),
``naive`` (a backend-agnostic sampler over any ``logits_fn(input_ids, attention_mask, position_ids)``, which is
what the megatron backend uses) and ``vllm`` (a colocated ``vllm.LLM`` with its own copy of the weights, synced
after every update; registered even where the ``vllm`` package is not installed). All produce the shared rollout
layout through one post-processing helper.
Register your own with ``@register_rollout("name")`` on a :class:`BaseRollout` subclass.
"""

from verl.workers.rollout.base import (
    ROLLOUT_REGISTRY,
    BaseRollout,
    SamplingParams,
    get_rollout_cls,
    list_rollouts,
    register_rollout,
)
from verl.workers.rollout.hf_rollout import HFRollout
from verl.workers.rollout.naive_rollout import NaiveRollout
from verl.workers.rollout.postprocess import build_rollout_output, compute_position_ids, mask_after_eos
from verl.workers.rollout.vllm_rollout import VLLMRollout

__all__ = [
    "ROLLOUT_REGISTRY",
    "BaseRollout",
    "HFRollout",
    "NaiveRollout",
    "SamplingParams",
    "VLLMRollout",
    "build_rollout_output",
    "compute_position_ids",
    "get_rollout_cls",
    "list_rollouts",
    "mask_after_eos",
    "register_rollout",
]
