"""Helpers of the GPU checks: the CUDA skip, a device parameter, bitwise snapshots of training state, decoding a
fixed token sequence, and the tolerance of a half-precision comparison.

Every check of ``tests/special_gpu`` runs its CUDA variant on the lent GPU machine (``run_all.sh``) and, where the
same logic means something on a CPU, a cheap CPU variant everywhere else, so that a mistake in a check's own logic
shows up before device time is spent on it.
"""

from __future__ import annotations

import pytest
import torch

from verl.protocol import DataProto

NEEDS_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# Unit roundoff of each compute dtype: a half-precision result is trusted to a small multiple of it, relative to
# the size of the values compared (fp16 keeps 11 significant bits, bf16 8).
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def half_precision_bound(reference: torch.Tensor, dtype: torch.dtype, num_roundings: int = 64) -> float:
    """The largest difference two computations of ``reference`` in ``dtype`` may show: ``num_roundings`` unit
    roundoffs of the largest magnitude (each layer rounds its activations again, and two kernels round apart)."""
    return float(num_roundings * UNIT_ROUNDOFF[dtype] * reference.abs().max().clamp(min=1.0))


def autocast_factory(device: str, dtype: torch.dtype):
    """A factory of the context a decoder runs each forward pass in (nothing for fp32)."""
    import contextlib

    if dtype == torch.float32:
        return contextlib.nullcontext
    return lambda: torch.autocast(device_type=device, dtype=dtype)


def torch_optimizer(optimizer) -> torch.optim.Optimizer:
    """The ``torch.optim`` optimizer inside verl's adapters or megatron-core's (chained) optimizer."""
    while not isinstance(optimizer, torch.optim.Optimizer):
        chained = getattr(optimizer, "chained_optimizers", None)
        optimizer = chained[0] if chained else optimizer.optimizer
    return optimizer


def _local(tensor: torch.Tensor) -> torch.Tensor:
    to_local = getattr(tensor, "to_local", None)
    return (to_local() if callable(to_local) else tensor).detach().clone()


def training_state(module: torch.nn.Module, optimizer) -> dict[str, torch.Tensor]:
    """Copies of what a failed update must leave untouched: the module's parameters, the optimizer's own
    parameters (megatron-core's fp32 main copies) and every tensor of its state (moments, step counts)."""
    state = {f"param/{name}": _local(p) for name, p in module.named_parameters()}
    inner = torch_optimizer(optimizer)
    for i, group in enumerate(inner.param_groups):
        for j, param in enumerate(group["params"]):
            state[f"main/{i}.{j}"] = _local(param)
            for key, value in inner.state.get(param, {}).items():
                if isinstance(value, torch.Tensor):
                    state[f"optim/{i}.{j}.{key}"] = _local(value)
    return state


def assert_bitwise_equal(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> None:
    """Every tensor of ``after`` is bit for bit the one of ``before`` (same keys, dtypes and values)."""
    assert before.keys() == after.keys(), sorted(set(before) ^ set(after))[:5]
    changed = [
        key for key in before if before[key].dtype != after[key].dtype or not torch.equal(before[key], after[key])
    ]
    assert not changed, f"{len(changed)} tensors changed, e.g. {changed[:5]}"


def num_optimizer_state_tensors(state: dict[str, torch.Tensor]) -> int:
    return sum(key.startswith("optim/") for key in state)


def append_tokens(prompts: DataProto, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The prompts (B, P) followed by ``tokens`` (B, T): input ids, mask and position ids of the whole (B, P+T)."""
    input_ids = torch.cat([prompts.batch["input_ids"], tokens], dim=-1)
    ones = torch.ones_like(tokens)
    attention_mask = torch.cat([prompts.batch["attention_mask"], ones], dim=-1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


def decode_fixed_tokens(decoder, prompts: DataProto, tokens: torch.Tensor, keep_after: int, keep: torch.Tensor):
    """Feed ``tokens`` (B, T) to an incremental decoder; after ``keep_after`` decode steps only rows ``keep`` go on.

    Returns:
        ``T + 1`` float32 logits tensors: the prefill's (B, V), then one per decode step ((B, V), or (len(keep), V)
        from step ``keep_after`` on). Step ``t`` holds the logits of column ``P - 1 + t`` of the whole sequence.
    """
    ids, mask, positions = (prompts.batch[k] for k in ("input_ids", "attention_mask", "position_ids"))
    rows = torch.arange(ids.shape[0], device=ids.device)
    logits = [decoder.prefill(ids, mask, positions, tokens.shape[1])]
    next_position = positions[:, -1] + 1
    for step in range(tokens.shape[1]):
        if step == keep_after:
            decoder.keep_rows(keep)
            rows, mask, next_position = rows[keep], mask[keep], next_position[keep]
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=-1)
        logits.append(decoder.decode(tokens[rows, step], mask, next_position))
        next_position = next_position + 1
    decoder.release()
    return logits


def reference_step_logits(full_logits: torch.Tensor, num_prompt_tokens: int, keep_after: int, keep: torch.Tensor):
    """The logits :func:`decode_fixed_tokens` must give, read off one forward pass over the whole sequence.

    Args:
        full_logits: (B, P + T, V) logits of the prompts followed by the fed tokens.
        num_prompt_tokens: P.
        keep_after, keep: as given to :func:`decode_fixed_tokens`.
    """
    steps = []
    for step in range(full_logits.shape[1] - num_prompt_tokens + 1):
        column = full_logits[:, num_prompt_tokens - 1 + step].float()
        steps.append(column[keep] if step > keep_after else column)
    return steps


def max_abs_difference(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    assert [g.shape for g in got] == [w.shape for w in want]
    return max(float((g.float() - w.float()).abs().max()) for g, w in zip(got, want, strict=True))
