"""verl.utils.fsdp_utils: the FSDP2 mixed-precision policy a model gets from its dtypes, and the buffer cast that
stands in for verl's mixed_precision.buffer_dtype (FSDP2 has none)."""

import pytest
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

from verl.utils.fsdp_utils import cast_floating_buffers, cast_floating_parameters, mixed_precision_policy

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


@pytest.mark.parametrize(
    ("dtype", "kwargs", "expected"),
    [
        # the policies before verl's mixed_precision keys existed: fp32 throughout, fp16/bf16 reduce in fp32
        (F32, {}, MixedPrecisionPolicy(param_dtype=F32, reduce_dtype=F32)),
        (F16, {}, MixedPrecisionPolicy(param_dtype=F16, reduce_dtype=F32)),
        (BF16, {}, MixedPrecisionPolicy(param_dtype=BF16, reduce_dtype=F32)),
        # verl's run_qwen3-32b_npu.sh on fp16 compute: gathered and reduced in bf16
        (F16, {"param_dtype": BF16, "reduce_dtype": BF16}, MixedPrecisionPolicy(param_dtype=BF16, reduce_dtype=BF16)),
        # fp32 compute with a bf16 gradient reduction only
        (F32, {"reduce_dtype": BF16}, MixedPrecisionPolicy(param_dtype=F32, reduce_dtype=BF16)),
        # fp16 compute over weights gathered in fp32 (autocast casts per operation)
        (F16, {"param_dtype": F32}, MixedPrecisionPolicy(param_dtype=F32, reduce_dtype=F32)),
    ],
)
def test_the_policy_gathers_in_param_dtype_and_reduces_in_reduce_dtype(dtype, kwargs, expected):
    assert mixed_precision_policy(dtype, **kwargs) == expected


class WithBuffers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)
        self.register_buffer("inv_freq", torch.tensor([1.0, 1.0 / 3.0]), persistent=False)
        self.register_buffer("steps", torch.tensor([7]))  # an integer buffer: never cast
        self.register_buffer("absent", None)


def test_floating_buffers_are_cast_and_nothing_else():
    module = WithBuffers()
    assert cast_floating_buffers(module, BF16) == 1
    assert module.inv_freq.dtype == BF16 and module.steps.dtype == torch.int64 and module.absent is None
    # 1/3 in bf16 (8 bits of mantissa): 0.333984375; parameters keep their dtype
    assert module.inv_freq.tolist() == [1.0, 0.333984375]
    assert module.linear.weight.dtype == F32
    assert cast_floating_buffers(module, BF16) == 0  # already there


def test_parameters_are_cast_with_buffers_left_alone_and_tied_ones_once():
    module = WithBuffers()
    module.tied = torch.nn.Linear(2, 2, bias=False)
    module.tied.weight = module.linear.weight  # one Parameter under two names, as tied embeddings are
    # distinct parameters: linear.weight (= tied.weight) and linear.bias
    assert cast_floating_parameters(module, BF16) == 2
    assert module.linear.weight.dtype == module.linear.bias.dtype == BF16 and module.tied.weight is module.linear.weight
    assert module.inv_freq.dtype == F32  # the rotary frequencies keep their precision
    assert cast_floating_parameters(module, BF16) == 0
