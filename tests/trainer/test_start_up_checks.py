"""What is known before Ray starts is said at start-up, first, in our words (issue 51, item 3): a model path that
does not exist (before any other message), a logger whose package is missing, lengths beyond the model's context.

The refusals run :func:`verl.trainer.main_ppo.run` in this process: exit code 2 (bad config), and Ray never started.
"""

import logging

import pytest

from verl.trainer import start_up_checks
from verl.trainer.main_ppo import EXIT_BAD_CONFIG, run
from verl.utils import tracking
from verl.workers.config import compose_omegaconf

KEY = "actor_rollout_ref.model.path"


@pytest.mark.parametrize("path", ["/no/such/model", "./models/mine", "~/no/such/model", "models/a/b"])
def test_a_path_that_is_not_here_is_said_in_our_words(path):
    message = start_up_checks.missing_model_message(KEY, path)
    assert message.startswith(f"{KEY}={path!r} does not exist: there is no such file or directory"), message
    assert "a path is never downloaded" in message and f"{KEY}=default" in message


@pytest.mark.parametrize("path", ["default", None, "Qwen/Qwen3-8B", "gpt2"])
def test_the_embedded_model_and_hub_names_are_left_to_loading(path):
    # a Hub name may be in transformers' cache (or downloaded, as in verl): transformers says what it finds
    assert start_up_checks.missing_model_message(KEY, path) is None


def test_an_existing_directory_passes(tmp_path):
    assert start_up_checks.missing_model_message(KEY, str(tmp_path)) is None


def _run(caplog, tmp_path, overrides):
    import ray

    config = compose_omegaconf([f"trainer.default_local_dir={tmp_path / 'out'}", *overrides])
    with caplog.at_level(logging.ERROR, logger="verl.trainer"):
        code = run(config)
    assert not ray.is_initialized(), "a refused config must not start Ray"
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    return code, errors[0]


def test_a_missing_model_is_the_first_thing_said(caplog, tmp_path):
    # verl's defaults (another model path: no embedded layer) also lack the micro-batch sizes; the path comes first
    code, message = _run(caplog, tmp_path, [f"{KEY}=/no/such/model"])
    assert code == EXIT_BAD_CONFIG
    assert message.startswith(f"Bad config: {KEY}='/no/such/model' does not exist"), message
    assert "micro_batch" not in message and "Repo id" not in message


def test_a_logger_without_its_package_is_refused_at_start_up(caplog, tmp_path, monkeypatch):
    # wandb as if not installed, wherever the test runs
    monkeypatch.setitem(tracking._SINK_MODULES, "wandb", ("no_such_module_for_this_test", "wandb"))
    assert tracking.missing_sink_packages(["console", "jsonl", "wandb"]) == {"wandb": "wandb"}
    code, message = _run(caplog, tmp_path, ["trainer.logger=[console,wandb]"])
    assert code == EXIT_BAD_CONFIG
    assert "trainer.logger=['console', 'wandb']" in message and "wandb (pip install wandb)" in message, message


def test_lengths_beyond_the_models_context_are_refused_with_the_three_numbers(caplog, tmp_path):
    # the embedded tiny model has 64 positions: 1024 + 2048 do not fit
    code, message = _run(caplog, tmp_path, ["data.max_prompt_length=1024", "data.max_response_length=2048"])
    assert code == EXIT_BAD_CONFIG
    assert (
        "data.max_prompt_length=1024 + data.max_response_length=2048 = 3072 tokens is longer than the model's "
        f"context: max_position_embeddings=64 of {KEY}='default'"
    ) in message, message
