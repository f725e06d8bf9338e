"""Where a step of the ``tiny`` GRPO benchmark goes: the actor worker's two calls in one process, operator by operator.

``bench_vs_trl.py`` measures the whole step against TRL; this script asks why the ``tiny`` step costs what it
does. It builds the ``dp`` actor worker with ``bench_vs_trl``'s ``tiny`` settings (16 prompts x 4 samples, 8-token
responses, fp32, one update per step), without Ray, and runs steps of ``generate_with_log_probs`` and
``update_actor`` (rewards and GRPO advantages computed in between, as the driver does). Reported per call:

- the median wall time over the measured steps;
- under ``torch.profiler``: how many torch operators the call runs, their summed self time, and the mean per
  operator, with the operators that take the most self time.

With ``--compile`` it also times the tiny model's forward and backward eager against ``torch.compile`` (inductor,
dynamic shapes), to size what a compiled runtime would save; compiling takes about half a minute.

The Ray round trip the single controller adds to each call is measured apart: a bare Ray actor that sends back a
payload of the size the ``tiny`` step's generated batch has, against a worker-group call that takes a DataProto of
that shape and returns two small tensors (``EchoWorker.tag_rows`` of the tests), so the group call moves less data
back than the bare one (``--no-ray`` skips it).

Run: ``.venv/bin/python benchmarks/bench_tiny_step_ops.py --compile`` (about two minutes).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # tests.single_controller: the worker-group test worker

import bench_vs_trl  # noqa: E402
import common  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]


def build_worker(num_steps: int, workdir: Path):
    """The ``dp`` actor worker and the training data of ``bench_vs_trl``'s ``tiny`` size."""
    from verl.trainer.data_setup import build_data
    from verl.trainer.main_ppo import worker_classes
    from verl.workers.config import compose_ppo_config

    data_file = workdir / "prompts.parquet"
    bench_vs_trl.write_prompts(data_file, num_prompts=max(32 * num_steps, 256), seed=1)
    args = bench_vs_trl.size_args(bench_vs_trl.parse_args(["--sizes", "tiny", "--device", "cpu"]), "tiny")
    args.steps = num_steps
    model = bench_vs_trl.model_dir("tiny", workdir)
    overrides = bench_vs_trl.verl_overrides(args, model, data_file, workdir / "log")
    config = compose_ppo_config([o for o in overrides if not o.startswith(("trainer.", "ray_init."))])
    worker = worker_classes("dp")[0].from_config(config, total_training_steps=num_steps + 1)
    worker.init_model()
    return worker, build_data(config, world_size=1)


def make_step(worker, data):
    """One step's two worker calls as callables over a fresh prompt batch (the driver's work in between)."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
    from verl.workers.actor.base import UPDATE_READS

    def prompts():
        batch = next(data.train_loader)
        batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
        return batch

    def update_batch(batch):
        scores = data.reward_fn(batch)
        advantages, returns = compute_grpo_outcome_advantage(
            scores, batch.batch["response_mask"], batch.non_tensor_batch["uid"]
        )
        batch.batch["advantages"], batch.batch["returns"] = advantages, returns
        update = batch.select(batch_keys=[k for k in UPDATE_READS if k in batch.batch.keys()])
        update.meta_info = {k: v for k, v in batch.meta_info.items() if k != "metrics"}
        return update

    return prompts, update_batch


def time_steps(worker, prompts, update_batch, num_warmup: int, num_steps: int, log=None) -> dict[str, Any]:
    """Run ``num_warmup + num_steps`` steps of the worker's two calls; the timed steps' generation and update
    seconds, real tokens, and the last generated batch. ``log(step, gen_s, update_s)`` is called after each step."""
    gen_s, update_s, tokens, batch = [], [], [], None
    for step in range(num_warmup + num_steps):
        batch_in = prompts()
        start = time.perf_counter()
        batch = worker.generate_with_log_probs(batch_in)
        generated = time.perf_counter()
        update = update_batch(batch)
        update_start = time.perf_counter()
        worker.update_actor(update)
        update_end = time.perf_counter()
        if log is not None:
            log(step, generated - start, update_end - update_start)
        if step >= num_warmup:
            gen_s.append(generated - start)
            update_s.append(update_end - update_start)
            tokens.append(int(batch.batch["attention_mask"].sum()))
    return {"gen_s": gen_s, "update_s": update_s, "tokens": tokens, "last_batch": batch}


def profile_calls(worker, prompts, update_batch, num_top: int = 8) -> tuple[dict[str, Any], dict[str, Any]]:
    """:func:`profile_call` of one ``generate_with_log_probs`` and one ``update_actor`` on fresh prompts."""
    batch_in = prompts()
    gen_ops = profile_call(lambda: worker.generate_with_log_probs(batch_in), num_top)
    update = update_batch(worker.generate_with_log_probs(prompts()))
    return gen_ops, profile_call(lambda: worker.update_actor(update), num_top)


def profile_call(fn, num_top: int = 8) -> dict[str, Any]:
    """Operator count and self time of one call of ``fn`` (torch.profiler, CPU)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    events = [e for e in prof.key_averages() if e.key.startswith(("aten::", "mkldnn::"))]
    num_ops = sum(e.count for e in events)
    self_us = sum(e.self_cpu_time_total for e in events)
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:num_top]
    return {
        "num_ops": num_ops,
        "ops_self_ms": self_us / 1e3,
        "us_per_op": self_us / max(num_ops, 1),
        "top_ops": [{"op": e.key, "calls": e.count, "self_ms": e.self_cpu_time_total / 1e3} for e in top],
    }


