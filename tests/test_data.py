"""Tests of bertflow.data: line/TSV readers, STS task loading and the downloader's offline parts."""

from __future__ import annotations

import logging
import os
import socket
import tarfile
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bertflow import data
from bertflow.data import (
    DATA_DIR_ENV,
    STS_TASKS,
    SentencePairs,
    StsTask,
    canonical_task_name,
    download_sts,
    iter_lines,
    load_nli_sentences,
    load_sts_task,
    load_sts_tasks,
    read_pairs,
    read_sentences,
    read_tsv_column,
    resolve_data_dir,
)
from bertflow.errors import DataNotFoundError, InputError
from bertflow.validation import is_blank, validate_sentences

REPO_ROOT = Path(__file__).resolve().parents[1]


def _shared_data_dir() -> Path | None:
    # The data is never copied into the repository: it lives next to the checkout (../shared/data/sts).
    env = os.environ.get(DATA_DIR_ENV)
    candidates = [Path(env)] if env else []
    candidates.append(REPO_ROOT.parent / "shared" / "data" / "sts")
    for candidate in candidates:
        if (candidate / "STS12").is_dir():
            return candidate
    return None


@pytest.fixture(scope="module")
def sts_dir() -> Path:
    found = _shared_data_dir()
    if found is None:
        pytest.skip(f"STS data not found at {REPO_ROOT.parent / 'shared/data/sts'} (set {DATA_DIR_ENV} to a copy)")
    return found


def _write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


# ------------------------------------------------------------------------------------------------------
# iter_lines / read_sentences
# ------------------------------------------------------------------------------------------------------


def test_iter_lines_strips_only_terminators(tmp_path: Path) -> None:
    raw = '\ufeff  lead\r\ntrail  \nmid\rcr\nsep\u2028arator\n"quoted" text\n\n'
    f = _write(tmp_path / "a.txt", raw)
    assert list(iter_lines(f)) == [
        (1, "  lead"),
        (2, "trail  "),
        (3, "mid\rcr"),  # a lone CR is content, not a terminator
        (4, "sep\u2028arator"),  # no splitlines() semantics
        (5, '"quoted" text'),
        (6, ""),
    ]


def test_iter_lines_last_line_without_newline(tmp_path: Path) -> None:
    f = _write(tmp_path / "a.txt", "one\ntwo")
    assert list(iter_lines(f)) == [(1, "one"), (2, "two")]


def test_iter_lines_is_lazy(tmp_path: Path) -> None:
    f = _write(tmp_path / "a.txt", "one\n\xff\n".encode("latin-1"))
    gen = iter_lines(f)
    assert next(gen) == (1, "one")  # the bad second line is only seen when reached
    with pytest.raises(InputError):
        next(gen)


def test_gzip_file_reads_like_the_plain_file(tmp_path: Path) -> None:
    import gzip

    raw = "\ufeffone\r\ncaf\u00e9 two\n\nthree\u2028four\nlast"
    plain = _write(tmp_path / "s.txt", raw)
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
    f = _write(tmp_path / "s.txt", "a b\n\n   \n\tc \n")
    with caplog.at_level(logging.INFO, logger="bertflow.data"):
        assert read_sentences(f) == ["a b", "\tc "]
    assert any("skipped 2 blank line" in r.getMessage() for r in caplog.records)


def test_read_sentences_blank_line_error_has_line_number(tmp_path: Path) -> None:
    f = _write(tmp_path / "s.txt", "a\nb\n  \nc\n")
    with pytest.raises(InputError, match=r"line 3 "):
        read_sentences(f, skip_blank=False)


def test_read_sentences_unique_keeps_first_occurrence(tmp_path: Path) -> None:
    f = _write(tmp_path / "s.txt", "b\na\nb\nc\na\nb \n")
    assert read_sentences(f, unique=True) == ["b", "a", "c", "b "]
    assert read_sentences(f) == ["b", "a", "b", "c", "a", "b "]


