"""The documented example policy `skip_budget`, selected the way a user would: by name, with `module:`."""

import sys

import pytest

from tests.workers.update_outcome.scaler_sim import SimulatedScaler, simulate
from verl.workers.update_outcome import (
    UPDATE_OUTCOME_HANDLER_REGISTRY,
    UpdateFailedError,
    UpdateOutcome,
    build_update_outcome_handler,
)

MODULE = "examples.update_failure_policy.skip_budget_handler"


@pytest.fixture(autouse=True)
def fresh_registry():
    # The example registers "skip_budget" at import time. Give each test its own copy of the registry and a fresh
    # import, so that the name is gone again afterwards: other tests compare the full list of registered names.
    sys.modules.pop(MODULE, None)
    with UPDATE_OUTCOME_HANDLER_REGISTRY.scoped():
        yield
    sys.modules.pop(MODULE, None)


def build(**params):
    return build_update_outcome_handler({"name": "skip_budget", "module": MODULE, **params}, dtype="float16")


def outcome(step, ok=False, scale=None, floor=None):
    return UpdateOutcome(ok, 1.0 if ok else None, None, scale, floor, step=step)


def test_selected_through_the_module_mapping_with_its_default():
    handler = build()
    assert type(handler).__name__ == "SkipBudgetHandler"
    assert handler.max_total_failures == 100


def test_budget_counts_only_unabsorbed_failures_across_successes():
    handler = build(max_total_failures=3)
    # step 1 F at 2**16 > floor 1: absorbed -> budget spent 0 (total 1, consecutive 1)
    # step 2 F at the floor 1: spent 1 (total 2, consecutive 2)
    # step 3 S: consecutive 0; the budget is for the whole run, spent stays 1
    # step 4 F without a loss scaler (None): never absorbable -> spent 2 (total 3, consecutive 1)
    # step 5 F at the floor: spent 3 == max_total_failures, still allowed (total 4, consecutive 2)
    steps = [
        outcome(1, scale=2.0**16, floor=1.0),
        outcome(2, scale=1.0, floor=1.0),
        outcome(3, ok=True, scale=1.0, floor=1.0),
        outcome(4),
        outcome(5, scale=1.0, floor=1.0),
    ]
    got = [handler.handle(o) for o in steps]
    assert [m["actor/update_failures_unabsorbed_total"] for m in got] == [0, 1, 1, 2, 3]
    assert [m["actor/update_failures_total"] for m in got] == [1, 2, 2, 3, 4]
    assert [m["actor/update_failures_consecutive"] for m in got] == [1, 2, 0, 1, 2]
    assert [m["actor/update_failed"] for m in got] == [1, 1, 0, 1, 1]
    # step 6 F at the floor: spent 4 > 3 -> stop, and the message says which key raises the budget.
    with pytest.raises(UpdateFailedError) as info:
        handler.handle(outcome(6, scale=1.0, floor=1.0))
    assert info.value.step == 6
    assert "max_total_failures=3" in str(info.value)
    assert "actor_rollout_ref.actor.update_failure_policy.max_total_failures" in str(info.value)


def test_state_round_trip_continues_the_same_budget():
    handler = build(max_total_failures=2)
    # F at the floor (spent 1), S, F absorbed at 2**10 (spent 1): total 2, consecutive 1, last step 3.
    for o in (
        outcome(1, scale=1.0, floor=1.0),
        outcome(2, ok=True, scale=1.0, floor=1.0),
        outcome(3, scale=1024.0, floor=1.0),
    ):
        handler.handle(o)
    state = handler.state_dict()
    assert state == {
        "num_total_failures": 2,
        "num_consecutive_failures": 1,
        "last_step": 3,
        "num_unabsorbed_failures": 1,
        # both failures had a loss scale: overflows of the scaled gradients
        "failures_by_cause": {
            "scaled_grad_overflow": 2,
            "nonfinite_loss": 0,
            "nonfinite_inputs": 0,
            "nonfinite_grads": 0,
        },
    }
    restored = build(max_total_failures=2)
    restored.load_state_dict(state)
    assert restored.state_dict() == state
    # Both: step 4 at the floor spends 2 (allowed), step 5 spends 3 > 2 -> raise.
    for h in (handler, restored):
        assert h.handle(outcome(4, scale=1.0, floor=1.0))["actor/update_failures_unabsorbed_total"] == 2
        with pytest.raises(UpdateFailedError, match="step 5"):
            h.handle(outcome(5, scale=1.0, floor=1.0))


def test_state_from_another_policy_falls_back_to_the_total():
    handler = build()
    # A fp16_warn_and_count checkpoint has no num_unabsorbed_failures: all 7 failures so far count as spent.
    handler.load_state_dict({"num_total_failures": 7, "num_consecutive_failures": 0, "last_step": 9})
    assert handler.num_unabsorbed_failures == 7
    with pytest.raises(ValueError, match="integer >= 0"):
        handler.load_state_dict(
            {"num_total_failures": 0, "num_consecutive_failures": 0, "last_step": 0, "num_unabsorbed_failures": -1}
        )


def test_all_nan_run_stops_after_the_budget():
    # Every step overflows. As in tests/workers/update_outcome/test_handlers.py: the scale reaches the floor 1.0 at
    # step 34 (steps 1..33 are absorbed); steps 34, 35, ... each spend one unit, and the 101st (> 100) is step 134.
    handler = build()
    with pytest.raises(UpdateFailedError) as info:
        for o in simulate(lambda step, scale: True, num_steps=300, scaler=SimulatedScaler(hysteresis=2)):
            handler.handle(o)
    assert info.value.step == 134


@pytest.mark.parametrize("bad", [0, -1, True, "5", 2.5])
def test_bad_budget_fails_at_start_up(bad):
    with pytest.raises(ValueError, match="max_total_failures must be an integer >= 1") as info:
        build(max_total_failures=bad)
    assert "actor_rollout_ref.actor.update_failure_policy" in str(info.value)


def test_unknown_parameter_is_rejected():
    with pytest.raises(ValueError, match=r"does not take parameter\(s\) \['max_consecutive_failures'\]"):
        build(max_consecutive_failures=3)
