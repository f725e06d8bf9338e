"""The model-based reward (``reward_model.enable``): a sequence-classification model scores every response.

As in verl's reward-model worker, a Hugging Face model with a one-label score head reads each whole sequence
(prompt + response) and its output at the sequence's last real token is the response's score; that score goes on the
response's last token of a (B, R) tensor, ``rm_scores``, which the trainer takes as the token-level scores in place of
the reward manager's (verl's managers return ``rm_scores`` when the batch has them). The model runs in a worker
group of its own (:class:`RewardModelWorker`, colocated with the actor's ranks) with ``reward_model.strategy``
``fsdp``/``fsdp2`` (FSDP2-sharded, every forward a collective) or ``dp`` (a whole copy per rank), in micro-batches
of ``micro_batch_size_per_gpu`` samples or of ``forward_max_token_len_per_gpu`` real tokens.

The backbone and the score head are applied at every position (:class:`TokenScoreModel`, what verl's
token-classification loading does) and the last real token is picked from the attention mask, so left-padded prompts,
right-padded responses and a pad token equal to eos all score as the unpadded sequence would. When
``model.input_tokenizer`` is set, the actor's tokens are decoded with it and re-tokenised with the reward model's own
tokenizer (its chat template over the batch's ``raw_chat`` when both exist; else prompt text + response text);
``max_length`` keeps at most that many tokens of each sequence, cut from the right.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from verl.protocol import DataProto
from verl.single_controller import Dispatch, register
from verl.utils.device_memory import releasing_device_memory
from verl.utils.micro_batching import LockstepGroup, split_by_length
from verl.utils.padding_free import forward_packed, real_column_span
from verl.workers.base_worker import SectionWorker, choose_device
from verl.workers.config import PPOConfig
from verl.workers.config.plan import RunPlan
from verl.workers.config.reward_model import RewardModelConfig

logger = logging.getLogger(__name__)

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class TokenScoreModel(torch.nn.Module):
    """A sequence-classification model's backbone and score head applied at every position.

    Args:
        model: a Hugging Face ``*ForSequenceClassification`` model with one label whose head is ``score`` (the
            decoder-only reward models: Llama, Qwen2, Mistral, Gemma, ...).

    Raises:
        ValueError: the model has no ``score`` head or more than one label.
    """

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        head = getattr(model, "score", None)
        if not isinstance(head, torch.nn.Linear) or head.out_features != 1:
            raise ValueError(
                f"reward_model.model.path: {type(model).__name__} has no one-label `score` head; the reward model must "
                "be a decoder-only Hugging Face model loadable with AutoModelForSequenceClassification (num_labels=1), "
                "as verl's reward models are (e.g. LlamaForSequenceClassification)."
            )
        self.backbone = model.base_model
        self.head = head
        self.config = model.config  # read by verl.utils.padding_free to choose the packed attention mask

    def forward(self, input_ids: torch.Tensor, attention_mask, position_ids: torch.Tensor) -> torch.Tensor:
        """(B, S) ids -> (B, S) score at every position (``attention_mask`` (B, S), or a packed row's 4-D mask)."""
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state
        return self.head(hidden).squeeze(-1)


def load_reward_model(path: str, trust_remote_code: bool = False) -> TokenScoreModel:
    """The reward model at ``path`` in fp32 on the CPU, frozen, in eval mode (``"default"``: the embedded tiny model,
    with an untrained head)."""
    from transformers import AutoModelForSequenceClassification

    from verl.models.loading import resolve_model_path

    model = AutoModelForSequenceClassification.from_pretrained(
        resolve_model_path(path), num_labels=1, dtype=torch.float32, trust_remote_code=trust_remote_code
    )
    module = TokenScoreModel(model).eval()
    module.requires_grad_(False)
    return module


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, S) mask -> (B,) column of each row's last real token (0 for a row without any)."""
    columns = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return (attention_mask.long() * columns).argmax(dim=-1)


def keep_first_tokens(attention_mask: torch.Tensor, max_length: int | None) -> torch.Tensor:
    """(B, S) mask with only the first ``max_length`` real tokens of each row left real (None: unchanged)."""
    if max_length is None:
        return attention_mask
    return attention_mask * (attention_mask.cumsum(dim=-1) <= max_length).to(attention_mask.dtype)


def expand_to_token_level(scores: torch.Tensor, attention_mask: torch.Tensor, response_length: int) -> torch.Tensor:
    """(B,) sequence scores -> (B, R) response-token scores: each score on its sequence's last real token.

    Args:
        scores: (B,) one score per sequence.
        attention_mask: (B, P + R) the actor's mask of prompt + response.
        response_length: R.

    Returns:
        (B, R) float32, zero but at each response's last token (all zero for an empty response, as in verl).
    """
    num_rows = scores.shape[0]
    full = torch.zeros(attention_mask.shape, dtype=torch.float32, device=scores.device)
    full[torch.arange(num_rows, device=scores.device), last_token_index(attention_mask)] = scores.float()
    return full[:, -response_length:]


