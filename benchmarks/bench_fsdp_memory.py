"""Memory per rank of the sharded (fsdp2) and replicated (dp) backends, and the default run's step time on both.

Part 1, memory: a Qwen2 model of a few million parameters trains a few PPO updates on each of ``world`` gloo ranks
(spawned processes; CUDA + NCCL on a GPU machine). Per rank it reports the bytes it holds of the parameters, the
gradients and the AdamW state (exact, from the tensors' local shards), and memory measured over the moment before
the model existed: the peak while building (and sharding) it, what stays resident after that, and the peak while
training (CPU: the resident set, with glibc told to return freed tensors; CUDA: ``max_memory_allocated``). With
fsdp2 the held state should halve from one rank to two; with dp it cannot.

Part 2, speed: ``python -m verl.trainer.main_ppo`` with the default config (the embedded tiny model, fp16) on one
rank, ``strategy=dp`` and ``strategy=fsdp2`` alternated, through ``bench_train_loop``'s runner; per run the median
step timings after the warm-up steps, then the fastest and the median run of each backend.

Run: ``.venv/bin/python benchmarks/bench_fsdp_memory.py`` (``--help``); writes ``results/bench_fsdp_memory.json``.
"""

from __future__ import annotations

import argparse
import gc
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

# About 5.2M parameters: embeddings 8192 x 256 (tied) = 2.1M, 4 layers of 0.79M.
MODEL = {
    "vocab_size": 8192,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
MiB = 2**20


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _build(strategy: str, dtype: str, device: str, sizes: dict[str, int] = MODEL):
    """The actor of ``strategy`` over a fresh model (the model is created inside, so its memory is measured)."""
    import torch.distributed as dist

    config = common.actor_config(strategy, dtype)
    model = common.tiny_qwen2(0, **sizes)
    if strategy == "fsdp2":
        from verl.utils.fsdp_utils import device_mesh
        from verl.workers.actor.fsdp_actor import build_fsdp_actor

        return build_fsdp_actor(config, model, mesh=device_mesh(device), total_training_steps=10)
    from verl.workers.actor.dp_actor import build_dp_actor

    return build_dp_actor(config, model.to(device), total_training_steps=10, process_group=dist.group.WORLD)


def _resident_bytes() -> int:
    """Live memory now: allocated CUDA bytes, or the process's resident set on the CPU."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.memory_allocated()
    return (common._proc_status_kib("VmRSS") or 0) * 1024


def _held_bytes(actor) -> dict[str, int]:
    from verl.utils.fsdp_utils import sharded_state_bytes

    return sharded_state_bytes(actor.model_module(), actor.optimizer.optimizer)


def _rank_main(rank: int, world: int, port: int, strategy: str, dtype: str, num_updates: int, queue) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    common.quiet_libraries()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    device = "cuda" if cuda else "cpu"
    batch = common.ppo_batch(8, 16, 16, MODEL["vocab_size"], seed=rank).to(device)
    result: dict[str, Any] = {}
    actors = []

    def build() -> None:
        actors.append(_build(strategy, dtype, device))

    def train() -> None:
        for _ in range(num_updates):
            metrics = actors[0].update_policy(batch).metrics
        result["update_failed"] = metrics["actor/update_failed"]

    # a first, tiny run imports and initialises everything (code pages count in the resident set too)
    warmup = _build(strategy, dtype, device, common.TINY_MODEL)
    warmup.update_policy(common.ppo_batch(8, 16, 16, common.TINY_MODEL["vocab_size"]).to(device))
    del warmup
    gc.collect()
    baseline = _resident_bytes()
    result["build_peak_bytes"], result["peak_method"] = common.peak_memory_bytes(build)
    result["resident_after_build_bytes"] = _resident_bytes() - baseline
    train_peak, _ = common.peak_memory_bytes(train)
    # the peak of the training updates over the same baseline as the build's: what the model costs while training
    result["train_peak_bytes"] = result["resident_after_build_bytes"] + train_peak
    result["held"] = _held_bytes(actors[0])
    result["num_parameters"] = sum(p.numel() for p in actors[0].model_module().parameters())
    queue.put((rank, result))
    dist.barrier()
    dist.destroy_process_group()


def measure_memory(strategy: str, world: int, dtype: str, num_updates: int) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp

    # glibc then serves every allocation above 64 KiB (all tensors that matter) with mmap and returns it on free,
    # so that the resident set follows the live tensors instead of keeping freed memory in its arenas
    os.environ.update(MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    args = (world, port, strategy, dtype, num_updates, queue)
    procs = [ctx.Process(target=_rank_main, args=(rank, *args)) for rank in range(world)]
    for proc in procs:
        proc.start()
    results = dict(queue.get(timeout=900) for _ in procs)
    for proc in procs:
        proc.join(timeout=120)
        if proc.exitcode != 0:
            raise RuntimeError(f"{strategy} world {world}: rank process exited with {proc.exitcode}")
    return [results[rank] for rank in range(world)]


def memory_rows(results: dict[tuple[str, int], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    rows = []
    for (strategy, world), ranks in results.items():
        for rank, r in enumerate(ranks):
            held = r["held"]
            rows.append(
                {
                    "strategy": strategy,
                    "world": world,
                    "rank": rank,
                    "params_MiB": held["params"] / MiB,
                    "grads_MiB": held["grads"] / MiB,
                    "adam_MiB": held["optimizer"] / MiB,
                    "held_MiB": sum(held.values()) / MiB,
                    "build_peak_MiB": r["build_peak_bytes"] / MiB,
                    "after_build_MiB": r["resident_after_build_bytes"] / MiB,
                    "train_peak_MiB": r["train_peak_bytes"] / MiB,
                }
            )
    return rows


def measure_step_time(args) -> dict[str, Any]:
    """Default run, one rank, dp and fsdp2 alternated ``args.repeats`` times; min and median of the runs."""
    import bench_train_loop

    runs: dict[str, list[dict[str, Any]]] = {"dp": [], "fsdp2": []}
    commands = {}
    for _ in range(args.repeats):
        for strategy in runs:
            run_args = argparse.Namespace(
                steps=args.steps, strategy=strategy, dtype="float16", ray_cpus=args.ray_cpus, overrides=[]
            )
            with tempfile.TemporaryDirectory(prefix="bench_fsdp_") as tmp:
                log_dir = Path(tmp) / "run"
                overrides = bench_train_loop.trainer_overrides(run_args, log_dir)
                records, wall = bench_train_loop.run_trainer(overrides, log_dir, args.timeout_s)
            commands[strategy] = "python -m verl.trainer.main_ppo " + " ".join(overrides)
            summary = bench_train_loop.summarise(records, args.warmup_steps, 0, 1.0)
            summary["process_wall_s"] = wall
            runs[strategy].append(summary)
    keys = ("timing_s/step", "timing_s/gen", "timing_s/update_actor")
    # other work on a shared machine slows whole runs down (several-fold on 2 busy cores): the fastest run is the
    # backend's own cost, the median shows the spread
    table = {
        strategy: {
            f"{stat}:{key}": fn([s[key] for s in summaries if s.get(key) is not None])
            for key in keys
            for stat, fn in (("min", min), ("median", common.median))
        }
        for strategy, summaries in runs.items()
    }
    return {"per_strategy": table, "runs": runs, "trainer_commands": commands}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"], help="part 1")
    parser.add_argument("--updates", type=int, default=3, help="PPO updates per rank in part 1")
    parser.add_argument("--steps", type=int, default=10, help="trainer steps per run in part 2")
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="runs per strategy in part 2 (alternated)")
    parser.add_argument("--ray-cpus", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument("--skip-step-time", action="store_true", help="part 1 only")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    common.quiet_libraries()
    memory = {}
    for strategy in ("dp", "fsdp2"):
        for world in (1, 2):
            memory[(strategy, world)] = measure_memory(strategy, world, args.dtype, args.updates)
    rows = memory_rows(memory)
    columns = [*rows[0].keys()]
    print(common.format_table(rows, columns))
    payload: dict[str, Any] = {
        "settings": vars(args),
        "model": {**MODEL, "num_parameters": memory[("dp", 1)][0]["num_parameters"]},
        "memory": {"rows": rows, "peak_method": memory[("dp", 1)][0]["peak_method"]},
    }
    if not args.skip_step_time:
        payload["step_time"] = measure_step_time(args)
        per_strategy = payload["step_time"]["per_strategy"]
        table = [{"strategy": s, **m} for s, m in per_strategy.items()]
        print(common.format_table(table, ["strategy", *next(iter(per_strategy.values())).keys()]))
    print(f"wrote {common.write_results('bench_fsdp_memory', payload)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
