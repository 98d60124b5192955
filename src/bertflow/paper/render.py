"""The Markdown reports of ``bertflow reproduce`` / ``evaluate`` / ``analyze``, from their result objects
(:func:`render_grid`, :func:`render_per_set`, :func:`render_analysis`), and their files (:func:`write_report`)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..evaluation.datasets import STS_TASKS
from .published import PAPER_TASKS, TABLE6, TABLE6_SOURCE, PublishedResult, matching
from .results import GridResult, PerSetResult, SetSummary, fit_size_label

if TYPE_CHECKING:
    from .analyze import AnalysisResult
    from .lodo import LodoSelection


def write_report(folder: Path, stem: str, markdown: str, data: Mapping[str, Any]) -> None:
    """Write a report as ``FOLDER/STEM.md`` and ``FOLDER/STEM.json`` (strict JSON: no NaN), atomically, creating the
    folder."""
    from ..io.files import atomic_write_text

    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / f"{stem}.md", markdown)
    atomic_write_text(folder / f"{stem}.json", json.dumps(data, indent=2, allow_nan=False) + "\n")


def format_stat(stat: Mapping[str, Any] | None, digits: int = 2) -> str:
    """``"mean ± std"`` of a :func:`~bertflow.paper.results.mean_std` (``"n/a"`` for ``None``, ``"nan"`` if empty)."""
    if stat is None:
        return "n/a"
    if stat["mean"] is None:
        return "nan"
    std = f" ± {stat['std']:.{digits}f}" if stat.get("std") is not None else ""
    return f"{stat['mean']:.{digits}f}{std}"


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _delta(stat: Mapping[str, Any] | None, base: Mapping[str, Any] | None) -> str:
    if stat is None or base is None or stat["mean"] is None or base["mean"] is None:
        return ""
    return f"{stat['mean'] - base['mean']:+.2f}"


def _published_cell(rows: Sequence[PublishedResult]) -> str:
    parts = []
    for r in rows:
        value = r.average if r.average is not None else next(iter(r.scores.values()))
        what = "avg" if r.average is not None else "/".join(r.scores)
        parts.append(f"{value:.2f} ({r.protocol}, {what}; {r.source.split(',')[0]} {r.source.split(',')[-1].strip()})")
    return "; ".join(parts)


def _settings(meta: Mapping[str, Any], heading: str, rows: Sequence[str], seeded: bool) -> list[str]:
    """Heading, command and the settings table of a run: the model, ``rows``, seeds, flow training, machine, time."""
    model, secs, m = meta["model"], meta["seconds"], meta["machine"]
    lines = [f"# {heading}", ""]
    if meta.get("command"):
        lines += ["Command:", "", "```bash", meta["command"], "```", ""]
    lines += [
        "| setting | value |",
        "|---|---|",
        f"| model | `{model['id']}` (fingerprint {model['fingerprint']}, {model['dim']} dims, "
        f"{model['layers']} layers, {model['dtype']}) |",
        f"| max_length | {model['max_length']} tokens |",
        *rows,
    ]
    if seeded:
        lines.append(f"| seeds | {meta['seeds']} ({meta['protocol']['seeds']}) |")
    flow = meta["flow"]
    if flow.get("epochs") is not None:
        changed = ", ".join(f"{k}={v}" for k, v in flow.items() if k != "epochs")
        how = f"changed from the preset: {changed}" if changed else "the official code's optimiser settings"
        lines.append(f"| flow training | {flow['epochs']:g} epoch(s), {how} |")
    machine = (
        f"{m['platform']}; {m['cpu']}; {m['usable_cpus']} usable of {m['cpu_count']} CPUs; "
        f"torch {m['torch']} ({m['torch_threads']} thread(s)), transformers {m['transformers']}; device {m['device']}"
    ) + (f" ({m['gpu']})" if m.get("gpu") else "")
    return [
        *lines,
        f"| machine | {machine} |",
        f"| wall time | {secs['total']:.0f} s in all: encoding {secs['encode']:.0f} s "
        f"({meta['sentences']['distinct']} distinct sentences, cache `{meta['cache']}`), "
        f"fitting and scoring {secs['cells']:.0f} s |",
        f"| started | {meta['started_at']} |",
        "",
    ]


def render_grid(result: GridResult, *, title: str = "bertflow reproduce", subsets: bool = False) -> str:
    """The report of a grid run under the heading ``title`` (``subsets``: also per-subset Spearman of every cell)."""
    meta = result.meta
    n_tasks = len(meta["tasks"])
    avg_name = "Avg" if n_tasks == len(STS_TASKS) else f"Avg ({n_tasks} tasks)"
    protocol = meta["protocol"]
    rows = [
        "| tasks | " + ", ".join(f"{t} ({v['n_pairs']} pairs)" for t, v in meta["tasks"].items()) + " |",
        f"| metric | {protocol['metric']} |",
        f'| "all" | {protocol["all"]} |',
        f'| "wmean" | {protocol["wmean"]} |',
        f"| {avg_name} | {protocol['average']} |",
        *(f"| regime `{regime}` | {text} |" for regime, text in meta["regimes"].items()),
    ]
    lines = [
        *_settings(meta, f"{title}: `{meta['model']['id']}`", rows, any(c.seeds != [None] for c in result.cells)),
        *_summary_lines(result, avg_name),
        *_task_lines(result, avg_name),
        *(_subset_lines(result) if subsets else []),
        *(_published_lines(result) if result.published else []),
    ]
    return "\n".join(lines).rstrip() + "\n"


def _summary_lines(result: GridResult, avg_name: str) -> list[str]:
    """The summary table: one row per cell, its averages and their difference to the raw encoder."""
    beside = bool(result.published)
    published = result.meta.get("published") or {"model": result.meta["model"]["id"], "caption": None}
    caption = published.get("caption")
    lines = [
        "## Summary",
        "",
        f"Spearman × 100; {avg_name} is the plain mean over the {len(result.meta['tasks'])} tasks. Δ: difference to "
        'the raw encoder with the same pooling. "test seen": how many evaluation sentences were in the calibrator\'s '
        "fitting set.",
        "",
        *([f"Last column: {caption}", ""] if caption and beside else []),
    ]
    head = f'| pooling | calibrator | regime | test seen | {avg_name} "all" | Δ | {avg_name} "wmean" | Δ | seconds |'
    sep = "|---|---|---|---|---:|---:|---:|---:|---:|"
    if beside:
        head += f" paper's {published['model']} (protocol; source) |" if caption else " published (protocol; source) |"
        sep += "---|"
    lines += [head, sep]
    for c in result.cells:
        raw = result.raw_cell(c.pooling)
        base = raw if raw and raw is not c else None
        cells = [c.pooling, c.calibrator, c.regime, c.seen_summary()]
        for protocol in ("all", "wmean"):
            ours, theirs = c.average_stat(protocol), base.average_stat(protocol) if base else None
            cells += ["error" if c.error else format_stat(ours), _delta(ours, theirs)]
        cells.append(f"{c.seconds:.1f}")
        if beside:
            cells.append(_published_cell(matching(published["model"], c.pooling, c.calibrator, c.regime)))
        lines.append(_row(cells))
    errors = [f"- {c.pooling} / {c.calibrator} / {c.regime}: {c.error}" for c in result.cells if c.error]
    return [*lines, *(["", "Failed cells:", "", *errors] if errors else [])]


def _task_lines(result: GridResult, avg_name: str) -> list[str]:
    """Per-task tables under both conventions."""
    tasks = list(result.meta["tasks"])
    lines: list[str] = []
    for protocol, text in (
        ("all", "one correlation over each task's concatenated subsets"),
        ("wmean", 'size-weighted mean of per-subset correlations; STS-B and SICK-R are identical to "all"'),
    ):
        lines += ["", f'## Per task, "{protocol}" ({text})', ""]
        lines.append("| pooling | calibrator | regime | " + " | ".join(tasks) + f" | {avg_name} |")
        lines.append("|---|---|---|" + "---:|" * (len(tasks) + 1))
        for c in result.cells:
            if not c.error:
                vals = [format_stat(c.task_stat(t, protocol)) for t in tasks]
                lines.append(_row([c.pooling, c.calibrator, c.regime, *vals, format_stat(c.average_stat(protocol))]))
    return lines


def _subset_lines(result: GridResult) -> list[str]:
    """Per-subset Spearman of every cell."""
    lines = ["", "## Per subset (Spearman × 100)", ""]
    for c in result.cells:
        if c.error:
            continue
        lines += [f"### {c.pooling} / {c.calibrator} / {c.regime}", "", "| task | subset | pairs | Spearman |"]
        lines.append("|---|---|---:|---:|")
        for t in c.evaluated():
            lines += [f"| {t} | {s.name} | {s.n_pairs} | {format_stat(stat)} |" for s, stat in c.subset_stats(t)]
        lines.append("")
    return lines


def _published_lines(result: GridResult) -> list[str]:
    """The published rows shown beside the grid, in the papers' task columns (:data:`PAPER_TASKS`)."""
    caption = (result.meta.get("published") or {}).get("caption")
    lines = [
        "",
        f"## Published numbers for {result.published[0].model}",
        "",
        *([caption, ""] if caption else []),
        "Transcribed in `bertflow/paper/published.json` from the cited tables. Compare a published row only with "
        'our row of the same protocol: "wmean" and "all" differ by up to 20 points on STS12.',
        "",
        "| published row | protocol | "
        + " | ".join(PAPER_TASKS)
        + " | Avg | ours: pooling / calibrator / regime | source |",
        "|---|---|" + "---:|" * (len(PAPER_TASKS) + 1) + "---|---|",
    ]
    for r in result.published:
        vals = [f"{r.scores[t]:.2f}" if t in r.scores else "" for t in PAPER_TASKS]
        avg = f"{r.average:.2f}" if r.average is not None else ""
        ours = f"{r.pooling} / {' or '.join(r.calibrators)} / {r.regime or 'not stated'}"
        note = f" ({r.note})" if r.note else ""
        lines.append(_row([r.label, r.protocol, *vals, avg, ours, f"{r.source}{note}"]))
    return lines


