"""RayPPOTrainer: the driver's loop — rollout, log-probs, reward, advantages, updates, metrics, checkpoints.

One obvious loop (:meth:`RayPPOTrainer.fit`); each step is :meth:`RayPPOTrainer.train_step`. The driver holds no
model: worker groups do the heavy work and DataProto carries the batch between them. Checkpoints are written as
``global_step_N`` directories, atomically, with the actor (and critic) state and the data position.
"""

from __future__ import annotations

import logging
import time
import uuid
import zlib
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_kl_controller, kl_penalty
from verl.trainer.ppo.rollout_corr import compute_mismatch_metrics, compute_rollout_correction
from verl.utils.checkpoint import atomic_directory, load_state, save_state
from verl.utils.torch_functional import masked_mean
from verl.utils.tracking import Tracking
from verl.workers.actor.base import UPDATE_READS
from verl.workers.config import PPOConfig
from verl.workers.critic.base import CRITIC_UPDATE_KEYS, VALUE_KEYS

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
    tensors = batch.batch
    mask = tensors["response_mask"]
    kld = kl_penalty(tensors["old_log_probs"], tensors["ref_log_prob"], kl_penalty_type) * mask
    beta = float(kl_ctrl.value)
    tensors["token_level_rewards"] = tensors["token_level_scores"] - beta * kld
    current_kl = masked_mean(kld, mask, axis=-1).mean().item()
    kl_ctrl.update(current_kl=current_kl, n_steps=len(batch))
    return {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}


def only_keys(batch: DataProto, keys: list[str]) -> DataProto:
    """What a worker call reads of ``batch``: the tensors of ``keys`` that it has, its meta_info, no non-tensors.

    Every call ships its argument to each rank, so what the worker would not read is left behind (the prompt
    texts, scores, rewards, returns, ...).
    """
    present = [key for key in keys if key in batch.batch.keys()]
    return batch.select(batch_keys=present, non_tensor_batch_keys=[])


def slowest_rank(metrics: dict[str, Any]) -> dict[str, float]:
    """Per-rank timings gathered by the worker group (a value or a list per key) -> the slowest rank's."""
    return {key: max(value) if isinstance(value, list) else float(value) for key, value in metrics.items()}


