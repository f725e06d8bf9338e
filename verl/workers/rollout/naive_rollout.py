"""The ``naive`` rollout: a backend-agnostic batched sampler over an incremental decoder.

It needs nothing from the model but a decoder (:class:`~verl.workers.rollout.decoding.IncrementalDecoder`): the
actors hand it their KV-cached one (a Hugging Face model's own cache for ``dp``/``fsdp``, megatron-core's static
inference context for ``megatron``), so the same sampler drives both backends without converting weights. A plain
``logits_fn(input_ids, attention_mask, position_ids) -> logits (B, S, V)`` is accepted too and re-run on the whole
sequence every token (:class:`~verl.workers.rollout.decoding.RecomputeDecoder`).

Each token costs one decoder call on the rows still generating: rows that emit eos leave the batch (their cache
rows go with them) in steps of :data:`ROW_BUCKET` rows, so late tokens of a batch with short answers are cheap.
Sampling stays on the device; the loop's only host sync per token is one small copy of the finished flags, which
decides both whether to stop and which rows to keep. Over a sharded model (FSDP2), whose every forward pass is a
collective, the ranks agree on that stop (:meth:`NaiveRollout.synchronize_stop`, folded into the same copy) and a
rank whose rows have all ended keeps one row going, so that all ranks take the same number of steps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig

from verl.models.decoding import IncrementalDecoder, LogitsFn, RecomputeDecoder
from verl.workers.rollout.base import BaseRollout, SamplingParams, register_rollout
from verl.workers.rollout.postprocess import compute_position_ids, is_eos
from verl.workers.rollout.sampling import sample_with_log_probs

__all__ = ["ROW_BUCKET", "NaiveRollout", "rows_to_keep"]

# The decoding batch shrinks in steps of this many rows: a few finished rows ride along until the rows still
# generating fit a smaller multiple of it. Each step then runs one of few batch shapes (kernels that specialise on
# shapes, oneDNN's on CPU as CUDA graphs on a GPU, are built once per shape and kept), and the cache is compacted
# a few times per call instead of at nearly every token.
ROW_BUCKET = 8


def rows_to_keep(finished: torch.Tensor) -> torch.Tensor | None:
    """The batch rows that go on decoding after this token (sorted), or None when all of them do.

    Args:
        finished: (B,) bool host tensor, the rows that have emitted eos.

    All unfinished rows stay, padded with finished ones to the next multiple of :data:`ROW_BUCKET`; the batch
    is cut only when that is smaller than B. When every row has finished one stays (a rank that keeps decoding in
    step with its peers); the tokens of finished rows are discarded by the post-processing.
    """
    num_rows = finished.numel()
    running = (~finished).nonzero().squeeze(-1)
    target = max(1, -(-running.numel() // ROW_BUCKET) * ROW_BUCKET)
    if target >= num_rows:
        return None
    riders = finished.nonzero().squeeze(-1)[: target - running.numel()]
    return torch.cat([running, riders]).sort().values


@register_rollout("naive")
class NaiveRollout(BaseRollout):
    """Sample responses token by token from an incremental decoder.

    Determinism: with ``seed`` set, the rollout owns a ``torch.Generator`` (one per device) seeded once at first
    use, so a fresh rollout built with the same seed and called with the same batches in the same order yields
    the same responses; successive calls continue the generator's stream, so they differ from each other. The
    generators' states are the rollout's :meth:`state_dict`, so a resumed run continues the stream where the
    checkpoint left it. Without ``seed`` draws use torch's global random state.

    Args:
        model: an :class:`~verl.workers.rollout.decoding.IncrementalDecoder`, or a ``logits_fn``
            ``(input_ids, attention_mask, position_ids) -> logits``, inputs (B, S), output (B, S, V), which is run
            without a cache.
        config: the sampling options (``RolloutConfig.sampling_options()``) or a config with all of them; see
            :class:`~verl.workers.rollout.base.SamplingParams` for the keys used.
        pad_token_id: id written after a row's eos and in right padding.
        eos_token_id: one eos id or a list of them.
    """

    def __init__(
        self,
        model: IncrementalDecoder | LogitsFn,
        config: SamplingParams | DictConfig | Mapping[str, Any],
        pad_token_id: int,
        eos_token_id: int | Sequence[int],
    ):
        if not isinstance(model, IncrementalDecoder) and not callable(model):
            raise ValueError(
                f"NaiveRollout needs an IncrementalDecoder or a callable logits_fn, got {type(model).__name__}."
            )
        super().__init__(config, pad_token_id, eos_token_id)
        self.decoder = model if isinstance(model, IncrementalDecoder) else RecomputeDecoder(model)
        self._generators: dict[torch.device, torch.Generator] = {}
        self._stop_group: Any = None

    def synchronize_stop(self, process_group: Any) -> None:
        """Stop before the response length only once every rank of ``process_group`` has ended all its rows.

        A sharded model gathers its parameters from every rank in each forward pass, so a rank that stopped
        early would leave the others waiting in a collective. With this set each step ends with a MIN
        all-reduce of the "all my rows ended" flag (one tiny collective per generated token), and a rank whose rows
        have all ended keeps decoding one of them (its tokens are discarded) until every rank is done.
        """
        self._stop_group = process_group

    def _finished_on_host(self, finished: torch.Tensor) -> tuple[bool, torch.Tensor]:
        """(stop now, the rows' finished flags on the host), in one device-to-host copy.

        Stop when every row has ended; with a stop group, only when every row of every rank has.
        """
        done = finished.all().reshape(1).to(torch.int32)
        if self._stop_group is not None:
            dist.all_reduce(done, op=dist.ReduceOp.MIN, group=self._stop_group)
        flags = torch.cat([done.bool(), finished]).cpu()  # the one host sync of this token
        return bool(flags[0]), flags[1:]

    def _generator(self, device: torch.device) -> torch.Generator | None:
        if self.params.seed is None:
            return None
        if device not in self._generators:
            generator = torch.Generator(device=device)
            generator.manual_seed(self.params.seed)
            self._generators[device] = generator
        return self._generators[device]

    def state_dict(self) -> dict[str, Any]:
        """The state of each device's generator, ``{"generators": {"cpu": uint8 tensor, "cuda:0": ...}}``.

        Only generators already used appear; a device used for the first time after a load is seeded from
        ``seed`` as usual. The states are CPU ``uint8`` tensors keyed by device string, so the dict loads with
        ``torch.load(..., weights_only=True)``. Without ``seed`` the dict is ``{"generators": {}}``.
        """
        return {"generators": {str(device): gen.get_state() for device, gen in self._generators.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Set the generators to the states :meth:`state_dict` returned (on the devices named there).

        Raises:
            ValueError: ``state`` was saved by another rollout, or holds generator states while this rollout has
                no ``seed`` (its draws come from torch's global random state).
        """
        self._check_state_keys(state, {"generators"})
        saved = state["generators"]
        if saved and self.params.seed is None:
            raise ValueError(
                "The rollout state to load holds seeded generator states, but this rollout has "
                "`actor_rollout_ref.rollout.seed: null`; set the seed as in the run that wrote the checkpoint."
            )
        generators = {}
        for name, generator_state in saved.items():
            device = torch.device(name)
            generator = torch.Generator(device=device)
            # set_state wants a CPU byte tensor whatever the generator's device; a loaded state may sit elsewhere
            generator.set_state(generator_state.to(device="cpu", dtype=torch.uint8))
            generators[device] = generator
        self._generators = generators

    def _generate_tokens(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, params: SamplingParams
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample token by token; rows that emitted eos leave the decoder's batch (see :func:`rows_to_keep`).

        Args:
            input_ids: (B*n, P) prompt ids, left-padded.
            attention_mask: (B*n, P) prompt mask.
            params: the sampling options of this call.

        Returns:
            (B*n, L) sampled tokens, L <= R (L < R only when every row has emitted eos), and their (B*n, L)
            log-probs under the logits they were sampled from. After a row's eos come pad ids, or the tokens it
            went on sampling while it rode along in the batch (see :func:`rows_to_keep`); the post-processing
            masks everything after an eos.
        """
        num_rows, device = input_ids.shape[0], input_ids.device
        generator = self._generator(device)
        tokens = torch.full((num_rows, params.response_length), self.pad_token_id, dtype=torch.long, device=device)
        log_probs = torch.zeros(num_rows, params.response_length, dtype=torch.float32, device=device)
        rows = torch.arange(num_rows, device=device)  # the output row of each row still generating
        finished = torch.zeros(num_rows, dtype=torch.bool, device=device)
        position_ids = compute_position_ids(attention_mask)
        next_position = position_ids[:, -1] + 1
        num_steps = 0
        observe = self.token_observer or (lambda index: None)
        try:
            observe(0)
            logits = self.decoder.prefill(input_ids, attention_mask, position_ids, params.response_length)
            for step in range(params.response_length):
                next_tokens, next_log_probs = sample_with_log_probs(logits, params, generator)
                tokens[rows, step] = next_tokens
                log_probs[rows, step] = next_log_probs
                num_steps = step + 1
                finished |= is_eos(next_tokens, self.stop_ids)
                if num_steps == params.response_length:
                    break
                if self.weight_switch is not None and self.weight_switch.requested():
                    break  # newer weights wait: the caller continues the unfinished rows with them

                stop, finished_host = self._finished_on_host(finished)
                if stop:
                    break
                keep = rows_to_keep(finished_host)
                if keep is not None:
                    keep = keep.to(device, non_blocking=True)
                    self.decoder.keep_rows(keep)
                    rows, finished, next_tokens = rows[keep], finished[keep], next_tokens[keep]
                    attention_mask, next_position = attention_mask[keep], next_position[keep]
                attention_mask = torch.cat([attention_mask, attention_mask.new_ones(rows.shape[0], 1)], dim=-1)
                observe(num_steps)
                logits = self.decoder.decode(next_tokens, attention_mask, next_position)
                next_position = next_position + 1
        finally:
            self.decoder.release()
        return tokens[:, :num_steps], log_probs[:, :num_steps]
