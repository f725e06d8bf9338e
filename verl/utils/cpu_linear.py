"""fp32 linear layers on CPU through oneDNN instead of the BLAS that ``torch.mm`` calls.

PyTorch's CPU builds send an fp32 ``F.linear`` to MKL's ``sgemm``. On CPUs where MKL does not pick its fastest
kernels (AMD EPYC, measured here: ``benchmarks/bench_cpu_linear.py``), the oneDNN library bundled in the same
build multiplies the same fp32 matrices about twice as fast, forward and backward, at the shapes of a transformer
layer. :class:`OneDNNLinear` is a ``torch.nn.Linear`` whose forward and backward products go through oneDNN
(``torch.ops.mkldnn._linear_pointwise``, which takes ordinary strided tensors, so nothing is converted or copied)
when that is safe and worth it, and through ``F.linear`` otherwise:

- the input and weight are fp32 CPU tensors and CPU autocast is off (fp16/bf16 compute keeps torch's kernels);
- the product is big enough (:data:`MIN_FLOPS`) that oneDNN's fixed cost per call does not eat the gain.

The arithmetic is full fp32 (oneDNN's default math mode), so results differ from MKL's only in summation order.
Gradients flow to whichever of input, weight and bias require them (a frozen weight with a trained bias included);
a backward with ``create_graph=True`` runs its products on ``F.linear``, so gradients of gradients are those of
``nn.Linear``; so does a compiled forward (``torch.compile``, whose inductor lowers ``F.linear`` itself).
:func:`use_onednn_linear` switches a model's ``nn.Linear`` modules in place: same parameters, same names, same
``state_dict``; FSDP2 sharding, tied weights and checkpoints are unaffected. The switch is
``actor_rollout_ref.model.use_onednn_linear`` (and ``critic.model.use_onednn_linear``).
"""

from __future__ import annotations

import logging
import os

import torch
import torch.nn.functional as F

__all__ = [
    "MIN_FLOPS",
    "PRIMITIVE_CACHE_CAPACITY",
    "OneDNNLinear",
    "onednn_available",
    "onednn_linear",
    "primitive_cache_env",
    "use_onednn_linear",
]

logger = logging.getLogger(__name__)

# oneDNN builds and caches one kernel per operand shape, about 0.6-0.8 MB each whatever the model's size (measured on
# this machine), up to 1024 by default; training micro-batches bring new shapes every step, so the default would
# grow a process by up to about 800 MB. A bound of 128 holds every shape a step uses (per micro-batch, three per
# distinct layer size; the rollout's batch shrinks through few shapes, see verl.workers.rollout.naive_rollout).
PRIMITIVE_CACHE_CAPACITY = 128

# oneDNN reads the first, PyTorch's own cache of oneDNN kernels the second, each once, when first used.
_CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def primitive_cache_env(environ=os.environ) -> dict[str, str]:
    """Environment variables that bound oneDNN's kernel caches to :data:`PRIMITIVE_CACHE_CAPACITY`, for a process
    about to start (``main_ppo`` gives them to its Ray workers); a variable already set in ``environ`` is left out,
    so a user's setting wins.

    They are not set by :func:`use_onednn_linear` itself: changing the environment of a running process is unsafe
    once it has threads (glibc's ``setenv`` against a concurrent ``getenv``), and a Ray worker has many.
    """
    return {name: str(PRIMITIVE_CACHE_CAPACITY) for name in _CACHE_VARIABLES if name not in environ}


# Below this many multiply-adds (rows x in x out) a product stays with F.linear: oneDNN's set-up per call (about
# 20 us) outweighs its faster arithmetic. Measured by benchmarks/bench_cpu_linear.py (forward + backward): 256 x 64
# -> 192 (3.1M) ran at 0.83x of F.linear, 8 x 384 -> 2048 (6.3M) at 1.35x, 1318 x 64 -> 192 (16M) at 1.3-1.4x.
MIN_FLOPS = 1 << 22