def mean_over_ranks(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """Average each metric over the ranks that reported it."""
    values: dict[str, list[float]] = defaultdict(list)
    for metrics in per_rank:
        for key, value in metrics.items():
            values[key].append(float(value))
    return {key: sum(v) / len(v) for key, v in values.items()}


class RayPPOTrainer:
    """The PPO/GRPO training loop.

    Args:
        config: the whole validated trainer config.
        train_loader: yields prompt batches (DataProto) forever, with ``state_dict``/``load_state_dict``.
        val_batches: validation prompt batches (DataProto), or an empty list.
        reward_fn: DataProto -> token-level scores (B, R).
        actor_wg: the ActorRolloutRef worker group.
        critic_wg: the critic worker group, or None.
        tracker: the metric sinks.
        total_training_steps: how many steps :meth:`fit` runs.
        resume_from: the checkpoint to resume from, chosen and verified before the workers started (None: fresh).
        restarts: how many times the run rebuilt its workers after one died before this trainer; logged with every
            step as ``trainer/restarts``.
    """

    def __init__(
        self,
        config: PPOConfig,
        train_loader,
        val_batches: list[DataProto],
        reward_fn,
        actor_wg,
        critic_wg,
        tracker: Tracking,
        total_training_steps: int,
        resume_from: Path | None = None,
        restarts: int = 0,
    ):
        self.config = config
        self.train_loader = train_loader
        self.val_batches = val_batches
        self.reward_fn = reward_fn
        self.actor_wg = actor_wg
        self.critic_wg = critic_wg
        self.tracker = tracker
        self.total_training_steps = total_training_steps
        self.global_step = 0
        self.last_checkpoint: Path | None = None
        self.last_metrics: dict[str, float] = {}
        self.roles = ("actor", "critic") if critic_wg is not None else ("actor",)
        # the checkpoint to resume from, chosen and verified by the caller before the workers started
        self.resume_from = resume_from
        self.restarts = restarts
        self.kl_ctrl = get_kl_controller(config.algorithm.kl_ctrl) if config.algorithm.use_kl_in_reward else None

    # ------------------------------------------------------------------ the loop

    def fit(self) -> dict[str, float]:
        """Train for ``total_training_steps`` steps (from the resumed step, if any); returns the last metrics."""
        self.maybe_resume()
        # Every step appears once in metrics.jsonl: after a resume, the rows of steps that run again go; a fresh
        # start in a directory with an earlier run's rows moves that file aside (nothing is deleted).
        if self.last_checkpoint is not None:
            self.tracker.truncate_after(self.global_step)
        else:
            self.tracker.set_aside_earlier_rows()
        trainer_cfg = self.config.trainer
        last: dict[str, float] = {}
        if trainer_cfg.val_before_train and trainer_cfg.test_freq > 0 and self.val_batches and self.global_step == 0:
            last = self.validate()
            self.tracker.log(last, step=0)
        progress = tqdm(
            total=self.total_training_steps,
            initial=self.global_step,
            desc="training",
            disable=not trainer_cfg.progress_bar,
            dynamic_ncols=True,
        )
        while self.global_step < self.total_training_steps:
            batch = next(self.train_loader)
            metrics = self.train_step(batch)
            metrics["trainer/restarts"] = float(self.restarts)
            self.global_step += 1
            is_last = self.global_step == self.total_training_steps
            if (
                trainer_cfg.test_freq > 0
                and self.val_batches
                and (self.global_step % trainer_cfg.test_freq == 0 or is_last)
            ):
                metrics.update(self.validate())
            self.tracker.log(metrics, step=self.global_step)
            if trainer_cfg.save_freq > 0 and (self.global_step % trainer_cfg.save_freq == 0 or is_last):
                self.save_checkpoint()
            progress.update(1)
            progress.set_postfix(
                reward=f"{metrics.get('critic/score/mean', float('nan')):.3f}",
                failed=int(metrics.get("actor/update_failures_total", 0)),
            )
            last = metrics
            self.last_metrics = metrics
        progress.close()
        return last

    # ------------------------------------------------------------------ the run's summary

    def update_counts(self) -> dict[str, tuple[int, int]]:
        """(updates applied, updates skipped) of each trained role over the whole run, resumed parts included."""
        counts = {}
        for role in self.roles:
            attempted = self.last_metrics.get(f"{role}/num_updates_attempted")
            if attempted is None:
                continue
            skipped = int(self.last_metrics.get(f"{role}/update_failures_total", 0))
            counts[role] = (int(attempted) - skipped, skipped)
        return counts

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
        timing[name] = time.perf_counter() - start

    def train_step(self, prompts: DataProto) -> dict[str, float]:
        """One RL step on a batch of prompts; returns its metrics."""
        cfg = self.config
        timing: dict[str, float] = {}
        step_start = time.perf_counter()
        prompt_texts = prompts.non_tensor_batch.get("raw_prompt", [])
        prompts.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(prompts))], dtype=object)
        self._pop_call_overheads()  # calls made between steps (validation, checkpoints) are not this step's
        # one call: generation, then the old and the reference log-probs the run needs (timed by the worker)
        batch = self.actor_wg.generate_with_log_probs(prompts)
        timing.update({k.removeprefix("timing_s/"): v for k, v in slowest_rank(batch.meta_info.pop("metrics")).items()})
        if self.critic_wg is not None:
            with self._timed(timing, "values"):
                batch = batch.union(self.critic_wg.compute_values(only_keys(batch, VALUE_KEYS)))
        metrics: dict[str, float] = self.mismatch(batch)
        with self._timed(timing, "reward"):
            scores = self.reward_fn(batch)
            batch.batch["token_level_scores"] = scores
            batch.batch["token_level_rewards"] = scores
            if self.kl_ctrl is not None:
                metrics.update(apply_kl_penalty(batch, self.kl_ctrl, cfg.algorithm.kl_penalty))
        with self._timed(timing, "adv"):
            self.compute_advantage(batch)
        metrics.update(self.correct_for_mismatch(batch))
        if self.critic_wg is not None:
            with self._timed(timing, "update_critic"):
                metrics.update(mean_over_ranks(self.critic_wg.update_critic(only_keys(batch, CRITIC_UPDATE_KEYS))))
        # verl's rule, with its 1-based step: the actor starts updating at step critic_warmup (0 and 1: at once)
        if self.global_step + 1 >= cfg.trainer.critic_warmup or self.critic_wg is None:
            with self._timed(timing, "update_actor"):
                metrics.update(mean_over_ranks(self.actor_wg.update_actor(only_keys(batch, UPDATE_READS))))
        timing["step"] = time.perf_counter() - step_start
        metrics.update(self.batch_metrics(batch, timing))
        metrics.update(self._pop_call_overheads())
        metrics["data/batch_fingerprint"] = float(zlib.crc32("\n".join(map(str, prompt_texts)).encode()))
        return metrics

    def _pop_call_overheads(self) -> dict[str, float]:
        """``timing_s/overhead/<method>``: seconds of each worker call beyond the work itself, summed over the calls
        since the last pop (splitting the batch, moving it to the workers and back, merging the results)."""
        overheads: dict[str, float] = {}
        for group in (self.actor_wg, self.critic_wg):
            if group is None:
                continue
            for method, calls in group.pop_call_timings().items():
                overheads[f"timing_s/overhead/{method}"] = sum(call.overhead_s for call in calls)
        return overheads

    def mismatch(self, batch: DataProto) -> dict[str, float]:
        """The engine-vs-trainer mismatch metrics, or (``bypass_mode``) the rollout's log-probs as the old ones.

        Without a separate old-log-prob pass the actor reports the metrics itself, against its update's first
        forward (see :meth:`~verl.workers.actor.base.BasePPOActor.update_policy`).
        """
        tensors = batch.batch
        if "rollout_log_probs" not in tensors.keys():
            return {}
        if self.config.algorithm.rollout_correction.bypass_mode:
            tensors["old_log_probs"] = tensors["rollout_log_probs"]
            return {}
        if "old_log_probs" not in tensors.keys():
            return {}
        return compute_mismatch_metrics(
            tensors["rollout_log_probs"], tensors["old_log_probs"], tensors["response_mask"]
        )

    def correct_for_mismatch(self, batch: DataProto) -> dict[str, float]:
        """``algorithm.rollout_correction``: importance weights on the policy loss, rejection out of the mask."""
        correction = self.config.algorithm.rollout_correction
        tensors = batch.batch
        if correction.loss_type == "reinforce":
            batch.meta_info["rollout_correction"] = {
                "loss_type": "reinforce",
                "rollout_is": correction.rollout_is,
                "rollout_is_threshold": correction.rollout_is_threshold,
            }
        if correction.bypass_mode or (correction.rollout_is is None and correction.rollout_rs is None):
            return {}
        if "rollout_log_probs" not in tensors.keys():
            raise ValueError(
                "algorithm.rollout_correction needs the rollout's own log-probs, and this rollout returned none."
            )
        weights, mask, metrics = compute_rollout_correction(
            tensors["old_log_probs"], tensors["rollout_log_probs"], tensors["response_mask"], correction
        )
        if weights is not None:
            tensors["rollout_is_weights"] = weights
        tensors["response_mask"] = mask  # rejected tokens leave the loss and its normalisation
        return metrics

    def compute_advantage(self, batch: DataProto) -> None:
        """Advantages and returns (B, R) from the registered estimator, called as verl calls it.

        GAE gets the values and its constants; every other estimator gets the rewards, the mask, the group ids and
        the ``algorithm`` section as ``config`` (built-ins read ``gamma`` or ``norm_adv_by_std_in_grpo`` from it),
        so that a verl user's estimator written for that call works unchanged.
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
            kwargs = {
                "token_level_rewards": tensors["token_level_rewards"],
                "response_mask": tensors["response_mask"],
                "index": batch.non_tensor_batch["uid"],
                "config": algo,
            }
            if "reward_baselines" in tensors.keys():
                kwargs["reward_baselines"] = tensors["reward_baselines"]
            advantages, returns = estimator(**kwargs)
        tensors["advantages"] = advantages.float()
        tensors["returns"] = returns.float()

    @staticmethod
    def batch_metrics(batch: DataProto, timing: dict[str, float]) -> dict[str, float]:
        tensors = batch.batch
        scores = tensors["token_level_scores"].sum(-1)
        response_length = tensors["response_mask"].sum(-1).float()
        num_tokens = float(tensors["attention_mask"].sum())
        metrics = {
            "critic/score/mean": scores.mean().item(),
            "critic/score/max": scores.max().item(),
            "critic/score/min": scores.min().item(),
            "critic/advantages/mean": tensors["advantages"].mean().item(),
            "response_length/mean": response_length.mean().item(),
            "perf/num_tokens": num_tokens,
            "perf/tokens_per_second": num_tokens / max(timing["step"], 1e-9),
        }
        metrics.update({f"timing_s/{name}": seconds for name, seconds in timing.items()})
        for phase in ("gen", "old_log_prob", "ref", "update_actor"):
            if phase in timing:
                metrics[f"perf/tokens_per_second/{phase}"] = num_tokens / max(timing[phase], 1e-9)
        return metrics

    # ------------------------------------------------------------------ validation

    def validate(self) -> dict[str, float]:
        """Greedy (by default) responses to the validation prompts, scored; returns ``val/score/mean``."""
        val_kwargs = self.config.actor_rollout_ref.rollout.val_kwargs
        scores = []
        for prompts in self.val_batches:
            prompts = DataProto.from_dict(
                tensors=dict(prompts.batch.items()),
                non_tensors=dict(prompts.non_tensor_batch),
                meta_info={"n": val_kwargs.n, "do_sample": val_kwargs.do_sample, "temperature": val_kwargs.temperature},
            )
            output = self.actor_wg.generate_sequences(prompts)
            scores.append(self.reward_fn(output).sum(-1))
        all_scores = torch.cat(scores)
        return {"val/score/mean": all_scores.mean().item()}

    # ------------------------------------------------------------------ checkpoints

    def checkpoint_root(self) -> Path:
        return Path(self.config.trainer.default_local_dir)

    def save_checkpoint(self) -> Path:
        """Write ``global_step_N`` atomically: a crash mid-save leaves the previous checkpoint intact."""
        final = self.checkpoint_root() / f"global_step_{self.global_step}"
        with atomic_directory(final) as tmp:
            self.actor_wg.save_checkpoint(str(tmp / "actor"))
            if self.critic_wg is not None:
                self.critic_wg.save_checkpoint(str(tmp / "critic"))
            save_state(
                tmp / "trainer_state.pt",
                {
                    "global_step": self.global_step,
                    "data_loader": self.train_loader.state_dict(),
                    # the adaptive KL coefficient moves every step: a resumed run must start where it stood
                    "kl_coef": None if self.kl_ctrl is None else float(self.kl_ctrl.value),
                },
            )
        self.last_checkpoint = final
        logger.info("saved checkpoint %s", final)
        return final

    def maybe_resume(self) -> None:
        """Restore :attr:`resume_from` (see ``verl.trainer.main_ppo.choose_checkpoint``), if set."""
        path = self.resume_from
        if path is None:
            return
        state: dict[str, Any] = load_state(path / "trainer_state.pt")
        self.actor_wg.load_checkpoint(str(path / "actor"))
        if self.critic_wg is not None:
            self.critic_wg.load_checkpoint(str(path / "critic"))
        self.train_loader.load_state_dict(state["data_loader"])
        self.global_step = int(state["global_step"])
        if self.kl_ctrl is not None and state.get("kl_coef") is not None:
            self.kl_ctrl.value = float(state["kl_coef"])
        self.last_checkpoint = path
        logger.info("resumed from %s at step %d", path, self.global_step)