@pytest.mark.parametrize("content", ["", "\n\n \n", "\ufeff\n"])
def test_read_sentences_empty_result(tmp_path: Path, content: str) -> None:
    f = _write(tmp_path / "empty.txt", content)
    with pytest.raises(InputError, match="no sentences in"):
        read_sentences(f)


def test_read_sentences_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        read_sentences(tmp_path / "nope.txt")
    with pytest.raises(InputError, match="directory"):
        read_sentences(tmp_path)


def test_bad_utf8_strict_names_line_and_byte(tmp_path: Path) -> None:
    f = _write(tmp_path / "bad.txt", b"good\nalso good\ncaf\xe9 bad\nfine\n")
    with pytest.raises(InputError) as info:
        read_sentences(f)
    message = str(info.value)
    assert "line 3" in message
    assert "0xe9" in message
    assert str(f) in message
    assert "replace" in message and "--encoding-errors" in message


def test_bad_utf8_replace_mode(tmp_path: Path) -> None:
    f = _write(tmp_path / "bad.txt", b"good\ncaf\xe9 bad\n\xff\xfe\n")
    assert read_sentences(f, errors="replace") == ["good", "caf\ufffd bad", "\ufffd\ufffd"]


def test_invalid_errors_mode(tmp_path: Path) -> None:
    f = _write(tmp_path / "s.txt", "a\n")
    with pytest.raises(InputError, match="errors must be"):
        read_sentences(f, errors="ignore")  # type: ignore[arg-type]


def test_one_megabyte_single_line(tmp_path: Path) -> None:
    line = ("word é " * 150_000)[:1_000_000]
    f = _write(tmp_path / "long.txt", line + "\r\n")
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
).filter(lambda s: not is_blank(s) and not data._looks_utf16(s.encode("utf-8")))  # blank / UTF-16: refused


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
    f = _write(tmp_path / "t.tsv", 'id\ttext\textra\n1\t"quoted, with comma\t x\n2\t trailing \t\n')
    assert read_tsv_column(f, "text") == ['"quoted, with comma', " trailing "]
    assert read_tsv_column(f, 1) == ['"quoted, with comma', " trailing "]
    assert read_tsv_column(f, "extra") == [" x", ""]
    assert read_tsv_column(f, 0, header=False) == ["id", "1", "2"]


def test_read_tsv_column_unknown_name_lists_header(tmp_path: Path) -> None:
    f = _write(tmp_path / "t.tsv", "id\ttext\n1\ta\n")
    with pytest.raises(InputError, match=r"no column named 'sentence'.*'id', 'text'"):
        read_tsv_column(f, "sentence")
    with pytest.raises(InputError, match="out of range"):
        read_tsv_column(f, 5)
    with pytest.raises(InputError, match="header=False"):
        read_tsv_column(f, "text", header=False)


def test_read_tsv_column_too_few_fields_names_line(tmp_path: Path) -> None:
    f = _write(tmp_path / "t.tsv", "id\ttext\n1\ta\n2\tb\n3\n4\td\n")
    with pytest.raises(InputError) as info:
        read_tsv_column(f, "text")
    assert "line 4" in str(info.value)
    assert "'text'" in str(info.value)


