"""The package as users get it (issue 25 item 3): ``python -m build`` makes a wheel and an sdist that ``twine check``
accepts; the wheel, installed into a fresh virtual environment, runs ``bertflow --version``, a fit and an encode
from a folder that holds no source tree.

The fresh environment has no site packages of its own: a ``.pth`` line puts this environment's site-packages on its
path for the dependencies (torch, transformers... are not installed twice). Its ``.pth`` files are not run from
there, so the editable install of the source tree stays invisible; the test checks that ``bertflow`` is imported
from the wheel's files.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import numpy as np
import pytest

from .conftest import SENTENCES

pytest.importorskip("build")
pytest.importorskip("twine")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def _run(args: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(map(str, args))} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """wheel + sdist built from a copy of the project (the checkout gets no build/ or egg-info)."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        shutil.copy2(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for folder in ("src", "tests"):
        shutil.copytree(ROOT / folder, source / folder, ignore=ignore)
    out = source / "dist"
    # --no-isolation: the build backend (setuptools, the test extra) is already installed; nothing is downloaded.
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)], cwd=source)
    return out


def test_build_makes_a_wheel_and_sdist_that_twine_accepts(dist: Path):
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    assert len(wheels) == len(sdists) == 1
    _run([sys.executable, "-m", "twine", "check", "--strict", *map(str, wheels + sdists)], cwd=dist)
    with zipfile.ZipFile(wheels[0]) as whl:
        names = whl.namelist()
        metadata = whl.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "bertflow/paper/published.json" in names  # the published numbers are package data
    assert "bertflow/py.typed" in names and any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "License-Expression: Apache-2.0" in metadata and "Requires-Python: >=3.10" in metadata
    assert "Project-URL: " in metadata and "Classifier: Programming Language :: Python :: 3.11" in metadata
    assert "Description-Content-Type: text/markdown" in metadata
    assert not any(n.startswith(("tests/", "benchmarks/")) for n in names)


def test_the_wheel_installed_in_a_fresh_venv_fits_and_encodes(dist: Path, tmp_path: Path, tiny_model_dir: Path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, system_site_packages=False, symlinks=os.name != "nt").create(env_dir)
    python = env_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    fresh_site = Path(_run([str(python), "-c", purelib], cwd=tmp_path).strip())
    (fresh_site / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n", encoding="utf-8")
    wheel = next(dist.glob("*.whl"))
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index"]
    _run([*pip, str(wheel)], cwd=tmp_path)

    work = tmp_path / "user"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    where = _run([str(python), "-c", "import bertflow; print(bertflow.__file__)"], cwd=work, env=env).strip()
    assert Path(where).is_relative_to(fresh_site), where
    cli = str(env_dir / "bin" / "bertflow")
    from bertflow._version import __version__

    assert _run([cli, "--version"], cwd=work, env=env).strip() == f"bertflow {__version__}"
    (work / "corpus.txt").write_text("\n".join(SENTENCES * 5) + "\n", encoding="utf-8")
    model = ["-m", str(tiny_model_dir), "--pooling", "mean"]
    _run([cli, "fit", "corpus.txt", *model, "--calibrator", "whitening-8", "-o", "my-flow", "-q"], cwd=work, env=env)
    _run([cli, "encode", "corpus.txt", "--model-dir", "my-flow", "-o", "vectors.npy", "-q"], cwd=work, env=env)
    vectors = np.load(work / "vectors.npy")
    assert vectors.shape[0] == len(SENTENCES) * 5 and vectors.dtype == np.float32
    # the installed copy computes what the source tree computes
    from bertflow import Embedder

    np.testing.assert_allclose(vectors, Embedder.load(work / "my-flow").encode(SENTENCES * 5), rtol=1e-5, atol=1e-6)
