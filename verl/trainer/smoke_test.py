"""A CPU smoke test of any run: ``--smoke-test`` on the trainer's command line (``python -m verl.trainer.main_ppo``,
and verl's async entry points, which share it) shrinks the run to one step that a 2-core CPU trains in seconds.

:func:`smoke_test_overrides` is what the flag does to the ``key=value`` overrides: it removes the command line's own
settings of the keys it sets and appends its own, so that they win over the script's values wherever the flag
stands. Everything else is the script's own: its algorithm, backend, rollout engine, reward, KL and entropy
settings, dynamic batch sizes, LoRA. What it sets:

- the step (:data:`SMOKE_TEST_OVERRIDES`): 8 prompts, prompts of at most 64 tokens, responses of at most 8, every
  mini- and micro-batch size 8 (which divides that), one training step, no validation, no checkpoint and no resume
  of an older run, the console and JSONL loggers only (verl's scripts log to W&B), no progress bar, no plot, vLLM's
  KV cache at 2% of the memory; a fully async script (one that sets ``rollout.total_rollout_steps``, which counts
  its run in prompts) gets one step's worth, 8 prompts;
- the hardware: CPU processes (``trainer.device=cpu``), one node of one rank (also for a rollout group of its own),
  every model-parallel size the command line sets at one rank (:data:`ONE_RANK_SIZES`), Ray with 2 CPUs;
- the model: a model path that is not a directory on this machine (a Hub name such as ``Qwen/Qwen3-8B``, or a path
  of another machine) becomes the embedded tiny model, read with :data:`TINY_MODEL_OVERRIDES` (two attention heads of
  32 instead of four of 16, which vLLM's CPU attention takes, and a context long enough for any prompt and
  response); a LoRA rank beyond its narrowest layer is cut to :data:`MAX_LORA_RANK`, and a LoRA adapter or tokenizer
  of the original model is dropped. Nothing is downloaded.

The data is the command line's: point ``data.train_files`` and ``data.val_files`` at files whose prompts fit 64
tokens, e.g. the embedded task in verl's layout (``python -m verl.utils.dataset.make_tiny_data --out DIR``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "LORA_RANK_KEYS",
    "MAX_LORA_RANK",
    "MODEL_PATH_KEYS",
    "ONE_NODE",
    "ONE_RANK_SIZES",
    "SMOKE_TEST_OVERRIDES",
    "TINY_MODEL_OVERRIDES",
    "smoke_test_overrides",
]

# One small step on the CPU, appended after the command line's own overrides.
SMOKE_TEST_OVERRIDES = (
    "data.train_batch_size=8",
    "data.val_batch_size=null",
    "data.max_prompt_length=64",
    "data.max_response_length=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.02",
    "critic.ppo_mini_batch_size=8",
    "critic.ppo_micro_batch_size_per_gpu=8",
    "reward_model.micro_batch_size_per_gpu=8",
    "trainer.total_training_steps=1",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.save_freq=-1",
    "trainer.resume_mode=disable",
    "trainer.logger=[console,jsonl]",
    "trainer.progress_bar=false",
    "trainer.plot=false",
    "trainer.device=cpu",
    "ray_init.num_cpus=2",
)
# verl's fully async trainer counts its run in prompts: one step's worth (one local update of 8 prompts). Set only
# where the command line sets the key: the other trainers must leave it unset.
_ASYNC_RUN_KEY, _ASYNC_RUN_PROMPTS = "rollout.total_rollout_steps", 8
# One node of one rank: the trainer's, always; a rollout group of its own (verl's async trainers), where it is set.
ONE_NODE = {"trainer.nnodes": "1", "trainer.n_gpus_per_node": "1"}
_ROLLOUT_GROUP = {"rollout.nnodes": "1", "rollout.n_gpus_per_node": "1"}
# The model-parallel sizes (the last part of the key, in any section) at one rank.
ONE_RANK_SIZES = {
    "tensor_model_parallel_size": "1",
    "pipeline_model_parallel_size": "1",
    "virtual_pipeline_model_parallel_size": "null",
    "expert_model_parallel_size": "1",
    "expert_tensor_parallel_size": "1",
    "context_parallel_size": "1",
    "ulysses_sequence_parallel_size": "1",
    "data_parallel_size": "1",
    "expert_parallel_size": "1",
    "moe_tensor_parallel_size": "1",
    "fsdp_size": "-1",  # -1: every rank (verl's default)
    "ulysses_parallel_size": "1",
    "fully_shard_parallel_size": "1",
}
# The keys naming a model directory -> the key of that model's override_config (None: the section has none).
MODEL_PATH_KEYS = {
    "actor_rollout_ref.model.path": "actor_rollout_ref.model.override_config",
    "critic.model.path": "critic.model.override_config",
    "reward_model.model.path": None,
    "reward.reward_model.model_path": None,  # verl's current reward section
}
# The embedded tiny model as the smoke test reads it: its 64 hidden units as 2 attention heads of 32 (1 key-value
# head) instead of 4 of 16, the head size vLLM's CPU attention takes (every projection keeps its shape, so the weights
# load as they are), and a context that holds any script's prompt + response.
TINY_MODEL_OVERRIDES = {"num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 65536}
# The largest LoRA rank the tiny model's narrowest projection (k_proj, 64 -> 32) takes; verl's dp/fsdp and megatron
# keys of the rank.
MAX_LORA_RANK = 32
LORA_RANK_KEYS = ("actor_rollout_ref.model.lora_rank", "actor_rollout_ref.model.lora.rank")
# What belongs to the model the tiny one replaces: dropped with it.
_OF_THE_MODEL = ("actor_rollout_ref.model.lora_adapter_path", "actor_rollout_ref.model.tokenizer_path")


def _key(override: str) -> str:
    return override.partition("=")[0].lstrip("+~")


def _usable(path: str) -> bool:
    """A model path the smoke test keeps: the embedded model's names, or a directory on this machine."""
    value = path.strip().strip("'\"")
    return value in ("", "default", "null", "None") or Path(value).expanduser().is_dir()


