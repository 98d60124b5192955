"""Download and convert the STS / SICK / SNLI release archives into the layout that
:mod:`bertflow.evaluation.datasets` reads."""

from __future__ import annotations

import json
import logging
import shutil
import socket
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from bertflow.errors import DataNotFoundError, InputError
from bertflow.io.files import atomic_file
from bertflow.io.formats import sha256_file

from ..io.text import BOM
from .datasets import DEFAULT_CACHE_DIR, USE_LOCAL_COPY, task_spec

logger = logging.getLogger(__name__)


def _year(path: str, prefix: str, *subsets: str) -> tuple[str, str, str, tuple[str, ...]]:
    """A SemEval year's archive URL, the name patterns of its sentence and gold files, its subsets."""
    url = f"http://ixa2.si.ehu.es/stswiki/images/{path}"
    return url, f"{prefix}.input.{{}}.txt", f"{prefix}.gs.{{}}.txt", subsets


# The original release archives SentEval's data script downloads (see its get_transfer_data.bash); STS13 without the
# LDC-licensed SMT subset, as SentEval and BERT-flow.
_SEMEVAL_YEARS: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    "STS12": _year("4/40/STS2012-en-test.zip", "STS", "MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN",
                   "surprise.SMTnews"),
    "STS13": _year("2/2f/STS2013-en-test.zip", "STS", "FNWN", "headlines", "OnWN"),
    "STS14": _year("8/8c/STS2014-en-test.zip", "STS", "deft-forum", "deft-news", "headlines", "images", "OnWN",
                   "tweet-news"),
    "STS15": _year("d/da/STS2015-en-test.zip", "STS", "answers-forums", "answers-students", "belief", "headlines",
                   "images"),
    "STS16": _year("9/98/STS2016-en-test.zip", "STS2016", "answer-answer", "headlines", "plagiarism", "postediting",
                   "question-question"),
}  # fmt: skip
_STSB_URL = "http://ixa2.si.ehu.es/stswiki/images/4/48/Stsbenchmark.tar.gz"
_SICK_URLS: dict[str, str] = {
    "train.tsv": "https://raw.githubusercontent.com/alvations/stasis/master/SICK-data/SICK_train.txt",
    "trial.tsv": "https://raw.githubusercontent.com/alvations/stasis/master/SICK-data/SICK_trial.txt",
    "test.tsv": "https://raw.githubusercontent.com/alvations/stasis/master/SICK-data/SICK_test_annotated.txt",
}
_SNLI_URL = "https://nlp.stanford.edu/projects/snli/snli_1.0.zip"
_COMPLETE_MARKER = ".bertflow-download-complete"