def measure_ray_round_trip(payload_bytes: int, num_calls: int) -> dict[str, float]:
    """Median round trip of a bare Ray actor call that echoes ``payload_bytes``, and of a worker-group call that
    sends a DataProto of about that size and gets two 64-row tensors back."""
    import ray

    from tests.single_controller.remote_helpers import EchoWorker
    from verl.protocol import DataProto
    from verl.single_controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        _system_config={"worker_niceness": 0},
        runtime_env={"env_vars": {"PYTHONPATH": str(REPO_ROOT)}},
    )
    try:

        @ray.remote(num_cpus=1)
        class Echo:
            def echo(self, value):
                return value

        bare = Echo.remote()
        payload = os.urandom(payload_bytes)
        group = RayWorkerGroup(
            RayResourcePool(num_workers=1, num_cpus_per_worker=1), RayClassWithInitArgs(EchoWorker), "ops_bench"
        )
        columns = max(1, payload_bytes // (64 * 8 * 6))  # six int64 tensors of 64 rows: the step's batch shape
        batch = DataProto.from_dict(
            tensors={"x": torch.arange(64), **{f"t{i}": torch.zeros(64, columns, dtype=torch.int64) for i in range(6)}},
            non_tensors={"uid": np.array([str(i) for i in range(64)], dtype=object)},
        )
        times = common.alternate(
            {
                "bare_ray_ms": lambda: ray.get(bare.echo.remote(payload)),
                "worker_group_ms": lambda: group.tag_rows(batch),
            },
            num_repeats=num_calls,
            num_warmup=20,
        )
        group.shutdown()
        return {name: 1e3 * common.median(values) for name, values in times.items()}
    finally:
        ray.shutdown()


def measure_compiled_forward_backward(num_calls: int) -> dict[str, float]:
    """The tiny model's forward and backward (a token log-likelihood loss on 64 rows), eager against
    ``torch.compile`` (inductor, dynamic shapes): how much a compiled runtime would take off the update."""
    from verl.models.loading import load_hf_causal_lm, resolve_model_path

    model = load_hf_causal_lm(resolve_model_path(None), dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)

    def batch(num_columns: int):
        ids = torch.randint(0, model.config.vocab_size, (64, num_columns), generator=generator)
        mask = torch.ones(64, num_columns, dtype=torch.long)
        mask[:8, :3] = 0  # some left padding, as the prompts have
        return ids, mask

    def forward_backward(module, ids, mask):
        logits = module(input_ids=ids, attention_mask=mask, use_cache=False).logits
        log_probs = torch.log_softmax(logits.float(), -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
        (-(log_probs * mask).sum() / mask.sum()).backward()

    compiled = torch.compile(model, dynamic=True)
    start = time.perf_counter()
    forward_backward(compiled, *batch(20))
    result = {"compile_s": time.perf_counter() - start}
    for num_columns in (20, 27):
        ids, mask = batch(num_columns)
        times = common.alternate(
            {
                "eager": lambda ids=ids, mask=mask: forward_backward(model, ids, mask),
                "compiled": lambda ids=ids, mask=mask: forward_backward(compiled, ids, mask),
            },
            num_repeats=num_calls,
            num_warmup=3,
        )
        for name, values in times.items():
            result[f"{name}_ms_{num_columns}_columns"] = 1e3 * common.median(values)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="steps timed (after --warmup)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--ray-calls", type=int, default=300, help="calls per variant of the Ray round trip")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray round trip")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile's forward and backward")
    args = parser.parse_args(argv)
    common.quiet_libraries()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="bench_tiny_ops_") as tmp:
        worker, data = build_worker(args.warmup + args.steps + 2, Path(tmp))
        prompts, update_batch = make_step(worker, data)
        steps = time_steps(worker, prompts, update_batch, args.warmup, args.steps)
        gen_s, update_s, batch = steps["gen_s"], steps["update_s"], steps["last_batch"]
        gen_ops, update_ops = profile_calls(worker, prompts, update_batch)
    from verl.single_controller.transport import PackedDataProto

    payload_bytes = len(PackedDataProto(batch).payload)
    result: dict[str, Any] = {
        "settings": vars(args),
        "generate_with_log_probs": {"median_ms": 1e3 * statistics.median(gen_s), **gen_ops},
        "update_actor": {"median_ms": 1e3 * statistics.median(update_s), **update_ops},
        "generated_batch_payload_bytes": payload_bytes,
    }
    if args.compile:
        result["compiled_forward_backward"] = measure_compiled_forward_backward(num_calls=30)
    if not args.no_ray:
        result["ray_round_trip"] = measure_ray_round_trip(payload_bytes, args.ray_calls)
    for call in ("generate_with_log_probs", "update_actor"):
        r = result[call]
        print(
            f"{call}: {r['median_ms']:.2f} ms per call; {r['num_ops']} torch operators, {r['ops_self_ms']:.2f} ms of "
            f"operator self time ({r['us_per_op']:.1f} us each)"
        )
        print(common.format_table(r["top_ops"], ["op", "calls", "self_ms"]))
    if "ray_round_trip" in result:
        trip = result["ray_round_trip"]
        print(
            f"Ray round trip with a {payload_bytes}-byte payload: bare actor {trip['bare_ray_ms']:.2f} ms, "
            f"worker group (DataProto) {trip['worker_group_ms']:.2f} ms"
        )
    if "compiled_forward_backward" in result:
        probe = result["compiled_forward_backward"]
        print(
            "forward and backward on 64 rows, eager / torch.compile: "
            + ", ".join(
                f"{c} columns {probe[f'eager_ms_{c}_columns']:.2f} / {probe[f'compiled_ms_{c}_columns']:.2f} ms"
                for c in (20, 27)
            )
            + f"; compiling took {probe['compile_s']:.1f} s"
        )
    print(f"wrote {common.write_results('bench_tiny_step_ops', result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
