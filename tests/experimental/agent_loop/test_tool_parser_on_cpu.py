"""The tool-call parsers on verl-style outputs of each format: calls found, content kept, malformed calls
skipped, and the registry of parser names."""

import asyncio
import json
import os

import pytest

from verl.experimental.agent_loop.tool_parser import (
    GptOssToolParser,
    HermesToolParser,
    KimiToolParser,
    Qwen3XMLToolParser,
    ToolParser,
    convert_xml_parameter,
)

from .tiny_chat import tiny_tokenizer, tool_schema


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def parse(parser_name, tokenizer, text, tools=None):
    """Encode ``text`` with the tiny tokenizer and run the named parser on the ids."""
    parser = ToolParser.get_tool_parser(parser_name, tokenizer)
    ids = tokenizer.encode(text, add_special_tokens=False)
    return asyncio.run(parser.extract_tool_calls(ids, tools))


def test_registry_has_verls_names_and_refuses_an_unknown_one(tokenizer):
    expected = {
        "hermes": HermesToolParser,
        "qwen3_coder": Qwen3XMLToolParser,
        "kimi": KimiToolParser,
        "gpt-oss": GptOssToolParser,
    }
    for name, cls in expected.items():
        assert type(ToolParser.get_tool_parser(name, tokenizer)) is cls
    with pytest.raises(ValueError, match="Unknown tool parser: 'mistral'.*hermes"):
        ToolParser.get_tool_parser("mistral", tokenizer)


def test_hermes_reads_every_call_and_removes_them_from_the_content(tokenizer):
    text = (
        "Let me add."
        '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
        '<tool_call>{"name": "mul", "arguments": {"x": "e"}}</tool_call><|im_end|>'
    )
    content, calls = parse("hermes", tokenizer, text)
    assert content == "Let me add.<|im_end|>"
    assert [(call.name, json.loads(call.arguments)) for call in calls] == [
        ("add", {"a": 2, "b": 3}),
        ("mul", {"x": "e"}),
    ]
    assert calls[0].arguments == '{"a": 2, "b": 3}'
    assert all(call.tool_call_id is None for call in calls)


def test_hermes_skips_malformed_calls_and_keeps_the_good_one(tokenizer):
    text = (
        '<tool_call>{"name": "add", "arguments": {"a": 2</tool_call>'  # JSON cut short
        '<tool_call>{"name": "add"}</tool_call>'  # no arguments
        '<tool_call>{"name": 7, "arguments": {}}</tool_call>'  # name not a string
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}</tool_call>'
    )
    _, calls = parse("hermes", tokenizer, text)
    assert [(call.name, call.arguments) for call in calls] == [("add", '{"a": 1, "b": 1}')]


def test_hermes_without_a_closed_call_returns_the_text(tokenizer):
    text = 'Thinking <tool_call>{"name": "add"'
    assert parse("hermes", tokenizer, text) == (text, [])


def test_hermes_keeps_string_arguments_as_written(tokenizer):
    # a model that writes the arguments as a string: passed through for the loop to judge
    _, calls = parse("hermes", tokenizer, '<tool_call>{"name": "add", "arguments": "{a: 1"}</tool_call>')
    assert calls[0].arguments == "{a: 1"


def test_qwen3_coder_converts_values_by_the_schema(tokenizer):
    tools = [tool_schema("add", {"a": "integer", "b": "number", "note": "string", "exact": "boolean"})]
    text = (
        "Sure.\n<tool_call>\n<function=add>\n<parameter=a>\n2\n</parameter>\n<parameter=b>\n1.5\n</parameter>\n"
        "<parameter=note>\n007\n</parameter>\n<parameter=exact>\nTrue\n</parameter>\n</function>\n</tool_call>"
    )
    content, calls = parse("qwen3_coder", tokenizer, text, tools)
    assert content == "Sure.\n"
    assert len(calls) == 1 and calls[0].name == "add"
    # integer "2" -> 2, number "1.5" -> 1.5, string "007" stays text, boolean "True" -> true
    assert json.loads(calls[0].arguments) == {"a": 2, "b": 1.5, "note": "007", "exact": True}


