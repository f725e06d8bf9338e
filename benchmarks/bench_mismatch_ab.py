"""A/B of the default run in bfloat16 and in float16: the rollout/trainer mismatch metrics over training.

Runs ``python -m verl.trainer.main_ppo`` twice (each in its own process and Ray instance) with the ``hf`` rollout,
which generates with the actor's fp32 weights, while the trainer's log-prob pass runs under the chosen precision's
autocast: the logged ``training/rollout_probs_diff_*`` and ``rollout_corr/kl`` then measure what that precision
costs. Writes ``benchmarks/results/bench_mismatch_ab.json`` (per-step series and medians) and a PNG of the curves.

Usage: ``python benchmarks/bench_mismatch_ab.py [--steps 30]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common  # noqa: E402

SERIES = ("training/rollout_probs_diff_mean", "training/rollout_probs_diff_max", "rollout_corr/kl", "critic/score/mean")


def run(dtype: str, steps: int, out_dir: Path) -> tuple[list[dict], float]:
    overrides = [
        f"actor_rollout_ref.actor.dtype={dtype}",
        "actor_rollout_ref.actor.strategy=dp",  # the hf rollout samples from a plain Hugging Face actor
        "actor_rollout_ref.rollout.name=hf",
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=-1",
        "trainer.progress_bar=false",
        "trainer.plot=false",
        f"trainer.default_local_dir={out_dir}",
    ]
    env = {**os.environ, "PYTHONPATH": str(common.REPO_ROOT), "RAY_ADDRESS": "local"}
    start = time.perf_counter()
    command = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides]
    subprocess.run(command, env=env, check=True, capture_output=True, cwd=out_dir.parent)
    seconds = time.perf_counter() - start
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "critic/score/mean" in r], seconds


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args(argv)
    results = {"machine": common.machine_info(), "steps": args.steps, "runs": {}}
    with tempfile.TemporaryDirectory() as workdir:
        for dtype in ("bfloat16", "float16"):
            rows, seconds = run(dtype, args.steps, Path(workdir) / dtype)
            series = {key: [r.get(key) for r in rows] for key in SERIES}
            results["runs"][dtype] = {
                "seconds": round(seconds, 1),
                "series": series,
                "median": {
                    key: statistics.median(abs(v) for v in values if v is not None) for key, values in series.items()
                },
            }
    bf16, fp16 = (results["runs"][d]["median"] for d in ("bfloat16", "float16"))
    for key in SERIES[:3]:
        results[f"ratio_bf16_to_fp16_median_{key.split('/')[-1]}"] = bf16[key] / fp16[key]
    common.RESULTS_DIR.mkdir(exist_ok=True)
    path = common.RESULTS_DIR / "bench_mismatch_ab.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    plot(results, path.with_suffix(".png"))
    for key in SERIES[:3]:
        print(f"{key}: median bf16 {bf16[key]:.3e}, fp16 {fp16[key]:.3e}, ratio {bf16[key] / fp16[key]:.1f}x")
    print(f"wrote {path}")
    return results


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for dtype, run_ in results["runs"].items():
        steps = range(1, len(run_["series"]["critic/score/mean"]) + 1)
        axes[0].semilogy(steps, run_["series"]["training/rollout_probs_diff_mean"], label=dtype)
        axes[1].plot(steps, run_["series"]["critic/score/mean"], label=dtype)
    axes[0].set_ylabel("mean |p_rollout - p_trainer|")
    axes[1].set_ylabel("mean reward")
    for axis in axes:
        axis.set_xlabel("training step")
        axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
