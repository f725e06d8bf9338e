"""The rollout role: responses sampled from a policy on one rank.

The actor workers host one when the rollout lives with the actor (``hybrid_engine=true``: it samples from the
actor's own model, or from an engine kept in step with it), the rollout workers of a group of their own host one over
a frozen copy of the policy. The role holds the rollout (``naive``, ``hf`` or a ``vllm`` engine of its own) and the
module it samples from; the hosting worker wraps its calls in its own phases (profiling, megatron's offloading).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from verl.protocol import DataProto
from verl.workers.config import ActorRolloutRefConfig
from verl.workers.config.rollout import RolloutConfig


@contextlib.contextmanager
def evaluating(module: torch.nn.Module):
    """``module`` in eval mode for the block, then back in the mode it was in. Every pass that does not train runs
    so: the rollout samples in eval mode, and the old log-probs, the reference's and the values must be those of
    that same deterministic model, not of a draw of its dropout (a user's ``attention_dropout``, megatron's
    ``hidden_dropout``, a megatron LoRA ``dropout``), which the update's forward passes keep."""
    was_training = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was_training)


class RolloutRole:
    """The rollout of one rank.

    Args:
        config: the ``actor_rollout_ref.rollout`` section.
        engine: the rollout (:class:`~verl.workers.rollout.base.BaseRollout` or a stand-in with
            ``generate_sequences``, ``state_dict`` and ``load_state_dict``; ``holds_weights`` and ``load_weights``
            when it keeps a copy of the weights of its own).
        module: the policy's module, in eval mode while sampling.
        device: where the prompts go.
    """

    def __init__(self, config: RolloutConfig, engine: Any, module: torch.nn.Module, device: str):
        self.config = config
        self.engine = engine
        self.module = module
        self.device = device
        # while agent loops run: whether the engine slept after each generation before (see generate_tokens)
        self._sleeps_after: bool | None = None

    @property
    def holds_weights(self) -> bool:
        """Whether the engine keeps a copy of the weights of its own (``vllm``), which must be sent to it after
        every applied update; a rollout over the policy's own module sees the updates by itself."""
        return bool(getattr(self.engine, "holds_weights", False))

    def generate(self, prompts: DataProto, on_token: Callable[[int], None] | None = None) -> DataProto:
        """Responses to ``prompts``, tagged with the temperature they were sampled at: the prompts' per-call override
        (as validation's ``val_kwargs``), else the configured one. Without ``calculate_log_probs`` the rollout's own
        log-probs are left out of the batch, as in verl. ``on_token``: called with the index of each response token
        before the rollout produces it (the profiler's token window; the naive and hf rollouts call it)."""
        with evaluating(self.module), torch.no_grad(), self._observing(on_token):
            output = self.engine.generate_sequences(prompts.to(self.device))
        output.meta_info["temperature"] = prompts.meta_info.get("temperature", self.config.temperature)
        if not self.config.calculate_log_probs:
            output.batch.pop("rollout_log_probs", None)
        return output

    def generate_tokens(self, requests: DataProto, on_token: Callable[[int], None] | None = None) -> DataProto:
        """Answers to a batch of token-id requests of agent loops (see :mod:`verl.workers.rollout.token_requests`):
        each request's new token ids, their log-probs and its finish reason. With ``meta_info["keep_awake"]`` an
        engine that sleeps between generations (vLLM's sleep mode) stays awake after the call, for the next turn's
        requests, until :meth:`release`."""
        from verl.workers.rollout.token_requests import generate_for_requests

        if requests.meta_info.get("keep_awake") and self._sleeps_after is None:
            self._sleeps_after = bool(getattr(self.engine, "can_sleep", False))
            if self._sleeps_after:
                self.engine.can_sleep = False  # no sleep between two turns
        with evaluating(self.module), torch.no_grad(), self._observing(on_token):
            return generate_for_requests(self.engine, requests, self.device)

    def release(self) -> None:
        """End of a batch of agent loops: an engine kept awake by :meth:`generate_tokens` sleeps again (its memory
        to training); nothing otherwise."""
        sleeps, self._sleeps_after = self._sleeps_after, None
        if sleeps:
            self.engine.can_sleep = True
            self.engine.sleep()

    @contextlib.contextmanager
    def _observing(self, on_token: Callable[[int], None] | None) -> Iterator[None]:
        """The engine's ``token_observer`` set to ``on_token`` for the block (nothing touched without one)."""
        if on_token is None:
            yield
            return
        self.engine.token_observer = on_token
        try:
            yield
        finally:
            self.engine.token_observer = None

    def load_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> float:
        """Send ``(Hugging Face name, tensor)`` pairs into an engine holding its own weights; returns the seconds it
        took."""
        start = time.perf_counter()
        with torch.no_grad():
            self.engine.load_weights(weights)
        return time.perf_counter() - start

    def state_dict(self) -> dict[str, Any]:
        """The rollout's state for this rank's checkpoint (its random generators)."""
        return self.engine.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.engine.load_state_dict(state)


def build_rollout_role(arr: ActorRolloutRefConfig, policy, device: str, seed_offset: int) -> RolloutRole:
    """The rollout ``arr.rollout`` configures (``arr``: the ``actor_rollout_ref`` section) over ``policy`` (a
    :class:`~verl.workers.actor.base.BasePPOActor`).

    ``naive`` samples with the policy's key/value-cached decoder and ``hf`` with its module's ``generate``, both in
    the training precision; ``vllm`` builds an engine of its own from the model directory (the host sends it the
    policy's weights). ``seed_offset``: data-parallel ranks sample differently, ranks sharing one model alike.
    """
    from verl.models.loading import load_tokenizer
    from verl.workers.rollout import get_rollout_cls

    rollout = arr.rollout
    if rollout.name == "hf":
        model = policy.model_module()
    elif rollout.name == "vllm":
        from verl.workers.rollout.vllm_engine import build_vllm_engine

        model = build_vllm_engine(arr, seed=rollout.seed + seed_offset, device=device)
    else:
        model = policy.incremental_decoder()
    tokenizer = load_tokenizer(arr.model.tokenizer_path or arr.model.path, arr.model.trust_remote_code)
    engine = get_rollout_cls(rollout.name)(
        model,
        rollout.sampling_options(seed_offset=seed_offset),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return RolloutRole(rollout, engine, policy.model_module(), device)
