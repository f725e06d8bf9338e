"""verl.utils.fs.copy_to_shm (verl's model.use_shm): one copy per node and source, reused while unchanged, held by
every process using it, removed when no process does (by its last user at a normal exit, by its detached remover
when the users were killed, by the next copy when the remover is gone too); the temporary directory without
/dev/shm; the source when there is no room.

Every test keeps its copies under its own ``tmp_path`` (the ``root`` argument, or a patched ``SHM_DIR``), never in
the machine's /dev/shm. Other processes are plain Python processes that import verl.utils.fs (no torch), so they
start in a fraction of a second.
"""

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verl.models.loading import DEFAULT_MODEL_PATH
from verl.utils import fs

ROOT = Path(__file__).resolve().parents[2]
# holds a copy until its stdin closes (then exits normally: atexit releases it) or it is killed; with a third
# argument it starts no remover (a remover killed with the run)
HOLDER = """
import sys
from verl.utils import fs
if len(sys.argv) > 3:
    fs._start_remover = lambda base, name: None
print(fs.copy_to_shm(sys.argv[1], root=sys.argv[2]), flush=True)
sys.stdin.readline()
"""


@pytest.fixture(autouse=True)
def release_after_each_test():
    yield
    fs.release_shm_copies()


def make_model_dir(directory: Path, weights: bytes = b"w" * 1000) -> Path:
    """A model directory's shape: config, tokenizer, weights, a sub-directory, and dot-entries a copy skips."""
    directory.mkdir(parents=True)
    (directory / "config.json").write_text('{"model_type": "qwen2"}')
    (directory / "tokenizer.json").write_text('{"version": "1.0"}')
    (directory / "model.safetensors").write_bytes(weights)
    (directory / "original").mkdir()
    (directory / "original" / "params.json").write_text("{}")
    (directory / ".git").mkdir()
    (directory / ".git" / "HEAD").write_text("ref: refs/heads/main")
    (directory / ".gitattributes").write_text("*.safetensors filter=lfs")
    return directory


def files_under(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def start_holder(source: Path, root: Path, remover: bool = True) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(source), str(root), *([] if remover else ["without-remover"])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    return proc, proc.stdout.readline().strip()


def copies_dir(root: Path) -> Path:
    return root / f"verl-model-copies-{os.getuid()}"


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)  # no atexit; the kernel drops its locks
    proc.wait(timeout=30)


