"""Metric sinks: console, JSONL (always cheap, always on by default), TensorBoard and W&B when asked.

TensorBoard and W&B are optional: asking for one that is not installed is a start-up error that says what to
install, never a silent no-op.

``metrics.jsonl`` holds one JSON object per line, ``{"step": <int>, "<metric>": <float or "nan"/"inf">, ...}``,
and is appended to across runs in the same directory. A resumed run replays the steps after its checkpoint, so
:meth:`Tracking.truncate_after` (or :func:`truncate_jsonl_after_step`) drops the rows past the resumed step
before they are logged again; a fresh start moves an earlier run's file aside as ``metrics.<time>.jsonl``, keeping
the :data:`KEEP_SET_ASIDE` newest of those. A crash can leave the last line half-written; readers drop such a line
with a warning, and :class:`Tracking` cuts it off before appending so that it never ends up in the middle of the
file.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger("verl.trainer")

LOGGERS = ("console", "jsonl", "tensorboard", "wandb")
# A fresh start moves an earlier run's metrics.jsonl (and val_generations.jsonl) aside under a dated name; this many
# of the newest such copies of each file are kept, the older ones deleted.
KEEP_SET_ASIDE = 5
# The optional sinks: the module each imports, and the package that provides it.
_SINK_MODULES = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb")}
# The few metrics the console line shows; everything goes to the other sinks.
CONSOLE_KEYS = (
    "critic/score/mean",
    "actor/update_failed",
    "actor/update_failures_total",
    "actor/loss_scale",
    "actor/pg_loss",
    "critic/vf_loss",
    "response_length/mean",
    "val/score/mean",
    "perf/tokens_per_second",
)


def _jsonable(value: Any) -> Any:
    value = float(value)
    return value if math.isfinite(value) else str(value)


def sink_names(value: Any) -> list[str]:
    """``trainer.logger`` as a list of sink names: a list as it is; a string names one sink, or spells a list.

    verl's scripts build their command line inside a double-quoted string, where ``trainer.logger='[console,wandb]'``
    keeps its single quotes, so Hydra reads the string ``"[console,wandb]"``, not a list. Such a string (items
    quoted or not) means the list it spells; any other string is one sink's name (``"console"``).
    """
    if not isinstance(value, str):
        return list(value)
    text = value.strip()
    if not (text.startswith("[") and text.endswith("]")):
        return [text]
    items = (item.strip() for item in text[1:-1].split(","))
    return [
        item[1:-1] if len(item) >= 2 and item[0] == item[-1] and item[0] in "'\"" else item for item in items if item
    ]


def _set_aside_stamp() -> str:
    """The date and time a set-aside copy is named by (one per second)."""
    return time.strftime("%Y%m%d-%H%M%S")


def missing_sink_packages(loggers) -> dict[str, str]:
    """The sinks of ``loggers`` whose package is not installed: {sink: the package to install}. Checked at start-up,
    before Ray starts, without importing the packages."""
    import importlib.util

    missing = {}
    for sink in loggers:
        module, package = _SINK_MODULES.get(sink, (None, None))
        if module is None:
            continue
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a parent package that is missing or broken
            found = False
        if not found:
            missing[sink] = package
    return missing


class Tracking:
    """Fan out ``log(metrics, step)`` to the configured sinks.

    Args:
        loggers: any of ``console``, ``jsonl``, ``tensorboard``, ``wandb`` (a list, or a string as
            :func:`sink_names` reads it).
        log_dir: where ``metrics.jsonl`` and TensorBoard events go.
        project_name, experiment_name: names for W&B and the console.
        config: the run config, stored with W&B runs.
    """

    def __init__(self, loggers, log_dir, project_name: str, experiment_name: str, config: dict | None = None):
        loggers = sink_names(loggers)
        unknown = sorted(set(loggers) - set(LOGGERS))
        if unknown:
            raise ValueError(f"trainer.logger has unknown sink(s) {unknown}; accepted: {list(LOGGERS)}.")
        self.loggers = loggers
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # opened per write rather than held: the file may be rewritten (truncate_jsonl_after_step replaces it),
        # and a held handle would keep appending to the replaced, unlinked copy
        self.jsonl_path: Path | None = self.log_dir / "metrics.jsonl" if "jsonl" in loggers else None
        # validation samples (trainer.log_val_generations) go to their own file: one row per sample
        self.generations_path: Path | None = self.log_dir / "val_generations.jsonl" if "jsonl" in loggers else None
        for path in (self.jsonl_path, self.generations_path):
            if path is not None:
                _drop_partial_last_line(path)
        self._tb = None
        self._wandb = None
        if "tensorboard" in loggers:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise ValueError("trainer.logger includes tensorboard: pip install tensorboard.") from err
            self._tb = SummaryWriter(str(self.log_dir / "tensorboard"))
        if "wandb" in loggers:
            try:
                import wandb
            except ImportError as err:
                raise ValueError("trainer.logger includes wandb: pip install wandb.") from err
            self._wandb = wandb.init(project=project_name, name=experiment_name, config=config)

    def log(self, metrics: dict[str, float], step: int) -> None:
        if "console" in self.loggers:
            shown = " ".join(f"{k}={metrics[k]:.4g}" for k in CONSOLE_KEYS if k in metrics)
            logger.info("step %d: %s", step, shown)
        if self.jsonl_path is not None:
            row = json.dumps({"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}) + "\n"
            with open(self.jsonl_path, "a") as handle:
                handle.write(row)
        if self._tb is not None:
            for key, value in metrics.items():
                self._tb.add_scalar(key, value, step)
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)

    def log_generations(self, samples: list[dict[str, Any]], step: int) -> None:
        """Validation samples, each ``{"input": str, "output": str, "score": float}``, to every sink: the console
        (one line each), ``val_generations.jsonl`` (one row each, with ``step``), a TensorBoard text entry and a
        W&B table."""
        if not samples:
            return
        if "console" in self.loggers:
            for number, sample in enumerate(samples):
                logger.info(
                    "step %d: validation sample %d (score %.4g)\n[input] %s\n[output] %s",
                    step,
                    number,
                    sample["score"],
                    sample["input"],
                    sample["output"],
                )
        if self.generations_path is not None:
            rows = "".join(json.dumps({"step": step, **sample}) + "\n" for sample in samples)
            with open(self.generations_path, "a") as handle:
                handle.write(rows)
        if self._tb is not None:
            text = "\n\n".join(f"**score {s['score']:.4g}**\n\n{s['input']}\n\n---\n\n{s['output']}" for s in samples)
            self._tb.add_text("val/generations", text, step)
        if self._wandb is not None:
            import wandb

            table = wandb.Table(columns=["step", "input", "output", "score"])
            for sample in samples:
                table.add_data(step, sample["input"], sample["output"], sample["score"])
            self._wandb.log({"val/generations": table}, step=step)

    def truncate_after(self, step: int) -> int:
        """Drop the ``metrics.jsonl`` (and ``val_generations.jsonl``) rows logged after ``step``; call it on resume
        with the resumed step.

        Only the JSONL sink is rewritten; TensorBoard and W&B keep what they received. Returns the number of rows
        dropped (0 without the ``jsonl`` sink). See :func:`truncate_jsonl_after_step`.
        """
        if self.jsonl_path is None:
            return 0
        if self.generations_path is not None:
            truncate_jsonl_after_step(self.generations_path, step)
        return truncate_jsonl_after_step(self.jsonl_path, step)

    def set_aside_earlier_rows(self) -> Path | None:
        """On a fresh start, move an earlier run's non-empty ``metrics.jsonl`` aside.

        The file becomes ``metrics.<time>.jsonl`` next to it, with a warning naming both, so the new run's steps
        appear once; a non-empty ``val_generations.jsonl`` moves to ``val_generations.<time>.jsonl`` the same way.
        Only the :data:`KEEP_SET_ASIDE` newest of these files of each name are kept: older ones are deleted, each
        named in the log, so that the fresh starts of a directory do not pile up. Returns the metrics file's new
        path, or None when it had nothing to move.
        """
        stamp = _set_aside_stamp()
        moved = [_move_aside(path, stamp) for path in (self.jsonl_path, self.generations_path)]
        for path in (self.jsonl_path, self.generations_path):
            if path is not None:
                _remove_old_set_aside(path, KEEP_SET_ASIDE)
        return moved[0]

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def _move_aside(path: Path | None, stamp: str) -> Path | None:
    """Rename a non-empty ``<name>.jsonl`` to ``<name>.<stamp>.jsonl`` (``<stamp>-<n>`` when two fresh starts share
    a second); returns the new path (None: nothing to move)."""
    if path is None or not path.is_file() or path.stat().st_size == 0:
        return None
    target = path.with_name(f"{path.stem}.{stamp}{path.suffix}")
    number = 1
    while target.exists():  # never over an earlier set-aside file
        target = path.with_name(f"{path.stem}.{stamp}-{number}{path.suffix}")
        number += 1
    os.replace(path, target)
    logger.warning("an earlier run's rows were in %s: moved to %s", path, target)
    return target


def _remove_old_set_aside(path: Path, keep: int) -> list[Path]:
    """Delete the set-aside copies of ``path`` (``<name>.<stamp>[-n].jsonl``) beyond the ``keep`` newest; returns
    the deleted paths. The stamps sort as the times they were made."""
    pattern = re.compile(rf"^{re.escape(path.stem)}\.(\d{{8}}-\d{{6}})(?:-(\d+))?{re.escape(path.suffix)}$")
    found = []
    for candidate in path.parent.iterdir():
        match = pattern.match(candidate.name)
        if match and candidate.is_file():
            found.append(((match.group(1), int(match.group(2) or 0)), candidate))
    old = [candidate for _, candidate in sorted(found, reverse=True)[keep:]]
    for candidate in old:
        candidate.unlink()
        logger.info("removed %s: only the %d newest set-aside copies of %s are kept", candidate, keep, path.name)
    return old


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` file, in order; a half-written last line is dropped with a warning.

    Raises:
        ValueError: a line other than the last is not a metrics row (the message names the line).
    """
    return [row for _, row in _parse_rows(Path(path))]


