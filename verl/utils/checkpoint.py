"""Checkpoint files: written atomically, read without unpickling arbitrary objects, checked before a resume.

A checkpoint directory is assembled under a temporary name next to its final path and renamed into place only when
complete, so a crash mid-save never damages the last good checkpoint. Weights go to safetensors; training state
(optimizer moments, loss scaler, LR schedule, handler counters, data position) to ``torch.save`` files made of
tensors and plain Python values, which load with ``torch.load(..., weights_only=True)``.

Layout of one checkpoint (``roles`` are the worker groups that saved into it, ``actor`` and optionally ``critic``)::

    global_step_N/
        trainer_state.pt          # the driver's state (step, data position)
        <role>/model.safetensors  # weights
        <role>/train_state.pt     # optimizer, loss scaler, LR schedule, handler counters
        <role>/rng_state_rank<R>.pt  # optional: rank R's random state (torch RNG, rollout sampler)

A file that is missing, truncated or holds anything but tensors and plain values raises :class:`CheckpointError`,
which names the file and says how to resume from another checkpoint or start fresh. Nothing read here is ever
unpickled with ``weights_only=False``. Interrupted saves leave ``.global_step_N.tmp-*`` and ``.global_step_N.old-*``
directories behind; :func:`remove_save_debris` clears them at start-up. :func:`prune_checkpoints` deletes the oldest
complete checkpoints beyond ``trainer.max_actor_ckpt_to_keep`` / ``max_critic_ckpt_to_keep`` after each save.

A role directory may also hold shards: ``sharded/`` (the ``fsdp2`` backend's ``torch.distributed.checkpoint``
files, see :mod:`verl.utils.fsdp_checkpoint`) or ``mp_rank_XX[_YYY]/`` (megatron's model-parallel shards, each with its
own ``model.safetensors`` and ``train_state.pt``); they count towards completeness and are verified like the rest.
A write that fails (disk full, read-only or unwritable directory: any ``OSError``) raises
:class:`CheckpointWriteError`, which names the file and the OS error.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import re
import secrets
import shutil
import struct
import warnings
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from verl.utils.checkpoint_errors import (  # noqa: F401  (verl.utils.checkpoint's public names)
    CheckpointError,
    CheckpointWriteError,
    describe_os_error,
    writing,
)

logger = logging.getLogger(__name__)

STEP_DIR_PATTERN = re.compile(r"^global_step_(\d+)$")
# what atomic_directory leaves behind when a save is interrupted (see remove_save_debris)
TMP_DEBRIS_PATTERN = re.compile(r"^\.(global_step_\d+)\.tmp-.+$")
OLD_DEBRIS_PATTERN = re.compile(r"^\.(global_step_\d+)\.old-.+$")

TRAINER_STATE_FILE = "trainer_state.pt"
WEIGHTS_FILE = "model.safetensors"
TRAIN_STATE_FILE = "train_state.pt"
RNG_STATE_GLOB = "rng_state_rank*.pt"
# megatron's model-parallel shards inside a role directory (verl.workers.actor.megatron_checkpoint.shard_directory):
# mp_rank_<tensor-parallel rank>, and _<pipeline stage> after it with pipeline stages
SHARD_DIR_PATTERN = re.compile(r"^mp_rank_(\d+)(?:_(\d+))?$")
# lines of torch's weights-only error that are advice or boilerplate, not the reason; the advice to retry with
# weights_only=False is exactly what must not be done with a file of unknown origin
_TORCH_BOILERPLATE = ("Weights only load failed", "Please file an issue", "Check the documentation")


@contextlib.contextmanager
def atomic_directory(final_path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory that replaces ``final_path`` when the block finishes without error."""
    final = Path(final_path)
    final.parent.mkdir(parents=True, exist_ok=True)
    # made with mkdir, not mkdtemp (0700): the checkpoint the directory becomes gets the umask's permissions, as the
    # files in it do
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def save_weights(path: str | os.PathLike, state_dict: dict[str, Any]) -> None:
    """Tensors of ``state_dict`` to safetensors (non-tensor entries such as ``_extra_state`` are skipped)."""
    tensors = {}
    for key, value in state_dict.items():
        if isinstance(value, torch.Tensor):
            # clone: tied weights share storage, which safetensors refuses to write twice
            tensors[key] = value.detach().to("cpu").contiguous().clone()
    with writing(path):
        save_file(tensors, str(path))


