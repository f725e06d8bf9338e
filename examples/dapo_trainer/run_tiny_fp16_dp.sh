#!/usr/bin/env bash
# DAPO (Yu et al., 2025) on the embedded tiny model and task, on CPU, in fp16, with the plain-PyTorch (dp) backend:
# GRPO advantages plus DAPO's four pieces, with verl's keys:
#   - dynamic sampling: groups whose responses all score the same (acc, from the dapo reward manager) are dropped,
#     and more prompts are generated until the batch holds data.train_batch_size informative groups;
#   - clip-higher: a wider upper clip range (0.28) than the lower one (0.2);
#   - token-level loss: every token of the mini-batch weighs the same (token-mean);
#   - overlong reward shaping: a response running into the last 2 of its 8 tokens loses up to 1.0 of its reward.
# No KL term, as in DAPO. No download, no GPU. Extra key=value arguments override the ones below, e.g.
#   bash examples/dapo_trainer/run_tiny_fp16_dp.sh trainer.total_training_steps=5
set -euo pipefail
source "$(dirname "$0")/../python_env.sh"

exec "$PYTHON" -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=false \
    algorithm.filter_groups.enable=true \
    algorithm.filter_groups.metric=acc \
    algorithm.filter_groups.max_num_gen_batches=10 \
    data.train_batch_size=16 \
    data.max_response_length=8 \
    actor_rollout_ref.model.path=default \
    actor_rollout_ref.actor.strategy=dp \
    actor_rollout_ref.actor.dtype=float16 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32 \
    actor_rollout_ref.actor.clip_ratio_low=0.2 \
    actor_rollout_ref.actor.clip_ratio_high=0.28 \
    actor_rollout_ref.actor.loss_agg_mode=token-mean \
    actor_rollout_ref.actor.use_kl_loss=false \
    actor_rollout_ref.actor.update_failure_policy=fp16_warn_and_count \
    actor_rollout_ref.rollout.name=naive \
    actor_rollout_ref.rollout.n=4 \
    reward_model.reward_manager=dapo \
    reward_model.overlong_buffer.enable=true \
    reward_model.overlong_buffer.len=2 \
    reward_model.overlong_buffer.penalty_factor=1.0 \
    trainer.device=cpu \
    trainer.n_gpus_per_node=1 \
    trainer.total_training_steps=60 \
    trainer.project_name=verl_examples \
    trainer.experiment_name=dapo_tiny_fp16_dp \
    "$@"