def retokenize(data: DataProto, source, target, max_length: int | None) -> dict[str, torch.Tensor]:
    """The batch's sequences in the reward model's tokens: responses decoded with ``source`` (the actor's
    tokenizer), each prompt + response tokenised with ``target`` (its chat template over ``raw_chat`` when both
    exist, else the prompt text followed by the response text), right-padded, cut to ``max_length`` tokens.

    Returns:
        ``input_ids``, ``attention_mask``, ``position_ids``: (B, S') int64.
    """
    tensors, non_tensors = data.batch, data.non_tensor_batch
    response_length = tensors["responses"].shape[1]
    response_mask = tensors["attention_mask"][:, -response_length:].bool()
    prompt_mask = tensors["attention_mask"][:, :-response_length].bool()
    chats, prompts = non_tensors.get("raw_chat"), non_tensors.get("raw_prompt")
    rows = []
    for i in range(len(data)):
        response = source.decode(tensors["responses"][i][response_mask[i]].tolist(), skip_special_tokens=True)
        chat = chats[i] if chats is not None else None
        if isinstance(chat, list | np.ndarray) and getattr(target, "chat_template", None):
            messages = [*list(chat), {"role": "assistant", "content": response}]
            text = target.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)
            ids = target(text, add_special_tokens=False)["input_ids"]
        else:
            prompt = prompts[i] if prompts is not None else None
            if not isinstance(prompt, str):
                prompt = source.decode(tensors["prompts"][i][prompt_mask[i]].tolist(), skip_special_tokens=True)
            ids = target(prompt + response)["input_ids"]
        rows.append(ids[:max_length] if max_length is not None else ids)
    width = max(1, max(len(ids) for ids in rows))
    input_ids = torch.full((len(rows), width), target.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, ids in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[i, : len(ids)] = 1
    position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}


class RewardModelScorer:
    """Scores batches with a reward model on one rank.

    Args:
        config: the ``reward_model`` section.
        module: the :class:`TokenScoreModel` (sharded or whole), on ``device``.
        device: where inputs go.
        num_ranks: ranks of the group (the global ``micro_batch_size`` is split over them).
        tokenizers: ``(actor's tokenizer, reward model's tokenizer)`` to re-tokenise, or None to read the actor's ids.
        process_group: the group that shards the model (FSDP2), whose ranks must run as many forwards as each other;
            None for a whole model.
    """

    def __init__(
        self,
        config: RewardModelConfig,
        module: torch.nn.Module,
        device: str,
        num_ranks: int = 1,
        tokenizers: tuple[Any, Any] | None = None,
        process_group=None,
    ):
        self.config = config
        self.module = module
        self.device = device
        self.batching = config.micro_batching(num_ranks)
        self.tokenizers = tokenizers
        self.process_group = process_group

    def model_inputs(self, data: DataProto) -> DataProto:
        """The rows the reward model reads: the actor's ids (first ``max_length`` tokens) or re-tokenised ones."""
        max_length = self.config.input_max_length
        if self.tokenizers is not None:
            return DataProto.from_dict(tensors=retokenize(data, *self.tokenizers, max_length))
        tensors = data.batch
        return DataProto.from_dict(
            tensors={
                "input_ids": tensors["input_ids"],
                "attention_mask": keep_first_tokens(tensors["attention_mask"], max_length),
                "position_ids": tensors["position_ids"],
            }
        )

    @torch.no_grad()
    def score_micro_batch(self, micro: DataProto) -> torch.Tensor:
        """(b,) scores of a micro-batch: the model's output at each row's last real token, in fp32."""
        start, end = real_column_span(micro.batch["attention_mask"])
        end = max(end, start + 1)  # a micro-batch of empty rows still runs (the ranks of a sharded model agree)
        ids, mask, pos = (
            micro.batch[key][:, start:end].to(self.device) for key in ("input_ids", "attention_mask", "position_ids")
        )
        if self.config.model.use_remove_padding:
            per_token = forward_packed(self.module, ids, mask, pos)
        else:
            per_token = self.module(input_ids=ids, attention_mask=mask, position_ids=pos)
        rows = torch.arange(ids.shape[0], device=ids.device)
        return per_token[rows, last_token_index(mask)].float().cpu()

    def score_sequences(self, inputs: DataProto) -> torch.Tensor:
        """(B,) scores of the rows of ``inputs`` (``input_ids``, ``attention_mask``, ``position_ids``), in order."""
        # every forward of a sharded model is a collective: the ranks cut their rows into as many micro-batches
        lockstep = None if self.process_group is None else LockstepGroup(self.process_group, "cpu")
        micro_batches, restore = split_by_length(inputs, self.batching, lockstep)
        return torch.cat([self.score_micro_batch(micro) for micro in micro_batches])[restore]

    def compute_rm_score(self, data: DataProto) -> DataProto:
        """``rm_scores`` (B, R): each response's score on its last token.

        Args:
            data: the rollout batch: ``input_ids``, ``attention_mask``, ``position_ids`` (B, P + R), ``responses``
                (B, R), and with re-tokenisation ``prompts`` and the non-tensors ``raw_prompt`` / ``raw_chat``.
        """
        scores = self.score_sequences(self.model_inputs(data))
        response_length = data.batch["responses"].shape[1]
        return DataProto.from_dict(
            tensors={"rm_scores": expand_to_token_level(scores, data.batch["attention_mask"].cpu(), response_length)}
        )


