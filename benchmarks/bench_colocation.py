"""A PPO run with a critic and a reward model, its roles in one process per rank against a process each.

Runs ``python -m verl.trainer.main_ppo`` on the embedded task with ``algorithm.adv_estimator=gae`` and a tiny reward
model, ``--steps`` steps, once with ``trainer.colocate_roles=true`` (the default) and once with ``false`` (a process
per role, as before), alternating for ``--repeats`` rounds, and reports per variant (medians):

- ``workers_start_s``: from the run-plan log line to the last worker group's model line (processes started,
  torch and transformers imported, models built);
- ``run_s``: the whole command, start to exit;
- ``step_s``: ``timing_s/step`` of the steps after the first (the first one warms up);
- ``peak_rss_gib``: the highest sum of resident memory over the run's process tree (the driver, Ray's daemons and
  the workers), sampled every 50 ms.

    python benchmarks/bench_colocation.py --steps 3 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def tiny_reward_model(path: Path) -> str:
    sys.path.insert(0, str(REPO))
    from tests.workers.test_reward_model import build_tiny_rm

    return build_tiny_rm(path, head_std=1.0)


def command(out_dir: Path, rm_path: str, steps: int, colocate: bool) -> list[str]:
    return [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        "algorithm.adv_estimator=gae",
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "critic.ppo_mini_batch_size=8",
        "critic.ppo_micro_batch_size_per_gpu=8",
        "reward_model.enable=true",
        f"reward_model.model.path={rm_path}",
        "reward_model.micro_batch_size_per_gpu=8",
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.save_freq=-1",
        "trainer.progress_bar=false",
        "trainer.plot=false",
        f"trainer.colocate_roles={str(colocate).lower()}",
        f"trainer.default_local_dir={out_dir}",
    ]


def _tree_rss(root: psutil.Process) -> int:
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            total += proc.memory_info().rss
        except psutil.Error:  # gone between the listing and the read
            pass
    return total


def run_once(rm_path: str, steps: int, colocate: bool) -> dict[str, float]:
    out_dir = Path(tempfile.mkdtemp(prefix="bench_coloc_"))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.perf_counter()
    proc = subprocess.Popen(command(out_dir, rm_path, steps, colocate), env=env, stderr=subprocess.PIPE, text=True)
    peak, done = [0], threading.Event()

    def sample() -> None:
        root = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                peak[0] = max(peak[0], _tree_rss(root))
            except psutil.Error:
                return
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, stderr = proc.communicate()
    run_s = time.perf_counter() - start
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"run failed ({proc.returncode}):\n{stderr[-3000:]}")
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    step_times = [row["timing_s/step"] for row in rows if "timing_s/step" in row][1:]
    return {
        "workers_start_s": workers_start_s(stderr),
        "run_s": run_s,
        "step_s": statistics.mean(step_times) if step_times else float("nan"),
        "peak_rss_gib": peak[0] / 2**30,
    }


def workers_start_s(log: str) -> float:
    """Seconds from the run-plan line to the last model line of the worker groups (``rank 0: ...``)."""
    times = {}
    for line in log.splitlines():
        match = STAMP.match(line)
        if match is None:
            continue
        when = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
        if "run plan (derived from the config" in line:
            times["plan"] = when
        elif "verl.trainer.ray_setup: rank 0: " in line:
            times["models"] = when
    return (times["models"] - times["plan"]).total_seconds()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "colocation.json")
    args = parser.parse_args()
    rm_path = tiny_reward_model(Path(tempfile.mkdtemp(prefix="bench_rm_")) / "rm")
    results: dict[str, list[dict[str, float]]] = {"colocated": [], "separate": []}
    for round_index in range(args.repeats):
        for name, colocate in (("colocated", True), ("separate", False)):
            row = run_once(rm_path, args.steps, colocate)
            results[name].append(row)
            print(f"round {round_index + 1} {name}: " + ", ".join(f"{k}={v:.3f}" for k, v in row.items()), flush=True)
    summary = {
        name: {key: statistics.median(row[key] for row in rows) for key in rows[0]} for name, rows in results.items()
    }
    for name, values in summary.items():
        print(f"median {name}: " + ", ".join(f"{k}={v:.3f}" for k, v in values.items()))
    speedup = summary["separate"]["workers_start_s"] / summary["colocated"]["workers_start_s"]
    print(f"workers start {speedup:.2f}x faster colocated")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"runs": results, "median": summary, "start_speedup": speedup}, indent=2) + "\n")


if __name__ == "__main__":
    main()
