"""The rollout base class, with the rollout registry and the validated sampling options every rollout shares.

A rollout turns a batch of left-padded prompts into sampled responses laid out as the shared data contract says
(``prompts``, ``responses``, ``input_ids``, ``attention_mask``, ``position_ids``, ``response_mask``). Rollouts are
chosen by name through ``actor_rollout_ref.rollout.name`` and looked up in :data:`ROLLOUT_REGISTRY` (defined in
:mod:`verl.workers.config.registries`, below both the config check and the engines, and re-exported here). The sampling
options (``n``, ``temperature``, ``top_k``, ``top_p``, ``response_length``, ``do_sample``, ``seed``) are read from
the rollout config once, validated by the rules the config itself is validated by
(:class:`~verl.workers.config.rollout.SamplingParams`, re-exported here), and may be overridden per call through a
prompt batch's ``meta_info`` (the trainer does so for validation).
:class:`BaseRollout` owns the ``generate_sequences`` skeleton shared by every rollout (check, override, repeat,
generate, post-process); a rollout implements only its token generation, plus ``state_dict``/``load_state_dict``
when it keeps random state that a resumed run must continue.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from omegaconf import DictConfig

from verl.protocol import DataProto
from verl.utils.padding_free import real_column_span
from verl.workers.config.registries import ROLLOUT_REGISTRY
from verl.workers.config.rollout import (  # noqa: F401  (the registry's public names, re-exported here)
    OVERRIDABLE_KEYS,
    ROLLOUT_KEY,
    SamplingParams,
    get_rollout_cls,
    list_rollouts,
    register_rollout,
)
from verl.workers.rollout.partial import WEIGHT_VERSION_KEY, WeightSwitch, continue_paused
from verl.workers.rollout.postprocess import as_eos_ids, build_rollout_output, check_prompts

__all__ = [
    "OVERRIDABLE_KEYS",
    "ROLLOUT_REGISTRY",
    "BaseRollout",
    "SamplingParams",
    "get_rollout_cls",
    "list_rollouts",
    "register_rollout",
]

_CONFIG_PREFIX = ROLLOUT_KEY


class BaseRollout(ABC):
    """A generator of responses for a batch of prompts.

    :meth:`generate_sequences` is the one skeleton every rollout shares: check that the prompts are left-padded,
    apply the per-call overrides of ``meta_info`` to the sampling options, repeat each prompt ``n`` times
    interleaved (``[a, a, b, b]``), generate, and build the shared layout with
    :func:`~verl.workers.rollout.postprocess.build_rollout_output`. A rollout implements only the token
    generation, :meth:`_generate_tokens`, and calls ``super().__init__`` so that ``params``, ``pad_token_id`` and
    ``eos_ids`` are set. A rollout with random state of its own (a seeded generator) overrides
    :meth:`state_dict` and :meth:`load_state_dict`, so that a resumed run continues its random stream instead of
    replaying it from the start.

    Args:
        config: the sampling options (``RolloutConfig.sampling_options()``) or a config with all of them; see
            :class:`SamplingParams` for the keys used.
        pad_token_id: id written after a row's eos and in right padding.
        eos_token_id: one eos id or a list of them.
    """

    def __init__(
        self,
        config: SamplingParams | DictConfig | Mapping[str, Any],
        pad_token_id: int,
        eos_token_id: int | Sequence[int],
    ) -> None:
        self.params = SamplingParams.from_config(config)
        self.pad_token_id = int(pad_token_id)
        self.eos_ids = as_eos_ids(eos_token_id)
        # partial rollouts (verl.workers.rollout.partial): set by the rollout worker; a rollout that can stop
        # between two tokens asks it after each one
        self.weight_switch: WeightSwitch | None = None
        # the profiler's token window (verl.utils.profiler.TokenWindow), set for one call by the hosting role: a
        # rollout that generates token by token calls it with each response token's index before producing it
        self.token_observer: Callable[[int], None] | None = None

    @property
    def stop_ids(self) -> list[int]:
        """The token ids that end a response: the eos ids, or none with ``ignore_eos``."""
        return [] if self.params.ignore_eos else self.eos_ids

    @torch.no_grad()
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Generate ``n`` responses per prompt.

        Args:
            prompts: ``input_ids``, ``attention_mask``, ``position_ids``, each (B, P), left-padded; its
                ``meta_info`` may override ``n``, ``temperature``, ``top_k``, ``top_p``, ``do_sample`` for this
                call.

        Returns:
            DataProto of ``B * n`` rows: ``prompts`` (B*n, P), ``responses`` (B*n, R), ``input_ids``,
            ``attention_mask``, ``position_ids`` (B*n, P+R), ``response_mask`` (B*n, R); the non-tensor fields
            repeated like the prompts, ``meta_info`` kept.

        Raises:
            ValueError: the prompts lack a key, are not left-padded, or an override is invalid.
        """
        check_prompts(prompts)
        params = self.params.with_overrides(prompts.meta_info)
        repeated = prompts.repeat(params.n, interleave=True) if params.n > 1 else prompts
        input_ids = repeated.batch["input_ids"].long()
        attention_mask = repeated.batch["attention_mask"].long()
        # prompts are left-padded to data.max_prompt_length: the columns that are padding in every row go
        start = min(real_column_span(attention_mask)[0], input_ids.shape[1] - 1)
        input_ids, attention_mask = input_ids[:, start:], attention_mask[:, start:]
        responses, log_probs, versions, first_version = self._generate_across_switches(
            input_ids, attention_mask, params
        )
        output = build_rollout_output(
            repeated,
            responses,
            params.response_length,
            self.pad_token_id,
            self.eos_ids,
            raw_log_probs=log_probs,
            ignore_eos=params.ignore_eos,
        )
        if versions is not None:  # each response token's weight version, the last one past the generated columns
            missing = params.response_length - versions.shape[1]
            last = versions[:, -1:] if versions.shape[1] else versions.new_full((len(output), 1), first_version)
            output.batch[WEIGHT_VERSION_KEY] = torch.cat([versions, last.expand(-1, missing)], dim=-1)
        return output

    def _generate_across_switches(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, params: SamplingParams
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, int | None]:
        """Generate the responses of the (repeated, trimmed) prompts, continuing across staged weight switches.

        Without a :class:`WeightSwitch` (or without log-probs) this is one :meth:`_generate_tokens` call. With one,
        the newest staged weights are applied before the first token, and generation pauses at every later switch
        and resumes under the new weights (:func:`continue_paused`), recording which weights produced each token.

        Returns:
            ``(responses (N, <=R), log_probs (N, <=R) or None, versions (N, <=R) or None, first_version)``.
        """
        switch = self.weight_switch
        first_version = switch.apply_staged() if switch is not None else None  # the newest weights, before a token
        generated = self._generate_tokens(input_ids, attention_mask, params)
        responses, log_probs = generated if isinstance(generated, tuple) else (generated, None)
        if switch is None or log_probs is None:
            return responses, log_probs, None, first_version

        def generate_more(ids: torch.Tensor, mask: torch.Tensor, budget: int):
            return self._generate_tokens(ids, mask, params.replace(n=1, response_length=budget))

        responses, log_probs, versions = continue_paused(
            generate_more,
            input_ids,
            attention_mask,
            responses,
            log_probs,
            params.response_length,
            self.stop_ids,
            switch,
            first_version,
            self.pad_token_id,
        )
        return responses, log_probs, versions, first_version

    @abstractmethod
    def _generate_tokens(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, params: SamplingParams
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Generate the raw response tokens for already repeated prompts (and the engine's log-probs of them).

        Args:
            input_ids: (B*n, P) int64 prompt ids, left-padded.
            attention_mask: (B*n, P) int64 0/1 mask of the prompts.
            params: the sampling options of this call (overrides applied).

        Returns:
            (B*n, L) response tokens with L <= ``params.response_length`` (less only when every row has ended);
            whatever follows a row's first eos is masked out by the post-processing, so it may be anything. A
            rollout that knows its engine's log-probs of those tokens returns ``(tokens, log_probs)``, log_probs
            (B*n, L) float (see :func:`~verl.workers.rollout.sampling.sampled_token_log_probs`); they become the
            output's ``rollout_log_probs``.
        """

    def state_dict(self) -> dict[str, Any]:
        """The rollout's own random state, made of tensors and plain values (loads with ``weights_only=True``).

        The base rollout has none and returns an empty dict.
        """
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned, so sampling continues where the saved rollout stopped.

        Raises:
            ValueError: ``state`` was not written by a rollout of this class.
        """
        if state:
            raise ValueError(
                f"{type(self).__name__} keeps no random state, but the rollout state to load has keys "
                f"{sorted(state)}; it was saved by another rollout. Resume with the same "
                f"`{_CONFIG_PREFIX}.name` as the run that wrote the checkpoint."
            )

    def _check_state_keys(self, state: Mapping[str, Any], expected: set[str]) -> None:
        """Raise ``ValueError`` unless ``state`` has exactly the ``expected`` keys."""
        if not isinstance(state, Mapping) or set(state) != expected:
            got = sorted(state) if isinstance(state, Mapping) else type(state).__name__
            raise ValueError(
                f"{type(self).__name__} cannot load rollout state {got}: it expects keys {sorted(expected)}, so the "
                f"state was saved by another rollout. Resume with the same `{_CONFIG_PREFIX}.name` as the run that "
                "wrote the checkpoint."
            )


class SeedSourceRollout(BaseRollout):
    """A rollout whose engine samples from seeds it is handed: a private generator (``seed``) draws them.

    Engines that own their random state (``transformers``' ``generate`` under a forked RNG, vLLM's per-request
    seeds) are reproducible through the seeds they are given. The seed source is seeded once from ``params.seed``
    (None: no source, the engine's own randomness), and its state is the rollout's checkpoint state, so a resumed
    run draws the seeds the uninterrupted run would have.
    """

    def __init__(
        self,
        config: SamplingParams | DictConfig | Mapping[str, Any],
        pad_token_id: int,
        eos_token_id: int | Sequence[int],
    ) -> None:
        super().__init__(config, pad_token_id, eos_token_id)
        self._seed_source: torch.Generator | None = None
        if self.params.seed is not None:
            self._seed_source = torch.Generator()
            self._seed_source.manual_seed(self.params.seed)

    def draw_seeds(self, count: int, bound: int) -> list[int] | None:
        """``count`` seeds in [0, bound) from the seed source; None when the rollout is unseeded."""
        if self._seed_source is None:
            return None
        return torch.randint(0, bound, (count,), generator=self._seed_source).tolist()

    def state_dict(self) -> dict[str, Any]:
        """``{"seed_source": uint8 tensor or None}``; loads with ``torch.load(..., weights_only=True)``."""
        return {"seed_source": None if self._seed_source is None else self._seed_source.get_state()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Set the seed source to the state :meth:`state_dict` returned.

        Raises:
            ValueError: ``state`` was saved by another rollout, or exactly one of the saved and this rollout is
                seeded.
        """
        self._check_state_keys(state, {"seed_source"})
        saved = state["seed_source"]
        if (saved is None) != (self._seed_source is None):
            raise ValueError(
                "The rollout state to load and this rollout disagree on seeding (one has "
                f"`{_CONFIG_PREFIX}.seed: null`, the other a seed); set the seed as in the run that wrote the "
                "checkpoint."
            )
        if saved is not None:
            self._seed_source.set_state(saved.to(device="cpu", dtype=torch.uint8))
