"""Check that a PR or commit title follows ``[BREAKING][module1, module2] type: description``.

``[BREAKING]`` is optional and marks a change users must adapt to; the module list names what the change touches
(one or more of :data:`ALLOWED_MODULES`, separated by ``,`` and at most one space); the type is one of
:data:`ALLOWED_TYPES`; the description is free text. Example: ``[megatron, doc] feat: fp16 update-failure policy``.

Usage: ``python tests/special_sanity/check_pr_title.py "TITLE"``, ``... --from-git`` (the last commit's subject),
or with the title in the ``PR_TITLE`` environment variable. Exits 1 and says what is allowed when the title is bad.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

ALLOWED_MODULES = (
    "fsdp",
    "megatron",
    "veomni",
    "sglang",
    "vllm",
    "rollout",
    "trainer",
    "ci",
    "training_utils",
    "recipe",
    "hardware",
    "deployment",
    "ray",
    "worker",
    "single_controller",
    "misc",
    "perf",
    "model",
    "algo",
    "env",
    "tool",
    "ckpt",
    "doc",
    "data",
    "cfg",
    "reward",
)
ALLOWED_TYPES = ("feat", "fix", "refactor", "chore", "test")
BREAKING = "[BREAKING]"
EXPECTED_FORM = "[BREAKING][module1, module2] type: description  (e.g. '[megatron, doc] feat: fp16 update policy')"


def _check_modules(text: str) -> list[str]:
    if not text.strip():
        return ["the module list [...] is empty; name at least one module"]
    errors = []
    seen = set()
    for index, item in enumerate(text.split(",")):
        # One space after a comma is the house style ("a, b"); anything else is a typo worth flagging.
        name = item[1:] if index > 0 and item.startswith(" ") else item
        if name != name.strip() or not name:
            errors.append(f"module {item!r} has stray spaces or is empty; write '[mod1, mod2]'")
        elif name not in ALLOWED_MODULES:
            errors.append(f"unknown module {name!r}")
        elif name in seen:
            errors.append(f"module {name!r} is listed twice")
        seen.add(name)
    return errors


def _check_type_and_description(text: str) -> list[str]:
    if not text.startswith(" ") or text.startswith("  "):
        return ["put exactly one space between ']' and the type"]
    type_part, colon, description = text[1:].partition(":")
    if not colon:
        return [f"missing 'type:' after the module list; types: {', '.join(ALLOWED_TYPES)}"]
    errors = []
    if type_part != type_part.strip():
        errors.append(f"type {type_part!r} has stray spaces; write 'type: description'")
    elif type_part not in ALLOWED_TYPES:
        errors.append(f"unknown type {type_part!r}")
    if not description.strip():
        errors.append("the description after 'type:' is empty")
    elif not description.startswith(" ") or description.startswith("  "):
        errors.append("put exactly one space between 'type:' and the description")
    return errors


def check_title(title: str) -> list[str]:
    """The problems of ``title``; an empty list means it is well formed.

    Args:
        title: a PR title or commit subject line.

    Returns:
        One human-readable message per problem found (several can be reported at once).
    """
    if not title.strip():
        return ["the title is empty"]
    if title != title.strip():
        return ["the title starts or ends with whitespace"]
    rest = title.removeprefix(BREAKING)
    if rest != title and rest.startswith(" "):
        return ["write '[BREAKING][modules]' with no space between the brackets"]
    if not rest.startswith("["):
        return ["the title must start with the module list in brackets, e.g. '[trainer] fix: ...'"]
    close = rest.find("]")
    if close < 0:
        return ["the module list has no closing ']'"]
    return _check_modules(rest[1:close]) + _check_type_and_description(rest[close + 1 :])


def explain(title: str, errors: list[str]) -> str:
    """The message printed for a bad title: what was wrong, the expected form, and the allowed values."""
    lines = [f"Bad title: {title!r}"]
    lines += [f"  - {error}" for error in errors]
    lines.append(f"Expected: {EXPECTED_FORM}")
    lines.append(f"Modules: {', '.join(ALLOWED_MODULES)}")
    lines.append(f"Types: {', '.join(ALLOWED_TYPES)}")
    return "\n".join(lines)


def _title_from_git() -> str:
    result = subprocess.run(["git", "log", "-1", "--format=%s"], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"git log failed: {result.stderr.strip()}")
    return result.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check a PR/commit title: " + EXPECTED_FORM)
    parser.add_argument("title", nargs="*", help="the title (words are joined with spaces); default: $PR_TITLE")
    parser.add_argument("--from-git", action="store_true", help="check the subject of the last commit")
    args = parser.parse_args(argv)
    if args.from_git:
        title = _title_from_git()
    elif args.title:
        title = " ".join(args.title)
    elif "PR_TITLE" in os.environ:
        title = os.environ["PR_TITLE"]
    else:
        parser.error("give a title, --from-git, or set PR_TITLE")
    errors = check_title(title)
    if errors:
        print(explain(title, errors), file=sys.stderr)
        return 1
    print(f"OK: {title}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
