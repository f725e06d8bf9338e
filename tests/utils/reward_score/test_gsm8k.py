"""Tests for the GSM8K scorer: strict and flexible answer extraction and scoring."""

import pytest

from verl.utils.reward_score import default_compute_score, gsm8k


@pytest.mark.parametrize(
    ("text", "method", "expected"),
    [
        ("so 6 * 7 = 42\n#### 42", "strict", "42"),
        ("#### 1,234", "strict", "1234"),  # thousands separators dropped
        ("#### $18", "strict", "18"),  # currency sign dropped
        ("#### -3", "strict", "-3"),
        ("first #### 5 then #### 6", "strict", "6"),  # the last #### wins
        ("The answer is 42.", "strict", None),  # strict needs ####
        ("The answer is 42.", "flexible", "42"),  # trailing period stripped
        ("3 apples and 5 pears", "flexible", "5"),  # last number
        ("costs $1,000.", "flexible", "1000"),
        ("#### 7 and later 9", "flexible", "7"),  # #### beats the last-number fallback
        ("no digits here", "flexible", None),
    ],
)
def test_extract_solution(text, method, expected):
    assert gsm8k.extract_solution(text, method=method) == expected


def test_compute_score():
    assert gsm8k.compute_score("#### 42", "42") == 1.0
    assert gsm8k.compute_score("#### 41", "42") == 0.0  # found but wrong, default format_score 0
    assert gsm8k.compute_score("#### 41", "42", format_score=0.1) == 0.1
    assert gsm8k.compute_score("42", "42") == 0.0  # strict: no #### means no answer, not even format credit
    assert gsm8k.compute_score("42", "42", method="flexible") == 1.0
    assert gsm8k.compute_score("#### 42", "42", score=2.0) == 2.0
    # A full reference solution as ground truth: its #### answer is used.
    assert gsm8k.compute_score("#### 1000", "She pays 10 * 100 = 1000.\n#### 1,000") == 1.0
    # Numbers compare as strings: GSM8K answers are integers, "42.0" is not "42".
    assert gsm8k.compute_score("#### 42.0", "42") == 0.0


def test_bad_method():
    with pytest.raises(ValueError, match="strict, flexible"):
        gsm8k.extract_solution("#### 1", method="fuzzy")


def test_dispatch():
    assert default_compute_score("openai/gsm8k", "#### 72", "72") == 1.0
    assert default_compute_score("gsm8k", "#### 71", "72") == 0.0
