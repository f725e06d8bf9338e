"""``python -m verl.experimental.one_step_off_policy.main_ppo [overrides]``: main_ppo with verl's
``one_step_off_ppo_trainer`` config (a rollout worker group of its own, one step ahead of the trainer).

The trainer is the one of :mod:`verl.trainer.main_ppo`; only the config differs (``hybrid_engine: false``, the
rollout's log-probs as the old ones). See docs/advance/async_training.md.
"""

from __future__ import annotations

from collections.abc import Sequence

from verl.trainer.main_ppo import CONFIG_DIR, cli

CONFIG_NAME = "one_step_off_ppo_trainer"


def main(argv: Sequence[str] | None = None) -> None:
    cli(argv, config_dir=CONFIG_DIR, config_name=CONFIG_NAME)


if __name__ == "__main__":
    main()
