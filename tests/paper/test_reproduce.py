"""The evaluation grid (bertflow.paper.grid), the published numbers (paper.py) and the CLI commands
`bertflow evaluate`, `bertflow reproduce` and `bertflow download-sts`, on a tiny BERT and a synthetic STS layout."""

# ruff: noqa: F811 - the fixtures imported from tests/sts_layout.py are redefined as parameters
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from bertflow import SentenceEncoder, StandardNormCalibrator, WhiteningCalibrator
from bertflow.calibrators import parse_calibrator
from bertflow.errors import InputError
from bertflow.evaluation import evaluate_sts
from bertflow.evaluation.datasets import STS_TASKS, load_nli_sentences, load_sts_tasks
from bertflow.paper.grid import GridConfig, default_calibrators, run_grid
from bertflow.paper.published import (
    PUBLISHED,
    QUOTED_AVERAGES,
    matching,
    paper_model_name,
    published_for,
    stand_in_caption,
)
from bertflow.paper.regimes import fitting_sets

from ..sts_layout import _invoke, layout, one_torch_thread, working_tiny_bert, write_sts_layout  # noqa: F401 - fixtures


@pytest.fixture(scope="module")
def encoder(working_tiny_bert: Path) -> SentenceEncoder:
    return SentenceEncoder(str(working_tiny_bert), pooling="mean", device="cpu")


def _close(a: float, b: float) -> bool:
    # Correlations x 100 of float32 embeddings computed in different batches: equal to well below 1e-4.
    return abs(a - b) < 1e-4


# ------------------------------------------------------------------------------------------------------
# Building blocks
# ------------------------------------------------------------------------------------------------------


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


def test_fitting_sets_per_regime(layout: Path) -> None:
    tasks = load_sts_tasks(STS_TASKS, layout)
    target = fitting_sets("target", tasks)
    assert not target.shared and target.per_task["STS-B"] == tasks["STS-B"].fit_sentences("target")
    assert set(tasks["STS12"].eval_sentences()) <= set(target.per_task["STS12"])
    train = fitting_sets("train", tasks)
    assert train.per_task["STS12"] is None and train.per_task["SICK-R"] == tasks["SICK-R"].fit_sentences("train")
    nli = load_nli_sentences(layout)
    shared = fitting_sets("nli", tasks, nli=nli)
    assert shared.shared and all(v == nli for v in shared.per_task.values())
    with pytest.raises(InputError, match="--corpus"):
        fitting_sets("corpus", tasks)
    with pytest.raises(InputError, match="unknown regime"):
        fitting_sets("test", tasks)


# ------------------------------------------------------------------------------------------------------
# The grid
# ------------------------------------------------------------------------------------------------------


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
    md = result.to_markdown()
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
    assert "±" in result.to_markdown() and "Avg (2 tasks)" in result.to_markdown()


def test_flow_options_reach_every_flow_cell(encoder: SentenceEncoder, layout: Path) -> None:
    base = dict(poolings=["mean"], calibrators=["flow", "whitening"], regimes=["nli"], tasks=["STS-B"],
                data_dir=layout, use_cache=False, flow_epochs=0.5)  # fmt: skip
    default = run_grid(GridConfig(**base), encoder=encoder)
    changed = run_grid(GridConfig(**base, flow_options={"lr": 0.05, "coupling": "affine"}), encoder=encoder)
    assert changed.meta["flow"] == {"epochs": 0.5, "lr": 0.05, "coupling": "affine"}
    assert "lr=0.05, coupling=affine" in changed.to_markdown()
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


# ------------------------------------------------------------------------------------------------------
# Published numbers
# ------------------------------------------------------------------------------------------------------


