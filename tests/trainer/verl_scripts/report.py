"""Which of verl's example scripts start here: ``python -m tests.trainer.verl_scripts.report [--out FILE]
[--device cuda]``.

Prints one line per script (``OK``, or the first line of the start-up error) and a summary: how many start, and
how many stop at each blocker (the key the error names, with the role prefix collapsed, e.g.
``*.megatron.param_offload``; or the error's type). The same lines go to ``--out`` when given.
"""

from __future__ import annotations

import argparse
import collections
import logging
import re
import sys
import tempfile
from pathlib import Path

from tests.trainer.verl_scripts.harness import load_scripts, start_up_check, write_inputs

_KEY = re.compile(
    r"\b((?:actor_rollout_ref|critic|reward_model|algorithm|data|trainer|custom_reward_function|"
    r"global_profiler|ray_init|ray_kwargs)(?:\.[A-Za-z0-9_]+)+)"
)
_ROLE_PREFIX = re.compile(r"^(actor_rollout_ref\.(actor|ref|rollout|model)|critic(\.model)?|reward_model)\.")


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"


def blocker(message: str) -> str:
    """The blocker an error message names: its first config key (role prefix collapsed), else its start."""
    match = _KEY.search(message)
    if match is None:
        return message[:60]
    key = match.group(1)
    return _ROLE_PREFIX.sub(lambda m: "*." if m.group(1).startswith("actor_rollout_ref") else m.group(0), key)


def check_all(data_dir: Path, extra: tuple[str, ...] = ()) -> list[tuple[str, str | None]]:
    """(script name, None when it starts or the first line of its error) for every stored script, with ``extra``
    overrides after the script's own."""
    inputs = write_inputs(data_dir)
    results = []
    for script in load_scripts():
        try:
            start_up_check(script, inputs, extra)
            results.append((script.name, None))
        except Exception as err:  # the report lists whatever stops a script, a bug included
            results.append((script.name, first_line(err)))
    return results


def format_report(results: list[tuple[str, str | None]]) -> list[str]:
    lines = [f"{name}: {'OK' if error is None else error}" for name, error in results]
    num_ok = sum(error is None for _, error in results)
    lines.append("")
    lines.append(f"{num_ok} of {len(results)} scripts pass start-up validation")
    counts = collections.Counter(blocker(error) for _, error in results if error is not None)
    for name, count in counts.most_common():
        lines.append(f"{count:3d}  {name}")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="also write the report to this file")
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="validate with trainer.device set to this (cuda: the checks a GPU machine runs; nothing starts on it)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    extra = () if args.device is None else (f"trainer.device={args.device}",)
    with tempfile.TemporaryDirectory(prefix="verl_scripts_data_") as tmp:
        lines = format_report(check_all(Path(tmp), extra))
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
