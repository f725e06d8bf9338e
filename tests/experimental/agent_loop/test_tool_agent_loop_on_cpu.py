"""The ReAct tool loop over a scripted server: token-in/token-out, masks and log-probs aligned, the response
budget, the turn and parallel-call limits, and every way a tool call can fail."""

import asyncio
import json
from types import SimpleNamespace

import pytest

from verl.experimental.agent_loop import ToolAgentLoop, ToolListWrap
from verl.experimental.agent_loop.tool_agent_loop import truncate_tool_response
from verl.experimental.agent_loop.tool_parser import FunctionCall
from verl.tools.function_tool import FunctionTool

from .tiny_chat import (
    AddTool,
    FailingTool,
    HangingTool,
    ImageTool,
    MeetingTool,
    ScriptedServer,
    TextTool,
    make_loop,
    tiny_tokenizer,
)

PROMPT = [{"role": "user", "content": "What is 2+3?"}]
CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call><|im_end|>'
FINAL = "The sum is 5.<|im_end|>"
# the tool turn after a sample that ended on <|im_end|>: the "\n" the template writes after it, then the turn
TOOL_TURN_5 = "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def encode(text):
    return tiny_tokenizer().encode(text, add_special_tokens=False)


def run_loop(samples, tools, logprobs=True, timeout=None, row=None, **config):
    """Run a ToolAgentLoop on PROMPT (and ``row``'s fields); returns (output, server)."""
    loop_kwargs = {"tools": ToolListWrap(tools), "tool_call_timeout": timeout}
    loop, server = make_loop(ToolAgentLoop, samples, logprobs=logprobs, loop_kwargs=loop_kwargs, **config)
    output = asyncio.run(loop.run({"temperature": 1.0}, raw_prompt=PROMPT, **(row or {})))
    return output, server


def tool_text(output, index=0):
    """The decoded text of the ``index``-th run of mask-0 ids of the response (a tool turn)."""
    runs, current = [], []
    for token, mask in zip(output.response_ids, output.response_mask, strict=True):
        if mask == 0:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    runs += [current] if current else []
    return tiny_tokenizer().decode(runs[index], skip_special_tokens=False)


def test_two_turns_keep_the_sampled_ids_and_align_mask_and_logprobs():
    tokenizer = tiny_tokenizer()
    a, b = tokenizer.convert_tokens_to_ids("a"), tokenizer.convert_tokens_to_ids("b")
    first = [a, b] + encode(CALL)  # "ab" as two ids, which re-tokenising would merge into one
    add = AddTool()
    output, server = run_loop([first, FINAL], [add], row={"tools_kwargs": {"add": {"create_kwargs": {"k": 1}}}})
    tool_ids, final = encode(TOOL_TURN_5), encode(FINAL)
    assert output.response_ids == first + tool_ids + final
    assert output.response_mask == [1] * len(first) + [0] * len(tool_ids) + [1] * len(final)
    assert output.response_logprobs == (
        [ScriptedServer.logprob(0, i) for i in range(len(first))]
        + [0.0] * len(tool_ids)
        + [ScriptedServer.logprob(1, i) for i in range(len(final))]
    )
    # the second generation saw exactly prompt + sampled ids + tool ids, under the same request id
    assert server.calls[1]["prompt_ids"] == output.prompt_ids + first + tool_ids
    assert server.calls[0]["request_id"] == server.calls[1]["request_id"]
    assert tokenizer.encode(tokenizer.decode(first), add_special_tokens=False) != first
    schemas = [add.tool_schema.model_dump(exclude_unset=True, exclude_none=True)]
    prompt_text = tokenizer.apply_chat_template(PROMPT, tools=schemas, tokenize=False, add_generation_prompt=True)
    assert output.prompt_ids == encode(prompt_text) and '"name": "add"' in prompt_text
    assert add.created == [{"create_kwargs": {"k": 1}}] and add.released == ["add-1"]
    # 1 prompt turn + 2 assistant turns + 1 tool turn
    assert output.num_turns == 4
    fields = output.extra_fields
    assert fields["tool_rewards"] == [1.0] and fields["turn_scores"] == []
    assert (fields["num_tool_calls"], fields["num_tool_call_errors"]) == (1, 0)
    assert (fields["num_assistant_turns"], fields["num_user_turns"]) == (2, 1)
    assert fields["termination_reason"] == "no_tool_call"
    assert fields["global_steps"] == 0 and output.metrics.num_preempted == 0


def test_each_generation_is_asked_for_the_budget_left():
    output, server = run_loop([CALL, FINAL], [AddTool()], response_length=200)
    used = len(encode(CALL)) + len(encode(TOOL_TURN_5))
    assert [call["params"]["max_tokens"] for call in server.calls] == [200, 200 - used]


def test_a_sample_that_ends_without_the_stop_token_gets_the_whole_turn_closer():
    cut = CALL.removesuffix("<|im_end|>")
    output, _ = run_loop([cut, FINAL], [AddTool()])
    assert tool_text(output) == "<|im_end|>" + TOOL_TURN_5


