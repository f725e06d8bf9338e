"""The trainer's validation: responses to the validation prompts, scored, with verl's validation metrics.

:class:`ValidationMixin` is a part of :class:`~verl.trainer.ppo.ray_trainer.RayPPOTrainer`; it reads the trainer's
``config``, ``val_batches``, ``rollout_source`` (which group answers, with which weights), ``score``,
``tokenizer``, ``tracker`` and ``global_step``.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from typing import Any

import numpy as np
import torch

from verl.protocol import DataProto
from verl.trainer.ppo.metric_utils import validation_metrics


class ValidationMixin:
    """:meth:`validate` of the trainer."""

    def validate(self) -> dict[str, float]:
        """Responses to the validation prompts sampled with ``actor_rollout_ref.rollout.val_kwargs`` (greedy by
        default), scored.

        Returns ``val/score/mean`` and verl's validation metrics (:func:`process_validation_metrics`, per data
        source): ``val-core/<source>/<var>/mean@N`` (and ``best@N`` / ``maj@N``) for the core variable (``acc``
        when the scorer returns it, else ``reward``, the score), ``val-aux/...`` for the rest. With
        ``trainer.log_val_generations: N`` the first N samples (prompt, response, score) go to the tracker. With a
        rollout group of its own, also which weights answered (``val/weight_version``, ``val/steps_behind``).
        """
        val_kwargs = self.config.actor_rollout_ref.rollout.val_kwargs
        num_samples = self.config.trainer.log_val_generations if self.tokenizer is not None else 0
        samples: list[dict[str, Any]] = []
        scores, sources, uids = [], [], []
        infos: dict[str, list] = defaultdict(list)
        weights: dict[str, float] = {}
        for prompts in self.val_batches:
            non_tensors = dict(prompts.non_tensor_batch)
            non_tensors["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(prompts))], dtype=object)
            prompts = DataProto.from_dict(
                tensors=dict(prompts.batch.items()),
                non_tensors=non_tensors,
                meta_info=val_kwargs.as_overrides(),  # n, do_sample, temperature, top_k, top_p
            )
            output, weights = self.rollout_source.validation_samples(prompts)
            score = self.score(output, validation=True).sum(-1)
            scores.append(score)
            if len(samples) < num_samples:
                samples += decoded_samples(self.tokenizer, output, score, num_samples - len(samples))
            infos["reward"].extend(score.tolist())
            for key in output.meta_info.get("reward_extra_keys", ()):  # what the scorer returned besides the score
                infos[key].extend(output.non_tensor_batch[key].tolist())
            uids.extend(output.non_tensor_batch["uid"].tolist())
            sources.extend(output.non_tensor_batch.get("data_source", np.full(len(output), "unknown")).tolist())
        metrics = {"val/score/mean": torch.cat(scores).mean().item(), **weights}
        metrics.update(validation_metrics(sources, uids, dict(infos)))
        if samples and self.tracker is not None:
            # the same first prompts at every validation, so that their answers can be compared as training goes
            self.tracker.log_generations(samples, step=self.global_step)
        return metrics


def decoded_samples(tokenizer, output: DataProto, scores: torch.Tensor, limit: int) -> list[dict[str, Any]]:
    """The first ``limit`` samples of a generation output as text: ``{"input", "output", "score"}``.

    The prompt is the left-padded ``prompts`` tensor without its padding, the response the ``responses`` tensor
    up to its last valid token (the masks are the attention mask's prompt and response parts); special tokens
    are skipped, as the reward manager decodes.
    """
    prompts, responses = output.batch["prompts"], output.batch["responses"]
    attention = output.batch["attention_mask"].bool()
    prompt_mask, response_mask = attention[:, : prompts.shape[1]], attention[:, prompts.shape[1] :]
    samples = []
    for i in range(min(limit, len(output))):
        samples.append(
            {
                "input": tokenizer.decode(prompts[i][prompt_mask[i]].tolist(), skip_special_tokens=True),
                "output": tokenizer.decode(responses[i][response_mask[i]].tolist(), skip_special_tokens=True),
                "score": float(scores[i]),
            }
        )
    return samples