def test_published_numbers_are_transcribed_consistently() -> None:
    for row in PUBLISHED:
        assert set(row.scores) <= set(STS_TASKS) and row.protocol in ("all", "wmean")
        assert row.model in ("bert-base-uncased", "bert-large-uncased") and row.source
        for spec in row.calibrators:
            parse_calibrator(spec)
        quoted = QUOTED_AVERAGES.get((row.model, row.label, row.protocol))
        if row.average is not None:
            assert quoted is not None and abs(row.average - quoted) < 0.006, row.label
    assert len(QUOTED_AVERAGES) == sum(r.average is not None for r in PUBLISHED)
    flow_target = matching("bert-base-uncased", "first-last-avg", "flow", "target")
    assert {(r.protocol, round(r.average, 2)) for r in flow_target} == {("wmean", 69.57), ("all", 66.31)}
    # Table 5 rows (fitting corpus not stated) match any regime; raw rows only the no-fitting regime.
    assert [r.scores for r in matching("bert-base-uncased", "mean", "natsv-10", "nli")] == [{"STS-B": 60.40}]
    assert matching("bert-base-uncased", "first-last-avg", "none", "target") == []
    assert paper_model_name("google-bert/bert-base-uncased") == "bert-base-uncased"
    assert paper_model_name("/models/bert-large-uncased/") == "bert-large-uncased"
    assert paper_model_name("bert-base-cased") is None and published_for("sentence-transformers/all-MiniLM-L6-v2") == []


def test_paper_rows_printed_beside_bert_base(working_tiny_bert: Path, layout: Path, tmp_path: Path) -> None:
    # A folder named like the paper's model: reproduce must show the published rows beside ours.
    folder = tmp_path / "bert-base-uncased"
    shutil.copytree(working_tiny_bert, folder)
    enc = SentenceEncoder(str(folder), device="cpu")
    result = run_grid(
        GridConfig(poolings=["first-last-avg"], calibrators=["none"], regimes=[], data_dir=layout, use_cache=False),
        encoder=enc,
    )
    md = result.to_markdown()
    assert "## Published numbers for bert-base-uncased" in md
    assert "69.57" in md and "66.31" in md  # flow (target) under wmean and all
    raw_row = next(line for line in md.splitlines() if line.startswith("| first-last-avg | none | none |"))
    assert "63.69 (wmean" in raw_row and "60.73 (all" in raw_row
    assert len(result.to_dict()["published"]) == len(published_for("bert-base-uncased"))


# ------------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------------


