"""The recipe's `failure_rate` policy, selected the way a user would: by name, with `module:`."""

import sys

import pytest

from tests.workers.update_outcome.scaler_sim import simulate
from verl.workers.update_outcome import (
    UPDATE_OUTCOME_HANDLER_REGISTRY,
    UpdateFailedError,
    UpdateOutcome,
    build_update_outcome_handler,
)

MODULE = "recipe.fp16_guard.failure_rate"


@pytest.fixture(autouse=True)
def fresh_registry():
    # The recipe registers "failure_rate" at import time; other tests compare the full list of registered names,
    # so each test gets its own copy of the registry and a fresh import.
    sys.modules.pop(MODULE, None)
    with UPDATE_OUTCOME_HANDLER_REGISTRY.scoped():
        yield
    sys.modules.pop(MODULE, None)


def build(**params):
    return build_update_outcome_handler({"name": "failure_rate", "module": MODULE, **params}, dtype="float16")


def outcome(step, ok=False, scale=None, floor=None, role="actor"):
    # scale=None: no dynamic loss scaling (fp32/bf16), so a failure is never absorbable.
    return UpdateOutcome(ok, 1.0 if ok else float("nan"), None, scale, floor, step=step, role=role)


def run_sequence(handler, pattern, role="actor"):
    """Feed 'S'/'F' outcomes from step 1; return the metrics of each handled step."""
    return [handler.handle(outcome(i, ok=c == "S", role=role)) for i, c in enumerate(pattern, start=1)]


def test_defaults_through_the_module_mapping():
    handler = build()
    assert type(handler).__name__ == "FailureRateHandler"
    assert (handler.window, handler.max_failure_rate, handler.min_updates, handler.count_absorbed) == (
        50,
        0.5,
        50,
        False,
    )


def test_window_4_rate_half_raises_at_step_5():
    handler = build(window=4, max_failure_rate=0.5)
    # step 1 S [0]        rate 0    (1 < 4 updates: no decision)
    # step 2 F [0,1]      rate 0.5
    # step 3 F [0,1,1]    rate 2/3  (still only 3 updates: no decision)
    # step 4 S [0,1,1,0]  rate 0.5, full window, not > 0.5: continue
    got = run_sequence(handler, "SFFS")
    assert [m["actor/update_failure_rate"] for m in got] == [0.0, 0.5, pytest.approx(2 / 3), 0.5]
    assert [m["actor/update_failed"] for m in got] == [0.0, 1.0, 1.0, 0.0]
    # step 5 F [1,1,0,1]: 3 of 4 failed, 0.75 > 0.5 -> stop (although only 1 failure in a row)
    with pytest.raises(UpdateFailedError) as info:
        handler.handle(outcome(5))
    message = str(info.value)
    assert info.value.step == 5 and info.value.role == "actor"
    assert "actor update failure rate too high at step 5" in message
    assert "3 of the last 4 updates failed" in message
    assert "rate of 0.75" in message
    assert "max_failure_rate=0.5 over window=4" in message
    assert "grad_norm=nan, loss_scale=n/a" in message
    assert "actor_rollout_ref.actor.update_failure_policy.max_failure_rate" in message


def test_no_decision_before_the_window_is_full_then_raises_on_a_success():
    handler = build(window=4, max_failure_rate=0.5)
    # steps 1-3 F: rate 1.0 but only 3 of the 4 updates min_updates needs
    assert [m["actor/update_failure_rate"] for m in run_sequence(handler, "FFF")] == [1.0, 1.0, 1.0]
    # step 4 S fills the window [1,1,1,0]: 0.75 > 0.5 -> stop, even though this update was applied
    with pytest.raises(UpdateFailedError, match="at step 4: 3 of the last 4 updates failed") as info:
        handler.handle(outcome(4, ok=True))
    assert "This step's update was applied" in str(info.value)


def test_alternating_failures_stay_at_the_limit_and_never_raise():
    handler = build(window=4, max_failure_rate=0.5)
    # F S F S ...: every full window holds exactly 2 of 4 failures = 0.5, not more than the limit
    got = run_sequence(handler, "FS" * 10)
    assert [m["actor/update_failure_rate"] for m in got[3:]] == [0.5] * 17
    assert got[-1]["actor/update_failures_total"] == 10.0


def test_min_updates_decides_earlier():
    handler = build(window=4, max_failure_rate=0.5, min_updates=2)
    handler.handle(outcome(1))  # [1]: 1 update < 2, no decision
    with pytest.raises(UpdateFailedError, match="2 of the last 2 updates failed"):
        handler.handle(outcome(2))  # [1,1] = 1.0 > 0.5


def test_absorbed_failures_are_not_counted_by_default():
    handler = build(window=4, max_failure_rate=0.5)
    # scale 2**16 above the floor 1: the scaler can still back off -> absorbed, recorded as 0
    got = [handler.handle(outcome(i, scale=2.0**16, floor=1.0)) for i in range(1, 11)]
    assert [m["actor/update_failure_rate"] for m in got] == [0.0] * 10
    assert [m["actor/update_failed"] for m in got] == [1.0] * 10
    assert got[-1]["actor/loss_scale"] == 2.0**16
    # failures at the floor (scale == min scale) are not absorbable: steps 11, 12 give [0,0,1,1] = 0.5, step 13
    # [0,1,1,1] = 0.75 -> stop
    handler.handle(outcome(11, scale=1.0, floor=1.0))
    assert handler.handle(outcome(12, scale=1.0, floor=1.0))["actor/update_failure_rate"] == 0.5
    with pytest.raises(UpdateFailedError, match="at step 13: 3 of the last 4 updates failed"):
        handler.handle(outcome(13, scale=1.0, floor=1.0))


