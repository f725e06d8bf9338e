"""The trainer's batch, timing, throughput and validation metrics, under verl's names and signatures.

:func:`compute_data_metrics` describes a training batch (scores, rewards, advantages, returns, values, lengths:
``critic/score/mean``, ``response_length/clip_ratio``, ...); :func:`compute_timing_metrics` turns the step's phase
timings into ``timing_s/<phase>`` and ``timing_per_token_ms/<phase>``; :func:`compute_throughout_metrics` (verl's
spelling) gives ``perf/total_num_tokens``, ``perf/time_per_step`` and ``perf/throughput``;
:func:`process_validation_metrics` groups validation results by data source and prompt and estimates mean@N,
best@N, worst@N and maj@N by bootstrap, and :func:`validation_metrics` names them as verl's trainer logs them.
:class:`~verl.trainer.ppo.ray_trainer.RayPPOTrainer` logs all of them.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch

from verl.protocol import DataProto

logger = logging.getLogger(__name__)

# the phases whose per-token time counts every token (prompt and response); generation counts the responses only
_ALL_TOKEN_PHASES = ("ref", "values", "adv", "update_critic", "update_actor")


def reduce_metrics(metrics: dict[str, list[Any]]) -> dict[str, float]:
    """The mean of each list of values (NaN for an empty one), as verl's ``reduce_metrics``."""
    return {key: float(np.mean(values)) if len(values) else float("nan") for key, values in metrics.items()}


def _compute_response_info(batch: DataProto) -> dict[str, torch.Tensor]:
    """(B,) float prompt and response lengths in tokens, from the attention mask (or given in the batch)."""
    tensors = batch.batch
    if "prompt_length" in tensors.keys() and "response_length" in tensors.keys():
        return {"prompt_length": tensors["prompt_length"], "response_length": tensors["response_length"]}
    num_response_columns = tensors["responses"].shape[-1]
    attention = tensors["attention_mask"]
    return {
        "prompt_length": attention[:, :-num_response_columns].sum(-1).float(),
        "response_length": attention[:, -num_response_columns:].sum(-1).float(),
    }


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    """``prefix/mean``, ``/max``, ``/min`` of a 1-D tensor; NaN (with a warning) when it is empty."""
    if values.numel() == 0:
        logger.warning("%s: no values in this batch (every response empty or masked); logging NaN", prefix)
        return {f"{prefix}/{name}": float("nan") for name in ("mean", "max", "min")}
    values = values.float()
    return {
        f"{prefix}/mean": values.mean().item(),
        f"{prefix}/max": values.max().item(),
        f"{prefix}/min": values.min().item(),
    }


def _length_stats(prefix: str, lengths: torch.Tensor, max_length: int) -> dict[str, float]:
    metrics = _stats(prefix, lengths)
    clipped = torch.eq(lengths, max_length).float()
    metrics[f"{prefix}/clip_ratio"] = clipped.mean().item() if lengths.numel() else float("nan")
    return metrics


def _value_metrics(values: torch.Tensor, returns: torch.Tensor) -> dict[str, float]:
    """Critic values over the valid tokens, and the explained variance 1 - Var(G - V) / Var(G)."""
    metrics = _stats("critic/values", values)
    if values.numel() == 0:
        metrics["critic/vf_explained_var"] = float("nan")
    else:
        explained = 1.0 - torch.var(returns - values) / (torch.var(returns) + 1e-5)
        metrics["critic/vf_explained_var"] = explained.item()
    return metrics


