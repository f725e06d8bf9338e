"""Reading data files row by row, and what is wrong with a row: :class:`RowProblem` names the file, the row and the
column, so that every bad row of a data set can be reported at start-up, in one message, before any training.

:func:`read_records` reads a parquet or JSONL file into its records, each with its position in the file, and sets
aside the rows it cannot read (text that is not valid UTF-8, a JSONL line that is not JSON) as problems instead of
stopping at the first; :class:`BadRow` is what a check of one record's values raises (a null ground truth, an
empty prompt, a value of the wrong type); :func:`describe_problems` is the one message for a list of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["MAX_LISTED_PROBLEMS", "BadRow", "Record", "RowProblem", "describe_problems", "is_null", "read_records"]

_EXTENSIONS = {".parquet": "parquet", ".jsonl": "jsonl"}
# A message lists this many problems, then says how many more there are.
MAX_LISTED_PROBLEMS = 20


@dataclass(frozen=True)
class RowProblem:
    """What is wrong with one row of a data file.

    Attributes:
        file: the data file.
        row: the row's 0-based index in the file (for JSONL, among its non-blank lines).
        column: the column at fault (dotted for a nested entry: ``reward_model.ground_truth``); None for the row.
        what: what is wrong, and what the value was.
        line: the 1-based line number of a JSONL row (None for parquet).
    """

    file: str
    row: int
    column: str | None
    what: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line} (row {self.row})" if self.line is not None else f"{self.file} row {self.row}"
        column = f", column {self.column!r}" if self.column is not None else ""
        return f"{where}{column}: {self.what}"


@dataclass(frozen=True)
class Record:
    """One row of a data file as read: its values and where it is."""

    values: dict[str, Any]
    file: str
    row: int
    line: int | None = None

    def problem(self, column: str | None, what: str) -> RowProblem:
        return RowProblem(self.file, self.row, column, what, self.line)


class BadRow(ValueError):
    """A record's value that the data set cannot use: the column at fault and what is wrong."""

    def __init__(self, column: str | None, what: str):
        super().__init__(what if column is None else f"column {column!r}: {what}")
        self.column = column
        self.what = what


def is_null(value: Any) -> bool:
    """None, a float NaN (a missing string of pandas), or pandas' ``NA``."""
    return value is None or (isinstance(value, float) and value != value) or type(value).__name__ == "NAType"


def describe_problems(problems: list[RowProblem], advice: str) -> str:
    """``problems`` as one message: how many, the first :data:`MAX_LISTED_PROBLEMS` one per line, then ``advice``."""
    listed = "".join(f"\n  - {problem}" for problem in problems[:MAX_LISTED_PROBLEMS])
    more = len(problems) - MAX_LISTED_PROBLEMS
    tail = f"\n  ... and {more} more" if more > 0 else ""
    return f"{len(problems)} bad data row(s):{listed}{tail}\n{advice}"


def read_records(path: Path) -> tuple[list[Record], list[RowProblem]]:
    """The rows of a ``.parquet`` or ``.jsonl`` file, and the rows that cannot be read (each a problem, left out).

    Raises:
        ValueError: an unknown extension, or a file that does not exist.
    """
    kind = _EXTENSIONS.get(path.suffix.lower())
    if kind is None:
        raise ValueError(
            f"Cannot read data file {str(path)!r}: unknown extension {path.suffix!r}. "
            "Accepted: .parquet, .jsonl (one JSON object per line). Convert the file to one of these."
        )
    if not path.is_file():
        raise ValueError(f"Data file {str(path)!r} does not exist. Check data.train_files / data.val_files.")
    return _read_parquet(path) if kind == "parquet" else _read_jsonl(path)


def _read_parquet(path: Path) -> tuple[list[Record], list[RowProblem]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    not_utf8: dict[int, tuple[str, str]] = {}  # row -> (the first column holding text that is not UTF-8, why)
    for name in table.column_names:
        column = table.column(name)
        try:
            column.validate(full=True)  # pyarrow's own check of its string data (nested ones too)
        except pa.ArrowInvalid:
            for row in range(len(column)):  # only for a column that failed: find its rows
                try:
                    column[row].as_py()
                except UnicodeDecodeError as err:
                    not_utf8.setdefault(row, (name, f"{err.reason} at byte {err.start}"))
    rows = [row for row in range(table.num_rows) if row not in not_utf8]
    if not_utf8:
        table = table.take(rows)
    values = table.to_pandas().to_dict(orient="records")
    problems = [
        RowProblem(str(path), row, column, f"text that is not valid UTF-8 ({why})")
        for row, (column, why) in sorted(not_utf8.items())
    ]
    return [Record(value, str(path), row) for row, value in zip(rows, values, strict=True)], problems


def _read_jsonl(path: Path) -> tuple[list[Record], list[RowProblem]]:
    records, problems = [], []
    row = 0
    for line_number, raw in enumerate(path.read_bytes().splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as err:
            problems.append(
                RowProblem(str(path), row, None, f"not valid UTF-8 ({err.reason} at byte {err.start})", line_number)
            )
        except json.JSONDecodeError as err:
            problems.append(
                RowProblem(str(path), row, None, f"not valid JSON ({err}); expected one JSON object", line_number)
            )
        else:
            if isinstance(value, dict):
                records.append(Record(value, str(path), row, line_number))
            else:
                what = f"a JSON {type(value).__name__}, not an object with the row's columns"
                problems.append(RowProblem(str(path), row, None, what, line_number))
        row += 1
    return records, problems
