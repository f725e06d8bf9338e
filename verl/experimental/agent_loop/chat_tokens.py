"""Token ids of the turns an agent loop adds between two generations, without re-tokenising the model's output.

The loops keep one growing list of ids: the prompt, then exactly the ids the model sampled, then the ids of the
tool (or user) messages, then the next sample, and so on. Re-rendering the whole conversation with the chat
template after each turn would change the model's own tokens (decode then encode is not the identity, and a tool
parser rewrites the assistant message), so only the *appended* messages are rendered here:

* the messages are rendered after a fixed synthetic conversation (a user turn and an assistant turn), once with
  and once without them, and the text the new messages add (plus the next generation prompt) is the suffix;
* the text the template puts after an assistant message (its *turn closer*, e.g. ``<|im_end|>\\n``) is compared
  with the end of what the model sampled: the part of it the model did not produce (the ``\\n`` after an
  ``<|im_end|>`` stop token, or the whole closer when the generation was cut) is put in front of the suffix.

Those ids are never trained on (mask 0); the model's ids stay as sampled.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from verl.utils.tokenizer import normalize_token_ids

__all__ = ["ChatTokens"]

_SYNTHETIC_USER = {"role": "user", "content": "Hi."}
# a reasoning text that keeps Qwen3-style templates from rendering the assistant turn differently when it is last
_SYNTHETIC_REASONING = "ok"
_ASSISTANT_MARK = "VERL_ASSISTANT_CONTENT_MARK"
# how many of the model's last tokens are decoded to compare with the turn closer
_TAIL_TOKENS = 8


def _synthetic_assistant(tool_messages: list[dict[str, Any]]) -> dict[str, Any]:
    """An assistant turn whose tool calls the appended tool messages answer (some templates need the calls)."""
    calls = [
        {
            "id": message.get("tool_call_id") or f"call_{index}",
            "type": "function",
            "function": {"name": message.get("name") or "tool", "arguments": {}},
        }
        for index, message in enumerate(tool_messages)
        if message.get("role") == "tool"
    ]
    message: dict[str, Any] = {"role": "assistant", "content": "", "reasoning_content": _SYNTHETIC_REASONING}
    if calls:
        message["tool_calls"] = calls
    return message


class ChatTokens:
    """The chat template of ``tokenizer`` (with ``chat_template_kwargs``) as token ids for an agent loop."""

    def __init__(self, tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None):
        self.tokenizer = tokenizer
        self.chat_template_kwargs = dict(chat_template_kwargs or {})

    def render(
        self, messages: list[dict[str, Any]], *, tools: list[dict] | None = None, add_generation_prompt: bool
    ) -> str:
        """The chat template's text of ``messages`` (tool schemas ``tools`` shown to the model when given)."""
        return self.tokenizer.apply_chat_template(
            messages,
            tools=tools or None,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **self.chat_template_kwargs,
        )

    def encode(self, text: str) -> list[int]:
        """``text`` as ids, special tokens written in it recognised, none added."""
        return normalize_token_ids(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict] | None = None) -> list[int]:
        """The ids of the first prompt: ``messages`` with the tool schemas and the generation prompt."""
        return self.encode(self.render(messages, tools=tools, add_generation_prompt=True))

    @cached_property
    def turn_closer(self) -> str:
        """The text the template writes right after an assistant message's content ('' if it cannot be found)."""
        text = self.render(
            [_SYNTHETIC_USER, {"role": "assistant", "content": _ASSISTANT_MARK}], add_generation_prompt=False
        )
        index = text.rfind(_ASSISTANT_MARK)
        return "" if index < 0 else text[index + len(_ASSISTANT_MARK) :]

    def missing_closer(self, generated_ids: list[int]) -> str:
        """The end of the turn closer that the model's last sample (``generated_ids``) did not produce.

        The longest start of the closer that the sampled text ends with counts as produced: a model that stopped
        on ``<|im_end|>`` misses only the ``\\n`` after it; one cut by the length limit misses the whole closer.
        """
        closer = self.turn_closer
        if not closer:
            return ""
        tail = self.tokenizer.decode(list(generated_ids[-_TAIL_TOKENS:]), skip_special_tokens=False)
        for produced in range(len(closer), 0, -1):
            if tail.endswith(closer[:produced]):
                return closer[produced:]
        return closer

    def appended_ids(
        self, new_messages: list[dict[str, Any]], *, tools: list[dict] | None = None, generated_ids: list[int] = ()
    ) -> list[int]:
        """The ids that follow the model's last sample when ``new_messages`` (tool / user turns) are appended:
        the rest of the assistant's turn closer, the new messages, and the next generation prompt.

        Raises:
            ValueError: the template renders the synthetic conversation differently once messages follow it, so
                the appended text cannot be told apart.
        """
        prefix = [_SYNTHETIC_USER, _synthetic_assistant(new_messages)]
        before = self.render(prefix, tools=tools, add_generation_prompt=False)
        after = self.render(prefix + list(new_messages), tools=tools, add_generation_prompt=True)
        if not after.startswith(before):
            roles = [message.get("role") for message in new_messages]
            raise ValueError(
                f"The chat template renders the conversation before the appended {roles} messages differently once "
                "they follow it, so their tokens cannot be appended without re-tokenising the model's output."
            )
        return self.encode(self.missing_closer(generated_ids) + after[len(before) :])
