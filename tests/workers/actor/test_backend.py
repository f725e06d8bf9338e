"""The training backends: each one declares all its differences in its own class, and the loop obeys them.

The loop, the roles and the models' classes hold no backend behaviour of their own: a test fails when a backend
inherits an answer instead of stating it, when a role or model class overrides what the backend decides, or when
the fire drill strikes anywhere but where the backend says. The contract is narrow: a test fails when a backend's
method takes the loop, when a backend module reads the loop's members or imports the loop's module, or when
megatron's path is not the backend class chosen at build time.
"""

import ast
import contextlib
import inspect
from pathlib import Path

import pytest
import torch

from tests.workers.actor.conftest import actor_config, ppo_batch, tiny_qwen2
from verl.workers.actor.backend import (
    FIRE_DRILL_TARGETS,
    BackendParts,
    DPBackend,
    FireDrillTarget,
    FSDPBackend,
    TrainingBackend,
)
from verl.workers.actor.dp_actor import DataParallelPPOActor, build_dp_actor
from verl.workers.actor.fsdp_actor import FSDPPPOActor
from verl.workers.actor.megatron_actor import MegatronPPOActor
from verl.workers.actor.megatron_backend import (
    MegatronBackend,
    MegatronScheduleBackend,
    MegatronStagesBackend,
    megatron_backend,
)
from verl.workers.actor.update_loop import UpdateLoop, build_loop_parts
from verl.workers.critic.dp_critic import DataParallelPPOCritic
from verl.workers.critic.fsdp_critic import FSDPPPOCritic
from verl.workers.critic.megatron_critic import MegatronPPOCritic

BACKENDS = [DPBackend, FSDPBackend, MegatronBackend, MegatronStagesBackend, MegatronScheduleBackend]
MODEL_CLASSES = [
    DataParallelPPOActor,
    FSDPPPOActor,
    MegatronPPOActor,
    DataParallelPPOCritic,
    FSDPPPOCritic,
    MegatronPPOCritic,
]
# what the loop delegates to its backend: no class between the loop and a model's class may redefine it
LOOP_DELEGATES = ["autocast", "_backward_mini_batch", "_optimizer_step", "save_checkpoint", "load_checkpoint"]


class FakeMesh:
    device_type = "cpu"


def attached(backend: TrainingBackend, loop: UpdateLoop) -> TrainingBackend:
    """``backend`` holding what ``loop`` trains with, as the loop hands it over when it is built."""
    backend.attach(
        BackendParts(loop.model_module(), loop.optimizer, loop.dtype, loop.micro_batching, loop.fault_injector)
    )
    return backend


@pytest.mark.parametrize("backend_cls", BACKENDS)
def test_every_backend_answers_every_question_in_its_own_class(backend_cls):
    questions = set(TrainingBackend.__abstractmethods__)
    assert questions == {
        "autocast",
        "lockstep",
        "holds_a_copy_of_rows",
        "backward_mini_batch",
        "step",
        "loss_scale",
        "min_loss_scale",
        "save_checkpoint",
        "load_checkpoint",
    }
    for name in questions:
        assert name in vars(backend_cls), f"{backend_cls.__name__} inherits {name} instead of stating it"
    assert backend_cls.__mro__[1] is TrainingBackend  # no backend builds on another one
    assert isinstance(backend_cls.name, str) and backend_cls.name


def test_a_data_parallel_rank_holds_rows_of_its_own():
    # dp and fsdp2 ranks each take their own rows (the ranks of a megatron model-parallel group take copies:
    # tests/special_distributed/test_megatron_tp_gloo.py counts non-finite inputs with them)
    assert DPBackend().holds_a_copy_of_rows() is False
    assert FSDPBackend(FakeMesh()).holds_a_copy_of_rows() is False


@pytest.mark.parametrize("model_cls", MODEL_CLASSES)
def test_roles_and_models_leave_the_backend_questions_to_the_backend(model_cls):
    for klass in model_cls.__mro__[: model_cls.__mro__.index(UpdateLoop)]:
        overridden = [name for name in LOOP_DELEGATES if name in vars(klass)]
        assert not overridden, f"{klass.__name__} overrides {overridden}, which its backend decides"


