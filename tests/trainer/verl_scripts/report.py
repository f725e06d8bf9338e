"""Which of verl's example scripts start here: ``python -m tests.trainer.verl_scripts.report [--set january|current]
[--all-blockers] [--out FILE] [--device cuda]``.

Prints one line per script (``OK``, or the first line of the start-up error) and a summary: how many start, and
how many stop at each blocker (the key the error names, with the role prefix collapsed, e.g.
``*.megatron.param_offload``; or the error's type). The same lines go to ``--out`` when given.

``--all-blockers`` lists every override that blocks a script, not only the first: the override the refusal names is
removed and the script checked again, until it starts, a refusal names an out-of-scope feature (the script is out of
scope, not blocked; without ``--device``, a CUDA-only path counts as that too) or a refusal names none of its
overrides (a rule across keys, a missing config file, a bug); then, per blocker, how many scripts it blocks, one
refusal's text and which scripts.
"""

from __future__ import annotations

import argparse
import collections
import logging
import re
import sys
import tempfile
from pathlib import Path

from tests.trainer.verl_scripts.harness import (
    CURRENT_OUT_OF_SCOPE,
    NEEDS_CUDA,
    SCRIPT_SETS,
    SCRIPTS_JSON,
    Script,
    load_broken_in_verl,
    load_scripts,
    start_up_check,
    write_inputs,
)

_KEY = re.compile(
    r"\b((?:actor_rollout_ref|critic|reward_model|algorithm|data|trainer|custom_reward_function|"
    r"global_profiler|ray_init|ray_kwargs)(?:\.[A-Za-z0-9_]+)+)"
)
# A quoted name in a refusal (Hydra's "Could not override 'model_engine'", a group override's 'actor').
_QUOTED = re.compile(r"'([A-Za-z0-9_.@]+)'")
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


def check_all(data_dir: Path, extra: tuple[str, ...] = (), path: Path = SCRIPTS_JSON) -> list[tuple[str, str | None]]:
    """(script name, None when it starts or the first line of its error) for every script stored in ``path``, with
    ``extra`` overrides after the script's own."""
    inputs = write_inputs(data_dir)
    results = []
    for script in load_scripts(path):
        try:
            start_up_check(script, inputs, extra)
            results.append((script.name, None))
        except Exception as err:  # the report lists whatever stops a script, a bug included
            results.append((script.name, first_line(err)))
    return results


def _override_key(override: str) -> str:
    """The key an override sets: ``+a.b=1`` -> ``a.b``; a group override ``actor@actor_rollout_ref.actor=x`` -> its
    package ``actor_rollout_ref.actor``."""
    key = override.partition("=")[0].lstrip("+~")
    return key.partition("@")[2] or key


def blocking_override(overrides: tuple[str, ...], message: str) -> str | None:
    """The override a refusal names: one quoted whole, else the one whose key the message names (the longest such
    key), else one under or above a named key; None when the refusal names none of them."""
    for override in overrides:
        if override in message:
            return override
    named = set(_QUOTED.findall(message)) | {m.group(1) for m in _KEY.finditer(message)}
    named |= {n.rstrip(".") for n in message.replace("=", " ").split() if n.rstrip(".,:;") in named}
    keys = {override: _override_key(override) for override in overrides}
    exact = [o for o, k in keys.items() if k in named]
    if exact:
        return max(exact, key=lambda o: len(keys[o]))
    related = [o for o, k in keys.items() if any(k.startswith(n + ".") or n.startswith(k + ".") for n in named)]
    return related[0] if related else None


def all_blockers(
    script: Script, inputs: dict[str, str], out_of_scope: tuple[str, ...] = (), max_tries: int = 40
) -> tuple[list[tuple[str, str]], str | None]:
    """Every override that blocks ``script`` with its refusal, in the order the refusals name them, and what stops it
    at the end (None when the script starts once they are removed). A refusal matching one of the ``out_of_scope``
    patterns ends the search: the script is out of scope (``out of scope: <refusal>``), not blocked."""
    overrides, removed = tuple(script.overrides), []
    for _ in range(max_tries):
        try:
            start_up_check(
                Script(script.name, script.config_path, script.config_name, overrides, script.entry_point), inputs
            )
            return removed, None
        except Exception as err:  # a bug stops the search too: it is listed as the last refusal
            message = first_line(err) if not isinstance(err, ValueError) else str(err)
        if any(re.search(pattern, message) for pattern in out_of_scope):
            return removed, "out of scope: " + message.strip().splitlines()[0]
        override = blocking_override(overrides, message)
        if override is None:
            return removed, message.strip().splitlines()[0]
        removed.append((override, message.strip().splitlines()[0]))
        overrides = tuple(o for o in overrides if o != override)
    return removed, "too many blockers"


