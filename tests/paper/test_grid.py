"""The evaluation grid (bertflow.paper.grid) on a tiny BERT and a synthetic STS layout: its cells equal a direct
computation, failed cells and seeds are reported, options reach the flows, bad arguments fail first."""

# ruff: noqa: F811 - the fixtures imported from tests/sts_layout.py are redefined as parameters
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bertflow import SentenceEncoder, StandardNormCalibrator, WhiteningCalibrator
from bertflow.calibrators import parse_calibrator
from bertflow.errors import InputError
from bertflow.evaluation import evaluate_sts
from bertflow.evaluation.datasets import STS_TASKS, load_nli_sentences, load_sts_tasks
from bertflow.paper.grid import GridConfig, default_calibrators, run_grid
from bertflow.paper.render import render_grid

from ..sts_layout import encoder, layout, one_torch_thread, working_tiny_bert  # noqa: F401 - fixtures


def _close(a: float, b: float) -> bool:
    # Correlations x 100 of float32 embeddings computed in different batches: equal to well below 1e-4.
    return abs(a - b) < 1e-4


def test_default_calibrators_follow_the_papers() -> None:
    assert default_calibrators(768) == [
        "none",
        "standard-norm",
        "natsv-10",
        "standard-norm+natsv-6",
        "whitening",
        "whitening-256",
        "flow",
        "flow-paper",
    ]
    assert "whitening-384" in default_calibrators(1024) and "whitening-128" in default_calibrators(384)
    for spec in default_calibrators(384):
        parse_calibrator(spec)


def test_grid_cells_equal_direct_computation(encoder: SentenceEncoder, layout: Path, tmp_path: Path) -> None:
    passes: list[int] = []
    hook = encoder.model.register_forward_pre_hook(
        lambda _m, _a, kw: passes.append(int(kw["input_ids"].shape[0])), with_kwargs=True
    )
    try:
        config = GridConfig(
            poolings=["mean", "cls"],
            calibrators=["none", "whitening", "standard-norm"],
            regimes=["target", "nli"],
            data_dir=layout,
            cache_dir=tmp_path / "cache",
        )
        result = run_grid(config, encoder=encoder)
    finally:
        hook.remove()
    tasks = load_sts_tasks(STS_TASKS, layout)
    nli = load_nli_sentences(layout)
    distinct = {s for t in tasks.values() for s in t.fit_sentences("target")} | set(nli)
    assert sum(passes) == len(distinct) == result.meta["sentences"]["distinct"]  # one pass, both poolings

    cells = {(c.pooling, c.calibrator, c.regime): c for c in result.cells}
    assert len(cells) == 2 * (1 + 2 * 2)  # per pooling: raw once, two calibrators x two regimes
    # The same numbers computed directly with single-pooling encoders (each sentence encoded once here too).
    sentences = sorted(distinct)
    cls_encoder = SentenceEncoder(encoder.model_id, pooling="cls", model=encoder.model, tokenizer=encoder.tokenizer)
    mean_of = dict(zip(sentences, encoder.encode(sentences), strict=True))
    cls_of = dict(zip(sentences, cls_encoder.encode(sentences), strict=True))

    def mean_emb(items: list[str]) -> np.ndarray:
        return np.stack([mean_of[s] for s in items])

    # Raw row == evaluate_sts on the encoder directly.
    direct = evaluate_sts(mean_emb, data_dir=layout)
    raw = cells[("mean", "none", "none")].reports[0]
    for t in STS_TASKS:
        assert _close(raw.tasks[t].all_spearman, direct.tasks[t].all_spearman)
        assert _close(raw.tasks[t].wmean_spearman, direct.tasks[t].wmean_spearman)
    # NLI regime: one whitening fitted on the NLI sentences, used for every task.
    white = WhiteningCalibrator().fit(mean_emb(nli))
    manual = evaluate_sts(lambda s: white.transform(mean_emb(s)), data_dir=layout)
    got = cells[("mean", "whitening", "nli")]
    assert _close(got.average_stat("all")["mean"], manual.average("all"))
    assert _close(got.average_stat("wmean")["mean"], manual.average("wmean"))
    # Target regime: one calibrator per task, fitted on that task's sentences.
    for t in ("STS12", "SICK-R"):
        sn = StandardNormCalibrator().fit(np.stack([cls_of[s] for s in tasks[t].fit_sentences("target")]))
        expected = evaluate_sts(
            lambda s, sn=sn: sn.transform(np.stack([cls_of[x] for x in s])), tasks=[t], data_dir=layout
        )
        assert _close(cells[("cls", "standard-norm", "target")].task_stat(t, "all")["mean"], expected.average("all"))
    # What the fits saw: target contains every test sentence, the NLI sentences none of them.
    assert cells[("mean", "whitening", "target")].seen_summary() == "all (transductive)"
    assert cells[("mean", "whitening", "nli")].seen_summary() == "none"
    assert cells[("mean", "none", "none")].seen_summary() == "n/a (no fitting)"
    # A second run reads every embedding from the cache: no forward pass at all.
    passes.clear()
    hook = encoder.model.register_forward_pre_hook(
        lambda _m, _a, kw: passes.append(int(kw["input_ids"].shape[0])), with_kwargs=True
    )
    try:
        again = run_grid(
            GridConfig(
                poolings=["cls"], calibrators=["none"], regimes=[], data_dir=layout, cache_dir=tmp_path / "cache"
            ),
            encoder=encoder,
        )
    finally:
        hook.remove()
    assert passes == []
    assert _close(
        again.cells[0].average_stat("all")["mean"], cells[("cls", "none", "none")].average_stat("all")["mean"]
    )


