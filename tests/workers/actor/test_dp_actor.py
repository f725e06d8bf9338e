"""DataParallelPPOActor: real fp16 overflow, strict, the fire drill, checkpoint resume."""

import logging

import pytest
import torch

from tests.tolerances import assert_gradients_close
from tests.workers.actor.conftest import actor_config, ppo_batch, tiny_qwen2
from verl.utils.checkpoint import atomic_directory
from verl.workers.actor.dp_actor import build_dp_actor
from verl.workers.update_outcome import FP16WarnAndCountHandler, StrictHandler, UpdateFailedError


def make_actor(seed=0, **overrides):
    model = tiny_qwen2(seed)
    return build_dp_actor(actor_config(**overrides), model, total_training_steps=100)


def batch_with_old_log_probs(actor, seed=0):
    batch = ppo_batch(seed=seed)
    batch.batch["old_log_probs"], _ = actor.compute_log_prob(batch)
    return batch


def snapshot(actor):
    params = {k: v.detach().clone() for k, v in actor.actor_module.state_dict().items()}
    opt_state = actor.optimizer.optimizer.state_dict()
    moments = {
        (pid, key): value.clone()
        for pid, state in opt_state["state"].items()
        for key, value in state.items()
        if isinstance(value, torch.Tensor)
    }
    return params, moments, actor.lr_scheduler.last_epoch


def assert_same(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_log_probs_match_a_direct_computation():
    actor = make_actor()
    batch = ppo_batch()
    log_probs, entropy = actor.compute_log_prob(batch, calculate_entropy=True)
    logits = actor.actor_module(
        input_ids=batch.batch["input_ids"],
        attention_mask=batch.batch["attention_mask"],
        position_ids=batch.batch["position_ids"],
    ).logits
    # the response token at t is predicted by the logits at position P + t - 1 (P = 4)
    expected = torch.log_softmax(logits[:, 3:7].float(), -1).gather(-1, batch.batch["responses"][..., None])[..., 0]
    torch.testing.assert_close(log_probs, expected, atol=1e-5, rtol=1e-5)
    assert entropy.shape == (8, 4) and torch.all(entropy > 0)


def test_only_the_response_positions_are_projected_onto_the_vocabulary():
    # the prompt's logits are never read: the model is asked for the last R + 1 = 5 positions (logits_to_keep), and
    # both the log-probs and the update's gradients are those of the whole-sequence path (use_torch_compile and
    # packed rows take the whole sequence)
    actor, whole = make_actor(), make_actor()
    whole.forward_response_logits = lambda ids, mask, pos, response_length: whole.forward_logits(ids, mask, pos)
    seen = []
    actor.actor_module.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs.get("logits_to_keep")), with_kwargs=True
    )
    batch = ppo_batch()
    torch.testing.assert_close(actor.compute_log_prob(batch)[0], whole.compute_log_prob(batch)[0], atol=0, rtol=0)
    assert seen == [5]
    for one in (actor, whole):
        one.update_policy(batch_with_old_log_probs(one))
    assert_gradients_close(whole.actor_module, actor.actor_module, batch.batch["input_ids"].shape[1])


def test_log_probs_are_taken_at_the_batch_temperature():
    actor = make_actor()
    batch = ppo_batch(temperature=0.7)
    log_probs, _ = actor.compute_log_prob(batch)
    logits = actor.actor_module(
        input_ids=batch.batch["input_ids"],
        attention_mask=batch.batch["attention_mask"],
        position_ids=batch.batch["position_ids"],
    ).logits[:, 3:7]
    responses = batch.batch["responses"][..., None]
    # by hand: log_softmax(logits / 0.7) at the sampled token; at temperature 1 the values differ
    expected = torch.log_softmax(logits.float() / 0.7, -1).gather(-1, responses)[..., 0]
    at_one = torch.log_softmax(logits.float(), -1).gather(-1, responses)[..., 0]
    torch.testing.assert_close(log_probs, expected, atol=1e-5, rtol=1e-5)
    assert (log_probs - at_one).abs().max() > 1e-3


def test_a_batch_without_temperature_is_refused_by_name():
    actor = make_actor()
    batch = batch_with_old_log_probs(actor)
    del batch.meta_info["temperature"]
    before = {k: v.clone() for k, v in actor.actor_module.state_dict().items()}
    with pytest.raises(ValueError, match=r"compute_log_prob: the batch's meta_info has no 'temperature'"):
        actor.compute_log_prob(batch)
    with pytest.raises(ValueError, match=r"update_policy: the batch's meta_info has no 'temperature'"):
        actor.update_policy(batch)
    assert actor.num_update_steps == 0  # refused before any update
    assert_same(before, actor.actor_module.state_dict())
    batch.meta_info["temperature"] = -1.0
    with pytest.raises(ValueError, match=r"meta_info\['temperature'\] must be a number >= 0"):
        actor.compute_log_prob(batch)