def load_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, on the CPU.

    Raises:
        CheckpointError: the file is missing, truncated or not a safetensors file.
    """
    path = Path(path)
    _check_is_file(path)
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(path, f"is damaged or was not written by this trainer ({err})") from err


def save_state(path: str | os.PathLike, state: Any) -> None:
    """``torch.save`` of tensors and plain values to ``path``.

    Raises:
        CheckpointWriteError: the file could not be written (disk full, read-only directory, ...).
    """
    # Through a Python file: torch's own file writer reports a full disk as "unexpected pos" without the OS error,
    # while a Python file raises the OSError itself. A buffered one: torch hands each tensor's bytes over in one write
    # and ignores a short count, and one write(2) moves at most 2 GiB on Linux, so a raw file would end a larger
    # tensor (an optimizer moment of a 7B model's embedding) short without an error; the buffered writer loops.
    with writing(path), open(path, "wb") as handle:
        torch.save(state, handle)


def load_state(path: str | os.PathLike, *, mmap: bool = False) -> Any:
    """What :func:`save_state` wrote, loaded with ``weights_only=True`` onto the CPU (``mmap``: its tensors mapped
    from the file rather than read, for a look at its plain values).

    Raises:
        CheckpointError: the file is missing, truncated, or holds Python objects other than tensors and plain
            values (those are refused, never executed).
    """
    path = Path(path)
    _check_is_file(path)
    return _torch_load(path, mmap=mmap)


def _check_is_file(path: Path) -> None:
    if not path.is_file():
        raise CheckpointError(path, "is missing (the checkpoint is incomplete)")


def _torch_load(path: Path, mmap: bool) -> Any:
    try:
        with warnings.catch_warnings():
            # a foreign pickle triggers torch's "please file an issue" protocol warning before being refused
            warnings.filterwarnings("ignore", message=r"Detected pickle protocol", category=UserWarning)
            return torch.load(str(path), map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        detail = _unpickling_detail(err)
        reason = (
            "holds Python objects other than tensors and plain values, so it was not written by this trainer; "
            "it was refused without running any of it"
        )
        raise CheckpointError(path, f"{reason} ({detail})" if detail else reason) from err
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile) as err:
        # torch reports a truncated zip as RuntimeError ("failed finding central directory"), OSError or EOFError
        raise CheckpointError(path, f"is damaged or was not written by this trainer ({_first_line(err)})") from err


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _unpickling_detail(err: pickle.UnpicklingError) -> str:
    """The reason in torch's weights-only error, without its advice (retry with weights_only=False, allowlist).

    torch's wording differs between versions and cases, so this keeps one sentence and gives up (empty string)
    rather than pass on any of the advice.
    """
    text = str(err)
    marker = "WeightsUnpickler error:"
    if marker in text:
        candidates = text.split(marker, 1)[1].splitlines()
    else:
        candidates = [line for line in text.splitlines() if not line.strip().startswith(_TORCH_BOILERPLATE)]
    line = next((line.strip() for line in candidates if line.strip()), "")
    sentence = line.split(". ", 1)[0].rstrip(".")
    return "" if "weights_only" in sentence or "safe_globals" in sentence else sentence


def rng_state_path(role_dir: str | os.PathLike, rank: int) -> Path:
    """Where rank ``rank`` keeps its rollout's random state in a role directory: ``rng_state_rank<R>.pt``.

    Each data-parallel rank samples with its own seed, so each saves its own file; :func:`verify_checkpoint`
    checks every such file present, and their absence does not make a checkpoint incomplete.
    """
    return Path(role_dir) / f"rng_state_rank{int(rank)}.pt"


def missing_checkpoint_files(step_dir: str | os.PathLike, roles: Iterable[str] = ("actor",)) -> list[str]:
    """The files a complete checkpoint has that ``step_dir`` lacks, relative to it; empty when complete.

    A complete checkpoint holds ``trainer_state.pt`` and, for each role, ``<role>/model.safetensors`` and
    ``<role>/train_state.pt``; a role directory with shards also holds ``sharded/.metadata`` (when it has
    ``sharded/``) and, for every ``mp_rank_XX/`` from ``mp_rank_00`` to the highest one present, that shard's
    ``model.safetensors`` and ``train_state.pt``. Rollout state files are optional (older checkpoints have none).

    Args:
        step_dir: a ``global_step_N`` directory.
        roles: the worker groups that save into a checkpoint, e.g. ``("actor", "critic")``.
    """
    step_dir = Path(step_dir)
    expected = [TRAINER_STATE_FILE]
    for role in roles:
        expected += [f"{role}/{WEIGHTS_FILE}", f"{role}/{TRAIN_STATE_FILE}"]
        if (step_dir / role / "sharded").is_dir():
            expected.append(f"{role}/sharded/.metadata")
        for shard in tensor_parallel_shard_names(step_dir / role):
            expected += [f"{role}/{shard}/{WEIGHTS_FILE}", f"{role}/{shard}/{TRAIN_STATE_FILE}"]
    return [name for name in expected if not (step_dir / name).is_file()]


def shard_name(tp_rank: int, stage: int | None = None) -> str:
    """The directory of a megatron rank's shards: ``mp_rank_XX`` for tensor-parallel rank ``XX``, with pipeline
    stages ``mp_rank_XX_YYY`` for stage ``YYY`` (megatron's naming)."""
    return f"mp_rank_{tp_rank:02d}" if stage is None else f"mp_rank_{tp_rank:02d}_{stage:03d}"


def tensor_parallel_shard_names(role_dir: str | os.PathLike) -> list[str]:
    """``mp_rank_00`` .. ``mp_rank_<highest present>`` (``mp_rank_TT_PPP`` for every tensor-parallel rank and
    pipeline stage up to the highest present, with stages): the shard directories a role directory must hold once
    it holds any (a gap is a missing shard, not a smaller model-parallel size); empty without shards."""
    role_dir = Path(role_dir)
    if not role_dir.is_dir():
        return []
    found = [m for p in role_dir.iterdir() if p.is_dir() and (m := SHARD_DIR_PATTERN.match(p.name))]
    if not found:
        return []
    tp = max(int(m.group(1)) for m in found) + 1
    stages = [int(m.group(2)) for m in found if m.group(2) is not None]
    if not stages:
        return [shard_name(rank) for rank in range(tp)]
    return [shard_name(rank, stage) for rank in range(tp) for stage in range(max(stages) + 1)]


def is_complete_checkpoint(step_dir: str | os.PathLike, roles: Iterable[str] = ("actor",)) -> bool:
    """Whether ``step_dir`` holds every file of a checkpoint (see :func:`missing_checkpoint_files`)."""
    return not missing_checkpoint_files(step_dir, roles)


def verify_checkpoint(step_dir: str | os.PathLike, roles: Iterable[str] = ("actor",)) -> None:
    """Check, cheaply and in the driver, that every file of a checkpoint exists and is readable.

    ``trainer_state.pt``, each ``<role>/train_state.pt`` and any ``<role>/rng_state_rank*.pt`` must be
    ``torch.save`` zip archives that load with ``weights_only=True`` (memory-mapped, so tensor data is not read)
    into a dict; each ``<role>/model.safetensors`` must have a valid header and exactly the size the header
    declares. Shards are checked the same way: each ``mp_rank_XX/`` like a role directory, and ``sharded/``'s
    ``.metadata`` and ``.distcp`` files by :func:`verl.utils.dcp_metadata.verify_sharded_checkpoint` (the index
    readable, every shard file present and as long as the index says). Foreign pickles are refused by the
    weights-only unpickler, never executed.

    Args:
        step_dir: a ``global_step_N`` directory.
        roles: the worker groups that save into a checkpoint, e.g. ``("actor", "critic")``.

    Raises:
        CheckpointError: on the first missing or bad file.
    """
    step_dir = Path(step_dir)
    roles = list(roles)
    missing = missing_checkpoint_files(step_dir, roles)
    if missing:
        raise CheckpointError(step_dir / missing[0], "is missing (the checkpoint is incomplete)")
    _verify_state_file(step_dir / TRAINER_STATE_FILE)
    for role in roles:
        role_dir = step_dir / role
        for weights_dir in [role_dir, *(role_dir / shard for shard in tensor_parallel_shard_names(role_dir))]:
            _verify_safetensors(weights_dir / WEIGHTS_FILE)
            _verify_state_file(weights_dir / TRAIN_STATE_FILE)
        for rng_state in sorted(role_dir.glob(RNG_STATE_GLOB)):
            _verify_state_file(rng_state)
        if (role_dir / "sharded").is_dir():
            # imported here: torch.distributed.checkpoint is only needed when a role holds DCP shards
            from verl.utils.dcp_metadata import SHARDED_DIR, verify_sharded_checkpoint

            verify_sharded_checkpoint(role_dir / SHARDED_DIR)


def _verify_state_file(path: Path) -> None:
    # torch.save writes zip archives; anything else is truncated (the zip directory is at the end) or foreign
    if not zipfile.is_zipfile(path):
        raise CheckpointError(
            path, "is damaged or was not written by this trainer (not a complete torch.save zip archive)"
        )
    state = _torch_load(path, mmap=True)
    if not isinstance(state, dict):
        raise CheckpointError(
            path, f"was not written by this trainer (it holds a {type(state).__name__}, the trainer writes a dict)"
        )


def _verify_safetensors(path: Path) -> None:
    try:
        with safe_open(str(path), framework="pt") as handle:
            handle.keys()
    except (SafetensorError, OSError) as err:
        raise CheckpointError(path, f"is damaged or was not written by this trainer ({err})") from err
    # safetensors checks this too, but the layout is simple enough to check ourselves whatever its version:
    # 8-byte little-endian header length, the JSON header, then the data the header's offsets cover
    size = path.stat().st_size
    with open(path, "rb") as handle:
        (header_length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(header_length))
    data_length = max(
        (int(entry["data_offsets"][1]) for key, entry in header.items() if key != "__metadata__"), default=0
    )
    expected = 8 + header_length + data_length
    if size != expected:
        raise CheckpointError(
            path, f"is damaged: {size} bytes, but its header describes {expected} bytes (an interrupted write?)"
        )


def find_latest_checkpoint(root: str | os.PathLike, roles: Iterable[str] = ("actor",)) -> Path | None:
    """The complete ``global_step_N`` directory under ``root`` with the largest N, or None.

    Incomplete directories (see :func:`missing_checkpoint_files`), such as a non-atomic copy leaves behind, are
    skipped with a warning naming each one and what it lacks. Completeness is about presence only; call
    :func:`verify_checkpoint` on the result to check the files can be read.

    Args:
        root: the checkpoint root, ``trainer.default_local_dir``.
        roles: the worker groups that save into a checkpoint, e.g. ``("actor", "critic")``.
    """
    root = Path(root)
    if not root.is_dir():
        return None
    roles = list(roles)
    steps = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := STEP_DIR_PATTERN.match(p.name))]
    for _, path in sorted(steps, reverse=True):
        missing = missing_checkpoint_files(path, roles)
        if not missing:
            return path
        logger.warning("skipping incomplete checkpoint %s: it lacks %s", path, ", ".join(missing))
    return None


