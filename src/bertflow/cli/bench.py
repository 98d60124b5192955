"""``bertflow bench ...``: deprecated. The benchmarks moved out of the package to ``benchmarks/`` in the source tree
(``python benchmarks/bench.py cpu|flow|suite``). For one release this command still runs that script when bertflow
is used from a source checkout; from an installed wheel it says which script to run instead.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import typer

from . import app

#: The entry script, where a source checkout has it (``src/bertflow/cli/bench.py`` -> ``benchmarks/bench.py``).
SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "bench.py"


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
    help="Deprecated: run `python benchmarks/bench.py cpu|flow|suite` from a source checkout (same options).",
)
def bench(ctx: typer.Context) -> None:
    from ..errors import BertflowError

    args = list(ctx.args)
    command = "python benchmarks/bench.py " + (" ".join(args) if args else "cpu|flow|suite")
    if not SCRIPT.is_file():
        raise BertflowError(
            f"bertflow bench moved out of the package: run {command} from a source checkout of bertflow"
        )
    spec = importlib.util.spec_from_file_location("bertflow_benchmarks_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    options = script.parse(args, prog="bertflow bench")  # bad options: one error line, and no notice before it
    print(f"bertflow bench is deprecated: run {command}", file=sys.stderr)
    script.run(options)