def test_cli_reproduce_writes_markdown_and_json(working_tiny_bert: Path, layout: Path, tmp_path: Path) -> None:
    out = tmp_path / "grid"
    r = _invoke(
        "reproduce", "--model", working_tiny_bert, "--poolings", "mean,first-last-avg", "--calibrators",
        "none,whitening", "--regimes", "target,train", "--data-dir", layout, "--cache-dir", tmp_path / "c",
        "-o", out, "-q",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    data = json.loads((out / "reproduce.json").read_text())
    assert [(c["pooling"], c["calibrator"], c["regime"]) for c in data["cells"]] == [
        ("mean", "none", "none"),
        ("mean", "whitening", "target"),
        ("mean", "whitening", "train"),
        ("first-last-avg", "none", "none"),
        ("first-last-avg", "whitening", "target"),
        ("first-last-avg", "whitening", "train"),
    ]
    md = (out / "reproduce.md").read_text()
    assert md == r.stdout
    assert "bertflow reproduce --model" in md and "--regimes target,train" in md
    assert data["meta"]["regimes"]["train"].startswith("per task, train split only")


def test_cli_reproduce_corpus_from_gzip_with_stand_in_paper_rows(
    working_tiny_bert: Path, layout: Path, tmp_path: Path
) -> None:
    import gzip

    sentences = load_nli_sentences(layout)
    plain = tmp_path / "corpus.txt"
    plain.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    packed = tmp_path / "corpus.txt.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    runs = {}
    for corpus in (plain, packed):
        out = tmp_path / f"grid-{corpus.name}"
        r = _invoke(
            "reproduce", "--model", working_tiny_bert, "--poolings", "mean", "--calibrators", "none,standard-norm",
            "--regimes", "corpus", "--corpus", corpus, "--tasks", "STS-B,SICK-R", "--data-dir", layout, "--no-cache",
            "--paper-rows", "bert-base-uncased", "-o", out, "-q",
        )  # fmt: skip
        assert r.exit_code == 0, r.output
        runs[corpus.name] = json.loads((out / "reproduce.json").read_text())
    cells = {name: [c["average"] for c in d["cells"]] for name, d in runs.items()}
    assert cells["corpus.txt"] == cells["corpus.txt.gz"]  # the .gz file is read as the plain one
    data = runs["corpus.txt.gz"]
    assert f"({len(set(sentences))} sentences)" in data["meta"]["regimes"]["corpus"]
    # A model the papers did not evaluate gets bert-base's rows only when asked, captioned with how they differ.
    assert data["meta"]["published"]["model"] == "bert-base-uncased"
    assert len(data["published"]) == len(published_for("bert-base-uncased"))
    md = (tmp_path / "grid-corpus.txt.gz" / "reproduce.md").read_text()
    caption = data["meta"]["published"]["caption"]
    assert caption in md and "not this encoder's" in caption and "12 layers, hidden 768" in caption
    assert f"{SentenceEncoder(str(working_tiny_bert)).num_layers} layers" in caption
    assert "--paper-rows bert-base-uncased" in md and "paper's bert-base-uncased (protocol; source)" in md
    raw_row = next(line for line in md.splitlines() if line.startswith("| mean | none | none |"))
    assert "(wmean" in raw_row  # the paper's raw last-avg row sits beside ours
    bad = _invoke("reproduce", "--model", working_tiny_bert, "--paper-rows", "gpt2", "--data-dir", layout, "-q")
    assert bad.exit_code == 2 and "no published rows for 'gpt2'" in bad.output


def test_stand_in_caption_names_the_encoder() -> None:
    caption = stand_in_caption("bert-base-uncased", "/models/bert-gutenberg-L6-H384/", 6, 384)
    assert "`bert-gutenberg-L6-H384` has 6 layers and hidden size 384" in caption and "Gutenberg" in caption
    assert "3.3B words" in caption
    with pytest.raises(ValueError, match="no published rows"):
        stand_in_caption("roberta-base", "x", 1, 2)


def test_cli_evaluate_regimes_and_saved_model(working_tiny_bert: Path, layout: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(load_nli_sentences(layout)) + "\n", encoding="utf-8")
    r = _invoke(
        "evaluate", "--model", working_tiny_bert, "--calibrator", "standard-norm", "--corpus", corpus,
        "--tasks", "STS-B,STS12", "--data-dir", layout, "--no-cache", "-o", tmp_path / "ev", "-q",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "ev" / "evaluate.json").read_text())
    cal = data["cells"][1]
    assert cal["regime"] == "corpus" and cal["test_sentences_seen_summary"] == "none"
    assert set(cal["tasks"]) == {"STS-B", "STS12"} and len(cal["tasks"]["STS12"]["subsets"]) == 2
    assert "corpus.txt" in data["meta"]["regimes"]["corpus"]
    assert "## Per subset" in r.stdout and "MSRpar" in r.stdout

    model_dir = tmp_path / "fitted"
    fit = _invoke("fit", corpus, "-o", model_dir, "--model", working_tiny_bert, "--calibrator", "whitening", "-q")
    assert fit.exit_code == 0, fit.output
    r = _invoke("evaluate", "--model-dir", model_dir, "--tasks", "STS-B", "--data-dir", layout, "--no-cache")
    assert r.exit_code == 0, r.output
    assert "unknown: fitted beforehand on" in r.stdout and "| mean | whitening |" in r.stdout

    r = _invoke("evaluate", "--model", working_tiny_bert, "--calibrator", "whitening", "--regime", "corpus",
                "--data-dir", layout)  # fmt: skip
    assert r.exit_code == 2 and "--corpus" in r.stderr


def test_cli_download_sts_fails_fast_with_advice(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from bertflow.errors import DataNotFoundError
    from bertflow.evaluation import download as data

    def offline(*_a: object, **_k: object) -> Path:
        raise DataNotFoundError("cannot download the STS data: network unreachable. Use --data-dir PATH")

    monkeypatch.setattr(data, "download_sts", offline)
    r = _invoke("download-sts", "-o", tmp_path / "sts")
    assert r.exit_code == 2 and "--data-dir" in r.stderr


# ------------------------------------------------------------------------------------------------------
# The real default model (slow)
# ------------------------------------------------------------------------------------------------------


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