def _summary_cells(summary: SetSummary | None) -> list[str]:
    """Δ mean, worst set (Δ) and count below, or blanks."""
    if summary is None:
        return ["", "", ""]
    return [f"{summary.mean_delta:+.2f}", f"{summary.worst_set} ({summary.worst_delta:+.2f})", str(summary.n_below)]


def render_per_set(result: PerSetResult, *, title: str = "bertflow reproduce") -> str:
    """The report of a per-set run (:mod:`bertflow.paper.perset`) under the heading ``title``."""
    meta, protocol, margin = result.meta, result.meta["protocol"], f"{result.margin:g}"
    cells = sorted(result.cells, key=lambda c: (c.fit_size or 0, result.cells.index(c)))
    sets = ", ".join(f"{s} ({v['n_pairs']} pairs)" for s, v in result.sets.items())
    rows = [
        f"| sets | {len(result.sets)}: {sets} |",
        f"| regime `per-set` | {meta['regimes']['per-set']} |",
        f"| fit sizes | {', '.join(meta['fit_sizes'])} (sample seed {meta['sample_seed']}); {protocol['samples']} |",
        *(f"| {key} | {protocol[key]} |" for key in ("metric", "raw", "weighted raw", "mean", "worst", "count")),
    ]
    lines = [
        *_settings(meta, f"{title}: `{meta['model']['id']}`, per set", rows, any(c.seeds != [None] for c in cells)),
        "## Summary",
        "",
        f"Spearman × 100. Δ against **raw** (the same encoder and pooling without weighting or calibrator); for a "
        f"weighted pooling also against the same weighted pooling uncalibrated (w-raw). worst: the set furthest "
        f"below raw, with its Δ; < −{margin}: sets more than {margin} points below raw.",
        "",
        f"| pooling | calibrator | fit | sets | mean | Δ raw | worst (Δ raw) | < −{margin} raw | Δ w-raw | "
        f"worst (Δ w-raw) | < −{margin} w-raw | seconds |",
        "|---|---|---|---:|---:|---:|---|---:|---:|---|---:|---:|",
    ]
    for c in cells:
        scores = c.scores()
        mean = f"{np.mean([v for v in scores.values() if math.isfinite(v)]):.2f}" if scores else ""
        row = [c.pooling, c.calibrator, fit_size_label(c.fit_size), str(len(scores)), "error" if c.error else mean]
        row += _summary_cells(result.summary(c)) + _summary_cells(result.summary(c, against="weighted-raw"))
        lines.append(_row([*row, f"{c.seconds:.1f}"]))
    errors = [f"- {c.label}: {c.error}" for c in result.cells if c.error]
    lines += ["", "Failed cells:", "", *errors] if errors else []
    for size in result.fit_sizes:
        label = fit_size_label(size)
        names = [s for s, by in result.fits.items() if by.get(label) is not None]
        shown = [c for c in cells if not c.error and c.fit_size == size]
        if shown:
            lines += ["", f"## Per set, fit {label}", "", "| pooling | calibrator | " + " | ".join(names) + " |"]
            lines.append("|---|---|" + "---:|" * len(names))
            for c in shown:
                got = c.scores()
                lines.append(_row([c.pooling, c.calibrator, *(f"{got[s]:.2f}" if s in got else "n/a" for s in names)]))
    for sel in result.lodo:
        lines += _lodo_lines(sel)
    return "\n".join(lines).rstrip() + "\n"


