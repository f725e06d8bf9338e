#!/usr/bin/env bash
# PPO (GAE advantages from a learned value model) on the embedded tiny model and task, on CPU, in fp16, with the
# plain-PyTorch (dp) backend for actor and critic. Extra key=value arguments override the ones below.
# Actor and critic each have their own loss scaler and their own update-failure policy.
set -euo pipefail
source "$(dirname "$0")/../python_env.sh"

exec "$PYTHON" -m verl.trainer.main_ppo \
    algorithm.adv_estimator=gae \
    algorithm.gamma=1.0 \
    algorithm.lam=0.95 \
    data.train_batch_size=16 \
    actor_rollout_ref.model.path=default \
    actor_rollout_ref.actor.strategy=dp \
    actor_rollout_ref.actor.dtype=float16 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32 \
    actor_rollout_ref.actor.update_failure_policy=fp16_warn_and_count \
    actor_rollout_ref.rollout.name=naive \
    actor_rollout_ref.rollout.n=4 \
    critic.enable=true \
    critic.strategy=dp \
    critic.dtype=float16 \
    critic.ppo_mini_batch_size=16 \
    critic.ppo_micro_batch_size_per_gpu=32 \
    critic.update_failure_policy=fp16_warn_and_count \
    trainer.device=cpu \
    trainer.n_gpus_per_node=1 \
    trainer.total_training_steps=40 \
    trainer.project_name=verl_examples \
    trainer.experiment_name=ppo_tiny_fp16_dp \
    "$@"
