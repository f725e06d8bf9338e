"""fp16_guard recipe: GRPO/PPO training whose fp16 update failures are judged by their rate over a window.

``failure_rate`` registers the policy, ``config/fp16_guard.yaml`` selects it on top of the main trainer config,
and ``python -m recipe.fp16_guard.main_fp16_guard`` runs the trainer with that config. See README.md.
"""
