"""Tests of the STS downloader's offline parts (bertflow.evaluation.download)."""

from __future__ import annotations

import dataclasses
import hashlib
import socket
import tarfile
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from bertflow.errors import DataNotFoundError, InputError
from bertflow.evaluation import datasets, download
from bertflow.evaluation.datasets import (
    DATA_DIR_ENV,
    STS_TASKS,
    load_sts_tasks,
)
from bertflow.evaluation.download import download_sts
from bertflow.io.text import read_pairs

from ..conftest import write_file

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
    monkeypatch.setattr(download, "_SEMEVAL_YEARS", {k: (bogus, *v[1:]) for k, v in download._SEMEVAL_YEARS.items()})
    monkeypatch.setattr(download, "_STSB_URL", bogus)
    monkeypatch.setattr(download, "_SICK_URLS", {k: bogus for k in download._SICK_URLS})
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

    monkeypatch.setattr(download.socket, "create_connection", hanging_connect)
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
    monkeypatch.setattr(download.socket, "create_connection", fake_connect)
    with pytest.raises(DataNotFoundError, match="proxy.example.invalid:3128: refused"):
        download._check_reachable(["https://raw.githubusercontent.com/x", "http://plain.example.invalid/y"], 1.0)
    assert sorted(probed) == [("plain.example.invalid", 80), ("proxy.example.invalid", 3128)]


def test_download_default_urls_fail_fast_offline(tmp_path: Path) -> None:
    # Real URLs: offline this must fail fast; online it would be a full download, so skip then.
    start = time.monotonic()
    try:
        download._check_reachable([download._STSB_URL], timeout=3.0)
    except DataNotFoundError as exc:
        assert time.monotonic() - start < 5.0
        assert "--data-dir" in str(exc) and DATA_DIR_ENV in str(exc)
    else:
        pytest.skip("network is reachable; the offline fail-fast path is covered by the other tests")


def test_download_skips_when_already_complete(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / download._COMPLETE_MARKER).write_text("complete\n")

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("network used")

    monkeypatch.setattr(download, "_check_reachable", no_network)
    assert download_sts(tmp_path) == tmp_path


def _semeval_fixture(folder: Path, prefix: str = "STS") -> None:
    # Input: sentence1 TAB sentence2 [TAB source notes]; gold: one score per line, empty = unscored.
    write_file(
        folder / f"{prefix}.input.news.txt",
        ' A "quoted" man. \tA man.\tsrc1\tsrc2\r\nUnscored one\tUnscored two\r\nCats purr.\tDogs bark. \r\n',
    )
    write_file(folder / f"{prefix}.gs.news.txt", "4.400\r\n\r\n0.2\r\n")
    write_file(folder / f"{prefix}.input.forum.txt", "x\ty\n")
    write_file(folder / f"{prefix}.gs.forum.txt", "3\n")


def test_convert_semeval_year(tmp_path: Path) -> None:
    src = tmp_path / "unpacked" / "test-gold"
    _semeval_fixture(src)
    counts = download._convert_semeval_year(
        tmp_path / "unpacked", tmp_path / "out/STS12", ["news", "forum"], "STS.input.{}.txt", "STS.gs.{}.txt"
    )
    assert counts == {"news": 2, "forum": 1}
    raw = (tmp_path / "out/STS12/news.tsv").read_bytes()
    assert raw == (b'score\tsentence1\tsentence2\n4.400\t A "quoted" man. \tA man.\n0.2\tCats purr.\tDogs bark. \n')
    pairs = read_pairs(tmp_path / "out/STS12/news.tsv")
    assert pairs.sentences1 == [' A "quoted" man. ', "Cats purr."]
    np.testing.assert_array_equal(pairs.scores, [4.4, 0.2])


