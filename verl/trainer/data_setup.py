"""The driver's data side: prompt loaders, validation batches and the reward function, from the config.

``data.train_files: null`` means the embedded task, generated from ``data.seed`` (no files, no download); files are
parquet or JSONL with ``prompt``, ``ground_truth`` and ``data_source`` columns.

Every row of every file is checked before Ray starts (:func:`check_rows`): a row that cannot be used (a missing,
null or empty prompt or ground truth, a value of the wrong type, text that is not UTF-8) and, with
``data.truncation=error``, a prompt longer than ``data.max_prompt_length`` (counted with the tokenizer over the whole
data set, in batches) is a problem naming the file, the row and the column; all of them are refused in one message,
unless a key asks to leave them out: ``data.skip_bad_rows`` for rows that cannot be used,
``data.filter_overlong_prompts`` (verl's key) for prompts that are too long. What is left out is counted in the log.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from verl.protocol import DataProto
from verl.utils.dataset.row_checks import RowProblem, describe_problems
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

    def origin(self, index: int) -> tuple[str, int, int | None]:
        """Where prompt ``index`` (a batch's ``index`` column) comes from: (file, 0-based row, JSONL line or None)."""
        return self.loader.dataset.origin(index)


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
            on_bad_row="skip",  # set aside and listed: check_rows reports or skips them with the other problems
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


def check_rows(config: PPOConfig, collate, train, val):
    """The training and validation sets with every row checked: (train, val), the rows to leave out left out.

    Raises:
        ValueError: rows that cannot be used (unless ``data.skip_bad_rows``) or prompts longer than
            ``data.max_prompt_length`` (with ``data.truncation=error``, unless ``data.filter_overlong_prompts``),
            every one of them named by file, row and column, up to
            :data:`~verl.utils.dataset.row_checks.MAX_LISTED_PROBLEMS`, and counted.
    """
    data = config.data
    unusable: list[RowProblem] = []
    overlong: list[RowProblem] = []
    checked = []
    for dataset, name in ((train, "training"), (val, "validation")):
        if dataset is None:
            checked.append(None)
            continue
        unusable += dataset.bad_rows
        counts = collate.token_counts([dataset[index] for index in range(len(dataset))])
        long_rows = [index for index, count in enumerate(counts) if count > collate.max_prompt_length]
        if long_rows and data.filter_overlong_prompts:
            dataset = _drop_overlong(dataset, set(long_rows), collate.max_prompt_length, name)
        elif long_rows and data.truncation == "error":
            overlong += [_overlong(dataset, index, counts[index], data) for index in long_rows]
        elif long_rows:
            logger.info(
                "%d of %d %s prompts are longer than data.max_prompt_length=%d tokens: data.truncation=%s cuts them",
                len(long_rows),
                len(dataset),
                name,
                collate.max_prompt_length,
                data.truncation,
            )
        checked.append(dataset)
    refused = (unusable if not data.skip_bad_rows else []) + overlong
    if refused:
        raise ValueError(describe_problems(refused, _advice(refused, overlong, data)))
    if unusable:
        logger.warning(
            "data.skip_bad_rows: left out %d data row(s) that cannot be used, the first: %s",
            len(unusable),
            unusable[0],
        )
    return checked[0], checked[1]


def _overlong(dataset, index: int, count: int, data) -> RowProblem:
    file, row, line = dataset.origin(index)
    what = f"the prompt is {count} tokens, longer than data.max_prompt_length={data.max_prompt_length}"
    return RowProblem(file, row, data.prompt_key, what, line)


def _advice(refused: list[RowProblem], overlong: list[RowProblem], data) -> str:
    advice = []
    if len(refused) > len(overlong):
        advice.append(
            "Fix or remove the rows that cannot be used, or set data.skip_bad_rows=true to leave them out (counted "
            "in the log)."
        )
    if overlong:
        advice.append(
            f"For the prompts longer than data.max_prompt_length={data.max_prompt_length} tokens: raise it, set "
            "data.filter_overlong_prompts=true to leave them out (as verl does), or set data.truncation to 'left' "
            "or 'right' to cut them."
        )
    return " ".join(advice)


def _drop_overlong(dataset, long_rows: set[int], max_prompt_length: int, name: str):
    """``data.filter_overlong_prompts``: keep the prompts that fit ``data.max_prompt_length``, and say how many went."""
    kept = dataset.take([index for index in range(len(dataset)) if index not in long_rows])
    logger.warning(
        "data.filter_overlong_prompts: dropped %d of %d %s prompts longer than data.max_prompt_length=%d tokens",
        len(long_rows),
        len(dataset),
        name,
        max_prompt_length,
    )
    if not len(kept):
        raise ValueError(
            f"data.filter_overlong_prompts dropped every {name} prompt: all are longer than data.max_prompt_length="
            f"{max_prompt_length} tokens; raise it."
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
        tokenizer,
        data.max_prompt_length,
        truncation=data.truncation,
        # verl's agent loops take each row's chat (raw_chat) as their messages
        return_raw_chat=data.return_raw_chat or config.actor_rollout_ref.rollout.multi_turn.enable,
    )
    train, val = check_rows(config, collate, *_datasets(config, tokenizer))
    batch_size = step_sizes(config).train_batch_size
    if batch_size % world_size:
        raise ValueError(
            f"data.train_batch_size={batch_size} must be a multiple of the {world_size} "
            f"data-parallel workers (trainer.n_gpus_per_node x trainer.nnodes)."
        )
    loader = StatefulPromptLoader(
        train,
        batch_size,
        seed=int(data.seed),
        shuffle=bool(data.shuffle),
        collate_fn=collate,
        num_workers=data.dataloader_num_workers,
    )
    val_batches = _validation_batches(val, collate, world_size, data.val_batch_size)
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
