"""Prompt datasets for RL, under verl's package name: :mod:`verl.utils.dataset.rl_dataset` (files of prompts, the
embedded task, verl's ``RLHFDataset`` and ``collate_fn``), :mod:`verl.utils.dataset.row_checks` (reading files row by
row, each bad row named by file, row and column), :mod:`verl.utils.dataset.loader` (prompt batches and the resumable
loader the trainer uses) and the command ``python -m verl.utils.dataset.make_tiny_data`` (the embedded task as data
files in verl's layout)."""

from verl.utils.dataset.loader import TRUNCATION_MODES, PromptCollator, StatefulPromptLoader
from verl.utils.dataset.rl_dataset import RLHFDataset, chat_renderer, collate_fn, make_tiny_task_dataset

__all__ = [
    "TRUNCATION_MODES",
    "PromptCollator",
    "RLHFDataset",
    "StatefulPromptLoader",
    "chat_renderer",
    "collate_fn",
    "make_tiny_task_dataset",
]