def onednn_available() -> bool:
    """Whether this torch build has oneDNN's strided linear kernel (CPU builds with MKLDNN do)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _strided_dense(matrix: torch.Tensor) -> torch.Tensor:
    """``matrix`` if it is laid out row- or column-major (what oneDNN's fast kernels read), else a contiguous copy.

    Broadcast gradients (a ``sum``'s backward hands on an expanded tensor with zero strides) would otherwise send
    oneDNN to its reference kernel, orders of magnitude slower.
    """
    rows, cols = matrix.shape
    row_stride, col_stride = matrix.stride()
    if (col_stride == 1 and row_stride >= cols) or (row_stride == 1 and col_stride >= rows):
        return matrix
    return matrix.contiguous()


def _matmul(inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``inputs @ weight.T + bias`` for 2-D operands in row- or column-major layout (transposes cost no copy)."""
    return torch.ops.mkldnn._linear_pointwise(_strided_dense(inputs), _strided_dense(weight), bias, "none", [], "")


class _OneDNNLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        # the inputs themselves are saved (a double backward differentiates through them), not their 2-D view
        ctx.save_for_backward(inputs, weight)
        ctx.has_bias = bias is not None
        flat = inputs.reshape(-1, inputs.shape[-1])
        return _matmul(flat, weight, bias).view(*inputs.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        inputs, weight = ctx.saved_tensors
        flat = inputs.reshape(-1, inputs.shape[-1])
        grad = grad_output.reshape(-1, weight.shape[0])
        # create_graph=True runs the backward with gradients on: the products then go through torch's differentiable
        # ones, so the gradients can be differentiated again (oneDNN's kernel has no derivative of its own)
        product = F.linear if torch.is_grad_enabled() else _matmul
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:  # grad @ W, as a linear with weight W.T (a strided view, no copy)
            grad_input = product(grad, weight.t(), None).view(*grad_output.shape[:-1], weight.shape[1])
        if ctx.needs_input_grad[1]:
            grad_weight = _weight_grad(product, grad, flat)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad.sum(0)
        return grad_input, grad_weight, grad_bias


def _weight_grad(product, grad: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """``grad.T @ flat`` (out x in) for a (rows, out) gradient and (rows, in) inputs.

    oneDNN's kernel copies its first operand, here the transposed gradient, to row-major; MKL's ``torch.mm`` reads
    it transposed in place. When the gradient is the larger operand (out >= in) the copy costs more than oneDNN's
    faster arithmetic saves (measured on 455 rows: out 151,936 / in 128, a large vocabulary's LM head, 0.12 s
    against 0.34 s; 1024 / 384 1.96 ms against 2.70 ms), so MKL takes it; otherwise (384 / 1024: 2.25 ms against
    1.99 ms) oneDNN does. A double backward (``product`` is then ``F.linear``) keeps torch's differentiable product.
    """
    if product is _matmul and grad.shape[1] >= flat.shape[1]:
        return torch.mm(grad.t(), flat)
    return product(grad.t(), flat.t(), None)


def _worth_onednn(inputs: torch.Tensor, weight: torch.Tensor) -> bool:
    if inputs.dtype != torch.float32 or weight.dtype != torch.float32:
        return False
    if inputs.device.type != "cpu" or weight.device.type != "cpu" or torch.is_autocast_enabled("cpu"):
        return False
    rows = inputs.numel() // max(inputs.shape[-1], 1)
    return rows * weight.shape[0] * weight.shape[1] >= MIN_FLOPS


def onednn_linear(inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` with fp32 CPU products of at least :data:`MIN_FLOPS` done by oneDNN (with autograd).

    Inside ``torch.compile`` (``actor.use_torch_compile``) the product is ``F.linear``: inductor cannot lower oneDNN's
    op, and it generates its own kernels for a linear layer.
    """
    if torch.compiler.is_compiling():
        return F.linear(inputs, weight, bias)
    if _worth_onednn(inputs, weight):
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (inputs, weight, bias)):
            return _OneDNNLinearFunction.apply(inputs, weight, bias)
        flat = _matmul(inputs.reshape(-1, inputs.shape[-1]), weight, bias)  # no graph to record
        return flat.view(*inputs.shape[:-1], weight.shape[0])
    return F.linear(inputs, weight, bias)


class OneDNNLinear(torch.nn.Linear):
    """``nn.Linear`` computed by :func:`onednn_linear`; made by :func:`use_onednn_linear`, not constructed."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return onednn_linear(inputs, self.weight, self.bias)


def use_onednn_linear(module: torch.nn.Module, device: str | torch.device = "cpu") -> int:
    """Switch every plain ``nn.Linear`` in ``module`` to :class:`OneDNNLinear`, in place; returns how many.

    Nothing changes for a model that runs on another ``device`` than the CPU, nor when this torch build has no
    oneDNN. Subclasses of ``nn.Linear`` (quantised or adapter layers with forwards of their own) are left alone.
    """
    if torch.device(device).type != "cpu":
        return 0
    if not onednn_available():
        logger.warning("use_onednn_linear: this torch build has no oneDNN linear kernel; keeping F.linear.")
        return 0
    switched = 0
    for child in module.modules():
        if type(child) is torch.nn.Linear:
            child.__class__ = OneDNNLinear
            switched += 1
    return switched
