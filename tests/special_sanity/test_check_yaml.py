"""check_yaml: valid files pass, a parse error is reported as file:line:column."""

from tests.special_sanity.check_yaml import check_file, main


def test_valid_yaml_including_multi_document(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("a: 1\nb: [1, 2]\n---\nc: {d: e}\n")
    assert check_file(path) == []


def test_parse_error_names_file_and_line(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    # Line 3 opens a flow sequence that never closes; the scanner fails at the end of the stream (line 4).
    path.write_text("a: 1\nb: 2\nc: [1, 2\n")
    (problem,) = check_file(path)
    assert problem.startswith(f"{path}:4:")
    assert main([str(path)]) == 1
    assert capsys.readouterr().out.startswith(f"{path}:4:")


def test_mapping_under_a_scalar_is_an_error(tmp_path):
    path = tmp_path / "indent.yaml"
    # "b" is indented under a scalar value: a mapping is not allowed there (line 2).
    path.write_text("a: 1\n   b: 2\n")
    (problem,) = check_file(path)
    assert problem.startswith(f"{path}:2:")
