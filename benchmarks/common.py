"""Shared pieces of the benchmarks: the machine description, a tiny model and batch, timers, memory probes, output.

The benchmarks are scripts, not tests: they print a table and write ``benchmarks/results/<name>.json``, and they
assert nothing about speed. Everything here is small on purpose so that each benchmark fits in a few minutes on a
2-core CPU; on a CUDA machine the same code measures the GPU (peak memory from ``torch.cuda``). The tiny model,
config and batch follow the ideas of the actor tests' fixtures, rewritten here because benchmarks never import
from ``tests/``.
"""

from __future__ import annotations

import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parent.parent

# Sizes of the tiny Qwen2 model the update benchmarks train. fp16 matmuls on CPU are ~100x slower than fp32, so the
# model stays small enough for an fp16 update to take tens of milliseconds.
TINY_MODEL = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


# ---------------------------------------------------------------------------------------------- machine


def cpu_model_name() -> str:
    """The CPU model as ``lscpu`` names it (falls back to ``platform.processor()``)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    match = re.search(r"^Model name:\s*(.+)$", out, flags=re.MULTILINE)
    return match.group(1).strip() if match else (platform.processor() or "unknown")


def machine_info() -> dict[str, Any]:
    """What the figures were measured on: CPU, core count, accelerator, library versions."""
    info = {
        "cpu_model": cpu_model_name(),
        "num_cpu_cores": os.cpu_count(),
        "torch_num_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        # Other processes on a shared machine show up here; figures taken under load are noisier.
        "load_average_1_5_15m": [round(x, 2) for x in os.getloadavg()],
    }
    if torch.cuda.is_available():
        info["gpu_model"] = torch.cuda.get_device_name(0)
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover - transformers is a dependency
        pass
    return info


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


# ---------------------------------------------------------------------------------------------- model and data


def tiny_hf_config(**overrides):
    """A Qwen2 config with the :data:`TINY_MODEL` sizes (tied embeddings, eager attention)."""
    from transformers import Qwen2Config

    sizes = {**TINY_MODEL, **overrides}
    return Qwen2Config(
        **sizes,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        attn_implementation="eager",
    )


def tiny_qwen2(seed: int = 0, **overrides) -> torch.nn.Module:
    """A randomly initialised tiny Qwen2ForCausalLM in fp32 (fp32 master weights; fp16 comes from autocast)."""
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    return Qwen2ForCausalLM(tiny_hf_config(**overrides)).float()


def num_parameters(module: torch.nn.Module) -> int:
    """Distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())


def actor_config(strategy: str = "dp", dtype: str = "float32", **overrides):
    """The YAML's ``actor_rollout_ref.actor`` section with the benchmark's sizes (validated, typed).

    The loss scale starts at 2**10 rather than megatron-core's 2**32, so that the timed updates are the steady
    state of a healthy run, not the scaler's first skipped steps.
    """
    from omegaconf import OmegaConf

    from verl.workers.config import ActorConfig, load_section

    base = {
        "strategy": strategy,
        "dtype": dtype,
        "ppo_mini_batch_size": 8,
        "ppo_micro_batch_size_per_gpu": 8,
        "optim": {"lr": 1e-4, "initial_loss_scale": 1024.0},
    }
    merged = OmegaConf.merge(OmegaConf.create(base), OmegaConf.create(overrides))
    return load_section(ActorConfig, OmegaConf.to_container(merged))


def ppo_batch(num_samples: int, prompt_length: int, response_length: int, vocab_size: int, seed: int = 0):
    """A fixed PPO batch in the rollout layout: left-padded prompts, right-padded responses, +-1 advantages.

    Returns:
        DataProto with ``input_ids``/``attention_mask``/``position_ids`` (B, P+R), ``responses``/``response_mask``/
        ``advantages``/``old_log_probs`` (B, R).
    """
    from verl.protocol import DataProto

    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, vocab_size, (num_samples, prompt_length), generator=gen)
    responses = torch.randint(3, vocab_size, (num_samples, response_length), generator=gen)
    attention_mask = torch.ones(num_samples, prompt_length + response_length, dtype=torch.long)
    # Some realistic padding: a few left-padded prompts and responses that stopped early.
    for row in range(0, num_samples, 4):
        attention_mask[row, : row % prompt_length] = 0
        prompts[row, : row % prompt_length] = 0
    for row in range(1, num_samples, 3):
        cut = response_length - 1 - row % response_length
        attention_mask[row, prompt_length + cut + 1 :] = 0
        responses[row, cut + 1 :] = 0
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    response_mask = attention_mask[:, prompt_length:].clone()
    sign = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(num_samples)])
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=-1),
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "response_mask": response_mask,
            "advantages": sign[:, None].expand(-1, response_length) * response_mask,
            "old_log_probs": torch.zeros(num_samples, response_length),
        },
        meta_info={"temperature": 1.0},  # the sampling temperature the actor's log-probs are taken at
    )


# ---------------------------------------------------------------------------------------------- timing


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_call(fn: Callable[[], Any]) -> float:
    """Seconds one call of ``fn`` takes (device work included)."""
    synchronize()
    start = time.perf_counter()
    fn()
    synchronize()
    return time.perf_counter() - start