def test_where_each_backend_fires_the_drill():
    assert DPBackend().fire_drill_target == "gradients"  # AmpOptimizer reduces them in its step
    assert FSDPBackend(FakeMesh()).fire_drill_target == "gradients"  # so does the sharded optimizer
    # megatron-core's DDP reduces the gradients inside its schedule: the losses are poisoned there
    assert MegatronScheduleBackend(torch.nn.Linear(1, 1)).fire_drill_target == "loss"
    assert MegatronBackend(torch.nn.Linear(1, 1)).fire_drill_target == "gradients"  # the CPU path's AmpOptimizer
    assert MegatronStagesBackend.fire_drill_target == "gradients"  # the adapter again, over pipeline stages
    for backend_cls in BACKENDS:  # a member of the enum, not a bare string
        assert isinstance(backend_cls.fire_drill_target, FireDrillTarget)
        assert backend_cls.fire_drill_target in FIRE_DRILL_TARGETS
    assert {str(target) for target in FireDrillTarget} == {"gradients", "loss"}


def test_how_each_backend_autocasts():
    linear = torch.nn.Linear(2, 2)
    loop = build_dp_actor(actor_config(dtype="bfloat16"), tiny_qwen2(), total_training_steps=1)
    with attached(DPBackend(), loop).autocast():
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    with attached(FSDPBackend(FakeMesh()), loop).autocast():  # the mesh's device, wherever the parameters are
        assert torch.is_autocast_enabled("cpu")
    # megatron-core's GPU path holds the parameters in the compute dtype already: no autocast
    assert isinstance(attached(MegatronScheduleBackend(linear), loop).autocast(), contextlib.nullcontext)
    with attached(MegatronBackend(linear), loop).autocast():
        assert torch.is_autocast_enabled("cpu")
    fp32 = build_dp_actor(actor_config(), tiny_qwen2(), total_training_steps=1)
    assert isinstance(attached(DPBackend(), fp32).autocast(), contextlib.nullcontext)


def test_the_dp_drill_poisons_the_gradients_not_the_losses():
    actor = build_dp_actor(
        actor_config(fault_injection={"nonfinite_grad_steps": [1]}), tiny_qwen2(), total_training_steps=1
    )
    batch = ppo_batch()
    metrics = actor._backward_mini_batch(batch, 1.0)
    assert all(torch.isfinite(torch.tensor(m["actor/pg_loss"])) for m in metrics)  # the losses stay finite
    assert all(torch.isfinite(p.grad).all() for p in actor.trainable_parameters())
    outcome = actor._optimizer_step()  # the drill strikes here, on the gradients
    assert not outcome.successful and outcome.step == 1


class CountingOptimizer:
    """megatron-core's bf16/fp32 optimizer's contract: applies whatever it gets and reports success."""

    def __init__(self):
        self.num_steps = 0

    def step(self):
        self.num_steps += 1
        return True, 1.0, 0

    def get_loss_scale(self):
        return torch.tensor(1.0)

    def zero_grad(self):
        pass


def cpu_schedule(*, forward_step_func, data_iterator, model, num_microbatches, seq_length, micro_batch_size, **_):
    """What megatron-core's no-pipelining schedule does with a loss, without its CUDA-only parts: forward each
    micro-batch, divide its loss by the number of micro-batches, backward."""
    for _ in range(num_microbatches):
        output, loss_func = forward_step_func(data_iterator, model[0])
        loss, _ = loss_func(output)
        (loss / num_microbatches).backward()


def megatron_actors(fault_injection):
    """(CPU-path actor, GPU-path actor driven by :func:`cpu_schedule`) on the same fp32 weights."""
    from verl.workers.actor.megatron_builder import build_megatron_actor

    megatron = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "use_megatron_optimizer": False}
    config = actor_config(strategy="megatron", megatron=megatron, seed=1, fault_injection=fault_injection)
    hf_model = tiny_qwen2()

    def build():
        return build_megatron_actor(
            hf_model.config, config, device="cpu", total_training_steps=1, hf_state_dict=hf_model.state_dict()
        )

    model = build().model
    model.zero_grad_buffer = lambda: model.zero_grad(set_to_none=True)  # megatron-core DDP's, for plain grads
    parts = build_loop_parts(config, rank=0)
    scheduled = MegatronPPOActor(config, model, CountingOptimizer(), use_megatron_schedule=True, **parts)
    return build(), scheduled


