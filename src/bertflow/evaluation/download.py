"""Download and convert the STS / SICK / SNLI release archives into the layout that
:mod:`bertflow.evaluation.datasets` reads."""

from __future__ import annotations

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

from ..io.text import BOM
from .datasets import DEFAULT_CACHE_DIR, USE_LOCAL_COPY, task_spec

__all__ = [
    "download_sts",
]

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------------
# Downloader
# ---------------------------------------------------------------------------------------------------------

# The original release archives SentEval's data script downloads (see its get_transfer_data.bash).
# Each year: archive URL, name pattern of the sentence and gold files, subsets (STS13 without the
# LDC-licensed SMT subset, as SentEval and BERT-flow).
_SEMEVAL_YEARS: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    "STS12": (
        "http://ixa2.si.ehu.es/stswiki/images/4/40/STS2012-en-test.zip",
        "STS.input.{}.txt",
        "STS.gs.{}.txt",
        ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"),
    ),
    "STS13": (
        "http://ixa2.si.ehu.es/stswiki/images/2/2f/STS2013-en-test.zip",
        "STS.input.{}.txt",
        "STS.gs.{}.txt",
        ("FNWN", "headlines", "OnWN"),
    ),
    "STS14": (
        "http://ixa2.si.ehu.es/stswiki/images/8/8c/STS2014-en-test.zip",
        "STS.input.{}.txt",
        "STS.gs.{}.txt",
        ("deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"),
    ),
    "STS15": (
        "http://ixa2.si.ehu.es/stswiki/images/d/da/STS2015-en-test.zip",
        "STS.input.{}.txt",
        "STS.gs.{}.txt",
        ("answers-forums", "answers-students", "belief", "headlines", "images"),
    ),
    "STS16": (
        "http://ixa2.si.ehu.es/stswiki/images/9/98/STS2016-en-test.zip",
        "STS2016.input.{}.txt",
        "STS2016.gs.{}.txt",
        ("answer-answer", "headlines", "plagiarism", "postediting", "question-question"),
    ),
}
_STSB_URL = "http://ixa2.si.ehu.es/stswiki/images/4/48/Stsbenchmark.tar.gz"
_SICK_URLS: dict[str, str] = {
    "train.tsv": "https://raw.githubusercontent.com/alvations/stasis/master/SICK-data/SICK_train.txt",
    "trial.tsv": "https://raw.githubusercontent.com/alvations/stasis/master/SICK-data/SICK_trial.txt",
    "test.tsv": "https://raw.githubusercontent.com/alvations/stasis/master/SICK-data/SICK_test_annotated.txt",
}
_SNLI_URL = "https://nlp.stanford.edu/projects/snli/snli_1.0.zip"
_COMPLETE_MARKER = ".bertflow-download-complete"


def _clean_field(text: str) -> str:
    # The TSV format cannot hold these characters inside a field; the README's rule is "replace by a space".
    return text.replace("\t", " ").replace("\r", " ").replace("\n", " ")


