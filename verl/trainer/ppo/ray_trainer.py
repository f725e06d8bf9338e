"""RayPPOTrainer: the driver's loop — rollout, log-probs, reward, advantages, updates, metrics, checkpoints.

One obvious loop (:meth:`RayPPOTrainer.fit`); each step is :meth:`RayPPOTrainer.train_step`. The driver holds no
model: worker groups do the heavy work and DataProto carries the batch between them; where a step's samples come
from is its rollout source (:mod:`verl.trainer.ppo.rollout_source`). Checkpoints (written atomically, resumed,
pruned, and the save a stop signal asks for between two steps) are :class:`~verl.trainer.ppo.trainer_checkpoints.
CheckpointMixin`; validation is :class:`~verl.trainer.ppo.trainer_validation.ValidationMixin`.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl.protocol import DataProto
from verl.trainer.console import StepProgress
from verl.trainer.ppo.balance import actor_data_parallel_size, balance_batch
from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_kl_controller, kl_penalty
from verl.trainer.ppo.dynamic_sampling import keep_informative_groups
from verl.trainer.ppo.metric_utils import (
    compute_data_metrics,
    compute_throughout_metrics,
    compute_timing_metrics,
    slowest_rank,
)
from verl.trainer.ppo.reward_errors import reward_function_error
from verl.trainer.ppo.rollout_corr import compute_mismatch_metrics
from verl.trainer.ppo.rollout_corr_helper import apply_bypass_mode, compute_rollout_correction_and_rejection_mask
from verl.trainer.ppo.rollout_source import AgentLoopRollout, AsyncRollout
from verl.trainer.ppo.skip_rollout import colocated_rollout
from verl.trainer.ppo.trainer_checkpoints import CheckpointMixin
from verl.trainer.ppo.trainer_validation import ValidationMixin, decoded_samples  # noqa: F401 (re-exported)
from verl.trainer.ray_setup import WorkerGroups
from verl.utils.profiler import StepSchedule
from verl.utils.torch_functional import masked_mean
from verl.utils.tracking import Tracking
from verl.workers.actor.base import UPDATE_READS
from verl.workers.config import PPOConfig
from verl.workers.config.plan import RunPlan, build_run_plan
from verl.workers.critic.base import CRITIC_UPDATE_READS, VALUE_KEYS
from verl.workers.reward_model import rm_score_inputs
from verl.workers.update_outcome.result import UpdateResult, merge_rank_results

logger = logging.getLogger("verl.trainer")


def apply_kl_penalty(batch: DataProto, kl_ctrl, kl_penalty_type: str) -> dict[str, float]:
    """``token_level_rewards = token_level_scores - beta * KL(old || ref)`` per response token, in place.

    The KL estimate per token (``kl_penalty_type``, masked to the response) is taken between the policy that
    sampled the batch (``old_log_probs``) and the reference (``ref_log_prob``); beta is the controller's current
    coefficient, which an adaptive controller then moves by the batch's mean KL (the per-sequence token mean,
    averaged over sequences).

    Returns:
        ``actor/reward_kl_penalty`` (that mean KL) and ``actor/reward_kl_penalty_coeff`` (the beta used).
    """
    beta = float(kl_ctrl.value)
    rewards, kld = kl_penalized_rewards(batch, beta, kl_penalty_type)
    batch.batch["token_level_rewards"] = rewards
    current_kl = masked_mean(kld, batch.batch["response_mask"], axis=-1).mean().item()
    kl_ctrl.update(current_kl=current_kl, n_steps=len(batch))
    return {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}


def kl_penalized_rewards(batch: DataProto, beta: float, kl_penalty_type: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(``token_level_scores - beta * KL(old || ref)``, the masked per-token KL), both (B, R); nothing is changed."""
    tensors = batch.batch
    kld = kl_penalty(tensors["old_log_probs"], tensors["ref_log_prob"], kl_penalty_type) * tensors["response_mask"]
    return tensors["token_level_scores"] - beta * kld, kld


