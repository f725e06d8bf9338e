"""Where a training step's samples come from: the actor workers' own rollout, or a rollout group one step ahead.

The trainer asks a source for the prompts of its next step (:meth:`next_prompts`), for the samples of those
prompts with the old and reference log-probs the run needs (:meth:`generate`), and tells it after each update
whether the update was applied (:meth:`after_update`).

- :class:`ColocatedRollout` (``actor_rollout_ref.hybrid_engine=true``): the rollout lives in the actor workers;
  each step generates, then trains, on the weights of the previous update.
- :class:`AsyncRollout` (``hybrid_engine=false``): a rollout worker group of its own
  (:class:`~verl.workers.rollout_worker.RolloutWorker`) generates ahead of the trainer, within verl's
  ``async_training`` rules (:class:`~verl.workers.config.async_training.AsyncTrainingConfig`). The driver owns the
  versions: after every ``trigger_parameter_sync_step`` steps (local updates) in which some update was applied, the
  actor's weights go to the rollout group as the next version (none when every update of the window was skipped:
  the weights did not change). Between two syncs the rollout group may start at most ``floor((1 +
  staleness_threshold) x trigger_parameter_sync_step)`` batches, less the batches started earlier that still wait.
  A batch is sampled by the version the rollout group held when it started (``weight_version`` on every row) and
  trained at the trainer's version when it is taken; the difference is its staleness. The defaults (threshold 1, a
  sync after every step) are one step off policy: batch t+1 is generated while batch t trains, by the weights of
  update t-1. Threshold 0 is synchronous: each batch is sampled by the newest weights.

Calls to one Ray worker run in the order they were made, so the driver never waits to order a sync and a
generation: a sync sent while the rollout group generates the next batch reaches it after that batch, and the
batch after it is sampled by the new weights.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import torch

from verl.protocol import DataProto
from verl.trainer.ppo.metric_utils import slowest_rank
from verl.workers.rollout.partial import WEIGHT_VERSION_KEY

logger = logging.getLogger(__name__)


def assign_group_ids(prompts: DataProto) -> DataProto:
    """Each prompt's group id (``uid``), shared by its ``rollout.n`` responses; in place, returns ``prompts``."""
    prompts.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(prompts))], dtype=object)
    return prompts


class ColocatedRollout:
    """The rollout in the actor workers (verl's hybrid engine): generate, then train.

    Args:
        actor_wg: the actor workers.
        train_loader: the prompt batches.
        generate_with_values: the actor processes' call that also returns the critic's values (the critic hosted
            there, :class:`~verl.workers.colocated.ColocatedRolesWorker`), or None: the samples come without them.
    """

    def __init__(self, actor_wg, train_loader, generate_with_values=None):
        self.actor_wg = actor_wg
        self.train_loader = train_loader
        self._generate_with_values = generate_with_values
        #: whether the samples :meth:`generate` returns carry the critic's ``values`` already
        self.carries_values = generate_with_values is not None

    def start(self, steps_to_train: int | None = None) -> None:
        """Nothing to send: the actor workers' rollout samples with their actor's weights (an engine with weights of
        its own got them when the workers started)."""

    def next_prompts(self) -> DataProto:
        return next(self.train_loader)

    def generate(self, prompts: DataProto, timing: dict[str, float]) -> DataProto:
        """Samples of ``prompts`` with the log-probs the run needs, in one call to the actor workers."""
        del timing  # the worker times its own passes (meta_info["metrics"])
        if self._generate_with_values is not None:
            return self._generate_with_values(assign_group_ids(prompts))
        return self.actor_wg.generate_with_log_probs(assign_group_ids(prompts))

    def after_update(self, applied: bool) -> dict[str, float]:
        """The actor workers send new weights to a rollout holding its own copy themselves."""
        return {}

    def validation_samples(self, prompts: DataProto) -> tuple[DataProto, dict[str, float]]:
        """Responses to validation prompts (their sampling settings in ``meta_info``), by the actor's current
        weights; no metrics of its own."""
        return self.actor_wg.generate_sequences(prompts), {}

    def batch_metrics(self, batch: DataProto, step_seconds: float, wait_seconds: float) -> dict[str, float]:
        """Every sample is fresh: no staleness to report."""
        return {}

    def loader_state(self) -> dict[str, Any]:
        """The data position a checkpoint saves: the prompts after it have not been trained on."""
        return self.train_loader.state_dict()

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


