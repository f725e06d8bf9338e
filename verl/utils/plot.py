"""The end-of-run picture: reward, loss scale and failed updates over training steps, from metrics.jsonl."""

from __future__ import annotations

from pathlib import Path

from verl.utils.tracking import read_metrics


def plot_training_curves(metrics_path: str | Path, output_path: str | Path) -> Path:
    """Write a three-panel PNG of the run in ``metrics_path`` and return its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [r for r in read_metrics(metrics_path) if "critic/score/mean" in r]
    steps = [r["step"] for r in records]
    fig, axes = plt.subplots(3, 1, figsize=(7, 8), sharex=True)
    axes[0].plot(steps, [r["critic/score/mean"] for r in records], label="train reward")
    val = [(r["step"], r["val/score/mean"]) for r in read_metrics(metrics_path) if "val/score/mean" in r]
    if val:
        axes[0].plot(*zip(*val), "o-", label="validation reward")
    axes[0].set_ylabel("mean reward")
    axes[0].legend()
    scales = [(r["step"], r["actor/loss_scale"]) for r in records if "actor/loss_scale" in r]
    if scales:
        axes[1].semilogy(*zip(*scales), drawstyle="steps-post")
    axes[1].set_ylabel("actor loss scale")
    axes[2].bar(steps, [r.get("actor/update_failed", 0.0) for r in records], color="tab:red", label="failed (step)")
    axes[2].plot(steps, [r.get("actor/update_failures_total", 0.0) for r in records], color="black", label="total")
    axes[2].set_ylabel("failed updates")
    axes[2].set_xlabel("training step")
    axes[2].legend()
    fig.tight_layout()
    output_path = Path(output_path)
    fig.savefig(output_path, dpi=100)
    plt.close(fig)
    return output_path
