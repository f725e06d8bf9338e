"""Entry point of the fp16_guard recipe: ``python -m recipe.fp16_guard.main_fp16_guard [key=value ...]``.

Composes ``config/fp16_guard.yaml`` (the main trainer config with the ``failure_rate`` update-failure policy) and
runs it with :func:`verl.trainer.main_ppo.run`, so the behaviour and the exit codes are those of
``verl.trainer.main_ppo``: 0 done, 1 stopped by the update-failure policy, 2 bad config. The policy's ``module``
entry makes every Ray worker import :mod:`recipe.fp16_guard.failure_rate`; importing it here as well registers the
handler in the driver, where the config is validated before Ray starts.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

import recipe.fp16_guard.failure_rate  # noqa: F401  (registers "failure_rate" in this process)
from verl.trainer.main_ppo import cli, run


@hydra.main(config_path="config", config_name="fp16_guard", version_base=None)
def main(config: DictConfig) -> None:
    sys.exit(run(config))


if __name__ == "__main__":
    cli(main)
