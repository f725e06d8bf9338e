"""The errors of checkpoint files: one that is missing or damaged (:class:`CheckpointError`, for reading) and one
that could not be written (:class:`CheckpointWriteError`: disk full, read-only or unwritable directory, any
``OSError``), both naming the file, both rebuilt intact when a worker's exception crosses to the driver pickled.
:func:`writing` turns whatever a writer raises for a failed write (an ``OSError``, or safetensors' I/O error) into
the latter. :mod:`verl.utils.checkpoint` re-exports all of them.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

from safetensors import SafetensorError

# how Rust's std::io::Error (safetensors) ends its message: "... (os error 28)"
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")

_RESUME_ADVICE = (
    "Resume from another checkpoint with `trainer.resume_mode=resume_path trainer.resume_from_path=<global_step_N "
    "directory>`, or start fresh with `trainer.resume_mode=disable`."
)


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, damaged, or was not written by this trainer.

    Args:
        path: the offending file.
        reason: what is wrong with it, in words.

    Attributes:
        path: the offending file, as a ``Path``.
        reason: what is wrong with it, in words.
    """

    def __init__(self, path: str | os.PathLike, reason: str):
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"Checkpoint file {self.path} {reason}. {_RESUME_ADVICE}")

    def __reduce__(self):
        # raised in a worker, it crosses to the driver pickled: rebuild it from its own arguments
        return type(self), (str(self.path), self.reason)


class CheckpointWriteError(RuntimeError):
    """Writing a checkpoint file failed: the disk is full, the directory is read-only or not writable, or any other
    ``OSError`` came up while the file was written.

    Args:
        path: the file (or directory) being written.
        reason: the OS error in words, e.g. ``[Errno 28] No space left on device``.
        errno: the OS error number (``errno.ENOSPC``, ...), None when unknown.
        checkpoint: the ``global_step_N`` directory being saved, when known.

    Attributes:
        path: the file being written, as a ``Path``.
        reason: the OS error in words.
        errno: the OS error number, or None.
        checkpoint: the ``global_step_N`` directory being saved, or None.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        reason: str,
        errno: int | None = None,
        checkpoint: str | os.PathLike | None = None,
    ):
        self.path, self.reason, self.errno = Path(path), reason, errno
        self.checkpoint = None if checkpoint is None else Path(checkpoint)
        super().__init__(f"cannot write {self.path}: {reason}")

    def __reduce__(self):
        checkpoint = None if self.checkpoint is None else str(self.checkpoint)
        return type(self), (str(self.path), self.reason, self.errno, checkpoint)

    @classmethod
    def while_saving(cls, err: CheckpointWriteError | OSError, checkpoint: str | os.PathLike) -> CheckpointWriteError:
        """``err``, raised while ``checkpoint`` was being saved (here or in a worker, whose raw ``OSError`` counts
        too), as one error naming the file, the OS error, the rank that raised it (when a worker did) and the
        checkpoint."""
        if isinstance(err, CheckpointWriteError):
            path, reason, errno = err.path, err.reason, err.errno
        else:
            path = Path(err.filename) if err.filename else Path(checkpoint).parent
            reason, errno = describe_os_error(err), err.errno
        rank = getattr(err, "rank", None)  # what the worker group attaches to a worker's exception
        return cls(path, reason if rank is None else f"{reason} (on rank {rank})", errno, checkpoint)


def describe_os_error(err: OSError) -> str:
    """``[Errno 28] No space left on device`` (without the file name, which the caller names its own way)."""
    if err.errno is None:
        return str(err) or type(err).__name__
    return f"[Errno {err.errno}] {err.strerror or os.strerror(err.errno)}"


@contextlib.contextmanager
def writing(path: str | os.PathLike) -> Iterator[None]:
    """Turn a failed write of ``path`` into :class:`CheckpointWriteError` naming the file and the OS error.

    Catches ``OSError`` and safetensors' I/O errors (which carry the OS error number as ``(os error N)``); any
    other error passes unchanged.
    """
    try:
        yield
    except OSError as err:
        raise CheckpointWriteError(path, describe_os_error(err), err.errno) from err
    except SafetensorError as err:
        match = _RUST_OS_ERROR.search(str(err))
        if match is None:
            raise
        code = int(match.group(1))
        raise CheckpointWriteError(path, f"[Errno {code}] {os.strerror(code)}", code) from err
