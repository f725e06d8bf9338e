"""A reward function that raises mid-run, reported with where: the step, the sample and its row in the data file.

The reward managers name the sample their scoring function failed on
(:class:`~verl.workers.reward_manager.SampleScoringError`: its position in the scored batch); the trainer turns that
position into the prompt's row in its data file through the batch's ``index`` column and the training prompts'
:meth:`~verl.trainer.data_setup.PromptBatches.origin`, and raises :class:`RewardFunctionError` with the original
exception as its cause. ``main_ppo`` adds the last complete checkpoint and how to resume from it.
"""

from __future__ import annotations

from typing import Any

from verl.protocol import DataProto
from verl.workers.reward_manager import SampleScoringError


class RewardFunctionError(RuntimeError):
    """The reward function raised; ``__cause__`` is its own exception, with its traceback.

    Attributes:
        step: the training step being scored (1-based); for a validation, the step it followed (0: before training).
        sample: the sample and its data row, in words ("sample 5 of the step's batch: the prompt at train.jsonl:13
            (row 12) (data_source 'x')").
        validation: True when the validation's samples were being scored.
    """

    def __init__(self, step: int, sample: str, cause: BaseException, validation: bool = False):
        self.step, self.sample, self.validation = step, sample, validation
        when = f"at step {step}"
        if validation:
            when = f"while validating after step {step}" if step else "while validating before the first step"
        detail = cause.__cause__ if isinstance(cause, SampleScoringError) and cause.__cause__ else cause
        super().__init__(f"The reward function raised {when}, on {sample}: {type(detail).__name__}: {detail}")


def reward_function_error(
    err: Exception, batch: DataProto, step: int, prompts: Any = None, validation: bool = False
) -> RewardFunctionError:
    """The :class:`RewardFunctionError` for ``err``, raised by the reward function on ``batch``.

    Args:
        err: what the reward function raised.
        batch: the batch it scored (its ``index`` column: each sample's prompt in the data set).
        step: the step being scored (or, with ``validation``, the step the validation followed).
        prompts: where the batch's prompts come from, with ``origin(index)`` -> ``(file, row, line or None)``
            (:class:`~verl.trainer.data_setup.PromptBatches`); None: unknown.
        validation: the validation's samples were being scored.
    """
    if not isinstance(err, SampleScoringError):
        return RewardFunctionError(step, "a sample its reward manager does not name", err, validation)
    which = "the validation batch" if validation else "the step's batch"
    sample = f"sample {err.position} of {which}"
    row = _data_row(batch, err.position, prompts, "validation" if validation else "training")
    if row:
        sample += f": {row}"
    return RewardFunctionError(step, f"{sample} (data_source {err.data_source!r})", err, validation)


def _data_row(batch: DataProto, position: int, prompts: Any, data_set: str) -> str:
    """Where the sample's prompt comes from, in words ('' when the batch has no ``index``)."""
    indices = batch.non_tensor_batch.get("index")
    if indices is None or not 0 <= position < len(indices):
        return ""
    index = int(indices[position])
    origin = getattr(prompts, "origin", None)
    if origin is None:
        return f"prompt {index} of the {data_set} set"
    try:
        file, row, line = origin(index)
    except (AttributeError, IndexError):  # a data set without origins (verl's constructor): the prompt's place
        return f"prompt {index} of the {data_set} set"
    where = f"{file}:{line} (row {row})" if line is not None else f"{file} row {row}"  # as data errors say it
    return f"the prompt at {where}"
