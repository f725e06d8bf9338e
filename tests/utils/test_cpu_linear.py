"""oneDNN linear layers on CPU: the same values and gradients as F.linear, used only where they should be."""

import math
import os

import pytest
import torch
import torch.nn.functional as F

from tests import tolerances
from verl.utils import cpu_linear
from verl.utils.cpu_linear import OneDNNLinear, onednn_linear, use_onednn_linear

pytestmark = pytest.mark.skipif(not cpu_linear.onednn_available(), reason="this torch build has no oneDNN")


@pytest.fixture
def onednn_calls(monkeypatch):
    """Every product goes through oneDNN (no size threshold); returns the list of products it computed."""
    calls = []
    matmul = cpu_linear._matmul

    def counting(inputs, weight, bias):
        calls.append((tuple(inputs.shape), tuple(weight.shape)))
        return matmul(inputs, weight, bias)

    monkeypatch.setattr(cpu_linear, "MIN_FLOPS", 0)
    monkeypatch.setattr(cpu_linear, "_matmul", counting)
    return calls


def _operands(batch_shape, fan_in=12, fan_out=20, bias=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*batch_shape, fan_in, generator=gen)
    w = torch.randn(fan_out, fan_in, generator=gen)
    b = torch.randn(fan_out, generator=gen) if bias else None
    return x, w, b


def _value_and_grads(fn, x, w, b, grad, needs_grad=(True, True, True)):
    """``fn(x, w, b)`` and, after its backward with ``grad``, the gradients of x, w, b (None where not required)."""
    x, w = x.clone().requires_grad_(needs_grad[0]), w.clone().requires_grad_(needs_grad[1])
    b = None if b is None else b.clone().requires_grad_(needs_grad[2])
    out = fn(x, w, b)
    if out.requires_grad:
        out.backward(grad)
    return [out.detach(), x.grad, w.grad] + ([] if b is None else [b.grad])


EPS = torch.finfo(torch.float32).eps  # 2**-23


def _bound(num_terms: int, sum_of_magnitudes: torch.Tensor) -> torch.Tensor:
    """How far two fp32 computations of a sum may differ when only their order of additions differs: a sum of n
    terms in any order is within n * u * sum|terms| of the exact one (u = eps / 2), so two orders are within
    n * eps * sum|terms| of each other (elementwise)."""
    return num_terms * EPS * sum_of_magnitudes


def _linear_bounds(x, w, b, grad):
    """Elementwise bounds of :func:`_bound` for ``x @ w.T + b`` and its gradients ``grad @ w``, ``grad.T @ x`` and
    ``grad.sum(0)`` (x and grad flattened to 2-D), in the order of :func:`_value_and_grads`."""
    x2, g2 = x.reshape(-1, x.shape[-1]).abs(), grad.reshape(-1, grad.shape[-1]).abs()
    rows, fan_in, fan_out = x2.shape[0], w.shape[1], w.shape[0]
    out = _bound(fan_in + 1, x2 @ w.abs().T + (0 if b is None else b.abs())).view(*x.shape[:-1], fan_out)
    grad_x = _bound(fan_out, g2 @ w.abs()).view(x.shape)
    grad_w = _bound(rows, g2.T @ x2)
    return [out, grad_x, grad_w] + ([] if b is None else [_bound(rows, g2.sum(0))])


def _assert_within(got, want, bound):
    assert got.shape == want.shape
    assert ((got - want).abs() <= bound).all(), f"{(got - want).abs().max().item()} beyond the bound"


@pytest.mark.parametrize("batch_shape", [(6,), (2, 5)], ids=["2d", "3d"])
@pytest.mark.parametrize("bias", [True, False])
def test_values_and_gradients_are_those_of_f_linear(onednn_calls, batch_shape, bias):
    x, w, b = _operands(batch_shape, bias=bias)
    grad = torch.randn(*batch_shape, 20, generator=torch.Generator().manual_seed(1))
    ours = _value_and_grads(onednn_linear, x, w, b, grad)
    reference = _value_and_grads(F.linear, x, w, b, grad)
    rows = x.numel() // 12
    # forward, then the input gradient (grad @ W): two oneDNN products; the weight gradient (grad.T @ x) has more
    # outputs (20) than inputs (12), so it is MKL's torch.mm (see test_the_weight_gradient_goes_where_it_copies_less)
    assert onednn_calls == [((rows, 12), (20, 12)), ((rows, 20), (12, 20))]
    for a, r, bound in zip(ours, reference, _linear_bounds(x, w, b, grad), strict=True):
        _assert_within(a, r, bound)  # only the summation order differs
    assert ours[2].is_contiguous()  # the weight gradient is laid out like the weight: no copy when accumulated


