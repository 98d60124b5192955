"""Atomic file writes: a reader sees the old file or the whole new one; a failed write leaves nothing behind."""

from __future__ import annotations

import pytest

from bertflow.io.files import TMP_MARK, atomic_file, atomic_write_text, temporary_name


def test_atomic_file_replaces_on_success(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old", encoding="utf-8")
    with atomic_file(target, "w", encoding="utf-8") as fh:
        fh.write("new")
        assert target.read_text(encoding="utf-8") == "old"  # nothing visible before the block ends
        assert temporary_name(target).exists()
    assert target.read_text(encoding="utf-8") == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_atomic_file_keeps_the_old_file_on_error(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="half way"), atomic_file(target, "wb") as fh:
        fh.write(b"partial")
        raise RuntimeError("half way")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]
    with pytest.raises(KeyboardInterrupt), atomic_file(tmp_path / "new.bin", "wb"):
        raise KeyboardInterrupt  # interrupted: no new file, no temporary one
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_temporary_name_is_hidden_and_marked(tmp_path):
    name = temporary_name(tmp_path / "shard.npy").name
    assert name.startswith(".shard.npy" + TMP_MARK)


def test_atomic_write_text_is_utf8(tmp_path):
    target = tmp_path / "note.json"
    atomic_write_text(target, "naïve ✓")
    assert target.read_bytes() == "naïve ✓".encode()
    assert [p.name for p in tmp_path.iterdir()] == ["note.json"]


def test_read_folder_names_a_save_that_replaced_the_folder_during_the_read(tmp_path):
    from bertflow.errors import ModelFileError
    from bertflow.io.files import atomic_directory, read_folder

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "a").write_text("1")

    def read_while_saved_over(f):
        first = (f / "a").read_text()
        with atomic_directory(f) as tmp:  # another process's save, between two reads of this one
            (tmp / "a").write_text("2")
        return first, (f / "a").read_text()

    with pytest.raises(ModelFileError, match="replaced by another save while it was being read; load it again"):
        read_folder(folder, read_while_saved_over)  # ("1", "2") would mix two saves
    assert read_folder(folder, lambda f: (f / "a").read_text()) == "2"

    def broken(f):
        raise ModelFileError("its own error")

    with pytest.raises(ModelFileError, match="its own error"):  # nothing changed: the folder's own error, as is
        read_folder(folder, broken)
