"""What each worker class's group exposes: registration resolved along the MRO, and one rollout-only group.

A subclass that overrides a registered method without repeating ``@register`` must keep it in its group's method
table with the same dispatch mode (before, it silently dropped out of the group); a subclass that re-decorates it
takes its own mode. The rollout group of its own exposes the rollout's methods, not the actor's.
"""

import pytest

from tests.workers.built import built_worker
from verl.single_controller import Dispatch, register
from verl.single_controller.decorator import RegisterSpec, registered_methods
from verl.single_controller.ray_worker_group import RayWorkerGroup
from verl.workers.dp_workers import DPActorRolloutRefWorker, DPCriticWorker
from verl.workers.fsdp_workers import FSDPActorRolloutRefWorker, FSDPCriticWorker
from verl.workers.megatron_workers import MegatronActorRolloutRefWorker, MegatronCriticWorker
from verl.workers.reward_model import RewardModelWorker
from verl.workers.rollout_worker import RolloutWorker

WORKER_CLASSES = [
    DPActorRolloutRefWorker,
    DPCriticWorker,
    FSDPActorRolloutRefWorker,
    FSDPCriticWorker,
    MegatronActorRolloutRefWorker,
    MegatronCriticWorker,
    RewardModelWorker,
    RolloutWorker,
]


def overriding_every_registered_method(cls: type) -> type:
    """A subclass of ``cls`` that overrides each registered method with a plain (undecorated) function."""

    def plain_override(name):
        def method(self, *args, **kwargs):
            return getattr(super(subclass, self), name)(*args, **kwargs)

        method.__name__ = name
        return method

    names = registered_methods(cls)
    subclass = type(f"My{cls.__name__}", (cls,), {name: plain_override(name) for name in names})
    return subclass


@pytest.mark.parametrize("cls", WORKER_CLASSES, ids=lambda cls: cls.__name__)
def test_an_undecorated_override_keeps_its_registration_and_mode(cls):
    table = RayWorkerGroup._registered_methods(cls)
    subclass = overriding_every_registered_method(cls)
    assert all("__verl_register_spec__" not in vars(subclass)[name].__dict__ for name in table)  # truly plain
    # the group's method table of the subclass: the same methods, each with the mode of the method it overrides
    assert RayWorkerGroup._registered_methods(subclass) == table
    assert table  # every worker class exposes something (init_model at least)


def test_a_redecorated_override_takes_its_own_mode():
    class Critic(DPCriticWorker):
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def compute_values(self, data):
            return super().compute_values(data)

    assert registered_methods(DPCriticWorker)["compute_values"].dispatch_mode is Dispatch.DP_COMPUTE_PROTO
    assert registered_methods(Critic)["compute_values"] == RegisterSpec(
        dispatch_mode=Dispatch.ONE_TO_ALL,
        execute_mode=registered_methods(Critic)["init_model"].execute_mode,
        blocking=True,
    )


def test_the_rollout_group_exposes_the_rollouts_methods_only():
    exposed = set(registered_methods(RolloutWorker))
    # generate_tokens / release_rollout: the agent loops' turns, batched into the rollout (rollout/token_requests.py)
    assert exposed == {
        "init_torch_distributed",
        "init_model",
        "generate_sequences",
        "generate_tokens",
        "release_rollout",
        "load_weights",
        "stage_weights",
    }
    # the actor's methods stay with the actor workers
    actor = set(registered_methods(DPActorRolloutRefWorker))
    assert {"update_actor", "save_checkpoint", "compute_ref_log_prob"} <= actor
    assert not exposed & {"update_actor", "save_checkpoint", "load_checkpoint", "compute_log_prob", "export_weights"}


def test_the_megatron_workers_expose_what_the_other_backends_do():
    # the offload phase is one hook (_placed_for), not overrides of the registered methods: same table as dp
    assert registered_methods(MegatronActorRolloutRefWorker) == registered_methods(DPActorRolloutRefWorker)
    assert registered_methods(MegatronCriticWorker) == registered_methods(DPCriticWorker)
    assert "_placed_for" in vars(MegatronActorRolloutRefWorker) and "update_actor" not in vars(
        MegatronActorRolloutRefWorker
    )


def test_every_pass_goes_through_the_one_phase_hook(tmp_path):
    # a backend changes what happens around every pass by overriding _placed_for once (megatron: its offloading);
    # here a recording one lists the passes a generation, an update and a checkpoint round trip enter
    import contextlib

    from tests.workers.test_rollout_weight_sync import SMALL, update_batch
    from verl.workers.config import compose_ppo_config

    class Recording(DPActorRolloutRefWorker):
        entered: list[str] = []

        def _placed_for(self, name):
            self.entered.append(name)
            return contextlib.nullcontext()

    worker = built_worker(Recording, compose_ppo_config(["actor_rollout_ref.actor.strategy=dp", *SMALL]), 4)
    worker.init_model()
    batch = update_batch(worker)  # generate_sequences, then compute_log_prob
    worker.update_actor(batch)
    worker.save_checkpoint(str(tmp_path / "ckpt"))
    worker.load_checkpoint(str(tmp_path / "ckpt"))
    assert worker.entered == ["gen", "old_log_prob", "update_actor", "checkpoint", "checkpoint"]
