"""verl.tools.calculator_tool: results, refusals of malformed and hostile input, per-instance state and reward."""

from __future__ import annotations

import asyncio

import pytest

from verl.tools.calculator_tool import (
    MAX_ABS_VALUE,
    MAX_EXPRESSION_CHARS,
    CalculatorError,
    CalculatorTool,
    evaluate_expression,
)


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("2 + 3 * 4", 14),  # precedence: 3*4=12, +2
        ("(2 + 3) * 4", 20),  # parentheses first: 5*4
        ("10 - 4 - 3", 3),  # left-associative: (10-4)-3
        ("-(7 - 10) * -2", -6),  # -(-3) = 3, 3 * -2
        ("+5", 5),
        ("  12\n", 12),  # surrounding whitespace ignored
        ("1_000 * 3", 3000),  # Python's digit separators are integers too
        (42, 42),  # a model that sends a JSON number
        (f"{MAX_ABS_VALUE} - 1", MAX_ABS_VALUE - 1),  # at the limit is fine
    ],
)
def test_good_expressions(expression, value):
    assert evaluate_expression(expression) == value


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        ("", "empty expression"),
        ("2 +", "malformed expression"),
        ("((1)", "malformed expression"),
        ("1 / 2", "unsupported operator Div"),
        ("7 // 2", "unsupported operator FloorDiv"),
        ("7 % 2", "unsupported operator Mod"),
        ("2 ** 3", "unsupported operator Pow"),
        ("1.5 + 1", "unsupported literal 1.5"),
        ("'a' * 3", "unsupported literal 'a'"),
        ("True + 1", "unsupported literal True"),
        ("x + 1", "unsupported syntax Name"),
        ("1 < 2", "unsupported syntax Compare"),
        ("1; 2", "malformed expression"),
        (None, "must be a string"),
        (True, "must be a string"),
        ([1, 2], "must be a string"),
    ],
)
def test_malformed_expressions(expression, words):
    with pytest.raises(CalculatorError, match=words):
        evaluate_expression(expression)


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        ("__import__('os').system('echo hacked')", "unsupported syntax Call"),
        ("().__class__.__bases__[0].__subclasses__()", "unsupported syntax"),
        ("(lambda: 1)()", "unsupported syntax Call"),
        ("open('/etc/passwd')", "unsupported syntax Call"),
        ("9 ** 9 ** 9 ** 9", "unsupported operator Pow"),  # a huge exponent is refused, never computed
        ("10" * 10, "exceeds the limit"),  # a 20-digit literal > 10**18
        ("999999999 * 999999999 * 999999999", "exceeds the limit"),  # (1e9)^3 ~ 1e27 stops at the 2nd product
        ("1" * (MAX_EXPRESSION_CHARS + 1), f"longer than {MAX_EXPRESSION_CHARS}"),
        ("(" * 150 + "1" + ")" * 150, "longer than"),  # 301 characters: the length limit comes first
    ],
)
def test_hostile_expressions_are_refused_cheaply(expression, words):
    with pytest.raises(CalculatorError, match=words):
        evaluate_expression(expression)


def test_deep_but_legal_nesting_within_the_length_limit():
    assert evaluate_expression("-" * 190 + "1") == 1  # an even number of unary minuses
    assert evaluate_expression("(" * 99 + "2" + ")" * 99) == 2  # 199 characters


def _run(coroutine):
    return asyncio.run(coroutine)


def test_execute_never_raises_and_tracks_state():
    tool = CalculatorTool(config={}, tool_schema=None)  # built-in schema
    assert tool.name == "calculator"
    assert tool.tool_schema.function.parameters.required == ["expression"]

    async def run():
        instance, _ = await tool.create()
        results = [await tool.execute(instance, params) for params in ({"expression": "6*7"}, {"expr": "1"}, {})]
        after_failure = tool.last_call_succeeded(instance)
        reward = await tool.calc_reward(instance)
        await tool.release(instance)
        return results, after_failure, reward, await tool.calc_reward(instance)

    results, after_failure, reward, released_reward = _run(run())
    (ok, ok_reward, ok_metrics), (bad, _, bad_metrics), (empty, _, _) = results
    assert (ok.text, ok_reward, ok_metrics) == ("42", 0.0, {"success": True})
    assert bad.text == "Error: missing the 'expression' argument" and bad_metrics == {"success": False}
    assert empty.text.startswith("Error: ")
    assert after_failure is False  # the last call failed, though an earlier one succeeded
    assert reward == 1.0  # one successful call in the trajectory
    assert released_reward == 0.0  # state dropped on release


def test_reward_is_zero_without_a_successful_call_and_instances_are_separate():
    tool = CalculatorTool(config={"success_step_reward": 0.1}, tool_schema=None)

    async def run():
        good, _ = await tool.create("good")
        bad, _ = await tool.create("bad")
        _, step_reward, _ = await tool.execute(good, {"expression": "1+1"})
        await tool.execute(bad, {"expression": "1/0"})
        return step_reward, await tool.calc_reward(good), await tool.calc_reward(bad), tool.last_call_succeeded(good)

    assert _run(run()) == (0.1, 1.0, 0.0, True)
    assert tool.last_call_succeeded("never-created") is False


def test_execute_on_an_uncreated_instance_starts_its_state():
    tool = CalculatorTool(config={}, tool_schema=None)
    response, _, _ = _run(tool.execute("fresh", {"expression": "3-5"}))
    assert response.text == "-2"
    assert _run(tool.calc_reward("fresh")) == 1.0
