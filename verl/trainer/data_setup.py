"""The driver's data side: prompt loaders, validation batches and the reward function, from the config.

``data.train_files: null`` means the embedded task, generated from ``data.seed`` (no files, no download); files are
parquet or JSONL with ``prompt``, ``ground_truth`` and ``data_source`` columns.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from verl.protocol import DataProto
from verl.workers.config import PPOConfig
from verl.workers.config.plan import step_sizes

logger = logging.getLogger("verl.trainer")
_TENSOR_KEYS = ("input_ids", "attention_mask", "position_ids")


def collated_to_dataproto(collated: dict[str, Any]) -> DataProto:
    """A collated prompt batch (tensors + object arrays) as a DataProto."""
    tensors = {k: collated[k] for k in _TENSOR_KEYS}
    non_tensors = {k: v for k, v in collated.items() if k not in _TENSOR_KEYS}
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)


class PromptBatches(Iterator[DataProto]):
    """Endless prompt batches as DataProto, with the loader's resumable position."""

    def __init__(self, loader):
        self.loader = loader

    def __next__(self) -> DataProto:
        return collated_to_dataproto(self.loader.next_batch())

    def state_dict(self) -> dict[str, int]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.loader.load_state_dict(state)


@dataclass
class TrainingData:
    train_loader: PromptBatches
    val_batches: list[DataProto]
    reward_fn: Any
    num_train_prompts: int
    tokenizer: Any = None  # decodes the validation samples the trainer logs (trainer.log_val_generations)


def _datasets(config: PPOConfig, tokenizer):
    from verl.utils.dataset import RLHFDataset, chat_renderer, make_tiny_task_dataset

    data = config.data

    def from_files(files):
        return RLHFDataset(
            files,
            prompt_key=data.prompt_key,
            data_source_key=data.reward_fn_key,
            render_chat=chat_renderer(tokenizer, dict(data.apply_chat_template_kwargs)),
            media_keys=(data.image_key, data.video_key),
        )

    if data.train_files is None:
        train = make_tiny_task_dataset(data.num_train_examples, seed=data.seed)
    else:
        train = from_files(data.train_files)
    if data.val_files is None and data.train_files is None:
        # a different seed: held-out prompts of the same task
        val = make_tiny_task_dataset(data.num_val_examples, seed=data.seed + 1_000_003)
    elif data.val_files is None:
        val = None
    else:
        val = from_files(data.val_files)
    return train, val


def _drop_overlong(dataset, collate, name: str):
    """``data.filter_overlong_prompts``: keep the prompts that fit ``data.max_prompt_length``, and say how many went."""
    counts = collate.token_counts([dataset[index] for index in range(len(dataset))])
    kept = dataset.take([index for index, count in enumerate(counts) if count <= collate.max_prompt_length])
    if len(kept) < len(dataset):
        logger.warning(
            "data.filter_overlong_prompts: dropped %d of %d %s prompts longer than data.max_prompt_length=%d tokens",
            len(dataset) - len(kept),
            len(dataset),
            name,
            collate.max_prompt_length,
        )
    if not len(kept):
        raise ValueError(
            f"data.filter_overlong_prompts dropped every {name} prompt: all are longer than data.max_prompt_length="
            f"{collate.max_prompt_length} tokens; raise it."
        )
    return kept


def build_reward_fn(config: PPOConfig, tokenizer):
    """The reward manager, with the custom scoring function named by ``reward_model.custom_score_fn`` or by
    verl's ``custom_reward_function.path`` / ``.name`` (at most one of them is set). verl's ``reward.*`` keys arrive
    here folded into these (:mod:`verl.workers.config.reward`): one path for both spellings."""
    from verl.workers.reward_manager import get_reward_manager_cls, load_custom_score_fn
    from verl.workers.reward_manager.registry import load_custom_reward_function

    manager_cls = get_reward_manager_cls(config.reward_model.reward_manager)
    custom = config.custom_reward_function
    if custom.path:
        compute_score = load_custom_reward_function(custom.path, custom.name)
    elif config.reward_model.custom_score_fn:
        compute_score = load_custom_score_fn(config.reward_model.custom_score_fn)
    else:
        compute_score = None
    # the dataset already read data.reward_fn_key's column into each row's data_source
    extra = {}
    if config.reward_model.reward_manager == "dapo":  # DAPO's overlong penalty needs the length limit and its buffer
        extra = {
            "max_resp_len": config.data.max_response_length,
            "overlong_buffer_cfg": config.reward_model.overlong_buffer,
        }
    # verl's reward_model.reward_kwargs (names checked against the manager's parameters) come last
    extra.update(config.reward_model.reward_kwargs)
    return manager_cls(tokenizer=tokenizer, compute_score=compute_score, **extra)


def build_data(config: PPOConfig, world_size: int) -> TrainingData:
    """Everything data-shaped the trainer needs; every problem is a ``ValueError`` raised before Ray starts.

    The loader's batch is the run plan's ``train_batch_size`` (:func:`~verl.workers.config.plan.step_sizes`:
    ``data.train_batch_size``, or verl's fully async size with a rollout group of its own).
    """
    from verl.models.loading import load_tokenizer
    from verl.utils.dataset import PromptCollator, StatefulPromptLoader

    model_cfg = config.actor_rollout_ref.model
    tokenizer = load_tokenizer(model_cfg.tokenizer_path or model_cfg.path, config.data.trust_remote_code)
    data = config.data
    collate = PromptCollator(
        tokenizer, data.max_prompt_length, truncation=data.truncation, return_raw_chat=data.return_raw_chat
    )
    train, val = _datasets(config, tokenizer)
    if data.filter_overlong_prompts:
        train = _drop_overlong(train, collate, "training")
        val = _drop_overlong(val, collate, "validation") if val is not None and len(val) else val
    batch_size = step_sizes(config).train_batch_size
    if batch_size % world_size:
        raise ValueError(
            f"data.train_batch_size={batch_size} must be a multiple of the {world_size} "
            f"data-parallel workers (trainer.n_gpus_per_node x trainer.nnodes)."
        )
    loader = StatefulPromptLoader(
        train, batch_size, seed=int(data.seed), shuffle=bool(data.shuffle), collate_fn=collate
    )
    val_batches = _validation_batches(val, collate, world_size, data.val_batch_size)
    # validate the first batch now: a prompt too long for max_prompt_length fails here, not in a worker
    collate([train[i] for i in range(min(len(train), batch_size))])
    return TrainingData(
        PromptBatches(loader), val_batches, build_reward_fn(config, tokenizer), len(train), tokenizer=tokenizer
    )


def _validation_batches(val, collate, world_size: int, val_batch_size: int | None) -> list[DataProto]:
    """The validation prompts as batches that split evenly over the workers (every prompt, up to a multiple of the
    workers; the last batch may be smaller)."""
    if val is None or not len(val):
        return []
    num_val = len(val) - len(val) % world_size  # every validation batch must split evenly over the workers
    if num_val < len(val):
        logger.info("using %d of %d validation prompts (a multiple of %d workers)", num_val, len(val), world_size)
    size = min(int(val_batch_size or num_val), num_val)
    size -= size % world_size
    if size < 1:
        raise ValueError(f"data.val_batch_size must be at least the {world_size} workers.")
    rows = [val[i] for i in range(num_val)]
    return [collated_to_dataproto(collate(rows[i : i + size])) for i in range(0, num_val, size)]
