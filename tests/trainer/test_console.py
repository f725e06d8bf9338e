"""The driver's console: a pipe whose reader went away, and the progress bar on a terminal and elsewhere."""

import io
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from verl.trainer.console import StepProgress

REPO = Path(__file__).resolve().parents[2]


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def screen(text: str) -> list[str]:
    """What a terminal shows after ``text``: a carriage return goes back to the line's start, a newline down."""
    rows, row, col = [[]], 0, 0
    for char in text:
        if char == "\r":
            col = 0
        elif char == "\n":
            row, col = row + 1, 0
            rows.append([]) if row == len(rows) else None
        else:
            line = rows[row]
            line.extend(" " * (col + 1 - len(line)))
            line[col] = char
            col += 1
    return ["".join(line).rstrip() for line in rows]


def test_output_into_a_pipe_whose_reader_is_gone_is_dropped_and_the_exit_code_stays(tmp_path):
    # `... 2>&1 | tee log` and Ctrl-C: tee dies first, the run goes on printing while it saves. Without the guard
    # the first print raises BrokenPipeError (and a failed flush at exit turns any exit code into 120).
    child = textwrap.dedent(
        """
        import logging, sys
        from verl.trainer.console import setup_logging
        setup_logging()
        sys.stdin.read()  # until the parent closed both readers
        for i in range(100):
            print("worker line", i)
            logging.getLogger("verl.trainer").warning("log record %d", i)
        sys.exit(5)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", child],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    proc.stdout.close()
    proc.stderr.close()
    proc.stdin.close()
    assert proc.wait(timeout=120) == 5


def on_a_terminal(monkeypatch):
    """stdout and stderr on one fake terminal, and a logger writing to it as the driver's handler does (set in the
    test itself: pytest puts its own capture back on sys.stdout and sys.stderr after a fixture's setup)."""
    term = FakeTerminal()
    monkeypatch.setattr(sys, "stdout", term)
    monkeypatch.setattr(sys, "stderr", term)
    log = logging.getLogger("tests.trainer.console")
    handler = logging.StreamHandler(term)
    monkeypatch.setattr(log, "handlers", [handler])
    monkeypatch.setattr(log, "propagate", False)
    monkeypatch.setattr(log, "level", logging.INFO)
    return term, log, handler


def test_on_a_terminal_the_bar_keeps_its_own_line_and_each_step_shows_its_own_postfix(monkeypatch):
    term, log, handler = on_a_terminal(monkeypatch)
    with StepProgress(total=3, initial=0, enabled=True) as progress:
        assert progress.shown
        log.info("step 1: reward 0.5")
        print("(Worker pid=1) a line Ray relays", file=sys.stderr)
        progress.step(reward="0.500", failed=1)
        sys.stdout.write("a line written ")
        sys.stdout.write("in two parts\n")
        progress.step(reward="0.750", failed=2)
    assert sys.stdout is term and sys.stderr is term and handler.stream is term  # all put back
    rows = screen(term.getvalue())
    # every line on a row of its own, above the bar; the bar's last state on the last row, then a newline
    assert rows[:3] == ["step 1: reward 0.5", "(Worker pid=1) a line Ray relays", "a line written in two parts"]
    assert rows[3].startswith("training:") and "2/3" in rows[3] and "reward=0.750, failed=2" in rows[3]
    assert rows[4:] == [""]
    # no state of the bar ever showed a step with the postfix of the step before it
    drawn = [part for line in term.getvalue().split("\n") for part in line.split("\r") if "training:" in part]
    assert [d for d in drawn if "1/3" in d] and all("reward=0.500" in d for d in drawn if "1/3" in d)
    assert [d for d in drawn if "2/3" in d] and all("reward=0.750" in d for d in drawn if "2/3" in d)


def test_a_stop_inside_the_bar_puts_the_streams_back(monkeypatch):
    term, _, handler = on_a_terminal(monkeypatch)
    with pytest.raises(KeyboardInterrupt), StepProgress(total=3, initial=1, enabled=True):
        sys.stderr.write("a line without its newline")
        raise KeyboardInterrupt
    assert sys.stderr is term and handler.stream is term
    assert "a line without its newline" in screen(term.getvalue())  # written when the bar closed


@pytest.mark.parametrize("stream, enabled", [(io.StringIO(), True), (FakeTerminal(), False)], ids=["pipe", "off"])
def test_in_a_pipe_or_switched_off_no_bar_is_drawn(monkeypatch, stream, enabled):
    # in a pipe or a file, each step's log line is the progress (trainer.progress_bar: on a terminal only)
    monkeypatch.setattr(sys, "stderr", stream)
    with StepProgress(total=3, initial=0, enabled=enabled) as progress:
        progress.step(reward="0.500", failed=0)
        assert sys.stderr is stream
    assert not progress.shown and stream.getvalue() == ""
