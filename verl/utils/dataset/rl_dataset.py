"""Prompt datasets for RL (verl's ``verl.utils.dataset.rl_dataset``): files of prompts, the embedded task, collate_fn.

A dataset row is a prompt (str), the ground truth its reward scorer compares against (str) and a ``data_source``
(str) that picks the scorer. Rows come from parquet or JSONL files, or from :func:`make_tiny_task_dataset`, which
generates the embedded default task without any file. The trainer batches them with
:mod:`verl.utils.dataset.loader`.

:class:`RLHFDataset` also takes verl's constructor, ``RLHFDataset(data_files, tokenizer, config, processor=None,
max_samples=-1)`` with verl's ``data`` keys in ``config``; its items are then verl's (see the class), to be batched
with :func:`collate_fn` as in verl.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl.utils.dataset.row_checks import BadRow, RowProblem, describe_problems, is_null, read_records
from verl.utils.reward_score import tiny_task

__all__ = ["RLHFDataset", "chat_renderer", "collate_fn", "make_tiny_task_dataset"]


def collate_fn(data_list: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Items (dicts with the same keys) as one batch, as verl's ``collate_fn`` gives it: a key whose values are
    tensors gets them stacked along a new first dimension; any other key gets a 1-D object array of its values
    (lists and dicts stay whole, one per item).

    Raises:
        ValueError: no items, or a key that some items lack.
    """
    if not data_list:
        raise ValueError("collate_fn needs at least one item.")
    keys = list(data_list[0])
    batch: dict[str, Any] = {}
    for key in keys:
        if any(key not in item for item in data_list):
            raise ValueError(f"collate_fn: key {key!r} is missing from some items; every item needs the same keys.")
        values = [item[key] for item in data_list]
        if all(isinstance(value, torch.Tensor) for value in values):
            batch[key] = torch.stack(values, dim=0)
        else:
            column = np.empty(len(values), dtype=object)
            for position, value in enumerate(values):  # element by element: a list value stays one element
                column[position] = value
            batch[key] = column
    return batch