def _decode_source(raw: bytes, name: str) -> list[str]:
    """Decode a source file into lines split on LF only, without terminators (a CR before LF is dropped)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        logger.warning("%s is not valid UTF-8; undecodable bytes are replaced by U+FFFD", name)
        text = raw.decode("utf-8", errors="replace")
    if text.startswith(BOM):
        text = text[1:]
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _write_pairs_tsv(path: Path, header: str, rows: Iterable[tuple[str, str, str]]) -> int:
    """Write ``header`` then one ``score<TAB>s1<TAB>s2`` row per item, atomically; return the row count."""
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with atomic_file(path, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(header + "\n")
        for score, s1, s2 in rows:
            fh.write(f"{_clean_field(score)}\t{_clean_field(s1)}\t{_clean_field(s2)}\n")
            n += 1
    return n


def _find_file(root: Path, name: str) -> Path:
    matches = sorted(p for p in root.rglob(name) if p.is_file())
    if not matches:
        raise DataNotFoundError(
            f"the downloaded archive has no file {name}; the source may have changed. {USE_LOCAL_COPY}"
        )
    # Prefer the shallowest match: some mirrors nest processed copies deeper.
    return min(matches, key=lambda p: (len(p.parts), str(p)))


def _convert_semeval_year(
    src_dir: Path, dst_dir: Path, subsets: Sequence[str], input_pattern: str, gs_pattern: str
) -> dict[str, int]:
    """Convert SemEval ``STS.input.<subset>.txt`` + ``STS.gs.<subset>.txt`` files to ``<subset>.tsv``.

    The input files hold ``sentence1<TAB>sentence2[<TAB>source notes...]``; the gold file holds one score
    per line, empty for pairs that were not scored. Unscored pairs are dropped (as SentEval does); scores
    and sentences are otherwise copied verbatim.

    Args:
        src_dir: Folder that contains (at any depth) the unpacked input and gold files.
        dst_dir: Year folder to write ``<subset>.tsv`` into.
        subsets: Subset names to convert.
        input_pattern: File name of the sentences, with ``{}`` for the subset.
        gs_pattern: File name of the gold scores, with ``{}`` for the subset.

    Returns:
        Number of scored pairs written per subset.

    Raises:
        DataNotFoundError: A file is missing. InputError: the files disagree in length or are malformed.
    """
    counts: dict[str, int] = {}
    for subset in subsets:
        input_path = _find_file(src_dir, input_pattern.format(subset))
        gs_path = _find_file(src_dir, gs_pattern.format(subset))
        pairs = _decode_source(input_path.read_bytes(), str(input_path))
        gold = _decode_source(gs_path.read_bytes(), str(gs_path))
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
        counts[subset] = _write_pairs_tsv(dst_dir / f"{subset}.tsv", "score\tsentence1\tsentence2", rows)
    return counts


def _convert_stsb_csv(src: Path, dst: Path) -> int:
    """Convert a raw STS Benchmark ``sts-<split>.csv`` (TAB-separated, no quoting) to the pair TSV.

    Columns are genre, filename, year, id, score, sentence1, sentence2 and optional licence fields; only
    score and the two sentences are kept.
    """
    rows: list[tuple[str, str, str]] = []
    for number, line in enumerate(_decode_source(src.read_bytes(), str(src)), start=1):
        if not line:
            continue
        fields = line.split("\t")
        if len(fields) < 7:
            raise InputError(f"{src}: line {number} has {len(fields)} fields, expected at least 7")
        rows.append((fields[4].strip(), fields[5], fields[6]))
    return _write_pairs_tsv(dst, "score\tsentence1\tsentence2", rows)


def _convert_sick(src: Path, dst: Path) -> int:
    """Convert an official SICK file (header pair_ID, sentence_A, sentence_B, relatedness_score, ...)."""
    lines = _decode_source(src.read_bytes(), str(src))
    if not lines:
        raise InputError(f"{src} is empty")
    header = lines[0].split("\t")
    try:
        i_a, i_b, i_s = (header.index(c) for c in ("sentence_A", "sentence_B", "relatedness_score"))
    except ValueError:
        raise InputError(f"{src}: unexpected SICK header {header!r}") from None
    rows: list[tuple[str, str, str]] = []
    for number, line in enumerate(lines[1:], start=2):
        if not line:
            continue
        fields = line.split("\t")
        if len(fields) < len(header):
            raise InputError(f"{src}: line {number} has {len(fields)} fields, expected {len(header)}")
        rows.append((fields[i_s].strip(), fields[i_a], fields[i_b]))
    return _write_pairs_tsv(dst, "score\tsentence1\tsentence2", rows)


def _convert_snli_jsonl(src: Path, dst: Path) -> int:
    """Convert an SNLI 1.0 ``.jsonl`` split to ``label<TAB>sentence1<TAB>sentence2``, dropping gold ``-``."""
    import json

    rows: list[tuple[str, str, str]] = []
    for line in _decode_source(src.read_bytes(), str(src)):
        if not line.strip():
            continue
        record = json.loads(line)
        if record.get("gold_label", "-") == "-":
            continue
        rows.append((record["gold_label"], record["sentence1"], record["sentence2"]))
    return _write_pairs_tsv(dst, "label\tsentence1\tsentence2", rows)


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
        host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
        proxy = proxies.get(parts.scheme)
        if proxy and not urllib.request.proxy_bypass(parts.hostname):
            proxy_parts = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
            if proxy_parts.hostname:
                host = proxy_parts.hostname
                port = proxy_parts.port or (443 if proxy_parts.scheme == "https" else 80)
        hosts.setdefault((host, port), url)
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


def download_sts(
    cache_dir: str | Path | None = None,
    *,
    include_nli: bool = False,
    force: bool = False,
    connect_timeout: float = 5.0,
    read_timeout: float = 60.0,
) -> Path:
    """Download the original STS12-16, STS Benchmark and SICK releases and build the TSV layout.

    Sources are the archives SentEval's data script uses: the SemEval STS 2012-2016 English test packages
    (``STS.input.*`` / ``STS.gs.*``; STS13 without the LDC-licensed SMT subset), the STS Benchmark tarball
    (columns score, sentence1, sentence2 of ``sts-{train,dev,test}.csv``) and SICK (``SICK_train``,
    ``SICK_trial``, ``SICK_test_annotated``; relatedness score). Only scored pairs are kept, text is raw
    (not SentEval's tokenized and lowercased copy), and the pair counts are checked against the official
    ones. The reachability of every host is probed first, so without network the call fails within about
    ``connect_timeout`` seconds.

    Args:
        cache_dir: Output folder (default ``~/.cache/bertflow/sts``, one of the folders
            :func:`resolve_data_dir` looks in). Existing files of the layout are overwritten; nothing else
            in the folder is touched.
        include_nli: Also build ``NLI/snli_{dev,test}.tsv`` from the SNLI 1.0 zip (about 90 MB download).
            Its text is raw SNLI, not the SentEval-tokenized text of the shipped copy.
        force: Rebuild even if a previous download completed.
        connect_timeout: Seconds allowed for reaching the hosts.
        read_timeout: Seconds allowed for any single network read.

    Returns:
        The data folder, ready for ``load_sts_tasks(data_dir=...)``.

    Raises:
        DataNotFoundError: A host is unreachable or a download fails; the message says how to use a local
            copy instead.
        InputError: A downloaded file does not have the expected content.
    """
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
    counts: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="bertflow-sts-") as tmp_name:
        tmp = Path(tmp_name)
        for year, (url, input_pattern, gs_pattern, subsets) in _SEMEVAL_YEARS.items():
            logger.info("downloading %s from %s", year, url)
            unpacked = tmp / year
            unpacked.mkdir()
            _safe_extract(_download(url, tmp / f"{year}.zip", read_timeout), unpacked)
            per_subset = _convert_semeval_year(unpacked, target / year, subsets, input_pattern, gs_pattern)
            counts[year] = sum(per_subset.values())
        logger.info("downloading STS Benchmark from %s", _STSB_URL)
        stsb = tmp / "stsb"
        stsb.mkdir()
        _safe_extract(_download(_STSB_URL, tmp / "stsb.tar.gz", read_timeout), stsb)
        for split in ("train", "dev", "test"):
            csv_path = _find_file(stsb, f"sts-{split}.csv")
            n = _convert_stsb_csv(csv_path, target / "STSBenchmark" / f"{split}.tsv")
            if split == "test":
                counts["STS-B"] = n
        for fname, url in _SICK_URLS.items():
            logger.info("downloading SICK %s from %s", fname, url)
            n = _convert_sick(_download(url, tmp / f"sick-{fname}", read_timeout), target / "SICK" / fname)
            if fname == "test.tsv":
                counts["SICK-R"] = n
        if include_nli:
            logger.info("downloading SNLI 1.0 from %s", _SNLI_URL)
            snli = tmp / "snli"
            snli.mkdir()
            _safe_extract(_download(_SNLI_URL, tmp / "snli.zip", read_timeout), snli)
            for split in ("dev", "test"):
                jsonl = _find_file(snli, f"snli_1.0_{split}.jsonl")
                _convert_snli_jsonl(jsonl, target / "NLI" / f"snli_{split}.tsv")
    wrong = {t: n for t, n in counts.items() if n != task_spec(t).official_pairs}
    if wrong:
        detail = ", ".join(f"{t}: {n} (official {task_spec(t).official_pairs})" for t, n in wrong.items())
        raise InputError(f"downloaded data in {target} has unexpected pair counts: {detail}")
    marker.write_text("complete\n", encoding="utf-8")
    logger.info("STS data ready in %s", target)
    return target