# verl's agent-loop metrics (AgentLoopManager._performance_metrics) are timings of the step: logged as timing_s/...
_AGENT_TIMING_PREFIXES = tuple(
    f"agent_loop/{name}/" for name in ("generate_sequences", "tool_calls", "compute_score", "num_preempted", "slowest")
)


class AgentLoopRollout(ColocatedRollout):
    """The actor workers' rollout driven by verl's agent loops (``actor_rollout_ref.rollout.multi_turn.enable``).

    Each prompt row runs its agent loop (:class:`~verl.experimental.agent_loop.manager.AgentLoopManager`), whose
    generations the actor workers' rollout answers in batches (``generate_tokens``); the trajectories then get the
    old and reference log-probs the run needs (``add_log_probs``), as a batch generated elsewhere does. Metrics, with
    verl's names: the loops' timings as ``timing_s/agent_loop/...`` beside ``timing_s/gen`` (the whole agent-loop
    phase), and per step the tool calls (``agent_loop/tool_calls_total``, ``agent_loop/tool_call_errors_total``,
    ``agent_loop/tool_call_success_rate``), the engine calls the generations took (``agent_loop/engine_calls``) and
    the mean count of response ids the model did not sample (``agent_loop/non_model_tokens/mean``: tool and user
    turns, response mask 0); ``num_turns/*`` and ``tool_call_counts/*`` come from the batch's columns.

    Args:
        actor_wg: the actor workers (``generate_tokens``, ``release_rollout``, ``add_log_probs``).
        train_loader: the prompt batches.
        manager: the agent-loop manager over ``actor_wg``.
    """

    def __init__(self, actor_wg, train_loader, manager):
        super().__init__(actor_wg, train_loader)
        self.manager = manager
        self._totals: dict[str, float] = {}

    def generate(self, prompts: DataProto, timing: dict[str, float]) -> DataProto:
        """Trajectories of ``prompts`` with the log-probs the run needs (one agent-loop phase, then one call)."""
        del timing  # the phases' seconds ride in meta_info["metrics"], as the workers' own
        start = time.perf_counter()
        generated = self.manager.generate_sequences(assign_group_ids(prompts))
        seconds = time.perf_counter() - start
        loop_metrics = generated.meta_info.pop("agent_loop_metrics", {})
        output = self.actor_wg.add_log_probs(generated)
        phases = output.meta_info.setdefault("metrics", {})
        phases["timing_s/gen"] = seconds
        for key, value in loop_metrics.items():
            if key.startswith(_AGENT_TIMING_PREFIXES):
                phases[f"timing_s/{key}"] = value
        for key in ("tool_calls_total", "tool_call_errors_total", "engine_calls"):
            name = f"agent_loop/{key}"
            self._totals[name] = self._totals.get(name, 0.0) + float(loop_metrics.get(name, 0.0))
        self._totals["agent_loop/non_model_tokens/mean"] = float(loop_metrics["agent_loop/non_model_tokens/mean"])
        return output

    def validation_samples(self, prompts: DataProto) -> tuple[DataProto, dict[str, float]]:
        """The agent loops' trajectories of validation prompts (their sampling settings in ``meta_info``)."""
        output = self.manager.generate_sequences(prompts)
        output.meta_info.pop("agent_loop_metrics", None)
        return output, {}

    def batch_metrics(self, batch: DataProto, step_seconds: float, wait_seconds: float) -> dict[str, float]:
        """The step's tool-call counts and success rate (1 without calls) and its engine calls."""
        totals, self._totals = self._totals, {}
        calls = totals.get("agent_loop/tool_calls_total", 0.0)
        errors = totals.get("agent_loop/tool_call_errors_total", 0.0)
        totals["agent_loop/tool_call_success_rate"] = 1.0 - errors / calls if calls else 1.0
        return totals