def test_read_pairs_sts_format(tmp_path: Path) -> None:
    f = _write(
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
    f = _write(tmp_path / "nli.tsv", "label\tsentence1\tsentence2\nentailment\ta\tb\n")
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
    f = _write(tmp_path / "p.tsv", body)
    with pytest.raises(InputError, match=pattern):
        read_pairs(f)


def test_sentence_pairs_validates_lengths() -> None:
    with pytest.raises(InputError):
        SentencePairs(["a"], ["b", "c"], None)
    with pytest.raises(InputError):
        SentencePairs(["a"], ["b"], np.array([1.0, 2.0]))


# ------------------------------------------------------------------------------------------------------
# Data folder resolution
# ------------------------------------------------------------------------------------------------------


def test_resolve_data_dir_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    explicit = tmp_path / "explicit"
    explicit.mkdir()
    env_dir = tmp_path / "env"
    env_dir.mkdir()
    monkeypatch.setenv(DATA_DIR_ENV, str(env_dir))
    assert resolve_data_dir(explicit) == explicit.resolve()
    assert resolve_data_dir() == env_dir.resolve()

    monkeypatch.delenv(DATA_DIR_ENV)
    home = tmp_path / "home"
    (home / ".cache/bertflow/sts").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    work = tmp_path / "repo" / "sub"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    assert resolve_data_dir() == (home / ".cache/bertflow/sts").resolve()
    (tmp_path / "repo" / "shared/data/sts").mkdir(parents=True)
    assert resolve_data_dir() == (tmp_path / "repo/shared/data/sts").resolve()
    (work / "shared/data/sts").mkdir(parents=True)
    found = resolve_data_dir()
    assert found == (work / "shared/data/sts").resolve() and found.is_absolute()


def test_resolve_data_dir_missing_explains_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataNotFoundError) as info:
        resolve_data_dir()
    message = str(info.value)
    for hint in ("--data-dir", DATA_DIR_ENV, "bertflow download-sts", "download_sts()"):
        assert hint in message
    with pytest.raises(DataNotFoundError, match="does not exist"):
        resolve_data_dir(tmp_path / "nope")
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "nope"))
    with pytest.raises(DataNotFoundError, match=DATA_DIR_ENV):
        resolve_data_dir()
    assert isinstance(info.value, FileNotFoundError)


# ------------------------------------------------------------------------------------------------------
# STS tasks on a synthetic layout
# ------------------------------------------------------------------------------------------------------


def _pairs_tsv(rows: list[tuple[str, str, str]]) -> str:
    return "score\tsentence1\tsentence2\n" + "".join(f"{s}\t{a}\t{b}\n" for s, a, b in rows)


@pytest.fixture
def tiny_layout(tmp_path: Path) -> Path:
    root = tmp_path / "sts"
    _write(root / "STS12/MSRpar.tsv", _pairs_tsv([("1", "a", "b"), ("2", "c", "a")]))
    _write(root / "STS12/surprise.OnWN.tsv", _pairs_tsv([("3", "d", "a")]))
    _write(root / "STS12/headlines.tsv", _pairs_tsv([("4", "e", "f")]))
    _write(root / "STSBenchmark/train.tsv", _pairs_tsv([("1", "tr1", "tr2"), ("2", "shared", "tr3")]))
    _write(root / "STSBenchmark/dev.tsv", _pairs_tsv([("1", "dv1", "shared")]))
    _write(root / "STSBenchmark/test.tsv", _pairs_tsv([("1", "te1", "te2"), ("5", "te1", "shared")]))
    _write(root / "SICK/train.tsv", _pairs_tsv([("1", "k1", "k2")]))
    _write(root / "SICK/trial.tsv", _pairs_tsv([("1", "k3", "k4")]))
    _write(root / "SICK/test.tsv", _pairs_tsv([("1", "k5", "k6")]))
    _write(root / "NLI/snli_dev.tsv", "label\tsentence1\tsentence2\nneutral\tp\th\nentailment\tp\th2\n")
    _write(root / "NLI/snli_test.tsv", "label\tsentence1\tsentence2\ncontradiction\th\tq\n")
    return root


def test_year_task_subsets_in_senteval_order(tiny_layout: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="bertflow.data"):
        task = load_sts_task("STS12", tiny_layout)
    assert list(task.eval_subsets) == ["headlines", "MSRpar", "surprise.OnWN"]  # case-insensitive order
    assert task.splits.keys() == task.eval_subsets.keys()
    assert task.n_eval_pairs == 4
    assert task.eval_sentences() == ["e", "f", "a", "b", "c", "d"]
    assert task.fit_sentences("target") == task.eval_sentences()
    assert not task.has_train_split
    with pytest.raises(InputError, match="no train split"):
        task.fit_sentences("train")
    with pytest.raises(InputError, match="regime"):
        task.fit_sentences("nli")  # type: ignore[arg-type]
    assert "official count is 3108" in caplog.text  # a non-official copy is flagged


