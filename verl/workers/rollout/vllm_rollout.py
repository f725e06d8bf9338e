"""The ``vllm`` rollout: responses from a colocated ``vllm.LLM`` that holds its own copy of the policy's weights.

The worker builds the engine (:func:`~verl.workers.rollout.vllm_engine.build_vllm_engine`) and hands it to
:class:`VLLMRollout`, which samples token ids in, token ids out, with the sampling options of the rollout config
(``n`` by repeating the prompts on our side, as every rollout does, and one vLLM request per row). Generation stops
at the tokenizer's eos ids; each response token comes with the engine's own log-prob (see
:func:`~verl.workers.rollout.vllm_engine.choose_logprobs_mode` for how it matches the trainer's), which becomes the
output's ``rollout_log_probs``.

Unlike ``naive`` and ``hf``, this rollout does not sample from the trainer's module: after every step that changed
the weights the worker streams them in with :meth:`VLLMRollout.load_weights` (vLLM's in-place ``reload_weights``,
which takes Hugging Face names and the trainer's dtype and casts), one tensor at a time: the engine runs in the
process that holds the weights to send (the actor worker, or a rollout worker once they have arrived), so there is
no transfer to batch, and ``checkpoint_engine.update_weights_bucket_megabytes``, which bounds the bytes in flight,
is met by streaming (packing buckets here was one more copy of every weight, slower:
``benchmarks/bench_weight_sync.py``).
Buckets pay between processes: the actor packs them for a rollout group of its own (:mod:`verl.utils.weight_buckets`).
With ``free_cache_engine`` on a GPU (and vLLM's sleep mode, ``enable_sleep_mode``, left on) the engine sleeps after
each generation (KV cache freed, weights offloaded) and wakes for the next one; vLLM's CPU worker has no sleep mode,
so on CPU it stays awake.

Tensor parallelism (an engine over TP ranks, vLLM's ``external_launcher``; see
:mod:`~verl.workers.rollout.vllm_engine`): the ranks of one engine must run the same requests, so each rank's prompts
are gathered over the engine's tensor-parallel group, every rank generates all of them (with the same seeds: the
ranks of a group share a seed source), and each keeps the rows of its own prompts.

Partial rollouts (``async_training.partial_rollout``, a :class:`~verl.workers.rollout.partial.WeightSwitch`
attached): vLLM cannot be stopped between two tokens from outside, so each engine call then samples at most
:data:`PARTIAL_CHUNK_TOKENS` new tokens, and :func:`~verl.workers.rollout.partial.continue_paused` continues the rows
that have not ended, with the staged weights applied between two calls: new weights take over within that many
tokens. Each continuation sends the prompt and the tokens so far again; vLLM's prefix cache (on by default) spares
recomputing them while the weights stay, and a weight load empties it. Without a switch one call samples the whole
response, as before.

Randomness: a seeded ``torch.Generator`` draws one seed per request of every sampling call, and vLLM samples each
request from its own generator seeded with it; greedy calls draw nothing. That generator is the rollout's
``state_dict``, so a resumed run gives its requests the seeds the uninterrupted run would have given them.

Importing this module does not import ``vllm``: the rollout is registered on every machine, and building one
without the package fails with a message naming the extra.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig

from verl.protocol import DataProto
from verl.utils.device_memory import release_device_memory
from verl.workers.rollout.base import SamplingParams, SeedSourceRollout, register_rollout

__all__ = ["VLLMRollout"]

# seeds are drawn below 2**31: vLLM's CPU sampler keeps per-request seeds in that range
_SEED_BOUND = 2**31 - 1
# with a weight switch (partial rollouts), the most new tokens one engine call samples: staged weights apply between
# two calls, so they take over within this many tokens of a response
PARTIAL_CHUNK_TOKENS = 32


@register_rollout("vllm")
class VLLMRollout(SeedSourceRollout):
    """Sample responses with a ``vllm.LLM``.

    Args:
        engine: the ``vllm.LLM`` (built with the tokenizer's eos ids in mind; see ``vllm_engine.engine_kwargs``).
        config: the sampling options (``RolloutConfig.sampling_options()``) or a config with all of them; see
            :class:`~verl.workers.rollout.base.SamplingParams` for the keys used.
        pad_token_id: id written after a row's eos and in right padding.
        eos_token_id: one eos id or a list of them; generation stops at any of them.
    """

    # The rollout holds its own copy of the weights: the worker sends the trainer's after every successful update.
    holds_weights = True

    def __init__(
        self,
        engine: Any,
        config: SamplingParams | DictConfig | Mapping[str, Any],
        pad_token_id: int,
        eos_token_id: int | Sequence[int],
    ):
        if not hasattr(engine, "generate") or not hasattr(engine, "collective_rpc"):
            raise ValueError(
                f"VLLMRollout needs a vllm.LLM engine, got {type(engine).__name__}; the worker builds it with "
                "verl.workers.rollout.vllm_engine.build_vllm_engine."
            )
        super().__init__(config, pad_token_id, eos_token_id)
        self.engine = engine
        # sleep mode exists only where vLLM supports it (GPU), when free_cache_engine and enable_sleep_mode ask for it
        self.can_sleep = bool(getattr(engine.model_config, "enable_sleep_mode", False))
        self._asleep = False
        # the gloo group of the engine's tensor-parallel ranks, None for an engine on one rank
        self.tp_group = _tensor_parallel_group(engine)

    # ------------------------------------------------------------------ weights and memory

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy new weights into the engine in place, one tensor at a time as ``weights`` yields them.

        No buckets: the engine lives in this process, so each tensor goes straight from its holder to vLLM's copy
        into its parameters; packing it into a bucket first would be one more copy of every weight (measured slower,
        and a bucket of verl's default 2048 MiB held a second copy of the model; ``benchmarks/bench_weight_sync.py``,
        docs/perf.md). ``update_weights_bucket_megabytes`` bounds the bytes in flight, and one tensor is below any
        bucket size. All of it within one ``reload_weights``: vLLM's in-place reload holds a layer's weights until
        all of that layer's have arrived, then processes the layer. The prefix cache is dropped afterwards: its KV
        entries were computed with the old weights.

        Args:
            weights: ``(name, tensor)`` pairs with Hugging Face names (``model.layers.0.self_attn.q_proj.weight``,
                ...) of the whole model, in any float dtype and on any device; vLLM casts and copies each one.
        """
        if self._asleep:
            # weights only: the KV cache stays released until the next generation
            self.engine.wake_up(tags=["weights"])
        # vLLM's in-place reload re-runs its per-layer processing (e.g. the CPU kernels' packed weight layouts),
        # which a plain model.load_weights into the live parameters would skip
        self.engine.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        if not self._asleep:
            self.engine.reset_prefix_cache()  # asleep, the cache was already cleared when the engine slept

    def sleep(self) -> None:
        """Release the KV cache and offload the weights (level 1), so training has the GPU memory; no-op on CPU.

        vLLM frees its own memory pool; what this process's PyTorch allocator cached during the generation (the
        sampled tokens, the prompts' tensors) is returned to the driver too, once per sleep."""
        if self.can_sleep and not self._asleep:
            self.engine.sleep(level=1)
            self._asleep = True
            release_device_memory()

    def wake_up(self) -> None:
        """Take back what :meth:`sleep` released (all of it, whatever a weight load already woke)."""
        if self._asleep:
            self.engine.wake_up()
            self._asleep = False

    # ------------------------------------------------------------------ generation

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """:meth:`BaseRollout.generate_sequences`; for an engine over several ranks, on the prompts of all of them.

        Every rank of the engine's tensor-parallel group passes its own prompts; they are gathered in rank order,
        the engine (one over the group) answers all of them, and this rank keeps the ``len(prompts) * n`` rows of
        its own, in its prompts' order.
        """
        if self.tp_group is None:
            return super().generate_sequences(prompts)
        parts: list[DataProto | None] = [None] * dist.get_world_size(self.tp_group)
        dist.all_gather_object(parts, prompts.to("cpu"), group=self.tp_group)
        output = super().generate_sequences(DataProto.concat(parts))
        rows_per_prompt = len(output) // sum(len(part) for part in parts)
        start = sum(len(part) for part in parts[: dist.get_rank(self.tp_group)]) * rows_per_prompt
        return output.slice(start, start + len(prompts) * rows_per_prompt)

    def _generate_across_switches(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, params: SamplingParams
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, int | None]:
        """The base class's generation, with the engine awake throughout (every chunk of a partial rollout and the
        weight loads between them) and put back to sleep after, when it can sleep."""
        self.wake_up()
        try:
            return super()._generate_across_switches(input_ids, attention_mask, params)
        finally:
            self.sleep()

    def _vllm_sampling_params(self, params: SamplingParams, num_rows: int, max_tokens: int) -> list[Any]:
        """One ``vllm.SamplingParams`` per row: the call's options, its own seed when sampling."""
        from vllm import SamplingParams as VLLMSamplingParams

        common: dict[str, Any] = {
            "n": 1,
            "max_tokens": max_tokens,
            "min_tokens": 0,
            "stop_token_ids": list(self.stop_ids),
            "ignore_eos": self.params.ignore_eos,
            "logprobs": 0,  # the sampled token's own log-prob only
            "detokenize": False,
            # neutral values, whatever vLLM's defaults become: the trainer recomputes plain softmaxed logits
            "repetition_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "min_p": 0.0,
        }
        if params.greedy:
            return [VLLMSamplingParams(temperature=0.0, **common) for _ in range(num_rows)]
        # vLLM's off values: top_k 0; top_p must be > 0, and top_p 0 keeps only the most likely token, i.e. top_k 1
        top_k = 1 if params.top_p <= 0 else max(int(params.top_k), 0)
        top_p = 1.0 if params.top_p <= 0 else float(params.top_p)
        seeds = self.draw_seeds(num_rows, _SEED_BOUND) or [None] * num_rows
        return [
            VLLMSamplingParams(temperature=float(params.temperature), top_k=top_k, top_p=top_p, seed=seed, **common)
            for seed in seeds
        ]

    def _generate_tokens(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, params: SamplingParams
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Generate with the engine (awake: :meth:`_generate_across_switches` woke it); with a weight switch, at
        most :data:`PARTIAL_CHUNK_TOKENS` tokens (the caller continues the rows that have not ended).

        Args:
            input_ids: (B*n, P) prompt ids, left-padded.
            attention_mask: (B*n, P) prompt mask; the padding is stripped before the ids go to vLLM.
            params: the sampling options of this call.

        Returns:
            (B*n, L) generated tokens, L <= R the longest response (or the chunk), rows padded with
            ``pad_token_id`` after their eos; and their (B*n, L) float32 log-probs from the engine (0 in the padding).
        """
        prompts = [
            {"prompt_token_ids": row[mask.bool()].tolist()} for row, mask in zip(input_ids.cpu(), attention_mask.cpu())
        ]
        max_tokens = params.response_length
        if self.weight_switch is not None:  # new weights apply between two calls: stop every chunk for them
            max_tokens = min(max_tokens, PARTIAL_CHUNK_TOKENS)
        sampling_params = self._vllm_sampling_params(params, len(prompts), max_tokens)
        self.wake_up()  # a no-op inside a generation; awake already
        outputs = self.engine.generate(prompts, sampling_params, use_tqdm=False)
        completions = [output.outputs[0] for output in outputs]
        length = max(len(completion.token_ids) for completion in completions)
        tokens = torch.full((len(prompts), length), self.pad_token_id, dtype=torch.long)
        log_probs = torch.zeros((len(prompts), length), dtype=torch.float32)
        for row, completion in enumerate(completions):
            ids = list(completion.token_ids)
            tokens[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            # each step's dict holds the sampled token (logprobs=0), keyed by its id
            log_probs[row, : len(ids)] = torch.tensor(
                [step[token].logprob for step, token in zip(completion.logprobs, ids)], dtype=torch.float32
            )
        return tokens.to(input_ids.device), log_probs.to(input_ids.device)


def _tensor_parallel_group(engine: Any) -> Any:
    """The CPU (gloo) group of an engine's tensor-parallel ranks, as vLLM built it; None for one rank."""
    vllm_config = getattr(getattr(engine, "llm_engine", None), "vllm_config", None)
    if vllm_config is None or vllm_config.parallel_config.tensor_parallel_size == 1:
        return None
    from vllm.distributed.parallel_state import get_tp_group

    return get_tp_group().cpu_group
