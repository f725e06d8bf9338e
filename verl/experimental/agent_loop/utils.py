"""Small helpers of the agent loops: where a config file named in the rollout config lies, and gpt-oss's
hand-written tool-response turns (its chat template cannot render a tool message without the call before it)."""

from __future__ import annotations

import os
from typing import Any

__all__ = [
    "add_generation_prompt_for_gpt_oss",
    "build_gpt_oss_tool_response_text",
    "format_gpt_oss_tool_response_manually",
    "resolve_config_path",
]


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def resolve_config_path(config_path: str) -> str:
    """The absolute path of a config file named in the rollout config (an agent-loop or tool YAML).

    An absolute path is returned as given. A relative one is looked up, in order, under the working directory,
    under the project root (the folder holding the ``verl`` package) and under the ``verl`` package itself; a
    path that climbs out of those folders (``../``) is not followed.

    Raises:
        FileNotFoundError: the file is in none of those places; the message names them.
    """
    if os.path.isabs(config_path):
        return config_path
    import verl

    package_dir = os.path.abspath(os.path.dirname(verl.__file__))
    roots = [os.path.abspath(os.getcwd()), os.path.dirname(package_dir), package_dir]
    for root in roots:
        candidate = os.path.abspath(os.path.join(root, config_path))
        if _inside(candidate, root) and os.path.exists(candidate):
            return candidate
    raise FileNotFoundError(
        f"Agent loop configuration file not found: {config_path}. Tried, relative to each of: {roots}."
    )


def format_gpt_oss_tool_response_manually(tool_response: str, tool_call_name: str) -> str:
    """One tool result as a gpt-oss (harmony) message from ``functions.<name>`` back to the assistant."""
    return f"<|start|>functions.{tool_call_name} to=assistant<|channel|>commentary<|message|>{tool_response}<|end|>"


def add_generation_prompt_for_gpt_oss(message_content: str) -> str:
    """``message_content`` followed by the harmony header that opens the assistant's next turn."""
    return message_content + "<|start|>assistant"


def build_gpt_oss_tool_response_text(messages: list[dict[str, Any]], tool_call_names: list[str]) -> str:
    """The text of a turn of gpt-oss tool results: each ``role: tool`` message in ``messages`` formatted under the
    name of the call it answers (``tool_call_names``, same order), then the assistant's generation prompt."""
    parts = [
        format_gpt_oss_tool_response_manually(str(message.get("content") or ""), name)
        for message, name in zip(messages, tool_call_names, strict=True)
    ]
    return add_generation_prompt_for_gpt_oss("".join(parts))
