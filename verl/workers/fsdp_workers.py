"""Ray workers of the ``fsdp2`` backend (alias ``fsdp``): Hugging Face models sharded with torch FSDP2.

What differs from the ``dp`` workers: every rank joins torch.distributed even alone (FSDP2 needs a process group),
on gloo for CPU tensors and NCCL for CUDA ones; models are loaded into CPU memory and sharded onto the device; the
naive rollout agrees over the ranks on when to stop sampling (each forward pass is a collective; the config
refuses the ``hf`` rollout, whose ``generate`` would stop each rank at its own eos); and a checkpoint is written
by every rank (its shards), not by rank 0 alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from verl.single_controller import Dispatch, register
from verl.utils.device_memory import releasing_device_memory
from verl.utils.fsdp_utils import device_mesh
from verl.workers.actor.fsdp_actor import FSDPPPOActor, build_fsdp_actor
from verl.workers.base_worker import ActorRolloutRefWorker, CriticWorker, choose_device
from verl.workers.config import ActorConfig, CriticConfig
from verl.workers.config.roles import cpu_offload


def offloads(fsdp_config) -> bool:
    """Whether a model's ``fsdp_config`` moves anything of it to host memory (its shards, or its optimizer state)."""
    return cpu_offload(fsdp_config) or bool(getattr(fsdp_config, "optimizer_offload", False))


class _FSDPWorkerMixin:
    """Process group, mesh, compute device and collective checkpoints of an FSDP2 worker."""

    def _join_process_group(self) -> str:
        """Initialise torch.distributed (also for one rank) and return the compute device type."""
        device = choose_device(self.plan.device)
        # one group for both kinds of tensor: NCCL for CUDA ones, gloo for the CPU ones offloading leaves behind
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        if torch.cuda.is_available() and not dist.is_initialized():
            # Ray narrows CUDA_VISIBLE_DEVICES to this actor's GPU; a worker started by hand takes its local rank's
            torch.cuda.set_device(self.local_rank % torch.cuda.device_count())
        self.init_torch_distributed(backend=backend)
        self._compute_device = device
        self._mesh = None
        return device

    def _device_mesh(self, device: str):
        if self._mesh is None:
            self._mesh = device_mesh(device)
        return self._mesh

    def _device(self) -> str:
        # the parameters' own device is the CPU under param_offload; inputs go where the compute runs
        return self._compute_device

    def _placed_for(self, name: str):
        """After each pass of a model that offloads (``param_offload``/``offload_policy``, ``optimizer_offload``),
        the device memory its offload freed goes back to the driver (:mod:`verl.utils.device_memory`): FSDP2 and the
        optimizer return the blocks to PyTorch's caching allocator, which would otherwise keep them from the
        rollout engine and the other roles' processes. Once per pass, not per micro-batch: it costs a sync."""
        return releasing_device_memory(self._offloads_in(name))

    def _offloads_in(self, name: str) -> bool:
        """Whether the model the pass ``name`` runs offloads anything."""
        raise NotImplementedError

    def _save_checkpoint(self, directory: Path) -> None:
        """Every rank writes its shards (a collective save); rank 0 the gathered weights and shared training state;
        every rank its own random state."""
        self._trained().save_checkpoint(directory)
        if self.rank == 0:
            self._save_extras(directory)
        self._save_rank_state(directory)
        dist.barrier()


class FSDPActorRolloutRefWorker(_FSDPWorkerMixin, ActorRolloutRefWorker):
    """Actor, rollout and reference over an FSDP2-sharded Hugging Face causal LM."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> str:
        # (rollout.name=hf is refused by the config: it needs the whole model; generate would also stop each
        # rank at its own eos, while every forward pass of a sharded model needs all ranks)
        rollout = self.config.rollout.name
        self._join_process_group()
        description = super().init_model()
        if self.rollout_role is None:  # the rollout runs in a worker group of its own (hybrid_engine=false)
            return description
        engine = self.rollout_role.engine
        if hasattr(engine, "synchronize_stop"):
            engine.synchronize_stop(self._device_mesh(self._compute_device).get_group())
        elif not self.rollout_role.holds_weights:
            # a rollout over the actor's own forward pass must stop on every rank at the same step
            raise ValueError(
                f"actor_rollout_ref.rollout.name={rollout} cannot agree with the other ranks on when to stop "
                "sampling, which strategy=fsdp2 needs (every forward pass is a collective); use rollout.name=naive."
            )
        return description

    def _offloads_in(self, name: str) -> bool:
        # the reference's pass may run on the actor's model (LoRA: the adapters switched off)
        actor = offloads(self.config.actor.fsdp_config)
        return (cpu_offload(self.config.ref.fsdp_config) or actor) if name == "ref" else actor

    def _iter_hf_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Each weight gathered whole, one at a time (a collective every rank runs in the same order), for a
        rollout that holds its own copy of the weights; never the whole gathered model at once."""
        for name, tensor in self.actor.model_module().state_dict().items():
            yield name, (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor)

    def _build_actor(self, actor_config: ActorConfig, device: str, trainable: bool) -> FSDPPPOActor:
        from verl.models.loading import load_hf_causal_lm
        from verl.utils.cpu_linear import use_onednn_linear
        from verl.workers.actor.update_loop import TORCH_DTYPES
        from verl.workers.config.precision import model_dtype_of

        arr = self.config
        fsdp_config = actor_config.fsdp_config if trainable else arr.ref.fsdp_config
        # in CPU memory, in verl's model_dtype (the shards keep it): fully_shard moves only this rank's shards to the
        # device; build_fsdp_actor checks it against the compute dtype
        module = load_hf_causal_lm(
            arr.model.path,
            dtype=TORCH_DTYPES[model_dtype_of(fsdp_config, trainable=trainable)],
            device="cpu",
            trust_remote_code=arr.model.trust_remote_code,
            config_overrides=arr.model.override_config,
        )
        if arr.model.use_onednn_linear:
            use_onednn_linear(module, device)
        peft_model = None
        if trainable and arr.model.uses_lora:
            from verl.utils.lora import add_lora_adapters

            # before sharding: FSDP2 then shards the adapters with their layers (frozen base weights included)
            peft_model = add_lora_adapters(module, arr.model)
        actor = build_fsdp_actor(
            actor_config,
            module,
            mesh=self._device_mesh(device),
            total_training_steps=self.total_training_steps,
            trainable=trainable,
            fsdp_config=fsdp_config,
            enable_gradient_checkpointing=trainable and arr.model.enable_gradient_checkpointing,
            use_remove_padding=arr.model.use_remove_padding,
            enable_activation_offload=trainable and arr.model.enable_activation_offload,
            rank=self.rank,
        )
        actor.peft_model = peft_model
        return actor


class FSDPCriticWorker(_FSDPWorkerMixin, CriticWorker):
    """The critic as an FSDP2-sharded Hugging Face backbone with a value head."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> str:
        self._join_process_group()
        return super().init_model()

    def _offloads_in(self, name: str) -> bool:
        return offloads(self.config.model.fsdp_config)

    def _build_critic(self, critic_config: CriticConfig, device: str):
        from verl.workers.critic.fsdp_critic import build_fsdp_critic

        return build_fsdp_critic(
            critic_config.model.path,
            critic_config,
            mesh=self._device_mesh(device),
            total_training_steps=self.total_training_steps,
            rank=self.rank,
        )
