"""Rule-based scorer for GSM8K-style math word problems.

The reference solutions of GSM8K end with ``#### <number>``. The ``strict`` method accepts only an answer written
that way (the last ``####`` line wins); the ``flexible`` method falls back to the last number anywhere in the
response. Numbers are compared as strings after removing thousands separators, a leading ``$`` and a trailing
period, so ``"1,000"`` and ``"1000"`` agree but ``"1000.0"`` and ``"1000"`` do not (GSM8K answers are integers).
"""

from __future__ import annotations

import re

_STRICT_PATTERN = re.compile(r"####\s*\$?\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)")
_NUMBER_PATTERN = re.compile(r"-?\$?[0-9][0-9,]*(?:\.[0-9]+)?")
_METHODS = ("strict", "flexible")


def _normalize_number(text: str) -> str:
    return text.replace(",", "").replace("$", "").strip().rstrip(".")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """Pull the final answer out of a response.

    Args:
        solution_str: the decoded response.
        method: ``"strict"`` (only ``#### <number>``) or ``"flexible"`` (``#### <number>`` if present, else the
            last number in the text).

    Returns:
        The normalised answer string, or ``None`` when no answer is found.

    Raises:
        ValueError: ``method`` is not one of ``strict``, ``flexible``.
    """
    if method not in _METHODS:
        raise ValueError(f"Unknown gsm8k extraction method {method!r}; accepted: {', '.join(_METHODS)}.")
    strict_matches = _STRICT_PATTERN.findall(solution_str)
    if strict_matches:
        return _normalize_number(strict_matches[-1])
    if method == "strict":
        return None
    for candidate in reversed(_NUMBER_PATTERN.findall(solution_str)):
        normalized = _normalize_number(candidate)
        if normalized not in ("", "-"):
            return normalized
    return None


def compute_score(
    solution_str: str,
    ground_truth: str,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """Score a response against the reference answer.

    Args:
        solution_str: the decoded response.
        ground_truth: the reference answer: a bare number (``"72"``) or a full solution ending in ``#### 72``.
        method: answer extraction, ``"strict"`` or ``"flexible"`` (see :func:`extract_solution`).
        format_score: reward for a response whose answer is found but wrong.
        score: reward for a correct answer.

    Returns:
        ``score`` if the extracted answer equals the reference, ``format_score`` if an answer was found but
        differs, 0.0 if none was found.
    """
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    reference = extract_solution(ground_truth, method="strict") or _normalize_number(ground_truth)
    return score if answer == reference else format_score
