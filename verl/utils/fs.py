"""A model directory copied into shared memory: verl's ``actor_rollout_ref.model.use_shm`` (:func:`copy_to_shm`).

With ``use_shm=true`` the actor workers load the model (config, tokenizer files, weights), a separate tokenizer
directory and ``lora_adapter_path`` from copies in ``/dev/shm``, a RAM-backed file system on Linux: the many readers
of one node (a worker per device, each loading the weights, and a vLLM engine beside it) read memory instead of a
network or disk file system.

- **One copy per node.** The workers of a node share ``/dev/shm``. The first to arrive copies, under an exclusive
  lock, while the others wait for it; then all load from the copy. It lives in
  ``/dev/shm/verl-model-copies-<uid>/<name>-<digest>``: ``digest`` hashes the source's absolute path and the name,
  size and modification time of each of its files, so while a copy exists every worker of the node with an
  unchanged source reuses it, and a changed source gets a fresh copy. A copy is written under another name and
  renamed into place when complete, so a half-written copy is never loaded.
- **What is copied.** Every file under the directory, symbolic links followed (a Hugging Face cache snapshot's
  files are links to its blobs), except names starting with ``.`` (``.git``, ``.cache``). A path that is not a local
  directory is taken as a Hugging Face hub name and resolved to its snapshot first (what ``from_pretrained`` would
  download anyway).
- **Lifetime.** A process holds a shared lock on every copy it uses for as long as it lives; the kernel drops it
  however the process ends (Ray kills its workers at the end of a run, so no exit handler of theirs runs). The
  process that makes a copy also starts a small detached process (:func:`remove_when_unused`, no child of the
  worker, so it outlives it) that waits for the last lock to go and then removes the copy. So the memory is held
  while a run uses the model, a restarted worker that arrives in time joins the copy, and it is given back after
  the run, however the run ended. A process that exits normally (or calls :func:`release_shm_copies`) removes a
  copy it was the last user of at once, and a copy left without its remover (the remover killed) is removed the
  next time a process of the node prepares another copy.
- **Where there is no /dev/shm** (or it is not writable), the system's temporary directory holds the copies, with a
  warning: the run behaves the same, without the speed-up. When the file system has no room for the model, the
  source is loaded directly, with a warning (Docker gives containers 64 MiB of ``/dev/shm`` by default).

:func:`copy_to_local` is verl's name of the same service for a local path.
"""

from __future__ import annotations

import atexit
import dataclasses
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

logger = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
# the directory that holds the verl package, for the remover process's imports
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
# per user: another user's copies are neither read nor removed (and cannot be planted in ours)
COPIES_DIR = f"verl-model-copies-{os.getuid()}"


@dataclasses.dataclass
class _HeldCopy:
    """A copy this process uses: its directory, and the open file holding the shared lock that says so."""

    root: Path
    name: str
    users_fd: int


_HELD: dict[str, _HeldCopy] = {}  # copy directory -> held copy
_HELD_LOCK = threading.Lock()


def copy_to_local(src: str, use_shm: bool = False) -> str:
    """The path to load ``src`` from: ``src`` itself, or with ``use_shm`` its copy in shared memory
    (:func:`copy_to_shm`). Only local directories and Hugging Face hub names are taken (no HDFS here)."""
    return copy_to_shm(src) if use_shm else src


def copy_to_shm(src: str | os.PathLike, root: str | os.PathLike | None = None) -> str:
    """The path of ``src``'s copy in shared memory, made unless this node already has it; held until this process
    ends (or :func:`release_shm_copies`).

    Args:
        src: a local model directory (or a Hugging Face hub name, resolved to its local snapshot).
        root: where the copies live (default ``/dev/shm``, else the system's temporary directory, with a warning).

    Returns:
        The copy's directory, or ``src``'s own directory when the file system has no room for the copy (with a
        warning).

    Raises:
        ValueError: ``src`` is neither a local directory nor a hub name that resolves to one.
    """
    source = _local_directory(str(src))
    manifest = _manifest(source)
    digest = hashlib.sha256(json.dumps([str(source), manifest]).encode()).hexdigest()[:16]
    base = _copies_root(root)
    name = f"{source.name or 'model'}-{digest}"
    target = base / name
    with _HELD_LOCK:
        if str(target) in _HELD:
            return str(target)
        _remove_unused_copies(base, keep=name)
        copy_fd = _lock(base / f"{name}.lock", fcntl.LOCK_EX)
        try:
            made = not _is_complete(target, manifest)
            if made and not _copy(source, target, manifest):
                return str(source)
            if not made:
                logger.info("use_shm: loading %s from the copy already in %s", source, target)
            users_fd = _lock(base / f"{name}.users", fcntl.LOCK_SH)
            if made:
                _start_remover(base, name)
        finally:
            os.close(copy_fd)  # the copy lock's only job was to let one process copy
        _HELD[str(target)] = _HeldCopy(base, name, users_fd)
    return str(target)