def test_the_last_sample_is_cut_at_the_response_budget():
    used = len(encode(CALL)) + len(encode(TOOL_TURN_5))
    output, server = run_loop([CALL, FINAL], [AddTool()], response_length=used + 3)
    assert server.calls[1]["params"]["max_tokens"] == 3
    assert len(output.response_ids) == used + 3 == len(output.response_mask) == len(output.response_logprobs)
    assert output.response_mask[-3:] == [1, 1, 1]
    assert output.extra_fields["termination_reason"] == "response_length"


def test_a_tool_turn_that_does_not_fit_is_dropped():
    first = encode(CALL)
    output, server = run_loop([CALL, FINAL], [AddTool()], response_length=len(first) + len(encode(TOOL_TURN_5)))
    assert output.response_ids == first and output.response_mask == [1] * len(first)
    assert len(server.calls) == 1 and output.extra_fields["termination_reason"] == "response_length"


def test_no_logprobs_from_the_server_gives_none():
    output, _ = run_loop([CALL, FINAL], [AddTool()], logprobs=False)
    assert output.response_logprobs is None


def test_max_assistant_turns_stops_before_running_the_calls():
    add = AddTool()
    output, server = run_loop([CALL, FINAL], [add], max_assistant_turns=1)
    assert len(server.calls) == 1 and add.created == []
    assert output.extra_fields["termination_reason"] == "max_assistant_turns"
    assert output.extra_fields["num_tool_calls"] == 0 and output.num_turns == 2


def test_max_user_turns_stops_after_that_many_tool_turns():
    output, server = run_loop([CALL, CALL, FINAL], [AddTool()], max_user_turns=1)
    # sample 1, tool turn 1, sample 2 (a call again) -> stop: 2 generations, 1 tool turn
    assert len(server.calls) == 2
    assert output.extra_fields["termination_reason"] == "max_user_turns"
    assert (output.extra_fields["num_user_turns"], output.extra_fields["num_tool_calls"]) == (1, 1)


