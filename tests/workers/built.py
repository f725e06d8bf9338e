"""Workers built outside a worker group from a whole config, as the worker tests build them.

A worker keeps only its own config section (``worker.config``) and the run plan; the tests also need the whole config
(the data loader reads ``data.*``), so :func:`built_worker` leaves it on the worker as ``run_config``, a handle of
the tests' own that no worker code reads.
"""

from verl.workers.config import PPOConfig


def built_worker(cls, config: PPOConfig, total_training_steps: int | None = None):
    """``cls.from_config(config, total_training_steps)`` (not initialised), with ``run_config`` set to ``config``."""
    worker = cls.from_config(config, total_training_steps)
    worker.run_config = config
    return worker