# sha256 of every file the downloader builds (NLI aside): the checksums of the reference copy of the data
# (../shared/data/sts/MANIFEST), built by the same rules from the same official packages.
_EXPECTED_SHA256: dict[str, str] = {
    "SICK/test.tsv": "978ef6b6956e3b7af701d349ca05d43b851d7e92b3790df22b41c785990b550e",
    "SICK/train.tsv": "0faf8457e52c3da2591c349a6554f0fe2e88367b54a76cdd7bc372b054f4405b",
    "SICK/trial.tsv": "8ece185afd97709376f8233e1ee7d3cb2fe933dd955e5ba6ebf68883cbf8fb57",
    "STS12/MSRpar.tsv": "aeb678fd809e6451b534e3ead0da427a87134484a57e3bf47a2ffdfd219f9e84",
    "STS12/MSRvid.tsv": "6ca5e7ad06c0ddf88b13f3789c2d82d4adc7e36bed979bbcfa28767e6821475a",
    "STS12/SMTeuroparl.tsv": "a66ca4fb880dab10be3cda6dc1d20f1f5eea3ef37f481ff8b91ca9dd228a401e",
    "STS12/surprise.OnWN.tsv": "2377ce2fc656aaf9dfc746b60febbdc6eb1de079975cf0a9e54ab30d0c7c0f7d",
    "STS12/surprise.SMTnews.tsv": "92d6307eea9006f2ed529bdddcf6ceec82a188fd9db56f9d852ed5894f509e99",
    "STS13/FNWN.tsv": "7113127cda71e956853916cc15eb57ce345163cc1930ef55ce5834104eb56ce6",
    "STS13/OnWN.tsv": "4a502e080328de453e1175c8eec0acc9ba2fc85ee78ebc9799dd6f148171ffe6",
    "STS13/headlines.tsv": "30652621bc6562fb6e40f4bf2100b6966da7231145a023fe16d4ba5a32edb5e2",
    "STS14/OnWN.tsv": "99bff95d192576171169e2d205a4a32aa91ab7da3a352f3c1ff6076944a3051e",
    "STS14/deft-forum.tsv": "4bb19ae87f7e81eb37e2f4499ed82acb7b1d4fb46bfa3806722f6ee987dfbe3a",
    "STS14/deft-news.tsv": "a2c945a760b23095f7da79ab51048daa7a8f94df2f0e9b9d842bb9b7fe1b5ccd",
    "STS14/headlines.tsv": "d3dfb8e133a10fb538805b4e226df2fa2a169b5464a4670d5fc4e0baa91797b2",
    "STS14/images.tsv": "6fb4f9d1bc630f7fd47b2dc18bdce980995628cbcfd3ea15c793da78d3ebd842",
    "STS14/tweet-news.tsv": "4a39cc18dbaba73ac06ddd159f5dcaa4a773ec06d140903b8b657e2174daa98f",
    "STS15/answers-forums.tsv": "2db9a430d268a3ece75348273c483ed6e43a51a444ac27a1b8d3db0a83fb62e0",
    "STS15/answers-students.tsv": "732cd8d0009d9acf9e28cf751c0eec724e41e44b61cffdbf6be3a86435725739",
    "STS15/belief.tsv": "1c482e99c092c5d56b216e857702fde8eaec36a6e60320af3db8f6f0473beedc",
    "STS15/headlines.tsv": "f0049a6fc3c875c785b3463be4109a77a593f75d4fb22ce509c2306772287493",
    "STS15/images.tsv": "f0c8f6dd3d86ae98e857a35a4056843915ef23a965f5a31db2c8e1ba24675945",
    "STS16/answer-answer.tsv": "de11aaf7429a02672713f3abb07eab94e9dead59db4ede3d0db72145c1bbdd42",
    "STS16/headlines.tsv": "d3164e96f77e722b13252dde46e8db1224ab02f1178cbe1b89bd2aeb39f5ade6",
    "STS16/plagiarism.tsv": "8cf3f81570b266a4f18744aadb853b12864dd1f0d720607a53015c859c78635e",
    "STS16/postediting.tsv": "f4e9d5132e1786bdb3faa89f1a18a0e30ba42e105cd4afcce8d0d0739926bb3d",
    "STS16/question-question.tsv": "aaf4f53d1047eb944dac8b4b67ddae80055032f81873ad357f8dbf619def476e",
    "STSBenchmark/dev.tsv": "9847c811e123501874b7296eb2780c2e6864f19c51342590cc9db7abefe9840e",
    "STSBenchmark/test.tsv": "9d449376d11bd3e1d319c0327dc0c42c1fc0c7491f3f84d4c591765c122233cf",
    "STSBenchmark/train.tsv": "d46b45477888dd90b914ef6cf502bd8f4b27d52c792b6e54baec729705a14441",
}


