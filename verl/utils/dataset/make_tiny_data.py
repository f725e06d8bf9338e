"""Write the embedded task as data files in verl's layout: ``python -m verl.utils.dataset.make_tiny_data --out DIR``.

The files are what verl's preprocessing scripts (``examples/data_preprocess/gsm8k.py`` among them) write, with the
embedded reverse-the-digits task (:mod:`verl.utils.reward_score.tiny_task`) in them: ``DIR/train.parquet`` and
``DIR/test.parquet``, each row ``data_source="tiny_task"``, ``prompt`` a chat of one user message (``"3142="``),
``ability="reverse"``, ``reward_model={"style": "rule", "ground_truth": "2413"}`` and ``extra_info={"split",
"index"}``. A verl script pointed at them (``data.train_files=DIR/train.parquet data.val_files=DIR/test.parquet``)
trains on data that the embedded tiny model's tokenizer reads and the built-in ``tiny_task`` scorer scores: the data
half of a CPU smoke test (``docs/start/from_verl.md``, "Smoke-test a verl script on CPU"). Nothing is downloaded; the
same ``--seed`` writes the same rows.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable, Sequence
from pathlib import Path

from verl.utils.reward_score import tiny_task

__all__ = ["ABILITY", "data_files_cli", "tiny_task_rows", "write_split_files", "write_tiny_data"]

ABILITY = "reverse"


def tiny_task_rows(num_rows: int, seed: int, split: str) -> list[dict]:
    """``num_rows`` rows of the embedded task in verl's layout, drawn from ``seed``."""
    rng = random.Random(seed)
    rows = []
    for index in range(num_rows):
        prompt, answer = tiny_task.make_example(rng)
        rows.append(
            {
                "data_source": tiny_task.DATA_SOURCE,
                "prompt": [{"role": "user", "content": prompt}],
                "ability": ABILITY,
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"split": split, "index": index},
            }
        )
    return rows


def write_tiny_data(out: Path, num_train: int, num_test: int, seed: int = 0, overwrite: bool = True) -> dict[str, str]:
    """``out/train.parquet`` (``num_train`` rows from ``seed``) and ``out/test.parquet`` (``num_test`` rows from
    ``seed + 1``); {"train": path, "test": path}. With ``overwrite=False`` a file that exists is kept as it is.

    Raises:
        ValueError: a row count below 1.
    """
    return write_split_files(tiny_task_rows, out, num_train, num_test, seed, overwrite)


def write_split_files(
    make_rows: Callable[[int, int, str], list[dict]],
    out: Path,
    num_train: int,
    num_test: int,
    seed: int = 0,
    overwrite: bool = True,
) -> dict[str, str]:
    """``out/train.parquet`` and ``out/test.parquet`` of ``make_rows(num_rows, seed, split)`` (the test rows from
    ``seed + 1``); {"train": path, "test": path}. With ``overwrite=False`` a file that exists is kept as it is.

    Raises:
        ValueError: a row count below 1.
    """
    import pandas as pd

    if num_train < 1 or num_test < 1:
        raise ValueError(f"--num-train and --num-test must be at least 1, got {num_train} and {num_test}.")
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, num_rows, split_seed in (("train", num_train, seed), ("test", num_test, seed + 1)):
        path = out / f"{split}.parquet"
        if overwrite or not path.exists():
            pd.DataFrame(make_rows(num_rows, split_seed, split)).to_parquet(path)
        paths[split] = str(path)
    return paths


def data_files_cli(prog: str, description: str, write: Callable[..., dict[str, str]], argv=None) -> None:
    """The command line of a data writer: ``--out DIR [--num-train N] [--num-test N] [--seed S]``; prints the
    ``data.train_files=... data.val_files=...`` overrides that use the files."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--out", type=Path, required=True, help="directory of train.parquet and test.parquet")
    parser.add_argument("--num-train", type=int, default=1024, help="training rows (default 1024)")
    parser.add_argument("--num-test", type=int, default=64, help="validation rows (default 64)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the training rows; the test rows use seed + 1")
    args = parser.parse_args(argv)
    try:
        paths = write(args.out.expanduser(), args.num_train, args.num_test, args.seed)
    except ValueError as err:
        parser.error(str(err))
    print(f"data.train_files={paths['train']} data.val_files={paths['test']}")


def main(argv: Sequence[str] | None = None) -> None:
    data_files_cli("python -m verl.utils.dataset.make_tiny_data", __doc__.splitlines()[0], write_tiny_data, argv)


if __name__ == "__main__":
    main()
