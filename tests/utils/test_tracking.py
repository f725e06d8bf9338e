"""metrics.jsonl: rows after a resumed step are dropped atomically, half-written last lines are survived."""

import json
import logging

import pytest

import verl.utils.tracking as tracking
from verl.utils.tracking import Tracking, read_metrics, truncate_jsonl_after_step


def _write_rows(path, steps, tail=""):
    path.write_text("".join(json.dumps({"step": s, "loss": s / 10}) + "\n" for s in steps) + tail)


def test_resume_drops_replayed_steps_and_keeps_logging(tmp_path):
    tracker = Tracking(["jsonl"], tmp_path, "project", "experiment")
    for step in range(6):
        tracker.log({"loss": step / 10}, step=step)
    # resumed from global_step_3: steps 4 and 5 run again, so their first rows go
    assert tracker.truncate_after(3) == 2
    assert [row["step"] for row in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1, 2, 3]
    # rows logged after the rewrite land in the new file, not in the replaced one
    tracker.log({"loss": 0.45}, step=4)
    tracker.close()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [row["step"] for row in rows] == [0, 1, 2, 3, 4]
    assert rows[-1]["loss"] == 0.45


def test_kept_lines_are_copied_unchanged(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = ['{"step": 1, "x": "nan"}\n', '{"step":2,"x":1e-07}\n', '{"step": 3}\n']
    path.write_text("".join(lines))
    path.chmod(0o644)
    assert truncate_jsonl_after_step(path, 2) == 1
    assert path.read_text() == "".join(lines[:2])
    assert path.stat().st_mode & 0o777 == 0o644


def test_half_written_last_line_is_dropped_with_a_warning(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    _write_rows(path, [1, 2], tail='{"step": 3, "lo')
    with caplog.at_level(logging.WARNING, logger="verl.trainer"):
        assert [row["step"] for row in read_metrics(path)] == [1, 2]
        # the half-written row is not a complete row, so it is not counted as dropped
        assert truncate_jsonl_after_step(path, 10) == 0
    assert "half-written" in caplog.text and str(path) in caplog.text
    assert path.read_text() == '{"step": 1, "loss": 0.1}\n{"step": 2, "loss": 0.2}\n'


def test_last_line_missing_only_its_newline_is_kept(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _write_rows(path, [1], tail='{"step": 2}')
    assert truncate_jsonl_after_step(path, 5) == 0
    assert path.read_text() == '{"step": 1, "loss": 0.1}\n{"step": 2}\n'


def test_damaged_line_in_the_middle_is_an_error_naming_it(tmp_path):
    path = tmp_path / "metrics.jsonl"
    # blank lines are skipped but still counted: the damaged line is the file's 3rd
    path.write_text('{"step": 1}\n\n{"step": 2, "lo\n{"step": 3}\n')
    with pytest.raises(ValueError, match="line 3"):
        truncate_jsonl_after_step(path, 1)
    path.write_text('{"step": 1}\n["not", "a", "row"]\n{"step": 3}\n')
    with pytest.raises(ValueError, match="line 2 is not a metrics row"):
        read_metrics(path)


def test_failed_rewrite_leaves_the_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    _write_rows(path, [1, 2, 3])
    before = path.read_bytes()

    def crash(*args):
        raise OSError("disk full")

    monkeypatch.setattr(tracking.os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        truncate_jsonl_after_step(path, 1)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


def test_missing_file_and_bad_step(tmp_path):
    assert truncate_jsonl_after_step(tmp_path / "metrics.jsonl", 3) == 0
    assert not (tmp_path / "metrics.jsonl").exists()
    with pytest.raises(ValueError, match="integer step"):
        truncate_jsonl_after_step(tmp_path / "metrics.jsonl", "3")
    assert Tracking(["console"], tmp_path, "project", "experiment").truncate_after(3) == 0


def test_tracking_cuts_a_half_written_tail_before_appending(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    _write_rows(path, [1, 2], tail='{"step": 3, "lo')
    with caplog.at_level(logging.WARNING, logger="verl.trainer"):
        tracker = Tracking(["jsonl"], tmp_path, "project", "experiment")
    assert "half-written" in caplog.text
    tracker.log({"loss": 0.3}, step=3)
    tracker.close()
    # without the cut, the new row would be glued to the partial one and damage a line in the middle
    assert [row["step"] for row in read_metrics(path)] == [1, 2, 3]


def test_a_fresh_start_moves_an_earlier_runs_rows_aside(tmp_path):
    from verl.utils.tracking import Tracking

    earlier = tmp_path / "metrics.jsonl"
    earlier.write_text('{"step": 1, "x": 1.0}\n{"step": 2, "x": 2.0}\n')
    tracker = Tracking(["jsonl"], tmp_path, "p", "e")
    moved = tracker.set_aside_earlier_rows()
    # nothing is deleted: the earlier rows live on under a dated name, and the new run starts an empty file
    assert moved is not None and moved.read_text().count("\n") == 2 and not earlier.exists()
    assert tracker.set_aside_earlier_rows() is None  # nothing left to move
    tracker.close()


def test_validation_samples_go_to_their_own_file_and_follow_resume_and_fresh_start(tmp_path, caplog):
    tracker = Tracking(["console", "jsonl"], tmp_path, "p", "e")
    samples = [{"input": "1+1=", "output": "2", "score": 1.0}, {"input": "2+2=", "output": "5", "score": 0.0}]
    with caplog.at_level(logging.INFO, logger="verl.trainer"):
        tracker.log_generations(samples, step=2)
        tracker.log_generations(samples[:1], step=4)
    path = tmp_path / "val_generations.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == [{"step": 2, **samples[0]}, {"step": 2, **samples[1]}, {"step": 4, **samples[0]}]
    assert "[output] 5" in caplog.text  # the console shows each sample
    tracker.log({"x": 1.0}, step=4)
    tracker.truncate_after(2)  # a resume from step 2 drops the samples of later validations too
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [2, 2]
    tracker.set_aside_earlier_rows()  # a fresh start moves both files aside
    assert not path.exists() and len(list(tmp_path.glob("val_generations.*.jsonl"))) == 1
    tracker.close()


def test_fresh_starts_keep_only_the_newest_set_aside_copies(tmp_path, monkeypatch):
    import verl.utils.tracking as tracking

    # seven fresh starts, the last two in the same second: each moves the run before it aside
    stamps = iter(
        [
            "20250101-000001",
            "20250101-000002",
            "20250101-000003",
            "20250101-000004",
            "20250101-000005",
            "20250101-000006",
            "20250101-000006",
        ]
    )
    monkeypatch.setattr(tracking, "_set_aside_stamp", lambda: next(stamps))  # not time.strftime: logging uses it
    unrelated = tmp_path / "metrics.backup.jsonl"  # not a dated copy: never removed
    unrelated.write_text('{"step": 1}\n')
    for run in range(7):
        (tmp_path / "metrics.jsonl").write_text(f'{{"step": 1, "run": {run}}}\n')
        Tracking(["jsonl"], tmp_path, "p", "e").set_aside_earlier_rows()
    kept = sorted(p.name for p in tmp_path.glob("metrics.2*.jsonl"))
    # KEEP_SET_ASIDE = 5 newest: runs 2..6; the second copy of one second got "-1" instead of replacing the first
    assert tracking.KEEP_SET_ASIDE == 5
    assert kept == [
        "metrics.20250101-000003.jsonl",
        "metrics.20250101-000004.jsonl",
        "metrics.20250101-000005.jsonl",
        "metrics.20250101-000006-1.jsonl",
        "metrics.20250101-000006.jsonl",
    ]
    assert '"run": 6' in (tmp_path / "metrics.20250101-000006-1.jsonl").read_text() and unrelated.exists()


@pytest.mark.parametrize(
    ("value", "sinks"),
    [
        (["console", "jsonl"], ["console", "jsonl"]),
        ("console", ["console"]),
        # a list spelt as a string (verl's scripts quote it inside a double-quoted bash string): the same list
        ("[console,jsonl]", ["console", "jsonl"]),
        ("['console', \"jsonl\"]", ["console", "jsonl"]),
        (" [ console ] ", ["console"]),
        ("[]", []),
    ],
)
def test_sink_names_read_a_list_a_name_or_a_list_spelt_as_a_string(value, sinks):
    assert tracking.sink_names(value) == sinks


def test_tracking_takes_a_list_spelt_as_a_string_as_the_list(tmp_path):
    tracker = Tracking("[console,jsonl]", tmp_path, "p", "e")
    tracker.log({"loss": 0.5}, step=1)
    tracker.close()
    assert tracker.loggers == ["console", "jsonl"]
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 1, "loss": 0.5}]
