"""The Markdown reports of ``bertflow reproduce`` / ``bertflow evaluate``. A grid run: settings, a summary table,
per-task tables under both conventions, optional per-subset tables and the published rows beside ours. A per-set
run: settings, a summary per configuration against the raw encoder (mean, worst set, sets below raw), per-set tables
and the leave-one-dataset-out selection."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..evaluation.datasets import STS_TASKS
from .published import PAPER_TASKS, PublishedResult, matching
from .results import GridResult, PerSetResult, SetSummary, fit_size_label, mean_std

if TYPE_CHECKING:
    from .lodo import LodoSelection

__all__ = ["format_stat", "render_markdown", "render_per_set"]


def format_stat(stat: Mapping[str, Any] | None, digits: int = 2) -> str:
    if stat is None:
        return "n/a"
    if stat["mean"] is None:
        return "nan"
    if stat.get("std") is not None:
        return f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f}"
    return f"{stat['mean']:.{digits}f}"


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


def _machine_line(m: Mapping[str, Any]) -> str:
    line = (
        f"{m['platform']}; {m['cpu']}; {m['usable_cpus']} usable of {m['cpu_count']} CPUs; "
        f"torch {m['torch']} ({m['torch_threads']} thread(s)), transformers {m['transformers']}; device {m['device']}"
    )
    return line + (f" ({m['gpu']})" if m.get("gpu") else "")


def _flow_options_text(flow: Mapping[str, Any]) -> str:
    """The flow settings a grid changed from the preset defaults, or the default wording."""
    changed = {k: v for k, v in flow.items() if k != "epochs"}
    if not changed:
        return "the official code's optimiser settings"
    return "changed from the preset: " + ", ".join(f"{k}={v}" for k, v in changed.items())


def _model_rows(meta: Mapping[str, Any]) -> list[str]:
    """The head of a report's settings table: the model and its truncation."""
    model = meta["model"]
    return [
        "| setting | value |",
        "|---|---|",
        f"| model | `{model['id']}` (fingerprint {model['fingerprint']}, {model['dim']} dims, "
        f"{model['layers']} layers, {model['dtype']}) |",
        f"| max_length | {model['max_length']} tokens |",
    ]


def _run_rows(meta: Mapping[str, Any]) -> list[str]:
    """The tail of a report's settings table: machine, wall time, start."""
    secs = meta["seconds"]
    return [
        f"| machine | {_machine_line(meta['machine'])} |",
        f"| wall time | {secs['total']:.0f} s in all: encoding {secs['encode']:.0f} s "
        f"({meta['sentences']['distinct']} distinct sentences, cache `{meta['cache']}`), "
        f"fitting and scoring {secs['cells']:.0f} s |",
        f"| started | {meta['started_at']} |",
    ]


def render_markdown(result: GridResult, *, title: str, subsets: bool) -> str:
    """The report of ``result`` under the heading ``title`` (``subsets``: also per-subset Spearman per cell)."""
    n_tasks = len(result.meta["tasks"])
    avg_name = "Avg" if n_tasks == len(STS_TASKS) else f"Avg ({n_tasks} tasks)"
    lines = [
        *_settings_lines(result, title, avg_name),
        *_summary_lines(result, avg_name),
        *_task_lines(result, avg_name),
        *(_subset_lines(result) if subsets else []),
        *(_published_lines(result) if result.published else []),
    ]
    return "\n".join(lines).rstrip() + "\n"


def _settings_lines(result: GridResult, title: str, avg_name: str) -> list[str]:
    """Heading, command and the settings table of a grid report."""
    meta = result.meta
    lines = [f"# {title}: `{meta['model']['id']}`", ""]
    if meta.get("command"):
        lines += ["Command:", "", "```bash", meta["command"], "```", ""]
    lines += [
        *_model_rows(meta),
        "| tasks | " + ", ".join(f"{t} ({v['n_pairs']} pairs)" for t, v in meta["tasks"].items()) + " |",
        f"| metric | {meta['protocol']['metric']} |",
        f'| "all" | {meta["protocol"]["all"]} |',
        f'| "wmean" | {meta["protocol"]["wmean"]} |',
        f"| {avg_name} | {meta['protocol']['average']} |",
        *(f"| regime `{regime}` | {text} |" for regime, text in meta["regimes"].items()),
    ]
    if any(c.seeds != [None] for c in result.cells):
        lines.append(f"| seeds | {meta['seeds']} ({meta['protocol']['seeds']}) |")
    if meta["flow"].get("epochs") is not None:
        lines.append(f"| flow training | {meta['flow']['epochs']:g} epoch(s), {_flow_options_text(meta['flow'])} |")
    return [*lines, *_run_rows(meta), ""]


def _published_of(result: GridResult) -> tuple[dict[str, Any], str | None]:
    """Whose published rows the report shows (``meta["published"]``) and their caption."""
    published = result.meta.get("published") or {"model": result.meta["model"]["id"], "caption": None}
    return published, published.get("caption")