def compute_data_metrics(batch: DataProto, use_critic: bool = True) -> dict[str, Any]:
    """Statistics of a scored training batch, verl's names.

    Scores and rewards are per sequence (sums over tokens), over the samples with a non-empty response;
    advantages, returns and values over the valid response tokens. Lengths in tokens, with ``clip_ratio`` the share
    at the padded maximum; ``response/aborted_ratio`` is the share of empty responses, and
    ``response_length_non_aborted/*`` leaves them out. ``num_turns/*`` and ``tool_call_counts/*`` when the batch
    has those non-tensor keys.

    Args:
        batch: tensors ``token_level_scores``, ``token_level_rewards``, ``advantages``, ``returns``,
            ``response_mask`` (B, R), ``prompts`` (B, P), ``responses`` (B, R), ``attention_mask`` (B, P+R), and
            ``values`` (B, R) with ``use_critic``.
        use_critic: add ``critic/values/*`` and ``critic/vf_explained_var``.
    """
    tensors = batch.batch
    mask = tensors["response_mask"].bool()
    info = _compute_response_info(batch)
    prompt_length, response_length = info["prompt_length"], info["response_length"]
    answered = response_length > 0
    valid_returns = torch.masked_select(tensors["returns"], mask)
    metrics: dict[str, Any] = {}
    metrics.update(_stats("critic/score", tensors["token_level_scores"].sum(-1)[answered]))
    metrics.update(_stats("critic/rewards", tensors["token_level_rewards"].sum(-1)[answered]))
    metrics.update(_stats("critic/advantages", torch.masked_select(tensors["advantages"], mask)))
    metrics.update(_stats("critic/returns", valid_returns))
    if use_critic:
        metrics.update(_value_metrics(torch.masked_select(tensors["values"], mask), valid_returns))
    max_response, max_prompt = tensors["responses"].shape[-1], tensors["prompts"].shape[-1]
    metrics.update(_length_stats("response_length", response_length, max_response))
    metrics.update(_length_stats("response_length_non_aborted", response_length[answered], max_response))
    metrics["response/aborted_ratio"] = (~answered).float().mean().item()
    metrics.update(_length_stats("prompt_length", prompt_length, max_prompt))
    for key, name in (("__num_turns__", "num_turns"), ("tool_call_counts", "tool_call_counts")):
        if key in batch.non_tensor_batch:
            counts = np.asarray(batch.non_tensor_batch[key], dtype=np.float64)
            metrics.update({f"{name}/min": counts.min(), f"{name}/max": counts.max(), f"{name}/mean": counts.mean()})
    return metrics


def compute_timing_metrics(batch: DataProto, timing_raw: dict[str, float]) -> dict[str, Any]:
    """``timing_s/<phase>`` for every timed phase, and ``timing_per_token_ms/<phase>``: generation per response
    token, ``ref``, ``values``, ``adv``, ``update_critic`` and ``update_actor`` per token of the whole batch
    (0 when there is none)."""
    info = _compute_response_info(batch)
    num_response_tokens = info["response_length"].sum().item()
    num_tokens = info["prompt_length"].sum().item() + num_response_tokens
    per_phase = {"gen": num_response_tokens, **dict.fromkeys(_ALL_TOKEN_PHASES, num_tokens)}
    metrics: dict[str, Any] = {f"timing_s/{name}": seconds for name, seconds in timing_raw.items()}
    for name in per_phase.keys() & timing_raw.keys():
        count = per_phase[name]
        metrics[f"timing_per_token_ms/{name}"] = timing_raw[name] * 1000 / count if count > 0 else 0.0
    return metrics


def compute_throughout_metrics(batch: DataProto, timing_raw: dict[str, float], n_gpus: int) -> dict[str, Any]:
    """``perf/total_num_tokens`` (the sum of ``meta_info["global_token_num"]``, every sample's tokens),
    ``perf/time_per_step`` (``timing_raw["step"]``) and ``perf/throughput``: tokens per second per device."""
    total = sum(batch.meta_info["global_token_num"])
    seconds = timing_raw["step"]
    return {
        "perf/total_num_tokens": total,
        "perf/time_per_step": seconds,
        "perf/throughput": total / (seconds * n_gpus),
    }


def bootstrap_metric(
    data: list[Any],
    subset_size: int,
    reduce_fns: list[Callable[[np.ndarray], float]],
    n_bootstrap: int = 1000,
    seed: int = 42,
) -> list[tuple[float, float]]:
    """(mean, std) of each ``reduce_fn`` over ``n_bootstrap`` resamples (with replacement) of ``subset_size`` items.

    Raises:
        ValueError: ``data`` is empty.
    """
    if len(data) == 0:
        raise ValueError("bootstrap_metric needs at least one data point; got an empty list.")
    # a generator of its own, seeded as verl seeds the global one: the same draws, and the global state untouched
    generator = np.random.RandomState(seed)
    items = np.array(data, dtype=object)
    indices = generator.choice(len(items), size=(n_bootstrap, subset_size), replace=True)
    results = []
    for reduce_fn in reduce_fns:
        values = np.array([reduce_fn(items[row]) for row in indices], dtype=np.float64)
        results.append((float(values.mean()), float(values.std())))
    return results


