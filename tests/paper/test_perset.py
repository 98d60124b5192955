"""The per-set protocol (bertflow.paper.perset) on a tiny BERT and a synthetic STS layout: each set fitted on its own
sentences or samples of them, scores and summaries equal to a direct computation, weighted poolings counted on the
fitting sample."""

# ruff: noqa: F811 - the fixtures imported from tests/sts_layout.py are redefined as parameters
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bertflow import SentenceEncoder
from bertflow.errors import InputError
from bertflow.evaluation import evaluate_pairs
from bertflow.evaluation.datasets import STS_TASKS, load_sts_tasks
from bertflow.paper import grid as grid_module
from bertflow.paper.grid import GridConfig, run_grid
from bertflow.paper.perset import evaluation_sets, fitting_sample, run_per_set
from bertflow.paper.render import render_per_set
from bertflow.paper.results import summarize_sets

from ..sts_layout import encoder, layout, one_torch_thread, per_set_config, working_tiny_bert  # noqa: F401 - fixtures


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


def test_each_set_is_fitted_on_its_own_sample_only(
    encoder: SentenceEncoder, layout: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fitted: list[np.ndarray] = []
    real = grid_module.parse_calibrator

    def spying(spec: str, **kwargs: object):  # noqa: ANN202 - a calibrator
        cal = real(spec, **kwargs)
        fit = cal.fit

        def record(X: np.ndarray, *a: object, **k: object):  # noqa: ANN202
            fitted.append(np.array(X))
            return fit(X, *a, **k)

        cal.fit = record  # type: ignore[method-assign]
        return cal

    monkeypatch.setattr(grid_module, "parse_calibrator", spying)  # every fit goes through fit_cell
    config = per_set_config(layout, poolings=["mean"], calibrators=["standard-norm"], fit_sizes=[30])
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
        per_set_config(layout, poolings=["mean"], calibrators=["none", "whitening"], fit_sizes=[30]), encoder=encoder
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
    md = render_per_set(result)
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
    config = per_set_config(layout, poolings=["sif:mean"], calibrators=["standard-norm"], fit_sizes=[20])
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
        run_per_set(per_set_config(layout, regimes=["per-set", "target"]), encoder=encoder)
    with pytest.raises(InputError, match="at least 2"):
        run_per_set(per_set_config(layout, fit_sizes=[1]), encoder=encoder)
    with pytest.raises(InputError, match="per-set"):
        run_grid(GridConfig(regimes=["per-set"], data_dir=layout), encoder=encoder)
    with pytest.raises(InputError, match="fit sizes"):
        run_grid(GridConfig(regimes=["target"], fit_sizes=[10], data_dir=layout), encoder=encoder)
