"""check_whitespace: end-of-file and trailing-whitespace problems, reported as file:line."""

from tests.special_sanity.check_whitespace import check_file, main


def write(tmp_path, name, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_clean_files_pass(tmp_path):
    assert check_file(write(tmp_path, "ok.py", b"a = 1\nb = 2\n")) == []
    assert check_file(write(tmp_path, "empty.txt", b"")) == []
    # CRLF endings are not trailing whitespace.
    assert check_file(write(tmp_path, "crlf.txt", b"a\r\nb\r\n")) == []


def test_missing_final_newline_names_the_last_line(tmp_path):
    path = write(tmp_path, "a.py", b"x = 1\ny = 2")
    assert check_file(path, "eof") == [f"{path}:2: no newline at end of file"]


def test_blank_lines_at_the_end_name_the_first_blank_line(tmp_path):
    # Content on lines 1-2, blank lines 3 and 4.
    path = write(tmp_path, "a.md", b"one\ntwo\n\n\n")
    assert check_file(path, "eof") == [f"{path}:3: blank line(s) at end of file"]
    assert check_file(write(tmp_path, "b.md", b"\n\n"), "eof") == [
        f"{tmp_path / 'b.md'}:1: file holds only blank lines"
    ]


def test_trailing_whitespace_lists_each_line(tmp_path):
    path = write(tmp_path, "a.yaml", b"a: 1 \nb: 2\nc: 3\t\n")
    assert check_file(path, "trailing") == [f"{path}:1: trailing whitespace", f"{path}:3: trailing whitespace"]
    # The eof check alone does not look at trailing spaces.
    assert check_file(path, "eof") == []


def test_binary_files_are_skipped(tmp_path):
    assert check_file(write(tmp_path, "w.bin", b"\x00\x01 \n\x00")) == []
    assert check_file(write(tmp_path, "latin1.txt", b"caf\xe9 ")) == []


def test_main_prints_and_exits_1(tmp_path, capsys):
    good = write(tmp_path, "good.txt", b"fine\n")
    bad = write(tmp_path, "bad.txt", b"trailing \nno newline")
    assert main([str(good)]) == 0
    assert main(["--check", "all", str(good), str(bad)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{bad}:2: no newline at end of file", f"{bad}:1: trailing whitespace"]
