"""Tests of the line, TSV and pair readers (bertflow.io.text)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bertflow import (
    InputError,
)
from bertflow.io import text
from bertflow.io.text import (
    SentencePairs,
    index_lines,
    iter_lines,
    read_lines,
    read_pairs,
    read_sentences,
    read_tsv_column,
)
from bertflow.validation import is_blank, validate_sentences

from ..conftest import write_file

# ------------------------------------------------------------------------------------------------------
# iter_lines / read_sentences
# ------------------------------------------------------------------------------------------------------


def test_iter_lines_strips_only_terminators(tmp_path: Path) -> None:
    raw = '\ufeff  lead\r\ntrail  \nsep\u2028arator\n"quoted" text\n\n'
    f = write_file(tmp_path / "a.txt", raw)
    assert list(iter_lines(f)) == [
        (1, "  lead"),
        (2, "trail  "),
        (3, "sep\u2028arator"),  # no splitlines() semantics
        (4, '"quoted" text'),
        (5, ""),
    ]


def test_iter_lines_last_line_without_newline(tmp_path: Path) -> None:
    f = write_file(tmp_path / "a.txt", "one\ntwo")
    assert list(iter_lines(f)) == [(1, "one"), (2, "two")]


def test_iter_lines_is_lazy(tmp_path: Path) -> None:
    f = write_file(tmp_path / "a.txt", "one\n\xff\n".encode("latin-1"))
    gen = iter_lines(f)
    assert next(gen) == (1, "one")  # the bad second line is only seen when reached
    with pytest.raises(InputError):
        next(gen)


def test_gzip_file_reads_like_the_plain_file(tmp_path: Path) -> None:
    import gzip

    raw = "\ufeffone\r\ncaf\u00e9 two\n\nthree\u2028four\nlast"
    plain = write_file(tmp_path / "s.txt", raw)
    packed = tmp_path / "s.txt.gz"
    packed.write_bytes(gzip.compress(raw.encode("utf-8")))
    renamed = tmp_path / "no-suffix"  # recognised by content, not by name
    renamed.write_bytes(packed.read_bytes())
    expected = list(iter_lines(plain))
    assert expected[0] == (1, "one")
    assert list(iter_lines(packed)) == expected == list(iter_lines(renamed))
    assert read_sentences(packed, unique=True) == read_sentences(plain, unique=True)
    assert read_tsv_column(packed, 0, header=False) == read_tsv_column(plain, 0, header=False)


def test_gzip_truncated_or_corrupt_is_an_input_error(tmp_path: Path) -> None:
    import gzip

    body = gzip.compress(("a sentence of some length\n" * 2000).encode())
    truncated = tmp_path / "cut.txt.gz"
    truncated.write_bytes(body[: len(body) // 2])
    with pytest.raises(InputError, match=r"cut\.txt\.gz.*(corrupt|truncated)"):
        read_sentences(truncated)
    corrupt = tmp_path / "bad.txt.gz"
    corrupt.write_bytes(body[:20] + bytes(b ^ 0xFF for b in body[20:60]) + body[60:])
    with pytest.raises(InputError, match=r"bad\.txt\.gz"):
        read_sentences(corrupt)
    assert truncated.read_bytes() == body[: len(body) // 2]  # the input is never touched


def test_read_sentences_skips_blank_lines_and_logs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    f = write_file(tmp_path / "s.txt", "a b\n\n   \n\tc \n")
    with caplog.at_level(logging.INFO, logger="bertflow.io.text"):
        assert read_sentences(f) == ["a b", "\tc "]
    assert any("skipped 2 blank line" in r.getMessage() for r in caplog.records)


def test_read_sentences_blank_line_error_has_line_number(tmp_path: Path) -> None:
    f = write_file(tmp_path / "s.txt", "a\nb\n  \nc\n")
    with pytest.raises(InputError, match=r"line 3 "):
        read_sentences(f, skip_blank=False)


def test_read_sentences_unique_keeps_first_occurrence(tmp_path: Path) -> None:
    f = write_file(tmp_path / "s.txt", "b\na\nb\nc\na\nb \n")
    assert read_sentences(f, unique=True) == ["b", "a", "c", "b "]
    assert read_sentences(f) == ["b", "a", "b", "c", "a", "b "]


@pytest.mark.parametrize("content", ["", "\n\n \n", "\ufeff\n"])
def test_read_sentences_empty_result(tmp_path: Path, content: str) -> None:
    f = write_file(tmp_path / "empty.txt", content)
    with pytest.raises(InputError, match="no sentences in"):
        read_sentences(f)


def test_read_sentences_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        read_sentences(tmp_path / "nope.txt")
    with pytest.raises(InputError, match="directory"):
        read_sentences(tmp_path)


def test_bad_utf8_strict_names_line_and_byte(tmp_path: Path) -> None:
    f = write_file(tmp_path / "bad.txt", b"good\nalso good\ncaf\xe9 bad\nfine\n")
    with pytest.raises(InputError) as info:
        read_sentences(f)
    message = str(info.value)
    assert "line 3" in message
    assert "0xe9" in message
    assert str(f) in message
    assert "replace" in message and "--encoding-errors" in message


def test_bad_utf8_replace_mode(tmp_path: Path) -> None:
    f = write_file(tmp_path / "bad.txt", b"good\ncaf\xe9 bad\n\xff\xfe\n")
    assert read_sentences(f, errors="replace") == ["good", "caf\ufffd bad", "\ufffd\ufffd"]


def test_invalid_errors_mode(tmp_path: Path) -> None:
    f = write_file(tmp_path / "s.txt", "a\n")
    with pytest.raises(InputError, match="errors must be"):
        read_sentences(f, errors="ignore")  # type: ignore[arg-type]


def test_one_megabyte_single_line(tmp_path: Path) -> None:
    line = ("word é " * 150_000)[:1_000_000]
    f = write_file(tmp_path / "long.txt", line + "\r\n")
    (sentence,) = read_sentences(f)
    assert sentence == line


def test_many_lines_stream(tmp_path: Path) -> None:
    n = 200_000
    f = tmp_path / "many.txt"
    with open(f, "w", encoding="utf-8") as fh:
        for i in range(n):
            fh.write(f"sentence {i % 1000}\n")
    assert len(read_sentences(f)) == n
    assert read_sentences(f, unique=True) == [f"sentence {i}" for i in range(1000)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blob=st.binary(max_size=300))
def test_fuzz_arbitrary_bytes_only_input_error(tmp_path: Path, blob: bytes) -> None:
    f = tmp_path / "fuzz.bin"
    f.write_bytes(blob)
    for errors in ("strict", "replace"):
        try:
            result = read_sentences(f, errors=errors)  # type: ignore[arg-type]
        except InputError:
            continue
        assert result and all(isinstance(s, str) and s.strip() for s in result)
        assert all("\n" not in s for s in result)


_line_text = st.text(
    alphabet=st.characters(blacklist_characters="\n\r", blacklist_categories=("Cs",)), min_size=1, max_size=40
).filter(lambda s: not is_blank(s) and not text._looks_utf16(s.encode("utf-8")))  # blank / UTF-16: refused


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(_line_text, min_size=1, max_size=20), crlf=st.booleans(), final_newline=st.booleans())
def test_fuzz_round_trip_text_lines(tmp_path: Path, lines: list[str], crlf: bool, final_newline: bool) -> None:
    if lines[0].startswith("\ufeff"):
        lines[0] = "x" + lines[0]  # a leading BOM is by design dropped
    sep = "\r\n" if crlf else "\n"
    f = tmp_path / "rt.txt"
    f.write_bytes((sep.join(lines) + (sep if final_newline else "")).encode("utf-8"))
    assert read_sentences(f) == lines
    assert read_sentences(f, unique=True) == list(dict.fromkeys(lines))


# ------------------------------------------------------------------------------------------------------
# TSV readers
# ------------------------------------------------------------------------------------------------------


def test_read_tsv_column_by_name_and_index(tmp_path: Path) -> None:
    f = write_file(tmp_path / "t.tsv", 'id\ttext\textra\n1\t"quoted, with comma\t x\n2\t trailing \t\n')
    assert read_tsv_column(f, "text") == ['"quoted, with comma', " trailing "]
    assert read_tsv_column(f, 1) == ['"quoted, with comma', " trailing "]
    assert read_tsv_column(f, "extra") == [" x", ""]
    assert read_tsv_column(f, 0, header=False) == ["id", "1", "2"]


def test_read_tsv_column_unknown_name_lists_header(tmp_path: Path) -> None:
    f = write_file(tmp_path / "t.tsv", "id\ttext\n1\ta\n")
    with pytest.raises(InputError, match=r"no column named 'sentence'.*'id', 'text'"):
        read_tsv_column(f, "sentence")
    with pytest.raises(InputError, match="out of range"):
        read_tsv_column(f, 5)
    with pytest.raises(InputError, match="header=False"):
        read_tsv_column(f, "text", header=False)


def test_read_tsv_column_too_few_fields_names_line(tmp_path: Path) -> None:
    f = write_file(tmp_path / "t.tsv", "id\ttext\n1\ta\n2\tb\n3\n4\td\n")
    with pytest.raises(InputError) as info:
        read_tsv_column(f, "text")
    assert "line 4" in str(info.value)
    assert "'text'" in str(info.value)


def test_read_pairs_sts_format(tmp_path: Path) -> None:
    f = write_file(
        tmp_path / "p.tsv",
        'score\tsentence1\tsentence2\n4.400\tA "man" plays. \t A man is playing.\n0\tx\ty\n',
    )
    pairs = read_pairs(f)
    assert len(pairs) == 2
    assert pairs.sentences1 == ['A "man" plays. ', "x"]
    assert pairs.sentences2 == [" A man is playing.", "y"]
    assert pairs.scores is not None and pairs.scores.dtype == np.float64
    np.testing.assert_array_equal(pairs.scores, [4.4, 0.0])
    assert pairs.labels is None
    assert list(pairs.sentences()) == ['A "man" plays. ', " A man is playing.", "x", "y"]


def test_read_pairs_label_format(tmp_path: Path) -> None:
    f = write_file(tmp_path / "nli.tsv", "label\tsentence1\tsentence2\nentailment\ta\tb\n")
    pairs = read_pairs(f)
    assert pairs.scores is None and pairs.labels == ["entailment"]


@pytest.mark.parametrize(
    ("body", "pattern"),
    [
        ("score\tsentence1\tsentence2\n1\ta\tb\nhigh\tc\td\n", r"line 3: score 'high' is not a number"),
        ("score\tsentence1\tsentence2\n1\ta\tb\nnan\tc\td\n", r"line 3: score 'nan' is not finite"),
        ("score\tsentence1\tsentence2\n1\ta\n", r"line 2 has 2 TAB-separated field\(s\), expected 3"),
        ("score\tsentence1\tsentence2\n1\ta\tb\tc\n", r"line 2 has 4 TAB-separated"),
        ("score\tsentence1\tsentence2\n1\t \tb\n", r"line 2: sentence1 is empty"),
        ("s1\ts2\n", r"header with the columns"),
        ("score\tsentence1\tsentence2\n", r"no sentence pairs"),
        ("", r"is empty"),
    ],
)
def test_read_pairs_errors(tmp_path: Path, body: str, pattern: str) -> None:
    f = write_file(tmp_path / "p.tsv", body)
    with pytest.raises(InputError, match=pattern):
        read_pairs(f)


def test_sentence_pairs_validates_lengths() -> None:
    with pytest.raises(InputError):
        SentencePairs(["a"], ["b", "c"], None)
    with pytest.raises(InputError):
        SentencePairs(["a"], ["b"], np.array([1.0, 2.0]))


# -- silent wrong results (issue 13): UTF-16 without a BOM, invisible-only lines --------------------------------


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
def test_utf16_without_bom_is_refused_not_read_as_garbage(tmp_path, encoding):
    """UTF-16 text is valid UTF-8 byte by byte (a NUL beside every ASCII character), so it used to be read as
    sentences full of NULs. Every reader now names the problem."""
    path = tmp_path / "corpus.txt"
    path.write_bytes("A man is playing a guitar.\nThe cat sleeps.\n".encode(encoding))
    for read in (read_sentences, lambda p: read_tsv_column(p, 0, header=False)):
        with pytest.raises(InputError, match="line 1 has a NUL byte every other byte: the file is UTF-16"):
            read(path)
    pairs = tmp_path / "pairs.tsv"
    pairs.write_bytes("score\tsentence1\tsentence2\n1.0\ta\tb\n".encode(encoding))
    with pytest.raises(InputError, match="UTF-16"):
        read_pairs(pairs)


def test_nul_bytes_that_are_not_utf16_are_not_mistaken_for_it(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes(b"a sentence with one \x00 NUL in it\nanother line\n")
    assert read_sentences(path) == ["a sentence with one \x00 NUL in it", "another line"]


@pytest.mark.parametrize(
    "blank", ["\u200b", "\u200b \u200c\u200d", "\ufeff", "\x00", "\x00\x00\x00", " \u2060 ", "\u180e\u3000"]
)
def test_lines_of_invisible_characters_are_blank(tmp_path, blank):
    """Zero-width characters, U+FEFF and NUL show nothing and tokenise to nothing: such a line is blank, like an
    empty one (skipped, or refused with skip_blank=False; a pair with such a sentence is refused)."""
    path = tmp_path / "corpus.txt"
    path.write_bytes(f"first\n{blank}\nlast\n".encode())
    assert read_sentences(path) == ["first", "last"]
    with pytest.raises(InputError, match="line 2 is empty or only whitespace or invisible characters"):
        read_sentences(path, skip_blank=False)
    pairs = tmp_path / "pairs.tsv"
    pairs.write_bytes(f"score\tsentence1\tsentence2\n1.0\tfine\t{blank}\n".encode())
    with pytest.raises(InputError, match="line 2: sentence2 is empty"):
        read_pairs(pairs)
    with pytest.raises(InputError, match="sentence 1 is empty or only whitespace or invisible"):
        validate_sentences(["fine", blank])


def test_the_distributed_line_reader_applies_the_same_rules(tmp_path):
    """distributed-encode reads shards of lines by byte offset with its own reader: same UTF-16 and blank rules."""
    from bertflow.io.text import read_lines

    utf16 = tmp_path / "utf16.txt"
    utf16.write_bytes("first line\nsecond line\n".encode("utf-16-le"))
    with pytest.raises(InputError, match="UTF-16"):
        read_lines(utf16, 0, 2)
    invisible = tmp_path / "invisible.txt"
    invisible.write_bytes("first line\n\u200b\ufeff\n".encode())
    with pytest.raises(InputError, match="line 2 is empty or only whitespace or invisible"):
        read_lines(invisible, 0, 2)


def test_read_pairs_without_target_and_with_every_column(tmp_path):
    from bertflow.errors import InputError
    from bertflow.io.text import read_pairs

    path = tmp_path / "pairs.tsv"
    path.write_text("id\tsentence1\tsentence2\tnote\nx1\ta b\tc d\t\nx2\te f\tg h\tkeep me\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"score \(or label\)"):
        read_pairs(path)  # the STS readers still need a score or label
    pairs = read_pairs(path, require_target=False, keep_columns=True)
    assert pairs.sentences1 == ["a b", "e f"] and pairs.sentences2 == ["c d", "g h"]
    assert pairs.scores is None and pairs.labels is None
    assert pairs.columns == {
        "id": ["x1", "x2"],
        "sentence1": ["a b", "e f"],
        "sentence2": ["c d", "g h"],
        "note": ["", "keep me"],
    }
    assert read_pairs(path, require_target=False).columns is None
    path.write_text("score\tsentence1\tsentence2\n4.5\ta\tb\n", encoding="utf-8")
    scored = read_pairs(path, require_target=False, keep_columns=True)
    assert scored.scores.tolist() == [4.5] and scored.columns["score"] == ["4.5"]


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
    assert index.rows == index.record["lines"] == len(expected) and index.record["bytes"] == len(content)
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
    import itertools

    from bertflow.io.text import _blank_line_error, decode_line

    def one_by_one(path, offset, count, first_line, errors):
        out = []
        with open(path, "rb") as fh:
            fh.seek(offset)
            for i, raw in enumerate(itertools.islice(fh, count)):
                out.append(decode_line(raw, path, first_line + i, errors, first=i == 0 and offset == 0))
                if is_blank(out[-1]):
                    _blank_line_error(path, first_line + i)
        if len(out) != count:
            raise InputError(
                f"{path} ended after line {first_line + len(out) - 1}, but {count} lines were expected from line "
                f"{first_line}: the file changed since it was indexed"
            )
        return out

    path = tmp_path / "in.txt"
    path.write_bytes(content)
    starts = [0] + [i + 1 for i, byte in enumerate(content) if byte == 10]
    for k, offset in enumerate(starts):
        for count in range(4):
            for errors in ("strict", "replace"):
                outcomes = []
                for read in (read_lines, one_by_one):
                    try:
                        if read is read_lines:
                            outcomes.append(read(path, offset, count, first_line=k + 1, errors=errors))
                        else:
                            outcomes.append(read(path, offset, count, k + 1, errors))
                    except InputError as e:
                        outcomes.append(str(e))
                assert outcomes[0] == outcomes[1], (offset, count, errors)


def test_tsv_with_missing_columns(tmp_path):
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("score\tsentence1\tsentence2\n3.0\tA man.\tA woman.\n2.0\tonly one sentence\n", encoding="utf-8")
    with pytest.raises(InputError, match="line 3"):
        read_pairs(tsv)
    with pytest.raises(InputError, match="line 3"):
        read_tsv_column(tsv, "sentence2")


@given(st.binary(max_size=400))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_tsv_readers_fuzz(tmp_path_factory, raw):
    """Arbitrary bytes: the TSV readers either return data or raise InputError, nothing else."""
    path = tmp_path_factory.mktemp("fuzz") / "f.tsv"
    path.write_bytes(b"score\tsentence1\tsentence2\n" + raw)
    for read in (lambda: read_pairs(path), lambda: read_tsv_column(path, "sentence1", errors="replace")):
        try:
            read()
        except InputError:
            pass


@pytest.mark.parametrize(
    ("encoding", "bom", "expected"),
    [
        ("utf-16-le", b"", "UTF-16LE without a byte-order mark"),
        ("utf-16-be", b"", "UTF-16BE without a byte-order mark"),
        ("utf-16-le", b"\xff\xfe", "UTF-16LE with a byte-order mark"),
        ("utf-16-be", b"\xfe\xff", "UTF-16BE with a byte-order mark"),
    ],
)
def test_utf16_advice_names_the_byte_order_and_the_mark(tmp_path, encoding, bom, expected):
    from bertflow.errors import InputError
    from bertflow.io.text import read_sentences

    path = tmp_path / "u16.txt"
    path.write_bytes(bom + "A man plays a guitar.\nA dog runs.\n".encode(encoding))
    with pytest.raises(InputError, match=expected):
        read_sentences(path)
