"""The trainer's data: every validation prompt is validated, in batches of data.val_batch_size."""

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
