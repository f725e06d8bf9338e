"""Where a step's time goes on one model shape: the ``dp`` actor worker's two calls, timed and profiled in-process.

``bench_vs_trl.py --sweep`` says at which shapes verl's lead over TRL shrinks; this script says why. It builds the
``dp`` actor worker with ``bench_vs_trl``'s settings for one case (a sweep case by name, ``--shape`` or ``--model``),
runs ``--warmup`` + ``--steps`` steps (``generate_with_log_probs``, the driver's reward and GRPO advantages,
``update_actor``), and reports each call's median time, its share of the machine's fp32 matmul rate, and the
torch operators with the most self time in one profiled call of each (``torch.profiler``, CPU).

Run: ``.venv/bin/python benchmarks/profile_step.py --case qwen2-20m-v152k`` (``--no-save`` leaves the results
file alone; extra ``key=value`` arguments are verl config overrides, e.g.
``actor_rollout_ref.model.use_fused_kernels=true``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_tiny_step_ops  # noqa: E402
import bench_vs_trl  # noqa: E402
import common  # noqa: E402


def build_worker(case_flags: list[str], num_steps: int, workdir: Path, extra: list[str]):
    """The ``dp`` actor worker, the data and the case of ``bench_vs_trl`` that ``case_flags`` pick."""
    from verl.trainer.data_setup import build_data
    from verl.trainer.main_ppo import worker_classes
    from verl.workers.config import compose_ppo_config

    args = bench_vs_trl.parse_args([*case_flags, "--device", "cpu", "--steps", str(num_steps)])
    (case,) = bench_vs_trl.build_cases(args)
    data_file = workdir / "prompts.parquet"
    bench_vs_trl.write_prompts(data_file, num_prompts=max(32 * num_steps, 256), seed=1)
    model = case.write_model(workdir)
    overrides = bench_vs_trl.verl_overrides(case.run, model, data_file, workdir / "log")
    config = compose_ppo_config([o for o in overrides if not o.startswith(("trainer.", "ray_init."))] + extra)
    worker = worker_classes("dp")[0].from_config(config, total_training_steps=num_steps + 1)
    worker.init_model()
    return worker, build_data(config, world_size=1), case, model


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--case", help="a case of model_shapes.SWEEP, by name")
    which.add_argument("--shape", help="a shape, as bench_vs_trl.py --shape takes it")
    which.add_argument("--model", help="a Hugging Face model directory")
    parser.add_argument("--response-length", type=int, default=None)
    parser.add_argument("--steps", type=int, default=3, help="steps timed (after --warmup)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--top", type=int, default=12, help="operators listed per call")
    parser.add_argument("--no-save", action="store_true")
    parser.add_argument("overrides", nargs="*", help="verl config overrides (key=value)")
    args = parser.parse_args(argv)
    common.quiet_libraries()
    if args.case:
        case_flags = ["--sweep", "--sweep-cases", args.case]
    else:
        case_flags = ["--shape", args.shape] if args.shape else ["--model", args.model]
    if args.response_length is not None:
        case_flags += ["--response-length", str(args.response_length)]
    with tempfile.TemporaryDirectory(prefix="profile_step_") as tmp:
        worker, data, case, model = build_worker(case_flags, args.warmup + args.steps + 2, Path(tmp), args.overrides)
        _, matmul_params = bench_vs_trl.count_parameters(model)
        prompts, update_batch = bench_tiny_step_ops.make_step(worker, data)
        steps = bench_tiny_step_ops.time_steps(
            worker,
            prompts,
            update_batch,
            args.warmup,
            args.steps,
            log=lambda step, gen, update: print(f"step {step}: generation {gen:.3f} s, update {update:.3f} s"),
        )
        gen_ops, update_ops = bench_tiny_step_ops.profile_calls(worker, prompts, update_batch, args.top)
    gen_s, update_s, tokens = steps["gen_s"], steps["update_s"], steps["tokens"]
    rate = common.matmul_flops_per_second()
    num_tokens = statistics.median(tokens)
    result: dict[str, Any] = {
        "case": case.name,
        "model": case.model_info,
        "overrides": args.overrides,
        "num_matmul_parameters": matmul_params,
        "num_tokens_median": num_tokens,
        "matmul_flops_per_second": rate,
        "generate_with_log_probs": {"median_s": statistics.median(gen_s), **gen_ops},
        "update_actor": {"median_s": statistics.median(update_s), **update_ops},
    }
    for call, flops_per_token in (("generate_with_log_probs", 2), ("update_actor", 6)):
        r = result[call]
        r["share_of_matmul_rate"] = flops_per_token * matmul_params * num_tokens / (r["median_s"] * rate)
        print(
            f"\n{call}: {r['median_s']:.3f} s per call ({r['share_of_matmul_rate']:.1%} of the fp32 matmul rate); "
            f"{r['num_ops']} torch operators, {r['ops_self_ms']:.0f} ms of operator self time"
        )
        print(common.format_table(r["top_ops"], ["op", "calls", "self_ms"]))
    if not args.no_save:
        print(f"wrote {common.write_results(f'profile_step_{case.name}', result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