def _lodo_lines(sel: LodoSelection) -> list[str]:
    """The leave-one-dataset-out section of one fitting-set size."""
    lines = [
        "",
        f"## Leave-one-dataset-out selection, fit {fit_size_label(sel.fit_size)}",
        "",
        f"For each dataset, the candidate maximising the objective on the **other** datasets' sets is picked and "
        f"scored on the held-out sets only. Objective: {sel.objective.describe()}. {len(sel.candidates)} "
        "candidates (every pooling / calibrator of this size and the raw encoders).",
        "",
        "| held out | picked on the others | objective on the others | held-out sets | mean | Δ raw | "
        f"worst (Δ raw) | < −{sel.objective.margin:g} raw |",
        "|---|---|---:|---:|---:|---:|---|---:|",
    ]
    for f in sel.folds:
        s = f.summary
        head = [f.held_out, f.picked, f"{f.objective:.2f}", str(s.n_sets), f"{s.mean:.2f}"]
        lines.append(_row([*head, *_summary_cells(s)]))
    p = sel.pooled
    lines += [
        f"| **all held out** | (per fold) | | {p.n_sets} | {p.mean:.2f} | " + " | ".join(_summary_cells(p)) + " |",
        "",
        f"Chosen on all sets at once (in-sample, for contrast): {sel.in_sample}.",
    ]
    if sel.excluded:
        lines += ["", "Left out: " + "; ".join(f"{k} ({v})" for k, v in sel.excluded.items()) + "."]
    return lines


