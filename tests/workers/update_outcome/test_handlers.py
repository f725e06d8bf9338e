"""The built-in handlers over hand-written and simulated outcome sequences."""

import logging
import math

import pytest

from tests.workers.update_outcome.scaler_sim import SimulatedScaler, simulate
from verl.workers.update_outcome import (
    FP16WarnAndCountHandler,
    StrictHandler,
    UpdateFailedError,
    UpdateOutcome,
)


def outcome(step, ok=True, scale=None, floor=None, grad_norm=1.0, role="actor"):
    return UpdateOutcome(
        successful=ok,
        grad_norm=grad_norm if ok else None,
        num_zeros_in_grad=None,
        loss_scale=scale,
        min_loss_scale=floor,
        step=step,
        role=role,
    )


# ---------------------------------------------------------------- strict


def test_strict_passes_successes_with_metrics():
    handler = StrictHandler()
    metrics = handler.handle(outcome(1))
    assert metrics == {
        "actor/update_failed": 0.0,
        "actor/update_failures_consecutive": 0.0,
        "actor/update_failures_total": 0.0,
    }


def test_strict_raises_on_first_failure_with_full_message():
    handler = StrictHandler()
    handler.handle(outcome(1, scale=1024.0, floor=1.0))
    with pytest.raises(UpdateFailedError) as info:
        handler.handle(outcome(2, ok=False, scale=512.0, floor=1.0))
    message = str(info.value)
    for part in ("actor", "step 2", "overflow", "grad_norm=n/a", "loss_scale=512", "1 consecutive", "1 in total"):
        assert part in message, part
    assert "actor_rollout_ref.actor.update_failure_policy" in message
    assert info.value.step == 2 and info.value.role == "actor"


def test_strict_message_names_the_critic_key_and_nonfinite_norm():
    handler = StrictHandler()
    failed = UpdateOutcome(False, math.nan, None, None, None, step=1, role="critic")
    with pytest.raises(UpdateFailedError) as info:
        handler.handle(failed)
    assert "critic update failed at step 1" in str(info.value)
    assert "non-finite gradient norm" in str(info.value)
    assert "critic.update_failure_policy" in str(info.value)


# ---------------------------------------------------------------- fp16_warn_and_count, hand-written sequences


def test_fp16_counts_and_resets_on_success():
    handler = FP16WarnAndCountHandler(max_consecutive_failures=3)
    # Scale at the floor (1.0): no failure is absorbed. Sequence F F S F:
    #   step 1 F -> consecutive 1, total 1, unabsorbed 1
    #   step 2 F -> consecutive 2, total 2, unabsorbed 2
    #   step 3 S -> consecutive 0, total 2, unabsorbed 0
    #   step 4 F -> consecutive 1, total 3, unabsorbed 1
    seq = [False, False, True, False]
    got = [handler.handle(outcome(i + 1, ok=ok, scale=1.0, floor=1.0)) for i, ok in enumerate(seq)]
    assert [m["actor/update_failures_consecutive"] for m in got] == [1, 2, 0, 1]
    assert [m["actor/update_failures_total"] for m in got] == [1, 2, 2, 3]
    assert [m["actor/update_failed"] for m in got] == [1, 1, 0, 1]
    assert [m["actor/update_failures_unabsorbed"] for m in got] == [1, 2, 0, 1]
    assert all(m["actor/loss_scale"] == 1.0 for m in got)


def test_fp16_raises_exactly_past_the_limit():
    handler = FP16WarnAndCountHandler(max_consecutive_failures=3)
    # Limit 3: failures 1, 2, 3 are skipped; the 4th consecutive unabsorbed failure is "more than 3" -> raise at step 4.
    for step in (1, 2, 3):
        handler.handle(outcome(step, ok=False, scale=1.0, floor=1.0))
    with pytest.raises(UpdateFailedError) as info:
        handler.handle(outcome(4, ok=False, scale=1.0, floor=1.0))
    assert "step 4" in str(info.value) and "max_consecutive_failures=3" in str(info.value)
    assert "4 consecutive (4 not absorbed" in str(info.value)


def test_fp16_absorbed_failures_do_not_count_towards_the_limit():
    handler = FP16WarnAndCountHandler(max_consecutive_failures=1)
    # Scale 2**20 above floor 1: every failure is absorbed, so 50 in a row never reach the limit of 1.
    for step in range(1, 51):
        metrics = handler.handle(outcome(step, ok=False, scale=2.0**20, floor=1.0))
    assert metrics["actor/update_failures_consecutive"] == 50
    assert metrics["actor/update_failures_unabsorbed"] == 0


def test_fp16_without_loss_scaler_counts_every_failure():
    handler = FP16WarnAndCountHandler(max_consecutive_failures=2)
    # bf16/fp32: loss_scale None -> not absorbable; failures 1 and 2 pass, the 3rd raises.
    handler.handle(outcome(1, ok=False))
    metrics = handler.handle(outcome(2, ok=False))
    assert "actor/loss_scale" not in metrics
    with pytest.raises(UpdateFailedError, match="step 3"):
        handler.handle(outcome(3, ok=False))


def test_fp16_warns_with_the_numbers(caplog):
    handler = FP16WarnAndCountHandler()
    with caplog.at_level(logging.WARNING, logger="verl.workers.update_outcome.handlers"):
        handler.handle(outcome(7, ok=False, scale=65536.0, floor=1.0))
    (record,) = caplog.records
    text = record.getMessage()
    for part in ("step 7", "loss scaler backs off", "loss_scale=65536", "grad_norm=n/a", "1 consecutive", "1 in total"):
        assert part in text, part