def remove_save_debris(root: str | os.PathLike) -> list[Path]:
    """Delete what interrupted saves left directly under ``root``; returns the deleted directories, sorted.

    Only directories named ``.global_step_N.tmp-*`` (a save that never finished) and ``.global_step_N.old-*``
    (the previous copy of a checkpoint being overwritten) are touched; symlinks and files are left alone. One
    exception keeps a good checkpoint: when ``global_step_N`` itself is absent, the save was interrupted between
    moving the old copy aside and moving the new one in, so the ``.old-*`` copy is renamed back to
    ``global_step_N`` (logged, not returned) instead of deleted. Call it at start-up, before anything saves. A
    directory that cannot be removed is left with a warning: its name is never taken for a checkpoint.

    Args:
        root: the checkpoint root, ``trainer.default_local_dir``; a missing root is not an error.
    """
    root = Path(root)
    if not root.is_dir():
        return []
    removed: list[Path] = []
    entries = sorted(root.iterdir())
    for path in entries:
        if path.is_symlink() or not path.is_dir():
            continue
        old = OLD_DEBRIS_PATTERN.match(path.name)
        if old and not (root / old.group(1)).exists():
            os.replace(path, root / old.group(1))
            logger.warning("restored %s from %s, left by a save interrupted mid-swap", root / old.group(1), path)
            continue
        if old or TMP_DEBRIS_PATTERN.match(path.name):
            try:
                shutil.rmtree(path)
            except OSError as err:  # e.g. a killed rank's last write still landing on a network filesystem
                logger.warning(
                    "could not remove %s (%s): it is never taken for a checkpoint; remove it by hand",
                    path,
                    describe_os_error(err),
                )
                continue
            removed.append(path)
    if removed:
        logger.info("removed debris of interrupted checkpoint saves: %s", ", ".join(str(p) for p in removed))
    return removed


