"""The STS benchmark catalog: one :class:`TaskSpec` record per data set (:data:`TASK_SPECS`), where the data lives,
and loading tasks and the NLI fitting sentences. Adding a data set in the same TSV layout is adding its record."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from bertflow.errors import DataNotFoundError, InputError

from ..io.text import SentencePairs, distinct, read_pairs

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskSpec:
    """Everything bertflow knows about one STS data set: its ``name`` in reports and on the command line
    (``"STS-B"``), its ``folder`` in the data directory (``"STSBenchmark"``), its ``official_pairs`` as SentEval
    evaluates it (another count is warned about, and refused by the download), its ``split_files`` (``{"train": file,
    "dev": file, "test": file}``, evaluated on ``test``; ``None`` for a test-only set, whose subsets are every
    ``*.tsv`` of its folder) and other names accepted for it, ``aliases`` (compared without case, ``-``, ``_``,
    spaces)."""

    name: str
    folder: str
    official_pairs: int
    split_files: Mapping[str, str] | None = None
    aliases: tuple[str, ...] = ()


TASK_SPECS: tuple[TaskSpec, ...] = (
    TaskSpec("STS12", "STS12", 3108),
    TaskSpec("STS13", "STS13", 1500),  # without the LDC-licensed SMT subset
    TaskSpec("STS14", "STS14", 3750),
    TaskSpec("STS15", "STS15", 3000),
    TaskSpec("STS16", "STS16", 1186),
    TaskSpec("STS-B", "STSBenchmark", 1379, {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}),
    TaskSpec(
        "SICK-R", "SICK", 4927, {"train": "train.tsv", "dev": "trial.tsv", "test": "test.tsv"}, ("SICK relatedness",)
    ),
)
"""The seven STS tasks of the BERT-flow / SimCSE evaluation, in the papers' column order."""

STS_TASKS: tuple[str, ...] = tuple(spec.name for spec in TASK_SPECS)
"""Their names, in that order."""


def _key(name: str) -> str:
    return name.replace("-", "").replace("_", "").replace(" ", "").upper()


def task_spec(name: str) -> TaskSpec:
    """The :class:`TaskSpec` of a task name, its folder name or an alias (``"stsb"``, ``"STSBenchmark"``, ``"sick"``);
    InputError listing the valid names for another."""
    for spec in TASK_SPECS:
        if _key(name) in {_key(n) for n in (spec.name, spec.folder, *spec.aliases)}:
            return spec
    raise InputError(f"unknown STS task {name!r}; expected one of {', '.join(STS_TASKS)}")


DATA_DIR_ENV = "BERTFLOW_DATA_DIR"
"""Environment variable the CLI reads for the STS data folder when ``--data-dir`` is not given (the library reads
no environment: its functions take the folder)."""

DEFAULT_CACHE_DIR = Path("~/.cache/bertflow/sts")
"""Where :func:`download_sts` builds the data by default (``~`` is expanded at call time)."""

HOW_TO_GET_DATA = (  # how to get the data, appended to every "not found" error
    "Point bertflow at a local copy of the STS data with --data-dir PATH or the environment variable "
    f"{DATA_DIR_ENV}=PATH (the folder holding STS12 ... STS16, STSBenchmark, SICK), or, with internet "
    "access, download it once with `bertflow download-sts` (Python: bertflow.evaluation.download.download_sts()), "
    f"which builds it in {DEFAULT_CACHE_DIR}."
)

USE_LOCAL_COPY = (
    "Without network access, get the data folder (STS12 ... STS16, STSBenchmark, SICK as TSV files) "
    "some other way and point bertflow at it with --data-dir PATH or the environment variable "
    f"{DATA_DIR_ENV}=PATH."
)


def resolve_data_dir(data_dir: str | Path | None) -> Path:
    """The STS data folder ``data_dir``, checked and made absolute (so a later change of directory does not
    invalidate it). There is no default: the caller names the folder (the CLI's ``--data-dir`` has one,
    :func:`bertflow.cli.evaluate.find_data_dir`). InputError for ``None``; DataNotFoundError for a missing folder,
    saying how to point at a local copy and how to download the data."""
    if data_dir is None:
        raise InputError(
            f"no STS data folder given: pass data_dir (the folder holding STS12 ... SICK). {HOW_TO_GET_DATA}"
        )
    p = Path(data_dir).expanduser()
    if not p.is_dir():
        raise DataNotFoundError(f"STS data folder {p} does not exist. {HOW_TO_GET_DATA}")
    return p.resolve()


