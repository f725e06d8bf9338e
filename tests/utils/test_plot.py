"""The end-of-run plot: four panels, and whole-number ticks on the failed-updates count."""

import json


def test_the_failed_updates_axis_has_whole_number_ticks(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from verl.utils.plot import plot_training_curves

    metrics = tmp_path / "metrics.jsonl"
    # one failed update at step 1, none after: the count axis spans 0..1, where matplotlib's default ticks are
    # 0, 0.2, 0.4, 0.6, 0.8, 1 (a count of 0.4 failed updates means nothing)
    rows = [
        {"step": step, "critic/score/mean": 0.5, "actor/update_failed": failed, "actor/update_failures_total": 1.0}
        for step, failed in ((1, 1.0), (2, 0.0), (3, 0.0))
    ]
    metrics.write_text("".join(json.dumps(row) + "\n" for row in rows))
    figures = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig: (figures.append(fig), close(fig)))
    path = plot_training_curves(metrics, tmp_path / "training_curves.png")
    assert path.stat().st_size > 0
    (figure,) = figures
    assert len(figure.axes) == 4  # reward, loss scale, failed updates, mismatch (the quickstart says so)
    ticks = [tick for tick in figure.axes[2].get_yticks() if 0 <= tick <= 1]
    assert ticks and all(float(tick).is_integer() for tick in ticks), ticks


def test_a_multi_turn_run_gets_a_fifth_panel_with_its_tool_calls(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from verl.utils.plot import plot_training_curves

    metrics = tmp_path / "metrics.jsonl"
    # two steps of a tool-calling run: 0.5 then 1.0 calls per trajectory, success 0.75 then 1.0
    rows = [
        {
            "step": step,
            "critic/score/mean": 0.5,
            "agent_loop/tool_calls_total": calls,
            "tool_call_counts/mean": per_trajectory,
            "agent_loop/tool_call_success_rate": success,
        }
        for step, calls, per_trajectory, success in ((1, 4.0, 0.5, 0.75), (2, 8.0, 1.0, 1.0))
    ]
    metrics.write_text("".join(json.dumps(row) + "\n" for row in rows))
    figures = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig: (figures.append(fig), close(fig)))
    plot_training_curves(metrics, tmp_path / "training_curves.png")
    (figure,) = figures
    assert len(figure.axes) == 5
    lines = {line.get_label(): list(line.get_ydata()) for line in figure.axes[4].get_lines()}
    assert lines == {"tool calls per trajectory": [0.5, 1.0], "tool-call success rate": [0.75, 1.0]}
