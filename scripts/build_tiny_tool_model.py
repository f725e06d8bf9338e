"""Build the embedded tiny tool model, its chat tokenizer and its warm start (``verl/models/tiny_tool``).

The model is the tiny default model's 2-layer Qwen2 decoder (``scripts/build_tiny_model.py``) with longer positions;
the tokenizer is character level like the tiny model's, plus chat and tool-call tokens and a hermes-like chat
template (see ``verl/models/tiny_tool/README.md``). A short supervised warm start on synthetic trajectories of the
calculator task (:mod:`verl.utils.reward_score.tiny_calc`), half of them calling the calculator and half guessing the
answer directly, teaches the format without solving the task, so an RL run starts with room to rise. Seeded and
deterministic: two runs write byte-identical files. Run from the repo root::

    .venv/bin/python scripts/build_tiny_tool_model.py            # writes verl/models/tiny_tool/
"""

from __future__ import annotations

import argparse
import json
import random
import string
import sys
from pathlib import Path

import torch
from tokenizers import AddedToken, pre_tokenizers
from transformers import PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_tiny_model import _pin_tokenizer_class, build_model, char_level_backend  # noqa: E402

from verl.tools.calculator_tool import CALCULATOR_SCHEMA  # noqa: E402
from verl.utils.dataset.make_tiny_tool_data import tool_trajectory  # noqa: E402
from verl.utils.reward_score import tiny_calc  # noqa: E402

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added but not special (as in Qwen2.5): they survive ``skip_special_tokens=True``, so parsers and scorers see them.
TAG_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
# Whole-word tokens for the role names and the hermes JSON keys, which keeps a trajectory near 60-70 tokens.
WORD_TOKENS = ["system", "user", "assistant", "tool", '"name"', '"arguments"', '"calculator"', '"expression"']
CHARACTERS = (
    list(string.digits)
    + list("+-*/=?()#.,:;!'\"{}[]_")
    + [" ", "\n"]
    + list(string.ascii_lowercase)
    + list(string.ascii_uppercase)
)
MAX_POSITIONS = 128
DEFAULT_OUTPUT = Path(__file__).resolve().parents[1] / "verl" / "models" / "tiny_tool"

# Hermes-like (Qwen2.5's layout, compacted): no newline between messages, tools listed by name only in a system
# block, tool calls as <tool_call>{json}</tool_call>, tool answers as a ``tool`` turn wrapped in <tool_response>.
# Rendering is concatenative: the text of messages[:k] is a prefix of the text of messages, and a lone tool message
# with add_generation_prompt renders exactly the tokens an agent loop appends after a tool call.
_NL = "{{ '\\n' }}"
CHAT_TEMPLATE = "".join(
    [
        "{%- macro text(content) -%}{%- if content is string -%}{{ content }}{%- elif content -%}",
        "{%- for part in content -%}{{ part.text if part.text is defined else '' }}{%- endfor -%}",
        "{%- endif -%}{%- endmacro -%}",
        "{%- set ns = namespace(start=0) -%}",
        "{%- if messages and messages[0].role == 'system' -%}{%- set ns.start = 1 -%}{%- endif -%}",
        "{%- if tools or ns.start == 1 -%}<|im_start|>system" + _NL,
        "{%- if ns.start == 1 -%}{{ text(messages[0].content) }}{%- if tools -%}" + _NL + "{%- endif -%}{%- endif -%}",
        "{%- for tool in tools or [] -%}{%- set fn = tool.function if tool.function is defined else tool -%}",
        '{"name": "{{ fn.name }}"}{%- if not loop.last -%}' + _NL + "{%- endif -%}{%- endfor -%}",
        "<|im_end|>{%- endif -%}",
        "{%- for message in messages[ns.start:] -%}",
        "{%- if message.role == 'assistant' -%}<|im_start|>assistant" + _NL + "{{ text(message.content) }}",
        "{%- for call in message.tool_calls or [] -%}",
        "{%- set fn = call.function if call.function is defined else call -%}",
        '<tool_call>{"name": "{{ fn.name }}", "arguments": ',
        "{% if fn.arguments is string %}{{ fn.arguments }}{% else %}{{ fn.arguments | tojson }}{% endif -%}",
        "}</tool_call>{%- endfor -%}<|im_end|>",
        "{%- elif message.role == 'tool' -%}<|im_start|>tool" + _NL,
        "<tool_response>{{ text(message.content) }}</tool_response><|im_end|>",
        "{%- elif message.role is defined -%}<|im_start|>{{ message.role }}" + _NL,
        "{{ text(message.content) }}<|im_end|>",
        "{%- endif -%}{%- endfor -%}",
        "{%- if add_generation_prompt -%}<|im_start|>assistant" + _NL + "{%- endif -%}",
    ]
)


