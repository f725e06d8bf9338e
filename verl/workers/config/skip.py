"""The ``skip`` section: verl's rollout dump and replay, to debug the trainer without paying for generation.

verl's current release holds it at the top level of its trainer config, one sub-section per place a rollout runs,
each with the same four keys:

- ``skip.rollout`` (the colocated trainer, ``actor_rollout_ref.hybrid_engine=true``): on each training step
  listed in ``steps`` (1-based), the first run writes the generated batch to ``dump_dir`` and a later run with the
  same settings reads it back instead of generating (:mod:`verl.utils.rollout_skip`). ``action: cache`` replays a
  step's own dump; ``repeat`` replays the nearest dump there is (the step's own, else the latest earlier one, else
  the earliest later one), for iterating on the trainer with one generated batch.
- ``skip.async_rollout`` (verl's fully async rollouter, keyed by the rollouter's per-sample feed order) and
  ``skip.rollout_tq`` (verl's TransferQueue trainer): not available here, refused by name when enabled.

``enable: false`` (verl's default) everywhere: nothing is read or written.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Literal

from verl.workers.config.schema import BaseConfig, FieldError, check_int_list

SKIP_ACTIONS = ("cache", "repeat")

# verl's skip sub-sections this project has no counterpart for, and why
UNAVAILABLE_SKIPS: dict[str, str] = {
    "async_rollout": (
        "verl's fully async rollouter replays single samples by their feed order; here a rollout group of its own "
        "generates whole batches ahead of the trainer, and replay is not available for it. Debug the trainer on "
        "replayed batches with actor_rollout_ref.hybrid_engine=true and skip.rollout"
    ),
    "rollout_tq": "verl's TransferQueue trainer (trainer.use_v1) is out of scope here; use skip.rollout",
}


@dataclasses.dataclass(frozen=True)
class RolloutSkipConfig(BaseConfig):
    """One ``skip.<role>`` sub-section.

    Attributes:
        enable: dump the listed steps' generated batches, and replay those already dumped.
        dump_dir: the root folder of the dumps (``~`` expanded); one folder per experiment below it.
        steps: the training steps (1-based ``global_steps``) that are dumped or replayed; the others generate.
        action: ``cache`` (a step replays its own dump) or ``repeat`` (a step replays the nearest dump).
    """

    enable: bool
    dump_dir: str
    steps: list[int]
    action: Literal["cache", "repeat"]

    def check(self) -> None:
        check_int_list(self, "steps", 1)
        if not self.dump_dir:
            raise FieldError("dump_dir", "is empty: name the folder the dumps go to, e.g. ~/.verl/rollout_dump.")


@dataclasses.dataclass(frozen=True)
class SkipConfig(BaseConfig):
    """``skip``: verl's rollout dump/replay; only ``rollout`` can be enabled here."""

    KEY: ClassVar[str] = "skip"

    rollout: RolloutSkipConfig
    async_rollout: RolloutSkipConfig
    rollout_tq: RolloutSkipConfig

    def check(self) -> None:
        for name, why in UNAVAILABLE_SKIPS.items():
            if getattr(self, name).enable:
                raise FieldError(f"{name}.enable", f"=true asks for a verl feature this project does not have: {why}.")
        if self.rollout.enable and not self.rollout.steps:
            raise FieldError(
                "rollout.enable",
                "=true with steps=[] dumps and replays nothing (verl does nothing either): list the training steps "
                "(1-based) to dump or replay, e.g. skip.rollout.steps=[1,2], or set enable=false.",
            )

    def check_applies(self, separate_rollout: bool) -> None:
        """``skip.rollout`` replays the colocated rollout; with a rollout group of its own nothing would read it.

        Raises:
            ValueError: ``skip.rollout.enable=true`` with ``actor_rollout_ref.hybrid_engine=false``.
        """
        if self.rollout.enable and separate_rollout:
            raise ValueError(
                "skip.rollout.enable=true replays the rollout of the actor workers (actor_rollout_ref.hybrid_engine="
                "true); a rollout worker group of its own (hybrid_engine=false: one step off policy, fully async) "
                "generates ahead of the trainer and is not replayed here. Set hybrid_engine=true to debug the "
                "trainer on replayed batches, or skip.rollout.enable=false."
            )

    def unused_settings(self) -> list[tuple[str, Any, str]]:
        """``(key, value, what would make it apply)`` for each key of ``skip.rollout`` while it is disabled: nothing
        reads them, so a value changed from its default is refused (:meth:`~verl.workers.config.PPOConfig.
        from_omegaconf`). The other keys of the unavailable sub-sections are never read: each is listed too (its
        ``enable`` is refused by :meth:`check`)."""
        unused: list[tuple[str, Any, str]] = []
        if not self.rollout.enable:
            fix = f"{self.KEY}.rollout.enable=true"
            unused += [(f"{self.KEY}.rollout.{key}", value, fix) for key, value in self.rollout.to_dict().items()]
        for name in UNAVAILABLE_SKIPS:
            fix = f"{self.KEY}.{name}.enable=true, a verl feature this project does not have (use skip.rollout)"
            values = getattr(self, name).to_dict()
            unused += [(f"{self.KEY}.{name}.{key}", value, fix) for key, value in values.items() if key != "enable"]
        return unused
