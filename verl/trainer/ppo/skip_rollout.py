"""``skip.rollout`` in the colocated trainer: dump the listed steps' generated batches, replay them on a later run.

:class:`ReplayingRollout` is the actor workers' rollout source (:class:`~verl.trainer.ppo.rollout_source.
ColocatedRollout`) with the dumps of :class:`~verl.utils.rollout_skip.RolloutSkip` in front of its generation. On a
listed step whose dump exists (``action=cache``: its own; ``repeat``: the nearest) the workers never generate: the
batch is read back and the actor workers add the old and reference log-probs the run needs, from the weights they
hold now (``add_log_probs``), as verl computes them after its rollout. Otherwise the step generates as usual and the
batch goes to disk without those log-probs. The data loader advances on every step either way, so the steps after
the listed ones see the prompts an uninterrupted run sees.

Its metrics: ``rollout_skip/replayed`` (1 on a step that replayed, else 0), ``rollout_skip/dumped`` (1 on a step
that wrote a dump) and ``rollout_skip/num_replayed_steps`` (the steps replayed so far in the run, resumed parts
included).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from verl.protocol import DataProto
from verl.trainer.ppo.rollout_source import ColocatedRollout
from verl.utils.rollout_skip import RolloutSkip, prompts_fingerprint

# what add_log_probs computes from the current weights: recomputed on replay, so never dumped
RECOMPUTED_KEYS = ("old_log_probs", "ref_log_prob")


def colocated_rollout(
    actor_wg, train_loader, config, current_step: Callable[[], int], generate_with_values=None
) -> ColocatedRollout:
    """The actor workers' rollout source: with ``skip.rollout.enable``, the one that dumps and replays (its dumps
    hold what the rollout generated, so the critic's values are computed apart there).

    Args:
        current_step: the 1-based number of the step being trained (asked on every generation).
        generate_with_values: the actor processes' call that also computes the critic's values, or None.
    """
    if not config.skip.rollout.enable:
        return ColocatedRollout(actor_wg, train_loader, generate_with_values)
    dumps = RolloutSkip.from_config(config, DataProto.load_from_disk)
    return ReplayingRollout(actor_wg, train_loader, dumps, current_step)


def without_recomputed(batch: DataProto) -> DataProto:
    """``batch`` as the rollout generated it: no log-probs of the trainer's passes, no per-call timings."""
    keys = [key for key in batch.batch.keys() if key not in RECOMPUTED_KEYS]
    meta_info = {key: value for key, value in batch.meta_info.items() if key != "metrics"}
    non_tensors = dict(batch.non_tensor_batch)
    return DataProto(batch=batch.batch.select(*keys), non_tensor_batch=non_tensors, meta_info=meta_info)


class ReplayingRollout(ColocatedRollout):
    """:class:`ColocatedRollout` that replays dumped batches on the steps ``skip.rollout`` lists.

    Args:
        actor_wg: the actor workers (``generate_with_log_probs``, ``add_log_probs``).
        train_loader: the prompt batches.
        skip: the dumps (:class:`~verl.utils.rollout_skip.RolloutSkip`).
        current_step: the 1-based number of the step being trained.
    """

    def __init__(self, actor_wg, train_loader, skip: RolloutSkip, current_step: Callable[[], int]):
        super().__init__(actor_wg, train_loader)
        self.skip = skip
        self.current_step = current_step
        self.num_replayed_steps = 0
        self._round = 0  # generation rounds of the step so far (DAPO's filter asks for more than one)
        self._replayed = False
        self._dumped = False

    def start(self, steps_to_train: int | None = None) -> None:
        """Check every dump there is against this run before the first step (a mismatch stops the run here)."""
        self.skip.check_dumps()
        super().start(steps_to_train)

    def next_prompts(self) -> DataProto:
        self._round, self._replayed, self._dumped = 0, False, False
        return super().next_prompts()

    def generate(self, prompts: DataProto, timing: dict[str, float]) -> DataProto:
        """The step's samples with the log-probs the run needs: replayed from a dump, or generated (and dumped when
        the step is listed)."""
        step, round_index = self.current_step(), self._round
        self._round += 1
        if not self.skip.covers(step):
            return super().generate(prompts, timing)
        fingerprint = prompts_fingerprint(prompts.batch["input_ids"])
        replayed = self.skip.load(step, round_index, fingerprint)
        if replayed is not None:
            if not self._replayed:
                self.num_replayed_steps += 1
            self._replayed = True
            return self.actor_wg.add_log_probs(replayed[0])
        batch = super().generate(prompts, timing)
        self.skip.dump(step, round_index, without_recomputed(batch), fingerprint)
        self._dumped = True
        return batch

    def batch_metrics(self, batch: DataProto, step_seconds: float, wait_seconds: float) -> dict[str, float]:
        return {
            "rollout_skip/replayed": float(self._replayed),
            "rollout_skip/dumped": float(self._dumped),
            "rollout_skip/num_replayed_steps": float(self.num_replayed_steps),
        }

    def state_dict(self) -> dict[str, Any]:
        return {"num_replayed_steps": self.num_replayed_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.num_replayed_steps = int(state.get("num_replayed_steps", 0))


__all__ = ["RECOMPUTED_KEYS", "ReplayingRollout", "colocated_rollout", "without_recomputed"]
