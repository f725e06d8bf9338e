"""verl: reinforcement-learning post-training for language models, with fp16 training that survives overflow."""

__version__ = "0.1.0"
