"""The documentation builds offline with warnings as errors, exactly as CI builds it."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_sphinx_build_with_warnings_as_errors(tmp_path):
    out = tmp_path / "html"
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "-b", "html", "-d", str(tmp_path / "doctrees"), "docs", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"sphinx-build failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    pages = (
        "index",
        "architecture",
        "advance/add_backend",
        "advance/add_role",
        "advance/add_rollout",
        "start/install",
        "start/quickstart",
        "start/examples",
        "config/ppo_trainer",
        "advance/update_failure_policy",
        "advance/fp16",
        "advance/backends",
        "advance/recipes",
        "perf",
        "api/index",
        "api/update_outcome",
    )
    for page in pages:
        assert (out / f"{page}.html").is_file(), page
    # autodoc imported every documented module and found its main public names
    autodoc = {
        "api/protocol": "verl.protocol.DataProto",
        "api/core_algos": "verl.algorithms.core_algos.compute_grpo_outcome_advantage",
        "api/torch_functional": "verl.utils.torch_functional.masked_mean",
        "api/actor": "verl.workers.actor.dp_actor.DataParallelPPOActor",
        "api/amp_optimizer": "verl.utils.amp_optimizer.AmpOptimizer",
        "api/rollout": "verl.workers.rollout.naive_rollout.NaiveRollout",
        "api/reward_manager": "verl.workers.reward_manager.naive.NaiveRewardManager",
        "api/single_controller": "verl.single_controller.ray_worker_group.RayWorkerGroup",
    }
    for page, object_id in autodoc.items():
        assert f'id="{object_id}"' in (out / f"{page}.html").read_text(encoding="utf-8"), (page, object_id)
    # The example handler is pulled in with literalinclude, and autodoc found the built-in handlers.
    assert "SkipBudgetHandler" in (out / "advance/update_failure_policy.html").read_text(encoding="utf-8")
    assert "FP16WarnAndCountHandler" in (out / "api/update_outcome.html").read_text(encoding="utf-8")
