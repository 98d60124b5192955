"""The calibrator registry is discovered: a calibrator is one module (of bertflow.calibrators, or named by an entry
point of the group ``bertflow.calibrators``) declaring its name, specs and affinity; nothing else lists it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from bertflow import (
    AllButTheTopCalibrator,
    ChainCalibrator,
    FlowCalibrator,
    IdentityCalibrator,
    StandardNormCalibrator,
    WhiteningCalibrator,
)
from bertflow.calibrators import calibrator_names, calibrator_specs, parse_calibrator
from bertflow.calibrators.registry import catalogue, get_calibrator_class
from bertflow.errors import CompatibilityError, InputError

from ..conftest import SENTENCES
from .examples import example_specs

SRC = str(Path(__file__).resolve().parents[2] / "src")

TOY_MODULE = '''
"""A toy calibrator in its own file: centre, then divide by one overall scale."""

from __future__ import annotations

from typing import Any

import numpy as np

from bertflow.calibrators import Calibrator, register
from bertflow.calibrators.base import expect_shape


@register("toy")
class ToyCalibrator(Calibrator):
    specs = {"toy": "a toy: centre, then divide by the overall std"}
    affine = True

    def __init__(self) -> None:
        pass

    def _fit(self, X: np.ndarray) -> None:
        self.mean_ = X.mean(axis=0)
        self.scale_ = float(X.std())

    def _transform(self, X: np.ndarray) -> np.ndarray:
        return (X - self.mean_) / self.scale_

    def _get_state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        return {"scale": self.scale_}, {"mean": self.mean_}

    def _set_state(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        self.mean_ = expect_shape(arrays, "mean", (self.n_features_in_,)).astype(np.float64)
        self.scale_ = float(meta["scale"])
'''


def test_every_declared_spec_builds_its_class():
    for entry in catalogue():
        for spec in entry.specs:
            example = spec.replace("-K", "-3").replace("-P", "-40")
            assert type(parse_calibrator(example)).__name__ == entry.class_name, spec
    assert list(calibrator_specs())[:2] == ["anchored", "anchored-P"]  # discovery order: module, then declaration
    assert {"chain", "flow", "whitening", "identity"} <= set(calibrator_names())


def test_aliases_numbers_and_chains():
    assert parse_calibrator("raw").name == parse_calibrator("none").name == "identity"
    assert parse_calibrator("abtt-3").n_components == parse_calibrator("all-but-the-top-3").n_components == 3
    assert parse_calibrator("anchored-25").alpha == 0.25
    assert [s.name for s in parse_calibrator("SN+whitening-4").steps] == ["standard-norm", "whitening"]
    assert parse_calibrator("flow-paper", seed=3).get_params()["seed"] == 3
    with pytest.raises(InputError, match="unknown calibrator 'whitening²'; known: anchored, anchored-P"):
        parse_calibrator("whitening²")
    with pytest.raises(InputError, match="unknown calibrator 'natsv'"):  # natsv-K needs its K
        parse_calibrator("natsv")
    with pytest.raises(InputError, match="between 0 and 100"):
        parse_calibrator("anchored-150")
    with pytest.raises(CompatibilityError, match="unknown calibrator type 'nope'"):
        get_calibrator_class("nope")


def test_affinity_is_declared_by_the_class_itself(anisotropic_data):
    affine = {type(c).__name__: c.fit(anisotropic_data).is_affine() for c in map(parse_calibrator, example_specs())}
    assert affine["WhiteningCalibrator"] and affine["StandardNormCalibrator"] and affine["ChainCalibrator"]
    # AutoCalibrator extends the anchored mix: neither is affine, and the subclass does not inherit a declaration.
    assert not affine["FlowCalibrator"] and not affine["AnchoredWhiteningCalibrator"] and not affine["AutoCalibrator"]


def _run(code: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_toy_calibrator_in_one_new_file_fits_saves_loads_in_fresh_processes_and_in_the_cli(tiny_model_dir, tmp_path):
    """One new module (here a third-party one, announced by an entry point) is all a calibrator takes: its spec
    parses, the CLI help lists it and ``--calibrator toy`` fits a model, and a fresh process loads what another
    saved, calibrator alone or whole model."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "toy_calibrator.py").write_text(textwrap.dedent(TOY_MODULE), encoding="utf-8")
    dist = plugins / "toy_calibrator-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-calibrator\nVersion: 0.1\n", encoding="utf-8")
    (dist / "entry_points.txt").write_text("[bertflow.calibrators]\ntoy = toy_calibrator\n", encoding="utf-8")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([SRC, str(plugins)]),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"{s} ({i})" for i, s in enumerate(SENTENCES * 4)) + "\n", encoding="utf-8")
    X = np.random.default_rng(0).normal(size=(50, 6)) * [1, 2, 3, 4, 5, 6] + 3
    np.save(tmp_path / "X.npy", X)

    help_text = _run(
        "from typer.testing import CliRunner\nfrom bertflow.cli import app\n"
        "print(CliRunner().invoke(app, ['fit', '--help'], terminal_width=400).output)",
        env,
    )
    assert "toy" in help_text
    _run(
        "import numpy as np\nfrom bertflow.calibrators import parse_calibrator\n"
        f"cal = parse_calibrator('toy').fit(np.load({str(tmp_path / 'X.npy')!r}))\n"
        f"cal.save({str(tmp_path / 'cal')!r})\n"
        f"np.save({str(tmp_path / 'Z.npy')!r}, cal.transform(np.load({str(tmp_path / 'X.npy')!r})))",
        env,
    )
    cli = [sys.executable, "-m", "bertflow", "fit", str(corpus), "-m", str(tiny_model_dir), "--pooling", "mean"]
    fit = [*cli, "--calibrator", "toy", "-o", str(tmp_path / "model"), "--device", "cpu"]
    done = subprocess.run(fit, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = _run(
        "import json, numpy as np\nfrom bertflow import Embedder\nfrom bertflow.calibrators import Calibrator\n"
        f"cal = Calibrator.load({str(tmp_path / 'cal')!r})\n"
        f"same = bool(np.array_equal(cal.transform(np.load({str(tmp_path / 'X.npy')!r})), "
        f"np.load({str(tmp_path / 'Z.npy')!r})))\n"
        f"model = Embedder.load({str(tmp_path / 'model')!r})\n"
        "print(json.dumps([type(cal).__name__, same, model.calibrator.name, model.encode(['a guitar']).shape[1]]))",
        env,
    )
    assert json.loads(loaded.strip().splitlines()[-1]) == ["ToyCalibrator", True, "toy", 32]
    # Without the plugin on the path, the saved model names a calibrator this installation does not know.
    plain = {**env, "PYTHONPATH": SRC}
    load = f"from bertflow import Embedder; Embedder.load({str(tmp_path / 'model')!r})"
    done = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True, env=plain, timeout=600)
    assert done.returncode != 0 and "unknown calibrator type 'toy'" in done.stderr


@pytest.mark.parametrize(
    ("spec", "cls", "attrs"),
    [
        ("none", IdentityCalibrator, {}),
        ("flow", FlowCalibrator, {"preset": "code"}),
        ("flow-paper", FlowCalibrator, {"preset": "paper"}),
        ("whitening", WhiteningCalibrator, {"n_components": None}),
        ("whitening-256", WhiteningCalibrator, {"n_components": 256}),
        ("standard-norm", StandardNormCalibrator, {}),
        ("natsv-6", AllButTheTopCalibrator, {"n_components": 6}),
        ("SN+NATSV-6", ChainCalibrator, {}),
    ],
)
def test_parse_calibrator(spec, cls, attrs):
    cal = parse_calibrator(spec)
    assert type(cal) is cls
    for k, v in attrs.items():
        assert getattr(cal, k) == v


def test_parse_calibrator_unknown():
    with pytest.raises(InputError, match="unknown calibrator"):
        parse_calibrator("pca-whatever")