#: The anisotropy rows of an analysis: measure key, label, isotropic ideal, decimals.
_GEOMETRY_ROWS = (
    ("mean_pairwise_cosine", "mean pairwise cosine", "0", 4),
    ("isotropy_score", "isotropy score min Z(c) / max Z(c)", "1", 4),
    ("top_eigenvalue_share", "top eigenvalue share of U^T U", "1/D", 4),
    ("top10_eigenvalue_share", "top-10 eigenvalue share", "10/D", 4),
    ("effective_rank", "effective rank (exp entropy of the spectrum)", "D", 1),
)


def render_analysis(result: AnalysisResult) -> str:
    """The report of ``bertflow analyze``: settings, the Table 6 analogue beside the paper's, anisotropy, plots."""
    m, lexical, geometry = result.meta, result.lexical, result.geometry

    def f(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.2f}"

    lines = [f"# bertflow analyze: `{m['model']['id']}` + `{m['calibrator']}`", ""]
    if m.get("command"):
        lines += ["Command:", "", "```bash", m["command"], "```", ""]
    mach = m["machine"]
    compared = f"; compared: {', '.join(f'`{c}`' for c in m['compare'])}" if m.get("compare") else ""
    lines += [
        "| setting | value |",
        "|---|---|",
        f"| model | `{m['model']['id']}` (fingerprint {m['model']['fingerprint']}, {m['model']['dim']} dims), "
        f"pooling `{m['pooling']}`, max_length {m['model']['max_length']} |",
        f'| calibrator | `{m["calibrator"]}` ("calibrated" below){compared} |',
        f"| regime | {m['regime']}: {m['regime_text']} |",
        f"| test sentences seen by the fit | {m['test_seen']} |",
        f"| pairs | STS-B test, {lexical['all']['n']} pairs; {geometry['raw']['n']} distinct sentences "
        "for the geometry |",
        "| edit distance | word-level Levenshtein over lowercased word and punctuation tokens |",
        f"| machine | {mach['platform']}; {mach['cpu']}; {mach['usable_cpus']} usable CPUs; torch {mach['torch']}; "
        f"device {mach['device']} |",
        f"| wall time | {m['seconds']:.0f} s |",
        "",
        "## Similarity vs edit distance (the paper's Table 6)",
        "",
        "Spearman × 100. A similarity that tracks meaning should correlate with edit distance about as weakly as "
        "gold does; a strongly negative value means it mostly measures word overlap.",
        "",
        f"| similarity | vs edit distance | vs gold | vs edit distance, pairs with ED <= "
        f"{lexical['small']['max_edit_distance']} (n={lexical['small']['n']}) | vs gold, same pairs | "
        "paper (BERT-base): vs ED | paper: vs gold |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, a in lexical["all"]["rows"].items():
        s, p = lexical["small"]["rows"][name], TABLE6.get(name, {})
        values = [a["vs_edit_distance"], a["vs_gold"], s["vs_edit_distance"], s["vs_gold"]]
        lines.append(_row([name, *map(f, [*values, p.get("vs_edit_distance"), p.get("vs_gold")])]))
    lines += [
        "",
        f"Paper: {TABLE6_SOURCE}. Its model is raw BERT-base, so compare the direction of the effect, not values.",
        "",
        "## Anisotropy (L2-normalised rows)",
        "",
        "| measure | " + " | ".join(geometry) + " | isotropic ideal |",
        "|---|" + "---:|" * (len(geometry) + 1),
        *(_row([label, *(f"{g[key]:.{digits}f}" for g in geometry.values()), ideal])
          for key, label, ideal, digits in _GEOMETRY_ROWS),
        "",
        "Dimensions: " + ", ".join(f"{name} {g['dim']}" for name, g in geometry.items()) + ".",
        "",
    ]  # fmt: skip
    if result.plots:
        lines += ["## Plots", "", *(f"![{p}]({p})" for p in result.plots if p.endswith(".png"))]
        vector = [p for p in result.plots if not p.endswith(".png")]
        if vector:
            lines += ["", "Vector copies: " + ", ".join(f"[{p}]({p})" for p in vector) + "."]
    return "\n".join(lines).rstrip() + "\n"