def step_of_checkpoint(path: str | os.PathLike) -> int:
    match = STEP_DIR_PATTERN.match(Path(path).name)
    if not match:
        raise ValueError(f"{path} is not a checkpoint directory (expected a name like global_step_10).")
    return int(match.group(1))


def checkpoints_to_keep(limits: Iterable[int | None]) -> int | None:
    """How many whole checkpoints to keep, given each saving role's limit (``trainer.max_<role>_ckpt_to_keep``).

    A checkpoint here is one directory holding every role, so the roles cannot be pruned apart without leaving
    checkpoints a resume cannot use: the largest limit wins, and ``None`` (keep all) for any role keeps all.
    """
    limits = list(limits)
    if not limits or any(limit is None for limit in limits):
        return None
    return max(int(limit) for limit in limits)


def prune_checkpoints(
    root: str | os.PathLike, newest: str | os.PathLike, keep: int | None, roles: Iterable[str] = ("actor",)
) -> list[Path]:
    """Delete the complete checkpoints older than ``newest`` beyond the ``keep`` most recent; returns them, oldest
    first.

    ``newest`` (the checkpoint just saved) always stays and counts as one of ``keep``. Only complete
    ``global_step_N`` directories with N below ``newest``'s step are candidates: incomplete directories are not
    counted and not touched (:func:`find_latest_checkpoint` already skips them, and they may be all that is left of
    something a person wants to inspect), nor are directories of later steps, which an earlier run in the same
    directory left before this run resumed from an older checkpoint.

    Args:
        root: the checkpoint root, ``trainer.default_local_dir``.
        newest: the checkpoint just saved, a ``global_step_N`` directory under ``root``.
        keep: how many checkpoints to keep, at least 1; ``None`` keeps all (nothing is deleted).
        roles: the worker groups that save into a checkpoint, e.g. ``("actor", "critic")``.

    Raises:
        ValueError: ``keep`` is below 1.
    """
    if keep is None:
        return []
    if keep < 1:
        raise ValueError(f"prune_checkpoints keeps at least 1 checkpoint (the one just saved), got keep={keep}.")
    root, roles = Path(root), list(roles)
    newest_step = step_of_checkpoint(newest)
    older = sorted(
        (int(m.group(1)), path)
        for path in root.iterdir()
        if path.is_dir()
        and not path.is_symlink()
        and (m := STEP_DIR_PATTERN.match(path.name))
        and int(m.group(1)) < newest_step
        and is_complete_checkpoint(path, roles)
    )
    doomed = [path for _, path in older[: max(len(older) - (keep - 1), 0)]]
    for path in doomed:
        shutil.rmtree(path)
    if doomed:
        logger.info("removed %d old checkpoint(s) to keep %d: %s", len(doomed), keep, ", ".join(map(str, doomed)))
    return doomed
