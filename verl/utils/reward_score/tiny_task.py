"""The embedded default task: reverse a short string of digits.

A prompt is a few random digits followed by ``=`` (``"3142="``); the answer is the same digits in reverse order
(``"2413"``), after which the model should emit its eos token. The score gives partial credit: the fraction of
answer positions the response gets right, divided by the longer of the two lengths so that padding a response with
extra characters cannot raise it. Partial credit is what lets a tiny model see a reward gradient early in RL (see
``verl/models/tiny/README.md`` for why this task was chosen).
"""

from __future__ import annotations

import random

DATA_SOURCE = "tiny_task"
MIN_DIGITS = 3
MAX_DIGITS = 5
PROMPT_SUFFIX = "="


def make_example(rng: random.Random) -> tuple[str, str]:
    """Draw one task instance.

    Args:
        rng: the random source; the same seed gives the same examples on every platform.

    Returns:
        ``(prompt, ground_truth)``, e.g. ``("3142=", "2413")``.
    """
    num_digits = rng.randint(MIN_DIGITS, MAX_DIGITS)
    digits = "".join(rng.choice("0123456789") for _ in range(num_digits))
    return digits + PROMPT_SUFFIX, digits[::-1]


def compute_score(solution_str: str, ground_truth: str) -> float:
    """Score a response by per-position agreement with the reversed digits.

    Surrounding whitespace is ignored. The score is ``num_correct_positions / max(len(answer), len(response))``,
    so a right prefix earns partial credit, and a response longer than the answer is diluted by its extra
    characters. An empty response (or an empty answer) scores 0.

    Args:
        solution_str: the decoded response, special tokens removed.
        ground_truth: the expected answer.

    Returns:
        A float in [0, 1]; 1 exactly when the response equals the answer.
    """
    response = solution_str.strip()
    answer = ground_truth.strip()
    num_positions = max(len(answer), len(response))
    if num_positions == 0 or not answer:
        return 0.0
    num_correct = sum(1 for got, want in zip(response, answer) if got == want)
    return num_correct / num_positions