def format_all_blockers(
    results: list[tuple[str, list[tuple[str, str]], str | None]], broken: dict[str, str] | None = None
) -> list[str]:
    """One line per script (the blocking overrides, then what still stops it), a summary (with the share of the
    scripts in scope that start, as the start-up test counts it: the first refusal names no out-of-scope feature
    and the script is not one of ``broken``, those verl cannot start either), and per blocker (role prefix
    collapsed) the count, one refusal's text and the scripts."""
    lines, per_key, sample, broken = [], collections.defaultdict(list), {}, broken or {}
    for name, removed, last in results:
        keys = [_override_key(o) for o, _ in removed]
        tail = "starts without them" if last is None else f"then: {last[:200]}"
        if name in broken:
            tail += f" [{broken[name][:120]}]"
        lines.append(f"{name}: {len(keys)} blocking: {', '.join(keys) or '-'}; {tail}")
        for key, (_, message) in zip(keys, removed, strict=True):
            per_key[blocker(key)].append(name)
            sample.setdefault(blocker(key), message)
        if last is not None:
            kind = "(out of scope)" if last.startswith("out of scope: ") else "(not an override)"
            per_key[f"{kind} {blocker(last.removeprefix('out of scope: '))}"].append(name)
    num_ok = sum(not removed and last is None for _, removed, last in results)
    freed = sum(bool(removed) and last is None for _, removed, last in results)
    out = sum(last is not None and last.startswith("out of scope: ") for _, _, last in results)
    lines += [
        "",
        f"{num_ok} of {len(results)} scripts start; {freed} more start once their blocking overrides go; {out} end "
        "at an out-of-scope feature's refusal",
    ]
    in_scope = [
        (removed, last)
        for name, removed, last in results
        if name not in broken and not (not removed and last is not None and last.startswith("out of scope: "))
    ]
    starting = sum(not removed and last is None for removed, last in in_scope)
    lines += [
        f"in scope (first refusal names no out-of-scope feature; {len(broken)} that verl cannot start either left "
        f"out): {starting} of {len(in_scope)} start ({100 * starting / max(len(in_scope), 1):.0f} %)",
        "",
    ]
    # the first blocker of each script that does not start (what stops it today), then every blocker
    first = collections.Counter(
        blocker(_override_key(removed[0][0]))
        if removed
        else f"(out of scope) {blocker(last.removeprefix('out of scope: '))}"
        if last.startswith("out of scope: ")
        else f"(not an override) {blocker(last)}"
        for _, removed, last in results
        if removed or last is not None
    )
    lines += ["first blocker of each script that does not start:"]
    lines += [f"{count:3d}  {key}" for key, count in first.most_common()] + ["", "every blocker:"]
    for key, names in sorted(per_key.items(), key=lambda item: (-len(set(item[1])), item[0])):
        lines.append(f"{len(set(names)):3d}  {key}" + (f"  e.g. {sample[key][:160]}" if key in sample else ""))
        lines += [f"       {name}" for name in dict.fromkeys(names)]
    return lines


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
    parser.add_argument("--set", choices=sorted(SCRIPT_SETS), default="january", help="which stored scripts")
    parser.add_argument("--all-blockers", action="store_true", help="every blocking override, not only the first")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    extra = () if args.device is None else (f"trainer.device={args.device}",)
    with tempfile.TemporaryDirectory(prefix="verl_scripts_data_") as tmp:
        if args.all_blockers:
            inputs = write_inputs(Path(tmp))
            scripts = load_scripts(SCRIPT_SETS[args.set])
            with_extra = [
                Script(s.name, s.config_path, s.config_name, s.overrides + extra, s.entry_point) for s in scripts
            ]
            patterns = (*CURRENT_OUT_OF_SCOPE.values(), *((NEEDS_CUDA,) if args.device is None else ()))
            broken = load_broken_in_verl(SCRIPT_SETS[args.set]) if args.set == "current" else {}
            lines = format_all_blockers([(s.name, *all_blockers(s, inputs, patterns)) for s in with_extra], broken)
        else:
            lines = format_report(check_all(Path(tmp), extra, SCRIPT_SETS[args.set]))
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