def test_same_step_twice_is_rejected_and_not_double_counted():
    handler = FP16WarnAndCountHandler()
    handler.handle(outcome(1, ok=False, scale=1.0, floor=1.0))
    with pytest.raises(ValueError, match="already handled"):
        handler.handle(outcome(1, ok=False, scale=1.0, floor=1.0))
    assert handler.num_total_failures == 1


def test_state_dict_round_trips_the_counters():
    handler = FP16WarnAndCountHandler(max_consecutive_failures=5)
    for step, ok in enumerate([False, True, False, False], start=1):
        handler.handle(outcome(step, ok=ok, scale=1.0, floor=1.0))
    state = handler.state_dict()
    # F S F F -> total 3, consecutive 2, unabsorbed 2, last step 4; all three with a loss scale: overflows
    assert state == {
        "num_total_failures": 3,
        "num_consecutive_failures": 2,
        "last_step": 4,
        "num_consecutive_unabsorbed": 2,
        "failures_by_cause": {
            "scaled_grad_overflow": 3,
            "nonfinite_loss": 0,
            "nonfinite_inputs": 0,
            "nonfinite_grads": 0,
        },
    }
    restored = FP16WarnAndCountHandler(max_consecutive_failures=5)
    restored.load_state_dict(state)
    assert restored.state_dict() == state
    # Both now decide identically: 3 more floor failures make unabsorbed 5 (allowed), the 4th makes 6 > 5.
    for step in (5, 6, 7):
        assert handler.handle(outcome(step, ok=False, scale=1.0, floor=1.0)) == restored.handle(
            outcome(step, ok=False, scale=1.0, floor=1.0)
        )
    for h in (handler, restored):
        with pytest.raises(UpdateFailedError):
            h.handle(outcome(8, ok=False, scale=1.0, floor=1.0))


def test_load_state_dict_rejects_bad_state():
    with pytest.raises(ValueError, match="missing 'last_step'"):
        StrictHandler().load_state_dict({"num_total_failures": 0, "num_consecutive_failures": 0})
    with pytest.raises(ValueError, match="non-negative integer"):
        StrictHandler().load_state_dict({"num_total_failures": -1, "num_consecutive_failures": 0, "last_step": 0})
    good = {"num_total_failures": 3, "num_consecutive_failures": 2, "last_step": 4}
    # Unabsorbed failures are a subset of the consecutive ones: 3 > 2 means a corrupt or hand-edited checkpoint.
    with pytest.raises(ValueError, match="num_consecutive_unabsorbed=3 > num_consecutive_failures=2"):
        FP16WarnAndCountHandler().load_state_dict({**good, "num_consecutive_unabsorbed": 3})
    with pytest.raises(ValueError, match="non-negative integer"):
        FP16WarnAndCountHandler().load_state_dict({**good, "num_consecutive_unabsorbed": "1"})
    # A checkpoint written under `strict` has no unabsorbed counter: the consecutive count is the safe bound.
    handler = FP16WarnAndCountHandler()
    handler.load_state_dict(good)
    assert handler.num_consecutive_unabsorbed == 2


# ---------------------------------------------------------------- simulated fp16 runs


def test_fp16_warm_up_from_2_pow_32_does_not_raise_with_defaults():
    # Gradients overflow whenever the scale exceeds 2**16. Hysteresis 2: step 1 (2**32) fails without a back-off,
    # step 2 (2**32) fails and halves; from then on each failure halves, so step k >= 2 uses 2**(34-k).
    # 2**(34-k) > 2**16 <=> k < 18: steps 1..17 fail (17 skipped, all above the floor 1.0 -> absorbed), step 18
    # succeeds at 2**16, and the run trains on.
    handler = FP16WarnAndCountHandler()
    results = [handler.handle(o) for o in simulate(lambda step, scale: scale > 2.0**16, num_steps=40)]
    failed_steps = [i + 1 for i, m in enumerate(results) if m["actor/update_failed"]]
    assert failed_steps == list(range(1, 18))
    assert results[17]["actor/loss_scale"] == 2.0**16
    assert results[-1]["actor/update_failures_total"] == 17
    assert results[-1]["actor/update_failures_consecutive"] == 0


def test_literal_rule_would_stop_the_same_warm_up():
    # ignore_loss_scale_backoff=False counts every failure: the 11th consecutive failure (step 11) exceeds 10.
    handler = FP16WarnAndCountHandler(ignore_loss_scale_backoff=False)
    with pytest.raises(UpdateFailedError, match="step 11"):
        for o in simulate(lambda step, scale: scale > 2.0**16, num_steps=40):
            handler.handle(o)


def test_gradients_that_stay_nan_raise_within_the_bound():
    # Every step overflows. Steps 1 and 2 use 2**32 (hysteresis 2), step k >= 2 uses 2**(34-k), which reaches the
    # floor 1.0 at k = 34. Steps 1..33 are absorbed (scale > floor); steps 34, 35, ... are not. The 11th unabsorbed
    # failure (> max_consecutive_failures=10) is step 34 + 10 = 44.
    # Bound from the issue: log2(2**32 / 1) + hysteresis 2 + max_consecutive_failures 10 + 1 = 45 >= 44.
    handler = FP16WarnAndCountHandler()
    raised_at = None
    try:
        for o in simulate(lambda step, scale: True, num_steps=100, scaler=SimulatedScaler(hysteresis=2)):
            handler.handle(o)
    except UpdateFailedError as err:
        raised_at = err.step
    assert raised_at == 44
    assert raised_at <= 32 + 2 + 10 + 1
