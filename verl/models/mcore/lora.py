"""LoRA adapters on a megatron-core GPTModel's linear layers (verl's megatron form, ``actor_rollout_ref.model.lora``).

:func:`add_lora_adapters` gives each targeted layer (``linear_qkv``, ``linear_proj``, ``linear_fc1``,
``linear_fc2`` by default) a child module ``adapter`` holding ``lora_A`` (rank x in) and ``lora_B`` (out x rank),
and a forward hook that adds ``scaling * B(A(x))`` to the layer's output; every base weight is frozen. The layers
keep their classes and names, so the Hugging Face conversion, the cached decoder and megatron-core's DDP see the
model as before, with two more parameters per layer.

Tensor parallelism splits each adapter as its layer is split, so that every rank holds whole rows or columns of
``B A`` and the merged weight ``W + scaling * B A`` shards exactly like ``W``:

- column-parallel layers (output split: ``linear_qkv``, ``linear_fc1``): ``A`` whole on every rank, ``B``'s rows
  split like the layer's (``glu`` halves for ``linear_fc1``). ``A x`` passes megatron-core's copy-to-region
  (backward: all-reduce), so ``A``'s gradient sums every rank's rows; with sequence parallelism it is gathered along
  the sequence first, as the layer's input is.
- row-parallel layers (input split: ``linear_proj``, ``linear_fc2``): ``A``'s columns split, ``A x`` all-reduced
  (reduce-scattered along the sequence with sequence parallelism), ``B`` whole.

Adapters are initialised in full shape and then cut, each layer's from a generator seeded with ``seed`` and the
layer's number in the whole model, so every rank agrees on the parts it shares and a layer gets the same adapters
whichever pipeline stage holds it. The scaling ``alpha / rank`` is a buffer of the adapter (``adapter.scaling``), so
that a state dict alone says how to merge it: :func:`merge_lora_state_dict` turns a full (gathered) state dict into the
plain model's, which the Hugging Face export and a rollout with its own weights receive.

A layer with the input norm fused into it (Transformer Engine's ``LayerNormColumnParallelLinear``) receives the
un-normalised input; its adapter applies the layer's RMSNorm weight first, so that it sees what the layer's matrix
sees.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch

ADAPTER = "adapter"
COLUMN_PARALLEL = ("linear_qkv", "linear_fc1")
ROW_PARALLEL = ("linear_proj", "linear_fc2")
INIT_METHODS = ("xavier", "kaiming", "normal", "zero")
_ADAPTER_KEY = f".{ADAPTER}."


def layer_sizes(config: Any) -> dict[str, tuple[int, int]]:
    """``{layer kind: (in features, out features)}`` of a GPTModel's linear layers, before any split."""
    attention = config.num_attention_heads * config.kv_channels
    query_groups = config.num_query_groups or config.num_attention_heads
    qkv = attention + 2 * query_groups * config.kv_channels
    fc1 = config.ffn_hidden_size * (2 if config.gated_linear_unit else 1)
    return {
        "linear_qkv": (config.hidden_size, qkv),
        "linear_proj": (attention, config.hidden_size),
        "linear_fc1": (config.hidden_size, fc1),
        "linear_fc2": (config.ffn_hidden_size, config.hidden_size),
    }


def _initialise(shape: tuple[int, int], method: str, generator: torch.Generator) -> torch.Tensor:
    tensor = torch.empty(shape)
    if method == "zero":
        return tensor.zero_()
    if method == "normal":
        return tensor.normal_(0.0, 0.02, generator=generator)
    if method == "xavier":
        bound = math.sqrt(6.0 / (shape[0] + shape[1]))
    else:  # kaiming, as torch.nn.Linear initialises its weight (a = sqrt(5))
        bound = 1.0 / math.sqrt(shape[1])
    return tensor.uniform_(-bound, bound, generator=generator)


