#!/usr/bin/env bash
# GRPO on the embedded tiny model and task, on CPU, in fp16, with the plain-PyTorch (dp) backend.
# No download, no GPU: a few minutes on a laptop. Extra key=value arguments override the ones below, e.g.
#   bash examples/grpo_trainer/run_tiny_fp16_dp.sh trainer.total_training_steps=5
# fp16 starts at loss scale 2**32, so the first updates overflow and are skipped while the scaler backs off;
# fp16_warn_and_count skips them with a warning and stops only on a streak the scaler cannot absorb.
set -euo pipefail
source "$(dirname "$0")/../python_env.sh"

exec "$PYTHON" -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_batch_size=16 \
    actor_rollout_ref.model.path=default \
    actor_rollout_ref.actor.strategy=dp \
    actor_rollout_ref.actor.dtype=float16 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32 \
    actor_rollout_ref.actor.update_failure_policy=fp16_warn_and_count \
    actor_rollout_ref.rollout.name=naive \
    actor_rollout_ref.rollout.n=4 \
    trainer.device=cpu \
    trainer.n_gpus_per_node=1 \
    trainer.total_training_steps=40 \
    trainer.project_name=verl_examples \
    trainer.experiment_name=grpo_tiny_fp16_dp \
    "$@"