def truncate_jsonl_after_step(path: str | Path, step: int) -> int:
    """Rewrite ``metrics.jsonl`` atomically, keeping only the rows whose ``step`` is ``<= step``.

    Kept lines are copied byte for byte, in order. A half-written last line (a crash mid-write) is dropped with a
    warning. The new content is written to a temporary file in the same directory and renamed over ``path``, so
    a crash during the rewrite leaves either the old or the new file, never a mix. A missing file is left
    missing.

    Args:
        path: the ``metrics.jsonl`` file.
        step: the last step to keep, the step a run resumes from.

    Returns:
        The number of complete rows dropped.

    Raises:
        ValueError: ``step`` is not an integer, or a line other than the last is not a metrics row (the message
            names the line).
    """
    if not isinstance(step, int) or isinstance(step, bool):
        raise ValueError(f"truncate_jsonl_after_step needs an integer step, got {step!r}.")
    path = Path(path)
    if not path.exists():
        return 0
    rows = _parse_rows(path)
    kept = [line for line, row in rows if row["step"] <= step]
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        # mkstemp makes the file private (0600); keep the permissions the metrics file had
        os.chmod(tmp_name, stat.S_IMODE(path.stat().st_mode))
        with os.fdopen(fd, "w") as handle:
            handle.writelines(kept)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    dropped = len(rows) - len(kept)
    if dropped:
        logger.info(
            "dropped %d row(s) after step %d from %s (they are logged again after the resume)", dropped, step, path
        )
    return dropped


