"""Ray workers of the ``megatron`` backend: megatron-core GPTModels initialised from Hugging Face weights.

Which training path runs (megatron-core's optimizer, DDP and schedules on CUDA; the torch.optim adapter on CPU)
is decided by :meth:`verl.workers.config.MegatronConfig.training_path`; the builders log it. A rollout with its own
copy of the weights (``vllm``) gets them through the megatron -> Hugging Face converter, layer by layer.

Tensor parallelism and pipeline stages (``megatron.tensor_model_parallel_size`` and
``megatron.pipeline_model_parallel_size`` of the actor's and of the critic's section): the ranks of one
model-parallel group hold parts of one model, so they form one data-parallel rank: ``data_parallel_layout`` (from
megatron-core's groups) tells the driver to hand them the same rows and to take the results from the last stage's
tensor-parallel rank 0; they sample alike (the same seed, the same gathered logits). Checkpoints are collective
(per-rank shards plus the gathered weights).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import torch

from verl.single_controller import Dispatch, register
from verl.utils.megatron_offload import attach_offloader, offload_phase
from verl.workers.actor.megatron_actor import MegatronPPOActor
from verl.workers.base_worker import ActorRolloutRefWorker, CriticWorker, _process_group, setup_worker_process
from verl.workers.config import ActorConfig, CriticConfig


def _load_hf(model_config):
    """The Hugging Face model of ``actor_rollout_ref.model`` or ``critic.model``, in fp32 on the CPU."""
    from verl.models.loading import load_hf_causal_lm

    return load_hf_causal_lm(
        model_config.path,
        dtype=torch.float32,
        device="cpu",
        trust_remote_code=model_config.trust_remote_code,
        config_overrides=model_config.override_config,
    )


def _join_model_parallel_groups(worker, megatron) -> None:
    """Join torch.distributed and megatron-core's groups at ``megatron``'s sizes, before a model is built."""
    from verl.models.mcore import ensure_model_parallel_initialized

    setup_worker_process(worker, worker.plan.device)
    ensure_model_parallel_initialized(tp=megatron.tensor_model_parallel_size, pp=megatron.pipeline_model_parallel_size)


def _megatron_data_parallel_layout() -> tuple[int, bool]:
    """(this rank's data-parallel rank, whether it returns its group's results) from megatron-core's groups: the
    ranks of one model-parallel group (tensor-parallel ranks and pipeline stages, which megatron-core does not
    number consecutively) hold one data-parallel rank, and the last stage's tensor-parallel rank 0 returns the
    results (the losses' metrics exist on the last stage only)."""
    from megatron.core import parallel_state

    from verl.models.mcore.parallel import answers_for_its_rows

    return parallel_state.get_data_parallel_rank(), answers_for_its_rows()


class MegatronActorRolloutRefWorker(ActorRolloutRefWorker):
    """Actor, rollout and reference over a megatron-core GPTModel, split over ``tensor_model_parallel_size`` ranks
    and ``pipeline_model_parallel_size`` stages."""

    def _model_parallel_size(self) -> int:
        return self.config.actor.megatron.model_parallel_size

    def _checkpoint_is_collective(self) -> bool:
        return self.config.actor.megatron.checkpoint_is_collective

    def data_parallel_layout(self) -> tuple[int, bool]:
        return _megatron_data_parallel_layout()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> str:
        """Join torch.distributed and megatron-core's groups before the base worker builds the models."""
        _join_model_parallel_groups(self, self.config.actor.megatron)
        description = super().init_model()
        # megatron.*_offload: the parts each section selects wait in host memory until a phase needs them
        arr = self.config
        attach_offloader(self.actor, arr.actor.megatron)
        if self.ref is not None and self._ref_owner() is self.ref:
            attach_offloader(self.ref, arr.ref.megatron)
        return description

    def _ref_owner(self):
        """Whose model the reference runs: its own, or (LoRA) the actor's with the adapters off, which moves with
        the actor's offloader (the reference's offload keys then have no model of their own to move)."""
        from verl.utils.lora import AdaptersOffReference

        return self.actor if isinstance(self.ref, AdaptersOffReference) else self.ref

    def _placed_for(self, name: str):
        """The offloaded parts each pass needs on the device: the reference's model for ``ref``, the actor's with
        its gradients and optimizer state for the update and checkpoints, its parameters for the other passes."""
        if name == "ref":
            return offload_phase(self._ref_owner(), training=False)
        return offload_phase(self.actor, training=name in ("update_actor", "checkpoint"))

    def _build_actor(self, actor_config: ActorConfig, device: str, trainable: bool) -> MegatronPPOActor:
        from verl.workers.actor.megatron_builder import build_megatron_actor

        if not trainable:
            # the reference's own megatron section: its layout follows the actor's, its offload and checkpoint its own
            actor_config = actor_config.replace(megatron=self.config.ref.megatron)
        model_config = self.config.model
        hf_model = _load_hf(model_config)
        return build_megatron_actor(
            hf_model.config,
            actor_config,
            device=device,
            total_training_steps=self.total_training_steps,
            hf_state_dict=hf_model.state_dict(),
            trainable=trainable,
            rank=self.rank,
            process_group=_process_group(),
            lora=model_config.lora,
        )

    def _iter_hf_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The GPTModel's weights under Hugging Face names, converted one layer at a time (fused q/k/v and
        gate/up split back), for a rollout that holds its own copy."""
        from verl.models.mcore.weight_converter import iter_hf_weights

        return iter_hf_weights(self.actor.model_module(), self._hf_config)

    @functools.cached_property
    def _hf_config(self):
        """The Hugging Face config of ``actor_rollout_ref.model``: the names and layouts the weights go out in."""
        from verl.models.loading import load_hf_config

        model_config = self.config.model
        return load_hf_config(model_config.path, model_config.trust_remote_code, model_config.override_config)


class MegatronCriticWorker(CriticWorker):
    """The critic as a megatron-core GPTModel with a value head, split over ``critic.megatron.
    tensor_model_parallel_size`` ranks and ``pipeline_model_parallel_size`` stages."""

    def _model_parallel_size(self) -> int:
        return self.config.megatron.model_parallel_size

    def _checkpoint_is_collective(self) -> bool:
        return self.config.megatron.checkpoint_is_collective

    def data_parallel_layout(self) -> tuple[int, bool]:
        return _megatron_data_parallel_layout()

    def _build_critic(self, critic_config: CriticConfig, device: str):
        from verl.workers.critic.megatron_critic import build_megatron_critic

        hf_model = _load_hf(critic_config.model)
        return build_megatron_critic(
            hf_model.config,
            critic_config,
            total_training_steps=self.total_training_steps,
            hf_state_dict=hf_model.state_dict(),
            device=device,
            rank=self.rank,
            process_group=_process_group(),
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> str:
        _join_model_parallel_groups(self, self.config.megatron)
        description = super().init_model()
        attach_offloader(self.critic, self.config.megatron)  # critic.megatron.*_offload
        return description

    def _placed_for(self, name: str):
        """The critic's offloaded parts on the device: with its gradients and optimizer state for the update and
        checkpoints, its parameters alone for the values."""
        return offload_phase(self.critic, training=name in ("update_critic", "checkpoint"))