def eventually(condition, timeout: float = 30.0) -> bool:
    """Whether ``condition()`` becomes true within ``timeout`` seconds (another process acts on its own time)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_the_copy_holds_every_file_but_dot_entries_byte_for_byte(tmp_path):
    source = make_model_dir(tmp_path / "Qwen2.5-3B")
    copy = Path(fs.copy_to_shm(source, root=tmp_path / "shm"))
    assert copy.parent == copies_dir(tmp_path / "shm") and copy.name.startswith("Qwen2.5-3B-")
    # config, tokenizer, weights and the sub-directory; .git/ and .gitattributes stay behind
    expected = files_under(source)
    del expected[".git/HEAD"], expected[".gitattributes"]
    assert sorted(expected) == ["config.json", "model.safetensors", "original/params.json", "tokenizer.json"]
    assert files_under(copy) == expected


def test_the_embedded_model_loads_from_its_copy(tmp_path):
    from verl.models.loading import load_hf_config, load_tokenizer

    copy = fs.copy_to_shm(DEFAULT_MODEL_PATH, root=tmp_path)
    assert load_tokenizer(copy).get_vocab() == load_tokenizer(DEFAULT_MODEL_PATH).get_vocab()
    loaded, original = load_hf_config(copy).to_dict(), load_hf_config(DEFAULT_MODEL_PATH).to_dict()
    assert loaded.pop("_name_or_path") == copy  # where it was read from; everything else is the same
    original.pop("_name_or_path")
    assert loaded == original


def test_a_second_call_returns_the_copy_this_process_holds(tmp_path):
    source = make_model_dir(tmp_path / "model")
    first = fs.copy_to_shm(source, root=tmp_path / "shm")
    weights = Path(first) / "model.safetensors"
    inode = weights.stat().st_ino
    assert fs.copy_to_shm(str(source), root=tmp_path / "shm") == first
    assert weights.stat().st_ino == inode  # not copied again


def test_another_process_reuses_the_copy_and_the_last_user_removes_it(tmp_path):
    source, root = make_model_dir(tmp_path / "model"), tmp_path / "shm"
    holder, held = start_holder(source, root)
    try:
        inode = (Path(held) / "model.safetensors").stat().st_ino
        # this process joins the copy the other one made: same directory, the same file (no second copy)
        assert fs.copy_to_shm(source, root=root) == held
        assert (Path(held) / "model.safetensors").stat().st_ino == inode
        fs.release_shm_copies()
        assert Path(held).is_dir()  # the other process still uses it
    finally:
        holder.stdin.close()  # the holder exits normally: its atexit release finds no other user
        assert holder.wait(timeout=30) == 0
    # gone, with its lock files (the holder's release, or its remover a moment later)
    assert eventually(lambda: list(copies_dir(root).iterdir()) == [])


def test_the_remover_waits_for_every_user_even_killed_ones_then_removes_the_copy(tmp_path):
    # Ray kills its workers at the end of a run: no exit handler runs, and the remover the first one started (no
    # child of it) removes the copy once the kernel has dropped the last lock
    source, root = make_model_dir(tmp_path / "model"), tmp_path / "shm"
    first, held = start_holder(source, root)
    second, joined = start_holder(source, root)  # a second worker of the node joins
    assert joined == held
    kill(first)
    time.sleep(1.5)  # the remover's turn has come and gone: the second worker still holds the copy
    assert (Path(held) / "model.safetensors").read_bytes() == b"w" * 1000
    kill(second)
    assert eventually(lambda: list(copies_dir(root).iterdir()) == [])


def test_a_copy_left_without_its_remover_is_reused_for_the_same_model_and_removed_for_another(tmp_path):
    root = tmp_path / "shm"
    model_a, model_b = make_model_dir(tmp_path / "a"), make_model_dir(tmp_path / "b", weights=b"v" * 10)
    holder, left = start_holder(model_a, root, remover=False)
    kill(holder)  # the copy stays: its user and its remover are gone
    inode = (Path(left) / "model.safetensors").stat().st_ino
    # the same unchanged model: the left copy is complete, so it is reused as it is
    assert fs.copy_to_shm(model_a, root=root) == left
    assert (Path(left) / "model.safetensors").stat().st_ino == inode
    fs.release_shm_copies()
    assert not Path(left).exists()  # this process was its last user
    holder, left = start_holder(model_a, root, remover=False)
    kill(holder)
    # another model: preparing its copy removes the one nobody uses any more
    copy_b = fs.copy_to_shm(model_b, root=root)
    assert not Path(left).exists() and Path(copy_b).is_dir()
    assert sorted(p.name for p in copies_dir(root).iterdir()) == sorted(
        [Path(copy_b).name, f"{Path(copy_b).name}.lock", f"{Path(copy_b).name}.users"]
    )


def test_a_copy_in_use_by_another_process_is_not_removed_for_another_model(tmp_path):
    root = tmp_path / "shm"
    model_a, model_b = make_model_dir(tmp_path / "a"), make_model_dir(tmp_path / "b")
    holder, held = start_holder(model_a, root)
    try:
        fs.copy_to_shm(model_b, root=root)
        assert files_under(Path(held))["model.safetensors"] == b"w" * 1000
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


def test_a_changed_source_gets_a_fresh_copy(tmp_path):
    source = make_model_dir(tmp_path / "model")
    old = fs.copy_to_shm(source, root=tmp_path / "shm")
    (source / "model.safetensors").write_bytes(b"x" * 1001)  # new weights: another size (and mtime)
    new = fs.copy_to_shm(source, root=tmp_path / "shm")
    assert new != old
    assert (Path(new) / "model.safetensors").read_bytes() == b"x" * 1001
    assert (Path(old) / "model.safetensors").read_bytes() == b"w" * 1000  # still held by this process
    fs.release_shm_copies()
    assert not Path(old).exists() and not Path(new).exists()


def test_without_dev_shm_the_temporary_directory_holds_the_copy(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(fs, "SHM_DIR", str(tmp_path / "no-shm-here"))
    monkeypatch.setattr(fs.tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    source = make_model_dir(tmp_path / "model")
    with caplog.at_level(logging.WARNING, logger="verl.utils.fs"):
        copy = Path(fs.copy_to_shm(source))
    assert copy.parent == copies_dir(tmp_path / "tmp")
    assert files_under(copy)["model.safetensors"] == b"w" * 1000
    assert "has no writable" in caplog.text and str(tmp_path / "tmp") in caplog.text


def test_without_room_the_source_is_loaded_directly(tmp_path, monkeypatch, caplog):
    source = make_model_dir(tmp_path / "model")
    # 1000 + 3 small files need more than the 100 bytes this file system pretends to have free
    monkeypatch.setattr(fs.shutil, "disk_usage", lambda path: type("Usage", (), {"free": 100})())
    with caplog.at_level(logging.WARNING, logger="verl.utils.fs"):
        assert fs.copy_to_shm(source, root=tmp_path / "shm") == str(source.resolve())
    assert "loading from" in caplog.text
    assert not any(p.is_dir() for p in copies_dir(tmp_path / "shm").iterdir())  # nothing half-copied left


def test_a_path_that_is_no_directory_is_refused(tmp_path):
    weights = make_model_dir(tmp_path / "model") / "model.safetensors"
    with pytest.raises(ValueError, match=r"use_shm=true copies a model directory, and .* is not one"):
        fs.copy_to_shm(weights, root=tmp_path / "shm")


def test_copy_to_local_copies_only_with_use_shm(tmp_path, monkeypatch):
    monkeypatch.setattr(fs, "SHM_DIR", str(tmp_path / "shm"))
    (tmp_path / "shm").mkdir()
    source = make_model_dir(tmp_path / "model")
    assert fs.copy_to_local(str(source)) == str(source)
    assert Path(fs.copy_to_local(str(source), use_shm=True)).parent == copies_dir(tmp_path / "shm")