def call(name, arguments):
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def test_calls_beyond_max_parallel_calls_are_not_run():
    three = call("add", {"a": 1, "b": 1}) + call("add", {"a": 2, "b": 2}) + call("add", {"a": 3, "b": 3})
    output, _ = run_loop([three + "<|im_end|>", FINAL], [AddTool()], max_parallel_calls=2)
    assert output.extra_fields["num_tool_calls"] == 2
    # two tool messages, 1+1 and 2+2
    assert tool_text(output) == (
        "\n<|im_start|>user\n<tool_response>\n2\n</tool_response>\n<tool_response>\n4\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )


def test_parallel_calls_run_at_once():
    meeting = {}
    tools = [MeetingTool("left", meeting, 2), MeetingTool("right", meeting, 2)]
    sample = call("left", {}) + call("right", {}) + "<|im_end|>"
    output, _ = run_loop([sample, FINAL], tools, max_parallel_calls=2)
    # each call answers only once the other is running too (else it fails after 5 s and is counted an error)
    assert meeting["peak"] == 2 and output.extra_fields["num_tool_call_errors"] == 0
    assert tool_text(output).count("met") == 2


@pytest.mark.parametrize(
    "sample, tools, timeout, expected",
    [
        (call("sub", {"a": 1}), [AddTool()], None, "Unknown function 'sub'. Available tools: ['add']"),
        ('<tool_call>{"name": "add", "arguments": "{a: 1"}</tool_call>', [AddTool()], None, "Invalid JSON"),
        (call("add", [1, 2]), [AddTool()], None, "Invalid arguments for 'add': expected a JSON object, got list"),
        (call("add", {}), [FailingTool()], None, "Error executing tool 'add': database connection failed"),
        (call("add", {}), [HangingTool()], 0.05, "Tool 'add' timed out after 0.05 seconds"),
    ],
)
def test_a_failing_call_answers_with_its_error_and_the_run_goes_on(sample, tools, timeout, expected):
    output, server = run_loop([sample + "<|im_end|>", FINAL], tools, timeout=timeout)
    assert expected in tool_text(output)
    assert len(server.calls) == 2 and output.extra_fields["termination_reason"] == "no_tool_call"
    assert (output.extra_fields["num_tool_calls"], output.extra_fields["num_tool_call_errors"]) == (1, 1)
    assert output.extra_fields["tool_rewards"] == [0.0]


def test_a_call_the_parser_cannot_read_counts_as_a_failed_call_and_ends_the_trajectory():
    # one readable call and one whose body is not JSON: the readable one runs, the other is a failed call
    sample = call("add", {"a": 1, "b": 2}) + "<tool_call>{add 1 2}</tool_call><|im_end|>"
    output, server = run_loop([sample, FINAL], [AddTool()])
    assert (output.extra_fields["num_tool_calls"], output.extra_fields["num_tool_call_errors"]) == (2, 1)
    # only unreadable calls: nothing runs, so the model's turn is its last
    output, server = run_loop(["<tool_call>{add}</tool_call><|im_end|>", FINAL], [AddTool()])
    assert len(server.calls) == 1 and output.extra_fields["termination_reason"] == "no_tool_call"
    assert (output.extra_fields["num_tool_calls"], output.extra_fields["num_tool_call_errors"]) == (1, 1)


@pytest.mark.parametrize("tool_cls", [FailingTool, HangingTool])
def test_a_failed_or_timed_out_instance_is_released(tool_cls):
    tool = tool_cls()
    run_loop([call("add", {}) + "<|im_end|>", FINAL], [tool], timeout=0.05)
    assert tool.released == ["add-1"]


def test_a_multimodal_tool_response_is_refused():
    with pytest.raises(NotImplementedError, match="multimodal tool responses"):
        run_loop([CALL, FINAL], [ImageTool()])


@pytest.mark.parametrize(
    "side, expected",
    [
        ("left", "(truncated)...6789"),
        ("right", "0123...(truncated)"),
        ("middle", "01...(truncated)...89"),
    ],
)
def test_long_tool_responses_are_cut_on_the_configured_side(side, expected):
    tools = [TextTool("add", "0123456789")]
    output, _ = run_loop([CALL, FINAL], tools, max_tool_response_length=4, tool_response_truncate_side=side)
    assert f"<tool_response>\n{expected}\n</tool_response>" in tool_text(output)
    assert output.extra_fields["tool_rewards"] == [0.5]


def test_truncate_tool_response_edges():
    assert truncate_tool_response("short", 5, "middle") == "short"
    # middle with 1 character allowed keeps half of it, rounded down: nothing of either end
    assert truncate_tool_response("abc", 1, "middle") == "...(truncated)..."


def test_an_unknown_truncate_side_is_refused():
    with pytest.raises(ValueError, match="tool_response_truncate_side='top'"):
        make_loop(ToolAgentLoop, [], tool_response_truncate_side="top")


def test_the_row_can_select_its_tools():
    output, server = run_loop(
        [call("add", {"a": 1, "b": 1}) + "<|im_end|>", FINAL],
        [AddTool(), AddTool("mul")],
        row={"extra_info": {"tool_selection": ["mul"]}},
    )
    # only mul is offered (and callable): add is unknown to this row
    assert "Available tools: ['mul']" in tool_text(output)
    prompt_text = tiny_tokenizer().decode(server.calls[0]["prompt_ids"], skip_special_tokens=False)
    assert '"name": "mul"' in prompt_text and '"name": "add"' not in prompt_text


def test_kimi_format_adds_its_stop_token():
    loop_kwargs = {"tools": ToolListWrap([AddTool()])}
    loop, server = make_loop(ToolAgentLoop, [FINAL], loop_kwargs=loop_kwargs, format="kimi")
    asyncio.run(loop.run({"stop_token_ids": [5]}, raw_prompt=PROMPT))
    im_end = tiny_tokenizer().convert_tokens_to_ids("<|im_end|>")
    assert server.calls[0]["params"]["stop_token_ids"] == sorted({5, im_end})


def test_gpt_oss_tool_turns_are_written_in_harmony_form():
    sample = '<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 2, "b": 3}<|call|>'
    output, _ = run_loop([sample, "<|channel|>final<|message|>5<|end|>"], [AddTool()], format="gpt-oss")
    expected = "<|start|>functions.add to=assistant<|channel|>commentary<|message|>5<|end|><|start|>assistant"
    assert tool_text(output) == expected


def test_call_tool_needs_only_verls_minimal_loop_state():
    # verl's own unit tests call _call_tool on an object holding just these three attributes
    state = SimpleNamespace(tools={"add": AddTool()}, max_tool_response_length=100, tool_response_truncate_side="left")
    agent_data = SimpleNamespace(tools_kwargs={})
    good = FunctionCall(name="add", arguments='{"a": 3, "b": 5}')
    response, reward, info = asyncio.run(ToolAgentLoop._call_tool(state, good, {}, agent_data))
    assert (response.text, reward, info) == ("8", 1.0, {})
    bad = FunctionCall(name="add", arguments="")
    response, reward, info = asyncio.run(ToolAgentLoop._call_tool(state, bad, {}, agent_data))
    assert response.text.startswith("Invalid JSON in arguments for 'add'")
    assert (reward, info) == (0.0, {"tool_call_error": "invalid_arguments"})


def test_a_function_tool_is_called_with_the_arguments():
    def add(a: int, b: int):
        return f"{a + b}", 2.0

    tool = FunctionTool(name="add", fn=add, tool_schema=AddTool().tool_schema)
    output, _ = run_loop([CALL, FINAL], [tool])
    assert tool_text(output) == TOOL_TURN_5
    assert output.extra_fields["tool_rewards"] == [2.0]