def test_stsb_fit_regimes(tiny_layout: Path) -> None:
    task = load_sts_task("stsb", tiny_layout)
    assert task.name == "STS-B"
    assert list(task.eval_subsets) == ["test"] and list(task.splits) == ["train", "dev", "test"]
    assert task.eval_sentences() == ["te1", "te2", "shared"]
    assert task.fit_sentences("train") == ["tr1", "tr2", "shared", "tr3"]
    assert task.fit_sentences("target") == ["tr1", "tr2", "shared", "tr3", "dv1", "te1", "te2"]
    sick = load_sts_task("SICK", tiny_layout)
    assert sick.name == "SICK-R"
    assert len(sick.splits["dev"]) == 1 and sick.splits["dev"].sentences1 == ["k3"]  # trial.tsv


def test_missing_task_files(tiny_layout: Path) -> None:
    (tiny_layout / "STSBenchmark/dev.tsv").unlink()
    with pytest.raises(DataNotFoundError, match="dev.tsv"):
        load_sts_task("STS-B", tiny_layout)
    with pytest.raises(DataNotFoundError, match="STS13"):
        load_sts_task("STS13", tiny_layout)
    with pytest.raises(InputError, match="unknown STS task"):
        load_sts_task("STS17", tiny_layout)


def test_task_name_aliases() -> None:
    assert [canonical_task_name(n) for n in ("sts12", "STS-B", "sts_b", "STSBenchmark", "sick-r", "sick")] == [
        "STS12",
        "STS-B",
        "STS-B",
        "STS-B",
        "SICK-R",
        "SICK-R",
    ]


def test_load_nli_sentences_distinct(tiny_layout: Path) -> None:
    assert load_nli_sentences(tiny_layout) == ["p", "h", "h2", "q"]


def test_sts_task_is_plain_dataclass() -> None:
    pairs = SentencePairs(["a"], ["b"], np.array([1.0]))
    task = StsTask("STS-B", {"test": pairs}, {"train": pairs, "test": pairs})
    assert task.fit_sentences("train") == ["a", "b"]


# ------------------------------------------------------------------------------------------------------
# The real shared data
# ------------------------------------------------------------------------------------------------------

OFFICIAL = {
    "STS12": 3108,
    "STS13": 1500,
    "STS14": 3750,
    "STS15": 3000,
    "STS16": 1186,
    "STS-B": 1379,
    "SICK-R": 4927,
}


def test_real_data_all_tasks(sts_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="bertflow.data"):
        tasks = load_sts_tasks(data_dir=sts_dir)
    assert "official count" not in caplog.text
    assert tuple(tasks) == STS_TASKS
    for name, task in tasks.items():
        assert task.n_eval_pairs == OFFICIAL[name], name
        distinct = task.eval_sentences()
        # Sentences repeat across pairs, but never so much that fewer than a third are distinct.
        assert task.n_eval_pairs * 2 / 3 < len(distinct) <= 2 * task.n_eval_pairs, name
        assert len(set(distinct)) == len(distinct)
        for pairs in task.eval_subsets.values():
            assert pairs.scores is not None and np.isfinite(pairs.scores).all()
            lo, hi = (1.0, 5.0) if name == "SICK-R" else (0.0, 5.0)
            assert pairs.scores.min() >= lo and pairs.scores.max() <= hi
    assert list(tasks["STS13"].eval_subsets) == ["FNWN", "headlines", "OnWN"]  # no SMT
    assert [len(p) for p in tasks["STS16"].eval_subsets.values()] == [254, 249, 230, 244, 209]
    assert {k: len(v) for k, v in tasks["STS-B"].splits.items()} == {"train": 5749, "dev": 1500, "test": 1379}
    assert {k: len(v) for k, v in tasks["SICK-R"].splits.items()} == {"train": 4500, "dev": 500, "test": 4927}
    # Sentences are verbatim: STS14 deft-news keeps the source's trailing space on sentence1.
    assert all(s.endswith(" ") for s in tasks["STS14"].eval_subsets["deft-news"].sentences1)


