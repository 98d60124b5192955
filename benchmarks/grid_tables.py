"""Pivot tables of one or more ``bertflow reproduce`` reports: pooling x regime rows, calibrator columns.

Reads the ``reproduce.json`` files written by ``bertflow reproduce`` (nothing is recomputed) and prints, per
protocol, the 7-task average of every calibrator (flow rows: mean ± sample std over seeds) with the raw encoder
beside it, then which calibrator is best in each row. docs/results.md quotes these tables.

Usage (from the repository root)::

    python benchmarks/grid_tables.py docs/results/bert-gutenberg-L6-H384/reproduce.json \
        docs/results/bert-gutenberg-L6-H384/corpus/reproduce.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _fmt(stat: dict[str, Any] | None, std: bool = True) -> str:
    if not stat or stat.get("mean") is None:
        return "n/a"
    if std and stat.get("std") is not None:
        return f"{stat['mean']:.2f} ± {stat['std']:.2f}"
    return f"{stat['mean']:.2f}"


def tables(reports: list[dict[str, Any]], protocols: tuple[str, ...] = ("all", "wmean")) -> str:
    """Markdown: for each protocol, one row per (pooling, regime), one column per calibrator."""
    cells = [c for r in reports for c in r["cells"]]
    poolings = list(dict.fromkeys(c["pooling"] for c in cells))
    calibrators = [c for c in dict.fromkeys(c["calibrator"] for c in cells) if c != "none"]
    regimes = [r for r in dict.fromkeys(c["regime"] for c in cells) if r != "none"]
    by_key = {(c["pooling"], c["calibrator"], c["regime"]): c for c in cells}
    lines: list[str] = []
    for protocol in protocols:
        lines += [
            f'### 7-task average, "{protocol}"',
            "",
            "| pooling | regime | raw | " + " | ".join(calibrators) + " | best (Δ raw) |",
            "|---|---|---:|" + "---:|" * len(calibrators) + "---|",
        ]
        for pooling in poolings:
            raw = by_key.get((pooling, "none", "none"))
            raw_mean = raw["average"][protocol]["mean"] if raw else None
            for regime in regimes:
                row = {cal: by_key.get((pooling, cal, regime)) for cal in calibrators}
                values = {
                    cal: c["average"][protocol]
                    for cal, c in row.items()
                    if c and c["average"][protocol] and c["average"][protocol]["mean"] is not None
                }
                if not values:  # e.g. the train regime: STS12-16 have no train split, so no 7-task average
                    continue
                best = max(values, key=lambda k: values[k]["mean"])
                delta = f" ({values[best]['mean'] - raw_mean:+.2f})" if raw_mean is not None else ""
                lines.append(
                    f"| {pooling} | {regime} | {_fmt(raw['average'][protocol]) if raw else 'n/a'} | "
                    + " | ".join(_fmt(c["average"][protocol]) if c else "" for c in row.values())  # n/a: no average
                    + f" | {best}{delta} |"
                )
        lines.append("")
    return "\n".join(lines)


def two_task_table(reports: list[dict[str, Any]], tasks: tuple[str, ...] = ("STS-B", "SICK-R")) -> str:
    """Markdown: the tasks with a train split, per pooling and regime (the train regime has only these)."""
    cells = [c for r in reports for c in r["cells"]]
    lines = [
        f"### {' and '.join(tasks)} (test sets; the only tasks with a train split)",
        "",
        "| pooling | calibrator | regime | " + " | ".join(tasks) + " | mean of the two |",
        "|---|---|---|" + "---:|" * (len(tasks) + 1),
    ]
    for c in cells:
        if c["error"] or any(not c["tasks"].get(t) for t in tasks):
            continue
        stats = [c["tasks"][t]["all"] for t in tasks]
        mean = sum(s["mean"] for s in stats) / len(stats)
        lines.append(
            f"| {c['pooling']} | {c['calibrator']} | {c['regime']} | "
            + " | ".join(_fmt(s) for s in stats)
            + f" | {mean:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("reports", nargs="+", type=Path, help="reproduce.json files of one encoder")
    parser.add_argument("--two-tasks", action="store_true", help="also the STS-B / SICK-R table of every cell")
    args = parser.parse_args(argv)
    reports = [json.loads(p.read_text(encoding="utf-8")) for p in args.reports]
    print(tables(reports))
    if args.two_tasks:
        print(two_task_table(reports))


if __name__ == "__main__":
    main()