def release_shm_copies() -> None:
    """Stop using this process's copies; each that no other process uses is removed. Runs at interpreter exit."""
    with _HELD_LOCK:
        for path in list(_HELD):
            held = _HELD.pop(path)
            copy_fd = _lock(held.root / f"{held.name}.lock", fcntl.LOCK_EX)  # no one is copying or joining meanwhile
            try:
                # only when no one else holds it; the remover may hold it for a moment (it lets go at once when it
                # finds the copy's lock taken), so a refusal is tried again before it counts as another user's
                for _ in range(5):
                    try:
                        fcntl.flock(held.users_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        time.sleep(0.02)
                        continue
                    _remove_copy(held.root, held.name)
                    break
            finally:
                os.close(held.users_fd)
                os.close(copy_fd)


atexit.register(release_shm_copies)


def remove_when_unused(base: str | os.PathLike, name: str) -> None:
    """Wait until no process uses the copy ``name`` under ``base``, then remove it; returns at once when it is gone.

    What the detached remover process runs (:func:`copy_to_shm` starts one per copy it makes). A process joining the
    copy meanwhile (it holds the copy's lock while it takes its shared lock) is let in, and waited for in turn.
    """
    base = Path(base)
    users = base / f"{name}.users"
    while True:
        try:
            users_fd = os.open(users, os.O_RDWR)
        except FileNotFoundError:
            return  # removed by its last user, or by another process's clean-up
        try:
            fcntl.flock(users_fd, fcntl.LOCK_EX)  # blocks while any process holds its shared lock
            if not _names(users_fd, users):
                continue  # removed (and maybe made again) while this process waited
            try:
                copy_fd = _lock(base / f"{name}.lock", fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                copy_fd = None  # a process is joining it, or releasing it: let go, then look again
            if copy_fd is not None:
                try:
                    _remove_copy(base, name)
                    return
                finally:
                    os.close(copy_fd)
        finally:
            os.close(users_fd)
        time.sleep(0.5)


def _start_remover(base: Path, name: str) -> None:
    """Start :func:`remove_when_unused` for a copy in a process of its own session that is no child of this one
    (``sh`` starts it in the background and exits), so that killing this process, or its process group, leaves it
    running."""
    code = "import sys; from verl.utils.fs import remove_when_unused; remove_when_unused(sys.argv[1], sys.argv[2])"
    pythonpath = os.pathsep.join(p for p in (_PACKAGE_ROOT, os.environ.get("PYTHONPATH")) if p)
    try:
        launcher = subprocess.Popen(
            ["sh", "-c", '"$@" &', "verl-shm-remover", sys.executable, "-c", code, str(base), name],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            cwd="/",
            env={**os.environ, "PYTHONPATH": pythonpath},
        )
        launcher.wait(timeout=30)
    except (OSError, subprocess.SubprocessError) as err:
        logger.warning("use_shm: could not start the remover of %s (%s); it stays after the run", base / name, err)


def _local_directory(src: str) -> Path:
    path = Path(src).expanduser()
    if path.is_dir():
        return path.resolve()
    if path.exists() or path.is_absolute() or src.startswith((".", "~")) or src.count("/") != 1:
        raise ValueError(
            f"actor_rollout_ref.model.use_shm=true copies a model directory, and {src!r} is not one; point the path "
            "at a local Hugging Face model directory (or a hub name), or set use_shm=false."
        )
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id=src)).resolve()
    except Exception as err:  # network, authentication, unknown repository
        raise ValueError(
            f"actor_rollout_ref.model.use_shm=true: {src!r} is not a local directory, and as a Hugging Face hub name "
            f"it did not resolve to a local snapshot ({err}); download it first, or set use_shm=false."
        ) from None


