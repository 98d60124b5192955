"""A flow study on one encoder, like the BERT-flow paper's Table 8 and ablations: does any flow setting beat whitening?

Each setting is a :class:`~bertflow.calibrators.FlowCalibrator` variant fitted by ``bertflow reproduce``'s grid
(:func:`bertflow.paper.grid.run_grid`) with ``GridConfig.flow_options``; every setting runs with seeds
0..N-1 and is reported as mean ± sample std. Reference rows: the raw encoder, whitening and whitening-K (K = D/3,
the project's rule) fitted on the same sentences.

Protocol (also written into the report):

- Encoder ``--model`` (default the raw MLM encoder ``../shared/models/bert-gutenberg-L6-H384``), max_length 64,
  float32 on CPU; embeddings from the shared embedding cache (``--cache-dir``), encoding only what it lacks.
- Tasks: STS12-16, STS-B test, SICK-R test; Spearman x100 of cosine; "all" and "wmean"; Avg = plain mean of 7.
- Regime ``target`` (default): per task, a fit on all of that task's sentences (transductive, the paper's
  default; no label is ever used). ``--regime nli`` fits once on the SNLI dev+test sentences.
- Settings (``--settings`` picks a subset; names below): the official code's flow (3 levels x 3 steps, additive,
  AdamW lr 1e-3, 1 epoch), the paper's Table 7 Glow (2 levels), epochs 3 and 10, learning rates 1e-4 and 1e-2,
  affine coupling, and held-out-NLL early stopping (10% of the fitting sentences held out, 3 epochs, the step
  with the lowest held-out NLL kept). ``epochs-10`` exists but is not in the default set (``--settings``).

Usage (from the repository root; regenerates docs/results/bert-gutenberg-L6-H384/flow_study.{json,md})::

    nice -n 10 python benchmarks/flow_study.py --seeds 3 --poolings first-last-avg,mean \
        --cache-dir /work/cache/emb --output docs/results/bert-gutenberg-L6-H384/flow_study
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from bertflow.cli.evaluate import find_data_dir
from bertflow.encoding.encoder import SentenceEncoder
from bertflow.evaluation.datasets import STS_TASKS, load_nli_sentences, load_sts_tasks
from bertflow.io.files import atomic_write_text
from bertflow.paper.grid import GridConfig, default_calibrators, run_grid
from bertflow.paper.render import format_stat
from bertflow.resources import machine_info

#: name -> (calibrator spec, epochs, FlowCalibrator options, what it changes from the code preset).
SETTINGS: dict[str, tuple[str, float, dict[str, Any], str]] = {
    "code": ("flow", 1.0, {}, "the official code's flow: 3 levels x 3 steps, additive, lr 1e-3, 1 epoch"),
    "paper": ("flow-paper", 1.0, {}, "the paper's Table 7 Glow: 2 levels x 3 steps, random permutation"),
    "epochs-3": ("flow", 3.0, {}, "3 epochs"),
    "epochs-10": ("flow", 10.0, {}, "10 epochs"),
    "lr-1e-4": ("flow", 1.0, {"lr": 1e-4}, "learning rate 1e-4"),
    "lr-1e-2": ("flow", 1.0, {"lr": 1e-2}, "learning rate 1e-2"),
    "affine": ("flow", 1.0, {"coupling": "affine"}, "affine coupling"),
    "early-stop": (
        "flow",
        3.0,
        {"validation_fraction": 0.1, "eval_every": 50},
        "3 epochs on 90% of the sentences, 10% held out; the step of lowest held-out NLL (checked every 50 steps) "
        "is kept",
    ),
}
#: Run unless --settings says otherwise (epochs-10 costs as much as all the others together on a 2-core CPU).
DEFAULT_SETTINGS = ("code", "paper", "epochs-3", "lr-1e-4", "lr-1e-2", "affine", "early-stop")
DEFAULT_MODEL = str(Path(__file__).resolve().parents[1].parent / "shared" / "models" / "bert-gutenberg-L6-H384")


def _cell_row(cell: Any) -> dict[str, Any]:
    return {
        "all": cell.average_stat("all"),
        "wmean": cell.average_stat("wmean"),
        "tasks": {t: cell.task_stat(t, "all") for t in cell.tasks},
        "seeds": cell.seeds,
        "seconds": round(cell.seconds, 1),
        "error": cell.error,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run every (pooling, setting) and the reference rows; returns the JSON-ready study."""
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    encoder = SentenceEncoder(args.model, max_length=args.max_length, device="cpu")
    tasks = load_sts_tasks(STS_TASKS, args.data_dir)
    nli = load_nli_sentences(args.data_dir) if args.regime == "nli" else None
    poolings = args.poolings.split(",")
    refs = [c for c in default_calibrators(encoder.dim) if c.startswith("whitening")]
    common = dict(
        poolings=poolings, regimes=[args.regime], data_dir=args.data_dir, cache_dir=args.cache_dir, max_length=64
    )
    say = (lambda msg: print(msg, file=sys.stderr, flush=True)) if not args.quiet else (lambda _m: None)
    say(f"reference rows: none, {', '.join(refs)}")
    base = run_grid(GridConfig(calibrators=["none", *refs], **common), encoder=encoder, tasks=tasks, nli=nli)
    rows: dict[str, dict[str, Any]] = {p: {} for p in poolings}
    for cell in base.cells:
        rows[cell.pooling]["raw" if cell.calibrator == "none" else cell.calibrator] = _cell_row(cell)
    for name in args.settings.split(","):
        spec, epochs, options, _ = SETTINGS[name]
        say(f"setting {name}: {spec}, {epochs:g} epoch(s), {options or 'preset defaults'}")
        grid = run_grid(
            GridConfig(calibrators=[spec], seeds=args.seeds, flow_epochs=epochs, flow_options=options, **common),
            encoder=encoder,
            tasks=tasks,
            nli=nli,
        )
        for cell in grid.cells:
            rows[cell.pooling][name] = _cell_row(cell)
            avg_all, avg_wmean = format_stat(cell.average_stat("all")), format_stat(cell.average_stat("wmean"))
            say(f"  {cell.pooling}: all {avg_all}, wmean {avg_wmean}")
    return {
        "meta": {
            "command": "python benchmarks/flow_study.py " + shlex.join(sys.argv[1:]),
            "model": base.meta["model"],
            "regime": args.regime,
            "regime_text": base.meta["regimes"][args.regime],
            "tasks": list(tasks),
            "seeds": args.seeds,
            "references": refs,
            "settings": {
                n: {"spec": s[0], "epochs": s[1], "options": s[2], "text": s[3]}
                for n, s in SETTINGS.items()
                if n in args.settings.split(",")
            },  # fmt: skip
            "protocol": base.meta["protocol"],
            "machine": {**machine_info("cpu"), "torch_threads": torch.get_num_threads()},
            "seconds": round(elapsed := time.perf_counter() - started, 1),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - elapsed)),
        },
        "rows": rows,
    }