def test_real_data_fit_regimes(sts_dir: Path) -> None:
    stsb = load_sts_task("STS-B", sts_dir)
    target = stsb.fit_sentences("target")
    target_set = set(target)
    for split in ("train", "dev", "test"):
        assert set(stsb.splits[split].sentences()) <= target_set, split
    assert len(target) == len(target_set)
    train = stsb.fit_sentences("train")
    assert set(train) < target_set and len(train) < len(target)
    assert len(target) > len(stsb.eval_sentences())
    assert len(load_nli_sentences(sts_dir)) == 25741  # as the data README states


# ------------------------------------------------------------------------------------------------------
# Downloader (offline parts)
# ------------------------------------------------------------------------------------------------------


@pytest.fixture
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.usefixtures("no_proxy_env")
def test_download_fails_fast_on_unresolvable_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bogus = "http://bertflow-test-host.invalid/STS.zip"
    monkeypatch.setattr(data, "_SEMEVAL_YEARS", {k: (bogus, *v[1:]) for k, v in data._SEMEVAL_YEARS.items()})
    monkeypatch.setattr(data, "_STSB_URL", bogus)
    monkeypatch.setattr(data, "_SICK_URLS", {k: bogus for k in data._SICK_URLS})
    start = time.monotonic()
    with pytest.raises(DataNotFoundError) as info:
        download_sts(tmp_path / "cache", connect_timeout=2.0)
    assert time.monotonic() - start < 5.0
    message = str(info.value)
    assert "bertflow-test-host.invalid" in message
    assert "--data-dir" in message and DATA_DIR_ENV in message
    assert not (tmp_path / "cache").exists()  # nothing half-built


@pytest.mark.usefixtures("no_proxy_env")
def test_download_fails_fast_when_connect_hangs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def hanging_connect(*args: object, **kwargs: object) -> socket.socket:
        time.sleep(30)
        raise OSError("unreachable")

    monkeypatch.setattr(data.socket, "create_connection", hanging_connect)
    start = time.monotonic()
    with pytest.raises(DataNotFoundError, match="no answer within 0.5 s"):
        download_sts(tmp_path / "cache", connect_timeout=0.5)
    assert time.monotonic() - start < 3.0


@pytest.mark.usefixtures("no_proxy_env")
def test_reachability_probe_uses_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    probed: list[tuple[str, int]] = []

    def fake_connect(address: tuple[str, int], timeout: float) -> socket.socket:
        probed.append(address)
        raise OSError("refused")

    monkeypatch.setenv("https_proxy", "http://proxy.example.invalid:3128")
    monkeypatch.setattr(data.socket, "create_connection", fake_connect)
    with pytest.raises(DataNotFoundError, match="proxy.example.invalid:3128: refused"):
        data._check_reachable(["https://raw.githubusercontent.com/x", "http://plain.example.invalid/y"], 1.0)
    assert sorted(probed) == [("plain.example.invalid", 80), ("proxy.example.invalid", 3128)]


def test_download_default_urls_fail_fast_offline(tmp_path: Path) -> None:
    # Real URLs: offline this must fail fast; online it would be a full download, so skip then.
    start = time.monotonic()
    try:
        data._check_reachable([data._STSB_URL], timeout=3.0)
    except DataNotFoundError as exc:
        assert time.monotonic() - start < 5.0
        assert "--data-dir" in str(exc) and DATA_DIR_ENV in str(exc)
    else:
        pytest.skip("network is reachable; the offline fail-fast path is covered by the other tests")


def test_download_skips_when_already_complete(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / data._COMPLETE_MARKER).write_text("complete\n")

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("network used")

    monkeypatch.setattr(data, "_check_reachable", no_network)
    assert download_sts(tmp_path) == tmp_path