def test_real_fp16_overflow_is_absorbed_then_training_works(caplog):
    # Loss scale 2**32 overflows the fp16 backward; the scaler halves until the gradients fit. auto -> the fp16
    # policy, which skips those updates with a warning and raises nothing.
    actor = make_actor(dtype="float16")
    assert isinstance(actor.update_outcome_handler, FP16WarnAndCountHandler)
    batch = batch_with_old_log_probs(actor)
    losses, failed = [], []
    with caplog.at_level(logging.WARNING):
        for _ in range(30):
            metrics = actor.update_policy(batch).metrics
            failed.append(metrics["actor/update_failed"])
            losses.append(metrics["actor/pg_loss"])
    num_skipped = int(sum(failed))
    first_success = failed.index(0.0)
    # 2**32 overflows the first updates; near its range the scale may overflow once more (a further skip) and
    # then settles: the last updates all apply.
    assert first_success >= 2 and failed[:first_success] == [1.0] * first_success
    assert failed[-5:] == [0.0] * 5
    assert metrics["actor/update_failures_total"] == num_skipped
    assert metrics["actor/loss_scale"] < 2.0**32
    assert any("loss scaler backs off" in r.getMessage() for r in caplog.records)
    # Advantages +1 on even rows and -1 on odd rows: the surrogate loss falls once updates apply.
    assert losses[-1] < losses[first_success] - 0.05


def test_strict_raises_on_the_first_overflow():
    actor = make_actor(dtype="float16", update_failure_policy="strict")
    assert isinstance(actor.update_outcome_handler, StrictHandler)
    batch = batch_with_old_log_probs(actor)
    with pytest.raises(UpdateFailedError) as info:
        actor.update_policy(batch)
    message = str(info.value)
    assert "actor update failed at step 1" in message and "overflow" in message
    assert "loss_scale=4.29497e+09" in message


def test_fire_drill_steps_leave_weights_moments_and_schedule_untouched():
    # fp32 + fp16_warn_and_count: steps 2 and 3 get NaN gradients; steps 1 and 4 update.
    actor = make_actor(
        update_failure_policy="fp16_warn_and_count",
        fault_injection={"nonfinite_grad_steps": [2, 3], "ranks": None},
        optim={"lr_scheduler": "cosine", "lr_warmup_steps": 2},
    )
    batch = batch_with_old_log_probs(actor)
    actor.update_policy(batch)  # step 1 succeeds
    before = snapshot(actor)
    adam_step = actor.optimizer.optimizer.state_dict()["state"][0]["step"].clone()
    for expected_total in (1, 2):  # steps 2 and 3 are poisoned
        metrics = actor.update_policy(batch).metrics
        assert metrics["actor/update_failed"] == 1.0
        assert metrics["actor/update_failures_total"] == expected_total
    after = snapshot(actor)
    assert_same(before[0], after[0])  # weights bit for bit
    assert_same(before[1], after[1])  # moments bit for bit (exp_avg, exp_avg_sq, step)
    assert before[2] == after[2]  # the LR schedule did not advance
    assert torch.equal(actor.optimizer.optimizer.state_dict()["state"][0]["step"], adam_step)
    metrics = actor.update_policy(batch).metrics  # step 4 updates again
    assert metrics["actor/update_failed"] == 0.0
    assert actor.lr_scheduler.last_epoch == before[2] + 1


def test_fire_drill_under_strict_names_step_and_reason():
    actor = make_actor(fault_injection={"nonfinite_grad_steps": [1], "ranks": None})
    with pytest.raises(UpdateFailedError, match="step 1: non-finite gradient norm"):
        actor.update_policy(batch_with_old_log_probs(actor))


def test_fire_drill_config_is_validated():
    with pytest.raises(ValueError, match=r"fault_injection\.nonfinite_grad_steps must hold integers >= 1"):
        make_actor(fault_injection={"nonfinite_grad_steps": [0], "ranks": None})


def test_bad_batch_sizes_are_rejected():
    with pytest.raises(ValueError, match="must be a multiple of ppo_micro_batch_size_per_gpu"):
        make_actor(ppo_mini_batch_size=6, ppo_micro_batch_size_per_gpu=4)


