"""The per-set protocol (bertflow.paper.perset), its summaries (results.summarize_sets), the leave-one-dataset-out
selection (bertflow.paper.lodo) and `bertflow reproduce/evaluate --regimes per-set`, on a tiny BERT and a
synthetic STS layout."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from bertflow import SentenceEncoder
from bertflow.cli import app
from bertflow.errors import BertflowError, InputError
from bertflow.evaluation import evaluate_pairs
from bertflow.evaluation.datasets import STS_TASKS, load_sts_tasks
from bertflow.paper import perset as perset_module
from bertflow.paper.grid import GridConfig, run_grid
from bertflow.paper.lodo import Objective, leave_one_dataset_out, select_lodo
from bertflow.paper.perset import evaluation_sets, fitting_sample, run_per_set
from bertflow.paper.results import summarize_sets

from ..sts_layout import one_torch_thread, working_tiny_bert, write_sts_layout  # noqa: F401 - fixtures

runner = CliRunner()


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sts_layout(tmp_path_factory.mktemp("sts-per-set"))


@pytest.fixture(scope="module")
def encoder(working_tiny_bert: Path) -> SentenceEncoder:  # noqa: F811 - the imported fixture
    return SentenceEncoder(str(working_tiny_bert), pooling="mean", device="cpu")


def _config(layout: Path, **kwargs: object) -> GridConfig:
    base: dict[str, object] = {"regimes": ["per-set"], "data_dir": layout, "use_cache": False}
    return GridConfig(**{**base, **kwargs})  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------------
# Sets and samples
# ------------------------------------------------------------------------------------------------------


def test_sets_are_subsets_with_their_own_fitting_sentences(layout: Path) -> None:
    tasks = load_sts_tasks(STS_TASKS, layout)
    sets = {s.name: s for s in evaluation_sets(tasks)}
    assert list(sets) == [
        "STS12/MSRpar", "STS12/OnWN", "STS13/FNWN", "STS14/images", "STS15/belief", "STS16/headlines",
        "STS16/plagiarism", "STS-B", "SICK-R",
    ]  # fmt: skip
    onwn = sets["STS12/OnWN"]
    assert onwn.dataset == "STS12" and list(onwn.sentences) == list(dict.fromkeys(onwn.pairs.sentences()))
    assert set(onwn.sentences).isdisjoint(sets["STS12/MSRpar"].sentences)
    # STS-B / SICK-R: scored on test, fitted on every split's sentences (as the target regime).
    assert sets["STS-B"].pairs is tasks["STS-B"].eval_subsets["test"]
    assert list(sets["SICK-R"].sentences) == tasks["SICK-R"].fit_sentences("target")
    assert len(sets["SICK-R"].sentences) > len(sets["SICK-R"].eval_sentences())


def test_fitting_samples_are_seeded_nested_and_only_where_the_set_is_larger(layout: Path) -> None:
    es = next(s for s in evaluation_sets(load_sts_tasks(["STS-B"], layout)))
    n = len(es.sentences)
    assert fitting_sample(es, None) == list(es.sentences)
    small, large = fitting_sample(es, 10), fitting_sample(es, 30)
    assert small is not None and large is not None and len(small) == 10 and len(large) == 30
    assert len(set(large)) == 30 and set(large) <= set(es.sentences)
    assert set(small) <= set(large)  # nested across sizes
    assert large == [s for s in es.sentences if s in set(large)]  # in the set's order
    assert fitting_sample(es, 30) == large and fitting_sample(es, 30, seed=1) != large
    assert fitting_sample(es, n) is None and fitting_sample(es, n - 1) is not None


# ------------------------------------------------------------------------------------------------------
# Summaries
# ------------------------------------------------------------------------------------------------------


def test_summary_against_a_hand_computation() -> None:
    raw = {"a": 50.0, "b": 60.0, "c": 70.0, "d": 40.0, "e": 30.0}
    got = {"a": 55.0, "b": 57.5, "c": 67.9, "d": 41.0, "e": math.nan}
    s = summarize_sets(got, raw)
    assert s is not None
    # e is left out (undefined); deltas a +5, b -2.5, c -2.1, d +1.
    assert s.n_sets == 4 and s.worst_set == "b" and s.worst_delta == pytest.approx(-2.5)
    assert s.n_below == 2  # b and c are more than 2 below; exactly -2 would not count
    assert s.mean == pytest.approx((55 + 57.5 + 67.9 + 41) / 4)
    assert s.mean_delta == pytest.approx((5 - 2.5 - 2.1 + 1) / 4)
    assert summarize_sets({"a": 48.0}, {"a": 50.0}).n_below == 0  # type: ignore[union-attr]
    assert summarize_sets({"a": 47.0}, {"a": 50.0}, margin=3.5).n_below == 0  # type: ignore[union-attr]
    assert summarize_sets({"x": 1.0}, raw) is None


# ------------------------------------------------------------------------------------------------------
# The protocol
# ------------------------------------------------------------------------------------------------------


def test_each_set_is_fitted_on_its_own_sample_only(
    encoder: SentenceEncoder, layout: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fitted: list[np.ndarray] = []
    real = perset_module.parse_calibrator

    def spying(spec: str, **kwargs: object):  # noqa: ANN202 - a calibrator
        cal = real(spec, **kwargs)
        fit = cal.fit

        def record(X: np.ndarray, *a: object, **k: object):  # noqa: ANN202
            fitted.append(np.array(X))
            return fit(X, *a, **k)

        cal.fit = record  # type: ignore[method-assign]
        return cal

    monkeypatch.setattr(perset_module, "parse_calibrator", spying)
    config = _config(layout, poolings=["mean"], calibrators=["standard-norm"], fit_sizes=[30])
    result = run_per_set(config, encoder=encoder)
    sets = evaluation_sets(load_sts_tasks(STS_TASKS, layout))
    expected = []
    for size in (None, 30):  # the run's order: size, then set
        for es in sets:
            sample = fitting_sample(es, size)
            if sample is not None:
                expected.append(sample)
    assert len(fitted) == len(expected)
    for X, sample in zip(fitted, expected, strict=True):
        assert X.shape == (len(sample), encoder.dim)
        assert np.allclose(X, encoder.encode(sample), atol=1e-5)  # exactly that set's sentences, nothing else
    # The plagiarism subset has at most 24 sentences: not scored at 30, and the fits say so.
    assert result.fits["STS16/plagiarism"]["30"] is None
    assert result.fits["STS-B"]["30"] == {"n_fit": 30, "seen": result.fits["STS-B"]["30"]["seen"]}
    cell = next(c for c in result.cells if c.fit_size == 30)
    assert "STS16/plagiarism" not in cell.scores() and "STS-B" in cell.scores()


def test_scores_and_summaries_equal_direct_computation(encoder: SentenceEncoder, layout: Path) -> None:
    from bertflow import WhiteningCalibrator

    result = run_per_set(
        _config(layout, poolings=["mean"], calibrators=["none", "whitening"], fit_sizes=[30]), encoder=encoder
    )
    sets = {s.name: s for s in evaluation_sets(load_sts_tasks(STS_TASKS, layout))}
    # One raw row: it does not depend on the fitting size.
    assert sorted((c.pooling, c.calibrator, c.fit_size or 0) for c in result.cells) == [
        ("mean", "none", 0), ("mean", "whitening", 0), ("mean", "whitening", 30),
    ]  # fmt: skip
    raw = next(c for c in result.cells if c.calibrator == "none")
    white = next(c for c in result.cells if c.calibrator == "whitening" and c.fit_size is None)
    for name in ("STS12/OnWN", "SICK-R"):
        es = sets[name]
        direct_raw = evaluate_pairs(name, {name: es.pairs}, encoder.encode).subsets[0].spearman
        assert raw.scores()[name] == pytest.approx(direct_raw, abs=1e-4)
        cal = WhiteningCalibrator().fit(encoder.encode(list(es.sentences)))
        direct = evaluate_pairs(name, {name: es.pairs}, lambda s, cal=cal: cal.transform(encoder.encode(s)))
        assert white.scores()[name] == pytest.approx(direct.subsets[0].spearman, abs=1e-3)
    summary = result.summary(white)
    assert summary == summarize_sets(white.scores(), raw.scores())
    assert summary is not None and summary.n_sets == len(sets)
    assert result.summary(raw) is None  # the baseline is not summarised against itself
    data = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    got = next(c for c in data["cells"] if c["calibrator"] == "whitening" and c["fit_size"] is None)
    assert got["summary_vs_raw"]["worst_set"] == summary.worst_set
    assert got["summary_vs_raw"]["n_below"] == summary.n_below
    md = result.to_markdown()
    row = next(line for line in md.splitlines() if line.startswith("| mean | whitening | all |"))
    assert f"{summary.worst_set} ({summary.worst_delta:+.2f})" in row and "## Per set, fit 30" in md
    assert "without weighting or calibrator" in md


def test_weighted_pooling_counts_tokens_in_the_fitting_sample(
    encoder: SentenceEncoder, layout: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted: list[list[str]] = []
    real = encoder.count_tokens

    def spying(sentences, **kwargs):  # noqa: ANN001, ANN202
        counted.append(list(sentences))
        return real(sentences, **kwargs)

    monkeypatch.setattr(encoder, "count_tokens", spying)
    assert encoder.token_statistics is None
    tasks = load_sts_tasks(["STS13", "STS-B"], layout)
    config = _config(layout, poolings=["sif:mean"], calibrators=["standard-norm"], fit_sizes=[20])
    result = run_per_set(config, encoder=encoder, tasks=tasks)
    assert encoder.token_statistics is None  # the caller's encoder is left as it was
    sets = evaluation_sets(tasks)
    assert counted == [fitting_sample(es, size) for size in (None, 20) for es in sets]
    cells = {(c.pooling, c.calibrator, c.fit_size): c for c in result.cells}
    # Raw = the unweighted base pooling; the weighted pooling uncalibrated is a row of each size.
    assert set(cells) == {
        ("mean", "none", None), ("sif-mean", "none", None), ("sif-mean", "standard-norm", None),
        ("sif-mean", "none", 20), ("sif-mean", "standard-norm", 20),
    }  # fmt: skip
    es = next(s for s in sets if s.name == "STS-B")
    sample = fitting_sample(es, 20)
    weighted = SentenceEncoder(
        encoder.model_id, pooling="sif:mean", model=encoder.model, tokenizer=encoder.tokenizer, device="cpu"
    )
    weighted.token_statistics = real(sample)
    direct = evaluate_pairs("STS-B", {"STS-B": es.pairs}, weighted.encode).subsets[0].spearman
    assert cells[("sif-mean", "none", 20)].scores()["STS-B"] == pytest.approx(direct, abs=1e-4)
    wcell = cells[("sif-mean", "standard-norm", 20)]
    assert result.raw_cell(wcell) is cells[("mean", "none", None)]
    assert result.weighted_raw_cell(wcell) is cells[("sif-mean", "none", 20)]
    both = result.summary(wcell, against="weighted-raw")
    assert both == summarize_sets(wcell.scores(), cells[("sif-mean", "none", 20)].scores())


def test_bad_per_set_arguments(encoder: SentenceEncoder, layout: Path) -> None:
    with pytest.raises(InputError, match="runs alone"):
        run_per_set(_config(layout, regimes=["per-set", "target"]), encoder=encoder)
    with pytest.raises(InputError, match="at least 2"):
        run_per_set(_config(layout, fit_sizes=[1]), encoder=encoder)
    with pytest.raises(InputError, match="per-set"):
        run_grid(GridConfig(regimes=["per-set"], data_dir=layout), encoder=encoder)
    with pytest.raises(InputError, match="fit sizes"):
        run_grid(GridConfig(regimes=["target"], fit_sizes=[10], data_dir=layout), encoder=encoder)


# ------------------------------------------------------------------------------------------------------
# Leave-one-dataset-out
# ------------------------------------------------------------------------------------------------------

DATASET_OF = {"A/1": "STS12", "A/2": "STS12", "B": "STS13", "C": "STS14", "D": "STS-B"}


def _table() -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    raw = {"A/1": 50.0, "A/2": 50.0, "B": 50.0, "C": 50.0, "D": 50.0}
    scores = {
        "raw": dict(raw),
        # Great on STS12, collapses elsewhere: never picked when STS12 is not what it is chosen on.
        "greedy": {"A/1": 60.0, "A/2": 60.0, "B": 40.0, "C": 45.0, "D": 40.0},
        "robust": {"A/1": 51.0, "A/2": 51.0, "B": 53.0, "C": 53.0, "D": 53.0},
    }
    return scores, {c: raw for c in scores}


def test_lodo_picks_on_the_other_datasets_only() -> None:
    scores, raw = _table()
    sel = leave_one_dataset_out(scores, raw, DATASET_OF)
    picks = {f.held_out: f.picked for f in sel.folds}
    assert picks == {"STS12": "robust", "STS13": "robust", "STS14": "robust", "STS-B": "robust"}
    # The objective by hand: mean 49 minus one point for each of the three sets more than 2 below raw.
    assert Objective()(scores["greedy"], raw["greedy"], list(DATASET_OF)) == pytest.approx(49 - 3)
    assert sel.in_sample == "robust" and sel.candidates == ["raw", "greedy", "robust"]
    # Held-out scores are the picked candidate's on the held-out sets, pooled over folds.
    sts12 = sel.folds[0]
    assert sts12.held_out_sets == ("A/1", "A/2") and sts12.summary.mean == pytest.approx(51.0)
    assert sel.pooled.n_sets == 5 and sel.pooled.mean == pytest.approx(np.mean([51, 51, 53, 53, 53]))
    assert sel.pooled.n_below == 0


def test_lodo_never_uses_the_held_out_scores_to_pick() -> None:
    scores, raw = _table()
    rng = random.Random(0)
    base = leave_one_dataset_out(scores, raw, DATASET_OF)
    for fold in base.folds:
        for _ in range(20):
            shaken = {c: dict(v) for c, v in scores.items()}
            for c in shaken:
                for s in fold.held_out_sets:
                    shaken[c][s] = rng.uniform(-100, 100)
            again = leave_one_dataset_out(shaken, raw, DATASET_OF)
            f = next(x for x in again.folds if x.held_out == fold.held_out)
            assert f.picked == fold.picked and f.objective == pytest.approx(fold.objective)
            # ... and its objective is the objective on the other sets, computed by hand.
            others = [s for s in DATASET_OF if DATASET_OF[s] != fold.held_out]
            assert f.objective == pytest.approx(Objective()(scores[f.picked], raw[f.picked], others))


def test_lodo_penalty_and_errors() -> None:
    scores, raw = _table()
    # Spiky: +20 on STS12's two sets, 3 below raw on every other set.
    scores["spiky"] = {"A/1": 70.0, "A/2": 70.0, "B": 47.0, "C": 47.0, "D": 47.0}
    raw["spiky"] = raw["raw"]
    # Held out STS13: spiky's mean on the others is 58.5 against robust's 52, with two harmed sets.
    for penalty, pick in ((0.0, "spiky"), (1.0, "spiky"), (4.0, "robust")):
        sel = leave_one_dataset_out(scores, raw, DATASET_OF, objective=Objective(penalty=penalty))
        assert {f.held_out: f.picked for f in sel.folds}["STS13"] == pick
    # A larger margin forgives a 3-point loss.
    sel = leave_one_dataset_out(scores, raw, DATASET_OF, objective=Objective(margin=3.5, penalty=4.0))
    assert {f.held_out: f.picked for f in sel.folds}["STS13"] == "spiky"
    with pytest.raises(InputError, match="no score or baseline"):
        leave_one_dataset_out({"x": {"A/1": 1.0}}, {"x": {"A/1": 1.0}}, DATASET_OF)
    scores["raw"]["B"] = math.nan  # an undefined correlation is never picked as a maximum
    with pytest.raises(InputError, match="'raw' has no score or baseline on B"):
        leave_one_dataset_out(scores, raw, DATASET_OF)
    with pytest.raises(InputError, match="two datasets"):
        leave_one_dataset_out(scores, raw, {"A/1": "STS12", "A/2": "STS12"})


def test_select_lodo_on_a_run(encoder: SentenceEncoder, layout: Path) -> None:
    result = run_per_set(
        _config(layout, poolings=["mean", "cls"], calibrators=["none", "whitening", "standard-norm"], fit_sizes=[30]),
        encoder=encoder,
    )
    selections = select_lodo(result)
    assert [s.fit_size for s in selections] == [None, 30]
    full, small = selections
    assert len(full.folds) == 7 and full.pooled.n_sets == 9
    expected = {f"{p} / {c}" for p in ("mean", "cls") for c in ("none", "whitening", "standard-norm")}
    assert set(full.candidates) == expected
    assert small.pooled.n_sets == 8  # the plagiarism subset has too few sentences for 30
    assert "mean / none" in small.candidates  # the raw encoder is a candidate at every size
    for fold in full.folds:
        held = set(fold.held_out_sets)
        assert held == {s for s, v in result.sets.items() if v["dataset"] == fold.held_out}


# ------------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------------


def _invoke(*args: object):  # noqa: ANN202 - a click Result
    result = runner.invoke(app, [str(a) for a in args])
    if result.exception and not isinstance(result.exception, (SystemExit, BertflowError)):
        raise result.exception
    return result


def test_cli_reproduce_per_set_with_lodo(working_tiny_bert: Path, layout: Path, tmp_path: Path) -> None:  # noqa: F811
    out = tmp_path / "per-set"
    r = _invoke(
        "reproduce", "--model", working_tiny_bert, "--poolings", "mean", "--calibrators", "none,standard-norm",
        "--regimes", "per-set", "--fit-sizes", "30", "--select", "lodo", "--data-dir", layout, "--no-cache",
        "-o", out, "-q",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    data = json.loads((out / "reproduce.json").read_text())
    assert data["meta"]["fit_sizes"] == ["all", "30"] and len(data["sets"]) == 9
    assert [x["fit_size"] for x in data["lodo"]] == [None, 30]
    md = (out / "reproduce.md").read_text()
    assert md == r.stdout and "--regimes per-set --fit-sizes 30 --select lodo" in md
    assert "## Leave-one-dataset-out selection, fit all" in md and "| **all held out** |" in md

    ev = _invoke(
        "evaluate", "--model", working_tiny_bert, "--calibrator", "standard-norm", "--regime", "per-set",
        "--tasks", "STS-B,STS12", "--data-dir", layout, "--no-cache", "-o", tmp_path / "ev", "-q",
    )  # fmt: skip
    assert ev.exit_code == 0, ev.output
    data = json.loads((tmp_path / "ev" / "evaluate.json").read_text())
    assert "--regime per-set" in data["meta"]["command"]  # the report's command re-runs the same protocol
    cells = data["cells"]
    assert [(c["calibrator"], sorted(c["sets"])) for c in cells] == [
        ("none", ["STS-B", "STS12/MSRpar", "STS12/OnWN"]),
        ("standard-norm", ["STS-B", "STS12/MSRpar", "STS12/OnWN"]),
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["reproduce", "--fit-sizes", "100"], "--fit-sizes belongs to the per-set regime"),
        (["reproduce", "--regimes", "per-set", "--fit-sizes", "1e3"], "whole numbers"),
        (["reproduce", "--regimes", "per-set", "--fit-sizes", "1"], "at least 2"),
        (["reproduce", "--select", "lodo"], "--select takes 'lodo', with --regimes per-set"),
        (["reproduce", "--regimes", "per-set", "--select", "best"], "--select takes 'lodo'"),
        (["reproduce", "--regimes", "per-set,target"], "runs alone"),
        (["evaluate", "--regime", "per-set", "--corpus", "CORPUS"], "--corpus has no role"),
    ],
)
def test_cli_per_set_refuses_bad_options(
    args: list[str], message: str, working_tiny_bert: Path, layout: Path, tmp_path: Path  # noqa: F811
) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("A sentence.\n", encoding="utf-8")
    full = [corpus if a == "CORPUS" else a for a in args]
    r = _invoke(*full, "--model", working_tiny_bert, "--data-dir", layout, "--no-cache", "-o", tmp_path / "o", "-q")
    assert r.exit_code == 2 and message in r.output
    assert not (tmp_path / "o" / "reproduce.json").exists()
