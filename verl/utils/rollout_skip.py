"""verl's rollout dump and replay (``skip.rollout``): debug the trainer without paying for generation.

On each training step listed in ``skip.rollout.steps``, the first run writes the batch the rollout generated to disk;
a later run with the same settings reads it back instead of generating, so everything after the rollout (rewards,
advantages, log-prob passes, updates) runs on the very samples of the first run. :class:`RolloutSkip` owns the
files: where a step's dump lives, which dump a step replays (``action``: ``cache`` its own, ``repeat`` the nearest),
and whether a dump fits this run. The trainer decides when to generate, dump or replay
(:mod:`verl.trainer.ppo.skip_rollout`).

Layout, one folder per experiment (as in verl), one per step::

    {dump_dir}/{experiment_name}_{project_name}/
        {step}/gen_batch.dp          # the generated batch (DataProto.save_to_disk: plain data, no pickle)
        {step}/meta.json             # the settings it was generated with, its row count, its prompts' fingerprint
        {step}/gen_batch_round{k}.dp, meta_round{k}.json   # extra generation rounds of a step (DAPO's filter)

A step's dump is complete once its ``meta.json`` exists (each file is written under a temporary name and renamed).
verl keeps each combination of sizes in a folder of its own and regenerates when they change; here a dump made with
other settings (batch size, prompt or response length, model, ``rollout.n``, temperature), or for other prompts, is
refused with an error naming the file and every difference, never replayed and never silently regenerated.

This module sits below :mod:`verl.protocol`: the batch only needs ``save_to_disk`` and ``len``, and the caller passes
the loader (``DataProto.load_from_disk``).
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

__all__ = ["RolloutDumpMismatchError", "RolloutSkip", "dump_settings", "prompts_fingerprint"]

logger = logging.getLogger(__name__)

BATCH_FILE = "gen_batch.dp"
META_FILE = "meta.json"
# written into every meta.json; a reader refuses another format or version
DUMP_FORMAT = "verl.rollout_skip"
DUMP_FORMAT_VERSION = 1


class RolloutDumpMismatchError(ValueError):
    """A dump on disk that does not fit this run; the message names the file, each difference and the fixes."""


def dump_settings(config: Any) -> dict[str, Any]:
    """The settings a dump must share with the run that replays it, by their full keys.

    Args:
        config: the validated trainer config (:class:`~verl.workers.config.PPOConfig`; read by attribute).
    """
    data, arr = config.data, config.actor_rollout_ref
    return {
        "data.train_batch_size": data.train_batch_size,
        "data.max_prompt_length": data.max_prompt_length,
        "data.max_response_length": data.max_response_length,
        "actor_rollout_ref.model.path": arr.model.path,
        "actor_rollout_ref.rollout.n": arr.rollout.n,
        "actor_rollout_ref.rollout.temperature": arr.rollout.temperature,
    }


def prompts_fingerprint(input_ids: torch.Tensor) -> str:
    """A short fingerprint of a batch of prompts (their token ids (B, P) and shape): equal prompts, equal prints."""
    ids = input_ids.detach().to("cpu").contiguous()
    crc = zlib.crc32(ids.numpy().tobytes(), zlib.crc32(str(tuple(ids.shape)).encode()))
    return f"{crc:08x}"


def _write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class RolloutSkip:
    """The dumps of one experiment: find, check, read and write them.

    Args:
        config: the ``skip.rollout`` section (``enable``, ``dump_dir``, ``steps``, ``action``; read by attribute).
        settings: what a dump must match (:func:`dump_settings`), by full key.
        run_name: the experiment's folder under ``dump_dir`` (verl's ``{experiment_name}_{project_name}``).
        load_batch: reads a batch file (``DataProto.load_from_disk``).
    """

    def __init__(self, config: Any, settings: Mapping[str, Any], run_name: str, load_batch: Callable[[Path], Any]):
        self.enable = bool(config.enable)
        self.steps = sorted(set(config.steps))
        self.action = config.action
        self.dump_root = Path(os.path.expanduser(config.dump_dir)).resolve() / run_name
        self.settings = dict(settings)
        self.load_batch = load_batch

    @classmethod
    def from_config(cls, config: Any, load_batch: Callable[[Path], Any]) -> RolloutSkip:
        """From the whole validated trainer config (``config.skip.rollout``, the trainer's names, the settings)."""
        run_name = f"{config.trainer.experiment_name}_{config.trainer.project_name}"
        return cls(config.skip.rollout, dump_settings(config), run_name, load_batch)

    def is_enabled(self) -> bool:
        return self.enable

    def covers(self, step: int) -> bool:
        """Whether ``step`` (1-based) is dumped or replayed."""
        return self.enable and step in self.steps

    # ------------------------------------------------------------------ where dumps are

    def paths(self, step: int, round_index: int = 0) -> tuple[Path, Path]:
        """(batch file, meta file) of ``step``'s generation round ``round_index`` (0: the step's batch)."""
        folder = self.dump_root / str(step)
        if round_index == 0:
            return folder / BATCH_FILE, folder / META_FILE
        return folder / f"gen_batch_round{round_index}.dp", folder / f"meta_round{round_index}.json"

    def has_dump(self, step: int, round_index: int = 0) -> bool:
        batch_path, meta_path = self.paths(step, round_index)
        return batch_path.is_file() and meta_path.is_file()

    def dumped_steps(self, round_index: int = 0) -> list[int]:
        """The steps with a complete dump of round ``round_index``, ascending."""
        if not self.dump_root.is_dir():
            return []
        steps = [int(p.name) for p in self.dump_root.iterdir() if p.is_dir() and p.name.isdigit()]
        return sorted(step for step in steps if self.has_dump(step, round_index))

    def source_step(self, step: int, round_index: int = 0) -> int | None:
        """The step whose dump ``step`` replays, or None (generate and dump).

        ``cache``: the step's own dump. ``repeat``: the step's own, else the latest earlier one, else the earliest
        later one (verl's order).
        """
        if not self.covers(step):
            return None
        if self.has_dump(step, round_index):
            return step
        if self.action != "repeat":
            return None
        available = self.dumped_steps(round_index)
        earlier = [s for s in available if s < step]
        later = [s for s in available if s > step]
        return earlier[-1] if earlier else (later[0] if later else None)

    # ------------------------------------------------------------------ checks

    def read_meta(self, meta_path: Path) -> dict[str, Any]:
        """A dump's meta file, checked against this run's settings.

        Raises:
            RolloutDumpMismatchError: the file is unreadable, of another format, or made with other settings.
        """
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError) as err:
            raise RolloutDumpMismatchError(
                f"skip.rollout: cannot read the dump's meta file {meta_path} ({err}); delete its step folder "
                f"{meta_path.parent} so that the step generates and dumps again."
            ) from None
        if not isinstance(meta, dict) or (meta.get("format"), meta.get("version")) != (
            DUMP_FORMAT,
            DUMP_FORMAT_VERSION,
        ):
            raise RolloutDumpMismatchError(
                f"skip.rollout: {meta_path} is not a rollout dump of this version ({DUMP_FORMAT} version "
                f"{DUMP_FORMAT_VERSION}); delete {meta_path.parent} or point skip.rollout.dump_dir elsewhere."
            )
        self._check_settings(meta_path, meta.get("settings", {}))
        return meta

    def _check_settings(self, meta_path: Path, dumped: Mapping[str, Any]) -> None:
        differences = [
            f"{key}={dumped.get(key)!r} there, {value!r} in this run"
            for key, value in self.settings.items()
            if dumped.get(key) != value
        ]
        if differences:
            raise RolloutDumpMismatchError(
                f"skip.rollout: the dump {meta_path} was generated with other settings: {'; '.join(differences)}. "
                "Replaying it would train on batches this run would never generate. Restore those settings, point "
                f"skip.rollout.dump_dir to another folder, or delete {self.dump_root} to dump again."
            )

    def check_dumps(self) -> list[int]:
        """Check every complete dump of this experiment against the run's settings (at start-up, before any step
        runs); returns the steps with a dump.

        Raises:
            RolloutDumpMismatchError: as :meth:`read_meta`, for the first dump that does not fit.
        """
        if not self.dump_root.is_dir():
            return []
        for meta_path in sorted(self.dump_root.glob("*/meta*.json")):
            self.read_meta(meta_path)
        return self.dumped_steps()

    # ------------------------------------------------------------------ read and write

    def load(self, step: int, round_index: int, fingerprint: str | None) -> tuple[Any, int] | None:
        """The batch ``step`` replays in round ``round_index`` and the step it was dumped at; None: generate.

        Args:
            fingerprint: the prompts the data loader gave this round (:func:`prompts_fingerprint`); a step's own
                dump must have been generated from the same prompts (a ``repeat`` substitute is another step's
                batch, by design). None skips the comparison.

        Raises:
            RolloutDumpMismatchError: the dump was made with other settings, other prompts, or holds another
                number of rows than it recorded.
        """
        source = self.source_step(step, round_index)
        if source is None:
            return None
        batch_path, meta_path = self.paths(source, round_index)
        meta = self.read_meta(meta_path)
        if source == step and fingerprint is not None and meta.get("prompts_fingerprint") != fingerprint:
            raise RolloutDumpMismatchError(
                f"skip.rollout: the dump {batch_path} was generated from other prompts than the data loader gives at "
                f"step {step} (fingerprint {meta.get('prompts_fingerprint')} there, {fingerprint} now): the data "
                "files, data.seed or data.shuffle changed, or the run resumed elsewhere. Restore them, or delete "
                f"{self.dump_root} to dump again."
            )
        batch = self.load_batch(batch_path)
        if len(batch) != meta.get("num_rows"):
            raise RolloutDumpMismatchError(
                f"skip.rollout: {batch_path} holds {len(batch)} rows, its {meta_path.name} says {meta.get('num_rows')}"
                f": the files do not belong together. Delete {batch_path.parent} to dump the step again."
            )
        logger.info("skip.rollout: step %d replays the batch generated at step %d, from %s", step, source, batch_path)
        return batch, source

    def dump(self, step: int, round_index: int, batch: Any, fingerprint: str | None) -> Path:
        """Write ``batch`` as ``step``'s round ``round_index``; returns the batch file. The meta file goes last, so
        an interrupted dump is never taken for a complete one."""
        batch_path, meta_path = self.paths(step, round_index)
        batch_path.parent.mkdir(parents=True, exist_ok=True)
        meta = {
            "format": DUMP_FORMAT,
            "version": DUMP_FORMAT_VERSION,
            "step": step,
            "round": round_index,
            "num_rows": len(batch),
            "prompts_fingerprint": fingerprint,
            "settings": self.settings,
        }
        _write_atomically(batch_path, batch.save_to_disk)
        _write_atomically(meta_path, lambda path: path.write_text(json.dumps(meta, indent=1, sort_keys=True)))
        logger.info("skip.rollout: dumped the batch generated at step %d to %s", step, batch_path)
        return batch_path
