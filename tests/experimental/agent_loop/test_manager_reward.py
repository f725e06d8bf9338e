"""Agent-loop trajectories reach the reward function as in verl: the whole response decoded (tool turns included),
the score on the last real token, and the loop's extra fields (tool rewards, turns) in ``extra_info``."""

import numpy as np
import torch

from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
from verl.experimental.agent_loop.batch import assemble_batch
from verl.protocol import DataProto
from verl.workers.reward_manager.naive import NaiveRewardManager

from .tiny_chat import tiny_tokenizer


def _trajectory(tokenizer, tool_rewards):
    call, tool_turn, answer = (tokenizer.encode(text) for text in ("call", "<tool_response>5</tool_response>", "5"))
    return AgentLoopOutput(
        prompt_ids=tokenizer.encode("2+3?"),
        response_ids=call + tool_turn + answer,
        response_mask=[1] * len(call) + [0] * len(tool_turn) + [1] * len(answer),
        num_turns=4,
        metrics=AgentLoopMetrics(),
        extra_fields={"tool_rewards": tool_rewards, "num_tool_calls": 1},
    )


def test_the_scorer_sees_the_whole_response_and_the_loops_extra_fields():
    tokenizer = tiny_tokenizer()
    outputs = [_trajectory(tokenizer, [1.0]), _trajectory(tokenizer, [])]
    tensors, columns = assemble_batch(outputs, prompt_length=8, response_length=48, pad_token_id=tokenizer.pad_token_id)
    columns.update(
        ground_truth=np.array(["5", "5"], dtype=object),
        data_source=np.array(["calc", "calc"], dtype=object),
        extra_info=np.array([{"index": 0}, {"index": 1}], dtype=object),
    )
    seen = []

    def score(data_source, solution_str, ground_truth, extra_info=None):
        seen.append((solution_str, extra_info))
        return float(sum(extra_info["tool_rewards"]))

    scores = NaiveRewardManager(tokenizer, compute_score=score)(DataProto.from_dict(tensors, columns))
    # "call" (4 ids) + the tool turn (3 ids: its markers are special, skipped in decoding) + "5" (1 id): the tool
    # turn's "5" is in the text although its mask is 0; a response_mask span would have decoded "call" alone
    length = len(outputs[0].response_ids)
    assert length == 8 and seen[0][0] == "call55"
    assert seen[0][1] == {
        "index": 0,
        "tool_rewards": [1.0],
        "num_tool_calls": 1,
        "num_turns": 4,
        "rollout_reward_scores": {},
    }
    # the score sits on the last real response id (a model id here), row 0's tool reward 1.0, row 1's none
    expected = torch.zeros(2, 48)
    expected[0, length - 1] = 1.0
    assert torch.equal(scores, expected)
