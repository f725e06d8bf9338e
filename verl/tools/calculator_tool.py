"""``CalculatorTool``: integer arithmetic for the embedded tool task, safe against whatever the model writes.

Tool name ``calculator``, one string parameter ``expression`` (config: ``verl/tools/configs/calculator_tool.yaml``).
It evaluates integer literals combined with ``+``, ``-``, ``*``, unary ``+``/``-`` and parentheses by walking the
``ast`` of the expression: nothing is ever ``eval``-ed, so names, calls, attributes, ``**``, ``/`` and floats are
refused, not run. Limits keep a hostile input cheap: at most :data:`MAX_EXPRESSION_CHARS` characters and every
literal and intermediate value within ``±MAX_ABS_VALUE`` (10**18).

``execute`` never raises on the model's input: the response text is the result (``"14"`` for ``"2 + 3 * 4"``) or a
line starting ``"Error: "`` saying what was wrong. It returns ``(ToolResponse, step_reward, {"success": bool})``
where ``step_reward`` is the config's ``success_step_reward`` (default 0.0) for a successful call, else 0.0.

State per instance (from ``create`` to ``release``): the number of calls and successful calls and whether the last
call succeeded (:meth:`CalculatorTool.last_call_succeeded`). ``calc_reward(instance_id)`` is 1.0 when the instance
made at least one successful call, else 0.0 (also for an unknown or released instance), so it must be asked
before ``release``. A call on an instance that was never created starts its state.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

__all__ = ["CalculatorTool", "CalculatorError", "evaluate_expression", "MAX_ABS_VALUE", "MAX_EXPRESSION_CHARS"]

MAX_EXPRESSION_CHARS = 200
MAX_ABS_VALUE = 10**18

_BINARY = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}
_UNARY = {ast.USub: lambda a: -a, ast.UAdd: lambda a: a}

CALCULATOR_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an integer arithmetic expression with +, -, * and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "The expression, e.g. '(3 + 4) * 5'."}},
            "required": ["expression"],
        },
    },
}


class CalculatorError(ValueError):
    """An expression the calculator refuses; the message is shown to the model."""


def _bounded(value: int) -> int:
    if abs(value) > MAX_ABS_VALUE:
        raise CalculatorError(f"a value exceeds the limit of {MAX_ABS_VALUE} in magnitude")
    return value


def _walk(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return _bounded(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _bounded(_BINARY[type(node.op)](_walk(node.left), _walk(node.right)))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _bounded(_UNARY[type(node.op)](_walk(node.operand)))
    if isinstance(node, ast.BinOp):
        raise CalculatorError(f"unsupported operator {type(node.op).__name__}; only +, - and * are allowed")
    if isinstance(node, ast.Constant):
        raise CalculatorError(f"unsupported literal {node.value!r}; only integers are allowed")
    raise CalculatorError(f"unsupported syntax {type(node).__name__}; only integers, +, -, * and () are allowed")


def evaluate_expression(expression: Any) -> int:
    """The value of an integer ``+ - *`` expression; :class:`CalculatorError` for anything else."""
    if isinstance(expression, int) and not isinstance(expression, bool):
        return _bounded(expression)
    if not isinstance(expression, str):
        raise CalculatorError(f"'expression' must be a string, got {type(expression).__name__}")
    text = expression.strip()
    if not text:
        raise CalculatorError("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as err:
        raise CalculatorError(f"malformed expression: {getattr(err, 'msg', err)}") from None
    try:
        return _walk(tree.body)
    except RecursionError:
        raise CalculatorError("expression nested too deeply") from None


@dataclass
class _CalcState:
    calls: int = 0
    successes: int = 0
    last_ok: bool = False


class CalculatorTool(BaseTool):
    """The ``calculator`` tool (module docstring); ``tool_schema=None`` uses the built-in schema."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None = None):
        super().__init__(config or {}, tool_schema)
        self.success_step_reward = float(self.config.get("success_step_reward", 0.0))
        self._instances: dict[str, _CalcState] = {}

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        """The schema given to the constructor, else the built-in ``calculator(expression: str)`` one."""
        return getattr(self, "tool_schema", None) or OpenAIFunctionToolSchema.model_validate(CALCULATOR_SCHEMA)

    async def create(self, instance_id: str | None = None, **kwargs) -> tuple[str, ToolResponse]:
        """Start an instance with no calls made."""
        instance_id, response = await super().create(instance_id, **kwargs)
        self._instances[instance_id] = _CalcState()
        return instance_id, response

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        """Evaluate ``parameters["expression"]``; the result or an ``Error: ...`` text, never an exception."""
        state = self._instances.setdefault(instance_id, _CalcState())
        state.calls += 1
        try:
            if not isinstance(parameters, dict) or "expression" not in parameters:
                raise CalculatorError("missing the 'expression' argument")
            text = str(evaluate_expression(parameters["expression"]))
            state.last_ok = True
        except CalculatorError as err:
            text, state.last_ok = f"Error: {err}", False
        state.successes += int(state.last_ok)
        reward = self.success_step_reward if state.last_ok else 0.0
        return ToolResponse(text=text), reward, {"success": state.last_ok}

    def last_call_succeeded(self, instance_id: str) -> bool:
        """Whether the instance's latest call gave a result (False before any call or for an unknown instance)."""
        state = self._instances.get(instance_id)
        return bool(state and state.last_ok)

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        """1.0 when the instance made at least one successful call, else 0.0."""
        state = self._instances.get(instance_id)
        return 1.0 if state is not None and state.successes > 0 else 0.0

    async def release(self, instance_id: str, **kwargs) -> None:
        """Drop the instance's state (unknown ids are ignored)."""
        self._instances.pop(instance_id, None)
