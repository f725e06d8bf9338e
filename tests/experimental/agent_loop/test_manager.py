"""Tests for the agent-loop manager: the trainer's batch of tool-calling trajectories (layout and masks, derived
by hand), the batching of concurrent generations into few engine calls spread over data-parallel ranks, the
per-row ``agent_name``, and the engines' errors reaching the caller."""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl.experimental.agent_loop.manager import AgentLoopManager, loop_kwargs, sampling_params_for
from verl.protocol import DataProto
from verl.single_controller.decorator import Dispatch, Execute, RegisterSpec, plan_call

from .tiny_chat import AddTool, tiny_tokenizer

CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call><|im_end|>'
ANSWER = "5<|im_end|>"
LOG_PROB = -0.5
PROMPT_LENGTH, RESPONSE_LENGTH = 160, 120


class FakeEngineGroup:
    """A worker group of ``world_size`` data-parallel ranks answering ``generate_tokens`` as the real dispatch splits
    it: a prompt without a tool response gets the tool call, one with a tool response gets the answer; every
    token's log-prob is -0.5. Records each call's rows per rank."""

    def __init__(self, tokenizer, world_size: int = 2, fail: bool = False):
        self.tokenizer, self.world_size, self.fail = tokenizer, world_size, fail
        self.calls: list[list[int]] = []
        self.released = 0

    def _rank(self, requests: DataProto) -> DataProto:
        answers = []
        for prompt in requests.non_tensor_batch["prompt_ids"]:
            text = self.tokenizer.decode(prompt)
            answers.append(self.tokenizer.encode(ANSWER if "<tool_response>" in text else CALL))
        token_ids = np.empty(len(answers), dtype=object)
        token_ids[:] = answers
        log_probs = np.empty(len(answers), dtype=object)
        log_probs[:] = [[LOG_PROB] * len(ids) for ids in answers]
        reasons = np.array(["stop"] * len(answers), dtype=object)
        return DataProto.from_dict(
            tensors={"num_tokens": torch.tensor([len(ids) for ids in answers])},
            non_tensors={"token_ids": token_ids, "log_probs": log_probs, "finish_reason": reasons},
        )

    def generate_tokens(self, requests: DataProto) -> DataProto:
        if self.fail:
            raise RuntimeError("engine died")
        spec = RegisterSpec(Dispatch.DP_COMPUTE_PROTO, Execute.ALL, blocking=True)
        plan = plan_call(spec, self.world_size, (requests,), {})
        self.calls.append([len(args[0]) for args in plan.args])
        return plan.collect([self._rank(*args) for args in plan.args])

    def release_rollout(self):
        self.released += 1


def _config(n=2, default_agent_loop="tool_agent", num_workers=2):
    rollout = {
        "prompt_length": PROMPT_LENGTH,
        "response_length": RESPONSE_LENGTH,
        "max_model_len": None,
        "n": n,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "do_sample": True,
        "calculate_log_probs": True,
        "agent": {"num_workers": num_workers, "default_agent_loop": default_agent_loop, "agent_loop_config_path": None},
        "multi_turn": {
            "max_assistant_turns": None,
            "max_user_turns": None,
            "max_parallel_calls": 1,
            "max_tool_response_length": 256,
            "tool_response_truncate_side": "middle",
            "format": "hermes",
            "tool_config_path": None,
            "function_tool_path": None,
        },
    }
    return OmegaConf.create({"actor_rollout_ref": {"rollout": rollout}, "data": {}})


def _prompts(num_rows=3, agent_names=None):
    questions = np.empty(num_rows, dtype=object)
    questions[:] = [[{"role": "user", "content": f"what is 2+3? ({i})"}] for i in range(num_rows)]
    non_tensors = {
        "raw_prompt": np.array([f"q{i}" for i in range(num_rows)], dtype=object),
        "raw_chat": questions,
        "uid": np.array([f"u{i}" for i in range(num_rows)], dtype=object),
        "extra_info": np.array([{"index": i} for i in range(num_rows)], dtype=object),
    }
    if agent_names is not None:
        non_tensors["agent_name"] = np.array(agent_names, dtype=object)
    return DataProto.from_dict(
        tensors={"input_ids": torch.zeros(num_rows, 1, dtype=torch.long)}, non_tensors=non_tensors
    )


def _run(prompts, **config):
    tokenizer = tiny_tokenizer()
    group = FakeEngineGroup(tokenizer)
    tool = AddTool()
    manager = AgentLoopManager(_config(**config), group, tokenizer, tools=[tool], gather_window_s=1.0)
    return manager.generate_sequences(prompts), group, tokenizer, tool


