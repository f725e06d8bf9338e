"""Write the embedded tool task as data files in verl's layout: ``python -m verl.utils.dataset.make_tiny_tool_data
--out DIR``.

The task (:mod:`verl.utils.reward_score.tiny_calc`) asks for ``37*48=?``-style arithmetic that the tiny tool model
(``verl/models/tiny_tool``) can only get right by calling the ``calculator`` tool. The rows follow verl's tool-agent
preprocessing (``examples/data_preprocess/gsm8k_tool_agent_loop.py``): ``data_source="tiny_calc"``,
``agent_name="tool_agent"``, ``prompt`` a chat of one user message, ``ability="math"``,
``reward_model={"style": "rule", "ground_truth": "1776"}`` and ``extra_info`` with ``split``, ``index``,
``expression``, ``need_tools_kwargs=True`` and ``tools_kwargs={"calculator": {"create_kwargs": {"ground_truth":
...}}}``. ``DIR/train.parquet`` and ``DIR/test.parquet`` are written; the same ``--seed`` writes the same rows.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

from verl.utils.dataset.make_tiny_data import data_files_cli, write_split_files
from verl.utils.reward_score import tiny_calc

__all__ = ["ABILITY", "AGENT_NAME", "TOOL_NAME", "tiny_calc_rows", "tool_trajectory", "write_tiny_tool_data"]

ABILITY = "math"
AGENT_NAME = "tool_agent"
TOOL_NAME = "calculator"


def tool_trajectory(expression: str, answer: str, use_tool: bool = True) -> list[dict]:
    """The chat messages of an ideal trajectory for one task instance.

    With ``use_tool``: the user's question, an assistant turn that calls the calculator with the expression, the
    tool's answer, and an assistant turn stating it. Without: the question and a direct answer.
    """
    messages = [{"role": "user", "content": expression + tiny_calc.PROMPT_SUFFIX}]
    if use_tool:
        call = {"type": "function", "function": {"name": TOOL_NAME, "arguments": {"expression": expression}}}
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append({"role": "tool", "content": answer})
    messages.append({"role": "assistant", "content": answer})
    return messages


def tiny_calc_rows(num_rows: int, seed: int, split: str) -> list[dict]:
    """``num_rows`` rows of the tool task in verl's layout, drawn from ``seed``."""
    rng = random.Random(seed)
    rows = []
    for index in range(num_rows):
        expression, answer = tiny_calc.make_example(rng)
        rows.append(
            {
                "data_source": tiny_calc.DATA_SOURCE,
                "agent_name": AGENT_NAME,
                "prompt": tool_trajectory(expression, answer)[:1],
                "ability": ABILITY,
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {
                    "split": split,
                    "index": index,
                    "expression": expression,
                    "need_tools_kwargs": True,
                    "tools_kwargs": {TOOL_NAME: {"create_kwargs": {"ground_truth": answer}}},
                },
            }
        )
    return rows


def write_tiny_tool_data(out: Path, num_train: int, num_test: int, seed: int = 0) -> dict[str, str]:
    """``out/train.parquet`` (``num_train`` rows from ``seed``) and ``out/test.parquet`` (``num_test`` rows from
    ``seed + 1``); returns {"train": path, "test": path}.

    Raises:
        ValueError: a row count below 1.
    """
    return write_split_files(tiny_calc_rows, out, num_train, num_test, seed)


def main(argv: Sequence[str] | None = None) -> None:
    data_files_cli(
        "python -m verl.utils.dataset.make_tiny_tool_data", __doc__.splitlines()[0], write_tiny_tool_data, argv
    )


if __name__ == "__main__":
    main()