def build_tool_tokenizer() -> PreTrainedTokenizerFast:
    """The character-level chat tokenizer: one token per character, plus whole tokens for the chat markup.

    Stored as a byte-level BPE with no merges, like the tiny model's tokenizer (``transformers`` 5 rebuilds a
    ``qwen2`` checkpoint's tokenizer in that form). No bos is prepended; eos is ``<|im_end|>``, pad (and the unused
    unk, which ``Qwen2Tokenizer`` would otherwise add) ``<|endoftext|>``.
    Characters outside the vocabulary are dropped by encoding.
    """
    byte_level = {ord(c): c for c in pre_tokenizers.ByteLevel.alphabet()}
    spelled = ["\u0120" if c == " " else "\u010a" if c == "\n" else byte_level[ord(c)] for c in CHARACTERS]
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + TAG_TOKENS + spelled)}
    backend = char_level_backend(vocab)
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS + WORD_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        padding_side="left",
        model_max_length=MAX_POSITIONS,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def encode_trajectory(tokenizer, messages: list[dict], tools: list[dict] | None) -> tuple[list[int], list[int]]:
    """Token ids of a whole conversation and a 0/1 mask that is 1 on the assistant's own tokens.

    The assistant's tokens of a turn are what a policy generates after ``<|im_start|>assistant\\n``: the content,
    the tool calls and the closing ``<|im_end|>``. They are found by rendering prefixes of the conversation, which
    the concatenative template makes exact (checked).
    """

    def ids(upto: int, generation_prompt: bool) -> list[int]:
        text = tokenizer.apply_chat_template(
            messages[:upto], tools=tools, add_generation_prompt=generation_prompt, tokenize=False
        )
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    full = ids(len(messages), False)
    mask = [0] * len(full)
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start, end = len(ids(index, True)), len(ids(index + 1, False))
        assert full[:end] == ids(index + 1, False), "the chat template must render prefixes as prefixes"
        mask[start:end] = [1] * (end - start)
    return full, mask


def make_batch(tokenizer, rng: random.Random, batch_size: int, tool_fraction: float) -> tuple[torch.Tensor, ...]:
    """Left-padded synthetic trajectories; labels are -100 except on the assistant's tokens.

    Each trajectory calls the calculator with probability ``tool_fraction`` (otherwise it states the answer
    directly); half are rendered with the calculator's schema in ``tools``, half without.

    Returns:
        input_ids, attention_mask, position_ids, labels: each (batch_size, S).
    """
    rows = []
    for _ in range(batch_size):
        expression, answer = tiny_calc.make_example(rng)
        use_tool = rng.random() < tool_fraction
        tools = [CALCULATOR_SCHEMA] if rng.random() < 0.5 else None
        rows.append(encode_trajectory(tokenizer, tool_trajectory(expression, answer, use_tool), tools))
    seq_len = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((batch_size, seq_len), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((batch_size, seq_len), -100, dtype=torch.long)
    attention_mask = torch.zeros((batch_size, seq_len), dtype=torch.long)
    for row, (ids, mask) in enumerate(rows):
        start = seq_len - len(ids)
        input_ids[row, start:] = torch.tensor(ids)
        attention_mask[row, start:] = 1
        labels[row, start:] = torch.where(torch.tensor(mask) == 1, torch.tensor(ids), torch.tensor(-100))
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids, labels


def warm_start(model, tokenizer, args: argparse.Namespace) -> list[float]:
    """Supervised next-token training on the assistant's tokens; returns the loss of every step."""
    rng = random.Random(args.seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    losses = []
    model.train()
    for _ in range(args.num_warmup_steps):
        input_ids, attention_mask, position_ids, labels = make_batch(
            tokenizer, rng, args.batch_size, args.tool_fraction
        )
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, labels=labels)
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        optimizer.step()
        losses.append(out.loss.item())
    model.eval()
    return losses


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--num-warmup-steps", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--tool-fraction", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=1234)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # one thread: same sums on every machine, and no spinning against a busy second core
    tokenizer = build_tool_tokenizer()
    model = build_model(tokenizer, max_position_embeddings=MAX_POSITIONS)
    losses = warm_start(model, tokenizer, args)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(args.output_dir)
    _pin_tokenizer_class(args.output_dir)
    _move_chat_template_into_config(args.output_dir)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(args.output_dir, safe_serialization=True)
    num_params = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.output_dir} ({num_params} parameters, vocab {len(tokenizer)})")
    if losses:
        print(f"warm-start loss: first {losses[0]:.3f}, last {sum(losses[-10:]) / len(losses[-10:]):.3f}")


def _move_chat_template_into_config(output_dir: Path) -> None:
    # transformers 5 writes the template to chat_template.jinja; tokenizer_config.json is read by 4.x and 5.x alike.
    template_file = output_dir / "chat_template.jinja"
    path = output_dir / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["chat_template"] = template_file.read_text() if template_file.exists() else CHAT_TEMPLATE
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    template_file.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
