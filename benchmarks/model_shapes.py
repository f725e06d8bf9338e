"""Model shapes for the benchmarks: the families and sizes users bring, written as seeded random Hugging Face models.

A :class:`Shape` names a family (``llama``, ``mistral``, ``qwen2``, ``qwen3``, ``gemma``), the hidden size, layers,
query and key/value heads, head size, MLP size, vocabulary and whether the LM head shares the embedding.
:func:`write_model` writes it (fp32 safetensors, seed 0) with the tiny model's tokenizer: a vocabulary larger than
the tokenizer's 50 tokens is allowed (as in released checkpoints, whose embedding has unused rows); ids the tokenizer
does not know decode to nothing, and a random model over a large vocabulary rarely samples its end-of-sequence
token, so every response runs to the length limit on both trainers: the same work.

A shape is written on the command line as ``family=llama,hidden=384,layers=6,heads=6,kv_heads=6,vocab=32000,
tied=false`` (:func:`parse_shape`; omitted fields take :class:`Shape`'s defaults). :data:`SWEEP` is the set
``bench_vs_trl.py --sweep`` runs: each family at least once, tied and untied, multi-head and grouped-query
attention, the tokenizer's vocabulary and 32k/152k vocabularies, 10-60M parameters, and three response lengths.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

__all__ = ["SWEEP", "Shape", "SweepCase", "count_shape_parameters", "parse_shape", "write_model"]

# family -> (config class, model class) in transformers
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM"),
}


@dataclasses.dataclass(frozen=True)
class Shape:
    family: str = "qwen2"
    hidden: int = 384
    layers: int = 6
    heads: int = 6
    kv_heads: int = 2
    head_dim: int = 64
    intermediate: int = 1024
    vocab: int = 0  # 0: the tiny tokenizer's own vocabulary (50 tokens)
    tied: bool = True

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"family {self.family!r}: choose from {sorted(FAMILIES)}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if min(self.hidden, self.layers, self.heads, self.kv_heads, self.head_dim, self.intermediate) <= 0:
            raise ValueError(f"every size must be positive: {self}")

    def describe(self) -> str:
        vocab = self.vocab or "tokenizer"
        tied = "tied" if self.tied else "untied"
        return (
            f"{self.family} h{self.hidden} L{self.layers} {self.heads}q/{self.kv_heads}kv x{self.head_dim} "
            f"mlp{self.intermediate} vocab {vocab} {tied}"
        )


@dataclasses.dataclass(frozen=True)
class SweepCase:
    name: str
    shape: Shape
    response_length: int


# The 10m shape of the original benchmark, kept by name.
SHAPE_10M = Shape()

SWEEP = (
    SweepCase("qwen2-10m", SHAPE_10M, 64),
    # Qwen2's real vocabulary with a small trunk: the LM head and its softmax carry most of the work.
    SweepCase("qwen2-20m-v152k", Shape("qwen2", 128, 4, 2, 1, 64, 512, vocab=151936, tied=True), 64),
    # Llama-2-like: multi-head attention, 32k vocabulary, untied LM head.
    SweepCase("llama-35m-v32k-untied", Shape("llama", 384, 6, 6, 6, 64, 1024, vocab=32000, tied=False), 64),
    # Deep and narrow, per-head query/key norms, grouped-query attention; long responses.
    SweepCase("qwen3-36m-deep", Shape("qwen3", 512, 12, 8, 4, 64, 1408), 128),
    # Mistral-like: 32k vocabulary, untied, 4:1 grouped-query attention; short responses.
    SweepCase("mistral-58m-v32k-untied", Shape("mistral", 512, 8, 8, 2, 64, 1536, vocab=32768, tied=False), 32),
    # Gemma-like: tied, one key/value head of 128, GeGLU MLP, scaled embedding.
    SweepCase("gemma-26m-v32k", Shape("gemma", 384, 6, 4, 1, 128, 1536, vocab=32000, tied=True), 64),
)


def parse_shape(text: str) -> Shape:
    """``key=value`` pairs separated by commas (see the module docstring) into a :class:`Shape`."""
    fields = {f.name: f for f in dataclasses.fields(Shape)}
    values: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in fields:
            raise ValueError(f"shape item {item!r}: expected key=value with a key from {sorted(fields)}")
        if key == "family":
            values[key] = value.strip()
        elif key == "tied":
            if value.strip().lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"shape item {item!r}: tied is true or false")
            values[key] = value.strip().lower() in ("true", "1")
        else:
            values[key] = int(value)
    return Shape(**values)


def hf_config(shape: Shape, tokenizer_config) -> Any:
    """The ``transformers`` config of ``shape``, special tokens and norm epsilon from ``tokenizer_config``."""
    import transformers

    config_class = getattr(transformers, FAMILIES[shape.family][0])
    return config_class(
        vocab_size=shape.vocab or tokenizer_config.vocab_size,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=512,
        tie_word_embeddings=shape.tied,
        bos_token_id=tokenizer_config.bos_token_id,
        eos_token_id=tokenizer_config.eos_token_id,
        pad_token_id=tokenizer_config.pad_token_id,
        rms_norm_eps=tokenizer_config.rms_norm_eps,
    )


def count_shape_parameters(shape: Shape) -> int:
    """Distinct parameters of ``shape`` (a tied LM head counted once), built on the meta device."""
    import torch
    import transformers

    from verl.models.loading import load_hf_config, resolve_model_path

    config = hf_config(shape, load_hf_config(Path(resolve_model_path(None))))
    with torch.device("meta"):
        model = getattr(transformers, FAMILIES[shape.family][1])(config)
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def write_model(shape: Shape, out_dir: Path, seed: int = 0) -> Path:
    """Write ``shape`` as a seeded random fp32 model (safetensors) with the tiny tokenizer into ``out_dir``."""
    import torch
    import transformers

    from verl.models.loading import load_hf_config, resolve_model_path

    tiny_dir = Path(resolve_model_path(None))
    config = hf_config(shape, load_hf_config(tiny_dir))
    torch.manual_seed(seed)
    model = getattr(transformers, FAMILIES[shape.family][1])(config).float()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    for file in tiny_dir.iterdir():
        if file.name.startswith(("tokenizer", "special_tokens_map", "vocab", "merges")):
            shutil.copy2(file, out_dir / file.name)
    return out_dir