NEEDS_GRAD = [(x, w, b) for x in (True, False) for w in (True, False) for b in (True, False) if x or w or b]


@pytest.mark.parametrize("needs_grad", NEEDS_GRAD, ids=lambda flags: "+".join(n for n, f in zip("xwb", flags) if f))
def test_gradients_reach_exactly_the_operands_that_require_them(onednn_calls, needs_grad):
    """A frozen weight with a trained bias (or input) included: the gradients of F.linear, no more, no fewer."""
    x, w, b = _operands((2, 5))
    grad = torch.randn(2, 5, 20, generator=torch.Generator().manual_seed(1))
    ours = _value_and_grads(onednn_linear, x, w, b, grad, needs_grad)
    reference = _value_and_grads(F.linear, x, w, b, grad, needs_grad)
    assert onednn_calls  # the product did go through oneDNN
    for a, r, bound in zip(ours, reference, _linear_bounds(x, w, b, grad), strict=True):
        assert (a is None) == (r is None)
        if r is not None:
            _assert_within(a, r, bound)


@pytest.mark.parametrize("fan_in, fan_out, on_onednn", [(12, 20, False), (20, 12, True)], ids=["wide", "narrow"])
def test_the_weight_gradient_goes_where_it_copies_less(onednn_calls, monkeypatch, fan_in, fan_out, on_onednn):
    # oneDNN copies its first operand, the transposed (out, rows) gradient, to row-major; torch.mm reads it in place.
    # A layer with at least as many outputs as inputs (a vocabulary's LM head) takes torch.mm, a narrowing one oneDNN;
    # either way the gradient is F.linear's to float rounding.
    mm_calls = []
    mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda a, b: mm_calls.append((tuple(a.shape), tuple(b.shape))) or mm(a, b))
    x, w, b = _operands((6,), fan_in=fan_in, fan_out=fan_out)
    grad = torch.randn(6, fan_out, generator=torch.Generator().manual_seed(1))
    ours = _value_and_grads(onednn_linear, x, w, b, grad)
    reference = _value_and_grads(F.linear, x, w, b, grad)
    weight_grad_call = ((fan_out, 6), (fan_in, 6))
    assert (weight_grad_call in onednn_calls) == on_onednn
    assert mm_calls == ([] if on_onednn else [((fan_out, 6), (6, fan_in))])
    assert ours[2].is_contiguous()  # the weight gradient is laid out like the weight
    for a, r, bound in zip(ours, reference, _linear_bounds(x, w, b, grad), strict=True):
        _assert_within(a, r, bound)


def test_gradients_of_gradients_are_those_of_f_linear(onednn_calls):
    """A backward with create_graph=True gives gradients that can be differentiated again, like F.linear's."""
    x, w, b = _operands((2, 5))

    def second_order(fn):
        xr, wr, br = (t.clone().requires_grad_() for t in (x, w, b))
        out = fn(xr, wr, br)
        grad_x, grad_w = torch.autograd.grad(out.pow(2).sum(), (xr, wr), create_graph=True)
        (grad_x.pow(2).sum() + grad_w.pow(2).sum()).backward()
        return [xr.grad, wr.grad, br.grad]

    ours, reference = second_order(onednn_linear), second_order(F.linear)
    # the forward, and the input-gradient product of the plain second backward through it (its weight gradient,
    # 20 outputs over 12 inputs, is torch.mm's); the first backward (create_graph=True) ran its products on
    # F.linear, else there would be more
    assert onednn_calls == [((10, 12), (20, 12)), ((10, 20), (12, 20))]
    rows, fan_in, fan_out = 10, 12, 20
    for a, r in zip(ours, reference, strict=True):
        # a chain of products each way: forward (fan_in), first backward (fan_out, rows), second backward (fan_in,
        # fan_out, rows); the bound of _bound on each, relative to the largest gradient
        _assert_within(a, r, _bound(2 * (fan_in + fan_out + rows), r.abs().max()))


