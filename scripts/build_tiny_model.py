"""Build the embedded tiny default model, its tokenizer and its warm start (``verl/models/tiny``).

The tokenizer is character level (a ``tokenizers`` WordLevel model over single characters, wrapped as a
``transformers`` fast tokenizer); the model is a Qwen2-style decoder small enough for fp16 on a CPU. A short
supervised warm start on the reverse-the-digits task (``verl/utils/reward_score/tiny_task.py``) teaches the
answer format and part of the mapping, so a default RL run starts at a modest reward with room to rise. Everything
is seeded: running the script twice writes the same weights. Run from the repo root::

    .venv/bin/python scripts/build_tiny_model.py            # writes verl/models/tiny/
"""

from __future__ import annotations

import argparse
import json
import random
import string
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from verl.utils.reward_score import tiny_task

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]
CHARACTERS = list(string.digits) + list("=+-*#.,:?") + [" "] + list(string.ascii_lowercase)
_SPACE = "\u0120"  # byte-level BPE spelling of " "
# The pre-tokenizer split of transformers' Qwen2Tokenizer (words, single digits, punctuation runs, whitespace).
_QWEN2_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
DEFAULT_OUTPUT = Path(__file__).resolve().parents[1] / "verl" / "models" / "tiny"


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A char-level tokenizer: every character is one token, ``<s>`` is prepended to every encoded text.

    It is written as a byte-level BPE with no merges, the same pipeline ``transformers`` 5 rebuilds for any
    ``qwen2`` checkpoint (its ``AutoTokenizer`` forces ``Qwen2Tokenizer`` there), so the tokenizer behaves the
    same whether it is loaded as ``Qwen2Tokenizer`` or as a plain fast tokenizer. Byte-level spelling stores the
    space as ``Ġ``; decoding turns it back into a space.
    """
    byte_level = pre_tokenizers.ByteLevel.alphabet()
    assert all(c in byte_level for c in CHARACTERS if c != " ")
    vocab = {
        token: index for index, token in enumerate(SPECIAL_TOKENS + [_SPACE if c == " " else c for c in CHARACTERS])
    }
    backend = char_level_backend(vocab)
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    backend.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",
        model_max_length=64,
    )


def char_level_backend(vocab: dict[str, int]) -> Tokenizer:
    """A byte-level BPE over ``vocab`` with no merges (one token per vocabulary entry, characters outside it
    dropped), with Qwen2's pre-tokenizer and the byte-level decoder: the pipeline ``Qwen2Tokenizer`` rebuilds."""
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False, byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    return backend


def build_model(tokenizer: PreTrainedTokenizerFast, max_position_embeddings: int = 64) -> Qwen2ForCausalLM:
    """A 2-layer Qwen2 decoder (hidden 64, 4 query heads, 2 kv heads, tied embeddings); the tool model
    (``scripts/build_tiny_tool_model.py``) reuses it with longer positions."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        use_cache=True,
    )
    return Qwen2ForCausalLM(config).float()


def make_batch(tokenizer, rng: random.Random, num_examples: int) -> tuple[torch.Tensor, ...]:
    """Left-padded ``prompt + answer + eos`` sequences with a loss mask on the answer and eos.

    Returns:
        input_ids, attention_mask, position_ids, labels: each (num_examples, S); labels are -100 off the answer.
    """
    rows = []
    for _ in range(num_examples):
        prompt, answer = tiny_task.make_example(rng)
        prompt_ids = tokenizer(prompt)["input_ids"]
        answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append((prompt_ids, answer_ids))
    seq_len = max(len(p) + len(a) for p, a in rows)
    input_ids = torch.full((num_examples, seq_len), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((num_examples, seq_len), -100, dtype=torch.long)
    attention_mask = torch.zeros((num_examples, seq_len), dtype=torch.long)
    for row, (prompt_ids, answer_ids) in enumerate(rows):
        ids = prompt_ids + answer_ids
        start = seq_len - len(ids)
        input_ids[row, start:] = torch.tensor(ids)
        attention_mask[row, start:] = 1
        labels[row, seq_len - len(answer_ids) :] = torch.tensor(answer_ids)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids, labels


def warm_start(model, tokenizer, num_steps: int, batch_size: int, lr: float, seed: int) -> list[float]:
    """Supervised next-token training on the answer tokens; returns the loss of every step."""
    rng = random.Random(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    model.train()
    for _ in range(num_steps):
        input_ids, attention_mask, position_ids, labels = make_batch(tokenizer, rng, batch_size)
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, labels=labels)
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        optimizer.step()
        losses.append(out.loss.item())
    model.eval()
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--num-warmup-steps", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    losses = warm_start(model, tokenizer, args.num_warmup_steps, args.batch_size, args.lr, args.seed)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(args.output_dir)
    _pin_tokenizer_class(args.output_dir)
    model.save_pretrained(args.output_dir, safe_serialization=True)
    num_params = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.output_dir} ({num_params} parameters, vocab {len(tokenizer)})")
    print(f"warm-start loss: first {losses[0]:.3f}, last {sum(losses[-10:]) / 10:.3f} (mean of last 10)")


def _pin_tokenizer_class(output_dir: Path) -> None:
    # transformers 5 writes its own backend name; the classic fast-tokenizer name loads in 4.x and 5.x alike.
    path = output_dir / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