def test_convert_semeval_mismatched_lengths(tmp_path: Path) -> None:
    write_file(tmp_path / "STS.input.a.txt", "x\ty\nz\tw\n")
    write_file(tmp_path / "STS.gs.a.txt", "1\n")
    with pytest.raises(InputError, match="cannot align"):
        download._convert_semeval_year(tmp_path, tmp_path / "out", ["a"], "STS.input.{}.txt", "STS.gs.{}.txt")


def test_convert_stsb_and_sick(tmp_path: Path) -> None:
    csv = write_file(
        tmp_path / "sts-test.csv",
        "main-captions\tMSRvid\t2012test\t0000\t2.500\t"
        "A girl is styling her hair.\tA girl is brushing her hair.\n"
        'main-forums\tanswers-forums\t2015\t0001\t1.0\t"Quoted" a \tb\tsrc1\tsrc2\n',
    )
    assert download._convert_stsb_csv(csv, tmp_path / "out/test.tsv") == 2
    pairs = read_pairs(tmp_path / "out/test.tsv")
    assert pairs.sentences1 == ["A girl is styling her hair.", '"Quoted" a ']
    np.testing.assert_array_equal(pairs.scores, [2.5, 1.0])

    sick = write_file(
        tmp_path / "SICK_test_annotated.txt",
        "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\r\n"
        "6\tThere is no boy\tA group of kids\t3.3\tCONTRADICTION\r\n",
    )
    assert download._convert_sick(sick, tmp_path / "out/sick.tsv") == 1
    pairs = read_pairs(tmp_path / "out/sick.tsv")
    assert pairs.sentences1 == ["There is no boy"] and pairs.sentences2 == ["A group of kids"]
    assert pairs.scores is not None and list(pairs.scores) == [3.3]


def test_safe_extract_rejects_path_traversal(tmp_path: Path) -> None:
    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("../escape.txt", "x")
    with pytest.raises(InputError, match="outside"):
        download._safe_extract(archive, tmp_path / "dest")
    assert not (tmp_path / "escape.txt").exists()