class LoraAdapter(torch.nn.Module):
    """``scaling * B(A(x))`` of one linear layer, this tensor-parallel rank's part of it.

    Args:
        kind: the layer's kind (``linear_qkv``, ``linear_proj``, ``linear_fc1``, ``linear_fc2``).
        sizes: the layer's full (in, out) features.
        rank, alpha: LoRA's rank and scaling numerator.
        init_a, init_b: :data:`INIT_METHODS` of A and B.
        generator: where the full A and B are drawn from (the same on every rank).
        tp_rank, tp_size: this rank's place in the tensor-parallel group.
        sequence_parallel: whether the layer's activations are split along the sequence.
        dropout, dropout_position: dropout on the input of A (``pre``) or on the adapter's output (``post``).
        norm_weight, norm_eps: the fused input norm's weight and epsilon, for a layer that normalises its input.
        dtype: the adapter's parameter dtype (the layer's).
    """

    def __init__(
        self,
        kind: str,
        sizes: tuple[int, int],
        rank: int,
        alpha: float,
        *,
        init_a: str,
        init_b: str,
        generator: torch.Generator,
        tp_rank: int = 0,
        tp_size: int = 1,
        sequence_parallel: bool = False,
        dropout: float = 0.0,
        dropout_position: str = "pre",
        norm_weight: torch.Tensor | None = None,
        norm_eps: float = 1e-6,
        dtype: torch.dtype = torch.float32,
    ):
        from verl.models.mcore.tensor_parallel import _slice

        super().__init__()
        self.column = kind in COLUMN_PARALLEL
        self.tp_size, self.sequence_parallel = tp_size, sequence_parallel
        self.dropout = torch.nn.Dropout(dropout) if dropout > 0 else torch.nn.Identity()
        self.dropout_position = dropout_position
        self.norm_weight, self.norm_eps = norm_weight, norm_eps
        in_features, out_features = sizes
        full_a = _initialise((rank, in_features), init_a, generator)
        full_b = _initialise((out_features, rank), init_b, generator)
        if self.column:  # B's rows split like the layer's output
            rule_b = "glu" if kind == "linear_fc1" else "dim0"
            part_a, part_b = full_a, _slice(full_b, rule_b, tp_rank, tp_size)
        else:  # A's columns split like the layer's input
            part_a, part_b = _slice(full_a, "dim1", tp_rank, tp_size), full_b
        self.lora_A = torch.nn.Linear(part_a.shape[1], rank, bias=False, dtype=dtype)
        self.lora_B = torch.nn.Linear(rank, part_b.shape[0], bias=False, dtype=dtype)
        with torch.no_grad():
            self.lora_A.weight.copy_(part_a)
            self.lora_B.weight.copy_(part_b)
        self.register_buffer("scaling", torch.tensor(alpha / rank, dtype=torch.float32))
        self.enabled = True
        self._mark_for_megatron()

    def _mark_for_megatron(self) -> None:
        """The attributes megatron-core's gradient norm and sequence-parallel reduction read."""
        from megatron.core.tensor_parallel import set_tensor_model_parallel_attributes

        split, whole = (self.lora_B, self.lora_A) if self.column else (self.lora_A, self.lora_B)
        set_tensor_model_parallel_attributes(split.weight, self.tp_size > 1, 0 if self.column else 1, 1)
        # the whole part sees one slice of the sequence per rank: its gradients are summed over the group
        whole.weight.sequence_parallel = self.sequence_parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from megatron.core import tensor_parallel as tp

        if self.norm_weight is not None:
            x = _rms_norm(x, self.norm_weight, self.norm_eps)
        if self.dropout_position == "pre":
            x = self.dropout(x)
        hidden = self.lora_A(x)
        if self.column:
            if self.sequence_parallel:
                hidden = tp.gather_from_sequence_parallel_region(hidden)
            elif self.tp_size > 1:
                hidden = tp.copy_to_tensor_model_parallel_region(hidden)
        elif self.sequence_parallel:
            hidden = tp.reduce_scatter_to_sequence_parallel_region(hidden)
        elif self.tp_size > 1:
            hidden = tp.reduce_from_tensor_model_parallel_region(hidden)
        out = self.lora_B(hidden) * self.scaling.to(hidden.dtype)
        return self.dropout(out) if self.dropout_position == "post" else out


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * weight.float()).to(x.dtype)


