"""The Ray worker that owns the actor, its rollout and the reference model on one data-parallel rank.

The driver calls its ``@register``'ed methods on the whole group; DataProto arguments are split across ranks and
the results gathered (``Dispatch.DP_COMPUTE_PROTO``). The backend (``dp`` or ``megatron``) only decides how the
actor and the reference are built (:meth:`ActorRolloutRefWorker._build_actor`); everything else — rollout over the
actor's own forward pass, log-probs, updates, checkpoints — is the same code for both.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf

from verl.protocol import DataProto
from verl.single_controller import Dispatch, Worker, register
from verl.trainer.config_validation import needs_reference
from verl.workers.actor.base import BasePPOActor

logger = logging.getLogger(__name__)


def per_rank_config(
    section: DictConfig, rollout_n: int, world_size: int, key: str = "actor_rollout_ref.actor"
) -> DictConfig:
    """A trained model's config with ``ppo_mini_batch_size`` turned from prompts into samples on each rank."""
    cfg = OmegaConf.create(OmegaConf.to_container(section, resolve=True))
    samples = int(cfg.ppo_mini_batch_size) * int(rollout_n)
    if samples % world_size:
        raise ValueError(
            f"{key}.ppo_mini_batch_size x rollout.n = {samples} samples do not split over "
            f"{world_size} ranks; make it a multiple of trainer.n_gpus_per_node x trainer.nnodes."
        )
    cfg.ppo_mini_batch_size = samples // world_size
    return cfg


def choose_device(config: DictConfig) -> str:
    device = config.trainer.device
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("trainer.device=cuda but this worker sees no CUDA device; use trainer.device=cpu or auto.")
    return device


def setup_worker_process(worker: Worker) -> str:
    """Thread count, torch.distributed (for several ranks) and the device of a freshly started worker."""
    threads = os.environ.get("VERL_NUM_THREADS")
    if threads:
        torch.set_num_threads(int(threads))
    if worker.world_size > 1:
        worker.init_torch_distributed()
    return choose_device(worker.config)


class ActorRolloutRefWorker(Worker):
    """Actor + rollout + (optional) reference on one rank. Subclasses implement :meth:`_build_actor`.

    Args:
        config: the whole trainer config.
        total_training_steps: the run's step count (sizes the LR schedule).
    """

    def __init__(self, config: DictConfig, total_training_steps: int):
        super().__init__()
        self.config = config
        self.total_training_steps = total_training_steps
        self.actor: BasePPOActor | None = None
        self.ref: BasePPOActor | None = None
        self.rollout = None

    # ------------------------------------------------------------------ backend hook

    def _build_actor(self, actor_config: DictConfig, device: str, trainable: bool) -> BasePPOActor:
        """Build the backend's actor (``trainable=False``: a frozen reference without optimizer)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ set-up

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> str:
        """Join torch.distributed, build actor, reference and rollout; returns a one-line description."""
        from verl.workers.rollout import get_rollout_cls

        cfg = self.config
        device = setup_worker_process(self)
        torch.manual_seed(int(cfg.actor_rollout_ref.actor.seed))
        actor_config = per_rank_config(cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout.n, self.world_size)
        self.actor = self._build_actor(actor_config, device, trainable=True)
        self.actor.model_module().train()
        if needs_reference(cfg):
            ref_config = actor_config.copy()
            ref_config.log_prob_micro_batch_size_per_gpu = cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu
            self.ref = self._build_actor(ref_config, device, trainable=False)
        from verl.models.loading import load_tokenizer

        tokenizer = load_tokenizer(self._tokenizer_path())
        rollout_cls = get_rollout_cls(cfg.actor_rollout_ref.rollout.name)
        rollout_config = OmegaConf.to_container(cfg.actor_rollout_ref.rollout, resolve=True)
        rollout_config["seed"] = int(rollout_config.get("seed") or 0) + self.rank  # ranks sample differently
        rollout_config.pop("val_kwargs", None)
        rollout_config.pop("name", None)
        self.rollout = rollout_cls(
            self._rollout_model(),
            rollout_config,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        return (
            f"rank {self.rank}: {type(self.actor).__name__} ({getattr(self.actor, 'training_path', device)}), "
            f"rollout {cfg.actor_rollout_ref.rollout.name}"
        )

    def _tokenizer_path(self) -> str:
        model_cfg = self.config.actor_rollout_ref.model
        return model_cfg.tokenizer_path or model_cfg.path

    def _rollout_model(self):
        """What the rollout samples from: the actor's own forward pass, in the training precision."""
        if self.config.actor_rollout_ref.rollout.name == "hf":
            return self.actor.model_module()
        actor = self.actor

        def logits_fn(input_ids, attention_mask, position_ids):
            with actor._autocast():
                return actor._forward_logits(input_ids, attention_mask, position_ids).float()

        return logits_fn

    # ------------------------------------------------------------------ the RL step

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        self.actor.model_module().eval()
        with torch.no_grad():
            output = self.rollout.generate_sequences(prompts.to(self._device()))
        self.actor.model_module().train()
        return output.to("cpu")

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        log_probs, _ = self.actor.compute_log_prob(data.to(self._device()))
        return DataProto.from_dict(tensors={"old_log_probs": log_probs.cpu()})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        if self.ref is None:
            raise ValueError("No reference model: set actor_rollout_ref.ref.enable=true (or use_kl_loss=true).")
        log_probs, _ = self.ref.compute_log_prob(data.to(self._device()))
        return DataProto.from_dict(tensors={"ref_log_prob": log_probs.cpu()})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_actor(self, data: DataProto) -> dict[str, float]:
        return self.actor.update_policy(data.to(self._device()))

    def _device(self) -> str:
        return next(self.actor.model_module().parameters()).device.type

    # ------------------------------------------------------------------ checkpoints

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, directory: str) -> None:
        """Rank 0 writes the actor (data-parallel ranks hold identical weights and optimizer state)."""
        if self.rank == 0:
            self.actor.save_checkpoint(directory)
        if dist.is_initialized():
            dist.barrier()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, directory: str) -> None:
        self.actor.load_checkpoint(directory)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def describe_update_policy(self) -> dict[str, Any]:
        """The handler class and its counters on this rank (for tests and tools that inspect the policy in use)."""
        handler = self.actor.update_outcome_handler
        return {"handler_class": f"{type(handler).__module__}.{type(handler).__qualname__}", **handler.state_dict()}
