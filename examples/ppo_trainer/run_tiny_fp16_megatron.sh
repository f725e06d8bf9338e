#!/usr/bin/env bash
# PPO (GAE advantages from a learned value model) on the embedded tiny model and task, on CPU, in fp16, with the
# megatron-core backend for actor and critic (its CPU path). Needs `pip install verl[megatron]`.
# Extra key=value arguments override the ones below.
set -euo pipefail
source "$(dirname "$0")/../python_env.sh"

exec "$PYTHON" -m verl.trainer.main_ppo --config-name ppo_megatron_trainer \
    algorithm.adv_estimator=gae \
    algorithm.gamma=1.0 \
    algorithm.lam=0.95 \
    data.train_batch_size=16 \
    actor_rollout_ref.actor.strategy=megatron \
    actor_rollout_ref.actor.dtype=float16 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32 \
    'actor_rollout_ref.actor.update_failure_policy={name: fp16_warn_and_count, max_consecutive_failures: 10}' \
    actor_rollout_ref.rollout.name=naive \
    actor_rollout_ref.rollout.n=4 \
    critic.enable=true \
    critic.strategy=megatron \
    critic.dtype=float16 \
    critic.ppo_mini_batch_size=16 \
    critic.ppo_micro_batch_size_per_gpu=32 \
    'critic.update_failure_policy={name: fp16_warn_and_count, max_consecutive_failures: 10}' \
    trainer.device=cpu \
    trainer.n_gpus_per_node=1 \
    trainer.total_training_steps=40 \
    trainer.project_name=verl_examples \
    trainer.experiment_name=ppo_tiny_fp16_megatron \
    "$@"
