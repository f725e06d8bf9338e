"""`python -m verl.utils.dataset.make_tiny_data --out DIR`: the embedded task in verl's data layout (issue 51, 6)."""

import pandas as pd
import pytest

from verl.utils.dataset import RLHFDataset
from verl.utils.dataset.make_tiny_data import main, write_tiny_data
from verl.utils.reward_score import tiny_task


def test_the_files_have_verls_columns_and_the_embedded_task(tmp_path, capsys):
    main(["--out", str(tmp_path), "--num-train", "5", "--num-test", "3"])
    train, test = tmp_path / "train.parquet", tmp_path / "test.parquet"
    # what the command prints is the two overrides to paste
    assert capsys.readouterr().out.strip() == f"data.train_files={train} data.val_files={test}"
    frame = pd.read_parquet(train)
    # the columns of verl's examples/data_preprocess/gsm8k.py
    assert list(frame.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert len(frame) == 5 and len(pd.read_parquet(test)) == 3
    row = frame.iloc[2]
    assert row["data_source"] == "tiny_task" and row["ability"] == "reverse"
    assert row["extra_info"] == {"split": "train", "index": 2}
    (message,) = row["prompt"]
    assert message["role"] == "user" and message["content"].endswith("=")
    # the ground truth is the prompt's digits reversed, which the built-in scorer rewards with 1.0
    digits = message["content"].removesuffix("=")
    assert row["reward_model"] == {"style": "rule", "ground_truth": digits[::-1]}
    assert tiny_task.compute_score(digits[::-1], row["reward_model"]["ground_truth"]) == 1.0
    # the trainer's dataset reads them as verl's files (chat prompt, nested ground truth)
    dataset = RLHFDataset(train, render_chat=lambda chat: chat[0]["content"])
    assert dataset[2]["raw_prompt"] == message["content"] and dataset[2]["ground_truth"] == digits[::-1]


def test_the_same_seed_writes_the_same_rows_and_the_test_split_differs(tmp_path):
    first = write_tiny_data(tmp_path / "a", 20, 20, seed=3)
    again = write_tiny_data(tmp_path / "b", 20, 20, seed=3)
    prompts = {
        name: pd.read_parquet(path)["prompt"].map(lambda chat: chat[0]["content"]).tolist()
        for name, path in first.items()
    }
    assert prompts["train"] == pd.read_parquet(again["train"])["prompt"].map(lambda chat: chat[0]["content"]).tolist()
    assert prompts["train"] != prompts["test"]  # seed 3 and seed 4


def test_a_row_count_below_one_is_refused(tmp_path):
    with pytest.raises(ValueError, match="at least 1"):
        write_tiny_data(tmp_path, 0, 4)
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--num-test", "0"])