def only_keys(batch: DataProto, keys: list[str]) -> DataProto:
    """What a worker call reads of ``batch``: the tensors of ``keys`` that it has, its meta_info, no non-tensors.

    Every call ships its argument to each rank, so what the worker would not read is left behind (the prompt
    texts, scores, rewards, returns, ...).
    """
    present = [key for key in keys if key in batch.batch.keys()]
    return batch.select(batch_keys=present, non_tensor_batch_keys=[])


def mean_over_ranks(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """Average each metric over the ranks that reported it."""
    values: dict[str, list[float]] = defaultdict(list)
    for metrics in per_rank:
        for key, value in metrics.items():
            values[key].append(float(value))
    return {key: sum(v) / len(v) for key, v in values.items()}


def _has_none(values) -> bool:
    return any(value is None for value in values)


@dataclass(frozen=True)
class TrainerRun:
    """Where one attempt of the run stands when its trainer is built.

    Attributes:
        total_training_steps: how many steps :meth:`RayPPOTrainer.fit` runs.
        resume_from: the checkpoint to resume from, chosen and verified before the workers started (None: fresh).
        restarts: how many times the run rebuilt its workers after one died before this trainer; logged with every
            step as ``trainer/restarts``.
        stop_signals: the driver's :class:`~verl.trainer.preemption.StopSignals`, asked between steps (None: the
            loop never stops early).
        plan: the run plan (:func:`~verl.workers.config.plan.build_run_plan`, device resolved): its sizes and test
            frequency drive the loop, and each checkpoint saves it as ``run_plan.json``; None: built from the config.
    """

    total_training_steps: int
    resume_from: Path | None = None
    restarts: int = 0
    stop_signals: Any = None
    plan: RunPlan | None = None


class RayPPOTrainer(CheckpointMixin, ValidationMixin):
    """The PPO/GRPO training loop.

    Args:
        config: the whole validated trainer config.
        groups: the run's worker groups (:class:`~verl.trainer.ray_setup.WorkerGroups`): the reward model's
            ``rm_scores`` are the training scores in place of the reward function's, as in verl; a rollout group of
            its own (``actor_rollout_ref.hybrid_engine=false``) generates ahead of the trainer within
            ``async_training`` (:class:`~verl.trainer.ppo.rollout_source.AsyncRollout`).
        data: the prompts and how they are scored (:class:`~verl.trainer.data_setup.TrainingData`): ``train_loader``
            (yields prompt batches forever, with ``state_dict``/``load_state_dict``), ``val_batches`` (possibly
            empty), ``reward_fn`` (DataProto -> token-level scores (B, R)) and ``tokenizer`` (decodes the
            validation samples ``trainer.log_val_generations`` logs; None: none logged).
        tracker: the metric sinks.
        run: the step count, the checkpoint to resume from, the restarts so far and the stop signals.
    """

    def __init__(self, config: PPOConfig, groups: WorkerGroups, data, tracker: Tracking, run: TrainerRun):
        self.config = config
        self.groups = groups
        self.train_loader = data.train_loader
        self.val_batches = data.val_batches
        self.reward_fn = data.reward_fn
        self.tokenizer = data.tokenizer
        self.tracker = tracker
        self.total_training_steps = run.total_training_steps
        self.resume_from = run.resume_from
        self.restarts = run.restarts
        self.stop_signals = run.stop_signals
        self.plan = run.plan if run.plan is not None else build_run_plan(config)
        self.global_step = 0
        self.last_checkpoint: Path | None = None
        self.last_metrics: dict[str, float] = {}
        # the last step's merged result of each trained role: what the run's summary counts
        self.update_results: dict[str, UpdateResult] = {}
        self.roles = ("actor", "critic") if groups.has_critic else ("actor",)
        self.kl_ctrl = get_kl_controller(config.algorithm.kl_ctrl) if config.algorithm.use_kl_in_reward else None
        self.rollout_source = self._rollout_source()

    def _rollout_source(self):
        """Where the steps' samples come from: the actor workers (replayed from dumps on the steps ``skip.rollout``
        lists), or the rollout group of its own."""
        if self.config.actor_rollout_ref.rollout.multi_turn.enable:
            return self._agent_loop_rollout()
        if not self.groups.has_rollout_group:
            groups = self.groups
            with_values = None
            if groups.values_ride_with_log_probs:  # the critic in the actor's processes: one call for both
                with_values = groups.actor_process.generate_with_log_probs_and_values
            return colocated_rollout(
                self.actor_wg, self.train_loader, self.config, lambda: self.global_step + 1, with_values
            )
        rules = self.config.async_training
        return AsyncRollout(
            self.rollout_wg,
            self.actor_wg,
            self.train_loader,
            staleness_threshold=rules.staleness_threshold,
            trigger_parameter_sync_step=rules.trigger_parameter_sync_step,
            rollout_n=self.config.actor_rollout_ref.rollout.n,
            partial_rollout=rules.partial_rollout,
            wait_timeout_s=self.config.trainer.collective_timeout_s,
        )

    def _agent_loop_rollout(self):
        """verl's agent loops on the actor workers' rollout (``rollout.multi_turn.enable``); the critic's values,
        when any, are computed after them."""
        from verl.experimental.agent_loop.manager import AgentLoopManager

        tokenizer = self.tokenizer
        if tokenizer is None:
            from verl.models.loading import load_tokenizer

            model = self.config.actor_rollout_ref.model
            tokenizer = load_tokenizer(model.tokenizer_path or model.path, model.trust_remote_code)
        return AgentLoopRollout(
            self.actor_wg, self.train_loader, AgentLoopManager(self.config, self.actor_wg, tokenizer)
        )

    @property
    def actor_wg(self):
        """The actor (+ rollout, + reference) worker group."""
        return self.groups.actor_rollout_ref

    @property
    def critic_wg(self):
        """The critic worker group, or None."""
        return self.groups.critic

    @property
    def reward_model_wg(self):
        """The reward-model worker group, or None."""
        return self.groups.reward_model

    @property
    def rollout_wg(self):
        """The rollout worker group of its own, or None."""
        return self.groups.rollout

    # ------------------------------------------------------------------ the loop

    def fit(self) -> dict[str, float]:
        """Train for ``total_training_steps`` steps (from the resumed step, if any); returns the last metrics.

        Raises:
            Preempted: a stop signal arrived; the steps it let finish are saved (see :meth:`stop_if_asked`).
            CheckpointWriteError: a checkpoint could not be written.
        """
        self.maybe_resume()
        self.rollout_source.start(steps_to_train=self.total_training_steps - self.global_step)
        # Every step appears once in metrics.jsonl: after a resume, the rows of steps that run again go; a fresh
        # start in a directory with an earlier run's rows moves that file aside (nothing is deleted).
        if self.last_checkpoint is not None:
            self.tracker.truncate_after(self.global_step)
        else:
            self.tracker.set_aside_earlier_rows()
        trainer_cfg = self.config.trainer
        last: dict[str, float] = {}
        if trainer_cfg.val_before_train and self.plan.test_freq > 0 and self.val_batches and self.global_step == 0:
            last = self.validate()
            self.tracker.log(last, step=0)
        with StepProgress(self.total_training_steps, self.global_step, trainer_cfg.progress_bar) as progress:
            return self._fit_steps(progress) or last

    def _fit_steps(self, progress: StepProgress) -> dict[str, float]:
        """The steps of :meth:`fit` from ``global_step`` on; returns the last step's metrics ({} when none ran)."""
        trainer_cfg = self.config.trainer
        last: dict[str, float] = {}
        profiling = StepSchedule(self.config.global_profiler, self.total_training_steps)
        while self.global_step < self.total_training_steps:
            self.stop_if_asked()
            if self.stop_signals is not None:
                self.stop_signals.step_in_progress = self.global_step + 1
            self._profile(profiling, self.global_step + 1, start=True)
            metrics = self.train_step(self.rollout_source.next_prompts())
            self._profile(profiling, self.global_step + 1, start=False)
            metrics["trainer/restarts"] = float(self.restarts)
            self.global_step += 1
            is_last = self.global_step == self.total_training_steps
            if (
                self.plan.test_freq > 0
                and self.val_batches
                and (self.global_step % self.plan.test_freq == 0 or is_last)
            ):
                metrics.update(self.validate())
            self.tracker.log(metrics, step=self.global_step)
            if trainer_cfg.save_freq > 0 and (self.global_step % trainer_cfg.save_freq == 0 or is_last):
                self.save_checkpoint()
            progress.step(
                reward=f"{metrics.get('critic/score/mean', float('nan')):.3f}",
                failed=self.update_results["actor"].num_failed_total if "actor" in self.update_results else 0,
            )
            last = metrics
            self.last_metrics = metrics
        return last

    def _profile(self, schedule: StepSchedule, step: int, *, start: bool) -> None:
        """Open (before ``step``) or close (after it) a profiling window on the profiled worker groups."""
        if not (schedule.starts_at(step) if start else schedule.stops_at(step)):
            return
        for group in (self.actor_wg, self.critic_wg):
            if group is None:
                continue
            if start:
                group.start_profile(step)
            else:
                written = [path for paths in group.stop_profile(schedule.is_last(step)) for path in paths]
                if written:
                    logger.info("profile of step %d: %s", step, ", ".join(written))

    # ------------------------------------------------------------------ the run's summary

    def update_counts(self) -> dict[str, tuple[int, int]]:
        """(updates applied, updates skipped) of each trained role over the whole run, resumed parts included."""
        return {
            role: (result.num_applied_total, result.num_failed_total)
            for role, result in self.update_results.items()
            if role in self.roles
        }

    def final_summary(self) -> str:
        keys = ("critic/score/mean", "val/score/mean", "actor/update_failures_total", "actor/loss_scale")
        return ", ".join(f"{k}={self.last_metrics[k]:.4g}" for k in keys if k in self.last_metrics)

    def log_update_summary(self) -> None:
        """One line of updates applied and skipped per role; a warning, with the reason, for a role that never
        applied one (a run can end with exit 0 and an untrained model: say so)."""
        counts = self.update_counts()
        if not counts:
            return
        logger.info(
            "updates over the run: %s",
            "; ".join(f"{role} {applied} applied, {skipped} skipped" for role, (applied, skipped) in counts.items()),
        )
        for role, (applied, skipped) in counts.items():
            if applied == 0 and skipped > 0:
                logger.warning("%s: no update was applied in this run. %s", role, self._why_nothing_applied(role))

    def _why_nothing_applied(self, role: str) -> str:
        section = self.config.actor_rollout_ref.actor if role == "actor" else self.config.critic
        key = "actor_rollout_ref.actor" if role == "actor" else "critic"
        scale = self.last_metrics.get(f"{role}/loss_scale")
        if section.dtype == "float16" and scale is not None and scale > section.optim.min_loss_scale:
            return (
                f"The fp16 loss scale was still backing off (now {scale:g}, from {key}.optim.initial_loss_scale="
                f"{section.optim.initial_loss_scale:g}): run more steps, or start lower, e.g. "
                f"{key}.optim.initial_loss_scale=65536."
            )
        return (
            "Every update had non-finite gradients with no loss scale left to back off: check the data, "
            f"{key}.optim.lr and {key}.dtype (bfloat16 or float32 rule out fp16 overflow)."
        )

    @contextmanager
    def _timed(self, timing: dict[str, float], name: str):
        start = time.perf_counter()
        yield
        timing[name] = timing.get(name, 0.0) + time.perf_counter() - start  # a phase may run more than once

    def train_step(self, prompts: DataProto) -> dict[str, float]:
        """One RL step on a batch of prompts; returns its metrics."""
        cfg = self.config
        timing: dict[str, float] = {}
        step_start = time.perf_counter()
        prompt_texts = list(prompts.non_tensor_batch.get("raw_prompt", []))
        self._pop_call_overheads()  # calls made between steps (validation, checkpoints) are not this step's
        metrics: dict[str, float] = {}
        batch = self._generate_and_score(prompts, timing)
        if cfg.algorithm.filter_groups.enable:  # DAPO's dynamic sampling: uniform groups out, more prompts in

            def generate_more() -> DataProto:
                more = next(self.train_loader)
                prompt_texts.extend(more.non_tensor_batch.get("raw_prompt", []))
                return self._generate_and_score(more, timing)

            batch, filter_metrics = keep_informative_groups(
                batch, cfg.algorithm.filter_groups, self.plan.train_batch_size, generate_more
            )
            metrics.update(filter_metrics)
        if cfg.trainer.balance_batch:  # as in verl: each data-parallel rank gets about the same number of tokens
            metrics.update(balance_batch(batch, actor_data_parallel_size(cfg)))
        if self.critic_wg is not None and not self.rollout_source.carries_values:
            with self._timed(timing, "values"):
                batch = batch.union(self.critic_wg.compute_values(only_keys(batch, VALUE_KEYS)))
        if self.kl_ctrl is not None:  # the same rewards as the round's, and the controller moves once a step
            metrics.update(apply_kl_penalty(batch, self.kl_ctrl, cfg.algorithm.kl_penalty))
        # as in verl: weights and rejection before the advantages, so that rejected tokens are out of both
        metrics.update(self.correct_for_mismatch(batch))
        with self._timed(timing, "adv"):
            self.compute_advantage(batch)
        if self.critic_wg is not None:
            with self._timed(timing, "update_critic"):
                critic = self._record_update(self.critic_wg.update_critic(only_keys(batch, CRITIC_UPDATE_READS)))
            metrics.update(critic.metrics)
        actor_updated = False
        # verl's rule, with its 1-based step: the actor starts updating at step critic_warmup (0 and 1: at once)
        if self.global_step + 1 >= cfg.trainer.critic_warmup or self.critic_wg is None:
            with self._timed(timing, "update_actor"):
                actor = self._record_update(self.actor_wg.update_actor(only_keys(batch, UPDATE_READS)))
            metrics.update(actor.metrics)
            actor_updated = actor.updated
        timing["step"] = time.perf_counter() - step_start
        metrics.update(self.rollout_source.batch_metrics(batch, timing["step"], timing.get("wait_prev_gen", 0.0)))
        metrics.update(self.rollout_source.after_update(actor_updated))
        metrics.update(self.batch_metrics(batch, timing, use_critic=self.critic_wg is not None))
        metrics.update(self._pop_call_overheads())
        metrics["data/batch_fingerprint"] = float(zlib.crc32("\n".join(map(str, prompt_texts)).encode()))
        return metrics

    def _record_update(self, per_rank: list[UpdateResult]) -> UpdateResult:
        """The ranks' results of one model's update merged (metrics averaged over ranks), kept for the summary."""
        result = merge_rank_results(per_rank, mean_over_ranks)
        self.update_results[result.role] = result
        return result

    def _generate_and_score(self, prompts: DataProto, timing: dict[str, float]) -> DataProto:
        """One generation round: each prompt gets a group id (``uid``); one worker call generates and computes the
        old and reference log-probs the run needs (timed by the worker); then the scores (``token_level_scores``) and
        the rewards (``token_level_rewards``). Timings add up over the rounds of a step."""
        batch = self.rollout_source.generate(prompts, timing)  # each prompt gets its group id there
        for name, seconds in slowest_rank(batch.meta_info.pop("metrics")).items():
            name = name.removeprefix("timing_s/")
            timing[name] = timing.get(name, 0.0) + seconds
        with self._timed(timing, "reward"):
            if self.reward_model_wg is not None:
                batch = batch.union(self.reward_model_wg.compute_rm_score(rm_score_inputs(batch)))
            batch.batch["token_level_scores"] = self.score(batch)
        self.use_rollout_log_probs_as_old(batch)
        # the final rewards, which DAPO's filter may compare (seq_final_reward): with a KL penalty in the reward, at
        # the step's coefficient (the step applies it again once the batch is complete, and moves the controller)
        rewards = batch.batch["token_level_scores"]
        if self.kl_ctrl is not None:
            rewards, _ = kl_penalized_rewards(batch, float(self.kl_ctrl.value), self.config.algorithm.kl_penalty)
        batch.batch["token_level_rewards"] = rewards
        return batch

    def score(self, batch: DataProto, validation: bool = False) -> torch.Tensor:
        """Token-level scores (B, R) of the batch's responses; each extra entry of the reward function's result
        (what a scorer returns besides ``score``, one value per sample) goes into ``batch.non_tensor_batch``, as in
        verl, where GDPO's reward components and ``algorithm.filter_groups.metric`` find it. A batch scored by
        the reward model (``rm_scores``) takes those scores as they are, and the reward function is not called:
        verl's reward managers return ``rm_scores`` when the batch has them.

        Raises:
            RewardFunctionError: the reward function raised; it names the step, the sample and its data row.
        """
        if "rm_scores" in batch.batch.keys():
            batch.meta_info["reward_extra_keys"] = []
            return batch.batch["rm_scores"]
        try:
            result = self.reward_fn(batch, return_dict=True)
        except Exception as err:  # the user's code: say where it failed (validation prompts have no file rows here)
            step = self.global_step if validation else self.global_step + 1
            prompts = None if validation else self.train_loader
            raise reward_function_error(err, batch, step, prompts, validation) from err
        if not isinstance(result, dict):
            return result
        added = []
        for key, values in result.get("reward_extra_info", {}).items():
            if len(values) == len(batch):
                batch.non_tensor_batch[key] = np.asarray(values, dtype=object if _has_none(values) else None)
                added.append(key)
        batch.meta_info["reward_extra_keys"] = added
        return result["reward_tensor"]

    def _pop_call_overheads(self) -> dict[str, float]:
        """``timing_s/overhead/<method>``: seconds of each worker call beyond the work itself, summed over the calls
        since the last pop (splitting the batch, moving it to the workers and back, merging the results)."""
        overheads: dict[str, float] = {}
        if self.rollout_wg is not None:
            self.rollout_wg.pop_call_timings()  # its calls overlap the step: their wall time is not overhead
        for group in (self.groups.actor_process, self.actor_wg, self.critic_wg, self.reward_model_wg):
            if group is None:
                continue
            for method, calls in group.pop_call_timings().items():
                overheads[f"timing_s/overhead/{method}"] = sum(call.overhead_s for call in calls)
        return overheads

    def use_rollout_log_probs_as_old(self, batch: DataProto) -> None:
        """Bypass mode (or ``actor.use_rollout_log_probs``): the rollout's log-probs become the old ones.

        Raises:
            ValueError: the rollout returned no log-probs.
        """
        if not self.config.uses_rollout_log_probs_as_old:
            return
        apply_bypass_mode(batch)

    def correct_for_mismatch(self, batch: DataProto) -> dict[str, float]:
        """The engine-vs-trainer metrics, and ``algorithm.rollout_correction`` applied to the batch.

        With a separate old-log-prob pass (verl's decoupled mode): the ``training/`` and ``rollout_corr/`` metrics,
        and, when asked, ``rollout_is_weights`` added and rejected tokens taken out of ``response_mask``. In bypass
        mode the settings go to the actor (``meta_info["rollout_correction"]``), whose loss corrects against the
        current policy and reports the metrics; so does a single on-policy update without an old-log-prob pass,
        against its first forward.

        Raises:
            ValueError: correction asked for, and the rollout returned no log-probs.
        """
        correction, tensors = self.config.algorithm.rollout_correction, batch.batch
        if "rollout_log_probs" not in tensors.keys():
            if correction.enabled:
                raise ValueError(
                    "algorithm.rollout_correction needs the rollout's own log-probs, and this rollout returned none."
                )
            return {}
        if correction.bypass_mode:
            batch.meta_info["rollout_correction"] = correction.to_dict()
            return {}
        if self.config.uses_rollout_log_probs_as_old or "old_log_probs" not in tensors.keys():
            return {}
        mask = tensors["response_mask"]
        metrics = compute_mismatch_metrics(tensors["rollout_log_probs"], tensors["old_log_probs"], mask)
        if (correction.rollout_is is None and correction.rollout_rs is None) or not mask.any():
            return metrics
        weights, tensors["response_mask"], corr_metrics = compute_rollout_correction_and_rejection_mask(
            tensors["old_log_probs"],
            tensors["rollout_log_probs"],
            mask,
            rollout_is=correction.rollout_is,
            rollout_is_threshold=correction.rollout_is_threshold,
            rollout_is_batch_normalize=correction.rollout_is_batch_normalize,
            rollout_rs=correction.rollout_rs,
            rollout_rs_threshold=correction.rollout_rs_threshold,
        )
        if weights is not None:
            tensors["rollout_is_weights"] = weights.batch["rollout_is_weights"]
        return {**metrics, **corr_metrics}

    def compute_advantage(self, batch: DataProto) -> None:
        """Advantages and returns (B, R) from the registered estimator, called as verl calls it.

        GAE gets the values and its constants; every other estimator gets the rewards, the mask, the group ids and
        the ``algorithm`` section as ``config`` (built-ins read ``gamma`` or ``norm_adv_by_std_in_grpo`` from it),
        so that a verl user's estimator written for that call works unchanged. As in verl, ``gdpo`` also gets the
        batch (``batch=``, ``non_tensor_batch=``: the reward components).
        """
        algo = self.config.algorithm
        estimator = get_adv_estimator_fn(algo.adv_estimator)
        tensors = batch.batch
        if algo.adv_estimator == "gae":
            advantages, returns = estimator(
                token_level_rewards=tensors["token_level_rewards"],
                values=tensors["values"],
                response_mask=tensors["response_mask"],
                gamma=algo.gamma,
                lam=algo.lam,
            )
        else:
            advantages, returns = estimator(**self._estimator_kwargs(batch))
        tensors["advantages"] = advantages.float()
        tensors["returns"] = returns.float()

    def _estimator_kwargs(self, batch: DataProto) -> dict[str, Any]:
        name, tensors = self.config.algorithm.adv_estimator, batch.batch
        kwargs = {
            "token_level_rewards": tensors["token_level_rewards"],
            "response_mask": tensors["response_mask"],
            "index": batch.non_tensor_batch["uid"],
            "config": self.config.algorithm,
        }
        if "reward_baselines" in tensors.keys():
            kwargs["reward_baselines"] = tensors["reward_baselines"]
        if name == "gdpo":
            kwargs["non_tensor_batch"] = batch.non_tensor_batch
            kwargs["batch"] = tensors
        return kwargs

    def batch_metrics(self, batch: DataProto, timing: dict[str, float], use_critic: bool) -> dict[str, float]:
        """verl's data, timing and throughput metrics of the step (``metric_utils``), and this trainer's own
        ``perf/num_tokens`` and ``perf/tokens_per_second[/phase]``."""
        tensors = batch.batch
        batch.meta_info["global_token_num"] = tensors["attention_mask"].sum(-1).tolist()
        metrics = compute_data_metrics(batch, use_critic=use_critic)
        metrics.update(compute_timing_metrics(batch, timing))
        metrics.update(compute_throughout_metrics(batch, timing, n_gpus=self.config.world_size))
        num_tokens = float(tensors["attention_mask"].sum())
        metrics["perf/num_tokens"] = num_tokens
        metrics["perf/tokens_per_second"] = num_tokens / max(timing["step"], 1e-9)
        for phase in ("gen", "old_log_prob", "ref", "update_actor"):
            if phase in timing:
                metrics[f"perf/tokens_per_second/{phase}"] = num_tokens / max(timing[phase], 1e-9)
        return metrics
