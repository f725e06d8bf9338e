"""verl's activation offload (verl.utils.activation_offload): which saved tensors move to CPU memory, and that the
backward pass reads back what the forward pass saved.

This machine has no GPU: tensors on the ``meta`` device stand in for device tensors where only the decision is
tested (no data is read), and the CPU run checks the pack/unpack round trip."""

import torch

from verl.utils.activation_offload import ActivationOffload, stays_in_place


def test_activations_move_and_weights_stay():
    weight = torch.nn.Parameter(torch.empty(4, 3, device="meta"))
    activation = torch.empty(2, 4, device="meta")
    # a linear layer saves its weight as a view (weight.t()): still the weight, which FSDP2 gathers again itself
    assert stays_in_place(weight) and stays_in_place(weight.t())
    assert not stays_in_place(activation) and not stays_in_place(activation[:, :2])
    # already in CPU memory: nothing to move
    assert stays_in_place(torch.zeros(2))


def test_the_hooks_pack_what_autograd_saves_and_the_backward_reads_it_back():
    # on CPU every tensor stays in place (no copy): the gradients are the plain backward's, bit for bit, and the pack
    # function saw the linear layers' inputs and weights
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    x = torch.randn(5, 3)
    layer(x).square().sum().backward()
    want = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    offload = ActivationOffload("cpu")
    packed = []
    pack = offload.pack_hook
    offload.pack_hook = lambda tensor: packed.append(tensor.shape) or pack(tensor)
    with offload:
        loss = layer(x).square().sum()
    loss.backward()  # after the context: each saved tensor carries its own unpack
    assert all(torch.equal(p.grad, g) for p, g in zip(layer.parameters(), want, strict=True))
    # the input x (5, 3), and the second layer's weight as the view weight.t() (4, 2): it needs the input's gradient
    assert torch.Size([5, 3]) in packed and torch.Size([4, 2]) in packed