def _summary_lines(result: GridResult, avg_name: str) -> list[str]:
    """The summary table: one row per cell, its averages and their difference to the raw encoder."""
    beside = bool(result.published)
    published, caption = _published_of(result)
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
            ours = c.average_stat(protocol)
            cells += [
                "error" if c.error else format_stat(ours),
                _delta(ours, base.average_stat(protocol) if base else None),
            ]
        cells.append(f"{c.seconds:.1f}")
        if beside:
            cells.append(_published_cell(matching(published["model"], c.pooling, c.calibrator, c.regime)))
        lines.append("| " + " | ".join(cells) + " |")
    errors = [c for c in result.cells if c.error]
    if errors:
        lines += ["", "Failed cells:", ""]
        lines += [f"- {c.pooling} / {c.calibrator} / {c.regime}: {c.error}" for c in errors]
    return lines


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
            if c.error:
                continue
            vals = [format_stat(c.task_stat(t, protocol)) for t in tasks]
            lines.append(
                f"| {c.pooling} | {c.calibrator} | {c.regime} | "
                + " | ".join(vals)
                + f" | {format_stat(c.average_stat(protocol))} |"
            )
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
            for i, s in enumerate(c.reports[0].tasks[t].subsets):
                stat = mean_std([r.tasks[t].subsets[i].spearman for r in c.reports])
                lines.append(f"| {t} | {s.name} | {s.n_pairs} | {format_stat(stat)} |")
        lines.append("")
    return lines


def _published_lines(result: GridResult) -> list[str]:
    """The published rows shown beside the grid, in the papers' task columns (:data:`PAPER_TASKS`)."""
    _, caption = _published_of(result)
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
        lines.append(f"| {r.label} | {r.protocol} | " + " | ".join(vals) + f" | {avg} | {ours} | {r.source}{note} |")
    return lines


def _summary_cells(summary: SetSummary | None) -> list[str]:
    """Δ mean, worst set (Δ) and count below, or blanks."""
    if summary is None:
        return ["", "", ""]
    return [
        f"{summary.mean_delta:+.2f}",
        f"{summary.worst_set} ({summary.worst_delta:+.2f})",
        str(summary.n_below),
    ]


def render_per_set(result: PerSetResult, *, title: str) -> str:
    """The report of a per-set run (:mod:`bertflow.paper.perset`) under the heading ``title``."""
    meta = result.meta
    protocol = meta["protocol"]
    margin = f"{result.margin:g}"
    lines = [f"# {title}: `{meta['model']['id']}`, per set", ""]
    if meta.get("command"):
        lines += ["Command:", "", "```bash", meta["command"], "```", ""]
    n_sets = len(result.sets)
    cells = sorted(result.cells, key=lambda c: (c.fit_size or 0, result.cells.index(c)))
    lines += [
        *_model_rows(meta),
        f"| sets | {n_sets}: " + ", ".join(f"{s} ({v['n_pairs']} pairs)" for s, v in result.sets.items()) + " |",
        f"| regime `per-set` | {meta['regimes']['per-set']} |",
        f"| fit sizes | {', '.join(meta['fit_sizes'])} (sample seed {meta['sample_seed']}); {protocol['samples']} |",
        f"| metric | {protocol['metric']} |",
        f"| raw | {protocol['raw']} |",
        f"| weighted raw | {protocol['weighted raw']} |",
        f"| mean | {protocol['mean']} |",
        f"| worst | {protocol['worst']} |",
        f"| count | {protocol['count']} |",
        *([f"| seeds | {meta['seeds']} ({protocol['seeds']}) |"] if any(c.seeds != [None] for c in cells) else []),
        *(
            [f"| flow training | {meta['flow']['epochs']:g} epoch(s), {_flow_options_text(meta['flow'])} |"]
            if meta["flow"].get("epochs") is not None
            else []
        ),
        *_run_rows(meta),
        "",
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
        lines.append("| " + " | ".join([*row, f"{c.seconds:.1f}"]) + " |")
    errors = [c for c in result.cells if c.error]
    if errors:
        lines += ["", "Failed cells:", ""] + [f"- {c.label}: {c.error}" for c in errors]
    for size in result.fit_sizes:
        label = fit_size_label(size)
        names = [s for s, by in result.fits.items() if by.get(label) is not None]
        shown = [c for c in cells if not c.error and (c.fit_size == size or (size is None and c.fit_size is None))]
        if not shown:
            continue
        lines += ["", f"## Per set, fit {label}", "", "| pooling | calibrator | " + " | ".join(names) + " |"]
        lines.append("|---|---|" + "---:|" * len(names))
        for c in shown:
            scores = c.scores()
            lines.append(
                f"| {c.pooling} | {c.calibrator} | "
                + " | ".join(f"{scores[s]:.2f}" if s in scores else "n/a" for s in names)
                + " |"
            )
    for sel in result.lodo:
        lines += _lodo_lines(sel)
    return "\n".join(lines).rstrip() + "\n"


def _lodo_lines(sel: LodoSelection) -> list[str]:
    """The leave-one-dataset-out section of one fitting-set size."""
    label = fit_size_label(sel.fit_size)
    lines = [
        "",
        f"## Leave-one-dataset-out selection, fit {label}",
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
        lines.append(
            f"| {f.held_out} | {f.picked} | {f.objective:.2f} | {s.n_sets} | {s.mean:.2f} | "
            + " | ".join(_summary_cells(s))
            + " |"
        )
    p = sel.pooled
    lines += [
        f"| **all held out** | (per fold) | | {p.n_sets} | {p.mean:.2f} | " + " | ".join(_summary_cells(p)) + " |",
        "",
        f"Chosen on all sets at once (in-sample, for contrast): {sel.in_sample}.",
    ]
    if sel.excluded:
        lines += ["", "Left out: " + "; ".join(f"{k} ({v})" for k, v in sel.excluded.items()) + "."]
    return lines