def test_micro_batches_accumulate_to_the_mini_batch_gradient():
    # One mini-batch of 8 as 2 micro-batches of 4 must give the same update as one micro-batch of 8.
    a = make_actor(ppo_micro_batch_size_per_gpu=4)
    b = make_actor(ppo_micro_batch_size_per_gpu=8)
    batch = batch_with_old_log_probs(a)
    ma, mb = a.update_policy(batch).metrics, b.update_policy(batch).metrics
    assert ma["actor/grad_norm"] == pytest.approx(mb["actor/grad_norm"], rel=1e-5)
    assert_gradients_close(b.actor_module, a.actor_module, batch.batch["input_ids"].shape[1])


def test_token_budget_micro_batches_give_the_same_update():
    # use_dynamic_bsz: the 8 samples hold 7, 8, 7, 8, ... real tokens (rows 0 and 1 have one pad each); a budget of
    # 16 packs two samples per micro-batch -> 4 micro-batches instead of 1, with the same accumulated gradient.
    from verl.utils.micro_batching import split_micro_batches

    a = make_actor(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=16)
    b = make_actor(ppo_micro_batch_size_per_gpu=8)
    batch = batch_with_old_log_probs(a)
    assert [len(m) for m in split_micro_batches(batch, a.micro_batching)] == [2, 2, 2, 2]
    ma, mb = a.update_policy(batch).metrics, b.update_policy(batch).metrics
    assert ma["actor/grad_norm"] == pytest.approx(mb["actor/grad_norm"], rel=1e-5)
    assert_gradients_close(b.actor_module, a.actor_module, batch.batch["input_ids"].shape[1])


def test_checkpoint_resume_equals_an_uninterrupted_run(tmp_path):
    # fp16 so that the loss scaler's state and the handler's counters are part of what must be restored.
    straight = make_actor(dtype="float16")
    batch = batch_with_old_log_probs(straight)
    for _ in range(20):
        straight.update_policy(batch)
    resumed_src = make_actor(dtype="float16")
    for _ in range(18):
        resumed_src.update_policy(batch)
    with atomic_directory(tmp_path / "ckpt") as tmp:
        resumed_src.save_checkpoint(tmp)
    resumed = make_actor(seed=123, dtype="float16")  # different init: everything must come from the checkpoint
    resumed.load_checkpoint(tmp_path / "ckpt")
    assert resumed.update_outcome_handler.state_dict() == resumed_src.update_outcome_handler.state_dict()
    for _ in range(2):
        resumed.update_policy(batch)
    assert_same(straight.actor_module.state_dict(), resumed.actor_module.state_dict())
    assert resumed.num_update_steps == straight.num_update_steps == 20
    assert resumed.optimizer.get_loss_scale() == straight.optimizer.get_loss_scale()
    assert resumed.update_outcome_handler.state_dict() == straight.update_outcome_handler.state_dict()


def test_one_on_policy_update_without_old_log_probs_equals_the_separate_pass():
    # One mini-batch, one epoch: the update's own detached log-probs are the old log-probs, so leaving them out
    # gives the same loss (ratio exactly 1), the same gradient and so the same weights, up to rounding.
    with_pass, without_pass = make_actor(), make_actor()
    batch = batch_with_old_log_probs(with_pass)
    metrics_with = with_pass.update_policy(batch).metrics
    batch.pop(batch_keys=["old_log_probs"])
    metrics_without = without_pass.update_policy(batch).metrics
    assert metrics_without["actor/ppo_kl"] == 0.0 and metrics_without["actor/pg_clipfrac"] == 0.0
    assert metrics_without["actor/pg_loss"] == pytest.approx(metrics_with["actor/pg_loss"], abs=1e-6)
    for a, b in zip(with_pass.actor_module.parameters(), without_pass.actor_module.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("overrides", [{"ppo_epochs": 2}, {"ppo_mini_batch_size": 4}])
def test_more_than_one_update_needs_old_log_probs(overrides):
    actor = make_actor(**overrides)
    batch = ppo_batch()
    batch.pop(batch_keys=["old_log_probs"])
    with pytest.raises(ValueError, match="no old_log_probs, which only a single on-policy update"):
        actor.update_policy(batch)


def on_policy_batch(actor, shift=0.0):
    """The test batch without old log-probs (one on-policy update); the engine's log-probs: the actor's + shift."""
    batch = ppo_batch()
    own, _ = actor.compute_log_prob(batch)
    del batch.batch["old_log_probs"]
    batch.batch["rollout_log_probs"] = (own + shift) * batch.batch["response_mask"]
    return batch, own


def test_without_an_old_log_prob_pass_the_mismatch_is_taken_against_the_first_forward():
    from verl.trainer.ppo.rollout_corr import compute_mismatch_metrics

    actor = make_actor()
    batch, own = on_policy_batch(actor, shift=-0.1)  # the engine is 0.1 nats less sure of every token
    metrics = actor.update_policy(batch).metrics
    # the update's first forward is the actor's own log-prob of the batch (fp32: the same numbers)
    expected = compute_mismatch_metrics(batch.batch["rollout_log_probs"], own, batch.batch["response_mask"])
    assert metrics["rollout_corr/kl"] == pytest.approx(expected["rollout_corr/kl"], abs=1e-6)
    assert metrics["rollout_corr/kl"] == pytest.approx(-0.1, abs=1e-5)  # k1 = mean(log mu - log pi) = -0.1
    assert metrics["training/rollout_probs_diff_mean"] > 0


def test_reinforce_loss_at_ratio_one_takes_the_same_step_as_the_clipped_loss():
    # With mu = pi_theta the weight is 1, and at ratio 1 the clipped surrogate's gradient is -A grad log pi too:
    # both losses must move the weights identically.
    plain, weighted = make_actor(), make_actor()
    batch, _ = on_policy_batch(plain)
    plain.update_policy(batch)
    # what the trainer hands the actor in bypass mode: algorithm.rollout_correction, as a dict
    batch.meta_info["rollout_correction"] = {
        "bypass_mode": True,
        "loss_type": "reinforce",
        "rollout_is": "token",
        "rollout_is_threshold": 2.0,
    }
    metrics = weighted.update_policy(batch).metrics
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-6)
    for pa, pb in zip(plain.actor_module.parameters(), weighted.actor_module.parameters()):
        torch.testing.assert_close(pa, pb, atol=1e-6, rtol=1e-5)


