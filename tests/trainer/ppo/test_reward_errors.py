"""A user's reward function that raises mid-run: the trainer names the step, the sample and its row in the data
file; main_ppo adds the last complete checkpoint and that the same command resumes from it, and exits with 8 and
the function's own traceback."""

import json
import logging

import pytest
import torch

from tests.trainer.test_main_ppo import write_checkpoint
from tests.trainer.test_main_ppo_stops import train, typed
from verl.trainer import main_ppo
from verl.trainer.data_setup import PromptBatches
from verl.trainer.ppo.reward_errors import RewardFunctionError
from verl.utils.dataset import RLHFDataset, StatefulPromptLoader
from verl.workers.reward_manager import NaiveRewardManager


class _Tokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return "42"


def fails_on_ground_truth(bad):
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        if ground_truth == bad:
            raise KeyError("no rule for this answer")
        return 1.0

    return compute_score


def scored_batch(tmp_path):
    """The prompts of a 3-row JSONL file (a blank line before the last), in file order, as the loader batches them,
    with one-token responses."""
    from verl.models.loading import load_tokenizer
    from verl.utils.dataset import PromptCollator

    rows = [{"prompt": f"{n}{n}=", "ground_truth": f"a{n}", "data_source": "mine"} for n in range(3)]
    lines = [json.dumps(rows[0]), json.dumps(rows[1]), "", json.dumps(rows[2])]
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(lines) + "\n")
    collate = PromptCollator(load_tokenizer(), max_prompt_length=8)
    prompts = PromptBatches(
        StatefulPromptLoader(RLHFDataset(str(path)), batch_size=3, shuffle=False, collate_fn=collate)
    )
    batch = next(prompts)
    batch = batch.select(non_tensor_batch_keys=["ground_truth", "data_source", "index"])
    batch.batch["responses"] = torch.ones(3, 1, dtype=torch.long)
    batch.batch["response_mask"] = torch.ones(3, 1, dtype=torch.long)
    return path, prompts, batch


def test_the_trainer_names_the_step_the_sample_and_its_row_in_the_data_file(tmp_path):
    from tests.trainer.ppo.test_ray_trainer import trainer_for

    path, prompts, batch = scored_batch(tmp_path)
    trainer = trainer_for(reward_fn=NaiveRewardManager(_Tokenizer(), compute_score=fails_on_ground_truth("a2")))
    trainer.train_loader, trainer.global_step = prompts, 6
    with pytest.raises(RewardFunctionError) as failed:
        trainer.score(batch)
    # the third prompt is sample 2 of the batch, row 2 of the file, on line 4 (after the blank line 3)
    assert str(failed.value) == (
        f"The reward function raised at step 7, on sample 2 of the step's batch: the prompt at {path}:4 (row 2) "
        "(data_source 'mine'): KeyError: 'no rule for this answer'"
    )
    assert failed.value.step == 7 and isinstance(failed.value.__cause__.__cause__, KeyError)


def test_a_reward_function_error_exits_8_naming_the_checkpoint_and_how_to_resume(tmp_path, monkeypatch, caplog):
    from verl.trainer.ppo.reward_errors import reward_function_error

    path, prompts, batch = scored_batch(tmp_path)
    try:
        NaiveRewardManager(_Tokenizer(), compute_score=fails_on_ground_truth("a0"))(batch)
    except Exception as err:  # the chain the trainer raises: ours, the manager's, the user's KeyError
        try:
            raise reward_function_error(err, batch, 5, prompts) from err
        except RewardFunctionError as ours:
            error = ours
    saved = write_checkpoint(tmp_path / "out", 4)
    code, _, lines, _ = train(monkeypatch, typed(tmp_path), [error], caplog)
    assert code == main_ppo.EXIT_UNEXPECTED_ERROR
    assert lines == (
        "Stopped by an error in the reward function (exit code 8). The reward function raised at step 5, on sample 0 "
        f"of the step's batch: the prompt at {path}:1 (row 0) (data_source 'mine'): KeyError: 'no rule for this "
        f"answer'. Last complete checkpoint: {saved}; once the reward function is fixed, run the same command to "
        "resume from it (trainer.resume_mode=auto). Its traceback:"
    )
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.exc_info[0] is KeyError  # the user's own traceback, not the wrappers'


def test_a_validation_names_when_it_ran_and_the_validation_prompt(tmp_path):
    from tests.trainer.ppo.test_ray_trainer import trainer_for

    _, prompts, batch = scored_batch(tmp_path)
    trainer = trainer_for(reward_fn=NaiveRewardManager(_Tokenizer(), compute_score=fails_on_ground_truth("a1")))
    trainer.train_loader = prompts  # not the validation prompts' loader: no file row is claimed for them
    with pytest.raises(RewardFunctionError) as failed:
        trainer.score(batch, validation=True)
    assert str(failed.value).startswith(
        "The reward function raised while validating before the first step, on sample 1 of the validation batch: "
        "prompt 1 of the validation set (data_source 'mine'): KeyError"
    )