def test_a_healthy_fp16_start_does_not_stop_unless_absorbed_failures_count():
    def overflows(step, scale):
        # Gradients overflow while the scale is above 2**16. From 2**32 with hysteresis 2, step 1 only spends the
        # hysteresis, then every overflow halves: step k >= 2 uses 2**(34 - k), so steps 1..17 fail and step 18
        # (scale 2**16) is the first applied update.
        return scale > 2.0**16

    handler = build(window=8, max_failure_rate=0.5)
    got = [handler.handle(o) for o in simulate(overflows, 30)]
    assert sum(m["actor/update_failed"] for m in got) == 17
    assert max(m["actor/update_failure_rate"] for m in got) == 0.0

    counting = build(window=8, max_failure_rate=0.5, count_absorbed=True)
    with pytest.raises(UpdateFailedError) as info:
        for o in simulate(overflows, 30):
            counting.handle(o)
    # steps 1..8 all failed: the window is full at step 8 with rate 1.0
    assert info.value.step == 8
    assert "8 of the last 8 updates failed, a rate of 1" in str(info.value)
    assert "not counted" not in str(info.value)


def test_critic_role_names_its_own_key():
    handler = build(window=2, max_failure_rate=0.5)
    with pytest.raises(UpdateFailedError) as info:
        run_sequence(handler, "FF", role="critic")
    assert "critic update failure rate too high at step 2" in str(info.value)
    assert "critic.update_failure_policy.max_failure_rate" in str(info.value)


def test_state_round_trip_continues_the_same_decisions():
    handler = build(window=4, max_failure_rate=0.5)
    run_sequence(handler, "SFFS")
    state = handler.state_dict()
    # the two failures have no loss scale (fp32/bf16): non-finite gradients by cause
    by_cause = {"scaled_grad_overflow": 0, "nonfinite_loss": 0, "nonfinite_inputs": 0, "nonfinite_grads": 2}
    assert state == {
        "num_total_failures": 2,
        "num_consecutive_failures": 0,
        "last_step": 4,
        "window": [0, 1, 1, 0],
        "failures_by_cause": by_cause,
    }

    resumed = build(window=4, max_failure_rate=0.5)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state
    # the same step 5 failure that stops the original run ([1,1,0,1] = 0.75) stops the resumed one
    with pytest.raises(UpdateFailedError, match="at step 5"):
        resumed.handle(outcome(5))


def test_load_keeps_the_newest_entries_of_a_longer_window():
    handler = build(window=4, max_failure_rate=0.5)
    handler.load_state_dict(
        {"num_total_failures": 3, "num_consecutive_failures": 0, "last_step": 6, "window": [1, 1, 1, 0, 0, 0]}
    )
    # the last 4 of [1,1,1,0,0,0] are [1,0,0,0]
    assert handler.state_dict()["window"] == [1, 0, 0, 0]
    assert handler.failure_rate == 0.25


def test_load_from_another_policy_starts_an_empty_window():
    handler = build(window=4, max_failure_rate=0.5)
    handler.load_state_dict({"num_total_failures": 5, "num_consecutive_failures": 5, "last_step": 5})
    assert handler.state_dict()["window"] == []
    assert handler.num_total_failures == 5


@pytest.mark.parametrize("window", [[0, 2], [True, 0], "0101", [0.5]])
def test_load_rejects_a_bad_window(window):
    handler = build(window=4, max_failure_rate=0.5)
    with pytest.raises(ValueError, match="'window' must be a list of 0/1"):
        handler.load_state_dict(
            {"num_total_failures": 0, "num_consecutive_failures": 0, "last_step": 0, "window": window}
        )


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"window": 0}, "window must be an integer >= 1, got 0"),
        ({"window": 2.5}, "window must be an integer >= 1, got 2.5"),
        ({"window": True}, "window must be an integer >= 1, got True"),
        ({"max_failure_rate": 0}, "max_failure_rate must satisfy 0 < max_failure_rate < 1"),
        ({"max_failure_rate": 1.0}, "max_failure_rate must satisfy 0 < max_failure_rate < 1"),
        ({"max_failure_rate": -0.1}, "max_failure_rate must satisfy 0 < max_failure_rate < 1"),
        ({"max_failure_rate": "0.5"}, "max_failure_rate must be a number"),
        ({"max_failure_rate": True}, "max_failure_rate must be a number"),
        ({"window": 4, "min_updates": 5}, "min_updates must be an integer between 1 and 4, got 5"),
        ({"min_updates": 0}, "min_updates must be an integer between 1 and 50, got 0"),
        ({"count_absorbed": "no"}, "count_absorbed must be true or false"),
    ],
)
def test_bad_parameters_fail_at_build_naming_the_parameter(params, expected):
    with pytest.raises(ValueError, match="failure_rate") as info:
        build(**params)
    assert expected in str(info.value)
    assert "actor_rollout_ref.actor.update_failure_policy" in str(info.value)


def test_unknown_parameter_lists_the_accepted_ones():
    with pytest.raises(ValueError, match="does not take parameter") as info:
        build(max_failures=3)
    for name in ("window", "max_failure_rate", "min_updates", "count_absorbed"):
        assert name in str(info.value)
