"""FSDP2 optimizer offload on CUDA: state moved with ``non_blocking=True``, then read, saved and loaded at once.

With ``fsdp_config.optimizer_offload`` the AdamW moments live in CPU memory between steps: the sharded optimizer
moves them to the GPU for the step and back with ``non_blocking=True``. A copy from the GPU into (pinned) host
memory that is not waited for is not there yet when the host reads it, so the state must be whole as soon as the
update returns, before a save reads it, and after a load put it back. Checked on one GPU (one NCCL + gloo group):
the moments read the instant the update returns equal those read after a device synchronisation; a checkpoint
written right after the update and loaded into a fresh actor restores weights, moments, step counts, loss scale and
handler bit for bit, and both actors then take the same next update; the GPU memory the offload frees is the
moments' size. The CPU variant (gloo, where the state is in CPU memory anyway) runs the save/load half.
"""

import datetime
import gc
import socket

import pytest
import torch
import torch.distributed as dist
import transformers

from tests.special_gpu.checks import NEEDS_CUDA, assert_bitwise_equal, torch_optimizer, training_state
from tests.workers.actor.conftest import actor_config, ppo_batch
from verl.utils.fsdp_utils import device_mesh
from verl.workers.actor.fsdp_actor import build_fsdp_actor

DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=[pytest.mark.gpu, NEEDS_CUDA])]
VOCAB = 32  # ppo_batch's token ids


@pytest.fixture
def process_group(device):
    """A world of one rank: gloo on CPU; on CUDA one group for both kinds of tensor, as the FSDP2 workers join."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group(
        "cpu:gloo,cuda:nccl" if device == "cuda" else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=120),
    )
    yield
    dist.destroy_process_group()


def model(device: str, seed: int = 0) -> torch.nn.Module:
    """A Qwen2 of 4 layers; on CUDA wide enough (17M parameters, 136 MB of moments) that a copy takes a while."""
    wide = device == "cuda"
    config = transformers.Qwen2Config(
        vocab_size=8192 if wide else VOCAB,
        hidden_size=512 if wide else 32,
        intermediate_size=1536 if wide else 64,
        num_hidden_layers=4 if wide else 2,
        num_attention_heads=8 if wide else 4,
        num_key_value_heads=4 if wide else 2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return transformers.Qwen2ForCausalLM(config).float()


def fsdp_actor(device: str, seed: int = 0, optimizer_offload: bool = True):
    config = actor_config(
        strategy="fsdp2",
        dtype="float16",
        optim={"lr": 1e-3, "initial_loss_scale": 1024.0},
        fsdp_config={"optimizer_offload": optimizer_offload},
    )
    return build_fsdp_actor(config, model(device, seed), mesh=device_mesh(device), total_training_steps=10)


def moments(actor) -> dict[str, torch.Tensor]:
    """Copies of every optimizer state tensor as it is in memory now (no device synchronisation on the way)."""
    state = torch_optimizer(actor.optimizer).state
    copies = {}
    for i, entries in enumerate(state.values()):
        for key, value in entries.items():
            local = value.to_local() if hasattr(value, "to_local") else value
            copies[f"{i}.{key}"] = local.clone()
    return copies


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


@pytest.mark.parametrize("device", DEVICES)
def test_offloaded_state_is_whole_when_the_update_returns_and_survives_a_save_at_once(
    device, process_group, tmp_path, figure
):
    actor = fsdp_actor(device)
    batch = ppo_batch().to(device)
    assert actor.update_policy(batch).metrics["actor/update_failed"] == 0.0
    early = moments(actor)  # read the instant the update returned
    assert early and {t.device.type for t in early.values()} == {"cpu"}
    actor.save_checkpoint(tmp_path / "ckpt")  # right away, as a checkpoint after the step's update
    synchronize(device)
    late = moments(actor)
    assert_bitwise_equal(early, late)
    figure("offloaded_state_MiB", sum(t.numel() * t.element_size() for t in late.values()) / 2**20)

    restored = fsdp_actor(device, seed=5)
    restored.load_checkpoint(tmp_path / "ckpt")
    loaded = moments(restored)  # the load moved the state back to CPU memory: read it at once too
    assert_bitwise_equal(late, loaded)
    synchronize(device)
    want = training_state(actor.model_module(), actor.optimizer)
    assert_bitwise_equal(want, training_state(restored.model_module(), restored.optimizer))
    assert restored.optimizer.get_loss_scale() == actor.optimizer.get_loss_scale() == 1024.0
    assert restored.update_outcome_handler.state_dict() == actor.update_outcome_handler.state_dict()
    # the next update is the same on both (up to the summation order of CUDA kernels): the moments the step moved
    # to the GPU were the saved ones; lost moments would move the weights by ~lr = 1e-3 instead
    assert actor.update_policy(batch).metrics["actor/update_failed"] == 0.0
    assert restored.update_policy(batch).metrics["actor/update_failed"] == 0.0
    synchronize(device)
    got = training_state(restored.model_module(), restored.optimizer)
    want = training_state(actor.model_module(), actor.optimizer)
    assert got.keys() == want.keys()
    difference = figure("next_update_max_abs_diff", max(float((got[k] - want[k]).abs().max()) for k in want))
    assert difference <= 1e-5


@pytest.mark.gpu
@NEEDS_CUDA
@pytest.mark.parametrize("device", ["cuda"])
def test_the_offload_frees_the_gpu_memory_of_the_moments(device, process_group, figure):
    batch = ppo_batch().to(device)

    def allocated_after_an_update(optimizer_offload: bool) -> tuple[int, int]:
        gc.collect()
        torch.cuda.empty_cache()
        start = torch.cuda.memory_allocated()
        actor = fsdp_actor(device, optimizer_offload=optimizer_offload)
        assert actor.update_policy(batch).metrics["actor/update_failed"] == 0.0
        torch.cuda.synchronize()
        used = torch.cuda.memory_allocated() - start
        state_bytes = sum(t.numel() * t.element_size() for t in moments(actor).values() if t.dim() > 0)
        del actor
        return used, state_bytes

    kept, state_bytes = allocated_after_an_update(False)
    offloaded, _ = allocated_after_an_update(True)
    freed = figure("offload_freed_MiB", (kept - offloaded) / 2**20)
    figure("moments_MiB", state_bytes / 2**20)
    # two fp32 moments of 17M parameters: 136 MiB; what stays on the GPU with them is the same for both actors
    assert state_bytes > 100 * 2**20
    assert abs(freed * 2**20 - state_bytes) <= 0.05 * state_bytes
