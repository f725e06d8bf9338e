"""Tests for the tiny-task scorer, its example generator and the data_source dispatch."""

import random

import pytest

from verl.utils.reward_score import default_compute_score, known_data_sources, tiny_task


@pytest.mark.parametrize(
    ("response", "answer", "expected"),
    [
        ("213", "213", 1.0),  # exact
        ("21", "213", 2 / 3),  # right prefix, one position missing: 2 of max(3, 2) = 3
        ("2134", "213", 3 / 4),  # one extra character dilutes: 3 right of max(3, 4) = 4
        ("312", "213", 1 / 3),  # only the middle '1' is in place
        ("999", "213", 0.0),
        ("", "213", 0.0),
        ("  213 ", "213", 1.0),  # surrounding whitespace ignored
        ("21300000", "213", 3 / 8),  # rambling on is punished: 3 right of 8
        ("x", "", 0.0),  # no answer to match
    ],
)
def test_compute_score_partial_credit(response, answer, expected):
    assert tiny_task.compute_score(response, answer) == pytest.approx(expected)


def test_make_example_reverses_prompt_digits():
    rng = random.Random(0)
    lengths = set()
    for _ in range(200):
        prompt, answer = tiny_task.make_example(rng)
        assert prompt.endswith("=") and prompt[:-1].isdigit()
        assert answer == prompt[:-1][::-1]
        lengths.add(len(answer))
    assert lengths == {3, 4, 5}
    # Same seed, same examples.
    assert tiny_task.make_example(random.Random(7)) == tiny_task.make_example(random.Random(7))


def test_dispatch_and_unknown_source():
    assert default_compute_score("tiny_task", "21", "213") == pytest.approx(2 / 3)
    assert "tiny_task" in known_data_sources() and "openai/gsm8k" in known_data_sources()
    with pytest.raises(ValueError, match=r"No built-in reward scorer for data_source 'mystery'.*gsm8k.*tiny_task"):
        default_compute_score("mystery", "1", "1")
