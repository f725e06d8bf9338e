"""Prompt datasets for RL: files of prompts with ground truth, the embedded task, collation and a resumable loader.

A dataset row is a prompt (str), the ground truth its reward scorer compares against (str) and a ``data_source``
(str) that picks the scorer. Rows come from parquet or JSONL files, or from :func:`make_tiny_task_dataset`, which
generates the embedded default task without any file. :class:`PromptCollator` turns rows into the shared batch
layout (prompts LEFT-padded to ``max_prompt_length``), and :class:`StatefulPromptLoader` hands out batches epoch
after epoch in a seeded order whose exact position is saved in checkpoints, so a resumed run sees the same data.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl.utils.reward_score import tiny_task

TRUNCATION_MODES = ("error", "left", "right")
_EXTENSIONS = {".parquet": "parquet", ".jsonl": "jsonl"}


def _read_records(path: Path) -> list[dict[str, Any]]:
    kind = _EXTENSIONS.get(path.suffix.lower())
    if kind is None:
        raise ValueError(
            f"Cannot read data file {str(path)!r}: unknown extension {path.suffix!r}. "
            "Accepted: .parquet, .jsonl (one JSON object per line). Convert the file to one of these."
        )
    if not path.is_file():
        raise ValueError(f"Data file {str(path)!r} does not exist. Check data.train_files / data.val_files.")
    if kind == "parquet":
        import pandas as pd

        return pd.read_parquet(path).to_dict(orient="records")
    records = []
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                message = f"{path}:{line_number} is not valid JSON ({err}); expected one JSON object per line."
                raise ValueError(message) from err
    return records


class RLHFDataset(torch.utils.data.Dataset):
    """Prompts with ground truth, read from parquet / JSONL files.

    Each item is ``{"raw_prompt": str, "ground_truth": str, "data_source": str, "raw_chat": list | None,
    "extra_info": Any, "index": int}``. A prompt is a string, or a chat as verl's data files hold it (a list of
    ``{"role", "content"}`` messages): the chat is rendered to ``raw_prompt`` by ``render_chat`` and kept as
    ``raw_chat``.

    Args:
        data_files: one path or a list of paths (``.parquet`` or ``.jsonl``), concatenated in order.
        prompt_key: column holding the prompt (``data.prompt_key``).
        ground_truth_key: column holding the reference answer; a verl-style ``reward_model`` column of dicts
            with a ``ground_truth`` entry is accepted when this column is absent.
        data_source_key: optional column naming the scorer per row (``data.reward_fn_key``).
        default_data_source: ``data_source`` for rows of files without that column.
        render_chat: turns a chat (list of messages) into the prompt text, e.g. the tokenizer's chat template
            (:func:`chat_renderer`); None refuses chat prompts.
        media_keys: columns of verl's multimodal data (``data.image_key``, ``data.video_key``); a row holding
            images or videos there is refused (multimodal training is out of scope here).

    Raises:
        ValueError: unknown extension, missing file, missing column, a prompt that is not a string, or a row with
            images or videos.
    """

    def __init__(
        self,
        data_files: str | Path | Sequence[str | Path],
        prompt_key: str = "prompt",
        ground_truth_key: str = "ground_truth",
        data_source_key: str = "data_source",
        default_data_source: str = "unknown",
        render_chat: Callable[[list[dict[str, str]]], str] | None = None,
        media_keys: Sequence[str] = (),
    ):
        paths = [data_files] if isinstance(data_files, (str, Path)) else list(data_files)
        if not paths:
            raise ValueError("RLHFDataset needs at least one data file (data.train_files / data.val_files).")
        rows: list[dict[str, Any]] = []
        keys = (prompt_key, ground_truth_key, data_source_key, default_data_source)
        for path in paths:
            for record in _read_records(Path(path)):
                _refuse_media(record, str(path), media_keys)
                rows.append(_to_row(record, str(path), *keys, render_chat=render_chat))
        self._rows = rows

    @classmethod
    def from_records(cls, records: Sequence[dict[str, str]]) -> RLHFDataset:
        """A dataset over in-memory rows with keys ``prompt``, ``ground_truth``, ``data_source``."""
        dataset = cls.__new__(cls)
        dataset._rows = [_to_row(r, "records", "prompt", "ground_truth", "data_source", "unknown") for r in records]
        return dataset

    def filter(self, keep: Callable[[dict[str, Any]], bool]) -> RLHFDataset:
        """A dataset of the rows for which ``keep(row)`` is true, in order (indices renumbered)."""
        return self.take([index for index, row in enumerate(self._rows) if keep(row)])

    def take(self, indices: Sequence[int]) -> RLHFDataset:
        """A dataset of the rows at ``indices``, in that order (indices renumbered)."""
        dataset = type(self).__new__(type(self))
        dataset._rows = [self._rows[index] for index in indices]
        return dataset

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        row = self._rows[index]
        return {**row, "index": int(index)}


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
        if value is None or (isinstance(value, float) and np.isnan(value)):
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
    record, where, prompt_key, ground_truth_key, data_source_key, default_data_source, render_chat=None
) -> dict[str, Any]:
    if prompt_key not in record:
        raise ValueError(
            f"{where}: missing column {prompt_key!r} (found {sorted(record)}). "
            f"Every row needs a {prompt_key!r} string or chat; rename your column or set data.prompt_key."
        )
    prompt = record[prompt_key]
    chat = _as_chat(prompt)
    if chat is not None:
        if render_chat is None:
            raise ValueError(f"{where}: column {prompt_key!r} holds chats, but no chat renderer was given.")
        prompt = render_chat(chat)
    if not isinstance(prompt, str):
        raise ValueError(
            f"{where}: column {prompt_key!r} must hold strings or chats (lists of {{role, content}} messages), "
            f"got {type(prompt).__name__}."
        )
    if ground_truth_key in record:
        ground_truth = record[ground_truth_key]
    elif isinstance(record.get("reward_model"), dict) and "ground_truth" in record["reward_model"]:
        ground_truth = record["reward_model"]["ground_truth"]
    else:
        raise ValueError(
            f"{where}: missing column {ground_truth_key!r} (found {sorted(record)}). Every row needs the "
            "reference answer the reward scorer compares against."
        )
    data_source = record.get(data_source_key)
    if data_source is None or (isinstance(data_source, float) and np.isnan(data_source)):
        data_source = default_data_source
    return {
        "raw_prompt": prompt,
        "ground_truth": str(ground_truth),
        "data_source": str(data_source),
        "raw_chat": chat,
        "extra_info": record.get("extra_info"),
    }


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
    return RLHFDataset.from_records(records)


class PromptCollator:
    """Tokenize rows into LEFT-padded prompt tensors of width ``max_prompt_length``.

    Args:
        tokenizer: a ``transformers`` tokenizer with a pad token.
        max_prompt_length: P, the width of every batch.
        truncation: what to do with a prompt longer than P: ``"error"`` (raise), ``"left"`` (drop its first
            tokens), ``"right"`` (drop its last tokens).

    Raises:
        ValueError: unknown ``truncation``, non-positive length, or a tokenizer without a pad token.
    """

    def __init__(self, tokenizer, max_prompt_length: int, truncation: str = "error", return_raw_chat: bool = False):
        if truncation not in TRUNCATION_MODES:
            raise ValueError(f"Unknown truncation {truncation!r}; accepted: {', '.join(TRUNCATION_MODES)}.")
        if max_prompt_length <= 0:
            raise ValueError(f"max_prompt_length must be positive, got {max_prompt_length!r}.")
        if tokenizer.pad_token_id is None:
            raise ValueError("The tokenizer has no pad token; load it with verl.models.loading.load_tokenizer.")
        self.tokenizer = tokenizer
        self.max_prompt_length = max_prompt_length
        self.truncation = truncation
        self.return_raw_chat = return_raw_chat

    def num_tokens(self, row: dict[str, Any]) -> int:
        """The length of a row's tokenized prompt, before any truncation."""
        return len(self.token_ids(row))

    def token_counts(self, rows: Sequence[dict[str, Any]]) -> list[int]:
        """:meth:`num_tokens` of every row, tokenized in two batches (rendered chats, plain prompts): what the
        overlong filter reads for a whole dataset, several times faster than a call per row."""
        counts = [0] * len(rows)
        for templated in (True, False):
            indices = [i for i, row in enumerate(rows) if self._templated(row) == templated]
            if indices:
                texts = [rows[i]["raw_prompt"] for i in indices]
                ids = self.tokenizer(texts, add_special_tokens=not templated)["input_ids"]
                for i, row_ids in zip(indices, ids, strict=True):
                    counts[i] = len(row_ids)
        return counts

    def token_ids(self, row: dict[str, Any]) -> list[int]:
        """A row's prompt tokens. A chat rendered by the tokenizer's template already holds the special tokens the
        template writes (Llama 3's, Gemma's and Mistral's write the BOS), so they are not added again, as in verl;
        a plain prompt, or a chat joined without a template, gets the tokenizer's own (its BOS)."""
        return self.tokenizer(row["raw_prompt"], add_special_tokens=not self._templated(row))["input_ids"]

    def _templated(self, row: dict[str, Any]) -> bool:
        return row.get("raw_chat") is not None and bool(getattr(self.tokenizer, "chat_template", None))

    def _fit(self, ids: list[int], prompt: str) -> list[int]:
        if len(ids) <= self.max_prompt_length:
            return ids
        if self.truncation == "left":
            return ids[-self.max_prompt_length :]
        if self.truncation == "right":
            return ids[: self.max_prompt_length]
        raise ValueError(
            f"Prompt {prompt[:60]!r} is {len(ids)} tokens, longer than data.max_prompt_length="
            f"{self.max_prompt_length}. Raise data.max_prompt_length, or set data.truncation to 'left' or 'right'."
        )

    def __call__(self, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """Collate rows.

        Returns:
            ``input_ids``, ``attention_mask``, ``position_ids``: (B, P) int64, left-padded, with
            ``position_ids = clamp(cumsum(attention_mask) - 1, min=0)``; and object arrays of length B:
            ``raw_prompt``, ``ground_truth``, ``data_source``, ``extra_info``, ``raw_chat`` (with
            ``return_raw_chat``), plus ``index`` (int64).
        """
        num_rows, width = len(rows), self.max_prompt_length
        input_ids = torch.full((num_rows, width), self.tokenizer.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((num_rows, width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids = self._fit(self.token_ids(row), row["raw_prompt"])
            if ids:
                input_ids[i, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
                attention_mask[i, width - len(ids) :] = 1
        position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)

        def column(key: str) -> np.ndarray:
            values = np.empty(num_rows, dtype=object)
            for i, row in enumerate(rows):  # element by element: list values must not become a 2-D array
                values[i] = row.get(key)
            return values

        collated = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "raw_prompt": column("raw_prompt"),
            "ground_truth": column("ground_truth"),
            "data_source": column("data_source"),
            "extra_info": column("extra_info"),
            "index": np.array([row["index"] for row in rows], dtype=np.int64),
        }
        if self.return_raw_chat:
            collated["raw_chat"] = column("raw_chat")
        return collated


class StatefulPromptLoader:
    """Batches of a dataset, epoch after epoch, in a seeded per-epoch order that can be saved and resumed.

    The order of epoch ``e`` is a permutation drawn from ``seed`` and ``e`` alone, so it does not depend on how
    many batches were drawn before; :meth:`state_dict` records ``(epoch, batch index within the epoch)`` and
    :meth:`load_state_dict` restores it, after which the loader yields exactly the batches the original would
    have.

    Args:
        dataset: anything with ``__len__`` and ``__getitem__``.
        batch_size: rows per batch.
        seed: seed of the shuffle.
        shuffle: False keeps the dataset order in every epoch.
        drop_last: drop the final short batch of each epoch (keeps every batch at ``batch_size`` rows).
        collate_fn: applied to each list of rows (e.g. a :class:`PromptCollator`); ``None`` yields the list.

    Raises:
        ValueError: non-positive ``batch_size``, or a dataset too small to fill a single batch.
    """

    def __init__(
        self,
        dataset,
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
        collate_fn: Callable[[list[Any]], Any] | None = None,
    ):
        if batch_size <= 0:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
        num_rows = len(dataset)
        if num_rows == 0 or (drop_last and num_rows < batch_size):
            raise ValueError(
                f"The dataset has {num_rows} rows, fewer than one batch of {batch_size} "
                "(data.train_batch_size). Use more data or a smaller batch size."
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.collate_fn = collate_fn
        self.epoch = 0
        self.batch_index = 0
        self._cached_order: tuple[int, list[int]] | None = None  # (epoch, its order): one shuffle per epoch

    def __len__(self) -> int:
        """Batches per epoch."""
        num_rows = len(self.dataset)
        return num_rows // self.batch_size if self.drop_last else -(-num_rows // self.batch_size)

    def _order(self, epoch: int) -> list[int]:
        """The row order of ``epoch``, a function of the seed and the epoch alone (so a resume recomputes it).

        Computed once per epoch: it costs O(rows), which on a large dataset would otherwise dominate each step.
        """
        if self._cached_order is None or self._cached_order[0] != epoch:
            if self.shuffle:
                generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
                order = torch.randperm(len(self.dataset), generator=generator).tolist()
            else:
                order = list(range(len(self.dataset)))
            self._cached_order = (epoch, order)
        return self._cached_order[1]

    def next_batch(self) -> Any:
        """The next batch; moves to the next epoch (a fresh order) after the last batch of one."""
        if self.batch_index >= len(self):
            self.epoch += 1
            self.batch_index = 0
        order = self._order(self.epoch)
        start = self.batch_index * self.batch_size
        rows = [self.dataset[i] for i in order[start : start + self.batch_size]]
        self.batch_index += 1
        return self.collate_fn(rows) if self.collate_fn is not None else rows

    def __iter__(self) -> Iterator[Any]:
        """Batches forever (epoch after epoch); stop by step count or :attr:`epoch`."""
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, int]:
        """``{"epoch", "batch_index", "seed"}``: the position of the next batch to hand out."""
        return {"epoch": self.epoch, "batch_index": self.batch_index, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume at a position saved by :meth:`state_dict`.

        Raises:
            ValueError: the state was saved with another seed (the order would differ) or is malformed.
        """
        missing = {"epoch", "batch_index"} - set(state)
        if missing:
            raise ValueError(f"Loader state lacks {sorted(missing)}; expected a dict saved by state_dict().")
        if "seed" in state and int(state["seed"]) != self.seed:
            raise ValueError(
                f"Loader state was saved with data.seed={state['seed']} but this run uses {self.seed}; "
                "resume with the same data.seed or start a fresh run."
            )
        self.epoch = int(state["epoch"])
        self.batch_index = int(state["batch_index"])