def smoke_test_overrides(overrides: Sequence[str]) -> tuple[str, ...]:
    """``overrides`` (a command line's ``key=value`` list) shrunk to a CPU smoke test (see the module).

    The command line's settings of the keys the smoke test sets are removed and the smoke test's appended, so they
    win; a model path that is not a directory here becomes the embedded tiny model. Returns a new tuple.
    """
    small = [*SMOKE_TEST_OVERRIDES, *(f"{key}={value}" for key, value in ONE_NODE.items())]
    keys = [_key(override) for override in overrides]
    small += [f"{key}={value}" for key, value in _ROLLOUT_GROUP.items() if key in keys]
    small += [
        f"{key}={ONE_RANK_SIZES[key.rsplit('.', 1)[-1]]}" for key in keys if key.rsplit(".", 1)[-1] in ONE_RANK_SIZES
    ]
    if _ASYNC_RUN_KEY in keys:
        small.append(f"{_ASYNC_RUN_KEY}={_ASYNC_RUN_PROMPTS}")
    small += _tiny_model(overrides)
    ours = {_key(override) for override in small}
    return tuple(override for override in overrides if _key(override) not in ours) + tuple(dict.fromkeys(small))


def _tiny_model(overrides: Sequence[str]) -> list[str]:
    """The overrides that put the embedded tiny model in place of each model path that is not a directory here."""
    from verl.models.loading import DEFAULT_MODEL_PATH

    swapped = []
    for override in overrides:
        key, eq, value = override.partition("=")
        key = key.lstrip("+~")
        if not eq or key not in MODEL_PATH_KEYS or _usable(value):
            continue
        # an absolute path, not "default": the embedded layer (the default run's own settings) stays out of it
        swapped.append(f"{key}={DEFAULT_MODEL_PATH}")
        if MODEL_PATH_KEYS[key] is not None:
            swapped += [f"{MODEL_PATH_KEYS[key]}.{name}={number}" for name, number in TINY_MODEL_OVERRIDES.items()]
        if key == "actor_rollout_ref.model.path":
            given = {_key(given) for given in overrides}
            swapped += [f"{other}=null" for other in _OF_THE_MODEL if other in given]
            for rank in overrides:
                rank_key, _, rank_value = rank.partition("=")
                if rank_key.lstrip("+~") in LORA_RANK_KEYS and rank_value.isdigit():
                    swapped.append(f"{rank_key.lstrip('+~')}={min(int(rank_value), MAX_LORA_RANK)}")
    return swapped
