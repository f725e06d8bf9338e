"""check_pr_title: accepted and rejected titles, and the CLI's exit codes and messages."""

import subprocess

import pytest

from tests.special_sanity.check_pr_title import ALLOWED_MODULES, ALLOWED_TYPES, check_title, main


@pytest.mark.parametrize(
    "title",
    [
        "[trainer] fix: resume from the latest checkpoint",
        "[megatron, doc] feat: fp16 update-failure policy",
        "[megatron,doc] feat: commas without a space are fine too",
        "[BREAKING][cfg, trainer] refactor: rename the resume key",
        "[ci] chore: cache the venv",
        "[algo] test: hand-derived GRPO advantages",
        "[training_utils, single_controller] fix: underscores in module names",
    ],
)
def test_accepted_titles(title):
    assert check_title(title) == []


@pytest.mark.parametrize(
    "title, expected_error",
    [
        ("[trainr] fix: typo in the module", "unknown module 'trainr'"),
        ("[trainer, nope] fix: one bad module of two", "unknown module 'nope'"),
        ("[trainer] feature: long type name", "unknown type 'feature'"),
        ("[trainer] Fix: types are lower case", "unknown type 'Fix'"),
        ("trainer fix: no brackets", "must start with the module list"),
        ("fix: no modules at all", "must start with the module list"),
        ("[trainer fix: unclosed", "no closing ']'"),
        ("[] fix: empty list", "module list [...] is empty"),
        ("[trainer] fix:", "description after 'type:' is empty"),
        ("[trainer] fix:   ", "the title starts or ends with whitespace"),
        ("[trainer] fix: ", "the title starts or ends with whitespace"),
        ("[trainer] fix no colon", "missing 'type:'"),
        ("[trainer]fix: no space after the bracket", "exactly one space between ']' and the type"),
        ("[trainer]  fix: two spaces after the bracket", "exactly one space between ']' and the type"),
        ("[trainer] fix:no space after the colon", "exactly one space between 'type:' and the description"),
        ("[trainer] fix :space before the colon", "type 'fix ' has stray spaces"),
        ("[ trainer] fix: space inside the bracket", "stray spaces"),
        ("[trainer , ci] fix: space before the comma", "stray spaces"),
        ("[trainer,  ci] fix: two spaces after the comma", "stray spaces"),
        ("[trainer, trainer] fix: duplicate", "listed twice"),
        ("[BREAKING] [trainer] fix: space after BREAKING", "no space between the brackets"),
        ("[BREAKING] fix: BREAKING without modules", "no space between the brackets"),
        (" [trainer] fix: leading space", "starts or ends with whitespace"),
        ("", "the title is empty"),
    ],
)
def test_rejected_titles(title, expected_error):
    errors = check_title(title)
    assert errors, title
    assert any(expected_error in error for error in errors), errors


def test_several_problems_are_reported_together():
    # Unknown module, unknown type and an empty description are independent: all three are listed.
    errors = check_title("[nope] wip:")
    assert len(errors) == 3
    assert "unknown module 'nope'" in errors[0]
    assert "unknown type 'wip'" in errors[1]
    assert "empty" in errors[2]


def test_cli_exit_codes_and_message(capsys, monkeypatch):
    monkeypatch.delenv("PR_TITLE", raising=False)
    assert main(["[doc] fix: typo"]) == 0
    assert "OK" in capsys.readouterr().out
    assert main(["[docs]", "fix:", "typo"]) == 1
    err = capsys.readouterr().err
    assert "unknown module 'docs'" in err
    # The message lists what is allowed, so the author can fix the title without reading the source.
    assert all(name in err for name in ALLOWED_MODULES) and all(kind in err for kind in ALLOWED_TYPES)


def test_cli_reads_pr_title_from_the_environment(monkeypatch, capsys):
    monkeypatch.setenv("PR_TITLE", "[ray] feat: cluster address")
    assert main([]) == 0
    monkeypatch.setenv("PR_TITLE", "[ray] feat:")
    assert main([]) == 1
    assert "empty" in capsys.readouterr().err


def test_cli_without_a_title_is_a_usage_error(monkeypatch):
    monkeypatch.delenv("PR_TITLE", raising=False)
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2


def test_cli_from_git_checks_the_last_commit_subject(tmp_path, monkeypatch, capsys):
    # A throwaway repository in tmp_path: the project's own git state is never touched.
    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True)

    git("init", "-q")
    git("commit", "-q", "--allow-empty", "-m", "[ckpt] fix: atomic rename")
    monkeypatch.chdir(tmp_path)
    assert main(["--from-git"]) == 0
    git("commit", "-q", "--allow-empty", "-m", "fixed stuff")
    assert main(["--from-git"]) == 1
    assert "Bad title: 'fixed stuff'" in capsys.readouterr().err
