"""oneDNN linear layers on CPU: the same values and gradients as F.linear, used only where they should be."""

import os

import pytest
import torch
import torch.nn.functional as F

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


def _value_and_grads(fn, x, w, b, grad):
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    b = None if b is None else b.clone().requires_grad_()
    out = fn(x, w, b)
    out.backward(grad)
    return [out.detach(), x.grad, w.grad] + ([] if b is None else [b.grad])


@pytest.mark.parametrize("batch_shape", [(6,), (2, 5)], ids=["2d", "3d"])
@pytest.mark.parametrize("bias", [True, False])
def test_values_and_gradients_are_those_of_f_linear(onednn_calls, batch_shape, bias):
    x, w, b = _operands(batch_shape, bias=bias)
    grad = torch.randn(*batch_shape, 20, generator=torch.Generator().manual_seed(1))
    ours = _value_and_grads(onednn_linear, x, w, b, grad)
    reference = _value_and_grads(F.linear, x, w, b, grad)
    rows = x.numel() // 12
    # forward, then the input gradient (grad @ W) and the weight gradient (grad.T @ x): three oneDNN products
    assert onednn_calls == [((rows, 12), (20, 12)), ((rows, 20), (12, 20)), ((20, rows), (12, rows))]
    for a, r in zip(ours, reference, strict=True):
        assert a.shape == r.shape
        # fp32 sums of at most 20 products of unit-scale numbers: only the summation order differs (~1e-6)
        assert torch.allclose(a, r, atol=1e-5, rtol=1e-5)
    assert ours[2].is_contiguous()  # the weight gradient is laid out like the weight: no copy when accumulated


def test_a_broadcast_gradient_is_made_dense_before_oneDNN_reads_it(onednn_calls):
    x, w, b = _operands((7,))
    xs = [x.clone().requires_grad_() for _ in range(2)]
    ws = [w.clone().requires_grad_() for _ in range(2)]
    # sum() hands its backward an expanded gradient: every stride 0
    onednn_linear(xs[0], ws[0], b).sum().backward()
    F.linear(xs[1], ws[1], b).sum().backward()
    assert torch.allclose(xs[0].grad, xs[1].grad, atol=1e-5) and torch.allclose(ws[0].grad, ws[1].grad, atol=1e-5)
    expanded = torch.ones(3, 1).expand(3, 4)
    assert cpu_linear._strided_dense(expanded).stride() == (4, 1)
    transposed = torch.randn(4, 3).t()
    assert cpu_linear._strided_dense(transposed) is transposed  # column-major is read as is


def test_without_gradients_no_graph_is_recorded(onednn_calls):
    x, w, b = _operands((4,))
    with torch.no_grad():
        out = onednn_linear(x, w.requires_grad_(), b)
    assert out.grad_fn is None and len(onednn_calls) == 1
    assert torch.allclose(out, F.linear(x, w.detach(), b), atol=1e-5)


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


def test_an_update_on_onednn_layers_trains_like_one_on_torch_layers(onednn_calls):
    from tests.workers.actor.conftest import actor_config, ppo_batch, tiny_qwen2
    from verl.workers.actor.dp_actor import build_dp_actor

    actors = []
    for switch in (False, True):
        module = tiny_qwen2(seed=0)
        if switch:
            assert use_onednn_linear(module) == 15  # 2 layers x (q, k, v, o, gate, up, down) + lm_head
        actors.append(build_dp_actor(actor_config(), module, total_training_steps=2))
    metrics = [actor.update_policy(ppo_batch()) for actor in actors]
    assert onednn_calls  # the switched actor did run its products on oneDNN
    assert metrics[0]["actor/pg_loss"] == pytest.approx(metrics[1]["actor/pg_loss"], abs=1e-5)
    assert metrics[0]["actor/grad_norm"] == pytest.approx(metrics[1]["actor/grad_norm"], rel=1e-4)
    for (name, p), q in zip(actors[0].actor_module.named_parameters(), actors[1].actor_module.parameters()):
        # the gradients of the step (kept until the next zero_grad) agree to float rounding; the weights after
        # AdamW's first step are not compared: it moves each weight by lr * sign(grad), so a gradient within
        # rounding of zero could move the two copies apart by 2 * lr
        assert torch.allclose(p.grad, q.grad, atol=1e-5, rtol=1e-4), name


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
    for (name, p), q in zip(actors[0].actor_module.named_parameters(), actors[1].actor_module.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-5, rtol=1e-4), name
