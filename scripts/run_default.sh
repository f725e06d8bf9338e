#!/usr/bin/env bash
# README's first command: set up .venv, then run the embedded tiny fp16 GRPO training run on CPU.
# Extra arguments are Hydra overrides, e.g. `bash scripts/run_default.sh actor_rollout_ref.actor.strategy=megatron`.
set -euo pipefail
cd "$(dirname "$0")/.."
# the default run needs no vLLM: skip its install (2-3 minutes, 2 GB) unless asked for
VERL_INSTALL_VLLM=${VERL_INSTALL_VLLM:-0} bash scripts/setup_env.sh >/dev/null
exec .venv/bin/python -m verl.trainer.main_ppo "$@"