def _semeval_fixture(folder: Path, prefix: str = "STS") -> None:
    # Input: sentence1 TAB sentence2 [TAB source notes]; gold: one score per line, empty = unscored.
    _write(
        folder / f"{prefix}.input.news.txt",
        ' A "quoted" man. \tA man.\tsrc1\tsrc2\r\nUnscored one\tUnscored two\r\nCats purr.\tDogs bark. \r\n',
    )
    _write(folder / f"{prefix}.gs.news.txt", "4.400\r\n\r\n0.2\r\n")
    _write(folder / f"{prefix}.input.forum.txt", "x\ty\n")
    _write(folder / f"{prefix}.gs.forum.txt", "3\n")


def test_convert_semeval_year(tmp_path: Path) -> None:
    src = tmp_path / "unpacked" / "test-gold"
    _semeval_fixture(src)
    counts = data._convert_semeval_year(
        tmp_path / "unpacked", tmp_path / "out/STS12", ["news", "forum"], "STS.input.{}.txt", "STS.gs.{}.txt"
    )
    assert counts == {"news": 2, "forum": 1}
    raw = (tmp_path / "out/STS12/news.tsv").read_bytes()
    assert raw == (b'score\tsentence1\tsentence2\n4.400\t A "quoted" man. \tA man.\n0.2\tCats purr.\tDogs bark. \n')
    pairs = read_pairs(tmp_path / "out/STS12/news.tsv")
    assert pairs.sentences1 == [' A "quoted" man. ', "Cats purr."]
    np.testing.assert_array_equal(pairs.scores, [4.4, 0.2])


def test_convert_semeval_mismatched_lengths(tmp_path: Path) -> None:
    _write(tmp_path / "STS.input.a.txt", "x\ty\nz\tw\n")
    _write(tmp_path / "STS.gs.a.txt", "1\n")
    with pytest.raises(InputError, match="cannot align"):
        data._convert_semeval_year(tmp_path, tmp_path / "out", ["a"], "STS.input.{}.txt", "STS.gs.{}.txt")


def test_convert_stsb_and_sick(tmp_path: Path) -> None:
    csv = _write(
        tmp_path / "sts-test.csv",
        "main-captions\tMSRvid\t2012test\t0000\t2.500\t"
        "A girl is styling her hair.\tA girl is brushing her hair.\n"
        'main-forums\tanswers-forums\t2015\t0001\t1.0\t"Quoted" a \tb\tsrc1\tsrc2\n',
    )
    assert data._convert_stsb_csv(csv, tmp_path / "out/test.tsv") == 2
    pairs = read_pairs(tmp_path / "out/test.tsv")
    assert pairs.sentences1 == ["A girl is styling her hair.", '"Quoted" a ']
    np.testing.assert_array_equal(pairs.scores, [2.5, 1.0])

    sick = _write(
        tmp_path / "SICK_test_annotated.txt",
        "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\r\n"
        "6\tThere is no boy\tA group of kids\t3.3\tCONTRADICTION\r\n",
    )
    assert data._convert_sick(sick, tmp_path / "out/sick.tsv") == 1
    pairs = read_pairs(tmp_path / "out/sick.tsv")
    assert pairs.sentences1 == ["There is no boy"] and pairs.sentences2 == ["A group of kids"]
    assert pairs.scores is not None and list(pairs.scores) == [3.3]


def test_safe_extract_rejects_path_traversal(tmp_path: Path) -> None:
    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("../escape.txt", "x")
    with pytest.raises(InputError, match="outside"):
        data._safe_extract(archive, tmp_path / "dest")
    assert not (tmp_path / "escape.txt").exists()