def calc_maj_val(data: list[dict[str, Any]], vote_key: str, val_key: str) -> float:
    """The ``val_key`` of the first item whose ``vote_key`` is the most common (the first such on a tie)."""
    by_vote: dict[Any, list[Any]] = defaultdict(list)
    for item in data:
        by_vote[item[vote_key]].append(item[val_key])
    majority = max(by_vote, key=lambda vote: len(by_vote[vote]))
    return by_vote[majority][0]


def _sample_sizes(num_responses: int) -> list[int]:
    """2, 4, 8, ... below ``num_responses``, then ``num_responses`` itself; [] for a single response."""
    if num_responses <= 1:
        return []
    sizes, n = [], 2
    while n < num_responses:
        sizes.append(n)
        n *= 2
    return sizes + [num_responses]


def _prompt_metrics(values: list[Any], preds: list[Any] | None, seed: int) -> dict[str, float]:
    """mean@N, std@N and the bootstrap best@n / worst@n / maj@n of one prompt's N values of one variable."""
    num = len(values)
    metrics = {f"mean@{num}": float(np.mean(values))}
    if num < 2:
        return metrics
    metrics[f"std@{num}"] = float(np.std(values))
    for n in _sample_sizes(num):
        (best_mean, best_std), (worst_mean, worst_std) = bootstrap_metric(values, n, [np.max, np.min], seed=seed)
        metrics.update({f"best@{n}/mean": best_mean, f"best@{n}/std": best_std})
        metrics.update({f"worst@{n}/mean": worst_mean, f"worst@{n}/std": worst_std})
        if preds is not None:
            votes = [{"val": value, "pred": pred} for value, pred in zip(values, preds, strict=True)]
            vote = partial(calc_maj_val, vote_key="pred", val_key="val")
            [(maj_mean, maj_std)] = bootstrap_metric(votes, n, [vote], seed=seed)
            metrics.update({f"maj@{n}/mean": maj_mean, f"maj@{n}/std": maj_std})
    return metrics


def process_validation_metrics(
    data_sources: list[str], sample_uids: list[str], infos_dict: dict[str, list[Any]], seed: int = 42
) -> dict[str, dict[str, dict[str, float]]]:
    """``{data_source: {variable: {metric: value}}}``, each metric averaged over the data source's prompts.

    Samples are grouped by data source and prompt (``sample_uids``); for each numeric variable of ``infos_dict``
    (one value per sample; string variables are skipped) a prompt with N responses gives ``mean@N``, and with
    N > 1 ``std@N`` and, for n = 2, 4, ... and N, ``best@n/mean``, ``best@n/std``, ``worst@n/...`` and, when
    ``infos_dict`` has ``pred``, ``maj@n/...`` (the value of the majority answer), estimated by bootstrap.
    """
    grouped: dict[str, dict[str, dict[str, list[Any]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for index, source in enumerate(data_sources):
        for name, values in infos_dict.items():
            grouped[source][sample_uids[index]][name].append(values[index])
    collected: dict[str, dict[str, dict[str, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    for source, by_uid in grouped.items():
        for variables in by_uid.values():
            preds = variables.get("pred")
            for name, values in variables.items():
                if not values or isinstance(values[0], str):
                    continue
                for metric, value in _prompt_metrics(values, preds, seed).items():
                    collected[source][name][metric].append(value)
    return {
        source: {
            name: {metric: float(np.mean(vals)) for metric, vals in metrics.items()}
            for name, metrics in by_name.items()
        }
        for source, by_name in collected.items()
    }


def validation_metrics(data_sources: list, sample_uids: list, infos: dict[str, list]) -> dict[str, float]:
    """verl's ``val-core/`` and ``val-aux/`` names for :func:`process_validation_metrics`'s results: core are the
    mean, maj and best of the core variable (``acc`` if present, else ``reward``) at the largest N."""
    metrics: dict[str, float] = {}
    for source, by_var in process_validation_metrics(data_sources, sample_uids, infos).items():
        core = "acc" if "acc" in by_var else "reward"
        for var, by_metric in by_var.items():
            n_max = max(int(name.split("@")[-1].split("/")[0]) for name in by_metric)
            for name, value in by_metric.items():
                is_core = var == core and name.startswith(("mean", "maj", "best")) and f"@{n_max}" in name
                metrics[f"{'val-core' if is_core else 'val-aux'}/{source}/{var}/{name}"] = value
    return metrics


def slowest_rank(metrics: dict[str, Any]) -> dict[str, float]:
    """Per-rank timings gathered by the worker group (a value or a list per key) -> the slowest rank's."""
    return {key: max(value) if isinstance(value, list) else float(value) for key, value in metrics.items()}
