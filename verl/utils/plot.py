"""The end-of-run picture from metrics.jsonl: reward, loss scale, failed updates, and the training-inference mismatch.

The mismatch panel shows the mean and max |p_rollout - p_trainer| of the response tokens per step (log scale): the
gap between the rollout engine and the trainer that fp16 keeps small and bf16 does not.
"""

from __future__ import annotations

from pathlib import Path

from verl.utils.tracking import read_metrics

# the agent loops' metrics (verl.experimental.agent_loop): a run that logs them gets the tool-call panel
_TOOL_CALLS = "agent_loop/tool_calls_total"
_CALLS_PER_TRAJECTORY = "tool_call_counts/mean"
_SUCCESS = "agent_loop/tool_call_success_rate"


def plot_training_curves(metrics_path: str | Path, output_path: str | Path) -> Path:
    """Write a four-panel PNG of the run in ``metrics_path`` and return its path.

    The panels, top to bottom: the mean train (and validation) reward, the actor's loss scale (log scale), the
    failed updates (per step and in total; whole-number ticks), the training-inference mismatch; and for a
    multi-turn run (its metrics have ``agent_loop/tool_calls_total``) a fifth: tool calls per trajectory and the
    tool-call success rate.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    records = [r for r in read_metrics(metrics_path) if "critic/score/mean" in r]
    steps = [r["step"] for r in records]
    with_tools = any(_TOOL_CALLS in r for r in records)  # a multi-turn run: a fifth panel for its tool calls
    fig, axes = plt.subplots(5 if with_tools else 4, 1, figsize=(7, 12.5 if with_tools else 10), sharex=True)
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
    axes[2].yaxis.set_major_locator(MaxNLocator(integer=True))  # a count: 0, 1, 2, never 0.5
    axes[2].legend()
    _plot_mismatch(axes[3], records)
    if with_tools:
        _plot_tool_calls(axes[4], records)
    axes[-1].set_xlabel("training step")
    fig.tight_layout()
    output_path = Path(output_path)
    fig.savefig(output_path, dpi=100)
    plt.close(fig)
    return output_path


def _plot_tool_calls(axis, records: list[dict]) -> None:
    """A multi-turn run's tool calls per step: calls per trajectory and the share of calls that succeeded."""
    for key, label in ((_CALLS_PER_TRAJECTORY, "tool calls per trajectory"), (_SUCCESS, "tool-call success rate")):
        points = [(r["step"], r[key]) for r in records if key in r]
        if points:
            axis.plot(*zip(*points), label=label)
    axis.set_ylabel("tool calls")
    axis.legend()


def _plot_mismatch(axis, records: list[dict]) -> None:
    """Mean and max |p_rollout - p_trainer| per step; a note instead when the rollout reported no log-probs."""
    for key, label in (("training/rollout_probs_diff_mean", "mean"), ("training/rollout_probs_diff_max", "max")):
        points = [(r["step"], r[key]) for r in records if r.get(key, 0) > 0]
        if points:
            axis.semilogy(*zip(*points), label=f"{label} |p_rollout - p_trainer|")
    if axis.lines:
        axis.legend()
    else:
        axis.text(0.5, 0.5, "no mismatch logged (identical or missing)", ha="center", transform=axis.transAxes)
    axis.set_ylabel("rollout/trainer mismatch")
