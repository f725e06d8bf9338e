"""verl's ``single_turn_agent``: the prompt through the chat template, one generation, the sampled ids returned."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

__all__ = ["SingleTurnAgentLoop"]


def empty_tool_fields() -> dict[str, Any]:
    """The tool fields every loop's ``extra_fields`` carry, so that batches of different loops share columns."""
    return {
        "turn_scores": [],
        "tool_rewards": [],
        "num_tool_calls": 0,
        "num_tool_call_errors": 0,
        "num_assistant_turns": 1,
        "num_user_turns": 0,
    }


@register("single_turn_agent")
class SingleTurnAgentLoop(AgentLoopBase):
    """One chat completion: ``raw_prompt`` rendered with the chat template, one sample of at most
    ``rollout.response_length`` ids, all of them trained on (mask 1)."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """Run on one row: ``kwargs['raw_prompt']`` holds the chat messages; other fields are not read."""
        messages = list(kwargs["raw_prompt"])
        self.refuse_multi_modal(messages, kwargs)
        prompt_ids = await self.build_prompt_ids(messages)
        metrics: dict[str, Any] = {}
        output = await self.generate_turn(uuid4().hex, prompt_ids, sampling_params, self.response_length, metrics)
        response_ids = list(output.token_ids)[: self.response_length]
        logprobs = list(output.log_probs)[: self.response_length] if output.log_probs is not None else None
        extra_fields = {**output.extra_fields, **empty_tool_fields(), "termination_reason": "single_turn"}
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            response_mask=[1] * len(response_ids),
            response_logprobs=logprobs,
            num_turns=2,
            metrics=AgentLoopMetrics(**metrics),
            extra_fields=extra_fields,
        )
