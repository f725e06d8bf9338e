"""``python -m verl.experimental.fully_async_policy.fully_async_main [overrides]``: main_ppo with verl's
``fully_async_ppo_trainer`` config (a rollout worker group of its own, ahead of the trainer within
``async_training``'s staleness rule).

The trainer is the one of :mod:`verl.trainer.main_ppo`; only the config differs. See docs/advance/async_training.md.
"""

from __future__ import annotations

from collections.abc import Sequence

from verl.trainer.main_ppo import CONFIG_DIR, cli

CONFIG_NAME = "fully_async_ppo_trainer"


def main(argv: Sequence[str] | None = None) -> None:
    cli(argv, config_dir=CONFIG_DIR, config_name=CONFIG_NAME)


if __name__ == "__main__":
    main()
