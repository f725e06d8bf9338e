"""The Ray worker that owns the critic (value model) on one data-parallel rank, for either backend.

It starts from the actor's model (``actor_rollout_ref.model.path``) with a fresh value head, trains with its own
optimizer, schedule and update-failure policy (``critic.update_failure_policy``, role "critic"), and checkpoints
next to the actor.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from omegaconf import DictConfig

from verl.protocol import DataProto
from verl.single_controller import Dispatch, Worker, register
from verl.workers.base_worker import per_rank_config, setup_worker_process


class CriticWorker(Worker):
    """Critic on one rank. Args: the whole trainer config and the run's step count."""

    def __init__(self, config: DictConfig, total_training_steps: int):
        super().__init__()
        self.config = config
        self.total_training_steps = total_training_steps
        self.critic = None

    def strategy(self) -> str:
        return self.config.critic.strategy or self.config.actor_rollout_ref.actor.strategy

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> str:
        device = setup_worker_process(self)
        cfg = self.config
        torch.manual_seed(int(cfg.critic.seed))
        critic_config = per_rank_config(cfg.critic, cfg.actor_rollout_ref.rollout.n, self.world_size, key="critic")
        group = dist.group.WORLD if dist.is_initialized() else None
        model_path = cfg.actor_rollout_ref.model.path
        if self.strategy() == "megatron":
            from verl.models.loading import load_hf_causal_lm
            from verl.workers.critic.megatron_critic import build_megatron_critic

            hf_model = load_hf_causal_lm(model_path, dtype=torch.float32, device="cpu")
            self.critic = build_megatron_critic(
                hf_model.config,
                critic_config,
                total_training_steps=self.total_training_steps,
                hf_state_dict=hf_model.state_dict(),
                device=device,
                rank=self.rank,
                process_group=group,
            )
        else:
            from verl.workers.critic.dp_critic import build_dp_critic

            self.critic = build_dp_critic(
                model_path,
                critic_config,
                total_training_steps=self.total_training_steps,
                rank=self.rank,
                process_group=group,
                device=device,
            )
        self.critic.model_module().train()
        return f"rank {self.rank}: {type(self.critic).__name__} on {device}"

    def _device(self) -> str:
        return next(self.critic.model_module().parameters()).device.type

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_values(self, data: DataProto) -> DataProto:
        values = self.critic.compute_values(data.to(self._device()))
        return DataProto.from_dict(tensors={"values": values.cpu()})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_critic(self, data: DataProto) -> dict[str, float]:
        return self.critic.update_critic(data.to(self._device()))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, directory: str) -> None:
        if self.rank == 0:
            self.critic.save_checkpoint(directory)
        if dist.is_initialized():
            dist.barrier()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, directory: str) -> None:
        self.critic.load_checkpoint(directory)
