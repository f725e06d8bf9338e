"""verl's one-step-off-policy entry point (``python -m verl.experimental.one_step_off_policy.main_ppo``)."""
