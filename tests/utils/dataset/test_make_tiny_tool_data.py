"""`python -m verl.utils.dataset.make_tiny_tool_data --out DIR`: the embedded tool task in verl's layout (issue 49)."""

import pandas as pd
import pytest

from verl.utils.dataset.make_tiny_tool_data import main, tiny_calc_rows, tool_trajectory
from verl.utils.reward_score import tiny_calc


def test_rows_follow_verls_tool_agent_layout():
    rows = tiny_calc_rows(3, seed=0, split="train")
    assert rows == tiny_calc_rows(3, seed=0, split="train")
    row = rows[1]
    assert row["data_source"] == "tiny_calc" and row["agent_name"] == "tool_agent" and row["ability"] == "math"
    (message,) = row["prompt"]
    expression = row["extra_info"]["expression"]
    assert message == {"role": "user", "content": expression + "=?"}
    answer = row["reward_model"]["ground_truth"]
    assert row["reward_model"]["style"] == "rule"
    # the ground truth is the expression's value, e.g. 37*48 -> 1776
    left, operator, right = expression.partition("*") if "*" in expression else expression.partition("+")
    assert answer == str(int(left) * int(right) if operator == "*" else int(left) + int(right))
    extra = row["extra_info"]
    assert extra["split"] == "train" and extra["index"] == 1 and extra["need_tools_kwargs"] is True
    assert extra["tools_kwargs"] == {"calculator": {"create_kwargs": {"ground_truth": answer}}}


def test_ideal_trajectory_messages():
    messages = tool_trajectory("37*48", "1776")
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    (call,) = messages[1]["tool_calls"]
    assert call["function"] == {"name": "calculator", "arguments": {"expression": "37*48"}}
    assert messages[2]["content"] == "1776" and messages[3]["content"] == "1776"
    # without the tool: the question and a direct answer
    assert [m["role"] for m in tool_trajectory("37*48", "1776", use_tool=False)] == ["user", "assistant"]


def test_cli_writes_train_and_test_parquet(tmp_path, capsys):
    main(["--out", str(tmp_path), "--num-train", "4", "--num-test", "2"])
    train, test = tmp_path / "train.parquet", tmp_path / "test.parquet"
    assert capsys.readouterr().out.strip() == f"data.train_files={train} data.val_files={test}"
    frame = pd.read_parquet(train)
    assert list(frame.columns) == ["data_source", "agent_name", "prompt", "ability", "reward_model", "extra_info"]
    assert len(frame) == 4 and len(pd.read_parquet(test)) == 2
    row = frame.iloc[0]
    assert (
        row["extra_info"]["tools_kwargs"]["calculator"]["create_kwargs"]["ground_truth"]
        == (row["reward_model"]["ground_truth"])
    )
    # the stored ground truth scores 1.0 with the built-in scorer
    truth = row["reward_model"]["ground_truth"]
    assert tiny_calc.compute_score(truth, truth) == 1.0


def test_cli_refuses_empty_splits(tmp_path):
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--num-train", "0"])
