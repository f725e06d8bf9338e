"""Metric sinks: console, JSONL (always cheap, always on by default), TensorBoard and W&B when asked.

TensorBoard and W&B are optional: asking for one that is not installed is a start-up error that says what to
install, never a silent no-op.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

logger = logging.getLogger("verl.trainer")

LOGGERS = ("console", "jsonl", "tensorboard", "wandb")
# The few metrics the console line shows; everything goes to the other sinks.
CONSOLE_KEYS = (
    "critic/score/mean",
    "actor/update_failed",
    "actor/update_failures_total",
    "actor/loss_scale",
    "actor/pg_loss",
    "critic/vf_loss",
    "response_length/mean",
    "val/score/mean",
    "perf/tokens_per_second",
)


def _jsonable(value: Any) -> Any:
    value = float(value)
    return value if math.isfinite(value) else str(value)


class Tracking:
    """Fan out ``log(metrics, step)`` to the configured sinks.

    Args:
        loggers: any of ``console``, ``jsonl``, ``tensorboard``, ``wandb``.
        log_dir: where ``metrics.jsonl`` and TensorBoard events go.
        project_name, experiment_name: names for W&B and the console.
        config: the run config, stored with W&B runs.
    """

    def __init__(self, loggers, log_dir, project_name: str, experiment_name: str, config: dict | None = None):
        loggers = list(loggers)
        unknown = sorted(set(loggers) - set(LOGGERS))
        if unknown:
            raise ValueError(f"trainer.logger has unknown sink(s) {unknown}; accepted: {list(LOGGERS)}.")
        self.loggers = loggers
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(self.log_dir / "metrics.jsonl", "a") if "jsonl" in loggers else None  # noqa: SIM115
        self._tb = None
        self._wandb = None
        if "tensorboard" in loggers:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise ValueError("trainer.logger includes tensorboard: pip install tensorboard.") from err
            self._tb = SummaryWriter(str(self.log_dir / "tensorboard"))
        if "wandb" in loggers:
            try:
                import wandb
            except ImportError as err:
                raise ValueError("trainer.logger includes wandb: pip install wandb.") from err
            self._wandb = wandb.init(project=project_name, name=experiment_name, config=config)

    def log(self, metrics: dict[str, float], step: int) -> None:
        if "console" in self.loggers:
            shown = " ".join(f"{k}={metrics[k]:.4g}" for k in CONSOLE_KEYS if k in metrics)
            logger.info("step %d: %s", step, shown)
        if self._jsonl is not None:
            self._jsonl.write(json.dumps({"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}) + "\n")
            self._jsonl.flush()
        if self._tb is not None:
            for key, value in metrics.items():
                self._tb.add_scalar(key, value, step)
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` file, in order."""
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]
