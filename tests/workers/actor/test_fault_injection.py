"""The fire drill's two strike points: gradients before the optimizer step, or losses before the backward."""

import logging
import math

import pytest
import torch

from verl.workers.actor.fault_injection import FaultInjector


def test_gradients_are_poisoned_only_on_drill_steps_and_chosen_ranks():
    param = torch.nn.Parameter(torch.ones(3))
    param.grad = torch.ones(3)
    on_rank_1 = FaultInjector([2], ranks=[1], rank=1)
    assert not on_rank_1.maybe_poison(1, [param]) and torch.equal(param.grad, torch.ones(3))
    assert on_rank_1.maybe_poison(2, [param]) and torch.isnan(param.grad).all()
    param.grad = torch.ones(3)
    assert not FaultInjector([2], ranks=[1], rank=0).maybe_poison(2, [param])  # rank 0 is not in the drill
    assert torch.equal(param.grad, torch.ones(3))


def test_megatron_main_grad_is_preferred_over_grad():
    param = torch.nn.Parameter(torch.ones(2))
    param.grad = torch.ones(2)
    param.main_grad = torch.ones(2)  # megatron-core's DDP accumulates here
    FaultInjector([1]).maybe_poison(1, [param])
    assert torch.isnan(param.main_grad).all() and torch.equal(param.grad, torch.ones(2))


def test_poisoned_loss_gives_nan_gradients_and_logs_once_per_step(caplog):
    injector = FaultInjector([3], ranks=None, rank=0)
    weight = torch.nn.Parameter(torch.tensor([2.0]))
    clean = injector.poison_loss(2, (weight * 3.0).sum())
    assert clean.item() == 6.0  # not a drill step: the loss is untouched
    with caplog.at_level(logging.WARNING, logger="verl.workers.actor.fault_injection"):
        for _ in range(2):  # two micro-batches of the same update
            loss = injector.poison_loss(3, (weight * 3.0).sum())
            assert math.isnan(loss.item())
    loss.backward()
    assert torch.isnan(weight.grad).all()
    assert sum("poisoned the losses of update step 3" in r.message for r in caplog.records) == 1


@pytest.mark.parametrize("steps", [[0], [-1], [1.5], "3"])
def test_bad_steps_name_the_key(steps):
    from tests.workers.actor.conftest import actor_config

    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.fault_injection\.nonfinite_grad_steps"):
        actor_config(fault_injection={"nonfinite_grad_steps": steps})
