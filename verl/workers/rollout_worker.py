"""The rollout worker group of its own (``actor_rollout_ref.hybrid_engine=false``): ranks that only sample.

Each rank holds a whole copy of the policy (a frozen Hugging Face model, as the ``dp`` backend builds it, with the
actor's precision) and the configured rollout over it (``naive``, ``hf`` or a ``vllm`` engine of its own); the
rollout ranks split each batch's prompts (``Dispatch.DP_COMPUTE_PROTO``) and never talk to one another. The weights
come from the trainer's actor through the driver, each set with its version number (Hugging Face names, a LoRA
actor's merged): :meth:`RolloutWorker.load_weights` takes them between two generation calls; with
``async_training.partial_rollout`` :meth:`RolloutWorker.stage_weights` takes them on a thread of their own while a
generation runs, and the rollout switches to them between two tokens (:mod:`verl.workers.rollout.partial`). Every
response token carries the version of the weights that sampled it (``weight_version``, (B, R) int64).

Rollout rank ``r`` samples with seed ``rollout.seed + r``, as rank ``r`` of the actor group does when the rollout
lives there: with as many rollout ranks as trainer ranks and the same weights, both sample the same responses.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import torch

from verl.protocol import DataProto
from verl.single_controller import Dispatch, register
from verl.workers.base_worker import setup_worker_process, with_model_copies_in_shm
from verl.workers.dp_workers import DPActorRolloutRefWorker
from verl.workers.rollout.partial import WEIGHT_VERSION_KEY, WeightSwitch

__all__ = ["WEIGHT_VERSION_KEY", "RolloutWorker"]


class RolloutWorker(DPActorRolloutRefWorker):
    """One rank of the rollout worker group: a frozen copy of the policy and its rollout.

    Args:
        config: the whole validated trainer config.
        total_training_steps: unused (the worker trains nothing); the worker group passes it to every worker.
    """

    def __init__(self, config, total_training_steps: int):
        super().__init__(config, total_training_steps)
        self.switch: WeightSwitch | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> str:
        """Join the rollout group's torch.distributed world, build the frozen model and the rollout over it."""
        device = setup_worker_process(self)
        if self.config.actor_rollout_ref.model.use_shm:  # verl's model.use_shm: load from the node's copy
            self.config = with_model_copies_in_shm(self.config)
        arr = self.config.actor_rollout_ref
        torch.manual_seed(arr.actor.seed)
        actor_config = arr.actor.per_rank(arr.rollout.n, self._dp_size())
        # the plain model (no adapters even for a LoRA actor: the trainer sends merged weights under plain names)
        self.actor = self._build_actor(actor_config, device, trainable=False)
        self.actor.model_module().eval()
        self.rollout = self._build_rollout()
        self.switch = WeightSwitch(self._put_weights)
        if self.config.async_training.partial_rollout:
            self.rollout.weight_switch = self.switch
        return f"rollout rank {self.rank}: {arr.rollout.name} on {device}"

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> float:
        """Take the trainer's weights (``{Hugging Face name: tensor}``) as version ``version`` now (between two
        generation calls); returns the seconds it took."""
        start = time.perf_counter()
        self.switch.stage(weights, version)
        self.switch.apply_staged()
        return time.perf_counter() - start

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, concurrency_group="weights")
    def stage_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        """Partial rollouts: keep the trainer's weights as version ``version`` for the generating thread, which
        switches to them between two tokens of a running generation, or before the next one starts. Runs beside a
        generation call (a thread of its own) and touches nothing it uses."""
        self.switch.stage(weights, version)

    def _put_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """The weights into the model (or the engine holding its own copy). Names the model lacks, or none for one
        of its weights, raise (a LoRA actor's merged weights carry the plain names)."""
        with torch.no_grad():
            if self._rollout_holds_weights():
                self.rollout.load_weights(iter(weights.items()))
            else:
                module = self.actor.model_module()
                missing, unexpected = module.load_state_dict(dict(weights), strict=False)
                if unexpected:
                    raise ValueError(f"the trainer sent weights this model does not have: {sorted(unexpected)[:5]}")
                tied = {name for name in missing if name.endswith("lm_head.weight")}
                if set(missing) - tied:
                    raise ValueError(f"the trainer sent no weights for {sorted(set(missing) - tied)[:5]}")

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Responses to ``prompts`` with the rollout's log-probs (when ``calculate_log_probs``), the weight version
        of each response token (``weight_version``, (B, R) int64) and ``meta_info["metrics"]["timing_s/gen"]``."""
        start = time.perf_counter()
        # (with partial rollouts the rollout applies weights staged between two calls before its first token)
        output = self._generate(prompts).to("cpu")
        if WEIGHT_VERSION_KEY not in output.batch.keys():  # no switch during the call: one version throughout
            shape = output.batch["responses"].shape
            output.batch[WEIGHT_VERSION_KEY] = torch.full(shape, self.switch.version, dtype=torch.long)
        output.meta_info["metrics"] = {"timing_s/gen": time.perf_counter() - start}
        return output