def _saved_and_resumed(tmp_path, save, load, updates=3):
    """An fp16 actor trained ``updates`` times and saved with ``checkpoint.save_contents=save``, and another (another
    init) that loads the checkpoint with ``load_contents=load``: (the source, the resumed actor, its train_state)."""
    from verl.utils.checkpoint import TRAIN_STATE_FILE, load_state

    source = make_actor(dtype="float16", checkpoint={"save_contents": save})
    batch = batch_with_old_log_probs(source)
    for _ in range(updates):
        source.update_policy(batch)
    with atomic_directory(tmp_path / "ckpt") as tmp:
        source.save_checkpoint(tmp)
    resumed = make_actor(seed=123, dtype="float16", checkpoint={"save_contents": save, "load_contents": load})
    resumed.load_checkpoint(tmp_path / "ckpt")
    return source, resumed, load_state(tmp_path / "ckpt" / TRAIN_STATE_FILE)


def test_a_checkpoint_holds_what_save_contents_names_and_resumes_the_rest_fresh(tmp_path, caplog):
    # verl's save_contents=['model']: the weights only; a resume with the same list starts optimizer and schedule anew
    with caplog.at_level(logging.WARNING):
        source, resumed, state = _saved_and_resumed(tmp_path, ["model"], ["model"])
    assert state["training_state_parts"] == [] and state["optimizer"] is None and state["lr_scheduler"] is None
    assert_same(source.actor_module.state_dict(), resumed.actor_module.state_dict())
    assert resumed.num_update_steps == 0 and resumed.lr_scheduler.last_epoch == 0  # fresh, not the source's 3
    assert resumed.optimizer.optimizer.state_dict()["state"] == {}  # no moments yet
    assert "without ['optimizer', 'extra']" in caplog.text and "not exact" in caplog.text


def test_a_checkpoint_with_the_extra_state_but_no_optimizer_resumes_the_schedule(tmp_path):
    # verl's [model, hf_model, extra] (without hf_model, which this run has no use for): counters and LR schedule
    # come back, the optimizer (moments, loss scale) starts fresh
    source, resumed, state = _saved_and_resumed(tmp_path, ["model", "extra"], ["model", "extra"])
    assert state["training_state_parts"] == ["extra"] and state["optimizer"] is None
    assert resumed.num_update_steps == source.num_update_steps == 3
    assert resumed.lr_scheduler.last_epoch == source.lr_scheduler.last_epoch
    assert resumed.update_outcome_handler.state_dict() == source.update_outcome_handler.state_dict()
    assert resumed.optimizer.optimizer.state_dict()["state"] == {}


def test_a_resume_asking_for_a_part_the_checkpoint_lacks_stops_before_loading(tmp_path):
    from verl.utils.checkpoint import CheckpointError

    with pytest.raises(
        CheckpointError,
        match=r"holds no optimizer state: .* saved \['model', 'extra'\].*leave "
        r"\['optimizer'\] out of actor_rollout_ref.actor.checkpoint.load_contents",
    ):
        _saved_and_resumed(tmp_path, ["model", "extra"], ["model", "optimizer", "extra"])