def _add_adapter_output(module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
    """Forward hook of an adapted layer: its ``(output, bias)`` with the adapter's term added to the output."""
    adapter = getattr(module, ADAPTER)
    if not adapter.enabled:
        return output
    x = args[0] if args else next(iter(kwargs.values()))
    out, bias = output
    return out + adapter(x).to(out.dtype), bias


# far enough apart that the layers' seeds never meet another run's seed + layer
_LAYER_SEED_STRIDE = 1_000_003


def _layer_number(model: torch.nn.Module, name: str) -> int:
    """The whole model's number (from 1) of the transformer layer that module ``name`` belongs to (0: none)."""
    parts = name.split(".")
    if parts[:2] != ["decoder", "layers"]:
        return 0
    return int(model.decoder.layers[int(parts[2])].layer_number)


def _whole_model_name(model: torch.nn.Module, name: str) -> str:
    """``name`` with its layer numbered as in the whole model: a pipeline stage numbers its own layers from 0."""
    number = _layer_number(model, name)
    if number == 0:
        return name
    parts = name.split(".")
    return ".".join([*parts[:2], str(number - 1), *parts[3:]])


def _targets(model: torch.nn.Module, targets: Sequence[str], exclude: Sequence[str]) -> list[tuple[str, Any]]:
    found = []
    for name, module in model.named_modules():
        kind = name.rsplit(".", 1)[-1]
        if kind not in (*COLUMN_PARALLEL, *ROW_PARALLEL) or kind not in targets:
            continue
        whole_name = _whole_model_name(model, name)  # an excluded layer is named as in the whole model
        if any(whole_name == pattern or whole_name.endswith(f".{pattern}") for pattern in exclude):
            continue
        found.append((name, module))
    return found


def add_lora_adapters(
    model: torch.nn.Module,
    *,
    rank: int,
    alpha: float,
    target_modules: Sequence[str],
    exclude_modules: Sequence[str] = (),
    dropout: float = 0.0,
    dropout_position: str = "pre",
    init_a: str = "xavier",
    init_b: str = "zero",
    seed: int = 0,
) -> list[str]:
    """Give every targeted linear layer of a GPTModel an adapter, and freeze everything else.

    Args:
        model: the GPTModel (this tensor-parallel rank's part).
        rank, alpha: LoRA's rank and scaling numerator (scaling ``alpha / rank``).
        target_modules: layer kinds to adapt, among :data:`COLUMN_PARALLEL` and :data:`ROW_PARALLEL`.
        exclude_modules: names (a layer's full name, a suffix of it, or a kind) left without adapters.
        dropout, dropout_position: see :class:`LoraAdapter`.
        init_a, init_b: :data:`INIT_METHODS`.
        seed: the seed the adapters are drawn with (the same on every rank).

    Returns:
        The adapted layers' names.

    Raises:
        ValueError: a target that is not a linear layer kind, or targets that match no layer.
    """
    _check_target_kinds(target_modules)
    sizes = layer_sizes(model.config)
    shared = _shared_adapter_options(
        model.config,
        rank=rank,
        alpha=alpha,
        init_a=init_a,
        init_b=init_b,
        dropout=dropout,
        dropout_position=dropout_position,
    )
    generators: dict[int, torch.Generator] = {}
    model.requires_grad_(False)
    adapted = []
    for name, module in _targets(model, target_modules, exclude_modules):
        layer_number = _layer_number(model, name)
        if layer_number not in generators:
            generators[layer_number] = torch.Generator().manual_seed(seed + _LAYER_SEED_STRIDE * layer_number)
        _attach_adapter(module, name.rsplit(".", 1)[-1], sizes, generators[layer_number], shared)
        adapted.append(name)
    if not adapted:
        raise ValueError(f"target_modules {list(target_modules)} (less {list(exclude_modules)}) match no layer.")
    return adapted


def _check_target_kinds(target_modules: Sequence[str]) -> None:
    """Raise ``ValueError`` for a target that is not a megatron-core linear layer kind of a GPTModel."""
    unknown = sorted(set(target_modules) - {*COLUMN_PARALLEL, *ROW_PARALLEL})
    if unknown:
        raise ValueError(
            f"target_modules {unknown} are not megatron-core linear layers of a GPTModel; take them from "
            f"{[*COLUMN_PARALLEL, *ROW_PARALLEL]}."
        )


def _shared_adapter_options(config: Any, **options: Any) -> dict[str, Any]:
    """The :class:`LoraAdapter` keywords every layer shares: ``options`` plus the model's parallel layout and norm."""
    tp_rank, tp_size = _tensor_parallel_place(config)
    return dict(
        options,
        tp_rank=tp_rank,
        tp_size=tp_size,
        sequence_parallel=bool(config.sequence_parallel),
        norm_eps=config.layernorm_epsilon,
    )


def _attach_adapter(
    module: torch.nn.Module,
    kind: str,
    sizes: dict[str, tuple[int, int]],
    generator: torch.Generator,
    shared: dict[str, Any],
) -> None:
    """Give ``module`` (a linear layer of kind ``kind``) its adapter, on its device and dtype, added to its output."""
    adapter = LoraAdapter(
        kind,
        sizes[kind],
        generator=generator,
        norm_weight=getattr(module, "layer_norm_weight", None),
        dtype=module.weight.dtype,
        **shared,
    ).to(module.weight.device)
    module.add_module(ADAPTER, adapter)
    module.register_forward_hook(_add_adapter_output, with_kwargs=True)


def _tensor_parallel_place(config: Any) -> tuple[int, int]:
    size = int(getattr(config, "tensor_model_parallel_size", 1))
    if size == 1:
        return 0, 1
    from megatron.core import parallel_state

    return parallel_state.get_tensor_model_parallel_rank(), size


def adapters(model: torch.nn.Module) -> Iterator[LoraAdapter]:
    return (module for module in model.modules() if isinstance(module, LoraAdapter))


def has_adapters(model: torch.nn.Module) -> bool:
    return next(adapters(model), None) is not None


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[None]:
    """Run ``model`` as the base model (every adapter skipped): the reference policy of a LoRA run."""
    switched = [adapter for adapter in adapters(model) if adapter.enabled]
    for adapter in switched:
        adapter.enabled = False
    try:
        yield
    finally:
        for adapter in switched:
            adapter.enabled = True


def merge_lora_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The plain model's state dict from a full (unsplit) one with adapters: each adapted layer's weight
    ``W + scaling * B A`` under its own name, the adapters' entries left out; a state dict without adapters is
    returned as it is.

    Raises:
        ValueError: an adapter without its layer's weight, or without one of its parts.
    """
    layers = {key.split(_ADAPTER_KEY)[0] for key in state if _ADAPTER_KEY in key}
    if not layers:
        return state
    merged = {key: value for key, value in state.items() if _ADAPTER_KEY not in key}
    for layer in layers:
        parts = [f"{layer}.weight", f"{layer}{_ADAPTER_KEY}lora_A.weight", f"{layer}{_ADAPTER_KEY}lora_B.weight"]
        missing = [key for key in [*parts, f"{layer}{_ADAPTER_KEY}scaling"] if key not in state]
        if missing:
            raise ValueError(f"LoRA layer {layer} lacks {missing}.")
        weight, lora_a, lora_b = (state[key] for key in parts)
        scaling = float(state[f"{layer}{_ADAPTER_KEY}scaling"])
        delta = lora_b.float() @ lora_a.float() * scaling
        merged[f"{layer}.weight"] = (weight.float() + delta).to(weight.dtype)
    return merged