def _lines(path: Path) -> list[str]:
    """The lines of a source file, split on LF only, without terminators (a CR before LF and a BOM are dropped)."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        logger.warning("%s is not valid UTF-8; undecodable bytes are replaced by U+FFFD", path)
        text = path.read_bytes().decode("utf-8", errors="replace")
    lines = text.removeprefix(BOM).split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def _write_pairs_tsv(path: Path, rows: Iterable[tuple[str, str, str]], first: str = "score") -> int:
    """Write the header then one ``first<TAB>s1<TAB>s2`` row per item, atomically; return the row count. TAB, CR and
    LF inside a field become spaces (the TSV format cannot hold them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with atomic_file(path, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(f"{first}\tsentence1\tsentence2\n")
        for row in rows:
            fh.write("\t".join(f.replace("\t", " ").replace("\r", " ").replace("\n", " ") for f in row) + "\n")
            n += 1
    return n


def _find_file(root: Path, name: str) -> Path:
    """The shallowest file ``name`` below ``root`` (some mirrors nest processed copies deeper)."""
    matches = sorted(p for p in root.rglob(name) if p.is_file())
    if not matches:
        raise DataNotFoundError(
            f"the downloaded archive has no file {name}; the source may have changed. {USE_LOCAL_COPY}"
        )
    return min(matches, key=lambda p: (len(p.parts), str(p)))


def _convert_semeval_year(
    src_dir: Path, dst_dir: Path, subsets: Sequence[str], input_pattern: str, gs_pattern: str
) -> dict[str, int]:
    """Convert SemEval ``STS.input.<subset>.txt`` + ``STS.gs.<subset>.txt`` files (found at any depth of ``src_dir``;
    names from ``input_pattern`` and ``gs_pattern``, ``{}`` for the subset) to ``dst_dir/<subset>.tsv``; returns the
    scored pairs written per subset.

    The input files hold ``sentence1<TAB>sentence2[<TAB>source notes...]``; the gold file one score per line, empty
    for pairs that were not scored. Unscored pairs are dropped (as SentEval does); the rest is copied verbatim.
    DataNotFoundError for a missing file; InputError for files that disagree in length or are malformed."""
    counts: dict[str, int] = {}
    for subset in subsets:
        input_path = _find_file(src_dir, input_pattern.format(subset))
        gs_path = _find_file(src_dir, gs_pattern.format(subset))
        pairs, gold = _lines(input_path), _lines(gs_path)
        if len(pairs) != len(gold):
            raise InputError(f"{input_path} has {len(pairs)} lines but {gs_path} has {len(gold)}; cannot align scores")
        rows: list[tuple[str, str, str]] = []
        for number, (line, score) in enumerate(zip(pairs, gold, strict=True), start=1):
            score = score.strip()
            if not score:
                continue
            fields = line.split("\t")
            if len(fields) < 2:
                raise InputError(f"{input_path}: line {number} has no TAB between the two sentences")
            try:
                float(score)
            except ValueError:
                raise InputError(f"{gs_path}: line {number}: score {score!r} is not a number") from None
            rows.append((score, fields[0], fields[1]))
        counts[subset] = _write_pairs_tsv(dst_dir / f"{subset}.tsv", rows)
    return counts


def _score_rows(src: Path, lines: list[str], first: int, width: int, score: int, s1: int, s2: int) -> list[tuple]:
    """``(score, sentence1, sentence2)`` from the TAB-separated non-empty ``lines`` (numbered from ``first``) of at
    least ``width`` fields, taken at the indices ``score``, ``s1``, ``s2``."""
    rows = []
    for number, line in enumerate(lines, start=first):
        if not line:
            continue
        fields = line.split("\t")
        if len(fields) < width:
            raise InputError(f"{src}: line {number} has {len(fields)} fields, expected at least {width}")
        rows.append((fields[score].strip(), fields[s1], fields[s2]))
    return rows


def _convert_stsb_csv(src: Path, dst: Path) -> int:
    """Convert a raw STS Benchmark ``sts-<split>.csv`` (TAB-separated, no quoting; genre, filename, year, id, score,
    sentence1, sentence2, optional licence fields) to the pair TSV."""
    return _write_pairs_tsv(dst, _score_rows(src, _lines(src), 1, 7, 4, 5, 6))


def _convert_sick(src: Path, dst: Path) -> int:
    """Convert an official SICK file (header pair_ID, sentence_A, sentence_B, relatedness_score, ...)."""
    lines = _lines(src)
    if not lines:
        raise InputError(f"{src} is empty")
    header = lines[0].split("\t")
    try:
        i_a, i_b, i_s = (header.index(c) for c in ("sentence_A", "sentence_B", "relatedness_score"))
    except ValueError:
        raise InputError(f"{src}: unexpected SICK header {header!r}") from None
    return _write_pairs_tsv(dst, _score_rows(src, lines[1:], 2, len(header), i_s, i_a, i_b))


def _convert_snli_jsonl(src: Path, dst: Path) -> int:
    """Convert an SNLI 1.0 ``.jsonl`` split to ``label<TAB>sentence1<TAB>sentence2``, dropping gold ``-``."""
    records = [json.loads(line) for line in _lines(src) if line.strip()]
    rows = [(r["gold_label"], r["sentence1"], r["sentence2"]) for r in records if r.get("gold_label", "-") != "-"]
    return _write_pairs_tsv(dst, rows, first="label")


def _safe_extract(archive: Path, dest: Path) -> None:
    """Unpack a zip or tar archive into ``dest``, refusing members that would land outside it."""
    dest_resolved = dest.resolve()

    def _check(name: str) -> None:
        target = (dest / name).resolve()
        if dest_resolved != target and dest_resolved not in target.parents:
            raise InputError(f"{archive}: member {name!r} would be written outside the extraction folder")

    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            for member in zf.namelist():
                _check(member)
            zf.extractall(dest)
        return
    try:
        with tarfile.open(archive) as tf:
            members = tf.getmembers()
            for member in members:
                _check(member.name)
                if member.issym() or member.islnk():
                    raise InputError(f"{archive}: refusing link member {member.name!r}")
            tf.extractall(dest, members=members)
    except tarfile.TarError as exc:
        raise InputError(f"{archive} is neither a zip nor a tar archive ({exc})") from None


def _check_reachable(urls: Iterable[str], timeout: float) -> None:
    """Fail fast when the download hosts cannot be reached within ``timeout`` seconds (in total).

    urllib's timeout does not bound DNS resolution, so the probe runs in daemon threads with a hard deadline.
    Where urllib would go through a proxy (``http_proxy`` / ``https_proxy``), the proxy is probed instead.
    """
    proxies = urllib.request.getproxies()
    hosts: dict[tuple[str, int], str] = {}
    for url in urls:
        parts = urllib.parse.urlsplit(url)
        if parts.hostname is None:
            raise DataNotFoundError(f"bad download URL {url!r}. {USE_LOCAL_COPY}")
        proxy = proxies.get(parts.scheme)
        if proxy and not urllib.request.proxy_bypass(parts.hostname):
            parts = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        hosts.setdefault((parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)), url)
    failures: dict[tuple[str, int], str] = {}
    lock = threading.Lock()  # late probes may still report while the result is being read

    def _probe(host: str, port: int) -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
        except OSError as exc:
            with lock:
                failures[(host, port)] = str(exc) or type(exc).__name__

    threads = {key: threading.Thread(target=_probe, args=key, daemon=True) for key in hosts}
    for thread in threads.values():
        thread.start()
    # One deadline for all probes: they run in parallel, so the whole check takes at most ~timeout seconds.
    deadline = time.monotonic() + timeout
    for key, thread in threads.items():
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            with lock:
                failures.setdefault(key, f"no answer within {timeout:g} s")
    with lock:
        reported = sorted(failures.items())
    if reported:
        detail = "; ".join(f"{host}:{port}: {why}" for (host, port), why in reported)
        raise DataNotFoundError(f"cannot download the STS data: network unreachable ({detail}). {USE_LOCAL_COPY}")


def _download(url: str, dest: Path, timeout: float) -> Path:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, open(dest, "wb") as out:  # noqa: S310
            shutil.copyfileobj(response, out, length=1 << 20)
    except (urllib.error.URLError, OSError) as exc:
        raise DataNotFoundError(f"downloading {url} failed ({exc}). {USE_LOCAL_COPY}") from None
    return dest


def _built_files() -> list[str]:
    """The files (relative to the data folder) that :func:`download_sts` builds, NLI aside."""
    files = [f"{year}/{subset}.tsv" for year, spec in _SEMEVAL_YEARS.items() for subset in spec[3]]
    files += [f"STSBenchmark/{split}.tsv" for split in ("train", "dev", "test")]
    return files + [f"SICK/{name}" for name in _SICK_URLS]


def _check_checksums(target: Path, files: Sequence[str]) -> None:
    """Refuse built files whose sha256 is not the pinned one (:data:`_EXPECTED_SHA256`), or that have none: one
    InputError naming them all."""
    bad = []
    for name in files:
        expected = _EXPECTED_SHA256.get(name)
        got = sha256_file(target / name)
        if expected != got:
            pinned = f"{expected[:12]}..." if expected else "none pinned"
            bad.append(f"{name} (sha256 {got[:12]}..., expected {pinned})")
    if bad:
        raise InputError(
            f"downloaded data in {target} does not match the pinned checksums: {', '.join(bad)}; the source "
            f"changed or the download was altered. {USE_LOCAL_COPY}"
        )


def _unpacked(what: str, url: str, tmp: Path, name: str, read_timeout: float) -> Path:
    """Download the archive ``url`` (``what`` in the log) as ``tmp/name`` and unpack it into a folder ``tmp/what``."""
    logger.info("downloading %s from %s", what, url)
    folder = tmp / what
    folder.mkdir()
    _safe_extract(_download(url, tmp / name, read_timeout), folder)
    return folder


def download_sts(
    cache_dir: str | Path | None = None,
    *,
    include_nli: bool = False,
    force: bool = False,
    connect_timeout: float = 5.0,
    read_timeout: float = 60.0,
) -> Path:
    """Download the original STS12-16, STS Benchmark and SICK releases and build the TSV layout in ``cache_dir``
    (default ``~/.cache/bertflow/sts``, one of the folders the CLI's ``--data-dir`` default looks in); returns it.

    Only scored pairs are kept, text is raw (not SentEval's tokenized copy), and the pair counts and the sha256 of
    every built file are checked against the pinned ones (InputError otherwise, NLI aside). Existing files of the
    layout are overwritten, nothing else in the folder is touched; a completed download is not repeated unless
    ``force``. ``include_nli`` also builds ``NLI/snli_{dev,test}.tsv`` from the SNLI 1.0 zip (about 90 MB). Every
    host is probed first, so without network the call fails (DataNotFoundError) within about ``connect_timeout``
    seconds; ``read_timeout`` bounds any single network read."""
    target = Path(cache_dir).expanduser() if cache_dir is not None else DEFAULT_CACHE_DIR.expanduser()
    marker = target / _COMPLETE_MARKER
    if marker.is_file() and not force and (not include_nli or (target / "NLI" / "snli_test.tsv").is_file()):
        logger.info("STS data already downloaded in %s", target)
        return target
    urls = [spec[0] for spec in _SEMEVAL_YEARS.values()] + [_STSB_URL, *_SICK_URLS.values()]
    if include_nli:
        urls.append(_SNLI_URL)
    _check_reachable(urls, connect_timeout)
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataNotFoundError(f"cannot create {target} ({exc}). {USE_LOCAL_COPY}") from None
    with tempfile.TemporaryDirectory(prefix="bertflow-sts-") as tmp_name:
        tmp = Path(tmp_name)
        counts: dict[str, int] = {}
        for year, (url, input_pattern, gs_pattern, subsets) in _SEMEVAL_YEARS.items():
            unpacked = _unpacked(year, url, tmp, f"{year}.zip", read_timeout)
            written = _convert_semeval_year(unpacked, target / year, subsets, input_pattern, gs_pattern)
            counts[year] = sum(written.values())
        stsb = _unpacked("STS Benchmark", _STSB_URL, tmp, "stsb.tar.gz", read_timeout)
        for split in ("train", "dev", "test"):  # the count checked is the test split's
            csv = _find_file(stsb, f"sts-{split}.csv")
            counts["STS-B"] = _convert_stsb_csv(csv, target / f"STSBenchmark/{split}.tsv")
        for name, url in _SICK_URLS.items():  # train, trial, test: the count checked is the test split's
            logger.info("downloading SICK %s from %s", name, url)
            counts["SICK-R"] = _convert_sick(_download(url, tmp / f"sick-{name}", read_timeout), target / "SICK" / name)
        if include_nli:
            snli = _unpacked("SNLI 1.0", _SNLI_URL, tmp, "snli.zip", read_timeout)
            for split in ("dev", "test"):
                _convert_snli_jsonl(_find_file(snli, f"snli_1.0_{split}.jsonl"), target / f"NLI/snli_{split}.tsv")
    wrong = {t: n for t, n in counts.items() if n != task_spec(t).official_pairs}
    if wrong:
        detail = ", ".join(f"{t}: {n} (official {task_spec(t).official_pairs})" for t, n in wrong.items())
        raise InputError(f"downloaded data in {target} has unexpected pair counts: {detail}")
    _check_checksums(target, _built_files())
    marker.write_text("complete\n", encoding="utf-8")
    logger.info("STS data ready in %s", target)
    return target
