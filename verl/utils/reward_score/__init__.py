"""Rule-based scorers and the ``data_source`` -> scorer dispatch used by the reward managers.

Each scorer is a plain function ``compute_score(solution_str, ground_truth) -> float``. The default dispatch picks
one by the sample's ``data_source`` (a column of the dataset); users with other data sources plug their own
function in with ``reward_model.custom_score_fn`` (see :mod:`verl.workers.reward_manager`).
"""

from __future__ import annotations

from collections.abc import Callable

from verl.utils.reward_score import gsm8k, tiny_calc, tiny_task

_SCORERS: dict[str, Callable[[str, str], float]] = {
    tiny_task.DATA_SOURCE: tiny_task.compute_score,
    tiny_calc.DATA_SOURCE: tiny_calc.compute_score,
    "gsm8k": gsm8k.compute_score,
    "openai/gsm8k": gsm8k.compute_score,
}


def known_data_sources() -> list[str]:
    """The data sources :func:`default_compute_score` can score, sorted."""
    return sorted(_SCORERS)


def default_compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info=None) -> float:
    """Score one response with the built-in scorer for its data source.

    Args:
        data_source: the dataset's ``data_source`` value for this sample, e.g. ``"tiny_task"``, ``"openai/gsm8k"``.
        solution_str: the decoded response.
        ground_truth: the reference answer.
        extra_info: unused by the built-in scorers; accepted so custom scorers and this one share a signature.

    Raises:
        ValueError: no built-in scorer for ``data_source``; the message lists the known ones.
    """
    scorer = _SCORERS.get(data_source)
    if scorer is None:
        raise ValueError(
            f"No built-in reward scorer for data_source {data_source!r}. Known: {', '.join(known_data_sources())}. "
            "Set the dataset's data_source column to one of these, or supply your own scorer with "
            "reward_model.custom_score_fn=module.path:function_name."
        )
    return float(scorer(solution_str, ground_truth))


__all__ = ["default_compute_score", "known_data_sources", "gsm8k", "tiny_calc", "tiny_task"]
