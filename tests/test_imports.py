"""Light imports: `import bertflow` and `bertflow --help` load no torch, transformers or scikit-learn."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
HEAVY = ("torch", "transformers", "sklearn", "scipy")


def loaded_after(code: str) -> dict[str, bool]:
    """Which heavy modules a fresh interpreter has loaded after running ``code``."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))"
    env = {**os.environ, "PYTHONPATH": SRC}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_bertflow_is_light():
    assert loaded_after("import bertflow; bertflow.__version__") == dict.fromkeys(HEAVY, False)


def test_cli_help_is_light():
    code = (
        "from bertflow.cli import app\n"
        "from typer.testing import CliRunner\n"
        "r = CliRunner().invoke(app, ['--help'])\n"
        "assert r.exit_code == 0 and 'fit' in r.output, r.output\n"
        "r = CliRunner().invoke(app, ['fit', '--help'])\n"
        "assert r.exit_code == 0 and 'auto' in r.output, r.output\n"
    )
    assert loaded_after(code) == dict.fromkeys(HEAVY, False)


def test_names_load_on_first_use():
    import bertflow
    from bertflow import calibrators

    assert bertflow.Embedder.__name__ == "Embedder"
    assert calibrators.AutoCalibrator.__name__ == "AutoCalibrator"
    assert set(bertflow.__all__) <= set(dir(bertflow))


def test_the_registry_finds_every_builtin_calibrator_in_a_fresh_process():
    listing = (
        "from bertflow.calibrators import calibrator_names, calibrator_specs\n"
        "assert {'auto', 'anchored', 'chain', 'whitening'} <= set(calibrator_names())\n"
        "assert 'whitening-K' in calibrator_specs()\n"
    )
    assert loaded_after(listing) == dict.fromkeys(HEAVY, False)  # read from the sources: no calibrator imported
    code = listing + "from bertflow.calibrators import get_calibrator_class\n"
    code += "assert get_calibrator_class('flow').__name__ == 'FlowCalibrator'\n"
    assert loaded_after(code)["torch"]  # ran, and loading the flow did need torch


def test_embedder_does_not_import_mteb_or_sentence_transformers():
    """The MTEB and sentence-transformers bridges are separate modules taking an Embedder, so
    bertflow works without either installed."""
    code = (
        "import sys\nimport bertflow.embedder\nfrom bertflow import Embedder\n"
        "assert Embedder.encode and Embedder.similarity\n"
        "bad = [m for m in ('mteb', 'sentence_transformers', 'datasets') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    env = {**os.environ, "PYTHONPATH": SRC}
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


def test_no_module_imports_another_modules_private_names():
    """The layers talk through public names only (issue 15): no ``from .x import _name`` across modules."""
    import ast

    root = Path(SRC) / "bertflow"
    offenders = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("bertflow")):
                offenders += [
                    f"{path.relative_to(root)}: {a.name} from {node.module}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    assert offenders == []
