"""A training step returns a typed UpdateResult: its outcomes, the run's counts (which survive a checkpoint), and the
metrics exactly as logged."""

import pytest

from tests.workers.actor.conftest import actor_config, ppo_batch, tiny_qwen2
from verl.workers.actor.dp_actor import build_dp_actor
from verl.workers.update_outcome import FailureCause, UpdateFailedError, UpdateResult, merge_rank_results


def make_actor(seed=0, **overrides):
    # 8 samples in mini-batches of 4: two optimizer updates per training step (one epoch)
    config = actor_config(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2, **overrides)
    return build_dp_actor(config, tiny_qwen2(seed), total_training_steps=100)


def fp16_at_2_32(seed=0):
    # loss x 2**32 overflows every fp16 backward of this model; fp16_warn_and_count (auto) skips without raising
    return make_actor(seed, dtype="float16", optim={"lr": 1e-2, "initial_loss_scale": 2.0**32})


def on_policy_batch(actor):
    batch = ppo_batch()
    batch.batch["old_log_probs"], _ = actor.compute_log_prob(batch)
    return batch


def test_a_step_of_two_overflowing_updates_reports_both_failed():
    actor = fp16_at_2_32()
    result = actor.update_policy(on_policy_batch(actor))
    assert isinstance(result, UpdateResult) and result.role == "actor"
    # 2 mini-batches -> 2 attempted updates, both overflow at 2**32 -> 0 applied, 2 failed since the run began
    assert result.num_attempted == 2 and result.num_successful == 0 and not result.updated
    assert (result.num_attempted_total, result.num_failed_total, result.num_applied_total) == (2, 2, 0)
    assert [o.cause for o in result.outcomes] == [FailureCause.SCALED_GRAD_OVERFLOW] * 2
    assert [o.step for o in result.outcomes] == [1, 2]
    # the metrics are the ones logged before the typed result: same keys, same values
    assert result.metrics["actor/num_updates_successful"] == 0.0
    assert result.metrics["actor/num_updates_attempted"] == 2.0
    assert result.metrics["actor/update_failures_total"] == 2.0
    assert result.metrics["actor/lr"] == pytest.approx(actor.optimizer.param_groups[0]["lr"])


def test_a_step_of_two_applied_updates_counts_them_over_the_run():
    actor = make_actor()
    first = actor.update_policy(on_policy_batch(actor))
    second = actor.update_policy(on_policy_batch(actor))
    # fp32: nothing overflows; two updates per step -> 2, then 4 attempted since the run began, none failed
    assert first.num_successful == 2 and first.updated
    assert (second.num_attempted_total, second.num_failed_total, second.num_applied_total) == (4, 0, 4)
    assert second.metrics["actor/num_updates_attempted"] == 4.0
    assert "actor/grad_norm" in second.metrics and "actor/pg_loss" in second.metrics


def test_a_failure_that_stops_the_run_is_counted_before_the_policy_raises():
    actor = make_actor(update_failure_policy="fp16_warn_and_count")
    batch = on_policy_batch(actor)
    batch.batch["advantages"][0, 0] = float("nan")
    # non-finite inputs: one update attempted and failed before any forward pass; no loss scale helps, so the
    # policy stops at once, and the loop's count already holds it (a checkpoint written after it would too)
    with pytest.raises(UpdateFailedError, match="nonfinite_inputs"):
        actor.update_policy(batch)
    assert (actor.num_update_steps, actor.num_failed_updates) == (1, 1)


def test_the_failure_count_survives_a_checkpoint(tmp_path):
    straight, source = fp16_at_2_32(), fp16_at_2_32()
    batch = on_policy_batch(straight)
    assert straight.update_policy(batch).num_failed_total == 2  # both updates of step 1 overflow (above)
    assert source.update_policy(batch).num_failed_total == 2
    source.save_checkpoint(tmp_path / "ckpt")
    resumed = fp16_at_2_32(seed=5)  # other weights: everything must come from the checkpoint
    resumed.load_checkpoint(tmp_path / "ckpt")
    assert (resumed.num_update_steps, resumed.num_failed_updates) == (2, 2)
    want, got = straight.update_policy(batch), resumed.update_policy(batch)
    # 2 failed before + this step's failures (2 attempted - its applied ones), as the straight run counts them
    assert got.num_failed_total == 2 + (2 - got.num_successful) == want.num_failed_total
    assert got.num_attempted_total == want.num_attempted_total == 4
    merge_rank_results([want, got], lambda ms: ms[0])  # the same outcomes on both: they agree


def test_a_checkpoint_without_the_count_falls_back_to_the_handlers_total():
    source = fp16_at_2_32()
    source.update_policy(on_policy_batch(source))
    state = source.training_state_dict()
    del state["num_failed_updates"]  # a checkpoint written before the loop kept its own count
    resumed = fp16_at_2_32()
    resumed.load_training_state_dict(state)
    assert resumed.num_failed_updates == state["update_outcome_handler"]["num_total_failures"] == 2
