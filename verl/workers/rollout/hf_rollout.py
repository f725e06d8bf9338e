"""The ``hf`` rollout: responses from ``transformers`` ``generate`` on a Hugging Face causal LM.

Generation uses the model's own KV cache, so it is the faster choice for ``dp`` training of HF models. The
options are the same as the naive rollout's: prompts are repeated interleaved on our side (one repetition rule for
both rollouts) and ``generate`` then runs with ``max_new_tokens = response_length``. The generation config is
built explicitly and switches off the penalties and warpers a checkpoint's ``generation_config.json`` may set
(repetition penalty, min length, typical-p, ...), because the trainer recomputes log-probs from plain softmaxed
logits and any extra warper would make rollout and trainer disagree. A seed seeds a private generator from which
each call draws the seed of a forked random state, so seeded runs are reproducible per call order without
touching torch's global random state; that generator's state is the rollout's ``state_dict``, so a resumed run
continues the same per-call seeds. The output goes through the shared post-processing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from omegaconf import DictConfig

from verl.workers.rollout.base import SamplingParams, SeedSourceRollout, register_rollout
from verl.workers.rollout.sampling import sampled_token_log_probs

__all__ = ["HFRollout"]


def _generation_kwargs(params: SamplingParams, pad_token_id: int, eos_ids: list[int]) -> dict[str, Any]:
    """Keyword values of the ``GenerationConfig`` for one call; neutral values for everything we do not use."""
    kwargs: dict[str, Any] = {
        "max_new_tokens": params.response_length,
        "min_new_tokens": 0,
        "do_sample": not params.greedy,
        "num_beams": 1,
        "num_return_sequences": 1,
        "pad_token_id": pad_token_id,
        "eos_token_id": eos_ids,
        "repetition_penalty": 1.0,
        "no_repeat_ngram_size": 0,
        "use_cache": True,
        "return_dict_in_generate": True,
        "output_logits": True,  # the raw logits of each step: the engine's log-probs of its own tokens
    }
    if not params.greedy:
        kwargs.update(
            temperature=float(params.temperature),
            # 0 is transformers' "off" for top-k
            top_k=max(int(params.top_k), 0),
            top_p=float(params.top_p),
            typical_p=1.0,
            epsilon_cutoff=0.0,
            eta_cutoff=0.0,
        )
    return kwargs


class _TokenObserver:
    """A stopping criterion of ``generate`` that never stops: it tells ``observer`` the index of the response token
    about to be produced (``generate`` asks its criteria after every token)."""

    def __init__(self, observer: Callable[[int], None], prompt_length: int, response_length: int):
        self.observer, self.prompt_length, self.response_length = observer, prompt_length, response_length

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        index = input_ids.shape[1] - self.prompt_length
        if index < self.response_length:  # after the last token there is none to come
            self.observer(index)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


@register_rollout("hf")
class HFRollout(SeedSourceRollout):
    """Sample responses with ``module.generate``.

    Args:
        module: a ``transformers`` causal LM (anything with ``generate`` and ``generation_config``).
        config: the sampling options (``RolloutConfig.sampling_options()``) or a config with all of them; see
            :class:`~verl.workers.rollout.base.SamplingParams` for the keys used.
        pad_token_id: id written after a row's eos and in right padding.
        eos_token_id: one eos id or a list of them.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        config: SamplingParams | DictConfig | Mapping[str, Any],
        pad_token_id: int,
        eos_token_id: int | Sequence[int],
    ):
        if not hasattr(module, "generate"):
            raise ValueError(
                f"HFRollout needs a transformers causal LM with .generate(), got {type(module).__name__}; "
                "use the 'naive' rollout for other models."
            )
        super().__init__(config, pad_token_id, eos_token_id)
        self.module = module

    def _generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, params: SamplingParams) -> torch.Tensor:
        from transformers import GenerationConfig, StoppingCriteriaList

        generation_config = GenerationConfig(**_generation_kwargs(params, self.pad_token_id, self.eos_ids))
        observers = []
        if self.token_observer is not None:
            self.token_observer(0)
            observers.append(_TokenObserver(self.token_observer, input_ids.shape[1], params.response_length))
        was_training = self.module.training
        self.module.eval()
        try:
            return self.module.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=generation_config,
                stopping_criteria=StoppingCriteriaList(observers),
            )
        finally:
            self.module.train(was_training)

    def _generate_tokens(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, params: SamplingParams
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run ``generate``, under a forked random state seeded from the seed source when seeded and sampling.

        Args:
            input_ids: (B*n, P) prompt ids, left-padded.
            attention_mask: (B*n, P) prompt mask.
            params: the sampling options of this call.

        Returns:
            (B*n, L) generated tokens (the prompt part cut off), L <= R, and their (B*n, L) log-probs under the
            model's raw logits at the sampling temperature.
        """
        seeds = None if params.greedy else self.draw_seeds(1, 2**62)
        if seeds is None:
            output = self._generate(input_ids, attention_mask, params)
        else:
            (call_seed,) = seeds
            devices = [input_ids.device] if input_ids.device.type == "cuda" else []
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(call_seed)
                output = self._generate(input_ids, attention_mask, params)
        tokens = output.sequences[:, input_ids.shape[1] :]
        log_probs = [
            sampled_token_log_probs(step_logits, tokens[:, t], params) for t, step_logits in enumerate(output.logits)
        ]
        return tokens, torch.stack(log_probs, dim=-1)