def test_download_pipeline_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole download_sts pipeline with the network replaced by local fixture archives."""
    fixtures = tmp_path / "fixtures"
    for year, (_url, input_pattern, _gs, _subsets) in download._SEMEVAL_YEARS.items():
        folder = fixtures / year / "sts-test-folder"
        _semeval_fixture(folder, prefix=input_pattern.split(".input")[0])
        with zipfile.ZipFile(fixtures / f"{year}.zip", "w") as zf:
            for f in folder.iterdir():
                zf.write(f, f"sts-test-folder/{f.name}")
    stsb_dir = fixtures / "stsbenchmark"
    for split in ("train", "dev", "test"):
        write_file(stsb_dir / f"sts-{split}.csv", f"g\tf\t2012\t0\t1.5\t{split} a\t{split} b\n")
    with tarfile.open(fixtures / "stsb.tar.gz", "w:gz") as tf:
        tf.add(stsb_dir, arcname="stsbenchmark")
    sick_header = "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"
    for name in ("SICK_train.txt", "SICK_trial.txt", "SICK_test_annotated.txt"):
        write_file(fixtures / name, sick_header + "1\tp\tq\t4\tE\n")

    url_to_file = {spec[0]: fixtures / f"{year}.zip" for year, spec in download._SEMEVAL_YEARS.items()}
    url_to_file[download._STSB_URL] = fixtures / "stsb.tar.gz"
    url_to_file.update({url: fixtures / url.rsplit("/", 1)[1] for url in download._SICK_URLS.values()})

    def fake_download(url: str, dest: Path, timeout: float) -> Path:
        dest.write_bytes(url_to_file[url].read_bytes())
        return dest

    monkeypatch.setattr(download, "_check_reachable", lambda urls, timeout: None)
    monkeypatch.setattr(download, "_download", fake_download)
    # The fixture years lack the real subsets: a source that changed layout fails clearly.
    with pytest.raises(DataNotFoundError, match="has no file STS.input.MSRpar.txt"):
        download_sts(tmp_path / "layout")

    # Fixture years only contain the subsets "news" and "forum": convert exactly those.
    monkeypatch.setattr(
        download, "_SEMEVAL_YEARS", {k: (*v[:3], ("news", "forum")) for k, v in download._SEMEVAL_YEARS.items()}
    )

    # Each fixture year has 3 scored pairs and each split 1; a wrong count must be refused.
    def official(counts: dict[str, int]) -> None:
        specs = tuple(dataclasses.replace(s, official_pairs=counts.get(s.name, s.official_pairs)) for s in specs_before)
        monkeypatch.setattr(datasets, "TASK_SPECS", specs)

    specs_before = datasets.TASK_SPECS
    fixture_counts = {task: 3 if task.startswith("STS1") else 1 for task in STS_TASKS}
    official({**fixture_counts, "STS-B": 2})
    with pytest.raises(InputError, match=r"unexpected pair counts: STS-B: 1 \(official 2\)"):
        download_sts(tmp_path / "bad")
    assert not (tmp_path / "bad" / download._COMPLETE_MARKER).exists()

    official(fixture_counts)
    # Each built file is checked against its pinned sha256: these fixtures are not the real data.
    with pytest.raises(InputError, match=r"does not match the pinned checksums: STS12/news.tsv \(sha256 \w{12}\.\.\., "
                       r"expected none pinned\)"):  # fmt: skip
        download_sts(tmp_path / "unpinned")
    assert not (tmp_path / "unpinned" / download._COMPLETE_MARKER).exists()
    header = b"score\tsentence1\tsentence2\n"
    news = header + b'4.400\t A "quoted" man. \tA man.\n0.2\tCats purr.\tDogs bark. \n'
    built = {f"{year}/news.tsv": news for year in download._SEMEVAL_YEARS}
    built |= {f"{year}/forum.tsv": header + b"3\tx\ty\n" for year in download._SEMEVAL_YEARS}
    built |= {f"STSBenchmark/{s}.tsv": header + f"1.5\t{s} a\t{s} b\n".encode() for s in ("train", "dev", "test")}
    built |= {f"SICK/{name}": header + b"4\tp\tq\n" for name in download._SICK_URLS}
    assert sorted(built) == sorted(download._built_files())
    pins = {name: hashlib.sha256(content).hexdigest() for name, content in built.items()}
    monkeypatch.setattr(download, "_EXPECTED_SHA256", {**pins, "SICK/test.tsv": "0" * 64})
    with pytest.raises(
        InputError, match=r"checksums: SICK/test.tsv \(sha256 \w{12}\.\.\., expected 000000000000\.\.\.\);"
    ):
        download_sts(tmp_path / "tampered")
    monkeypatch.setattr(download, "_EXPECTED_SHA256", pins)
    out = download_sts(tmp_path / "cache")
    assert (out / download._COMPLETE_MARKER).is_file()
    tasks = load_sts_tasks(data_dir=out)
    assert tasks["STS16"].n_eval_pairs == 3
    assert list(tasks["STS12"].eval_subsets) == ["forum", "news"]
    assert tasks["STS12"].eval_subsets["news"].sentences1 == [' A "quoted" man. ', "Cats purr."]
    assert tasks["STS-B"].splits["dev"].sentences1 == ["dev a"]
    assert tasks["SICK-R"].splits["dev"].sentences2 == ["q"]


def test_pinned_checksums_cover_every_built_file_and_match_the_reference_copy(sts_dir: Path) -> None:
    """Every file the downloader builds (NLI aside) has a pinned sha256, and the reference copy of the data (built
    from the same official packages) has exactly those checksums."""
    from bertflow.io.formats import sha256_file

    assert sorted(download._built_files()) == sorted(download._EXPECTED_SHA256)
    for name, digest in download._EXPECTED_SHA256.items():
        assert sha256_file(sts_dir / name) == digest, name
