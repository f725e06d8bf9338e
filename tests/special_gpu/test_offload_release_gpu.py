"""The GPU memory an offload frees is given back to the driver, by the production code path alone.

FSDP2 actor and critic workers (``optimizer_offload`` on both) are built in this process, as the trainer's workers
build them, and run a PPO step's passes; this test never empties the cache itself. Checked on CUDA:

1. after each pass of an offloading role, ``torch.cuda.memory_reserved()`` is what is allocated plus the free parts
   of segments that still hold live tensors (what ``empty_cache`` cannot return): no whole free segment is kept, and
   the waste left is well under the Adam moments the update moved to host memory;
2. generation, actor update and critic update alternating twice peak (``torch.cuda.max_memory_reserved``) no higher
   than the largest of the three run alone, plus :data:`ALTERNATION_SLACK`.

The CPU variant runs the same passes on the tiny model (the release is a no-op there), so that a mistake in the
check's own set-up shows before device time is spent on it.
"""

import shutil

import pytest
import torch
import torch.distributed as dist
import transformers

from tests.special_gpu.checks import NEEDS_CUDA
from tests.workers.built import built_worker
from verl.models.loading import resolve_model_path
from verl.protocol import DataProto
from verl.workers.config import compose_ppo_config
from verl.workers.fsdp_workers import FSDPActorRolloutRefWorker, FSDPCriticWorker

DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=[pytest.mark.gpu, NEEDS_CUDA])]
MIB = 2**20
# segments kept by empty_cache are exactly those holding a live block: reserved = allocated + their free parts; a
# whole free segment left behind is a missed release (the smallest segment is 2 MiB)
RELEASE_TOLERANCE = 2 * MIB
# the same passes on the same shapes allocate the same blocks; the slack absorbs a different split of the segments
ALTERNATION_SLACK = 64 * MIB


