"""The RL algorithms as pure tensor functions: advantage estimators, policy and value losses, KL, loss
aggregation, and training-inference mismatch metrics and rollout correction, with the registries of policy losses
and advantage estimators.

This package sits below :mod:`verl.workers` (whose actor and critic compute the losses, and whose typed config
checks loss and estimator names against the registries) and above :mod:`verl.protocol`; it imports neither the
workers nor the trainer. verl users keep importing :mod:`verl.trainer.ppo.core_algos` (and the other old module
paths under ``verl.trainer.ppo``), which are these very modules under their old names.
"""
