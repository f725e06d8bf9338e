"""Turn a local GSM8K file into verl's training format: the parquet layout verl's own preprocessing writes.

GSM8K rows have a ``question`` and an ``answer`` whose last line is ``#### <number>``. Each row becomes
``data_source="openai/gsm8k"``; a ``prompt`` chat of one user message (the question plus an instruction to end
with ``#### <answer>``, the format the ``openai/gsm8k`` scorer in :mod:`verl.utils.reward_score.gsm8k` reads);
``ability="math"``; ``reward_model={"style": "rule", "ground_truth": <the number after ####, normalised the way
the scorer normalises responses>}``; and ``extra_info`` (split, index, the original question and answer). Files
written by verl's preprocessing and by this script read the same. Nothing is downloaded: point ``--input`` at a
JSONL or parquet copy of the split you have.

Usage::

    python examples/data_preprocess/gsm8k.py --input gsm8k/train.jsonl --output_dir ~/data/gsm8k --split train
    python examples/data_preprocess/gsm8k.py --input gsm8k/test.jsonl --output_dir ~/data/gsm8k --split test
    # then: data.train_files=~/data/gsm8k/train.parquet data.val_files=~/data/gsm8k/test.parquet
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from verl.utils.reward_score.gsm8k import extract_solution

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
SPLITS = ("train", "test", "val")
COLUMNS = ["data_source", "prompt", "ability", "reward_model", "extra_info"]


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The records of a ``.jsonl`` (one JSON object per line) or ``.parquet`` file.

    Raises:
        ValueError: missing file, unknown extension, or a JSONL line that is not a JSON object.
    """
    if not path.is_file():
        raise ValueError(f"--input {str(path)!r} does not exist; pass a local GSM8K .jsonl or .parquet file.")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return pd.read_parquet(path).to_dict(orient="records")
    if suffix != ".jsonl":
        raise ValueError(f"--input {str(path)!r}: unknown extension {suffix!r}; accepted: .jsonl, .parquet.")
    rows = []
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{line_number} is not valid JSON ({err}).") from err
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{line_number} must be a JSON object with question/answer fields.")
            rows.append(record)
    return rows


def make_prompt(question: str) -> str:
    """The training prompt of one GSM8K question."""
    return f"{question.strip()} {INSTRUCTION}"


def convert_row(record: dict[str, Any], where: str, split: str = "train", index: int = 0) -> dict[str, Any]:
    """One GSM8K record -> a row of verl's layout (``data_source``, ``prompt`` chat, ``ability``,
    ``reward_model``, ``extra_info``).

    Raises:
        ValueError: ``question`` or ``answer`` missing or not a string, or an answer without ``#### <number>``.
    """
    for field in ("question", "answer"):
        if not isinstance(record.get(field), str):
            raise ValueError(
                f"{where}: field {field!r} must be a string (found fields {sorted(record)}); GSM8K rows have "
                f"'question' and 'answer'."
            )
    ground_truth = extract_solution(record["answer"], method="strict")
    if ground_truth is None:
        raise ValueError(f"{where}: the answer does not end with '#### <number>': {record['answer'][-80:]!r}.")
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": make_prompt(record["question"])}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"split": split, "index": index, "question": record["question"], "answer": record["answer"]},
    }


def convert_file(input_path: Path, output_dir: Path, split: str) -> Path:
    """Convert ``input_path`` and write ``<output_dir>/<split>.parquet``; returns the written path.

    Raises:
        ValueError: bad split name, unreadable input, an empty file, or a malformed row (see :func:`convert_row`).
    """
    if split not in SPLITS:
        raise ValueError(f"--split {split!r} is not supported; use one of {list(SPLITS)}.")
    records = read_rows(input_path)
    if not records:
        raise ValueError(f"--input {str(input_path)!r} has no rows.")
    rows = [convert_row(record, f"{input_path} row {index}", split, index) for index, record in enumerate(records)]
    output_dir.mkdir(parents=True, exist_ok=True)
    output_path = output_dir / f"{split}.parquet"
    pd.DataFrame(rows, columns=COLUMNS).to_parquet(output_path, index=False)
    return output_path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, type=Path, help="local GSM8K .jsonl or .parquet file")
    parser.add_argument("--output_dir", required=True, type=Path, help="folder for <split>.parquet")
    parser.add_argument("--split", default="train", help=f"output name, one of {', '.join(SPLITS)}")
    args = parser.parse_args(argv)
    try:
        output_path = convert_file(args.input, args.output_dir.expanduser(), args.split)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {len(pd.read_parquet(output_path))} rows to {output_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
