"""The Markdown report of a grid run (``bertflow reproduce`` / ``bertflow evaluate``): settings, a summary table,
per-task tables under both conventions, optional per-subset tables and the published rows beside ours."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .datasets import STS_TASKS
from .paper import PublishedResult, matching
from .results import GridResult, mean_std

__all__ = ["format_stat", "render_markdown"]


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


def render_markdown(result: GridResult, *, title: str, subsets: bool) -> str:
    """The report of ``result`` under the heading ``title`` (``subsets``: also per-subset Spearman per cell)."""
    meta = result.meta
    model = meta["model"]
    tasks = list(meta["tasks"])
    n_tasks = len(tasks)
    avg_name = "Avg" if n_tasks == len(STS_TASKS) else f"Avg ({n_tasks} tasks)"
    lines = [f"# {title}: `{model['id']}`", ""]
    if meta.get("command"):
        lines += ["Command:", "", "```bash", meta["command"], "```", ""]
    secs = meta["seconds"]
    lines += [
        "| setting | value |",
        "|---|---|",
        f"| model | `{model['id']}` (fingerprint {model['fingerprint']}, {model['dim']} dims, "
        f"{model['layers']} layers, {model['dtype']}) |",
        f"| max_length | {model['max_length']} tokens |",
        "| tasks | " + ", ".join(f"{t} ({v['n_pairs']} pairs)" for t, v in meta["tasks"].items()) + " |",
        f"| metric | {meta['protocol']['metric']} |",
        f'| "all" | {meta["protocol"]["all"]} |',
        f'| "wmean" | {meta["protocol"]["wmean"]} |',
        f"| {avg_name} | {meta['protocol']['average']} |",
    ]
    for regime, text in meta["regimes"].items():
        lines.append(f"| regime `{regime}` | {text} |")
    lines += [
        *(
            [f"| seeds | {meta['seeds']} ({meta['protocol']['seeds']}) |"]
            if any(c.seeds != [None] for c in result.cells)
            else []
        ),
        *(
            [f"| flow training | {meta['flow']['epochs']:g} epoch(s), {_flow_options_text(meta['flow'])} |"]
            if meta["flow"].get("epochs") is not None
            else []
        ),
        f"| machine | {_machine_line(meta['machine'])} |",
        f"| wall time | {secs['total']:.0f} s in all: encoding {secs['encode']:.0f} s "
        f"({meta['sentences']['distinct']} distinct sentences, cache `{meta['cache']}`), "
        f"fitting and scoring {secs['cells']:.0f} s |",
        f"| started | {meta['started_at']} |",
        "",
    ]
    beside = bool(result.published)
    published = meta.get("published") or {"model": model["id"], "caption": None}
    caption = published.get("caption")
    lines += [
        "## Summary",
        "",
        f"Spearman × 100; {avg_name} is the plain mean over the {n_tasks} tasks. Δ: difference to the raw encoder "
        'with the same pooling. "test seen": how many evaluation sentences were in the calibrator\'s fitting set.',
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
        a_all, a_w = c.average_stat("all"), c.average_stat("wmean")
        b_all = raw.average_stat("all") if raw and raw is not c else None
        b_w = raw.average_stat("wmean") if raw and raw is not c else None
        cells = [
            c.pooling,
            c.calibrator,
            c.regime,
            c.seen_summary(),
            "error" if c.error else format_stat(a_all),
            _delta(a_all, b_all),
            "error" if c.error else format_stat(a_w),
            _delta(a_w, b_w),
            f"{c.seconds:.1f}",
        ]
        if beside:
            cells.append(_published_cell(matching(published["model"], c.pooling, c.calibrator, c.regime)))
        lines.append("| " + " | ".join(cells) + " |")
    errors = [c for c in result.cells if c.error]
    if errors:
        lines += ["", "Failed cells:", ""]
        lines += [f"- {c.pooling} / {c.calibrator} / {c.regime}: {c.error}" for c in errors]
    for protocol, text in (
        ("all", "one correlation over each task's concatenated subsets"),
        ("wmean", 'size-weighted mean of per-subset correlations; STS-B and SICK-R are identical to "all"'),
    ):
        lines += ["", f'## Per task, "{protocol}" ({text})', ""]
        lines.append("| pooling | calibrator | regime | " + " | ".join(tasks) + f" | {avg_name} |")
        lines.append("|---|---|---|" + "---:|" * (n_tasks + 1))
        for c in result.cells:
            if c.error:
                continue
            vals = [format_stat(c.task_stat(t, protocol)) for t in tasks]
            lines.append(
                f"| {c.pooling} | {c.calibrator} | {c.regime} | "
                + " | ".join(vals)
                + f" | {format_stat(c.average_stat(protocol))} |"
            )
    if subsets:
        lines += ["", "## Per subset (Spearman × 100)", ""]
        for c in result.cells:
            if c.error:
                continue
            lines += [
                f"### {c.pooling} / {c.calibrator} / {c.regime}",
                "",
                "| task | subset | pairs | Spearman |",
                "|---|---|---:|---:|",
            ]
            for t in c.evaluated():
                first = c.reports[0].tasks[t]
                for i, s in enumerate(first.subsets):
                    stat = mean_std([r.tasks[t].subsets[i].spearman for r in c.reports])
                    lines.append(f"| {t} | {s.name} | {s.n_pairs} | {format_stat(stat)} |")
            lines.append("")
    if beside:
        lines += [
            "",
            f"## Published numbers for {result.published[0].model}",
            "",
            *([caption, ""] if caption else []),
            "Transcribed in `bertflow/evaluation/paper.py` from the cited tables. Compare a published row only with "
            'our row of the same protocol: "wmean" and "all" differ by up to 20 points on STS12.',
            "",
            "| published row | protocol | "
            + " | ".join(STS_TASKS)
            + " | Avg | ours: pooling / calibrator / regime | source |",
            "|---|---|" + "---:|" * (len(STS_TASKS) + 1) + "---|---|",
        ]
        for r in result.published:
            vals = [f"{r.scores[t]:.2f}" if t in r.scores else "" for t in STS_TASKS]
            avg = f"{r.average:.2f}" if r.average is not None else ""
            ours = f"{r.pooling} / {' or '.join(r.calibrators)} / {r.regime or 'not stated'}"
            note = f" ({r.note})" if r.note else ""
            lines.append(
                f"| {r.label} | {r.protocol} | " + " | ".join(vals) + f" | {avg} | {ours} | {r.source}{note} |"
            )
    return "\n".join(lines).rstrip() + "\n"