def test_a_broadcast_gradient_is_made_dense_before_oneDNN_reads_it(onednn_calls):
    x, w, b = _operands((7,))
    xs = [x.clone().requires_grad_() for _ in range(2)]
    ws = [w.clone().requires_grad_() for _ in range(2)]
    # sum() hands its backward an expanded gradient: every stride 0
    onednn_linear(xs[0], ws[0], b).sum().backward()
    F.linear(xs[1], ws[1], b).sum().backward()
    bounds = _linear_bounds(x, w, b, torch.ones(7, 20))
    _assert_within(xs[0].grad, xs[1].grad, bounds[1])
    _assert_within(ws[0].grad, ws[1].grad, bounds[2])
    expanded = torch.ones(3, 1).expand(3, 4)
    assert cpu_linear._strided_dense(expanded).stride() == (4, 1)
    transposed = torch.randn(4, 3).t()
    assert cpu_linear._strided_dense(transposed) is transposed  # column-major is read as is


def test_without_gradients_no_graph_is_recorded(onednn_calls):
    x, w, b = _operands((4,))
    with torch.no_grad():
        out = onednn_linear(x, w.requires_grad_(), b)
    assert out.grad_fn is None and len(onednn_calls) == 1
    _assert_within(out, F.linear(x, w.detach(), b), _linear_bounds(x, w.detach(), b, torch.zeros(4, 20))[0])


def test_small_products_low_precision_and_autocast_stay_with_f_linear(monkeypatch):
    calls = []
    monkeypatch.setattr(cpu_linear, "_matmul", lambda *args: calls.append(args))
    x, w, b = _operands((4,))  # 4 x 12 x 20 = 960 multiply-adds, far below MIN_FLOPS
    assert torch.equal(onednn_linear(x, w, b), F.linear(x, w, b))
    big = torch.randn(64, 256), torch.randn(256, 256)  # 64 x 256 x 256 = 2**22 = MIN_FLOPS
    assert cpu_linear._worth_onednn(*big) and not cpu_linear._worth_onednn(big[0][:16], big[1])  # 16 rows: 1.0M
    monkeypatch.setattr(cpu_linear, "MIN_FLOPS", 0)
    assert onednn_linear(x.double(), w.double(), b.double()).dtype == torch.float64
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert onednn_linear(x, w, b).dtype == torch.bfloat16  # autocast's lower-precision product
    assert calls == []


def test_a_model_switches_its_plain_linear_layers_in_place():
    class Adapter(torch.nn.Linear):
        """A Linear subclass with a forward of its own: left alone."""

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), Adapter(8, 8), torch.nn.Linear(8, 2))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    assert use_onednn_linear(model, "cuda") == 0 and type(model[0]) is torch.nn.Linear  # not a CPU model
    assert use_onednn_linear(model) == 2
    assert [type(m) for m in model] == [OneDNNLinear, torch.nn.ReLU, Adapter, OneDNNLinear]
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    x = torch.randn(3, 4)
    assert torch.equal(model(x), torch.nn.Sequential(*[m for m in model])(x))


def test_the_cache_bound_is_for_processes_about_to_start_and_a_users_setting_wins(monkeypatch):
    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        monkeypatch.delenv(name, raising=False)
    before = dict(os.environ)
    use_onednn_linear(torch.nn.Linear(4, 4))
    assert dict(os.environ) == before  # the running process's environment is never changed (setenv vs threads)
    bound = str(cpu_linear.PRIMITIVE_CACHE_CAPACITY)
    assert cpu_linear.primitive_cache_env() == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": bound, "LRU_CACHE_CAPACITY": bound}
    assert cpu_linear.primitive_cache_env({"LRU_CACHE_CAPACITY": "7"}) == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": bound}


NUM_TOKENS = 8 * 8  # ppo_batch(): 8 samples of 4 prompt and 4 response tokens


def _forward_terms() -> int:
    from tests.workers.actor.conftest import tiny_qwen2

    return tolerances.decoder_reduction_length(tiny_qwen2().config, num_positions=8)


