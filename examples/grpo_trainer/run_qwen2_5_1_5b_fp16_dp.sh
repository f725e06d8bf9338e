#!/usr/bin/env bash
# GRPO on GSM8K with Qwen2.5-1.5B-Instruct, in fp16, with the plain-PyTorch (dp) backend, on one node of GPUs.
#   MODEL_PATH  local Hugging Face directory of Qwen2.5-1.5B-Instruct (nothing is downloaded)
#   DATA_DIR    folder with train.parquet and test.parquet from examples/data_preprocess/gsm8k.py
#   N_GPUS      GPUs on this node (default 8); 128 prompts x 8 samples split evenly over 1, 2, 4 or 8
# Extra key=value arguments override the ones below, e.g. trainer.total_epochs=1.
# The policy stops after more than 20 consecutive failed updates the fp16 loss scaler could not absorb.
set -euo pipefail
source "$(dirname "$0")/../python_env.sh"
: "${MODEL_PATH:?set MODEL_PATH to a local Qwen2.5-1.5B-Instruct directory}"
: "${DATA_DIR:?set DATA_DIR to the --output_dir of examples/data_preprocess/gsm8k.py}"

exec "$PYTHON" -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/test.parquet" \
    data.train_batch_size=128 \
    data.max_prompt_length=512 \
    data.max_response_length=512 \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.actor.strategy=dp \
    actor_rollout_ref.actor.dtype=float16 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.use_kl_loss=true \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    'actor_rollout_ref.actor.update_failure_policy={name: fp16_warn_and_count, max_consecutive_failures: 20}' \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.rollout.name=hf \
    actor_rollout_ref.rollout.n=8 \
    trainer.device=cuda \
    trainer.nnodes=1 \
    trainer.n_gpus_per_node="${N_GPUS:-8}" \
    trainer.total_epochs=3 \
    trainer.total_training_steps=null \
    trainer.test_freq=10 \
    trainer.save_freq=20 \
    trainer.project_name=verl_gsm8k \
    trainer.experiment_name=qwen2_5_1_5b_grpo_fp16_dp \
    "$@"
