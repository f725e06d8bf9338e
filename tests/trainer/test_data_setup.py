"""The trainer's data: every validation prompt is validated, in batches of data.val_batch_size; the training prompts'
loader has data.dataloader_num_workers worker processes."""

import pytest

from verl.trainer.data_setup import build_data
from verl.workers.config.loading import compose_ppo_config


@pytest.mark.parametrize(
    "num_val, val_batch_size, world_size, sizes",
    [
        (64, None, 1, [64]),  # one batch of all of them
        (50, 16, 2, [16, 16, 16, 2]),  # 3 whole batches and the rest (a multiple of the 2 workers)
        (50, 64, 2, [50]),  # a batch size above the set: one batch of the set, not none
        (51, 16, 2, [16, 16, 16, 2]),  # 51 over 2 workers: 50 prompts (the odd one out is logged)
    ],
)
def test_every_validation_prompt_is_in_a_batch(num_val, val_batch_size, world_size, sizes):
    config = compose_ppo_config(
        [
            f"data.num_val_examples={num_val}",
            f"data.val_batch_size={'null' if val_batch_size is None else val_batch_size}",
            f"data.train_batch_size={16 * world_size}",
        ]
    )
    data = build_data(config, world_size)
    assert [len(batch) for batch in data.val_batches] == sizes
    indices = [int(i) for batch in data.val_batches for i in batch.non_tensor_batch["index"]]
    assert len(set(indices)) == sum(sizes)  # no prompt twice


def _data_file(tmp_path, num_rows, null_row, long_row):
    """verl's layout (tiny-task rows): ``null_row`` without a ground truth, ``long_row`` a prompt of 12 tokens (the
    tiny tokenizer: one per character and a BOS), longer than the embedded run's data.max_prompt_length=8."""
    import pandas as pd

    rows = []
    for index in range(num_rows):
        prompt = "1234567890=" if index == long_row else f"{index % 1000:03d}="
        answer = None if index == null_row else prompt[:-1][::-1]
        rows.append(
            {
                "data_source": "tiny_task",
                "prompt": [{"role": "user", "content": prompt}],
                "reward_model": {"ground_truth": answer},
            }
        )
    path = tmp_path / "train.parquet"
    pd.DataFrame(rows).to_parquet(path)
    return path


def test_every_row_is_checked_before_training_and_each_problem_named(tmp_path):
    # the long prompt is the last of 2000 rows: far from the first batch, which was all that was checked before
    path = _data_file(tmp_path, 2000, null_row=5, long_row=1999)
    with pytest.raises(ValueError) as err:
        build_data(compose_ppo_config([f"data.train_files={path}"]), 1)
    message = str(err.value)
    assert message.startswith("2 bad data row(s):"), message
    assert f"{path} row 5, column 'reward_model.ground_truth': the ground truth is null" in message
    assert f"{path} row 1999, column 'prompt': the prompt is 12 tokens, longer than data.max_prompt_length=8" in message
    assert "data.skip_bad_rows=true" in message and "data.filter_overlong_prompts=true" in message


def test_the_keys_that_leave_rows_out_leave_out_only_their_kind(tmp_path, caplog):
    path = _data_file(tmp_path, 40, null_row=5, long_row=39)
    skip = [f"data.train_files={path}", "data.skip_bad_rows=true"]
    # data.skip_bad_rows leaves the null ground truth out; the long prompt is data.filter_overlong_prompts' to drop
    with pytest.raises(ValueError, match=r"^1 bad data row\(s\):\n  - .* row 39, column 'prompt'"):
        build_data(compose_ppo_config(skip), 1)
    with caplog.at_level("WARNING", logger="verl.trainer"):
        data = build_data(compose_ppo_config([*skip, "data.filter_overlong_prompts=true"]), 1)
    assert data.num_train_prompts == 38  # 40 - the null one - the long one
    assert "left out 1 data row(s) that cannot be used, the first: " in caplog.text and "row 5," in caplog.text
    assert "dropped 1 of 39 training prompts longer than data.max_prompt_length=8" in caplog.text


def test_the_training_prompts_are_read_by_dataloader_num_workers_processes():
    # verl's data.dataloader_num_workers (the embedded run's layer sets 0: its 16 prompts need no workers)
    data = build_data(compose_ppo_config(["data.dataloader_num_workers=2"]), 1)
    loader = data.train_loader.loader
    assert loader.num_workers == 2 and loader.dataloader is None
    assert len(next(data.train_loader)) == 16
    assert loader.dataloader.num_workers == 2
    assert build_data(compose_ppo_config([]), 1).train_loader.loader.num_workers == 0
