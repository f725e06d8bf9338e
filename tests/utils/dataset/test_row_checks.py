"""Every bad row of a data file is named by file, row and column (issue 51, item 10): verl.utils.dataset.row_checks and
the RLHFDataset that reads with it."""

import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verl.utils.dataset import RLHFDataset
from verl.utils.dataset.row_checks import MAX_LISTED_PROBLEMS, RowProblem, describe_problems, read_records


def _chat(text):
    return [{"role": "user", "content": text}]


def _verl_row(prompt, ground_truth):
    return {
        "data_source": "tiny_task",
        "prompt": prompt,
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
    }


def _render(chat):
    return "\n".join(message["content"] for message in chat)


def test_a_null_ground_truth_is_a_problem_not_the_answer_none(tmp_path):
    # verl's layout (nested ground truth, null -> None) and the flat one (a null string column -> NaN in pandas)
    nested = tmp_path / "nested.parquet"
    pd.DataFrame([_verl_row(_chat("12="), "21"), _verl_row(_chat("34="), None)]).to_parquet(nested)
    flat = tmp_path / "flat.parquet"
    pd.DataFrame({"prompt": ["12=", "34=", "56="], "ground_truth": ["21", None, "65"]}).to_parquet(flat)
    with pytest.raises(ValueError) as err:
        RLHFDataset([nested, flat], render_chat=_render)
    message = str(err.value)
    assert message.startswith("2 bad data row(s):"), message
    assert f"{nested} row 1, column 'reward_model.ground_truth': the ground truth is null" in message
    assert f"{flat} row 1, column 'ground_truth': the ground truth is null" in message
    skipped = RLHFDataset([nested, flat], render_chat=_render, on_bad_row="skip")
    # 1 + 2 rows kept, in order; each still knows its place in its file
    assert [skipped[i]["ground_truth"] for i in range(len(skipped))] == ["21", "21", "65"]
    assert [skipped.origin(i) for i in range(3)] == [(str(nested), 0, None), (str(flat), 0, None), (str(flat), 2, None)]
    assert [(p.file, p.row) for p in skipped.bad_rows] == [(str(nested), 1), (str(flat), 1)]


@pytest.mark.parametrize(
    "prompt, what",
    [
        ("", "the prompt is empty ('')"),
        ("   ", "the prompt is empty ('   ')"),
        (None, "the prompt is null"),
        (_chat(""), "every message of the chat has empty content"),
        ([], "a chat without messages"),
        (5, "must hold strings or chats (lists of {role, content} messages), got int: 5"),
        ([{"text": "no role"}], "got list: [{'text': 'no role'}]"),
    ],
)
def test_empty_null_and_malformed_prompts_are_named_by_row_and_column(tmp_path, prompt, what):
    path = tmp_path / "d.jsonl"
    rows = [{"prompt": "12=", "ground_truth": "21"}, {"prompt": prompt, "ground_truth": "1"}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(ValueError) as err:
        RLHFDataset(path, render_chat=_render)
    # row 1 is the file's second line
    assert f"{path}:2 (row 1), column 'prompt': " in str(err.value) and what in str(err.value), str(err.value)


def _not_utf8(values):
    """A pyarrow string array holding the bytes as they are (pyarrow checks nothing when built from buffers)."""
    raw = pa.array(values, pa.binary())
    return pa.Array.from_buffers(pa.string(), len(raw), raw.buffers())


def test_text_that_is_not_utf8_names_its_row_and_column_and_the_rest_is_read(tmp_path):
    flat = tmp_path / "flat.parquet"
    pq.write_table(
        pa.table({"prompt": _not_utf8([b"12=", b"3\xff4=", b"56="]), "ground_truth": ["21", "43", "65"]}), flat
    )
    # verl's layout: the bad byte inside the chat's message
    contents = _not_utf8([b"78=", b"9\xfe="])
    messages = pa.StructArray.from_arrays([contents, pa.array(["user", "user"])], names=["content", "role"])
    chats = pa.ListArray.from_arrays(pa.array([0, 1, 2], pa.int32()), messages)
    nested = tmp_path / "nested.parquet"
    pq.write_table(pa.table({"prompt": chats, "ground_truth": ["87", "9"]}), nested)
    records, problems = read_records(flat)
    assert [(r.row, r.values["prompt"]) for r in records] == [(0, "12="), (2, "56=")]
    assert [str(p) for p in problems] == [
        f"{flat} row 1, column 'prompt': text that is not valid UTF-8 (invalid start byte at byte 1)"
    ]
    with pytest.raises(ValueError, match=rf"{nested} row 1, column 'prompt': text that is not valid UTF-8"):
        RLHFDataset(nested, render_chat=_render)


def test_jsonl_lines_that_are_not_utf8_or_not_objects_are_named_by_line(tmp_path):
    path = tmp_path / "d.jsonl"
    good = json.dumps({"prompt": "12=", "ground_truth": "21"}).encode()
    path.write_bytes(good + b"\n\n" + b'{"prompt": "\xff", "ground_truth": "1"}\n' + b"[1, 2]\n" + good + b"\n")
    records, problems = read_records(path)
    # the blank line 2 is no row: rows 0..3 are lines 1, 3, 4, 5
    assert [(r.row, r.line) for r in records] == [(0, 1), (3, 5)]
    assert [(p.row, p.line, p.column) for p in problems] == [(1, 3, None), (2, 4, None)]
    assert "not valid UTF-8" in problems[0].what and "a JSON list, not an object" in problems[1].what


def test_a_message_lists_the_first_problems_and_counts_the_rest():
    problems = [RowProblem("f.parquet", row, "prompt", "the prompt is empty ('')") for row in range(25)]
    message = describe_problems(problems, "Fix them.")
    lines = message.splitlines()
    # a head line, MAX_LISTED_PROBLEMS (20) rows, the count of the 5 others, the advice
    assert lines[0] == "25 bad data row(s):" and len(lines) == 1 + MAX_LISTED_PROBLEMS + 2
    assert lines[MAX_LISTED_PROBLEMS] == "  - f.parquet row 19, column 'prompt': the prompt is empty ('')"
    assert lines[-2:] == ["  ... and 5 more", "Fix them."]