def alternate(variants: dict[str, Callable[[], Any]], num_repeats: int, num_warmup: int = 1) -> dict[str, list[float]]:
    """Time each variant ``num_repeats`` times, interleaved (A B A B ... with the order flipped every round).

    Interleaving spreads slow drift of the machine (thermal state, other processes) evenly over the variants, and
    flipping the order cancels the advantage of always running first or second.

    Returns:
        variant name -> the list of its ``num_repeats`` timings in seconds.
    """
    names = list(variants)
    for _ in range(num_warmup):
        for name in names:
            variants[name]()
    timings: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(num_repeats):
        order = names if round_index % 2 == 0 else names[::-1]
        for name in order:
            timings[name].append(time_call(variants[name]))
    return timings


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def spread(values: Sequence[float]) -> float:
    """Half the inter-quartile range relative to the median: a robust measure of run-to-run noise."""
    if len(values) < 4:
        return float("nan")
    quartiles = statistics.quantiles(values, n=4)
    return float((quartiles[2] - quartiles[0]) / 2 / statistics.median(values))


def matmul_flops_per_second(
    size: int = 1024, min_seconds: float = 1.0, dtype=torch.float32, kernel: str = "torch"
) -> float:
    """The machine's measured matmul rate: 2*n^3 FLOPs per ``size`` x ``size`` product, timed in a loop.

    ``kernel``: ``torch`` times ``a @ b`` (on CPU: MKL's sgemm); ``onednn`` times the oneDNN product that
    ``verl.utils.cpu_linear`` gives fp32 linear layers on CPU.
    """
    device = default_device()
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    if kernel == "onednn":
        from verl.utils.cpu_linear import _matmul

        def product():
            return _matmul(a, b, None)
    else:

        def product():
            return a @ b

    for _ in range(3):  # warm-up (thread pool, caches, cuBLAS handles)
        product()
    num_products = 0
    synchronize()
    start = time.perf_counter()
    while True:
        for _ in range(4):
            product()
        num_products += 4
        synchronize()
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            break
    return 2.0 * size**3 * num_products / elapsed


# ---------------------------------------------------------------------------------------------- memory


def _proc_status_kib(field: str) -> int | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    match = re.search(rf"^{field}:\s+(\d+) kB", text, flags=re.MULTILINE)
    return int(match.group(1)) if match else None


def _reset_peak_rss() -> bool:
    # Writing "5" to clear_refs resets VmHWM (Linux >= 4.0): per-run peaks become measurable inside one process.
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def maxrss_kib() -> int:
    """The process's lifetime peak resident set (``getrusage``), KiB on Linux."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def peak_memory_bytes(fn: Callable[[], Any]) -> tuple[int, str]:
    """Peak memory ``fn`` adds on top of what was live before it, and how that was measured.

    CUDA: ``torch.cuda.max_memory_allocated`` minus the allocated bytes before the call. CPU: the peak resident
    set during the call minus the resident set before it (VmHWM after a reset, Linux), else the growth of
    ``getrusage`` maxrss (which only sees new lifetime peaks, so it reads 0 once a larger run has happened).
    """
    if torch.cuda.is_available():
        synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        synchronize()
        return int(torch.cuda.max_memory_allocated() - before), "cuda.max_memory_allocated"
    if _reset_peak_rss():
        before = _proc_status_kib("VmRSS")
        fn()
        peak = _proc_status_kib("VmHWM")
        if before is not None and peak is not None:
            return max(peak - before, 0) * 1024, "VmHWM-VmRSS"
    before = maxrss_kib()
    fn()
    return max(maxrss_kib() - before, 0) * 1024, "getrusage.maxrss delta"


def python_heap_peak_bytes(fn: Callable[[], Any]) -> int:
    """Peak Python-heap bytes ``fn`` allocates (``tracemalloc``; tensor storage is not on the Python heap).

    This is where a handler's own cost lives (its metric dicts and counters), so it separates handlers that the
    resident-set figure cannot, since freed tensor memory is reused by the allocator without growing the process.
    """
    tracemalloc.start()
    try:
        fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return int(peak)


# ---------------------------------------------------------------------------------------------- output


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """A plain-text table of ``rows`` (dicts) restricted to ``columns``, numbers shown with 4 significant digits."""

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.4g}"
        return str(value)

    cells = [[cell(row.get(col, "")) for col in columns] for row in rows]
    widths = [max(len(col), *(len(r[i]) for r in cells)) if cells else len(col) for i, col in enumerate(columns)]
    lines = ["  ".join(col.ljust(w) for col, w in zip(columns, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def write_results(name: str, payload: dict[str, Any]) -> Path:
    """Write ``payload`` (plus the machine and the command line) to ``benchmarks/results/<name>.json``, atomically."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": name,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_info(),
        **payload,
    }
    path = RESULTS_DIR / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)
    return path


def quiet_libraries() -> None:
    """Silence import-time chatter (megatron's missing-Apex warnings, transformers' advice) in benchmark output."""
    import logging
    import warnings

    warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine).*")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    logging.getLogger("transformers").setLevel(logging.ERROR)