@pytest.mark.usefixtures("megatron_world_of_one")
@pytest.mark.parametrize("drill", [False, True])
def test_the_megatron_schedule_poisons_the_losses_and_weights_them_as_plain_accumulation(monkeypatch, drill):
    import megatron.core.pipeline_parallel as pipeline_parallel

    monkeypatch.setattr(pipeline_parallel, "get_forward_backward_func", lambda: cpu_schedule)
    plain, scheduled = megatron_actors({"nonfinite_grad_steps": [1] if drill else []})
    batch = ppo_batch()
    plain._backward_mini_batch(batch, 1.0)  # the CPU path: no drill in the backward
    assert all(torch.isfinite(p.grad).all() for p in plain.trainable_parameters())
    scheduled._backward_mini_batch(batch, 1.0)
    grads = [p.grad for p in scheduled.trainable_parameters()]
    if drill:
        # the losses of update 1 were poisoned inside the schedule, so every gradient is NaN before the step,
        # which the bf16/fp32 guard then refuses without calling the optimizer
        assert all(torch.isnan(g).all() for g in grads)
        outcome = scheduled._optimizer_step()
        assert not outcome.successful and scheduled.optimizer.num_steps == 0
    else:
        # loss x share x num_micro / num_micro: the same gradients as weighted accumulation (other micro-batch cuts)
        for want, got in zip([p.grad for p in plain.trainable_parameters()], grads, strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
        assert scheduled._optimizer_step().successful and scheduled.optimizer.num_steps == 1


def all_backend_classes() -> set[type]:
    found, todo = set(), [TrainingBackend]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.add(sub)
            todo.append(sub)
    return found


def test_no_backend_method_takes_the_loop():
    # the contract: parts at build time, a MiniBatchLoss per mini-batch, CheckpointContents per checkpoint
    backend_classes = all_backend_classes()
    assert set(BACKENDS) <= backend_classes
    for backend_cls in backend_classes | {TrainingBackend}:
        for name, member in inspect.getmembers(backend_cls, inspect.isfunction):
            if name.startswith("_"):
                continue
            for param in inspect.signature(member).parameters.values():
                assert param.name != "loop", f"{backend_cls.__name__}.{name} takes the loop"
                assert "UpdateLoop" not in str(param.annotation), f"{backend_cls.__name__}.{name}: {param}"


BACKEND_MODULES = ["backend.py", "megatron_backend.py", "megatron_checkpoint.py"]


@pytest.mark.parametrize("filename", BACKEND_MODULES)
def test_backend_modules_neither_import_the_loop_nor_read_its_members(filename):
    import verl.workers.actor as actor_package

    source = (Path(actor_package.__file__).parent / filename).read_text()
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            imported.add(node.module)
        elif isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
    assert "verl.workers.actor.update_loop" not in imported  # type hints included: no cycle with the loop
    assert "loop." not in source  # what `grep -n "loop\\." backend*.py` checks


class FakeStage:
    is_last = True


def test_megatron_backend_is_chosen_by_path():
    model = torch.nn.Linear(1, 1)
    assert type(megatron_backend(model, use_megatron_schedule=True)) is MegatronScheduleBackend
    stages = megatron_backend(model, use_megatron_schedule=False, stage=FakeStage(), run_stage=lambda m, t: (None, m))
    assert type(stages) is MegatronStagesBackend
    assert type(megatron_backend(model, use_megatron_schedule=False)) is MegatronBackend
    # a frozen reference in stages next to megatron-core's path never trains: the plain class, without autocast
    frozen = megatron_backend(model, use_megatron_schedule=False, stage=FakeStage(), params_in_compute_dtype=True)
    assert type(frozen) is MegatronBackend and frozen.params_in_compute_dtype


@pytest.mark.usefixtures("megatron_world_of_one")
def test_the_megatron_builder_and_actor_take_the_backend_of_their_path():
    plain, scheduled = megatron_actors({})
    assert type(plain.backend) is MegatronBackend  # built on CPU: the torch.optim adapter on a whole model
    assert type(scheduled.backend) is MegatronScheduleBackend
