"""DPActorRolloutRefWorker outside a worker group (rank 0 of 1): what init_model builds from the trainer config."""

import torch
from hydra import compose, initialize_config_dir

from verl.trainer.main_ppo import CONFIG_DIR
from verl.workers.dp_workers import DPActorRolloutRefWorker


def make_worker(*overrides: str) -> DPActorRolloutRefWorker:
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=["actor_rollout_ref.actor.dtype=float32", *overrides])
    worker = DPActorRolloutRefWorker(config, total_training_steps=4)
    worker.init_model()
    return worker


def test_reference_uses_its_own_micro_batch_and_has_no_optimizer():
    worker = make_worker(
        "actor_rollout_ref.ref.enable=true",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.log_prob_micro_batch_size_per_gpu=16",
    )
    assert worker.ref is not None and worker.ref.optimizer is None
    assert worker.ref.config.log_prob_micro_batch_size_per_gpu == 8
    assert worker.actor.config.log_prob_micro_batch_size_per_gpu == 16
    # The per-rank config turns 16 prompts x 4 samples into 64 samples per mini-batch on the single rank.
    assert worker.actor.config.ppo_mini_batch_size == 64


def test_reference_is_built_only_when_asked_or_needed():
    assert make_worker().ref is None  # auto, and the default has no KL loss
    assert make_worker("actor_rollout_ref.actor.use_kl_loss=true").ref is not None


def test_fp16_reference_log_probs_equal_the_untrained_actor():
    # The frozen reference (no trainable parameters) must still run under fp16 autocast, and before any update
    # it holds the actor's own weights, so both give the same log-probs.
    from verl.trainer.data_setup import build_data

    worker = make_worker("actor_rollout_ref.actor.dtype=float16", "actor_rollout_ref.actor.use_kl_loss=true")
    prompts = next(build_data(worker.config, 1).train_loader)
    samples = worker.generate_sequences(prompts)
    ref = worker.compute_ref_log_prob(samples).batch["ref_log_prob"]
    actor = worker.compute_log_prob(samples).batch["old_log_probs"]
    assert ref.shape == samples.batch["responses"].shape
    assert torch.equal(ref, actor)
