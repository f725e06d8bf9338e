"""What runs after a profiling window, as verl's ``relocate_results`` and ``finish_hook_cmd`` have it.

- :func:`relocate_nsight_reports`: Ray writes each profiled worker's Nsight Systems report into its session's log
  directory (``logs/nsight/worker_process_<pid>.*``), wherever ``save_path`` is; this moves the reports of one
  process there, named after the role and the host. nsys finishes a report only when its capture ends, so a report
  not yet written is left for the next call.
- :func:`run_finish_hook`: the user's shell command, once after the last profiled step (an upload of ``save_path``,
  say), with the run's context in ``VERL_PROFILE_*`` variables. Its output goes to the log; a failure is logged and
  never stops training.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_NSIGHT_DIR", "ray_nsight_dir", "relocate_nsight_reports", "run_finish_hook"]

# Ray's Nsight directory when this process is not a Ray worker (the newest session's).
DEFAULT_NSIGHT_DIR = Path("/tmp/ray/session_latest/logs/nsight")


def ray_nsight_dir() -> Path:
    """Where Ray's ``nsight`` runtime environment writes this process's reports: its session's ``logs/nsight``."""
    try:
        from ray._private import worker

        node = worker._global_node  # set in a Ray worker; Ray has no public accessor of the session directory
        if node is not None:
            return Path(node.get_session_dir_path()) / "logs" / "nsight"
    except (ImportError, AttributeError):
        pass
    return DEFAULT_NSIGHT_DIR


def relocate_nsight_reports(source: Path, save_dir: Path, prefix: str, pid: int | None = None) -> list[str]:
    """Move process ``pid``'s reports (``worker_process_<pid>.*``, this process by default) from ``source`` into
    ``save_dir`` as ``<prefix>_<host>_<name>``; returns the new paths (none when nothing is written yet)."""
    pid = os.getpid() if pid is None else pid
    reports = sorted(source.glob(f"worker_process_{pid}.*")) if source.is_dir() else []
    moved = []
    for report in reports:
        save_dir.mkdir(parents=True, exist_ok=True)
        target = save_dir / f"{prefix}_{socket.gethostname()}_{report.name}"
        try:
            shutil.move(str(report), str(target))
        except OSError as err:  # moved by another call meanwhile, or a read-only target: keep training
            logger.warning("relocate_results: could not move %s to %s: %s", report, target, err)
            continue
        moved.append(str(target))
    return moved


def run_finish_hook(command: str, env: Mapping[str, str]) -> int | None:
    """Run ``command`` with ``/bin/sh -c`` and ``env`` added to this process's environment, its output logged line
    by line; returns its exit code (None when it could not start). Never raises."""
    logger.info("profiler finish hook: running %s", command)
    try:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", command],
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    except OSError as err:
        logger.warning("profiler finish hook: %s could not start: %s", command, err)
        return None
    with proc:
        for line in proc.stdout:
            logger.info("profiler finish hook: %s", line.rstrip())
    if proc.returncode:
        logger.warning("profiler finish hook: %s exited with %d", command, proc.returncode)
    return proc.returncode
