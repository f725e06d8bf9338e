"""Entry point of the fp16_guard recipe: ``python -m recipe.fp16_guard.main_fp16_guard [key=value ...]``.

Composes ``config/fp16_guard.yaml`` (the main trainer config with the ``failure_rate`` update-failure policy) and
runs it with :func:`verl.trainer.main_ppo.cli`, so the behaviour and the exit codes are those of
``verl.trainer.main_ppo``: 0 done, 1 stopped by the update-failure policy, 2 bad config, 3 damaged checkpoint. The
policy's ``module`` entry makes every Ray worker import :mod:`recipe.fp16_guard.failure_rate`; importing it here as
well registers the handler in the driver, where the config is validated before Ray starts.
"""

from __future__ import annotations

from pathlib import Path

import recipe.fp16_guard.failure_rate  # noqa: F401  (registers "failure_rate" in this process)
from verl.trainer.main_ppo import cli

CONFIG_DIR = Path(__file__).parent / "config"


def main() -> None:
    cli(config_dir=CONFIG_DIR, config_name="fp16_guard")


if __name__ == "__main__":
    main()