class RLHFDataset(torch.utils.data.Dataset):
    """Prompts with ground truth, read from parquet / JSONL files.

    Each item is ``{"raw_prompt": str, "ground_truth": str, "data_source": str, "raw_chat": list | None,
    "extra_info": Any, "index": int}``. A prompt is a string, or a chat as verl's data files hold it (a list of
    ``{"role", "content"}`` messages): the chat is rendered to ``raw_prompt`` by ``render_chat`` and kept as
    ``raw_chat``.

    verl's constructor, ``RLHFDataset(data_files, tokenizer, config, processor=None, max_samples=-1)``, reads
    ``prompt_key``, ``max_prompt_length``, ``filter_overlong_prompts``, ``apply_chat_template_kwargs``,
    ``image_key``, ``video_key``, ``shuffle`` and ``seed`` from ``config`` (verl's ``data`` section; a missing key
    takes verl's default; ``tool_config_path`` / ``function_tool_path`` are refused) and gives verl's items: the
    row's columns, ``raw_prompt`` as a chat (a string prompt becomes one user message), ``dummy_tensor``
    (``tensor([0], uint8)``), ``index``, ``tools_kwargs`` and ``interaction_kwargs`` (from ``extra_info``).
    ``max_samples`` > 0 keeps that many rows (the first ones, or a seeded sample with ``config.shuffle``);
    ``filter_overlong_prompts`` drops rows whose templated prompt is longer than ``max_prompt_length`` tokens.

    Args:
        data_files: one path or a list of paths (``.parquet`` or ``.jsonl``), concatenated in order.
        tokenizer, config, processor, max_samples: verl's constructor (see above); a ``processor`` (multimodal
            input) is refused.
        prompt_key: column holding the prompt (``data.prompt_key``).
        ground_truth_key: column holding the reference answer; a verl-style ``reward_model`` column of dicts
            with a ``ground_truth`` entry is accepted when this column is absent.
        data_source_key: optional column naming the scorer per row (``data.reward_fn_key``).
        default_data_source: ``data_source`` for rows of files without that column.
        render_chat: turns a chat (list of messages) into the prompt text, e.g. the tokenizer's chat template
            (:func:`chat_renderer`); None refuses chat prompts.
        media_keys: columns of verl's multimodal data (``data.image_key``, ``data.video_key``); a row holding
            images or videos there is refused (multimodal training is out of scope here).
        on_bad_row: what to do with rows that cannot be used (:class:`~verl.utils.dataset.row_checks.RowProblem`:
            a missing, null or empty prompt or ground truth, a value of the wrong type, text that is not UTF-8, a
            JSONL line that is not JSON): ``"raise"`` (every one of them listed in one ``ValueError``) or
            ``"skip"`` (left out, listed in :attr:`bad_rows`).

    Attributes:
        bad_rows: the rows left out with ``on_bad_row="skip"``, each with its file, row and column.

    Raises:
        ValueError: unknown extension, missing file, a row with images or videos, or (``on_bad_row="raise"``) rows
            that cannot be used.
    """

    def __init__(
        self,
        data_files: str | Path | Sequence[str | Path],
        tokenizer: Any = None,
        config: Any = None,
        processor: Any = None,
        max_samples: int = -1,
        *,
        prompt_key: str = "prompt",
        ground_truth_key: str = "ground_truth",
        data_source_key: str = "data_source",
        default_data_source: str = "unknown",
        render_chat: Callable[[list[dict[str, str]]], str] | None = None,
        media_keys: Sequence[str] = (),
        on_bad_row: str = "raise",
    ):
        paths = [data_files] if isinstance(data_files, (str, Path)) else list(data_files)
        if not paths:
            raise ValueError("RLHFDataset needs at least one data file (data.train_files / data.val_files).")
        if on_bad_row not in ("raise", "skip"):
            raise ValueError(f"on_bad_row={on_bad_row!r}; accepted: 'raise', 'skip'.")
        self._verl_items = config is not None
        self._origins: list[tuple[str, int, int | None]] = []  # (file, row, JSONL line) of each row
        self.bad_rows: list[RowProblem] = []
        if self._verl_items:
            self._rows = _verl_rows(paths, tokenizer, config, processor, max_samples)
            return
        if tokenizer is not None or processor is not None:
            raise TypeError("RLHFDataset(data_files, tokenizer, config): verl's constructor needs the config too.")
        rows: list[dict[str, Any]] = []
        keys = (prompt_key, ground_truth_key, data_source_key, default_data_source)
        for path in paths:
            records, problems = read_records(Path(path))
            for record in records:
                _refuse_media(record.values, str(path), media_keys)
                try:
                    rows.append(_to_row(record.values, *keys, render_chat=render_chat))
                except BadRow as bad:
                    problems.append(record.problem(bad.column, bad.what))
                    continue
                self._origins.append((record.file, record.row, record.line))
            self.bad_rows += sorted(problems, key=lambda problem: problem.row)
        if self.bad_rows and on_bad_row == "raise":
            raise ValueError(describe_problems(self.bad_rows, "Fix or remove these rows."))
        self._rows = rows

    @classmethod
    def from_records(cls, records: Sequence[dict[str, str]], name: str = "records") -> RLHFDataset:
        """A dataset over in-memory rows with keys ``prompt``, ``ground_truth``, ``data_source`` (``name`` stands
        for the file in :meth:`origin`).

        Raises:
            ValueError: a row that cannot be used.
        """
        dataset = cls.__new__(cls)
        dataset._verl_items = False
        dataset.bad_rows = []
        dataset._origins = [(name, row, None) for row in range(len(records))]
        try:
            dataset._rows = [_to_row(r, "prompt", "ground_truth", "data_source", "unknown") for r in records]
        except BadRow as bad:
            raise ValueError(f"{name}: {bad}") from None
        return dataset

    def origin(self, index: int) -> tuple[str, int, int | None]:
        """Where row ``index`` comes from: (file, 0-based row in the file, 1-based line of a JSONL file or None)."""
        return self._origins[index]

    def filter(self, keep: Callable[[dict[str, Any]], bool]) -> RLHFDataset:
        """A dataset of the rows for which ``keep(row)`` is true, in order (indices renumbered)."""
        return self.take([index for index, row in enumerate(self._rows) if keep(row)])

    def take(self, indices: Sequence[int]) -> RLHFDataset:
        """A dataset of the rows at ``indices``, in that order (indices renumbered)."""
        dataset = type(self).__new__(type(self))
        dataset._verl_items = getattr(self, "_verl_items", False)
        dataset._rows = [self._rows[index] for index in indices]
        dataset._origins = [self._origins[index] for index in indices] if self._origins else []
        dataset.bad_rows = list(self.bad_rows)
        return dataset

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        row = self._rows[index]
        if getattr(self, "_verl_items", False):
            return _verl_item(row)
        return {**row, "index": int(index)}