def test_qwen3_coder_reads_a_call_cut_before_its_closing_tags(tokenizer):
    tools = [tool_schema("add", {"a": "integer", "b": "integer"})]
    text = "<tool_call>\n<function=add>\n<parameter=a>\n2\n</parameter>\n<parameter=b>\n3"
    _, calls = parse("qwen3_coder", tokenizer, text, tools)
    assert json.loads(calls[0].arguments) == {"a": 2, "b": 3}


def test_qwen3_coder_skips_a_header_without_its_bracket_and_a_broken_parameter(tokenizer):
    tools = [tool_schema("add", {"a": "integer"})]
    text = (
        "<tool_call><function=add</function></tool_call>"  # no '>' after the name: skipped
        "<tool_call><function=add><parameter=a>4</parameter><parameter=broken</function></tool_call>"
    )
    _, calls = parse("qwen3_coder", tokenizer, text, tools)
    assert [(call.name, json.loads(call.arguments)) for call in calls] == [("add", {"a": 4})]


def test_qwen3_coder_values_are_never_evaluated(tmp_path):
    marker = tmp_path / "pwned"
    payload = f'__import__("os").system("touch {marker}")'
    assert convert_xml_parameter(payload, "array") == payload
    assert not os.path.exists(marker)
    assert convert_xml_parameter("[1, 2]", "array") == [1, 2]
    assert convert_xml_parameter("{'k': (1, 2)}", "object") == {"k": (1, 2)}  # a Python literal
    assert convert_xml_parameter("null", "integer") is None
    assert convert_xml_parameter("x1", "integer") == "x1"  # not an integer: stays text
    assert convert_xml_parameter("4.0", "number") == 4  # a whole number becomes an int
    assert convert_xml_parameter("yes", "boolean") is False


def test_kimi_reads_calls_with_their_ids_and_skips_unreadable_arguments(tokenizer):
    tools = [tool_schema("get_weather", {"city": "string"}), tool_schema("add", {"a": "integer"})]
    text = (
        "I will check.<|tool_calls_section_begin|>"
        '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>'
        "<|tool_call_begin|>functions.add:1<|tool_call_argument_begin|>{bad<|tool_call_end|>"
        "<|tool_calls_section_end|>"
    )
    content, calls = parse("kimi", tokenizer, text, tools)
    assert content == "I will check."
    assert [(call.name, call.arguments, call.tool_call_id) for call in calls] == [
        ("get_weather", '{"city": "Paris"}', "functions.get_weather:0")
    ]


def test_kimi_stops_on_im_end(tokenizer):
    parser = ToolParser.get_tool_parser("kimi", tokenizer)
    assert parser.stop_token_ids == [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    assert ToolParser.get_tool_parser("hermes", tokenizer).stop_token_ids == []


def test_gpt_oss_reads_commentary_calls_and_ignores_the_analysis_channel(tokenizer):
    text = (
        "<|channel|>analysis<|message|>maybe to=functions.fake <|constrain|>json<|message|>{}<|call|><|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_current_weather <|constrain|>json"
        '<|message|>{"location": "Tokyo"}<|call|>'
    )
    content, calls = parse("gpt-oss", tokenizer, text)
    assert [(call.name, call.arguments) for call in calls] == [("get_current_weather", '{"location": "Tokyo"}')]
    assert "get_current_weather" not in content


def test_gpt_oss_reads_a_first_message_without_its_start_header(tokenizer):
    # the prompt ends with "<|start|>assistant", so the sample opens at the channel tag
    text = '<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 1}<|call|>'
    _, calls = parse("gpt-oss", tokenizer, text)
    assert [(call.name, call.arguments) for call in calls] == [("add", '{"a": 1}')]
    assert parse("gpt-oss", tokenizer, "<|channel|>final<|message|>42<|end|>")[1] == []
