"""What the update-outcome handler costs: one ``update_policy`` call with the configured handler vs a no-op one.

For each backend (``dp``, ``megatron``) and precision (fp32, fp16) one actor trains a tiny Qwen2-shaped model on a
fixed batch. Its handler is swapped between the configured one (``auto``: ``strict`` in fp32,
``fp16_warn_and_count`` in fp16) and a registered no-op handler whose ``handle()`` returns ``{}`` without any
bookkeeping, and the two variants are timed interleaved (same model, same batch, same optimizer state) so that
machine drift cancels. Reported: median wall time per call, peak memory per call, the overhead ratio, and
``handler.handle(outcome)`` timed alone in microseconds, which gives a second, much less noisy estimate of the
overhead (handle time x updates per call / step time). On CUDA it also counts device-to-host synchronisations
inside ``handle()`` (``torch.cuda.set_sync_debug_mode("warn")``); on any device it checks that the outcome the
handler receives holds plain Python numbers, not tensors.

Run: ``.venv/bin/python benchmarks/bench_update_step.py`` (``--help`` for sizes and repeats).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import tracemalloc
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

from verl.workers.update_outcome import (  # noqa: E402
    UpdateOutcome,
    UpdateOutcomeHandler,
    build_update_outcome_handler,
    register_update_outcome_handler,
)

logger = logging.getLogger(__name__)
NOOP_HANDLER = "bench_noop"


@register_update_outcome_handler(NOOP_HANDLER)
class NoOpHandler(UpdateOutcomeHandler):
    """The baseline: accepts every outcome and returns no metrics, keeping no counters at all."""

    def handle(self, outcome: UpdateOutcome) -> dict[str, float]:
        return {}


class ProbeHandler(UpdateOutcomeHandler):
    """Wraps a handler to record what ``handle()`` receives and whether it synchronises with the GPU."""

    def __init__(self, inner: UpdateOutcomeHandler):
        super().__init__()
        self.inner = inner
        self.non_python_fields: list[str] = []
        self.num_sync_warnings = 0

    def handle(self, outcome: UpdateOutcome) -> dict[str, float]:
        for name, value in outcome.to_dict().items():
            if value is not None and not isinstance(value, bool | int | float | str):
                self.non_python_fields.append(f"{name}: {type(value).__name__}")
        if not torch.cuda.is_available():
            return self.inner.handle(outcome)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                metrics = self.inner.handle(outcome)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        self.num_sync_warnings += sum("synchroniz" in str(w.message).lower() for w in caught)
        return metrics


# ---------------------------------------------------------------------------------------------- actors


def build_dp_actor(dtype: str, device: torch.device, seed: int):
    from verl.workers.actor.dp_actor import build_dp_actor as build

    model = common.tiny_qwen2(seed).to(device)
    actor = build(common.actor_config("dp", dtype), model, total_training_steps=1000)
    return actor, common.num_parameters(model)


def build_megatron_actor_for_bench(dtype: str, device: torch.device, seed: int):
    """The megatron actor through the project's builder, initialised from the same tiny HF model as dp."""
    from verl.workers.actor.megatron_builder import build_megatron_actor

    hf_model = common.tiny_qwen2(seed)
    actor = build_megatron_actor(
        hf_model.config,
        common.actor_config("megatron", dtype),
        device=device,
        total_training_steps=1000,
        hf_state_dict=hf_model.state_dict(),
    )
    return actor, common.num_parameters(actor.model_module())


def megatron_available() -> str | None:
    """None when the megatron actor can be built here, else why not."""
    try:
        import verl.workers.actor.megatron_builder  # noqa: F401
    except ImportError as err:
        return f"verl.workers.actor.megatron_builder does not import ({err})"
    return None


# ---------------------------------------------------------------------------------------------- measurements