def test_train_regime_failed_cell_and_reports(encoder: SentenceEncoder, layout: Path) -> None:
    config = GridConfig(
        poolings=["mean"],
        calibrators=["none", "standard-norm", "whitening-999"],
        regimes=["train"],
        data_dir=layout,
        use_cache=False,
        command="bertflow reproduce --regimes train",
    )
    result = run_grid(config, encoder=encoder)
    sn = next(c for c in result.cells if c.calibrator == "standard-norm")
    assert sn.evaluated() == ["STS-B", "SICK-R"]
    assert sn.task_stat("STS12", "all") is None and sn.average_stat("all") is None
    assert sn.test_seen["STS12"] is None and sn.test_seen["STS-B"]["of"] == len(
        load_sts_tasks(["STS-B"], layout)["STS-B"].eval_sentences()
    )
    bad = next(c for c in result.cells if c.calibrator == "whitening-999")
    assert bad.error and "n_components" in bad.error and bad.reports == []

    data = json.loads(json.dumps(result.to_dict(), allow_nan=False))  # strict JSON: no NaN anywhere
    cell = next(c for c in data["cells"] if c["calibrator"] == "standard-norm")
    assert cell["tasks"]["STS12"] is None and cell["average"]["all"] is None
    assert cell["tasks"]["STS-B"]["subsets"][0]["name"] == "test"
    assert data["meta"]["machine"]["cpu_count"] >= 1 and data["meta"]["seconds"]["total"] >= 0
    md = render_grid(result)
    assert "bertflow reproduce --regimes train" in md
    assert '## Per task, "all"' in md and '## Per task, "wmean"' in md
    assert "| mean | standard-norm | train |" in md and "n/a" in md
    assert "Failed cells" in md and "whitening-999" in md
    assert "Published numbers" not in md  # not a model the papers evaluated


def test_flow_rows_report_seed_spread(encoder: SentenceEncoder, layout: Path) -> None:
    config = GridConfig(
        poolings=["mean"],
        calibrators=["flow-paper", "whitening"],
        regimes=["nli"],
        tasks=["STS-B", "SICK-R"],
        seeds=2,
        flow_epochs=0.5,
        data_dir=layout,
        use_cache=False,
    )
    result = run_grid(config, encoder=encoder)
    flow, white = result.cells
    assert flow.seeds == [0, 1] and len(flow.reports) == 2
    assert white.seeds == [None] and len(white.reports) == 1  # deterministic: fitted once
    per_seed = [r.average("all") for r in flow.reports]
    assert per_seed[0] != per_seed[1]  # the seed changes the flow
    stat = flow.average_stat("all")
    assert _close(stat["mean"], float(np.mean(per_seed))) and _close(stat["std"], float(np.std(per_seed, ddof=1)))
    assert "±" in render_grid(result) and "Avg (2 tasks)" in render_grid(result)


def test_flow_options_reach_every_flow_cell(encoder: SentenceEncoder, layout: Path) -> None:
    base = dict(poolings=["mean"], calibrators=["flow", "whitening"], regimes=["nli"], tasks=["STS-B"],
                data_dir=layout, use_cache=False, flow_epochs=0.5)  # fmt: skip
    default = run_grid(GridConfig(**base), encoder=encoder)
    changed = run_grid(GridConfig(**base, flow_options={"lr": 0.05, "coupling": "affine"}), encoder=encoder)
    assert changed.meta["flow"] == {"epochs": 0.5, "lr": 0.05, "coupling": "affine"}
    assert "lr=0.05, coupling=affine" in render_grid(changed)
    # Same seed, other optimiser and coupling: the flow changes, the deterministic whitening does not.
    assert changed.cells[0].average_stat("all") != default.cells[0].average_stat("all")
    assert changed.cells[1].average_stat("all") == default.cells[1].average_stat("all")
    with pytest.raises(InputError, match="bad flow option"):
        run_grid(GridConfig(**base, flow_options={"learning_rate": 1e-3}), encoder=encoder)
    with pytest.raises(InputError, match="seed"):
        run_grid(GridConfig(**base, flow_options={"seed": 3}), encoder=encoder)


def test_bad_grid_arguments(encoder: SentenceEncoder, layout: Path) -> None:
    with pytest.raises(InputError, match="seeds"):
        run_grid(GridConfig(seeds=0, data_dir=layout), encoder=encoder)
    with pytest.raises(InputError, match="unknown regime"):
        run_grid(GridConfig(regimes=["test"], data_dir=layout), encoder=encoder)
    with pytest.raises(InputError, match="--corpus"):
        run_grid(GridConfig(regimes=["corpus"], data_dir=layout), encoder=encoder)
    with pytest.raises(InputError, match="unknown calibrator"):
        run_grid(GridConfig(calibrators=["pca"], data_dir=layout), encoder=encoder)


@pytest.mark.slow
def test_minilm_raw_stsb_matches_published(default_encoder: SentenceEncoder, data_dir: Path) -> None:
    """Raw all-MiniLM-L6-v2 on STS-B test under cosine: MTEB reports 82.03 Spearman (docs/results.md)."""
    result = run_grid(
        GridConfig(poolings=["mean"], calibrators=["none"], regimes=[], tasks=["STS-B"], data_dir=data_dir,
                   use_cache=False),
        encoder=default_encoder,
    )  # fmt: skip
    spearman = result.cells[0].task_stat("STS-B", "all")["mean"]
    assert abs(spearman - 82.03) < 0.3
