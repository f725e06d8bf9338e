"""The embedded tool task's examples and scorer (issue 49, item 4)."""

import random

from verl.utils.reward_score import default_compute_score, known_data_sources, tiny_calc

TRAJECTORY = (
    '<tool_call>{"name": "calculator", "arguments": {"expression": "37*48"}}</tool_call>'
    "<|im_end|><|im_start|>tool\n<tool_response>1776</tool_response><|im_end|><|im_start|>assistant\n{answer}<|im_end|>"
)


def _with_answer(answer: str) -> str:
    return TRAJECTORY.replace("{answer}", answer)


def test_examples_are_seeded_and_their_ground_truth_is_the_value():
    first = [tiny_calc.make_example(random.Random(3)) for _ in range(2)]
    assert first[0] == first[1]
    for expression, answer in (tiny_calc.make_example(random.Random(seed)) for seed in range(200)):
        left, operator, right = expression.partition("*") if "*" in expression else expression.partition("+")
        value = int(left) * int(right) if operator == "*" else int(left) + int(right)
        assert answer == str(value)
        # products of two 2-digit numbers, sums of two 3-digit numbers
        assert all(len(part) == (2 if operator == "*" else 3) for part in (left, right))


def test_the_final_answer_is_what_follows_the_last_tool_response():
    # with special tokens kept and with them skipped (the reward manager's decode), the answer is "1776"
    full = _with_answer("1776")
    skipped = full.replace("<|im_end|>", "").replace("<|im_start|>", "")
    assert tiny_calc.extract_final_answer(full) == "1776"
    assert tiny_calc.extract_final_answer(skipped) == "1776"
    # no tool call: the whole response is the answer
    assert tiny_calc.extract_final_answer("1800<|im_end|>") == "1800"
    # a call that got no response leaves no final answer
    assert tiny_calc.extract_final_answer('12<tool_call>{"name": "calculator"') == "12"
    assert tiny_calc.extract_final_answer('<tool_call>{"name": "calculator"') == ""


def test_score_is_per_position_credit_of_the_final_answer():
    assert tiny_calc.compute_score(_with_answer("1776"), "1776") == 1.0
    # 1766 against 1776: positions 1, 2, 4 right -> 3/4
    assert tiny_calc.compute_score(_with_answer("1766"), "1776") == 0.75
    # 17760: four positions right out of max(4, 5) -> 4/5
    assert tiny_calc.compute_score(_with_answer("17760"), "1776") == 0.8
    # the tool's answer alone earns nothing: the model must state it
    assert tiny_calc.compute_score(_with_answer(""), "1776") == 0.0
    # a direct guess: 1800 vs 1776 shares only the first digit -> 1/4
    assert tiny_calc.compute_score("1800", "1776") == 0.25
    assert tiny_calc.compute_score("", "") == 0.0


def test_the_default_dispatch_knows_tiny_calc():
    assert "tiny_calc" in known_data_sources()
    assert default_compute_score("tiny_calc", _with_answer("1776"), "1776") == 1.0
