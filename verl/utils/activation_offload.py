"""verl's activation offload (``model.enable_activation_offload``): what a training forward pass saves for its backward
pass is kept in CPU memory instead of device memory, and copied back when the backward pass reads it.

The tool is PyTorch's own :class:`torch.autograd.graph.save_on_cpu` (saved-tensor hooks: each tensor autograd saves
goes through a pack function during the forward pass and an unpack function in the backward pass), with one change:
the weights stay where they are. A linear layer saves its weight (a view of the parameter) besides its input, and
under FSDP2 that weight is the gathered (unsharded) parameter, which FSDP2 frees after the layer's forward and gathers
again for its backward; copying it to CPU memory would hold a second copy of every layer's full weights there. So a
saved tensor that is a parameter or a view of one, and one already in CPU memory, is kept as it is; the rest (the
activations) goes to pinned CPU memory on CUDA and comes back with a non-blocking copy.

On a CPU run every activation is in CPU memory already: nothing moves, and the hooks only look at each saved tensor.
"""

from __future__ import annotations

import torch

__all__ = ["ActivationOffload", "stays_in_place"]


def stays_in_place(tensor: torch.Tensor) -> bool:
    """Whether a tensor saved for the backward pass is kept where it is: a parameter or a view of one (a weight,
    gathered or not), or a tensor already in CPU memory."""
    base = tensor if tensor._base is None else tensor._base
    return isinstance(base, torch.nn.Parameter) or tensor.device.type == "cpu"


class ActivationOffload(torch.autograd.graph.save_on_cpu):
    """:class:`torch.autograd.graph.save_on_cpu` that leaves the weights in place (see the module docstring).

    Enter it around a training forward pass; the backward pass may run after it exits (each saved tensor carries its
    own unpack function).

    Args:
        device_type: the device the forward pass computes on (``"cuda"``: pinned host memory and asynchronous
            copies; ``"cpu"``: nothing to move).
    """

    def __init__(self, device_type: str):
        pin_memory = device_type == "cuda" and torch.cuda.is_available()
        super().__init__(pin_memory=pin_memory, device_type=device_type)
        offload, restore = self.pack_hook, self.unpack_hook

        def pack(tensor: torch.Tensor):
            if stays_in_place(tensor):
                return None, tensor
            return offload(tensor)

        def unpack(packed) -> torch.Tensor:
            device, tensor = packed
            return tensor if device is None else restore(packed)

        self.pack_hook, self.unpack_hook = pack, unpack