@dataclass
class StsTask:
    """One STS task (``name`` from :data:`STS_TASKS`): ``eval_subsets``, its evaluation pairs by subset (STS12-16:
    every subset of the year, ``"MSRpar"`` ...; STS-B and SICK-R: ``{"test": ...}``), and ``splits``, all its pairs by
    split (STS-B and SICK-R: ``train``, ``dev`` (SICK's ``trial``), ``test``; STS12-16: the evaluation subsets)."""

    name: str
    eval_subsets: dict[str, SentencePairs]
    splits: dict[str, SentencePairs] = field(default_factory=dict)

    @property
    def n_eval_pairs(self) -> int:
        """Number of evaluation pairs over all subsets."""
        return sum(len(pairs) for pairs in self.eval_subsets.values())

    @property
    def has_train_split(self) -> bool:
        """Whether the task has a labelled train split (STS-B and SICK-R only)."""
        return task_spec(self.name).split_files is not None

    def fit_sentences(self, regime: Literal["target", "train"] = "target") -> list[str]:
        """Distinct unlabelled sentences to fit a calibrator on, in order of first occurrence (split by split, pair by
        pair, ``s1`` before ``s2``). ``"target"``: every sentence of the task (train + dev + test for STS-B and SICK-R,
        all subsets for STS12-16), BERT-flow's transductive default (it sees the test sentences, never the scores);
        ``"train"``: the train split only (STS-B and SICK-R). The "nli" regime is :func:`load_nli_sentences`.
        InputError for another regime, or ``"train"`` for a task without a train split (STS12-16)."""
        if regime == "target":
            chosen = list(self.splits.values()) or list(self.eval_subsets.values())
        elif regime == "train":
            if not self.has_train_split or "train" not in self.splits:
                raise InputError(
                    f"{self.name} has no train split (STS12-16 are test-only); use regime='target' or fit "
                    "on another corpus (e.g. load_nli_sentences())"
                )
            chosen = [self.splits["train"]]
        else:
            raise InputError(f"regime must be 'target' or 'train', got {regime!r}")
        return distinct(s for pairs in chosen for s in pairs.sentences())

    def eval_sentences(self) -> list[str]:
        """Distinct sentences of the evaluation pairs, in order of first occurrence."""
        return distinct(s for pairs in self.eval_subsets.values() for s in pairs.sentences())


def _read_data_file(path: Path) -> SentencePairs:
    if not path.is_file():
        raise DataNotFoundError(f"missing STS data file {path}. {HOW_TO_GET_DATA}")
    return read_pairs(path)


def load_sts_task(name: str, data_dir: str | Path) -> StsTask:
    """Load one STS task (a name or alias, :func:`task_spec`) from the TSV layout in ``data_dir``.

    STS12-16 subsets are every ``*.tsv`` in the year's folder, ordered case-insensitively by name (SentEval's order).
    A pair count other than the official one is logged as a warning (results would not be comparable with published
    numbers). InputError for an unknown task or a malformed file; DataNotFoundError for a missing folder or file."""
    spec = task_spec(name)
    task, folder = spec.name, resolve_data_dir(data_dir) / spec.folder
    if not folder.is_dir():
        raise DataNotFoundError(f"{task}: folder {folder} does not exist. {HOW_TO_GET_DATA}")
    if spec.split_files is not None:
        splits = {split: _read_data_file(folder / fname) for split, fname in spec.split_files.items()}
        subsets = {"test": splits["test"]}
    else:
        files = sorted(folder.glob("*.tsv"), key=lambda f: (f.name.lower(), f.name))
        if not files:
            raise DataNotFoundError(f"{task}: no subset files (*.tsv) in {folder}. {HOW_TO_GET_DATA}")
        subsets = {f.stem: _read_data_file(f) for f in files}
        splits = dict(subsets)
    result = StsTask(task, subsets, splits)
    if result.n_eval_pairs != spec.official_pairs:
        logger.warning("%s has %d evaluation pairs in %s, the official count is %d: scores are not comparable with "
                       "published results", task, result.n_eval_pairs, folder, spec.official_pairs)  # fmt: skip
    return result


def load_sts_tasks(names: Sequence[str] = STS_TASKS, data_dir: str | Path | None = None) -> dict[str, StsTask]:
    """Load several STS tasks from the folder ``data_dir`` (required), keyed by canonical task name, in the given
    order."""
    root = resolve_data_dir(data_dir)
    return {task.name: task for task in (load_sts_task(name, root) for name in names)}


def load_nli_sentences(data_dir: str | Path) -> list[str]:
    """Distinct sentences of SNLI dev + test (``NLI/snli_dev.tsv``, ``NLI/snli_test.tsv`` in ``data_dir``) in order
    of first occurrence: the "nli" regime, a stand-in for BERT-flow's full SNLI + MultiNLI, which the data folder
    lacks; DataNotFoundError when the files are missing."""
    root = resolve_data_dir(data_dir)
    parts = [_read_data_file(root / "NLI" / fname) for fname in ("snli_dev.tsv", "snli_test.tsv")]
    return distinct(s for pairs in parts for s in pairs.sentences())