def _best_reference(row: Mapping[str, Any], refs: list[str], protocol: str) -> tuple[str, float]:
    name = max(refs, key=lambda r: row[r][protocol]["mean"])
    return name, row[name][protocol]["mean"]


def markdown(study: Mapping[str, Any]) -> str:
    """The study as Markdown: settings, one table per pooling with Δ to raw and to the best whitening."""
    m = study["meta"]
    refs = m["references"]
    lines = [
        f"# Flow study: `{Path(m['model']['id']).name}`",
        "",
        "Command:",
        "",
        "```bash",
        m["command"],
        "```",
        "",
        "| setting | value |",
        "|---|---|",
        f"| model | `{m['model']['id']}` ({m['model']['dim']} dims, {m['model']['layers']} layers, fingerprint "
        f"{m['model']['fingerprint']}), max_length {m['model']['max_length']}, {m['model']['dtype']} |",
        f"| regime | `{m['regime']}`: {m['regime_text']} |",
        "| test sentences seen while fitting | "
        + ("yes, unlabeled: each task's fit contains its test sentences |" if m["regime"] == "target" else "no |"),
        f'| scores | Spearman × 100 of cosine, 7-task average, "all" and "wmean" ({m["protocol"]["wmean"]}) |',
        f"| seeds | {m['seeds']} per flow setting (0..{m['seeds'] - 1}): mean ± sample std |",
        f"| machine | {m['machine']['cpu']}, {m['machine']['usable_cpus']} usable CPUs, device cpu, "
        f"{m['machine']['torch_threads']} torch thread(s), torch {m['machine']['torch']} |",
        f"| wall time | {m['seconds']:.0f} s (started {m['started_at']}) |",
        "",
        "Settings (everything else as the official code's flow: Glow 3 levels x 3 steps, additive coupling, "
        "channel reversal, width 32, AdamW lr 1e-3, weight decay 0.01, batch 64, 1 epoch):",
        "",
    ]
    lines += [f"- `{n}`: {s['text']}" for n, s in m["settings"].items()]
    for pooling, row in study["rows"].items():
        b_all = _best_reference(row, refs, "all")
        b_w = _best_reference(row, refs, "wmean")
        lines += [
            "",
            f"## {pooling}",
            "",
            f"Δ raw: difference to the raw encoder; Δ best whitening: to the better of {', '.join(refs)} "
            f'({b_all[0]} under "all", {b_w[0]} under "wmean").',
            "",
            '| setting | Avg "all" | Δ raw | Δ best whitening | Avg "wmean" | Δ raw | Δ best whitening | '
            + " | ".join(m["tasks"])
            + ' ("all") | seconds |',
            "|---|---:|---:|---:|---:|---:|---:|" + "---:|" * len(m["tasks"]) + "---:|",
        ]
        raw = row["raw"]
        for name, r in row.items():
            if r["error"]:
                lines.append(f"| {name} | error: {r['error']} |")
                continue
            d = []
            for protocol, best in (("all", b_all[1]), ("wmean", b_w[1])):
                mean = r[protocol]["mean"]
                d += [format_stat(r[protocol]), f"{mean - raw[protocol]['mean']:+.2f}", f"{mean - best:+.2f}"]
            tasks = [format_stat(r["tasks"][t]) for t in m["tasks"]]
            lines.append(f"| {name} | " + " | ".join(d + tasks) + f" | {r['seconds']:.0f} |")
        flows = {n: r for n, r in row.items() if n in m["settings"] and not r["error"]}
        if flows:
            top = max(flows, key=lambda n: flows[n]["all"]["mean"])
            gap = flows[top]["all"]["mean"] - b_all[1]
            verdict = (
                f"ahead of the best whitening by {gap:.2f}" if gap > 0 else f"{-gap:.2f} behind the best whitening"
            )
            lines += [
                "",
                f'Best flow setting under "all": `{top}` ({format_stat(flows[top]["all"])}), {verdict} '
                f"({b_all[0]}, {b_all[1]:.2f}).",
            ]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--poolings", default="first-last-avg")
    parser.add_argument("--regime", default="target", choices=("target", "nli"))
    parser.add_argument(
        "--settings", default=",".join(DEFAULT_SETTINGS), help=f"comma-separated, of: {', '.join(SETTINGS)}"
    )
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", required=True, help="path stem: writes STEM.json and STEM.md")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    args.data_dir = find_data_dir(args.data_dir)  # as the CLI finds it when --data-dir is not given
    unknown = [s for s in args.settings.split(",") if s not in SETTINGS]
    if unknown:
        parser.error(f"unknown setting(s) {', '.join(unknown)}; use {', '.join(SETTINGS)}")
    study = run(args)
    stem = Path(args.output)
    stem.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(stem.with_suffix(".json"), json.dumps(study, indent=2, allow_nan=False) + "\n")
    text = markdown(study)
    atomic_write_text(stem.with_suffix(".md"), text)
    print(text)


if __name__ == "__main__":
    main()