def load_tokenizers(config: RewardModelConfig) -> tuple[Any, Any] | None:
    """(actor's tokenizer, reward model's tokenizer) when ``model.input_tokenizer`` is set, else None.

    Raises:
        ValueError: the reward model's directory has no tokenizer.
    """
    from verl.models.loading import load_tokenizer

    model = config.model
    if model.input_tokenizer is None:
        return None
    try:
        target = load_tokenizer(model.path, trust_remote_code=model.trust_remote_code)
    except (OSError, ValueError, TypeError) as err:
        raise ValueError(
            f"reward_model.model.path={model.path!r} has no tokenizer to re-tokenise the responses with ({err}); "
            "add one, or set reward_model.model.input_tokenizer=null to feed it the actor's token ids (same "
            "vocabulary)."
        ) from None
    return load_tokenizer(model.input_tokenizer, trust_remote_code=model.trust_remote_code), target


class RewardModelWorker(SectionWorker):
    """The reward model on one rank of its own worker group (``reward_model.strategy``: fsdp/fsdp2 or dp).

    Args:
        config: the ``reward_model`` section.
        plan: the run plan (its device).
    """

    def __init__(self, config: RewardModelConfig, plan: RunPlan):
        super().__init__()
        self.config = config
        self.plan = plan
        self.scorer: RewardModelScorer | None = None
        # param_offload (FSDP2's CPUOffloadPolicy): each scoring call's device memory goes back to the driver after it
        self.offloads = False

    @classmethod
    def init_kwargs(cls, config: PPOConfig, plan: RunPlan) -> dict[str, Any]:
        return {"config": config.reward_model, "plan": plan}

    def _join_process_group(self) -> None:
        # one group for both kinds of tensor: NCCL for CUDA ones, gloo for the CPU ones offloading leaves behind
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        if torch.cuda.is_available() and not dist.is_initialized():
            torch.cuda.set_device(self.local_rank % torch.cuda.device_count())
        self.init_torch_distributed(backend=backend)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> str:
        from verl.workers.config.roles import FSDP_STRATEGIES

        threads = os.environ.get("VERL_NUM_THREADS")
        if threads:
            torch.set_num_threads(int(threads))
        rm = self.config
        device = choose_device(self.plan.device)
        module = load_reward_model(rm.model.path, rm.model.trust_remote_code)
        dtype = TORCH_DTYPES[rm.dtype]
        group = None
        if rm.strategy in FSDP_STRATEGIES:
            from verl.utils.fsdp_utils import device_mesh, shard_model

            self._join_process_group()
            mesh = device_mesh(device)
            fsdp = rm.model.fsdp_config
            module = shard_model(
                module,
                mesh=mesh,
                dtype=dtype,
                reshard_after_forward=fsdp.reshard_after_forward,
                param_offload=fsdp.param_offload,
                wrap_class_names=fsdp.wrap_policy.transformer_layer_cls_to_wrap,
                key="reward_model.model.fsdp_config",
                forward_prefetch=fsdp.forward_prefetch,
            )
            group = mesh.get_group()
            self.offloads = bool(fsdp.param_offload)
        else:
            module = module.to(device=device, dtype=dtype)
        self.scorer = RewardModelScorer(rm, module, device, self.world_size, load_tokenizers(rm), group)
        return f"rank {self.rank}: reward model {rm.model.path} ({rm.strategy}, {rm.dtype}) on {device}"

    def data_parallel_layout(self) -> tuple[int, bool]:
        """(data-parallel rank, returns its results): every rank scores its own share of a batch."""
        return self.rank, True

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """This rank's share of the batch scored: ``rm_scores`` (b, R) on the CPU. Under ``param_offload`` the
        device memory the forward passes used is returned to the driver afterwards (the actor and the rollout engine
        share the GPU), once per call (:func:`~verl.utils.device_memory.release_device_memory` costs a sync)."""
        with releasing_device_memory(self.offloads):
            return self.scorer.compute_rm_score(data)


# what compute_rm_score reads of a rollout batch (the non-tensors only when it re-tokenises)
RM_SCORE_READS = ("input_ids", "attention_mask", "position_ids", "responses", "prompts")
RM_SCORE_TEXT_READS = ("raw_prompt", "raw_chat")


def rm_score_inputs(batch: DataProto) -> DataProto:
    """What the reward-model workers read of ``batch``: the sequences, and the prompt texts and chats it has."""
    tensors = [key for key in RM_SCORE_READS if key in batch.batch.keys()]
    texts = [key for key in RM_SCORE_TEXT_READS if key in batch.non_tensor_batch]
    return batch.select(batch_keys=tensors, non_tensor_batch_keys=texts)