@dataclass
class _InFlight:
    """A batch the rollout group is generating: its prompts, the call, and where the data stood before them."""

    prompts: DataProto
    pending: Any  # PendingResult of RolloutWorker.generate_sequences
    loader_state_before: dict[str, Any]


class AsyncRollout:
    """A rollout worker group of its own, ahead of the trainer within the staleness rule.

    Args:
        rollout_wg: the :class:`~verl.workers.rollout_worker.RolloutWorker` group.
        actor_wg: the actor group: it sends its weights (``export_weights``) and computes the old and reference
            log-probs of each generated batch (``add_log_probs``).
        train_loader: the prompt batches (one per step), drawn ahead of training.
        staleness_threshold: verl's ``async_training.staleness_threshold`` (0: synchronous; 1: one step off).
        trigger_parameter_sync_step: steps between two weight syncs.
        rollout_n: responses per prompt (``rollout.n``): trajectories of a prompt, for the stale counts.
        partial_rollout: send weights to the rollout workers' weights thread, which switches to them between two
            tokens of the generation in flight (else they wait for it to end).
        wait_timeout_s: the longest the trainer waits for a batch once it asks for it (``trainer.
            collective_timeout_s``); past it the run stops with
            :class:`~verl.single_controller.results.GenerationTimeoutError` naming the rank, never hangs.
    """

    def __init__(
        self,
        rollout_wg,
        actor_wg,
        train_loader,
        staleness_threshold: float = 1.0,
        trigger_parameter_sync_step: int = 1,
        rollout_n: int = 1,
        partial_rollout: bool = False,
        wait_timeout_s: float = 600.0,
    ):
        if staleness_threshold < 0 or trigger_parameter_sync_step < 1:
            raise ValueError(
                f"staleness_threshold must be >= 0 and trigger_parameter_sync_step >= 1, got {staleness_threshold} "
                f"and {trigger_parameter_sync_step}."
            )
        self.rollout_wg = rollout_wg
        self.actor_wg = actor_wg
        self.train_loader = train_loader
        self.carries_values = False  # the critic computes the values of each batch the trainer takes
        self.trigger_parameter_sync_step = trigger_parameter_sync_step
        # batches the rollout group may start per weight version (verl: (1 + threshold) x the samples of a sync)
        self.batches_per_version = max(1, math.floor((1 + staleness_threshold) * trigger_parameter_sync_step + 1e-9))
        if staleness_threshold > 0 and self.batches_per_version == trigger_parameter_sync_step:
            # verl counts the budget in samples (a fraction of a batch may go ahead); here it is whole batches
            logger.warning(
                "async_training.staleness_threshold=%g with trigger_parameter_sync_step=%d allows %d batches per "
                "weight version, one window's worth: the rollout group never generates ahead of a sync (the budget "
                "counts whole batches). staleness_threshold >= %g lets one batch go ahead.",
                staleness_threshold,
                trigger_parameter_sync_step,
                self.batches_per_version,
                1 / trigger_parameter_sync_step,
            )
        self.rollout_n = rollout_n
        self.wait_timeout_s = wait_timeout_s
        # partial rollouts: weights go to a thread of their own in each rollout worker, which switches to them
        # between two tokens of the generation in flight; else they wait for it to end
        self.sync_method = "stage_weights" if partial_rollout else "load_weights"
        self.version = 0  # weight versions sent after the first: syncs of windows in which an update was applied
        self.steps_since_sync = 0
        self.applied_since_sync = False
        self.may_start = self.batches_per_version  # batches the rollout group may still start before the next sync
        self.batches_to_start: int | None = None  # the steps the run has left to feed (None: no end)
        self.in_flight: deque[_InFlight] = deque()
        self._to_redraw: deque[dict[str, Any]] = deque()  # after a resume: where the saved in-flight batches began
        self.stale_samples_processed = 0  # prompts trained on with staleness > 0 (verl's "samples")
        self.stale_trajectories_processed = 0  # their responses (verl's "trajectories")
        self._rollout_busy_s = 0.0  # the rollout group's generation seconds since the last step's metrics
        self._last_metrics_at: float | None = None
        self._syncs: deque = deque()  # the weight syncs sent whose outcome has not been read, oldest first

    # ------------------------------------------------------------------ the trainer's calls

    def start(self, steps_to_train: int | None = None) -> None:
        """Send the trainer's weights at :attr:`version` (0 on a fresh run, the one saved with the checkpoint after
        a resume) and start the first version's batches; no more than ``steps_to_train`` batches are ever started
        (None: no end), so that the run's last step leaves nothing generating."""
        self.batches_to_start = steps_to_train
        self._send_weights()
        self._last_metrics_at = time.perf_counter()
        self._start_allowed()

    def next_prompts(self) -> DataProto:
        """The prompts of the next training step: the oldest batch in flight."""
        if not self.in_flight:  # the rule always leaves one in flight; this is a bug, not a state to wait out
            raise RuntimeError("no batch in flight: the rollout group was given no budget for this version")
        return self.in_flight[0].prompts

    def generate(self, prompts: DataProto, timing: dict[str, float]) -> DataProto:
        """The samples of ``prompts`` with the old and reference log-probs the run needs.

        For the batch in flight, wait for it (``timing["wait_prev_gen"]``), then let the actor workers add the
        log-probs while the rollout group generates what is started after it. Other prompts (DAPO's extra rounds)
        are generated now, after what is in flight.
        """
        start = time.perf_counter()
        if self.in_flight and self.in_flight[0].prompts is prompts:
            pending = self.in_flight.popleft().pending
        else:
            pending = self._submit(prompts)
            self._wait_behind_in_flight()
        self._wait_for(pending)
        generated = pending.get()
        timing["wait_prev_gen"] = timing.get("wait_prev_gen", 0.0) + time.perf_counter() - start
        gen_s = slowest_rank(generated.meta_info.pop("metrics"))["timing_s/gen"]
        timing["gen"] = timing.get("gen", 0.0) + gen_s
        self._rollout_busy_s += gen_s
        return self.actor_wg.add_log_probs(generated)

    def after_update(self, applied: bool) -> dict[str, float]:
        """After the step's update. At the end of a sync window (``trigger_parameter_sync_step`` steps): the next
        version and its weights for the rollout group when some update of the window was applied, and the budget of
        batches the rollout group may start before the next sync.

        Returns ``timing_s/sync_rollout_weights`` (0 when nothing was sent) and
        ``fully_async/count/current_param_version``.
        """
        seconds = 0.0
        self.steps_since_sync += 1
        self.applied_since_sync = self.applied_since_sync or applied
        if self.steps_since_sync == self.trigger_parameter_sync_step:
            if self.applied_since_sync:
                self.version += 1
                start = time.perf_counter()
                self._send_weights()
                seconds = time.perf_counter() - start
            self.steps_since_sync, self.applied_since_sync = 0, False
            # what was started before this sync and still waits counts against the new version's budget
            self.may_start = max(1, self.batches_per_version - len(self.in_flight))
            self._start_allowed()
        return {
            "timing_s/sync_rollout_weights": seconds,
            "fully_async/count/current_param_version": float(self.version),
        }

    def validation_samples(self, prompts: DataProto) -> tuple[DataProto, dict[str, float]]:
        """Responses to validation prompts from the rollout group, which holds the weights of the last sync: queued
        behind the batches in flight, each waited for within ``wait_timeout_s``. Its metrics say which weights
        answered: ``val/weight_version`` and ``val/steps_behind`` (the steps since that sync whose applied updates
        the answers lack: 0 when ``trainer.test_freq`` is a multiple of ``trigger_parameter_sync_step``)."""
        pending = self.rollout_wg.submit("generate_sequences", prompts)
        self._wait_behind_in_flight()
        self._wait_for(pending)
        behind = self.steps_since_sync if self.applied_since_sync else 0
        return pending.get(), {"val/weight_version": float(self.version), "val/steps_behind": float(behind)}

    def batch_metrics(self, batch: DataProto, step_seconds: float, wait_seconds: float) -> dict[str, float]:
        """The staleness of the step's batch and the idle shares of both sides.

        ``fully_async/staleness/{mean,max}`` (the trainer's version minus the oldest ``weight_version`` of each
        response's tokens), the running counts ``fully_async/count/stale_{samples,trajectory}_processed`` (prompts
        and responses trained with staleness > 0), ``fully_async/partial/{total_partial_num,partial_ratio,
        max_partial_span}`` (responses whose tokens come from more than one version, their share, and the most
        versions one spans), ``trainer/idle_ratio`` (the step's share spent waiting for samples) and
        ``rollouter/idle_ratio`` (the share of the time since the last step the rollout group did not generate).
        Called after the step's update and before :meth:`after_update`, so :attr:`version` is the one the batch
        trained at.
        """
        oldest, newest = token_version_range(batch)
        staleness = self.version - oldest
        span = newest - oldest
        stale_rows = int((staleness > 0).sum())
        self.stale_trajectories_processed += stale_rows
        self.stale_samples_processed += stale_rows // max(self.rollout_n, 1)
        now = time.perf_counter()
        since = max(now - (self._last_metrics_at or now), 1e-9)
        rollouter_idle = max(0.0, 1.0 - self._rollout_busy_s / since)
        self._last_metrics_at, self._rollout_busy_s = now, 0.0
        return {
            "fully_async/staleness/mean": float(np.mean(staleness)),
            "fully_async/staleness/max": float(np.max(staleness)),
            "fully_async/count/stale_samples_processed": float(self.stale_samples_processed),
            "fully_async/count/stale_trajectory_processed": float(self.stale_trajectories_processed),
            "fully_async/partial/total_partial_num": float((span > 0).sum()),
            "fully_async/partial/partial_ratio": float((span > 0).mean()),
            "fully_async/partial/max_partial_span": float(span.max()),
            "trainer/idle_ratio": wait_seconds / max(step_seconds, 1e-9),
            "rollouter/idle_ratio": rollouter_idle,
        }

    def loader_state(self) -> dict[str, Any]:
        """The data position a checkpoint saves: after every batch drawn so far, the ones in flight included (those
        are drawn again from their own positions, :meth:`state_dict`)."""
        return self.train_loader.state_dict()

    def state_dict(self) -> dict[str, Any]:
        """What a resume needs: the version, the sync window's position and budget, the stale counts, and where each
        batch in flight was drawn. Their samples are not saved: a resumed run draws the same prompts from those
        positions and generates them again with the checkpoint's weights. Each is drawn from its own position, not
        all from the first one's, because prompts drawn between them (DAPO's extra rounds, :meth:`generate`) were
        trained already and must not come back as a step's batch."""
        return {
            "version": self.version,
            "steps_since_sync": self.steps_since_sync,
            "applied_since_sync": self.applied_since_sync,
            "may_start": self.may_start,
            "stale_samples_processed": self.stale_samples_processed,
            "stale_trajectories_processed": self.stale_trajectories_processed,
            "in_flight_positions": [batch.loader_state_before for batch in self.in_flight],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # a checkpoint without positions (written before they were saved) holds the first in-flight batch's
        # position as its data position: drawing on from there is what those runs did
        self._to_redraw = deque(state.get("in_flight_positions", []))
        # the window's budget as the save left it: the batches then in flight (drawn again at start) and those the
        # version could still start; a full version's budget would start, mid-window, batches that the
        # uninterrupted run starts only after the next sync, and they would train one version staler than the rule
        budget = state.get("may_start")
        self.may_start = self.batches_per_version if budget is None else len(self._to_redraw) + int(budget)
        self.version = int(state.get("version", 0))
        self.steps_since_sync = int(state.get("steps_since_sync", 0))
        self.applied_since_sync = bool(state.get("applied_since_sync", False))
        self.stale_samples_processed = int(state.get("stale_samples_processed", 0))
        self.stale_trajectories_processed = int(state.get("stale_trajectories_processed", 0))

    # ------------------------------------------------------------------ the rollout group

    def _start_allowed(self) -> None:
        """Start batches while this version's budget allows, and while the run has steps left to feed."""
        while self.may_start > 0 and self.batches_to_start != 0:
            self._launch()
            self.may_start -= 1
            if self.batches_to_start is not None:
                self.batches_to_start -= 1

    def _launch(self) -> None:
        resume_at = None
        if self._to_redraw:  # after a resume: a batch that was in flight at the save, from where it was drawn
            resume_at = self.train_loader.state_dict()
            self.train_loader.load_state_dict(self._to_redraw.popleft())
        before = self.train_loader.state_dict()
        prompts = next(self.train_loader)
        if resume_at is not None:
            self.train_loader.load_state_dict(resume_at)
        self.in_flight.append(_InFlight(prompts, self._submit(prompts), before))

    def _wait_behind_in_flight(self) -> None:
        """For a call queued behind every batch in flight: wait for each of those within its own bound first, so
        that a healthy queue longer than ``wait_timeout_s`` is not taken for a rank that hangs."""
        for earlier in self.in_flight:
            self._wait_for(earlier.pending)

    def _wait_for(self, pending) -> None:
        """Wait up to ``wait_timeout_s`` for a generation call; past it, stop the run naming the late rank."""
        late = pending.unfinished_ranks(self.wait_timeout_s)
        if late:
            raise self.rollout_wg.generation_timeout(late[0], self.wait_timeout_s)

    def _submit(self, prompts: DataProto):
        return self.rollout_wg.submit("generate_sequences", assign_group_ids(prompts))

    def _send_weights(self) -> None:
        """The actor's weights, once into Ray's object store, to every rollout rank as version :attr:`version`
        (queued behind the generation in flight)."""
        weights = next(w for w in self.actor_wg.export_weights() if w is not None)
        # an earlier sync that has run raises what it raised; one still queued behind a generation nobody has taken
        # yet (a staleness threshold above 1 starts more than one version ahead) is not waited for: the trainer
        # would wait out that generation here, without the bound of wait_timeout_s. A rank that never gets to it is
        # found by the wait for the generation before it (generate).
        while self._syncs and not self._syncs[0].unfinished_ranks(0.0):
            self._syncs.popleft().get()
        self._syncs.append(self.rollout_wg.submit(self.sync_method, ray.put(weights), self.version))


def token_version_range(batch: DataProto) -> tuple[np.ndarray, np.ndarray]:
    """Per response: the oldest and the newest weight version among its tokens (``weight_version`` (B, R) under the
    response mask; a response with no token takes its first column's)."""
    versions = batch.batch[WEIGHT_VERSION_KEY]
    mask = batch.batch["response_mask"].bool()
    has_tokens = mask.any(dim=-1)
    oldest = torch.where(mask, versions, versions.max() + 1).min(dim=-1).values
    newest = torch.where(mask, versions, versions.min() - 1).max(dim=-1).values
    oldest = torch.where(has_tokens, oldest, versions[:, 0])
    newest = torch.where(has_tokens, newest, versions[:, 0])
    return oldest.numpy(), newest.numpy()