def _parse_rows(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """``(line, row)`` for each row of a metrics file; each ``line`` ends with a newline."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        lines = handle.readlines()
    last_number = max((number for number, line in enumerate(lines, start=1) if line.strip()), default=0)
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        is_last = number == last_number
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            if is_last:
                logger.warning("dropping the half-written last line of %s: %r", path, line[:80])
                break
            raise ValueError(
                f"{path}: line {number} is not valid JSON ({err}); only the last line can be half-written by a "
                "crash, so the file was edited or mixed with another one. Fix or delete that line."
            ) from err
        if not isinstance(row, dict) or not isinstance(row.get("step"), int) or isinstance(row["step"], bool):
            raise ValueError(
                f"{path}: line {number} is not a metrics row (a JSON object with an integer `step`): {line[:80]!r}. "
                "Fix or delete that line."
            )
        rows.append((line if line.endswith("\n") else line + "\n", row))
    return rows


def _drop_partial_last_line(path: Path) -> None:
    """Make ``path`` end with a complete line so that appended rows start on their own line.

    A last line without its newline is either complete (only the newline was lost: one is added) or half-written
    (it is cut off, with a warning).
    """
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as handle:
        data = handle.read()
        if data.endswith(b"\n"):
            return
        start = data.rfind(b"\n") + 1
        tail = data[start:]
        try:
            complete = isinstance(json.loads(tail), dict)
        except ValueError:  # JSONDecodeError and UnicodeDecodeError both derive from it
            complete = False
        if complete:
            handle.write(b"\n")
            return
        logger.warning("dropping the half-written last line of %s: %r", path, tail[:80])
        handle.truncate(start)