def test_tool_trajectories_in_the_rollout_layout_with_tool_tokens_masked():
    batch, group, tokenizer, tool = _run(_prompts(3), n=2)
    b = batch.batch
    # 3 prompts x n=2, interleaved; prompts left-padded to 160, responses right-padded to 120
    assert b["prompts"].shape == (6, PROMPT_LENGTH) and b["responses"].shape == (6, RESPONSE_LENGTH)
    assert list(batch.non_tensor_batch["uid"]) == ["u0", "u0", "u1", "u1", "u2", "u2"]
    call_ids, answer_ids = tokenizer.encode(CALL), tokenizer.encode(ANSWER)
    for row in range(6):
        length = int(b["attention_mask"][row, PROMPT_LENGTH:].sum())
        response = b["responses"][row, :length].tolist()
        mask = b["response_mask"][row, :length].tolist()
        # the response is: the model's call (mask 1), the tool turn (mask 0), the model's answer (mask 1)
        tool_turn = response[len(call_ids) : length - len(answer_ids)]
        assert response[: len(call_ids)] == call_ids and response[length - len(answer_ids) :] == answer_ids
        assert mask == [1] * len(call_ids) + [0] * len(tool_turn) + [1] * len(answer_ids)
        assert "<tool_response>" in tokenizer.decode(tool_turn) and "5" in tokenizer.decode(tool_turn)
        # padding after the response: pad ids, attention 0, mask 0
        assert b["responses"][row, length:].eq(tokenizer.pad_token_id).all()
        assert b["response_mask"][row, length:].eq(0).all()
        # log-probs: -0.5 on the model's ids, 0 on the tool turn and the padding
        expected = torch.tensor(mask + [0] * (RESPONSE_LENGTH - length), dtype=torch.float32) * LOG_PROB
        assert torch.equal(b["rollout_log_probs"][row], expected)
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], dim=-1))
    assert torch.equal(b["position_ids"], (b["attention_mask"].cumsum(-1) - 1).clamp(min=0))
    # turns: the user's question, the call, the tool's answer, the final answer
    assert batch.non_tensor_batch["__num_turns__"].tolist() == [4] * 6
    assert [list(r) for r in batch.non_tensor_batch["tool_rewards"]] == [[1.0]] * 6  # AddTool's reward per call
    assert batch.non_tensor_batch["tool_extra_fields"][0]["num_tool_calls"] == 1
    assert batch.non_tensor_batch["tool_call_counts"].tolist() == [1] * 6
    metrics = batch.meta_info["agent_loop_metrics"]
    assert metrics["agent_loop/tool_calls_total"] == 6 and metrics["agent_loop/tool_call_success_rate"] == 1.0
    assert batch.meta_info["temperature"] == 1.0
    assert len(tool.created) == 6 and group.released == 1


def test_concurrent_trajectories_share_engine_calls_spread_over_ranks():
    _, group, _, _ = _run(_prompts(3), n=2)
    # 6 trajectories x 2 generations each: 12 requests in 2 calls (all first turns, then all second turns), each
    # split 3 + 3 over the 2 data-parallel ranks
    assert group.calls == [[3, 3], [3, 3]]


def test_each_row_runs_the_loop_its_agent_name_names():
    batch, group, _, _ = _run(_prompts(2, agent_names=["single_turn_agent", None]), n=1)
    # row 0: one generation (the call text, never executed): 2 turns; row 1 (default tool_agent): 4 turns
    assert batch.non_tensor_batch["__num_turns__"].tolist() == [2, 4]
    assert batch.batch["response_mask"][0].sum().item() == batch.batch["attention_mask"][0, PROMPT_LENGTH:].sum()
    assert group.calls == [[1, 1], [1, 1]]  # turn 1 of both rows, then row 1's turn 2 (padded to the 2 ranks)


def test_an_engine_error_reaches_the_caller_and_the_engine_is_released():
    tokenizer = tiny_tokenizer()
    group = FakeEngineGroup(tokenizer, fail=True)
    manager = AgentLoopManager(_config(n=1), group, tokenizer, tools=[AddTool()])
    with pytest.raises(RuntimeError, match="engine died"):
        manager.generate_sequences(_prompts(2))
    assert group.released == 1


def test_row_kwargs_and_sampling_params():
    prompts = _prompts(1)
    prompts.non_tensor_batch["extra_info"][0] = {"tools_kwargs": {"add": {"create_kwargs": {"x": 1}}}}
    kwargs = loop_kwargs(prompts.non_tensor_batch, 0)
    assert kwargs["raw_prompt"] == [{"role": "user", "content": "what is 2+3? (0)"}]
    assert kwargs["tools_kwargs"] == {"add": {"create_kwargs": {"x": 1}}}
    rollout = _config().actor_rollout_ref.rollout
    # validation's greedy overrides: do_sample false is temperature 0 with the filters off
    greedy = sampling_params_for(rollout, {"do_sample": False, "temperature": 0.7})
    assert (greedy["temperature"], greedy["top_p"], greedy["top_k"], greedy["logprobs"]) == (0.0, 1.0, -1, True)