def test_download_pipeline_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole download_sts pipeline with the network replaced by local fixture archives."""
    fixtures = tmp_path / "fixtures"
    for year, (_url, input_pattern, _gs, _subsets) in data._SEMEVAL_YEARS.items():
        folder = fixtures / year / "sts-test-folder"
        _semeval_fixture(folder, prefix=input_pattern.split(".input")[0])
        with zipfile.ZipFile(fixtures / f"{year}.zip", "w") as zf:
            for f in folder.iterdir():
                zf.write(f, f"sts-test-folder/{f.name}")
    stsb_dir = fixtures / "stsbenchmark"
    for split in ("train", "dev", "test"):
        _write(stsb_dir / f"sts-{split}.csv", f"g\tf\t2012\t0\t1.5\t{split} a\t{split} b\n")
    with tarfile.open(fixtures / "stsb.tar.gz", "w:gz") as tf:
        tf.add(stsb_dir, arcname="stsbenchmark")
    sick_header = "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"
    for name in ("SICK_train.txt", "SICK_trial.txt", "SICK_test_annotated.txt"):
        _write(fixtures / name, sick_header + "1\tp\tq\t4\tE\n")

    url_to_file = {spec[0]: fixtures / f"{year}.zip" for year, spec in data._SEMEVAL_YEARS.items()}
    url_to_file[data._STSB_URL] = fixtures / "stsb.tar.gz"
    url_to_file.update({url: fixtures / url.rsplit("/", 1)[1] for url in data._SICK_URLS.values()})

    def fake_download(url: str, dest: Path, timeout: float) -> Path:
        dest.write_bytes(url_to_file[url].read_bytes())
        return dest

    monkeypatch.setattr(data, "_check_reachable", lambda urls, timeout: None)
    monkeypatch.setattr(data, "_download", fake_download)
    # The fixture years lack the real subsets: a source that changed layout fails clearly.
    with pytest.raises(DataNotFoundError, match="has no file STS.input.MSRpar.txt"):
        download_sts(tmp_path / "layout")

    # Fixture years only contain the subsets "news" and "forum": convert exactly those.
    monkeypatch.setattr(
        data, "_SEMEVAL_YEARS", {k: (*v[:3], ("news", "forum")) for k, v in data._SEMEVAL_YEARS.items()}
    )
    # Each fixture year has 3 scored pairs and each split 1; a wrong count must be refused.
    for task in STS_TASKS:
        monkeypatch.setitem(data.OFFICIAL_EVAL_PAIRS, task, 3 if task.startswith("STS1") else 1)
    monkeypatch.setitem(data.OFFICIAL_EVAL_PAIRS, "STS-B", 2)
    with pytest.raises(InputError, match=r"unexpected pair counts: STS-B: 1 \(official 2\)"):
        download_sts(tmp_path / "bad")
    assert not (tmp_path / "bad" / data._COMPLETE_MARKER).exists()

    monkeypatch.setitem(data.OFFICIAL_EVAL_PAIRS, "STS-B", 1)
    out = download_sts(tmp_path / "cache")
    assert (out / data._COMPLETE_MARKER).is_file()
    tasks = load_sts_tasks(data_dir=out)
    assert tasks["STS16"].n_eval_pairs == 3
    assert list(tasks["STS12"].eval_subsets) == ["forum", "news"]
    assert tasks["STS12"].eval_subsets["news"].sentences1 == [' A "quoted" man. ', "Cats purr."]
    assert tasks["STS-B"].splits["dev"].sentences1 == ["dev a"]
    assert tasks["SICK-R"].splits["dev"].sentences2 == ["q"]


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
    from bertflow.distributed import read_lines

    utf16 = tmp_path / "utf16.txt"
    utf16.write_bytes("first line\nsecond line\n".encode("utf-16-le"))
    with pytest.raises(InputError, match="UTF-16"):
        read_lines(utf16, 0, 2)
    invisible = tmp_path / "invisible.txt"
    invisible.write_bytes("first line\n\u200b\ufeff\n".encode())
    with pytest.raises(InputError, match="line 2 is empty or only whitespace or invisible"):
        read_lines(invisible, 0, 2)


def test_read_pairs_without_target_and_with_every_column(tmp_path):
    from bertflow.data import read_pairs
    from bertflow.errors import InputError

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
