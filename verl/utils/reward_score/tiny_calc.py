"""The embedded tool task: arithmetic that the tiny tool model can only get right by calling a calculator.

A prompt asks for a product of two 2-digit numbers or a sum of two 3-digit numbers (``"37*48=?"``); the ground
truth is the result as a decimal string (``"1776"``). The intended trajectory is a ``calculator`` tool call with the
expression, the tool's answer in a ``<tool_response>``, then the result as the final answer (see
``verl/models/tiny_tool/README.md``).

The score is the per-position credit of the *final answer* only: the text after the last ``</tool_response>`` (the
whole response when there is none), cut at a ``<tool_call>`` that got no response, with chat markup removed. The
score is ``num_correct_positions / max(len(answer), len(final_answer))`` as in :mod:`tiny_task`, so ``1776`` scores
1.0, ``1766`` 0.75, ``17760`` 0.8 and an empty final answer 0. The tool's own answer earns nothing by itself: the
model has to copy it into its final turn. Partial credit gives group-normalised advantages (GRPO) a gradient from
the first step, and a trajectory that used the calculator right scores 1 where a guess scores well below it.
"""

from __future__ import annotations

import random
import re

DATA_SOURCE = "tiny_calc"
PROMPT_SUFFIX = "=?"
# (operator, smallest operand, largest operand): the answers are 3 to 4 digits, beyond what the tiny model computes.
OPERATIONS = (("*", 10, 99), ("+", 100, 999))
_TOOL_RESPONSE_END = "</tool_response>"
_TOOL_CALL_START = "<tool_call>"
_MARKUP = re.compile(r"<\|im_start\|>|<\|im_end\|>|<pad>|<\|endoftext\|>")
_ROLE_HEADER = re.compile(r"^\s*(assistant|tool|user)?\s*")


def make_example(rng: random.Random) -> tuple[str, str]:
    """Draw one task instance: ``(expression, ground_truth)``, e.g. ``("37*48", "1776")`` or ``("512+349", "861")``.

    The prompt shown to the model is ``expression + PROMPT_SUFFIX``. The same seed gives the same examples on every
    platform (only ``random.Random`` integer draws are used).
    """
    operator, low, high = OPERATIONS[rng.randrange(len(OPERATIONS))]
    left, right = rng.randint(low, high), rng.randint(low, high)
    value = left * right if operator == "*" else left + right
    return f"{left}{operator}{right}", str(value)


def extract_final_answer(solution_str: str) -> str:
    """The model's final answer in a decoded trajectory.

    Takes the text after the last ``</tool_response>`` (all of it when there is none), cuts it at the first
    ``<tool_call>`` (a call that was never answered leaves no final answer), drops ``<|im_start|>``, ``<|im_end|>``
    and padding, a leading role header (``assistant``, left there when special tokens are skipped in decoding)
    and surrounding whitespace.
    """
    text = solution_str.rsplit(_TOOL_RESPONSE_END, 1)[-1]
    text = text.split(_TOOL_CALL_START, 1)[0]
    text = _MARKUP.sub("", text)
    return _ROLE_HEADER.sub("", text, count=1).strip()


def compute_score(solution_str: str, ground_truth: str) -> float:
    """Per-position credit of the final answer against ``ground_truth``; a float in [0, 1], 1 exactly when equal.

    Args:
        solution_str: the decoded response (the whole multi-turn trajectory after the prompt; with or without
            special tokens).
        ground_truth: the expected result, e.g. ``"1776"``.
    """
    answer = extract_final_answer(solution_str)
    expected = ground_truth.strip()
    num_positions = max(len(expected), len(answer))
    if num_positions == 0 or not expected:
        return 0.0
    num_correct = sum(1 for got, want in zip(answer, expected) if got == want)
    return num_correct / num_positions
