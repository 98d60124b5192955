"""The embedding store and the input index, in one process: shards, manifest, the reader, line offsets."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from bertflow.errors import InputError, ModelFileError
from bertflow.io.text import index_lines, iter_lines, read_lines
from bertflow.scale.layout import ShardSpec, plan_shards, read_manifest, shard_record
from bertflow.scale.reader import open_embeddings
from bertflow.scale.shards import ShardWriter
from bertflow.scale.store import merge_shards, write_store


@pytest.fixture()
def matrix() -> np.ndarray:
    return np.random.default_rng(0).normal(size=(103, 5)).astype(np.float32)


@pytest.fixture()
def store(tmp_path, matrix):
    return write_store(matrix, tmp_path / "store", shard_size=10)


# -- the input index --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [
        b"a\nbb\nccc\nd\ne\n",
        b"a\nbb\nccc\nd\ne",  # no final newline: the last line still counts
        b"\xef\xbb\xbfa\r\nbb\r\nccc\r\nd\r\ne\r\nf\r\n",  # BOM and CRLF
        b"one line only",
        b"",
    ],
)
@pytest.mark.parametrize("every", [1, 2, 3, 10])
def test_line_index_agrees_with_the_whole_file_reader(tmp_path, content, every):
    path = tmp_path / "in.txt"
    path.write_bytes(content)
    expected = [text for _, text in iter_lines(path)]
    index = index_lines(path, every, block_size=3)  # tiny blocks: boundaries fall across block edges
    assert index.lines == len(expected) and index.bytes == len(content)
    assert len(index.offsets) == -(-len(expected) // every)
    got = []
    for k, offset in enumerate(index.offsets):
        count = min(every, len(expected) - k * every)
        got += read_lines(path, offset, count, first_line=k * every + 1)
    assert got == expected


def test_read_lines_names_the_line_of_a_blank_or_undecodable_line(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes(b"fine\n  \nok\n")
    with pytest.raises(InputError, match="line 2 is empty"):
        read_lines(path, 0, 3)
    path.write_bytes(b"fine\nbad \xff byte\n")
    with pytest.raises(InputError, match=r"line 12 is not valid UTF-8 \(byte 0xff"):
        read_lines(path, 0, 2, first_line=11)
    assert read_lines(path, 0, 2, errors="replace")[1] == "bad \ufffd byte"
    with pytest.raises(InputError, match="changed since it was indexed"):
        read_lines(path, 0, 5, errors="replace")


def test_read_lines_decodes_a_plain_block_at_once(tmp_path, monkeypatch):
    # A shard of ordinary UTF-8 lines (CRLF ends and a BOM included) is decoded as one block, not line by line in
    # Python (which fed the encoder at about 6 us a line): the per-line decoder is not called for it.
    import bertflow.io.text as text_module

    path = tmp_path / "in.txt"
    content = b"\xef\xbb\xbfcaf\xc3\xa9 one\r\n  two \xe2\x80\xa8\nthree\r\nfour"  # U+2028 splits no line
    path.write_bytes(content)
    monkeypatch.setattr(text_module, "decode_line", lambda *a, **k: pytest.fail("decoded line by line"))
    assert read_lines(path, 0, 4) == ["caf\u00e9 one", "  two \u2028", "three", "four"]
    assert read_lines(path, content.index(b"\n") + 1, 2, first_line=2) == ["  two \u2028", "three"]


@pytest.mark.parametrize(
    "content",
    [
        b"a\nb\n",
        b"a\r\nb",
        b"\xef\xbb\xbf\na\n",  # a BOM alone on line 1: blank
        b"a\n \t\nb\n",
        b"a\n\xe2\x80\x8b\nb\n",  # a zero-width space alone: blank
        b"a\n\xe2\x80\x8bx\nb\n",
        b"a\rb\nc\n",  # a lone CR
        b"a\nb\r",
        b"a\nx\x00y\x00z\x00w\x00\n",  # UTF-16
        b"a\nbad \xff\nc\n",
        b"a\n\r\nb\n",
        b"a\n",
    ],
)
def test_read_lines_equals_the_line_by_line_reader(tmp_path, content):
    # The block reader gives the same lines, or the same error naming the same line, as decoding each line.
    from bertflow.io.text import _read_lines_one_by_one

    path = tmp_path / "in.txt"
    path.write_bytes(content)
    starts = [0] + [i + 1 for i, byte in enumerate(content) if byte == 10]
    for k, offset in enumerate(starts):
        for count in range(4):
            for errors in ("strict", "replace"):
                outcomes = []
                for read in (read_lines, _read_lines_one_by_one):
                    try:
                        if read is read_lines:
                            outcomes.append(read(path, offset, count, first_line=k + 1, errors=errors))
                        else:
                            outcomes.append(read(path, offset, count, k + 1, errors))
                    except InputError as e:
                        outcomes.append(str(e))
                assert outcomes[0] == outcomes[1], (offset, count, errors)


def test_plan_cuts_rows_into_shards():
    assert plan_shards(25, 10) == [ShardSpec(0, 0, 10), ShardSpec(1, 10, 20), ShardSpec(2, 20, 25)]
    assert plan_shards(0, 10) == []
    with pytest.raises(InputError):
        plan_shards(5, 0)


# -- writing ----------------------------------------------------------------------------------------------------


def test_a_shard_exists_only_once_committed(tmp_path):
    spec = ShardSpec(3, 30, 36)
    rows = np.arange(18, dtype=np.float32).reshape(6, 3)
    writer = ShardWriter(tmp_path, spec, 3, record={"rank": 1})
    writer.write(rows[:4])
    assert shard_record(tmp_path, spec, 3) is None and not (tmp_path / "shards" / spec.name).exists()
    writer.write(rows[4:])
    record = writer.commit()
    assert record["rank"] == 1 and record["rows"] == 6 and shard_record(tmp_path, spec, 3) == record
    np.testing.assert_array_equal(np.load(tmp_path / "shards" / spec.name), rows)
    assert [p.name for p in (tmp_path / "shards").iterdir() if ".tmp-" in p.name] == []


def test_a_failed_shard_leaves_nothing_behind(tmp_path):
    spec = ShardSpec(0, 0, 4)
    with pytest.raises(RuntimeError, match="encoder broke"), ShardWriter(tmp_path, spec, 2) as writer:
        writer.write(np.zeros((2, 2), np.float32))
        raise RuntimeError("encoder broke")
    assert list((tmp_path / "shards").iterdir()) == []
    with ShardWriter(tmp_path, spec, 2, background=False) as writer:
        with pytest.raises(InputError, match="overflows"):
            writer.write(np.zeros((5, 2), np.float32))
        writer.write(np.zeros((3, 2), np.float32))
        with pytest.raises(InputError, match="got 3 rows, expected 4"):
            writer.commit()


def test_a_truncated_or_mismatched_shard_is_not_complete(store):
    spec = store.specs[2]
    assert shard_record(store.folder, spec, 5) is not None
    assert shard_record(store.folder, spec, 6) is None  # another dimension than planned
    path = store.folder / "shards" / spec.name
    path.write_bytes(path.read_bytes()[:-4])
    assert shard_record(store.folder, spec, 5) is None


# -- reading ----------------------------------------------------------------------------------------------------


def test_the_store_indexes_like_the_matrix(store, matrix):
    assert store.shape == matrix.shape and len(store) == 103 and len(store.specs) == 11
    np.testing.assert_array_equal(np.asarray(store), matrix)
    for key in [0, 57, -1, slice(None), slice(8, 31), slice(95, 200), slice(3, 90, 7), slice(None, None, -3)]:
        np.testing.assert_array_equal(store[key], matrix[key])
    picks = [102, 0, 55, 55, -3, 9, 10]
    np.testing.assert_array_equal(store[picks], matrix[picks])
    np.testing.assert_array_equal(store[np.array(picks)], matrix[picks])
    mask = np.zeros(103, bool)
    mask[[1, 50, 99]] = True
    np.testing.assert_array_equal(store[mask], matrix[mask])
    np.testing.assert_array_equal(store[12:47, 1:3], matrix[12:47, 1:3])
    np.testing.assert_array_equal(store[5, 4], matrix[5, 4])
    np.testing.assert_array_equal(np.concatenate(list(store.iter_chunks(rows=7))), matrix)
    with pytest.raises(IndexError):
        store[103]
    with pytest.raises(IndexError):
        store[[0, 400]]


def test_merge_writes_one_memory_mappable_array(store, matrix):
    path = merge_shards(store.folder)
    merged = np.load(path, mmap_mode="r")
    np.testing.assert_array_equal(merged, matrix)
    record = read_manifest(store.folder)["merged"]
    assert record["file"] == "embeddings.npy"
    # The recorded digest and size are those of the whole file, header included.
    assert record["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert record["bytes"] == path.stat().st_size


def test_verify_catches_a_changed_byte(store):
    store.verify()
    path = store.folder / "shards" / store.specs[4].name
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match="sha256"):
        open_embeddings(store.folder, verify=True)


def test_an_incomplete_store_is_refused_with_the_missing_shards(store):
    (store.folder / "shards" / store.specs[3].record_name).unlink()
    with pytest.raises(InputError, match=r"1 of 11 shard\(s\) are not complete \(3\); re-run"):
        open_embeddings(store.folder)


def test_a_newer_or_foreign_manifest_is_refused(store):
    manifest_path = store.folder / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**manifest, "format_version": 99}))
    with pytest.raises(ModelFileError, match="upgrade bertflow"):
        open_embeddings(store.folder)
    manifest_path.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ModelFileError, match="not a bertflow embedding-store"):
        open_embeddings(store.folder)
    with pytest.raises(ModelFileError, match="is missing"):
        open_embeddings(store.folder / "nowhere")
