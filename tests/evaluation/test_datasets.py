"""Tests of the STS catalog (bertflow.evaluation.datasets): data folder, tasks, the real shared data."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from bertflow.errors import DataNotFoundError, InputError
from bertflow.evaluation import datasets
from bertflow.evaluation.datasets import (
    DATA_DIR_ENV,
    STS_TASKS,
    StsTask,
    TaskSpec,
    load_nli_sentences,
    load_sts_task,
    load_sts_tasks,
    resolve_data_dir,
    task_spec,
)
from bertflow.io.text import SentencePairs

from ..conftest import write_file

# ------------------------------------------------------------------------------------------------------
# Data folder resolution
# ------------------------------------------------------------------------------------------------------


def test_resolve_data_dir_takes_the_folder_and_searches_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The library has no default folder: no environment, no ``../shared`` relative to the working directory (the
    CLI's ``--data-dir`` default does that search, tests/cli/test_evaluate.py)."""
    explicit = tmp_path / "explicit"
    explicit.mkdir()
    assert resolve_data_dir(explicit) == explicit.resolve()
    monkeypatch.setenv(DATA_DIR_ENV, str(explicit))
    (tmp_path / "shared/data/sts").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match="no STS data folder given"):
        resolve_data_dir(None)
    with pytest.raises(InputError, match="no STS data folder given"):
        load_sts_tasks(["STS-B"])
    with pytest.raises(DataNotFoundError, match="does not exist"):
        resolve_data_dir(tmp_path / "nope")


# ------------------------------------------------------------------------------------------------------
# STS tasks on a synthetic layout
# ------------------------------------------------------------------------------------------------------


def _pairs_tsv(rows: list[tuple[str, str, str]]) -> str:
    return "score\tsentence1\tsentence2\n" + "".join(f"{s}\t{a}\t{b}\n" for s, a, b in rows)


@pytest.fixture
def tiny_layout(tmp_path: Path) -> Path:
    root = tmp_path / "sts"
    write_file(root / "STS12/MSRpar.tsv", _pairs_tsv([("1", "a", "b"), ("2", "c", "a")]))
    write_file(root / "STS12/surprise.OnWN.tsv", _pairs_tsv([("3", "d", "a")]))
    write_file(root / "STS12/headlines.tsv", _pairs_tsv([("4", "e", "f")]))
    write_file(root / "STSBenchmark/train.tsv", _pairs_tsv([("1", "tr1", "tr2"), ("2", "shared", "tr3")]))
    write_file(root / "STSBenchmark/dev.tsv", _pairs_tsv([("1", "dv1", "shared")]))
    write_file(root / "STSBenchmark/test.tsv", _pairs_tsv([("1", "te1", "te2"), ("5", "te1", "shared")]))
    write_file(root / "SICK/train.tsv", _pairs_tsv([("1", "k1", "k2")]))
    write_file(root / "SICK/trial.tsv", _pairs_tsv([("1", "k3", "k4")]))
    write_file(root / "SICK/test.tsv", _pairs_tsv([("1", "k5", "k6")]))
    write_file(root / "NLI/snli_dev.tsv", "label\tsentence1\tsentence2\nneutral\tp\th\nentailment\tp\th2\n")
    write_file(root / "NLI/snli_test.tsv", "label\tsentence1\tsentence2\ncontradiction\th\tq\n")
    return root


def test_year_task_subsets_in_senteval_order(tiny_layout: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="bertflow.evaluation.datasets"):
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
    assert [task_spec(n).name for n in ("sts12", "STS-B", "sts_b", "STSBenchmark", "sick-r", "sick")] == [
        "STS12",
        "STS-B",
        "STS-B",
        "STS-B",
        "SICK-R",
        "SICK-R",
    ]


def test_a_data_set_is_one_record(tiny_layout: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Adding a data set in the TSV layout is adding its TaskSpec: names, aliases, folder, splits and the official
    count all come from the record."""
    assert STS_TASKS == tuple(spec.name for spec in datasets.TASK_SPECS)
    toy = TaskSpec("TOY-R", "Toy", 2, {"train": "a.tsv", "dev": "b.tsv", "test": "c.tsv"}, ("toy relatedness",))
    monkeypatch.setattr(datasets, "TASK_SPECS", (*datasets.TASK_SPECS, toy))
    for split, name in (("train", "a"), ("dev", "b"), ("test", "c")):
        write_file(
            tiny_layout / "Toy" / f"{name}.tsv", _pairs_tsv([("1", f"{split} 1", f"{split} 2"), ("2", "x", "y")])
        )
    task = load_sts_task("Toy Relatedness", tiny_layout)
    assert task.name == "TOY-R" and task.has_train_split and task.n_eval_pairs == 2
    assert task.fit_sentences("train") == ["train 1", "train 2", "x", "y"]
    assert task_spec("toy").name == "TOY-R"


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
    with caplog.at_level(logging.WARNING, logger="bertflow.evaluation.datasets"):
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