def time_handle_alone(handler: UpdateOutcomeHandler, fp16: bool, num_calls: int) -> dict[str, float]:
    """Microseconds per ``handle()`` on successful outcomes, and the Python heap one call allocates at peak."""
    start_step = handler.last_step + 1
    outcomes = [
        UpdateOutcome(
            successful=True,
            grad_norm=0.5,
            num_zeros_in_grad=None,
            loss_scale=1024.0 if fp16 else None,
            min_loss_scale=1.0 if fp16 else None,
            step=start_step + i,
        )
        for i in range(num_calls + 1)
    ]
    handle = handler.handle
    tracemalloc.start()
    handle(outcomes[0])
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    start = time.perf_counter()
    for outcome in outcomes[1:]:
        handle(outcome)
    elapsed = time.perf_counter() - start
    return {"handle_us": elapsed / num_calls * 1e6, "handle_py_heap_peak_bytes": float(peak)}


def time_cause_checks(actor, batch, num_updates: int, num_calls: int) -> dict[str, float]:
    """Microseconds per ``update_policy`` call of the checks that tell failure causes apart: the loss inputs'
    finiteness (once per call) and the micro-batch losses' (one note per micro-batch, one agreed verdict per
    update, ``num_updates`` per call)."""
    keys = actor._update_batch_keys(batch)
    loss = torch.tensor(0.5, device=batch.batch["advantages"].device)
    num_micro = max(1, int(actor.mini_batch_size) // int(actor.micro_batch_size or actor.mini_batch_size))
    start = time.perf_counter()
    for _ in range(num_calls):
        assert not actor._nonfinite_inputs(batch, keys)
        for _ in range(num_updates):
            for _ in range(num_micro):
                actor.note_loss(loss)
            assert not actor._take_nonfinite_loss()
    return {"cause_checks_us": (time.perf_counter() - start) / num_calls * 1e6}


def sync_probe(actor, batch) -> dict[str, Any]:
    """One extra update with the configured handler wrapped in :class:`ProbeHandler`."""
    configured = actor.update_outcome_handler
    probe = ProbeHandler(configured)
    actor.update_outcome_handler = probe
    try:
        actor.update_policy(batch)
    finally:
        actor.update_outcome_handler = configured
    return {
        "outcome_fields_all_python": not probe.non_python_fields,
        "outcome_non_python_fields": probe.non_python_fields,
        "cuda_syncs_in_handle": probe.num_sync_warnings if torch.cuda.is_available() else None,
    }


def bench_one(backend: str, dtype: str, args, device: torch.device) -> dict[str, Any]:
    """All figures of one (backend, dtype) pair."""
    builder = build_dp_actor if backend == "dp" else build_megatron_actor_for_bench
    actor, num_params = builder(dtype, device, args.seed)
    batch = common.ppo_batch(
        args.batch_size, args.prompt_length, args.response_length, common.TINY_MODEL["vocab_size"], args.seed
    ).to(device)
    handlers = {
        "configured": actor.update_outcome_handler,
        "noop": build_update_outcome_handler(NOOP_HANDLER, dtype=dtype),
    }

    def run_with(name: str):
        def step():
            actor.update_outcome_handler = handlers[name]
            metrics = actor.update_policy(batch).metrics
            assert metrics["actor/num_updates_successful"] > 0, f"{backend}/{dtype}: no update succeeded"

        return step

    variants = {name: run_with(name) for name in handlers}
    timings = common.alternate(variants, args.repeats, num_warmup=args.warmup)
    peaks, py_peaks, methods = {name: [] for name in handlers}, {name: [] for name in handlers}, set()
    for round_index in range(args.memory_repeats):
        for name in handlers if round_index % 2 == 0 else list(handlers)[::-1]:
            peak, method = common.peak_memory_bytes(variants[name])
            peaks[name].append(peak)
            methods.add(method)
            py_peaks[name].append(common.python_heap_peak_bytes(variants[name]))
    actor.update_outcome_handler = handlers["configured"]
    probe = sync_probe(actor, batch)
    handle_stats = time_handle_alone(handlers["configured"], dtype == "float16", args.handle_calls)

    num_updates = args.batch_size // int(actor.mini_batch_size) * int(actor.config.ppo_epochs)
    check_stats = time_cause_checks(actor, batch, num_updates, args.handle_calls // 10)
    step_configured = common.median(timings["configured"])
    step_noop = common.median(timings["noop"])
    handle_share = handle_stats["handle_us"] * 1e-6 * num_updates / step_noop
    return {
        "backend": backend,
        "dtype": dtype,
        "handler": type(handlers["configured"]).__name__,
        "num_parameters": num_params,
        "num_updates_per_call": num_updates,
        "step_ms_configured": step_configured * 1e3,
        "step_ms_noop": step_noop * 1e3,
        "step_noise_configured": common.spread(timings["configured"]),
        "step_noise_noop": common.spread(timings["noop"]),
        "overhead_ratio_wall": (step_configured - step_noop) / step_noop,
        "overhead_ratio_paired": common.median(
            [c / n for c, n in zip(timings["configured"], timings["noop"], strict=True)]
        )
        - 1.0,
        "overhead_ratio_from_handle": handle_share,
        "overhead_ratio_from_checks": check_stats["cause_checks_us"] * 1e-6 / step_noop,
        "peak_mem_mib_configured": max(peaks["configured"]) / 2**20,
        "peak_mem_mib_noop": max(peaks["noop"]) / 2**20,
        "peak_mem_method": ",".join(sorted(methods)),
        "py_heap_peak_kib_configured": max(py_peaks["configured"]) / 1024,
        "py_heap_peak_kib_noop": max(py_peaks["noop"]) / 1024,
        "process_maxrss_mib": common.maxrss_kib() / 1024,
        **handle_stats,
        **check_stats,
        **probe,
        "timings_s": timings,
    }


# ---------------------------------------------------------------------------------------------- main

COLUMNS = [
    "backend",
    "dtype",
    "handler",
    "step_ms_noop",
    "step_ms_configured",
    "overhead_ratio_wall",
    "overhead_ratio_paired",
    "handle_us",
    "overhead_ratio_from_handle",
    "cause_checks_us",
    "overhead_ratio_from_checks",
    "peak_mem_mib_noop",
    "peak_mem_mib_configured",
    "py_heap_peak_kib_noop",
    "py_heap_peak_kib_configured",
    "cuda_syncs_in_handle",
]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="dp,megatron", help="comma-separated: dp, megatron")
    parser.add_argument("--dtypes", default="float32,float16", help="comma-separated: float32, float16")
    parser.add_argument("--repeats", type=int, default=100, help="timed update_policy calls per variant")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per variant first")
    parser.add_argument("--memory-repeats", type=int, default=4, help="peak-memory probes (alternating variants)")
    parser.add_argument("--handle-calls", type=int, default=20000, help="handle() calls timed alone")
    parser.add_argument("--batch-size", type=int, default=16, help="samples per update_policy call")
    parser.add_argument("--prompt-length", type=int, default=16)
    parser.add_argument("--response-length", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    common.quiet_libraries()
    device = common.default_device()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    skipped = {}
    if "megatron" in backends and (reason := megatron_available()) is not None:
        skipped["megatron"] = reason
        backends.remove("megatron")
        print(f"megatron skipped: {reason}")
    rows = []
    for backend in backends:
        for dtype in dtypes:
            start = time.perf_counter()
            rows.append(bench_one(backend, dtype, args, device))
            print(f"  {backend}/{dtype}: {time.perf_counter() - start:.1f}s", flush=True)
    print(common.format_table(rows, COLUMNS))
    payload = {
        "settings": {k: v for k, v in vars(args).items()},
        "model": common.TINY_MODEL,
        "goal": "overhead_ratio < 0.01",
        "skipped": skipped,
        "rows": rows,
    }
    print(f"wrote {common.write_results('bench_update_step', payload)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
