#!/usr/bin/env bash
# GRPO on the embedded tiny model and task, on CPU, in fp16, with the megatron-core backend (its CPU path: a
# megatron-core GPTModel trained through the torch.optim adapter). Needs `pip install verl[megatron]`.
# Extra key=value arguments override the ones below.
# The policy is given as a mapping to show the form that takes parameters: stop after more than 10 consecutive
# failed updates the loss scaler could not absorb.
set -euo pipefail
source "$(dirname "$0")/../python_env.sh"

exec "$PYTHON" -m verl.trainer.main_ppo --config-name ppo_megatron_trainer \
    algorithm.adv_estimator=grpo \
    data.train_batch_size=16 \
    actor_rollout_ref.actor.strategy=megatron \
    actor_rollout_ref.actor.dtype=float16 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32 \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1 \
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1 \
    'actor_rollout_ref.actor.update_failure_policy={name: fp16_warn_and_count, max_consecutive_failures: 10}' \
    actor_rollout_ref.rollout.name=naive \
    actor_rollout_ref.rollout.n=4 \
    trainer.device=cpu \
    trainer.n_gpus_per_node=1 \
    trainer.total_training_steps=40 \
    trainer.project_name=verl_examples \
    trainer.experiment_name=grpo_tiny_fp16_megatron \
    "$@"
