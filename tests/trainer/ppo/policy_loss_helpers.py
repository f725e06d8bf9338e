"""Shared by the policy-loss tests: the actor config as the losses read it, with the YAML file's defaults."""

import functools
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace

from omegaconf import OmegaConf

# the actor section's component file (ppo_trainer.yaml composes it at actor_rollout_ref.actor)
YAML = Path(__file__).resolve().parents[3] / "verl" / "trainer" / "config" / "actor" / "actor.yaml"
# the actor keys the policy losses read (besides the policy_loss section)
LOSS_KEYS = (
    "clip_ratio",
    "clip_ratio_low",
    "clip_ratio_high",
    "clip_ratio_c",
    "tau_pos",
    "tau_neg",
    "loss_scale_factor",
)


@functools.lru_cache(maxsize=1)
def _yaml_actor() -> dict:
    return OmegaConf.to_container(OmegaConf.load(YAML), resolve=False)


def actor_config(**overrides):
    """The actor keys the losses read, as attributes (like the typed config dataclass), plus overrides.

    ``policy_loss`` overrides merge into the YAML's section: a bare name sets ``loss_mode``, a mapping or a
    ``SimpleNamespace`` sets the keys it has. Other overrides (``global_batch_info``, verl's run-time attribute)
    are set as given.
    """
    actor = _yaml_actor()
    values = {key: actor[key] for key in LOSS_KEYS}
    section = dict(actor["policy_loss"])
    given = overrides.pop("policy_loss", None)
    if isinstance(given, str):
        section["loss_mode"] = given
    elif isinstance(given, Mapping):
        section.update(given)
    elif given is not None:
        section.update(vars(given))
    values["policy_loss"] = SimpleNamespace(**section)
    values.update(overrides)
    return SimpleNamespace(**values)