def _manifest(source: Path) -> list[list]:
    """``[relative path, size, mtime_ns]`` of every file under ``source`` (links followed, dot-names skipped)."""
    entries = []
    for directory, subdirs, files in os.walk(source, followlinks=True):
        subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
        for file in sorted(f for f in files if not f.startswith(".")):
            path = Path(directory) / file
            stat = path.stat()
            entries.append([path.relative_to(source).as_posix(), stat.st_size, stat.st_mtime_ns])
    return entries


def _copies_root(root: str | os.PathLike | None) -> Path:
    if root is None:
        if os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK | os.X_OK):
            root = SHM_DIR
        else:
            root = tempfile.gettempdir()
            logger.warning(
                "actor_rollout_ref.model.use_shm=true, but this node has no writable %s: the model copy goes to %s "
                "(no faster than the source)",
                SHM_DIR,
                root,
            )
    base = Path(root) / COPIES_DIR
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    if base.stat().st_uid != os.getuid():
        raise ValueError(f"{base} belongs to another user; remove it, or point TMPDIR elsewhere.")
    return base


def _lock(path: Path, operation: int) -> int:
    """An open descriptor of ``path`` holding ``flock(operation)``. A lock file removed (and maybe made again) by
    another process while this one waited is opened afresh, so every holder locks the file the path names.

    Raises:
        BlockingIOError: ``operation`` has ``LOCK_NB`` and another process holds a conflicting lock.
    """
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, operation)
            if _names(fd, path):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # removed after the lock was taken: take the new file's


def _names(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _is_complete(target: Path, manifest: list[list]) -> bool:
    """Whether ``target`` holds every file of ``manifest`` at its size (the digest in its name pins the rest)."""
    if not target.is_dir():
        return False
    for relative, size, _ in manifest:
        path = target / relative
        if not path.is_file() or path.stat().st_size != size:
            return False
    return True


def _copy(source: Path, target: Path, manifest: list[list]) -> bool:
    """Copy ``source``'s files into ``target`` (written aside, renamed into place); False when there is no room."""
    needed = sum(size for _, size, _ in manifest)
    free = shutil.disk_usage(target.parent).free
    if needed > free:
        logger.warning(
            "actor_rollout_ref.model.use_shm=true, but %s has %.1f GiB free and %s needs %.1f GiB: loading from %s",
            target.parent,
            free / 2**30,
            source,
            needed / 2**30,
            source,
        )
        return False
    partial = Path(tempfile.mkdtemp(prefix=f"{target.name}.partial-", dir=target.parent))
    try:
        for relative, _, _ in manifest:
            destination = partial / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / relative, destination)
        shutil.rmtree(target, ignore_errors=True)  # an incomplete copy (files removed from it by hand)
        os.rename(partial, target)
    except OSError as err:
        shutil.rmtree(partial, ignore_errors=True)
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        logger.warning(
            "actor_rollout_ref.model.use_shm=true, but %s filled up (%s): loading from %s", target, err, source
        )
        return False
    logger.info("use_shm: copied %s (%.1f MiB, %d files) to %s", source, needed / 2**20, len(manifest), target)
    return True


def _remove_copy(base: Path, name: str) -> None:
    """Remove a copy, its half-written leftovers and its users file (the caller holds its locks)."""
    shutil.rmtree(base / name, ignore_errors=True)
    for leftover in base.glob(f"{name}.partial-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    for suffix in (".users", ".lock"):
        (base / f"{name}{suffix}").unlink(missing_ok=True)


def _copy_name(entry: str) -> str:
    """The copy an entry of the copies directory belongs to: the copy itself, its ``.lock`` and ``.users`` files,
    its half-written ``.partial-*`` directories (a model's own name may hold dots: ``Qwen2.5-3B``)."""
    for suffix in (".lock", ".users"):
        if entry.endswith(suffix):
            return entry[: -len(suffix)]
    return entry.split(".partial-", 1)[0]


def _remove_unused_copies(base: Path, keep: str) -> None:
    """Remove every copy under ``base`` but ``keep`` that no process uses or is making (left by a killed run)."""
    names = {_copy_name(entry.name) for entry in base.iterdir()} - {keep}
    for name in sorted(names):
        try:
            copy_fd = _lock(base / f"{name}.lock", fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # being copied or joined right now
        try:
            users_fd = _lock(base / f"{name}.users", fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(copy_fd)
            continue  # in use
        try:
            logger.info("use_shm: removing %s, a copy no process uses", base / name)
            _remove_copy(base, name)
        finally:
            os.close(users_fd)
            os.close(copy_fd)