def _assert_same_gradients(reference: torch.nn.Module, module: torch.nn.Module) -> float:
    """Each parameter's gradient within the reordering bound of ``tests.tolerances`` relative to its largest entry;
    returns the bound this puts on the difference of the gradient norms (|norm(a) - norm(b)| <= norm(a - b))."""
    # a gradient goes through the forward chain of reductions, the same chain backward, and a sum over the tokens
    num_terms = 2 * _forward_terms() + NUM_TOKENS
    squared = 0.0
    for (name, p), q in zip(reference.named_parameters(), module.parameters(), strict=True):
        tol = tolerances.reordering_tolerance(p.grad, num_terms)
        assert torch.allclose(q.grad, p.grad, atol=tol, rtol=0), f"{name}: {(q.grad - p.grad).abs().max()} > {tol}"
        squared += p.grad.numel() * tol**2
    return math.sqrt(squared)


def test_an_update_on_onednn_layers_trains_like_one_on_torch_layers(onednn_calls):
    from tests.workers.actor.conftest import actor_config, ppo_batch, tiny_qwen2
    from verl.workers.actor.dp_actor import build_dp_actor

    actors = []
    for switch in (False, True):
        module = tiny_qwen2(seed=0)
        if switch:
            assert use_onednn_linear(module) == 15  # 2 layers x (q, k, v, o, gate, up, down) + lm_head
        actors.append(build_dp_actor(actor_config(), module, total_training_steps=2))
    metrics = [actor.update_policy(ppo_batch()).metrics for actor in actors]
    assert onednn_calls  # the switched actor did run its products on oneDNN
    # the gradients of the step (kept until the next zero_grad) agree to float rounding; the weights after AdamW's
    # first step are not compared: it moves each weight by lr * sign(grad), so a gradient within rounding of zero
    # could move the two copies apart by 2 * lr
    norm_bound = _assert_same_gradients(*(actor.actor_module for actor in actors))
    assert abs(metrics[0]["actor/grad_norm"] - metrics[1]["actor/grad_norm"]) <= norm_bound
    # pg_loss averages per-token terms advantage (+-1) x ratio (exp(log p - 0) <= 1), each within the forward
    # chain's bound relative to the log-probs (about log(32) = 3.5 on this near-uniform model: 4)
    loss_tol = tolerances.reordering_tolerance(torch.tensor(4.0), _forward_terms() + NUM_TOKENS)
    assert abs(metrics[0]["actor/pg_loss"] - metrics[1]["actor/pg_loss"]) <= loss_tol


def test_activation_checkpointing_recomputes_the_onednn_forward(onednn_calls):
    from tests.workers.actor.conftest import actor_config, ppo_batch, tiny_qwen2
    from verl.workers.actor.dp_actor import build_dp_actor
    from verl.workers.dp_workers import enable_gradient_checkpointing

    actors = []
    for checkpointing in (False, True):
        module = tiny_qwen2(seed=0)
        use_onednn_linear(module)
        if checkpointing:
            enable_gradient_checkpointing(module)
        actors.append(build_dp_actor(actor_config(), module, total_training_steps=2))
    calls_before = len(onednn_calls)
    actors[0].update_policy(ppo_batch())
    plain_calls = len(onednn_calls) - calls_before
    actors[1].update_policy(ppo_batch())
    # checkpointing re-runs each decoder layer's forward (7 products per layer) in the backward pass
    assert len(onednn_calls) - calls_before - plain_calls > plain_calls
    _assert_same_gradients(actors[0].actor_module, actors[1].actor_module)


def test_a_compiled_forward_runs_f_linear_which_inductor_can_lower(onednn_calls):
    # actor.use_torch_compile with use_onednn_linear: inductor cannot lower oneDNN's op (it failed the whole run), so
    # the traced forward takes F.linear; eager calls outside the compiled region still go through oneDNN
    layer = torch.nn.Linear(12, 20)
    assert use_onednn_linear(layer) == 1
    x = torch.randn(6, 12, requires_grad=True)
    compiled = torch.compile(layer, backend="eager", dynamic=True)
    out = compiled(x)
    out.sum().backward()
    assert onednn_calls == []
    torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias))
    layer(x)
    assert onednn_calls == [((6, 12), (20, 12))]
