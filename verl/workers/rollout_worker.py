"""The rollout worker group of its own (``actor_rollout_ref.hybrid_engine=false``): ranks that only sample.

Each rank is a worker of its own (not an actor worker: its group exposes the rollout's methods only) hosting a whole
copy of the policy (a frozen Hugging Face model, as the ``dp`` backend builds it, with the actor's precision) and a
:class:`~verl.workers.roles.rollout.RolloutRole`, the configured rollout over it (``naive``, ``hf`` or a ``vllm``
engine of its own); the rollout ranks split each batch's prompts (``Dispatch.DP_COMPUTE_PROTO``) and never talk to
one another. The weights come from the trainer's actor through the driver, each set with its version number (Hugging
Face names, a LoRA actor's merged; packed in buckets by the actor's ``export_weights``, a plain ``{name: tensor}``
accepted too): :meth:`RolloutWorker.load_weights` takes them between two generation calls; with
``async_training.partial_rollout`` :meth:`RolloutWorker.stage_weights` takes them on a thread of their own while a
generation runs, and the rollout switches to them between two tokens (``vllm``: between two engine calls of a few
dozen tokens each; :mod:`verl.workers.rollout.partial`). Every response token carries the version of the weights that
sampled it (``weight_version``, (B, R) int64).

Rollout rank ``r`` samples with seed ``rollout.seed + r``, as rank ``r`` of the actor group does when the rollout
lives there: with as many rollout ranks as trainer ranks and the same weights, both sample the same responses.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from verl.protocol import DataProto
from verl.single_controller import Dispatch, register
from verl.utils.weight_buckets import WeightBucket, named_tensors
from verl.workers.base_worker import SectionWorker, setup_worker_process, with_model_copies_in_shm
from verl.workers.config import ActorRolloutRefConfig, PPOConfig
from verl.workers.config.plan import RunPlan
from verl.workers.dp_workers import build_dp_policy
from verl.workers.roles.rollout import RolloutRole, build_rollout_role
from verl.workers.rollout.partial import WEIGHT_VERSION_KEY, WeightSwitch

__all__ = ["WEIGHT_VERSION_KEY", "RolloutWorker"]


class RolloutWorker(SectionWorker):
    """One rank of the rollout worker group: a frozen copy of the policy and the rollout role over it.

    Its group exposes the rollout's methods only (``init_model``, ``generate_sequences``, ``load_weights``,
    ``stage_weights``), never the actor's: it trains nothing and writes no checkpoint.

    Args:
        config: the ``actor_rollout_ref`` section (the model, the actor's precision and seed, the rollout).
        plan: the run plan (the device, the responses per prompt, whether rollouts are partial).
    """

    def __init__(self, config: ActorRolloutRefConfig, plan: RunPlan):
        super().__init__()
        self.config = config
        self.plan = plan
        self.policy = None  # the frozen copy of the policy (a BasePPOActor without optimizer)
        self.rollout_role: RolloutRole | None = None
        self.switch: WeightSwitch | None = None

    @classmethod
    def init_kwargs(cls, config: PPOConfig, plan: RunPlan) -> dict[str, Any]:
        return {"config": config.actor_rollout_ref, "plan": plan}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> str:
        """Join the rollout group's torch.distributed world, build the frozen model and the rollout over it."""
        from verl.workers.rollout.vllm_engine import engine_index

        device = setup_worker_process(self, self.plan.device)
        if self.config.model.use_shm:  # verl's model.use_shm: load from the node's copy
            self.config = with_model_copies_in_shm(self.config)
        arr = self.config
        torch.manual_seed(arr.actor.seed)
        actor_config = arr.actor.per_rank(self.plan.rollout_n, self.world_size)
        # the plain model (no adapters even for a LoRA actor: the trainer sends merged weights under plain names)
        self.policy = build_dp_policy(
            arr.model, actor_config, device, trainable=False, total_training_steps=0, rank=self.rank
        )
        self.policy.model_module().eval()
        # rank r samples as rank r of the actor group would (a vLLM engine: its tensor-parallel group's seed)
        seed_offset = engine_index(arr.rollout, self.rank) if arr.rollout.name == "vllm" else self.rank
        self.rollout_role = build_rollout_role(arr, self.policy, device, seed_offset)
        self.switch = WeightSwitch(self._put_weights)
        if self.plan.partial_rollout:
            self.rollout_role.engine.weight_switch = self.switch
        return f"rollout rank {self.rank}: {arr.rollout.name} on {device}"

    def data_parallel_layout(self) -> tuple[int, bool]:
        """(data-parallel rank, returns its results): every rank samples its own share of the prompts."""
        return self.rank, True

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_weights(self, weights: Mapping[str, torch.Tensor] | Sequence[WeightBucket], version: int) -> float:
        """Take the trainer's weights (:class:`~verl.utils.weight_buckets.WeightBucket` s of Hugging Face names, or
        ``{name: tensor}``) as version ``version`` now (between two generation calls); returns the seconds it took."""
        start = time.perf_counter()
        self.switch.stage(weights, version)
        self.switch.apply_staged()
        return time.perf_counter() - start

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, concurrency_group="weights")
    def stage_weights(self, weights: Mapping[str, torch.Tensor] | Sequence[WeightBucket], version: int) -> None:
        """Partial rollouts: keep the trainer's weights as version ``version`` for the generating thread, which
        switches to them between two tokens of a running generation, or before the next one starts. Runs beside a
        generation call (a thread of its own) and touches nothing it uses."""
        self.switch.stage(weights, version)

    def _put_weights(self, weights: Mapping[str, torch.Tensor] | Sequence[WeightBucket]) -> None:
        """The weights into the model (or the engine holding its own copy), read from the buckets where they arrived
        (views, no copy before the model's own). Names the model lacks, or none for one of its weights, raise (a
        LoRA actor's merged weights carry the plain names)."""
        if self.rollout_role.holds_weights:
            self.rollout_role.load_weights(named_tensors(weights))
            return
        with torch.no_grad():
            missing, unexpected = self.policy.model_module().load_state_dict(dict(named_tensors(weights)), strict=False)
        if unexpected:
            raise ValueError(f"the trainer sent weights this model does not have: {sorted(unexpected)[:5]}")
        tied = {name for name in missing if name.endswith("lm_head.weight")}
        if set(missing) - tied:
            raise ValueError(f"the trainer sent no weights for {sorted(set(missing) - tied)[:5]}")

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_tokens(self, requests: DataProto) -> DataProto:
        """Answers to agent loops' token-id requests (see :mod:`verl.workers.rollout.token_requests`), sampled by
        the weights this rank holds now (staged weights apply first)."""
        self.switch.apply_staged()
        return self.rollout_role.generate_tokens(requests).to("cpu")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def release_rollout(self) -> None:
        """The agent loops of a batch are done: an engine kept awake between their turns sleeps again."""
        self.rollout_role.release()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Responses to ``prompts`` with the rollout's log-probs (when ``calculate_log_probs``), the weight version
        of each response token (``weight_version``, (B, R) int64) and ``meta_info["metrics"]["timing_s/gen"]``."""
        start = time.perf_counter()
        # (with partial rollouts the rollout applies weights staged between two calls before its first token)
        output = self.rollout_role.generate(prompts).to("cpu")
        if WEIGHT_VERSION_KEY not in output.batch.keys():  # no switch during the call: one version throughout
            shape = output.batch["responses"].shape
            output.batch[WEIGHT_VERSION_KEY] = torch.full(shape, self.switch.version, dtype=torch.long)
        output.meta_info["metrics"] = {"timing_s/gen": time.perf_counter() - start}
        return output
