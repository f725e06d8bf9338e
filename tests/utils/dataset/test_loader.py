"""The prompt loader's worker processes (verl's data.dataloader_num_workers): a torch DataLoader with that many
workers reads and collates the batches, which are the in-process loader's, across epochs and resumes."""

import pytest

from verl.utils.dataset import StatefulPromptLoader, make_tiny_task_dataset


def indices(rows):
    return [row["index"] for row in rows]


def test_workers_give_the_in_process_batches_across_an_epoch_and_a_resume():
    dataset = make_tiny_task_dataset(10, seed=0)
    in_process = StatefulPromptLoader(dataset, batch_size=3, seed=5)
    with_workers = StatefulPromptLoader(dataset, batch_size=3, seed=5, num_workers=2)
    assert with_workers.dataloader is None  # no worker starts before the first batch is asked for
    # 3 batches per epoch (10 // 3, the last row dropped): 5 batches cross into the second epoch
    want = [indices(in_process.next_batch()) for _ in range(5)]
    got = [indices(with_workers.next_batch()) for _ in range(5)]
    assert got == want and with_workers.epoch == 1
    assert with_workers.dataloader.num_workers == 2
    # the second epoch's DataLoader was opened at its start: its 3 batches, 2 of them handed out
    assert len(with_workers.dataloader.batch_sampler) == 3
    # a resume at an earlier position: the batches read ahead are dropped, the saved position's come again
    state = {"epoch": 0, "batch_index": 1, "seed": 5}
    with_workers.load_state_dict(state)
    assert with_workers.dataloader is None
    assert [indices(with_workers.next_batch()) for _ in range(2)] == want[1:3]
    assert len(with_workers.dataloader.batch_sampler) == 2  # batches 1 and 2 of epoch 0


def test_the_same_position_keeps_the_open_loader():
    # a state at the position the loader is at (the async trainer's redraw puts its position back): nothing to drop
    loader = StatefulPromptLoader(make_tiny_task_dataset(10, seed=0), batch_size=3, seed=5, num_workers=1)
    loader.next_batch()
    opened = loader.dataloader
    loader.load_state_dict(loader.state_dict())
    assert loader.dataloader is opened


def test_a_negative_worker_count_is_refused():
    with pytest.raises(ValueError, match=r"num_workers must be 0 or more \(data.dataloader_num_workers\), got -1"):
        StatefulPromptLoader(make_tiny_task_dataset(10, seed=0), batch_size=3, num_workers=-1)
