"""The embedded tiny tool model: its tokenizer, chat template, builder and warm-start masks (issue 49, item 4)."""

import importlib.util
import sys
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl.tools.calculator_tool import CALCULATOR_SCHEMA
from verl.utils.dataset.make_tiny_tool_data import tool_trajectory

ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = ROOT / "verl" / "models" / "tiny_tool"
RENDERED = (
    "<|im_start|>user\n37*48=?<|im_end|>"
    "<|im_start|>assistant\n"
    '<tool_call>{"name": "calculator", "arguments": {"expression": "37*48"}}</tool_call><|im_end|>'
    "<|im_start|>tool\n<tool_response>1776</tool_response><|im_end|>"
    "<|im_start|>assistant\n1776<|im_end|>"
)


def _builder():
    sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location(
        "build_tiny_tool_model", ROOT / "scripts" / "build_tiny_tool_model.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(MODEL_DIR)


def test_the_shipped_model_and_tokenizer_load_offline(tokenizer):
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR)
    assert model.config.model_type == "qwen2" and model.config.num_hidden_layers == 2
    assert model.config.hidden_size == 64 and model.config.max_position_embeddings == 128
    # every id the tokenizer can produce has an embedding (Qwen2Tokenizer would add an unk unless one is named)
    assert len(tokenizer) == model.config.vocab_size == 100
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == model.config.eos_token_id == 2
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.padding_side == "left"
    assert tokenizer.bos_token is None


def test_special_and_tag_tokens_are_single_ids(tokenizer):
    for token in ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]:
        ids = tokenizer(token, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1 and tokenizer.decode(ids) == token
    # one token per character elsewhere: "37*48" is 5 ids; no bos is prepended
    assert len(tokenizer("37*48")["input_ids"]) == 5
    # tags are added but not special (as in Qwen2.5): skip_special_tokens keeps them and drops the chat markers
    ids = tokenizer("<|im_start|>assistant\n<tool_call>x</tool_call><|im_end|>", add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "assistant\n<tool_call>x</tool_call>"


def test_round_trips_and_where_they_break(tokenizer):
    # in-vocabulary text round-trips exactly, spaces and newlines included
    ids = tokenizer(RENDERED, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == RENDERED
    # characters outside the vocabulary are dropped: decode(encode(text)) != text
    assert tokenizer.decode(tokenizer("a~b é", add_special_tokens=False)["input_ids"]) == "ab "
    # ids -> text -> ids is not the identity either: "calculator" spelled per character re-encodes as one word token
    spelled = [tokenizer.convert_tokens_to_ids(c) for c in '"calculator"']
    assert len(spelled) == 12
    assert tokenizer(tokenizer.decode(spelled), add_special_tokens=False)["input_ids"] == [
        tokenizer.convert_tokens_to_ids('"calculator"')
    ]


def test_chat_template_renders_a_tool_trajectory(tokenizer):
    messages = tool_trajectory("37*48", "1776")
    assert tokenizer.apply_chat_template(messages, tokenize=False) == RENDERED
    # user turn 11 (im_start, user, \n, 7 characters, im_end) + assistant header 3 + call 26 (<tool_call> { "name" :
    # space "calculator" , space "arguments" : space { "expression" : space " 37*48 " } } </tool_call> im_end) +
    # tool turn 10 (im_start, tool, \n, <tool_response>, 1776, </tool_response>, im_end) + header 3 + 1776 + im_end
    # = 11 + 3 + 26 + 10 + 8 = 58, well inside the 128 positions
    assert len(tokenizer(RENDERED, add_special_tokens=False)["input_ids"]) == 58
    # tools are listed by name in a system block; a JSON-string arguments field is inserted as is
    messages[1]["tool_calls"][0]["function"]["arguments"] = '{"expression": "37*48"}'
    with_tools = tokenizer.apply_chat_template(messages, tools=[CALCULATOR_SCHEMA], tokenize=False)
    assert with_tools == '<|im_start|>system\n{"name": "calculator"}<|im_end|>' + RENDERED
    # the tokens an agent loop appends after a call: a lone tool message with the generation prompt
    tool_turn = tokenizer.apply_chat_template(
        [{"role": "tool", "content": "1776"}], add_generation_prompt=True, tokenize=False
    )
    assert tool_turn == "<|im_start|>tool\n<tool_response>1776</tool_response><|im_end|><|im_start|>assistant\n"
    # a system message and no tools
    system = tokenizer.apply_chat_template([{"role": "system", "content": "hi"}], tokenize=False)
    assert system == "<|im_start|>system\nhi<|im_end|>"


def test_warm_start_mask_covers_exactly_the_models_tokens(tokenizer):
    ids, mask = _builder().encode_trajectory(tokenizer, tool_trajectory("37*48", "1776"), None)
    assert len(ids) == len(mask) == 58
    model_tokens = tokenizer.decode([i for i, m in zip(ids, mask) if m])
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "37*48"}}</tool_call><|im_end|>'
    assert model_tokens == call + "1776<|im_end|>"


def test_builder_is_deterministic_on_a_tiny_scale(tmp_path):
    builder = _builder()
    for name in ("a", "b"):
        builder.main(["--output-dir", str(tmp_path / name), "--num-warmup-steps", "2", "--batch-size", "4"])
    for file in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "config.json"):
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes(), file
    # two warm-start steps moved the weights away from the seeded initialisation: different from the shipped model
    assert (tmp_path / "a" / "model.safetensors").read_bytes() != (MODEL_DIR / "model.safetensors").read_bytes()
