"""Batches of prompt rows: :class:`PromptCollator` (tokenized, LEFT-padded prompts) and the resumable
:class:`StatefulPromptLoader` (a seeded order whose position is saved in checkpoints; with worker processes, verl's
``data.dataloader_num_workers``, the rows are read and collated ahead in a ``torch.utils.data.DataLoader``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.utils.data

__all__ = ["TRUNCATION_MODES", "PromptCollator", "StatefulPromptLoader"]

TRUNCATION_MODES = ("error", "left", "right")


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
            ``return_raw_chat``) and ``agent_name`` (when a row has one), plus ``index`` (int64).
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
        if any(row.get("agent_name") is not None for row in rows):  # verl's per-row agent loop (None: the default)
            collated["agent_name"] = column("agent_name")
        return collated


def _rows(rows: list[Any]) -> list[Any]:
    """The DataLoader's collate function without one: the rows as they are."""
    return rows


class StatefulPromptLoader:
    """Batches of a dataset, epoch after epoch, in a seeded per-epoch order that can be saved and resumed.

    The order of epoch ``e`` is a permutation drawn from ``seed`` and ``e`` alone, so it does not depend on how
    many batches were drawn before; :meth:`state_dict` records ``(epoch, batch index within the epoch)`` and
    :meth:`load_state_dict` restores it, after which the loader yields exactly the batches the original would
    have.

    With ``num_workers`` > 0 the rest of the current epoch's batches come from a ``torch.utils.data.DataLoader``
    over the same order (its ``batch_sampler``) with that many worker processes, which read and collate a few
    batches ahead of the step. The batches are the same as in-process; the position counts the batches handed
    out, so the ones read ahead are read again after a resume, and a restored position starts a fresh DataLoader.

    Args:
        dataset: anything with ``__len__`` and ``__getitem__``.
        batch_size: rows per batch.
        seed: seed of the shuffle.
        shuffle: False keeps the dataset order in every epoch.
        drop_last: drop the final short batch of each epoch (keeps every batch at ``batch_size`` rows).
        collate_fn: applied to each list of rows (e.g. a :class:`PromptCollator`); ``None`` yields the list.
        num_workers: worker processes of the DataLoader (verl's ``data.dataloader_num_workers``); 0 reads and
            collates each batch in this process when it is asked for.

    Raises:
        ValueError: non-positive ``batch_size``, negative ``num_workers``, or a dataset too small to fill a single
            batch.
    """

    def __init__(
        self,
        dataset,
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        num_workers: int = 0,
    ):
        if batch_size <= 0:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
        if num_workers < 0:
            raise ValueError(f"num_workers must be 0 or more (data.dataloader_num_workers), got {num_workers!r}.")
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
        self.num_workers = num_workers
        self.epoch = 0
        self.batch_index = 0
        self._cached_order: tuple[int, list[int]] | None = None  # (epoch, its order): one shuffle per epoch
        # with workers: the DataLoader of the current epoch's remaining batches and its iterator (None: none open)
        self.dataloader: torch.utils.data.DataLoader | None = None
        self._ahead: Iterator[Any] | None = None

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
            self._close()
        if self.num_workers:
            if self._ahead is None:
                self._open()
            batch = next(self._ahead)
        else:
            rows = [self.dataset[i] for i in self._batch_rows(self.epoch, self.batch_index)]
            batch = self.collate_fn(rows) if self.collate_fn is not None else rows
        self.batch_index += 1
        return batch

    def _batch_rows(self, epoch: int, index: int) -> list[int]:
        """The row indices of batch ``index`` of ``epoch``."""
        start = index * self.batch_size
        return self._order(epoch)[start : start + self.batch_size]

    def _open(self) -> None:
        """A DataLoader over the current epoch's batches from :attr:`batch_index` on, its workers started."""
        self.dataloader = torch.utils.data.DataLoader(
            self.dataset,
            batch_sampler=[self._batch_rows(self.epoch, index) for index in range(self.batch_index, len(self))],
            collate_fn=self.collate_fn if self.collate_fn is not None else _rows,
            num_workers=self.num_workers,
        )
        self._ahead = iter(self.dataloader)

    def _close(self) -> None:
        """Let the open DataLoader go (its workers stop with its iterator)."""
        self.dataloader, self._ahead = None, None

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
        position = (int(state["epoch"]), int(state["batch_index"]))
        if position != (self.epoch, self.batch_index):
            self._close()  # the batches read ahead from the old position are not the next ones
        self.epoch, self.batch_index = position
