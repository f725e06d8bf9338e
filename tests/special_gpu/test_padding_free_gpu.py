"""Padding-free forward passes (``model.use_remove_padding``) on CUDA: both branches of ``forward_packed``.

- SDPA: the packed row gets a block-diagonal causal mask (1, 1, T, T), which on CUDA sends SDPA to its masked
  kernels.
- The branch that builds no mask: an attention implementation whose name says flash attention reads the samples'
  boundaries from the restarting position ids (flash attention's variable-length kernel does). The GPU image has no
  ``flash_attn`` package, so a stand-in registered with transformers' ``AttentionInterface`` under a name containing
  "flash" attends within each sample by the same rule (SDPA per sample): the check is that verl builds no mask for it
  and hands it position ids from which the samples can be told apart, and that the result is the padded forward's.

Each is compared at every real token with the padded forward pass of the same model, directly and through the
``dp`` actor's log-probs and gradient norm. The CPU variants (fp32) check the checks themselves.
"""

import pytest
import torch
import torch.nn.functional as F
import transformers
from transformers import AttentionInterface

from tests.special_gpu.checks import DTYPES, NEEDS_CUDA, autocast_factory, half_precision_bound
from tests.workers.actor.conftest import actor_config
from verl.protocol import DataProto
from verl.utils.padding_free import forward_packed, pack, uses_flash_attention
from verl.workers.actor.dp_actor import build_dp_actor

VOCAB = 64
FLASH_LIKE = "verl_test_flash_varlen"
FP32_BOUND = 1e-4  # the same arithmetic, other kernels and another summation order: ~1e-6 on logits of order 1
NUM_ROUNDINGS = 16  # see test_decode_gpu.py
# (prompt length, response length) of each row, left- and right-padded to 4 + 4 columns
LENGTHS = [(2, 4), (4, 1), (1, 3), (3, 2)]
PROMPT = RESPONSE = 4


def cases(cpu: list, cuda: list) -> list:
    return [pytest.param("cpu", *c, id="-".join(["cpu", *c])) for c in cpu] + [
        pytest.param("cuda", *c, id="-".join(["cuda", *c]), marks=[pytest.mark.gpu, NEEDS_CUDA]) for c in cuda
    ]


def varlen_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """A flash-attention stand-in: causal attention within each sample of the packed row, samples told apart by
    ``position_ids`` restarting at 0 (what flash attention's variable-length path reads). (1, H, T, D) in,
    (1, T, H, D) out. Records what it was given in ``varlen_attention.calls``."""
    position_ids = kwargs.get("position_ids")
    varlen_attention.calls.append((attention_mask is None, position_ids is not None))
    assert query.shape[0] == 1 and position_ids is not None, "the packed row needs position ids"
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    starts = (position_ids[0] == 0).nonzero()[:, 0].tolist() + [query.shape[2]]
    outputs = [
        F.scaled_dot_product_attention(
            query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], is_causal=True, scale=scaling, dropout_p=dropout
        )
        for a, b in zip(starts[:-1], starts[1:])
    ]
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


varlen_attention.calls = []
AttentionInterface.register(FLASH_LIKE, varlen_attention)


def build_model(device: str, attn: str) -> torch.nn.Module:
    config = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        initializer_range=0.1,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).float().to(device)
    model.config._attn_implementation = attn  # as verl's own code switches it (the stand-in is no hub kernel)
    return model


def padded_batch(device: str) -> DataProto:
    """Rows of LENGTHS, prompts left-padded and responses right-padded, advantages +-1, in the rollout layout."""
    generator = torch.Generator().manual_seed(2)
    num_rows = len(LENGTHS)
    input_ids = torch.randint(3, VOCAB, (num_rows, PROMPT + RESPONSE), generator=generator)
    attention_mask = torch.zeros_like(input_ids)
    for row, (prompt, response) in enumerate(LENGTHS):
        attention_mask[row, PROMPT - prompt : PROMPT + response] = 1
    input_ids = input_ids * attention_mask
    response_mask = attention_mask[:, PROMPT:].clone()
    sign = torch.tensor([1.0, -1.0, 1.0, -1.0])[:, None]
    batch = DataProto.from_dict(
        tensors={
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "responses": input_ids[:, PROMPT:],
            "response_mask": response_mask,
            "advantages": sign * response_mask,
        },
        meta_info={"temperature": 1.0},
    )
    return batch.to(device)