def write_model(directory, wide: bool) -> str:
    """A Qwen2 of 2 layers with the tiny model's vocabulary and tokenizer. Wide (CUDA): hidden 2048, 84M parameters
    (336 MB in fp32, 671 MB of Adam moments), every weight matrix 16 MiB or more (segments of its own, little
    fragmentation); else hidden 64, for the CPU variant."""
    tiny = resolve_model_path("default")
    config = transformers.Qwen2Config(
        vocab_size=50,  # the tiny model's (its tokenizer's ids, bos 1, eos 2, pad 0)
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        hidden_size=2048 if wide else 64,
        intermediate_size=4096 if wide else 128,
        num_hidden_layers=2,
        num_attention_heads=16 if wide else 4,
        num_key_value_heads=16 if wide else 4,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(config).float().save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(f"{tiny}/{name}", directory / name)
    return str(directory)


class AnyName(frozenset):
    """Every name counts as one of ``ray.init``'s parameters."""

    def __contains__(self, name) -> bool:
        return True


def compose_without_ray(overrides: list[str]):
    """``compose_ppo_config(overrides)``, also on the GPU image, which has no Ray: the ``ray_kwargs`` section's check
    imports Ray to read ``ray.init``'s parameters, and there is no ``ray.init`` to start here anyway."""
    from verl.workers.config import ray_kwargs

    try:
        import ray  # noqa: F401
    except ImportError:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(ray_kwargs, "ray_init_parameters", AnyName)
            return compose_ppo_config(overrides)
    return compose_ppo_config(overrides)


@pytest.fixture(scope="module")
def workers(request, tmp_path_factory):
    """(actor, critic) FSDP2 workers of one rank with optimizer_offload, fp32, 16 prompts x 4 responses of 8 tokens
    (ignore_eos: every generation has the same shapes); the process group ends with the module."""
    device = request.param
    path = write_model(tmp_path_factory.mktemp("model"), wide=device == "cuda")
    assert not dist.is_initialized(), "another module left a process group"
    config = compose_without_ray(
        [
            "actor_rollout_ref.actor.strategy=fsdp",
            "algorithm.adv_estimator=gae",
            f"actor_rollout_ref.model.path={path}",
            f"critic.model.path={path}",
            f"trainer.device={device}",
            "actor_rollout_ref.actor.dtype=float32",
            "critic.dtype=float32",
            "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
            "critic.model.fsdp_config.optimizer_offload=true",
            "actor_rollout_ref.rollout.ignore_eos=true",
            # a model of its own takes verl's sizes, not the embedded model's: those of the embedded model again
            "data.train_batch_size=16",
            "data.max_prompt_length=8",
            "data.max_response_length=8",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=16",
            "critic.ppo_mini_batch_size=16",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
            "critic.ppo_micro_batch_size_per_gpu=16",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
            "critic.forward_micro_batch_size_per_gpu=16",
        ]
    )
    built = [built_worker(cls, config, 4) for cls in (FSDPActorRolloutRefWorker, FSDPCriticWorker)]
    for worker in built:
        worker.init_model()  # the first joins the process group (NCCL + gloo on CUDA)
    yield device, *built
    if dist.is_initialized():
        dist.destroy_process_group()


def prompts(num_prompts: int = 16, width: int = 8) -> DataProto:
    """train_batch_size left-padded prompts of the tiny vocabulary (ids 3..49; 0 pads); n=4 responses each make
    one mini-batch (64 samples) of the actor and of the critic."""
    ids = torch.arange(num_prompts * width).reshape(num_prompts, width) % 47 + 3
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(tensors={"input_ids": ids * mask, "attention_mask": mask, "position_ids": position_ids})


def training_batch(actor, critic) -> DataProto:
    """One generation with its old log-probs and values, advantages +1/-1 by row and returns values + advantages."""
    batch = actor.generate_sequences(prompts())
    assert batch.batch["responses"].shape == (16 * 4, 8)  # 16 prompts x n=4, all of response_length (ignore_eos)
    batch.batch["old_log_probs"] = actor.compute_log_prob(batch).batch["old_log_probs"]
    values = critic.compute_values(batch).batch["values"]
    sign = torch.where(torch.arange(len(batch))[:, None] % 2 == 0, 1.0, -1.0)
    batch.batch["advantages"] = sign * batch.batch["response_mask"]
    batch.batch["values"], batch.batch["returns"] = values, values + batch.batch["advantages"]
    return batch


def passes(actor, critic, batch) -> dict:
    """The three passes the test alternates, each a registered worker call as the trainer makes it."""
    return {
        "gen": lambda: actor.generate_sequences(prompts()),
        "update_actor": lambda: actor.update_actor(batch),
        "update_critic": lambda: critic.update_critic(batch),
    }


def kept_beyond_live_segments() -> int:
    """Reserved bytes beyond the allocated ones and the free parts of segments that hold live blocks: the whole free
    segments the caching allocator keeps (0 right after a release)."""
    stats = torch.cuda.memory_stats()
    live = stats["allocated_bytes.all.current"] + stats["inactive_split_bytes.all.current"]
    return stats["reserved_bytes.all.current"] - live


def moment_bytes(worker_model: torch.nn.Module) -> int:
    """Bytes of AdamW's two fp32 moments of a model's parameters (one rank: the shards are the whole tensors)."""
    return 2 * 4 * sum(p.numel() for p in worker_model.parameters() if p.requires_grad)


@pytest.mark.parametrize("workers", DEVICES, indirect=True)
def test_each_offload_pass_gives_back_what_it_freed(workers, figure):
    device, actor, critic = workers
    batch = training_batch(actor, critic)
    for name, run in passes(actor, critic, batch).items():
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        result = run()
        if name.startswith("update"):
            assert result.metrics[f"{name.split('_')[1]}/update_failed"] == 0.0  # fp32: the step ran, moments moved
        if device != "cuda":
            continue
        reserved, allocated = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
        figure(f"{name}_peak_reserved_MiB", torch.cuda.max_memory_reserved() / MIB)
        figure(f"{name}_reserved_after_MiB", reserved / MIB)
        figure(f"{name}_fragmentation_MiB", (reserved - allocated) / MIB)
        assert kept_beyond_live_segments() <= RELEASE_TOLERANCE, name
    if device == "cuda":
        # after the actor's update its moments (2 x 336 MB) left the device and were returned: what stays reserved
        # beyond the allocated bytes is fragmentation, well under them (without the release it is at least them)
        moments = moment_bytes(actor.actor.model_module())
        assert moments > 600 * MIB
        assert torch.cuda.memory_reserved() - torch.cuda.memory_allocated() < moments / 2


@pytest.mark.parametrize("workers", DEVICES, indirect=True)
def test_alternating_passes_peak_no_higher_than_the_largest_alone(workers, figure):
    device, actor, critic = workers
    batch = training_batch(actor, critic)
    runs = passes(actor, critic, batch)
    for run in runs.values():
        run()  # warm-up: the optimizer state exists, the lazy workspaces are allocated
    alone = {}
    for name, run in runs.items():
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()  # the peak restarts from what is reserved now (released)
        run()
        alone[name] = torch.cuda.max_memory_reserved() if device == "cuda" else 0
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for _ in range(2):
        for run in runs.values():
            run()
    if device != "cuda":
        return
    alternating = torch.cuda.max_memory_reserved()
    largest = max(alone.values())
    figure("largest_pass_peak_reserved_MiB", largest / MIB)
    figure("alternating_peak_reserved_MiB", alternating / MIB)
    # both models' weights and the actor's gradients stay on the device: the largest pass holds more than one model
    assert largest > 336 * MIB
    assert alternating <= largest + ALTERNATION_SLACK