# keys of verl's data section that change what verl's RLHFDataset keeps, and that this one does not read
_UNREAD_VERL_KEYS = ("tool_config_path", "function_tool_path")


def _config_value(config: Any, key: str, default: Any) -> Any:
    value = config.get(key, default) if hasattr(config, "get") else getattr(config, key, default)
    return default if value is None else value


def _verl_rows(paths: Sequence[str | Path], tokenizer: Any, config: Any, processor: Any, max_samples: int) -> list:
    """The rows of verl's constructor: every column kept, ``max_samples`` and the length filter applied."""
    if processor is not None:
        raise ValueError(
            "RLHFDataset(processor=...): multimodal (vision-language) data is out of scope here; pass processor=None."
        )
    for key in _UNREAD_VERL_KEYS:
        if _config_value(config, key, None) is not None:
            raise ValueError(
                f"RLHFDataset: data.{key} (tool schemas counted in the prompt-length filter) is not read here; "
                "leave it null."
            )
    prompt_key = _config_value(config, "prompt_key", "prompt")
    media_keys = (_config_value(config, "image_key", "images"), _config_value(config, "video_key", "videos"))
    rows = []
    for path in paths:
        records, problems = read_records(Path(path))
        if problems:
            raise ValueError(describe_problems(problems, "Fix or remove these rows."))
        for record in records:
            _refuse_media(record.values, str(path), media_keys)
            if prompt_key not in record.values:
                found = sorted(record.values)
                raise ValueError(f"{path}: no column {prompt_key!r} (found {found}); set data.prompt_key.")
            rows.append(dict(record.values))
    if 0 < max_samples < len(rows):
        if _config_value(config, "shuffle", False):
            seed = config.get("seed") if hasattr(config, "get") else None
            chosen = np.random.default_rng(seed).choice(len(rows), size=max_samples, replace=False)
        else:
            chosen = np.arange(max_samples)
        rows = [rows[int(i)] for i in chosen]
    if _config_value(config, "filter_overlong_prompts", True) and tokenizer is not None:
        limit = _config_value(config, "max_prompt_length", 1024)
        render = chat_renderer(tokenizer, dict(_config_value(config, "apply_chat_template_kwargs", {})))
        rows = [r for r in rows if len(tokenizer(render(_chat_of(r[prompt_key])))["input_ids"]) <= limit]
    for row in rows:
        row["raw_prompt"] = _chat_of(row[prompt_key])
    return rows


def _chat_of(prompt: Any) -> list[dict[str, str]]:
    chat = _as_chat(prompt)
    if chat is not None:
        return chat
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    raise ValueError(f"a prompt must be a string or a chat (a list of {{role, content}} messages); got {prompt!r}.")


def _verl_item(row: dict[str, Any]) -> dict[str, Any]:
    """verl's item layout of a row (a fresh dict each time)."""
    item = dict(row)
    extra = item.get("extra_info")
    extra = dict(extra) if isinstance(extra, dict) else {}
    item["extra_info"] = extra
    item["dummy_tensor"] = torch.tensor([0], dtype=torch.uint8)
    item["index"] = extra.get("index", 0)
    item["tools_kwargs"] = extra.get("tools_kwargs", {})
    item["interaction_kwargs"] = extra.get("interaction_kwargs", {})
    return item


def _as_chat(value: Any) -> list[dict[str, str]] | None:
    """A chat (list of {role, content} messages, as verl's files hold prompts) as plain dicts; None otherwise."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, list) or not value:
        return None
    if not all(isinstance(m, dict) and isinstance(m.get("content"), str) and "role" in m for m in value):
        return None
    return [{"role": str(m["role"]), "content": m["content"]} for m in value]


def _refuse_media(record: dict[str, Any], where: str, media_keys: Sequence[str]) -> None:
    """A row with images or videos in a multimodal column is refused: multimodal training is out of scope."""
    for key in media_keys:
        value = record.get(key)
        if is_null(value):
            continue
        if len(value) if hasattr(value, "__len__") else True:
            raise ValueError(
                f"{where}: column {key!r} (data.image_key / data.video_key) holds images or videos: multimodal "
                "(vision-language) training is out of scope here; use text-only prompts."
            )


def chat_renderer(tokenizer, template_kwargs: dict[str, Any] | None = None) -> Callable[[list[dict[str, str]]], str]:
    """The tokenizer's chat template (with the assistant's turn opened; ``template_kwargs``, verl's
    ``data.apply_chat_template_kwargs``, passed on to ``apply_chat_template``), or, for a tokenizer without one, the
    messages' contents joined by newlines."""
    extra = dict(template_kwargs or {})

    def render(messages: list[dict[str, str]]) -> str:
        if getattr(tokenizer, "chat_template", None):
            return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **extra)
        return "\n".join(m["content"] for m in messages)

    return render