def padded_and_packed_logits(model, batch: DataProto, dtype: torch.dtype, reference_attn: str):
    """(padded logits at the real tokens, packed logits at the same tokens), both float32 (N, V)."""
    device = batch.batch["input_ids"].device.type
    ids, mask, pos = (batch.batch[k] for k in ("input_ids", "attention_mask", "position_ids"))
    packed_attn = model.config._attn_implementation
    with torch.no_grad(), autocast_factory(device, dtype)():
        packed = forward_packed(model, ids, mask, pos, use_cache=False)
        model.config._attn_implementation = reference_attn
        try:
            padded = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
        finally:
            model.config._attn_implementation = packed_attn
    real = mask.bool()
    return padded[real].float(), packed[real].float()


def check_close(got, want, dtype, figure, name) -> None:
    difference = figure(name, float((got - want).abs().max()))
    bound = FP32_BOUND if dtype == torch.float32 else half_precision_bound(want, dtype, NUM_ROUNDINGS)
    assert difference <= bound, f"{difference} > {bound}"


@pytest.mark.parametrize(
    ("device", "dtype"), cases(cpu=[("float32",)], cuda=[("float32",), ("bfloat16",), ("float16",)])
)
def test_sdpa_on_the_packed_row_with_its_block_mask_gives_the_padded_logits(device, dtype, figure):
    model = build_model(device, "sdpa")
    batch = padded_batch(device)
    ids, mask, pos = (batch.batch[k] for k in ("input_ids", "attention_mask", "position_ids"))
    assert not uses_flash_attention(model)
    num_real = int(mask.sum())  # 6 + 5 + 4 + 5 = 20 real tokens of 32
    assert pack(ids, mask, pos).attention_mask.shape == (1, 1, num_real, num_real)
    padded, packed = padded_and_packed_logits(model, batch, DTYPES[dtype], "sdpa")
    check_close(packed, padded, DTYPES[dtype], figure, "sdpa_packed_max_abs_logit_diff")


@pytest.mark.parametrize(("device", "dtype"), cases(cpu=[("float32",)], cuda=[("float32",), ("bfloat16",)]))
def test_the_maskless_branch_hands_flash_attention_restarting_positions_and_gives_the_padded_logits(
    device, dtype, figure
):
    model = build_model(device, FLASH_LIKE)
    batch = padded_batch(device)
    ids, mask, pos = (batch.batch[k] for k in ("input_ids", "attention_mask", "position_ids"))
    assert uses_flash_attention(model)
    assert pack(ids, mask, pos, block_mask=False).attention_mask is None
    varlen_attention.calls.clear()
    padded, packed = padded_and_packed_logits(model, batch, DTYPES[dtype], "sdpa")
    # every layer's attention got no mask and the position ids (2 layers, one packed forward)
    assert varlen_attention.calls == [(True, True)] * 2
    check_close(packed, padded, DTYPES[dtype], figure, "maskless_packed_max_abs_logit_diff")


@pytest.mark.parametrize(("device", "attn"), cases(cpu=[("sdpa",)], cuda=[("sdpa",), (FLASH_LIKE,)]))
def test_the_dp_actor_padding_free_gives_the_padded_log_probs_and_gradient(device, attn, figure):
    def actor(use_remove_padding):
        # the padded reference attends with SDPA and the padding mask (the stand-in takes packed rows only)
        return build_dp_actor(
            actor_config(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=4),
            build_model(device, attn if use_remove_padding else "sdpa"),
            total_training_steps=1,
            use_remove_padding=use_remove_padding,
        )

    batch = padded_batch(device)
    packed_actor, padded_actor = actor(True), actor(False)
    want, _ = padded_actor.compute_log_prob(batch)
    got, _ = packed_actor.compute_log_prob(batch)
    real = batch.batch["response_mask"].bool()
    check_close(got[real], want[real], torch.float32, figure, "actor_log_prob_max_abs_diff")
    # the backward through the packed row: the same gradient norm (one on-policy update of each actor)
    packed_metrics = packed_actor.update_policy(batch).metrics
    padded_metrics = padded_actor.update_policy(batch).metrics
    norms = packed_metrics["actor/grad_norm"], padded_metrics["actor/grad_norm"]
    figure("actor_grad_norm_rel_diff", abs(norms[0] - norms[1]) / norms[1])
    assert norms[1] > 0 and abs(norms[0] - norms[1]) <= 1e-4 * norms[1]
