"""verl's agent loops: multi-turn, tool-calling rollouts token-in/token-out (see ``agent_loop.py``).

Importing the package registers the built-in loops ``single_turn_agent`` and ``tool_agent`` and the tool parsers
``hermes``, ``qwen3_coder``, ``kimi`` and ``gpt-oss``.
"""

from .agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    DictConfigWrap,
    ServerManager,
    TokenOutput,
    ToolListWrap,
    get_agent_loop_class,
    get_trajectory_info,
    instantiate_agent_loop,
    load_agent_loop_config,
    register,
)
from .single_turn_agent_loop import SingleTurnAgentLoop
from .tool_agent_loop import ToolAgentLoop
from .tool_parser import FunctionCall, ToolParser

__all__ = [
    "AgentLoopBase",
    "AgentLoopManager",
    "AgentLoopMetrics",
    "AgentLoopOutput",
    "DictConfigWrap",
    "FunctionCall",
    "ServerManager",
    "SingleTurnAgentLoop",
    "TokenOutput",
    "ToolAgentLoop",
    "ToolListWrap",
    "ToolParser",
    "get_agent_loop_class",
    "get_trajectory_info",
    "instantiate_agent_loop",
    "load_agent_loop_config",
    "register",
]


def __getattr__(name: str):
    """``AgentLoopManager`` (verl's name here) on first use: the manager imports the rollout engines' request
    batches, which the loops and parsers alone do not need."""
    if name == "AgentLoopManager":
        from .manager import AgentLoopManager

        return AgentLoopManager
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