def _to_row(
    record, prompt_key, ground_truth_key, data_source_key, default_data_source, render_chat=None
) -> dict[str, Any]:
    """A record as a dataset row.

    Raises:
        BadRow: a missing, null or empty prompt or ground truth, or a prompt that is neither a string nor a chat.
        ValueError: a chat prompt with no ``render_chat`` (the caller's to give).
    """
    if prompt_key not in record:
        raise BadRow(
            None,
            f"missing column {prompt_key!r} (found {sorted(record)}). Every row needs a {prompt_key!r} string or "
            "chat; rename your column or set data.prompt_key.",
        )
    prompt, chat = _prompt_text(record[prompt_key], prompt_key, render_chat)
    if ground_truth_key in record:
        column, ground_truth = ground_truth_key, record[ground_truth_key]
    elif isinstance(record.get("reward_model"), dict) and "ground_truth" in record["reward_model"]:
        column, ground_truth = "reward_model.ground_truth", record["reward_model"]["ground_truth"]
    else:
        raise BadRow(
            None,
            f"missing column {ground_truth_key!r} (found {sorted(record)}). Every row needs the reference answer "
            "the reward scorer compares against.",
        )
    if is_null(ground_truth):
        # str() would make it the answer "None" (or "nan"), which the scorer would then reward
        raise BadRow(column, "the ground truth is null; every row needs the answer the reward scorer compares against")
    data_source = record.get(data_source_key)
    if is_null(data_source):
        data_source = default_data_source
    row = {
        "raw_prompt": prompt,
        "ground_truth": str(ground_truth),
        "data_source": str(data_source),
        "raw_chat": chat,
        "extra_info": record.get("extra_info"),
    }
    if not is_null(record.get("agent_name")):  # verl's column: the agent loop of the row (multi-turn rollouts)
        row["agent_name"] = str(record["agent_name"])
    return row


def _prompt_text(prompt: Any, prompt_key: str, render_chat) -> tuple[str, list[dict[str, str]] | None]:
    """The prompt of a row as text (a chat rendered), and the chat (None for a string prompt).

    Raises:
        BadRow: a null or empty prompt, or one that is neither a string nor a chat.
    """
    if is_null(prompt):
        raise BadRow(prompt_key, "the prompt is null")
    chat = _as_chat(prompt)
    if chat is not None:
        if render_chat is None:
            raise ValueError(f"column {prompt_key!r} holds chats, but no chat renderer was given.")
        if not any(message["content"].strip() for message in chat):
            raise BadRow(prompt_key, "the prompt is empty (every message of the chat has empty content)")
        return render_chat(chat), chat
    if isinstance(prompt, (list, np.ndarray)) and len(prompt) == 0:
        raise BadRow(prompt_key, "the prompt is empty (a chat without messages)")
    if not isinstance(prompt, str):
        raise BadRow(
            prompt_key,
            f"must hold strings or chats (lists of {{role, content}} messages), got {type(prompt).__name__}: "
            f"{_short(prompt)}",
        )
    if not prompt.strip():
        raise BadRow(prompt_key, f"the prompt is empty ({prompt!r})")
    return prompt, None


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value.tolist() if isinstance(value, np.ndarray) else value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def make_tiny_task_dataset(num_examples: int, seed: int = 0) -> RLHFDataset:
    """Generate the embedded reverse-the-digits task (``data_source="tiny_task"``) deterministically.

    Args:
        num_examples: number of rows.
        seed: the same seed gives the same rows.

    Raises:
        ValueError: ``num_examples`` is not positive.
    """
    if num_examples <= 0:
        raise ValueError(f"num_examples must be a positive integer, got {num_examples!r}.")
    rng = random.Random(seed)
    records = []
    for _ in range(num_examples):
        prompt, answer = tiny_task.make_example(rng)
        records.append({"prompt": prompt, "ground_truth": answer, "data_source": tiny_task.DATA_SOURCE})
    return RLHFDataset.from_records(records, name="the embedded task")
